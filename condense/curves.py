"""Circuit curves from edge scores: faithfulness of top-n circuits, MIB's CPR and CMD, and the
smallest faithful top-n circuit (docs/design.md §4).

A top-n circuit keeps the n best-scoring edges (graph.apply_topn) and is then pruned to the
edges on an input -> logits path (graph.prune), as MIB evaluates it; `n` is the number asked
for and `edges` the circuit size after pruning. Faithfulness is evaluate()'s
f(C) = (LD(C) - LD(empty)) / (LD(full) - LD(empty)). The full and empty runs do not depend on
the circuit: they are computed once (evaluate.reference_outputs) and reused for every point.

x-axis of the areas: the fraction of *all* edges of the graph asked for, n = floor(fraction *
total) as in MIB, at MIB's ten fractions 0.001 .. 1 on a linear axis, integrated with the
trapezoid rule from 0.001 to 1 (no point at 0). So a curve that is 1 everywhere has area
0.999, and CPR = area under f (signed scores: edges that hurt the metric rank last), CMD =
area under |1 - f| (absolute scores); higher CPR and lower CMD are better.
"""
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional

from condense.evaluate import evaluate, reference_outputs
from condense.artifacts import atomic_write

MIB_PERCENTS = (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100)


def trapezoid(x, y):
    """Trapezoid-rule area under the points (x, y), x increasing."""
    return sum((x1 - x0) * (y0 + y1) / 2 for x0, x1, y0, y1 in zip(x, x[1:], y, y[1:]))


def pruned_topn(graph, n: int, absolute: bool = True):
    """`graph` (in place, and returned) as its top-n circuit the way MIB evaluates one: the n
    best-scoring edges, then only those on an input -> logits path."""
    graph.apply_topn(n, absolute=absolute)
    return graph.prune()


@dataclass
class Curve:
    """Faithfulness of top-n circuits at the given fractions of all edges."""
    fractions: list        # x: fraction of all edges asked for (percent / 100)
    n: list                # edges asked for (top-n)
    edges: list            # circuit size after pruning (edges on an input -> logits path)
    faithfulness: list
    absolute: bool         # ranked by |score| (True) or by signed score

    @property
    def area(self):
        """Area under f over the fraction axis (CPR when ranked by signed scores)."""
        return trapezoid(self.fractions, self.faithfulness)

    @property
    def area_from_one(self):
        """Area under |1 - f| over the fraction axis (CMD when ranked by |score|)."""
        return trapezoid(self.fractions, [abs(1 - f) for f in self.faithfulness])


class _TopN:
    """Evaluates top-n circuits of one scored graph, each n once (tiny graphs repeat n).
    `progress(text)`, when given, hears about every evaluation (they take seconds each on a
    real model). `memo`: the evaluations so far ({n: (faithfulness, circuit size)}; filled in
    place), and `on_evaluated()` is called after each new one, so that a caller can keep them
    for a rerun."""

    def __init__(self, model, graph, dataset, absolute, intervention, batch_size, means, reference,
                 progress=None, memo: Optional[dict] = None, on_evaluated=None, base=None):
        self.model, self.dataset, self.absolute, self.progress = model, dataset, absolute, progress
        self.kw = dict(intervention=intervention, batch_size=batch_size, means=means)
        self.graph = graph.copy()  # the caller's in_graph is left alone
        self.total = int(graph.valid.sum())
        self.reference = reference or reference_outputs(model, graph, dataset, intervention,
                                                        batch_size, means, keep_ablated=True)
        self.seen = memo if memo is not None else {}
        self.on_evaluated = on_evaluated
        # base: a circuit every top-n circuit contains (the frozen completion of a condensed
        # circuit, condense.fidelity); details: each evaluation's evaluate() output, per row
        self.base = None if base is None else (base.in_graph & base.valid).clone()
        self.details = {}

    def circuit(self, n):
        g = pruned_topn(self.graph, n, self.absolute)
        if self.base is not None:
            g.in_graph = g.in_graph | self.base
            g.prune()
        return g

    def evaluation(self, n) -> dict:
        """evaluate()'s output (per row included) of the pruned top-n circuit, with its size."""
        if n not in self.details:
            g = self.circuit(n)
            out = evaluate(self.model, g, self.dataset, reference=self.reference, per_row=True, **self.kw)
            out["edges"] = g.count_edges()
            self.details[n] = out
        return self.details[n]

    def __call__(self, n):
        """(faithfulness, circuit size) of the pruned top-n circuit."""
        if n not in self.seen:
            out = self.evaluation(n)
            f = out["faithfulness"]
            if math.isnan(f):
                raise ValueError("faithfulness is undefined: the full and the empty circuit have "
                                 "the same mean logit difference on this dataset")
            self.seen[n] = (f, out["edges"])
            if self.on_evaluated is not None:
                self.on_evaluated()
            if self.progress is not None:
                self.progress(f"top-{n} by {'|score|' if self.absolute else 'score'}: "
                              f"{self.seen[n][1]} edges, f = {f:.3f}")
        return self.seen[n]


