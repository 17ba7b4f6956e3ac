"""Local verification of a circuit of any size: the circuit, every circuit without one edge and
every circuit without two (`condense verify --local`; `--singles` drops the pairs, for circuits
whose n(n-1)/2 pairs are out of reach), judged like the exhaustive subsets; and for a reducible
circuit a greedy reduction to a passing subset from which no edge can go."""
import sys

import torch

from condense.verify.pairs import _median, judge, pair_interactions
from condense.verify.subsets import subset_masks


def local_masks(n, pairs=True, removals=None):
    """Bool masks [1 + n + n(n-1)/2, n]: the circuit, without each edge, without each pair
    (without `pairs`: [1 + n, n], the first two; with `removals` K too: [1 + K, n], the circuit
    without each of its first K edges)."""
    full = torch.ones(n, dtype=torch.bool)
    masks = [full]
    for i in range(n if removals is None else min(removals, n)):
        m = full.clone()
        m[i] = False
        masks.append(m)
    for i in range(n if pairs else 0):
        for j in range(i + 1, n):
            m = full.clone()
            m[[i, j]] = False
            masks.append(m)
    return torch.stack(masks)


def analyse_local(ld, accuracy, names, ld_full, ld_empty, threshold, tau, accuracy_floor=None,
                  pairs=True):
    """Report from the mean LD and accuracy of local_masks(n, pairs, removals)'s subsets (in
    that order). Without `pairs` the pair fields are empty or None (`pairs_checked` false): only
    the one-edge removals were judged, the first `removals_checked` of them (all n, or the
    first K: then a passing one still proves the circuit reducible, but none passing proves
    nothing, so `one_minimal` is None)."""
    n = len(names)
    f, ok = judge(ld, accuracy, ld_full, ld_empty, threshold, accuracy_floor)
    with_pairs = pairs or n < 2
    checked = n if with_pairs else len(ld) - 1
    if with_pairs:
        # pair_interactions indexes by subset id: give it the ids of these subsets
        full = 2 ** n - 1
        ids = [full] + [full ^ (1 << i) for i in range(n)] + [
            full ^ (1 << i) ^ (1 << j) for i in range(n) for j in range(i + 1, n)]
        by_id = {k: float(v) for k, v in zip(ids, ld)}
        by_id[0] = ld_empty
        pairs = pair_interactions(by_id, n, tau)
        for p in pairs["pairs"]:
            p["edge_i"], p["edge_j"] = names[p["i"]], names[p["j"]]
    else:
        pairs = dict(pairs=[], scale=None, partners=None)
    removable = [names[i] for i in range(checked) if bool(ok[1 + i])]
    removable_pairs = [[names[p["i"]], names[p["j"]]] for k, p in enumerate(pairs["pairs"])
                       if bool(ok[1 + n + k])] if with_pairs else None
    reducible = bool(ok[1:].any())
    return dict(
        mode="local", pairs_checked=with_pairs, removals_checked=checked, n_edges=n, edges=names,
        threshold=threshold, tau=tau,
        accuracy_floor=accuracy_floor, accuracy_circuit=float(accuracy[0]),
        logit_diff_full_model=ld_full, logit_diff_empty=ld_empty, logit_diff_circuit=float(ld[0]),
        faithfulness_circuit=float(f[0]), circuit_faithful=bool(ok[0]),
        irreducible=False if reducible else None,
        one_minimal=not removable if checked == n else (False if removable else None),
        removable_edges=removable, removable_pairs=removable_pairs,
        faithfulness_without_edge={names[i]: float(f[1 + i]) for i in range(checked)},
        accuracy_without_edge={names[i]: float(accuracy[1 + i]) for i in range(checked)},
        n_minimal_faithful_subsets=None, pairs=pairs["pairs"], pair_scale=pairs["scale"],
        n_interacting_pairs=sum(p["interacts"] for p in pairs["pairs"]) if with_pairs else None,
        partners={names[i]: c for i, c in enumerate(pairs["partners"])} if with_pairs else None,
        partners_median=_median(pairs["partners"]) if with_pairs else None)


