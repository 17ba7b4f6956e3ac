"""The verdicts of an exhaustive subset table: which subsets pass, which are minimal, whether
the circuit is irreducible, and how faithfulness spreads over subset sizes (pure tensor work on
the mean logit difference of every subset id; bit i of an id = edge i)."""
import math

import torch

from condense.verify.pairs import _median, judge, pair_interactions

MAX_LISTED = 10000  # minimal faithful subsets written out by name (all are counted)

def subset_sizes(n):
    """Number of edges in each subset id 0 .. 2^n - 1."""
    ids = torch.arange(2 ** n)
    return ((ids[:, None] >> torch.arange(n)) & 1).sum(1) if n else torch.zeros(1, dtype=torch.long)


def proper_subset_faithful(faithful, n):
    """Bool [2^n]: some proper subset of the subset is faithful (sum over subsets, bit by bit)."""
    below = faithful.clone()                 # after the loop: some subset (itself included)
    for i in range(n):
        view = below.view(-1, 2, 2 ** i)
        view[:, 1] |= view[:, 0]
    proper = torch.zeros_like(faithful)
    for i in range(n):                       # drop one present edge, any subset of the rest
        p, b = proper.view(-1, 2, 2 ** i), below.view(-1, 2, 2 ** i)
        p[:, 1] |= b[:, 0]
    return proper


def analyse(ld, names, ld_full, ld_empty, threshold, tau, accuracy=None, accuracy_floor=None):
    """Report (a dict for verify.json) and the per-subset faithfulness, from the mean logit
    difference `ld` [2^n] of every subset id and the reference LD(full), LD(∅). A subset
    passes ("faithful" in the report) when f >= `threshold` (None: not required) and, given
    `accuracy` [2^n] and `accuracy_floor`, its accuracy >= that floor."""
    n = len(names)
    f, faithful = judge(ld, accuracy, ld_full, ld_empty, threshold, accuracy_floor)
    proper = proper_subset_faithful(faithful, n)
    minimal = faithful & ~proper
    sizes = subset_sizes(n)
    full = 2 ** n - 1
    ids = torch.nonzero(minimal).flatten()
    order = sorted(ids.tolist(), key=lambda k: (int(sizes[k]), -float(f[k])))
    listed = order[:MAX_LISTED]
    by_size = {}
    for k in range(n + 1):
        vals = f[sizes == k]
        ok = vals[~torch.isnan(vals)]
        by_size[str(k)] = dict(
            subsets=math.comb(n, k), faithful=int(faithful[sizes == k].sum()),
            min=float(ok.min()) if len(ok) else None, median=float(ok.median()) if len(ok) else None,
            max=float(ok.max()) if len(ok) else None)
    pairs = pair_interactions(ld, n, tau)
    for p in pairs["pairs"]:
        p["edge_i"], p["edge_j"] = names[p["i"]], names[p["j"]]
    report = dict(
        n_edges=n, edges=names, threshold=threshold, tau=tau, accuracy_floor=accuracy_floor,
        accuracy_circuit=float(accuracy[full]) if accuracy is not None else None,
        logit_diff_full_model=ld_full, logit_diff_empty=ld_empty,
        logit_diff_circuit=float(ld[full]), faithfulness_circuit=float(f[full]),
        circuit_faithful=bool(faithful[full]),
        # then every subset's verdict is vacuous: the corrupted run alone passes
        empty_passes=bool(faithful[0]),
        # a circuit that fails its own criterion is neither: "irreducible" would only say that
        # nothing inside a failing circuit passes (a passing proper subset still shows it
        # reducible: it holds a smaller circuit that passes)
        irreducible=False if bool(proper[full]) else (True if bool(faithful[full]) else None),
        n_faithful_subsets=int(faithful.sum()),
        n_minimal_faithful_subsets=len(order),
        minimal_faithful_subsets=[[names[i] for i in range(n) if k >> i & 1] for k in listed],
        minimal_faithful_faithfulness=[float(f[k]) for k in listed],
        minimal_faithful_listed_all=len(order) <= MAX_LISTED,
        faithful_subset_sizes={k: v["faithful"] for k, v in by_size.items()},
        faithfulness_by_size=by_size,
        pairs=pairs["pairs"],
        pair_scale=pairs["scale"],
        n_interacting_pairs=sum(p["interacts"] for p in pairs["pairs"]),
        partners={names[i]: c for i, c in enumerate(pairs["partners"])},
        partners_median=_median(pairs["partners"]),
    )
    return report, f, minimal
