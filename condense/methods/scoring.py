"""One-shot edge scoring (methods eap, eap_ig, eap_ig_inputs, eap_ig_activations,
clean_corrupted, eap_gp, random): rank every edge once, then find the smallest faithful top-n
circuit.

Splits have one job each, so that no reported number is measured on the data that chose it:
- `train` ranks the edges (attribute);
- `val` draws the MIB curves (CPR, CMD) and searches the smallest faithful circuit;
- `test` gives the final numbers of that circuit.

Artifacts in the run folder (each written atomically; metrics.json last, so its presence
means the run finished): circuit.json (MIB format, every edge's score, in_graph = the circuit
found), circuit.png, curve.png, metrics.json; recipe.yaml is written by condense.runs.

An interrupted run goes on where it stopped: state/scoring.pt keeps the edge scores once the
ranking is done and every top-n evaluation of the curves and the search as it is made (each
takes seconds on a real model), so the rerun of the same command ranks and evaluates only what
is left, and reports the time of the whole run.
"""
import time
from contextlib import contextmanager
from dataclasses import dataclass

from condense.artifacts import ResumeFile
from condense.attribute import METHODS, attribute
from condense.config import RunConfig
from condense.curves import cpr_cmd, plot_curve, smallest_faithful
from condense.evaluate import evaluate, reference_outputs, rows_digest
from condense.methods import register
from condense.runs import SCORING_STATE, RunContext, log, save_run

# recipe method -> condense.attribute method; `eap_ig` is EAP-IG on the inputs
ATTRIBUTION_METHOD = {"eap_ig": "eap_ig_inputs", **{m: m for m in METHODS}}


@dataclass
class ScoringConfig(RunConfig):
    """One-shot scorers use the shared keys only (ranking, search and evaluation)."""


class ScoringState:
    """What a scoring run has done so far, saved at `path` (atomically, after the ranking and
    after each evaluation): the edge scores and their ranking's seconds, each stage's top-n
    evaluations ({n: (faithfulness, circuit size)} by curve or search) and each stage's
    seconds. Read back only by a run of the same model, rows and ranking settings (`key`)."""

    def __init__(self, path: str, key: str):
        self.file = ResumeFile(path, 0.0, label="scoring: ")
        self.state = self.file.read(key) or dict(key=key, scores=None, rank_seconds=0.0,
                                                  memos={}, seconds={})
        self._stage = None  # (name, its start in this process, its earlier runs' seconds)

    @property
    def scores(self):
        return self.state["scores"]

    def ranked(self, scores, seconds: float) -> None:
        self.state.update(scores=scores.detach().cpu().clone(), rank_seconds=seconds)
        self.save()

    def memo(self, name: str) -> dict:
        return self.state["memos"].setdefault(name, {})

    def seconds(self, name: str) -> float:
        return float(self.state["seconds"].get(name, 0.0))

    def _clock_stage(self) -> None:
        if self._stage is not None:
            name, started, earlier = self._stage
            self.state["seconds"][name] = earlier + time.perf_counter() - started

    def save(self) -> None:
        self._clock_stage()
        self.file.write(self.state)

    @contextmanager
    def stage(self, name: str):
        """Time the stage `name`; seconds(name) adds its earlier runs' time to this run's."""
        self._stage = (name, time.perf_counter(), self.seconds(name))
        try:
            yield
        finally:
            self._clock_stage()
            self._stage = None


def scoring_key(cfg, rows) -> str:
    """What the scores and evaluations depend on (the threshold and search resolution stay
    out: they only decide which n the search asks about, and each answer is kept by n)."""
    return repr((cfg.model, cfg.tokenizer, cfg.dtype, cfg.quantization, cfg.device, cfg.method,
                 cfg.ig_steps, cfg.gp_step, cfg.intervention, cfg.metric, cfg.seed, cfg.batch_size,
                 rows_digest(rows["train"], rows["val"])))


def rank_edges(model, graph, rows, cfg, method, means, progress=True):
    """Score every edge of `graph` with attribution `method` on `rows`; returns seconds."""
    start = time.perf_counter()
    attribute(model, graph, rows, method, ig_steps=cfg.ig_steps, intervention=cfg.intervention,
              metric=cfg.metric, batch_size=cfg.batch_size, seed=cfg.seed, means=means,
              progress=progress, gp_step=cfg.gp_step)
    return time.perf_counter() - start