def greedy_reduction(evaluate, n, passes, first=None, on_step=None):
    """A passing subset that no single edge can leave (1-minimal), found greedily: from the
    circuit, while some one-edge removal of the current subset passes, take the passing removal
    with the highest f. An upper bound on the smallest passing subset, not the smallest itself
    (f is not monotone, and another order may go further).

    evaluate(masks [M, n] bool) -> (ld, accuracy) of those subsets; passes(ld, accuracy) ->
    (f, ok); first: (ld, accuracy) of the circuit's n one-edge removals, in edge order, when
    already measured; on_step(edges left, f, accuracy) after each removal. Returns (mask [n]
    bool, the removals in order as (edge index, f, accuracy), subsets evaluated)."""
    current = torch.ones(n, dtype=torch.bool)
    removals, evaluated = [], 0
    while bool(current.any()):
        on = current.nonzero().flatten()
        if first is not None and not removals:
            ld, accuracy = first
        else:
            masks = current.repeat(len(on), 1)
            masks[torch.arange(len(on)), on] = False
            ld, accuracy = evaluate(masks)
            evaluated += len(on)
        f, ok = passes(ld, accuracy)
        if not bool(ok.any()):
            break
        k = int(torch.where(ok, f, torch.full_like(f, -torch.inf)).argmax())
        current[on[k]] = False
        removals.append((int(on[k]), float(f[k]), float(accuracy[k])))
        if on_step is not None:
            on_step(int(current.sum()), float(f[k]), float(accuracy[k]))
    return current, removals, evaluated


def smallest_within(evaluate, kept, passes):
    """Every subset of the edges `kept` [n] bool (2^k of them, k = kept.sum()): a smallest
    passing one is a minimal passing subset of the whole circuit (any passing proper subset of
    it would be smaller), and `kept` itself is minimal when no proper subset passes. Returns
    (mask [n] of a smallest passing subset, the most faithful of that size; whether `kept` is
    minimal; subsets evaluated). evaluate and passes as in greedy_reduction."""
    on = kept.nonzero().flatten()
    k = len(on)
    inside = subset_masks(torch.arange(2 ** k), k)                     # [2^k, k]
    masks = torch.zeros(2 ** k, len(kept), dtype=torch.bool)
    masks[:, on] = inside
    ld, accuracy = evaluate(masks)
    f, ok = passes(ld, accuracy)
    sizes = inside.sum(1)
    kept_is_minimal = not bool(ok[:-1].any())                          # id 2^k - 1 is `kept`
    if not bool(ok.any()):
        return None, kept_is_minimal, len(masks)
    smallest = int(sizes[ok].min())
    best = torch.where(ok & (sizes == smallest), f, torch.full_like(f, -torch.inf)).argmax()
    return masks[best], kept_is_minimal, len(masks)


def reduce_circuit(evaluator, ld, accuracy, ld_full, ld_empty, rule, floor, show=False,
                   max_edges=20, progress=None, memo=None) -> dict:
    """--local on a reducible circuit: greedy_reduction's passing subset that no edge can leave
    (its first step reuses the one-edge removals just measured); when it has at most
    `max_edges` edges, every subset of it (smallest_within): a minimal passing subset of the
    circuit, and whether the greedy subset is one. `memo`: each evaluation is kept there, and
    one already kept is replayed (an interrupted reduction goes on)."""
    n, names = evaluator.n_edges, evaluator.edge_names

    def evaluate(masks, **kw):
        def run(m):
            return evaluator.mean_logit_diffs(m, with_accuracy=True, **kw)
        return memo.evaluate(run, masks) if memo is not None else run(masks)

    def passes(ld_, accuracy_):
        return judge(ld_, accuracy_, ld_full, ld_empty, rule, floor)

    def step(left, f, acc):
        print(f"greedy reduction: {left} edges left (f {f:.3f}, accuracy {acc:.3f})",
              file=sys.stderr, flush=True)

    evaluator.kept = {}  # each step asks about a few subsets: prepare each prompt batch once
    try:
        kept, removals, evaluated = greedy_reduction(evaluate, n, passes,
                                                     first=(ld[1:1 + n], accuracy[1:1 + n])
                                                     if len(ld) > n else None,  # all n measured
                                                     on_step=step if show else None)
        out = dict(greedy_subset=[names[i] for i in range(n) if bool(kept[i])],
                   greedy_subset_size=int(kept.sum()),
                   greedy_removals=[dict(edge=names[i], faithfulness=f, accuracy=a)
                                    for i, f, a in removals],
                   greedy_subsets_evaluated=evaluated,  # those replayed from a save among them
                   greedy_subsets_replayed=memo.replayed if memo is not None else 0)
        if int(kept.sum()) <= max_edges:
            evaluator.kept = None  # many subsets per pass again: nothing to keep
            smallest, kept_minimal, checked = smallest_within(
                lambda m: evaluate(m, progress=progress), kept, passes)
            out.update(greedy_subset_minimal=kept_minimal, subsets_within_greedy=checked)
            if smallest is not None:  # (the greedy subset passed: only rounding could undo it)
                out.update(minimal_subset=[names[i] for i in range(n) if bool(smallest[i])],
                           minimal_subset_size=int(smallest.sum()))
    finally:
        evaluator.kept = None
    return out