def faithfulness_curve(model, graph, dataset, absolute=True, percents=MIB_PERCENTS,
                       intervention="patching", batch_size=32, means=None, reference=None,
                       progress=None, memo=None, on_evaluated=None):
    """Faithfulness of the pruned top-n circuits of `graph`'s scores at `percents` of all edges
    (memo, on_evaluated: see _TopN)."""
    top = _TopN(model, graph, dataset, absolute, intervention, batch_size, means, reference, progress,
                memo, on_evaluated)
    fractions = [p / 100 for p in percents]
    ns = [int(fr * top.total) for fr in fractions]
    results = [top(n) for n in ns]
    return Curve(fractions, ns, [e for _, e in results], [f for f, _ in results], absolute)


def cpr_cmd(model, graph, dataset, percents=MIB_PERCENTS, intervention: str = "patching",
            batch_size: int = 32, means=None, reference=None, progress=None,
            memos: Optional[dict] = None, on_evaluated=None) -> dict:
    """MIB's CPR (signed ranking, area under f) and CMD (absolute ranking, area under |1 - f|),
    with both curves; the full/empty reference runs are shared. memos: {"signed": {...},
    "absolute": {...}}, the evaluations of each curve so far (see _TopN), filled in place."""
    if reference is None:
        reference = reference_outputs(model, graph, dataset, intervention, batch_size, means,
                                      keep_ablated=True)
    kw = dict(percents=percents, intervention=intervention, batch_size=batch_size, means=means,
              reference=reference, progress=progress)
    memos = memos if memos is not None else {}
    signed = faithfulness_curve(model, graph, dataset, absolute=False, on_evaluated=on_evaluated,
                                memo=memos.setdefault("signed", {}), **kw)
    absolute = faithfulness_curve(model, graph, dataset, absolute=True, on_evaluated=on_evaluated,
                                  memo=memos.setdefault("absolute", {}), **kw)
    return dict(cpr=signed.area, cmd=absolute.area_from_one, signed=signed, absolute=absolute)


@dataclass
class FaithfulCircuit:
    """Result of smallest_faithful: the top-n circuit found (pruned), or n=None if none was."""
    n: int
    edges: int
    faithfulness: float
    graph: object
    evaluated: dict = field(default_factory=dict)  # n -> (faithfulness, circuit size)

    def evaluated_json(self) -> dict:
        """The search's evaluations as JSON: {"n": {"faithfulness", "edges"}}, by n."""
        return {str(n): dict(faithfulness=f, edges=e) for n, (f, e) in sorted(self.evaluated.items())}