def search_circuit(model, graph, rows, cfg, means, state: ScoringState):
    """MIB curves and the smallest faithful top-n circuit of `graph`'s scores on `rows`, going
    on from (and saving into) `state`. Returns (curves from cpr_cmd, FaithfulCircuit, curve
    seconds, search seconds)."""
    kw = dict(intervention=cfg.intervention, batch_size=cfg.batch_size, means=means)
    # shared by every circuit below, the corrupted run included (about 40 evaluations)
    reference = reference_outputs(model, graph, rows, keep_ablated=True, **kw)
    with state.stage("curve"):
        curves = cpr_cmd(model, graph, rows, reference=reference, progress=lambda t: log(f"curve: {t}"),
                         memos={k: state.memo(f"curve_{k}") for k in ("signed", "absolute")},
                         on_evaluated=state.save, **kw)
    ranking = "absolute" if cfg.absolute_scores else "signed"
    with state.stage("search"):
        found = smallest_faithful(model, graph, rows, threshold=cfg.faithfulness_threshold,
                                  absolute=cfg.absolute_scores, reference=reference,
                                  progress=lambda t: log(f"search: {t}"),
                                  resolution=cfg.search_resolution,
                                  memo=state.memo(f"search_{ranking}"),
                                  on_evaluated=state.save, **kw)
    return curves, found, state.seconds("curve"), state.seconds("search")


def _curve_points(curve):
    return dict(percent=[100 * f for f in curve.fractions], n=curve.n, edges=curve.edges,
                faithfulness=curve.faithfulness)


def run(ctx: RunContext) -> dict:
    """The whole one-shot run; returns metrics.json's contents. Runs on the main process only:
    ranking is not sharded, and the other processes of an `accelerate launch` wait."""
    cfg, model, graph, rows, means = ctx.cfg, ctx.model, ctx.graph, ctx.rows, ctx.means
    attribution_method = ATTRIBUTION_METHOD[cfg.method]
    state = ScoringState(ctx.path(SCORING_STATE), scoring_key(cfg, rows))
    if state.scores is not None and state.scores.shape == graph.scores.shape:
        graph.scores = state.scores.to(graph.scores.device, graph.scores.dtype)
        rank_seconds = state.state["rank_seconds"]
        log(f"ranking: done before, from {state.file.path}")
    else:
        rank_seconds = rank_edges(model, graph, rows["train"], cfg, attribution_method, means)
        state.ranked(graph.scores, rank_seconds)
    log(f"ranked {graph.n_edges} edges with {attribution_method} in {rank_seconds:.1f}s")
    curves, found, curve_seconds, search_seconds = search_circuit(model, graph, rows["val"], cfg,
                                                                  means, state)
    log(f"val: CPR {curves['cpr']:.3f}, CMD {curves['cmd']:.3f}; smallest faithful (f >= "
        f"{cfg.faithfulness_threshold}): n={found.n}, {found.edges} edges, f={found.faithfulness:.3f}")

    if found.graph is not None:
        circuit = found.graph
    else:  # not even the full graph is faithful on val: report the full graph, flagged
        circuit = graph.copy()
        circuit.reset(in_graph=True)
        circuit.prune()
    test = evaluate(model, circuit, rows["test"], intervention=cfg.intervention,
                    batch_size=cfg.batch_size, means=means)
    edges = circuit.count_edges(on_path=True)
    log(f"test: {edges} edges, faithfulness {test['faithfulness']:.3f}, accuracy "
        f"{test['accuracy']:.3f} (full model {test['accuracy_full']:.3f})")

    metrics = dict(
        method=cfg.method, attribution_method=attribution_method, task=cfg.task, model=cfg.model,
        intervention=cfg.intervention, metric=cfg.metric, ig_steps=cfg.ig_steps,
        edges=edges, n_requested=found.n, total_edges=int(graph.valid.sum()),
        faithful_on_val=found.graph is not None, faithfulness_threshold=cfg.faithfulness_threshold,
        faithfulness_val=found.faithfulness,
        faithfulness=test["faithfulness"], accuracy=test["accuracy"], top1=test["top1"],
        logit_diff=test["logit_diff"], kl=test["kl"],
        accuracy_full=test["accuracy_full"], logit_diff_full=test["logit_diff_full"],
        logit_diff_empty=test["logit_diff_empty"],
        cpr=curves["cpr"], cmd=curves["cmd"],
        rank_seconds=rank_seconds, curve_seconds=curve_seconds, search_seconds=search_seconds,
        n_train=len(rows["train"]), n_val=len(rows["val"]), n_test=len(rows["test"]),
        curve_signed=_curve_points(curves["signed"]), curve_absolute=_curve_points(curves["absolute"]),
        search_evaluated=found.evaluated_json())

    plot_curve({"signed scores": curves["signed"], "|scores|": curves["absolute"]}, ctx.path("curve.png"),
               title=f"{cfg.method} on {cfg.task} (val): faithfulness of top-n circuits")
    return save_run(ctx, metrics, circuit)


for _name in ATTRIBUTION_METHOD:
    register(_name, ScoringConfig, run, help=f"one-shot edge scoring with {ATTRIBUTION_METHOD[_name]}")
