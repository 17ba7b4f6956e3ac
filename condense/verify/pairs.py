"""What the exhaustive and the local analyses share: the rule a subset passes by, and the
pairwise ablation of a circuit's edges from the mean logit differences of its subsets."""
import math

import torch


def judge(ld, accuracy, ld_full, ld_empty, threshold, accuracy_floor):
    """(f, passes) per subset: f = (LD - LD(∅)) / (LD(full) - LD(∅)); a subset passes when
    f >= `threshold` (None: not required) and its accuracy >= `accuracy_floor` (None: not
    required)."""
    denom = ld_full - ld_empty
    f = (ld - ld_empty) / denom if abs(denom) > 1e-12 else torch.full_like(ld, math.nan)
    passes = f >= threshold if threshold is not None else torch.ones_like(ld, dtype=torch.bool)
    if accuracy_floor is not None:
        passes &= accuracy >= accuracy_floor - 1e-12
    return f, passes


def pair_interactions(ld, n, tau):
    """Pairwise ablation from the mean logit difference `ld` of subsets, indexed by subset id
    (bit i = edge i): a tensor over every id, or a dict of the ids read here (the circuit, 0,
    and the circuit without each edge and each pair)."""
    full = 2 ** n - 1
    m_c, m_empty = float(ld[full]), float(ld[0])
    scale = abs(m_c - m_empty)
    delta = [float(ld[full ^ (1 << i)]) - m_c for i in range(n)]
    pairs, partners = [], [0] * n
    for i in range(n):
        for j in range(i + 1, n):
            d_ij = float(ld[full ^ (1 << i) ^ (1 << j)]) - m_c
            interaction = d_ij - delta[i] - delta[j]
            interacts = abs(interaction) > tau * scale
            if interacts:
                partners[i] += 1
                partners[j] += 1
            pairs.append(dict(i=i, j=j, delta_i=delta[i], delta_j=delta[j], delta_ij=d_ij,
                              interaction=interaction, interacts=bool(interacts)))
    return dict(m_circuit=m_c, m_empty=m_empty, scale=scale, delta=delta, pairs=pairs,
                partners=partners)


def _median(values):
    if not values:
        return None
    s = sorted(values)
    mid = len(s) // 2
    return float(s[mid]) if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