def smallest_faithful(model, graph, dataset, threshold: float = 0.9, absolute: bool = True,
                      intervention: str = "patching", batch_size: int = 32, means=None,
                      reference=None, progress=None, resolution: float = 0.0,
                      memo: Optional[dict] = None, on_evaluated=None) -> FaithfulCircuit:
    """The smallest n whose pruned top-n circuit has faithfulness >= threshold, by search.

    Doubling n = 1, 2, 4, ... until a circuit passes, then bisection between the last
    failing and the first passing n. Each evaluation is one evaluate() over the dataset, so
    this costs about 2 log2(n) evaluations instead of n. Faithfulness is not monotone in n in
    general (adding an edge can hurt), so the result is a boundary (f(n) >= threshold and
    f(n - 1) < threshold, or n = 0), not necessarily the global minimum: a smaller passing n
    may exist below an n that failed. Returns a FaithfulCircuit whose graph is a pruned copy
    (the input graph's in_graph is unchanged); n is None when even the full graph fails.
    `resolution` > 0 ends the bisection once the bracket is narrower than that fraction of its
    upper end (the n returned passes; the boundary lies within that fraction below it): on a
    graph of 100k edges, 0.01 saves about seven of the most expensive evaluations.
    memo, on_evaluated: the evaluations so far, kept for a rerun (see _TopN)."""
    top = _TopN(model, graph, dataset, absolute, intervention, batch_size, means, reference, progress,
                memo, on_evaluated)

    def passes(n):
        return top(n)[0] >= threshold

    hi = 0 if threshold <= 0 else boundary(top.total, passes, resolution)  # f(∅) = 0 passes 0
    if hi is None:
        f, e = top(top.total)
        return FaithfulCircuit(None, e, f, None, dict(top.seen))
    f, e = top(hi)
    return FaithfulCircuit(hi, e, f, top.circuit(hi).copy(), dict(top.seen))


def boundary(total: int, passes, resolution: float = 0.0, zero_passes: bool = False) -> Optional[int]:
    """The search of smallest_faithful over n in [0, total] for any pass rule `passes(n)`:
    double n from 1 until it passes, then bisect between the last failing and the first passing
    n (`resolution`: stop once the bracket is narrower than that fraction of its upper end).
    0 when `zero_passes` (checked by the caller), None when even `total` fails."""
    if zero_passes:
        return 0
    if not passes(total):
        return None
    lo, hi = 0, 1
    while not passes(hi):  # afterwards passes(hi) and not passes(lo)
        lo, hi = hi, min(2 * hi, total)
    while hi - lo > max(1, int(resolution * hi)):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if passes(mid) else (mid, hi)
    return hi


# ---------------------------------------------------------------- searches under a named rule
RULES = ("faithfulness", "gate", "both")


@dataclass
class Rule:
    """When a circuit passes (docs/design.md §4 and §5), so that two circuits set side by side
    can be judged by the same one, named:

    - `faithfulness`: f(C) >= `threshold` (one-shot scoring's search);
    - `gate`: condensation's gate on a frozen model: accuracy >= the reference accuracy (the
      full model's on the same rows, or `accuracy_reference`) - `accuracy_tol`, and, with
      `empty_fails`, the empty circuit's accuracy below that floor (a frozen model's
      perplexity ratio is 1, so the gate's perplexity check always holds);
    - `both`: the two together (a condensation run with gate_faithfulness)."""
    name: str = "faithfulness"
    threshold: float = 0.9
    accuracy_tol: float = 0.05
    empty_fails: bool = True
    accuracy_reference: Optional[float] = None

    def __post_init__(self):
        if self.name not in RULES:
            raise ValueError(f"rule {self.name!r}; choose one of {', '.join(RULES)}")

    def floor(self, metrics: dict) -> float:
        from condense.metrics import ACCURACY_EPS
        ref = metrics["accuracy_full"] if self.accuracy_reference is None else self.accuracy_reference
        return ref - self.accuracy_tol - ACCURACY_EPS

    def passes(self, metrics: dict) -> bool:
        """Whether evaluate()'s `metrics` of a circuit pass this rule."""
        ok_f = bool(metrics["faithfulness"] >= self.threshold)
        floor = self.floor(metrics)
        ok_gate = bool(metrics["accuracy"] >= floor) and (
            not self.empty_fails or bool(metrics["accuracy_empty"] < floor))
        return {"faithfulness": ok_f, "gate": ok_gate, "both": ok_f and ok_gate}[self.name]

    def describe(self) -> str:
        f = f"f >= {self.threshold:g}"
        gate = (f"accuracy within {self.accuracy_tol:g} of the original's"
                + (", the empty circuit below it" if self.empty_fails else ""))
        return {"faithfulness": f, "gate": gate, "both": f"{gate}, and {f}"}[self.name]

    def to_json(self) -> dict:
        return dict(name=self.name, threshold=self.threshold, accuracy_tol=self.accuracy_tol,
                    empty_fails=self.empty_fails, accuracy_reference=self.accuracy_reference,
                    described=self.describe())


@dataclass
class PassingCircuit:
    """smallest_passing's answer: the top-n (with `base`, base ∪ top-n) circuit found, n None
    when even the full graph fails; `evaluations`: every n evaluated, with its metrics and
    per-row values (for intervals over rows, condense.intervals)."""
    n: Optional[int]
    edges: int
    metrics: dict
    graph: object
    rule: Rule
    evaluations: dict = field(default_factory=dict)

    def evaluated_json(self) -> dict:
        keys = ("faithfulness", "accuracy", "accuracy_empty", "kl", "top1_agreement", "choice_agreement")
        return {str(n): dict({k: m[k] for k in keys}, edges=m["edges"], passes=self.rule.passes(m))
                for n, m in sorted(self.evaluations.items())}


def smallest_passing(model, graph, dataset, rule: Rule, absolute: bool = True,
                     intervention: str = "patching", batch_size: int = 32, means=None,
                     reference=None, progress=None, resolution: float = 0.0,
                     base=None) -> PassingCircuit:
    """The smallest n whose pruned top-n circuit of `graph`'s scores passes `rule`, by
    smallest_faithful's search (a boundary, not always the global minimum: neither f nor
    accuracy need grow with n). `base` (a Graph of the same model): every circuit is base ∪
    top-n, pruned, and n = 0 is the base alone: the fewest ranked edges that complete it."""
    top = _TopN(model, graph, dataset, absolute, intervention, batch_size, means, reference, progress,
                base=base)

    def passes(n):
        m = top.evaluation(n)
        if progress is not None and n not in top.seen:
            top.seen[n] = (m["faithfulness"], m["edges"])
            progress(f"top-{n}{' with the base' if base is not None else ''}: {m['edges']} edges, "
                     f"f = {m['faithfulness']:.3f}, accuracy {m['accuracy']:.3f}: "
                     f"{'passes' if rule.passes(m) else 'fails'} ({rule.name})")
        return rule.passes(m)

    zero = base is not None and passes(0)
    hi = boundary(top.total, passes, resolution, zero_passes=zero)
    found = hi if hi is not None else top.total
    m = top.evaluation(found)
    return PassingCircuit(hi, m["edges"], m, top.circuit(found).copy() if hi is not None else None,
                          rule, dict(top.details))


def plot_curve(curve, path, title=None):
    """Faithfulness against the fraction of edges (log axis) to a PNG. `curve` is a Curve or
    a mapping label -> Curve (e.g. methods compared); the legend gives each area."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    curves = curve if isinstance(curve, Mapping) else {"": curve}
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, c in curves.items():
        kind = f"CMD {c.area_from_one:.3f}" if c.absolute else f"CPR {c.area:.3f}"
        ax.plot([100 * x for x in c.fractions], c.faithfulness, marker="o",
                label=f"{label} ({kind})".strip())
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_xlabel("edges kept (% of all edges, top-n by score)")
    ax.set_ylabel("faithfulness f(C)")
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=120), "wb")
    plt.close(fig)
