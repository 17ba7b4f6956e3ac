"""The S3martCirc run (`method: s3martcirc`): its config and checks, training
(condense.methods.s3martcirc.method, where the method is described), evaluation against the node baselines,
and the artifacts (circuit.json with roles, circuit.png, roles.json, training.png,
metrics.json). Only the main process writes.
"""
import math
from dataclasses import dataclass, field
from typing import Optional

import torch

from condense.artifacts import ResumeFile, atomic_write, write_json
from condense.config import RecipeError, RunConfig, at_least, refuse
from condense.evaluate import rows_digest
from condense.methods import register
from condense.optimize import FitState, world
from condense.runs import BASELINES_STATE, TRAINING_STATE, RunContext, log, save_run
from condense.methods.s3martcirc.node_baselines import (
    BASELINES,
    NodeSet,
    ablation_metrics,
    circuit_metrics,
    connected_nodes,
    node_circuit_graph,
    reference_for,
    score_nodes,
)
from condense.methods.s3martcirc.method import (
    ROLES,
    S3Settings,
    train_s3martcirc,
)

# ---------------------------------------------------------------- artifacts

def role_graph(graph, result, nodes):
    """The node circuit of `nodes` (node_baselines.node_circuit_graph) with roles: heads and
    circuit neurons their own, an MLP node the most common role among its circuit neurons."""
    g = node_circuit_graph(graph, nodes)
    r_h, r_n = result.roles()
    roles = {}
    for l in range(g.n_layers):
        for h in range(g.n_heads):
            roles[f"a{l}.h{h}"] = ROLES[int(r_h[l, h]) if nodes.heads[l, h] else 0]
        kept = torch.nonzero(nodes.neurons[l]).flatten().tolist()
        for i in kept:
            roles[f"m{l}.n{i}"] = ROLES[int(r_n[l, i])]
        if kept:
            counts = torch.bincount(r_n[l, kept], minlength=3)
            roles[f"m{l}"] = ROLES[int(counts[1:].argmax()) + 1]
        else:
            roles[f"m{l}"] = ROLES[0]
    g.roles = roles
    return g


def roles_table(graph, result, nodes):
    """{name: {role, c_u, c_p, c_f, fi}} for every head and every circuit neuron."""
    c_h, c_n = result.coefficients
    r_h, r_n = result.roles()
    out = {}
    for l in range(graph.n_layers):
        for h in range(graph.n_heads):
            out[f"a{l}.h{h}"] = _entry(ROLES[int(r_h[l, h]) if nodes.heads[l, h] else 0],
                                       c_h[l, h], result.fi.heads[l, h])
        for i in torch.nonzero(nodes.neurons[l]).flatten().tolist():
            out[f"m{l}.n{i}"] = _entry(ROLES[int(r_n[l, i])], c_n[l, i], result.fi.neurons[l, i])
    return out


def _entry(role, c, fi):
    return dict(role=role, c_u=float(c[0]), c_p=float(c[1]), c_f=float(c[2]), fi=float(fi))


def plot_history(history, path, title):
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.5))
    ep = [h["epoch"] for h in history]
    a1.plot(ep, [h.get("task", math.nan) for h in history], label="discovery (KL / NLL)")
    a1.plot(ep, [h.get("classification", math.nan) for h in history], label="classification")
    a1.set_xlabel("epoch")
    a1.legend(fontsize=7)
    a2.plot(ep, [h["heads"] + h["neurons"] for h in history], label="candidates")
    a2.plot(ep, [h["functional"] for h in history], label="functional")
    a2.plot(ep, [h["passthrough"] for h in history], label="passthrough")
    a2.set_xlabel("epoch")
    a2.set_yscale("symlog")
    a2.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110), "wb")
    plt.close(fig)


# ---------------------------------------------------------------- evaluation and comparison

def evaluate_nodes(model, graph, rows, nodes, reference, intervention, batch_size, means):
    kw = dict(intervention=intervention, batch_size=batch_size, means=means, reference=reference)
    out = ablation_metrics(model, graph, rows, nodes, **kw)
    alone = circuit_metrics(model, graph, rows, nodes, **kw)
    out.update({f"circuit_{k}": v for k, v in alone.items() if k not in ("accuracy_full", "logit_diff_full")})
    return out


def compare_baselines(model, graph, rows, scored, size, baselines, budgets, *, test_reference,
                      intervention="patching", batch_size=32, means=None, ig_steps=5, seed=0,
                      pruning=None, recovery_reference=None, progress=True,
                      state: Optional[ResumeFile] = None):
    """Score nodes with each baseline on rows['train'] and evaluate on rows['test']: at the
    S3martCirc circuit size (ablation and circuit-alone metrics) and at every budget
    (ablation metrics), plus recovery of `recovery_reference` when given. `scored`: rankings
    already made ({name: NodeScores}, e.g. S3martCirc's), evaluated at the budgets only.
    state: each baseline's record is saved there once it is done, and a rerun with the same
    rows, size and settings takes the saved ones (their measured seconds with them) rather
    than scoring again (exact patching takes minutes on a real model).
    Returns {method: {...}}."""
    from condense.methods.s3martcirc.recovery import recovery
    shape = graph.shape
    kw = dict(intervention=intervention, batch_size=batch_size, means=means)
    key = _baselines_key(graph, rows, size, budgets, intervention, batch_size, ig_steps, seed,
                         pruning, recovery_reference)
    done = (state.read(key) or {}).get("done", {}) if state is not None else {}
    out = {}
    entries = list(scored.items()) + [(b, None) for b in baselines]
    for method, scores in entries:
        rec = {}
        if scores is None and method in done:
            log(f"baseline {method}: done before, from {state.path}")
            out[method] = done[method]
            continue
        if scores is None:
            log(f"baseline {method} ...")
            scores, seconds = score_nodes(method, model, graph, rows["train"], ig_steps=ig_steps,
                                          seed=seed, progress=progress, pruning=pruning, **kw)
            rec["seconds"] = seconds
            if method == "exact_patching_heads":  # the same per-node cost over every node
                n_heads = shape.n_layers * shape.n_heads
                rec["exact_patching_seconds_estimate"] = seconds * (scores.n_nodes + 1) / (n_heads + 1)
            nodes = scores.top(size)
            rec["at_size"] = evaluate_nodes(model, graph, rows["test"], nodes, test_reference, **kw)
            log(f"{method}: {seconds:.1f}s; top {size} nodes ablated: accuracy drop "
                f"{rec['at_size']['accuracy_drop']:.1f} points, logit drop {rec['at_size']['logit_drop']:.3f}")
        rec["budgets"] = {str(b): ablation_metrics(model, graph, rows["test"], scores.top(min(b, scores.n_nodes)),
                                                   reference=test_reference, **kw) for b in budgets}
        if recovery_reference is not None:
            rec["recovery"] = {str(b): v for b, v in
                               recovery(scores.ranked_names(shape, max(budgets)), recovery_reference,
                                        budgets).items()}
        out[method] = rec
        if state is not None and method not in scored:
            done[method] = rec
            if world()[0] == 0:  # every process reads it, so that all skip the same baselines
                state.write(dict(key=key, done=done))
    return out


def _baselines_key(graph, rows, size, budgets, *settings) -> str:
    """What a saved baseline record depends on: the model's shape, the rows (mean ablation's
    means are the train rows'), the circuit size, the budgets and the scoring and evaluation
    settings."""
    return repr((repr(graph.shape), size, [int(b) for b in budgets], repr(settings),
                 rows_digest(rows["train"], rows["test"])))


def done_when(s3, compared):
    """Per baseline: S3martCirc's accuracy drop >= the baseline's at the same circuit size (the
    size condition 'no more than 1.5x theirs' then holds with ratio 1), and S3martCirc's time
    (FI + training) at least 10x below exact patching's (measured, or with
    exact_patching_heads the estimate for every node)."""
    checks = {}
    for method, rec in compared.items():
        if "at_size" in rec:
            checks[f"drop_vs_{method}"] = s3["accuracy_drop"] >= rec["at_size"]["accuracy_drop"] - 1e-9
    exact = (compared.get("exact_patching", {}).get("seconds")
             or compared.get("exact_patching_heads", {}).get("exact_patching_seconds_estimate"))
    if exact:
        checks["10x_faster_than_exact_patching"] = exact >= 10 * s3["seconds"]
    return checks


# ---------------------------------------------------------------- runner

@dataclass
class S3Config(RunConfig):
    """S3martCirc's keys and those of its node baselines."""
    method: str = field(default="s3martcirc", metadata={"help": "s3martcirc (this config's method)"})
    s3_lr: float = field(default=0.005, metadata={
        "help": "AdamW learning rate of the node coefficient logits (paper: 0.005)"})
    s3_weight_decay: float = field(default=5e-4, metadata={
        "help": "AdamW weight decay of the coefficient logits (paper: 5e-4)"})
    s3_epochs: int = field(default=60, metadata={
        "help": "epochs over the train rows (paper: 60); one discovery step per batch"})
    s3_warmup_epochs: int = field(default=5, metadata={
        "help": "first epochs with discovery steps only (paper: 5)"})
    s3_sparsity: float = field(default=0.3, metadata={
        "help": "weight of the sparsity loss, mean over all nodes (heads and neurons) "
                "of c_p + c_f (paper: 0.3)"})
    s3_alpha: float = field(default=0.75, metadata={
        "help": "discovery loss alpha * KL(P_orig || P_mask) - (1 - alpha) * log "
                "P_mask(answer) (paper: 0.75)"})
    s3_k: int = field(default=6, metadata={
        "help": "classification steps after each discovery step once warmup is over"})
    s3_seed: int = field(default=42, metadata={
        "help": "seed of the batch order (paper: 42)"})
    s3_batch_size: Optional[int] = field(default=None, metadata={
        "help": "train rows per discovery step, also node_pruning's (null: batch_size)"})
    s3_binary_weight: float = field(default=0.3, metadata={
        "help": "weight of the loss pushing each coefficient to 0 or 1, mean over "
                "nodes of sum_k c_k (1 - c_k) (the paper gives none; the default equals "
                "s3_sparsity's default, and does not follow s3_sparsity when that is set)"})
    s3_init_unimportant: float = field(default=1 / 3, metadata={
        "help": "initial c_u of every node, c_p = c_f = (1 - c_u) / 2 (1/3: all "
                "three equal, where the 0-or-1 loss has no gradient)"})
    s3_fi_threshold: Optional[float] = field(default=None, metadata={
        "help": "FI at or above which a circuit node is pushed to functional, below "
                "to passthrough (null: the median FI of its kind, heads and neurons apart)"})
    s3_baselines: Optional[list] = field(default=None, metadata={
        "help": "node baselines run on the same train rows and compared at the same "
                "circuit size and at s3_budgets: exact_patching, exact_patching_heads (exact "
                "patching of the heads only, for models whose neurons are too many), "
                "attribution_patching, attribution_patching_ig, node_pruning, random (null: none)"})
    s3_budgets: Optional[list] = field(default=None, metadata={
        "help": "node budgets (top-n nodes by score) for the ablation numbers and "
                "known-circuit recovery (null: the paper's 50, 100, 150, 200 for GPT-2 small)"})
    s3_reference: Optional[str] = field(default=None, metadata={
        "help": "reference circuit for recovery: a key of condense/data/"
                "known_circuits.json or a JSON file (null: gpt2_ioi / gpt2_acronym / "
                "gpt2_greater_than by task when the model is GPT-2 small, else none)"})
    s3_np_lr: float = field(default=0.1, metadata={
        "help": "node_pruning baseline: learning rate of the hard-concrete log-alphas (it "
                "trains as many steps as S3martCirc has discovery steps)"})
    s3_np_l0: float = field(default=0.3, metadata={
        "help": "node_pruning baseline: weight of the mean expected-L0 penalty over nodes"})

    def check(self):
        """Refuse values the run cannot use, naming the key, before any model loads."""
        super().check()
        for b in self.s3_baselines or []:
            if b not in BASELINES:
                raise RecipeError(f"recipe key 's3_baselines': unknown {b!r}; valid: "
                                  f"{', '.join(BASELINES)}")
        at_least(self, "s3_epochs", 1)
        at_least(self, "s3_k", 0)
        at_least(self, "s3_lr", 0, strict=True)
        at_least(self, "s3_sparsity", 0)
        at_least(self, "s3_binary_weight", 0)
        if not 0 < self.s3_init_unimportant < 1:
            refuse(self, "s3_init_unimportant", "must lie in (0, 1)")
        bad = [b for b in self.s3_budgets or [] if isinstance(b, bool) or not isinstance(b, int) or b < 1]
        if bad:
            refuse(self, "s3_budgets", "node counts must be whole numbers >= 1", value=bad)
        if not 0 <= self.s3_warmup_epochs <= self.s3_epochs:
            refuse(self, "s3_warmup_epochs", f"must lie in [0, s3_epochs = {self.s3_epochs}]")
        if not 0 <= self.s3_alpha <= 1:
            refuse(self, "s3_alpha", "must lie in [0, 1]")

    def settings(self) -> S3Settings:
        """The training settings of condense.methods.s3martcirc.method."""
        return S3Settings(lr=self.s3_lr, weight_decay=self.s3_weight_decay, epochs=self.s3_epochs,
                          warmup_epochs=self.s3_warmup_epochs, sparsity=self.s3_sparsity,
                          alpha=self.s3_alpha, k=self.s3_k,
                          batch_size=self.s3_batch_size or self.batch_size,
                          binary_weight=self.s3_binary_weight,
                          init_unimportant=self.s3_init_unimportant,
                          fi_threshold=self.s3_fi_threshold, intervention=self.intervention,
                          seed=self.s3_seed)


def run_s3martcirc(ctx: RunContext) -> dict:
    """The whole S3martCirc run (see the module docstring); returns metrics.json's contents."""
    from condense.methods.s3martcirc.recovery import PAPER_BUDGETS, default_reference

    cfg, model, graph, rows, means, main = ctx.cfg, ctx.model, ctx.graph, ctx.rows, ctx.means, ctx.is_main
    baselines = list(cfg.s3_baselines or [])
    settings = cfg.settings()
    log(f"{graph.n_layers * graph.n_heads} heads + {graph.n_layers * graph.shape.d_mlp} neurons")
    torch.manual_seed(settings.seed)
    state = FitState(ctx.path(TRAINING_STATE))  # a rerun goes on from it
    result = train_s3martcirc(model, graph, rows["train"], settings, means=means, progress=main,
                              state=state)
    if state.resumed_at:
        log(f"went on from {state.path} at step {state.resumed_at}")
    candidates = result.candidates()
    nodes = connected_nodes(graph, candidates)
    size = len(nodes)
    r_h, r_n = result.roles()
    log(f"trained in {result.seconds:.1f}s (FI {result.fi_seconds:.1f}s): {size} nodes "
        f"({nodes.n_heads} heads, {nodes.n_neurons} neurons)")

    kw = dict(intervention=cfg.intervention, batch_size=cfg.batch_size, means=means)
    test_ref = reference_for(model, graph, rows["test"], **kw)
    s3 = evaluate_nodes(model, graph, rows["test"], nodes, test_ref, **kw)
    s3.update(seconds=result.seconds, fi_seconds=result.fi_seconds,
              candidates=len(candidates), size=size,
              functional=int(((r_h == 2) & nodes.heads).sum() + ((r_n == 2) & nodes.neurons).sum()),
              passthrough=int(((r_h == 1) & nodes.heads).sum() + ((r_n == 1) & nodes.neurons).sum()),
              functional_heads=int(((r_h == 2) & nodes.heads).sum()),
              passthrough_heads=int(((r_h == 1) & nodes.heads).sum()),
              fi_thresholds=result.thresholds)
    log(f"test: ablating the circuit drops accuracy {s3['accuracy_drop']:.1f} points "
        f"({s3['accuracy_full']:.3f} -> {s3['accuracy']:.3f}), logit diff by {s3['logit_drop']:.3f}; "
        f"circuit alone: faithfulness {s3['circuit_faithfulness']:.3f}")

    # the ceiling: every node ablated (the corrupted run's accuracy); a budget at which every
    # method reaches it cannot tell methods apart
    every = NodeSet(torch.ones_like(nodes.heads), torch.ones_like(nodes.neurons))
    ceiling = ablation_metrics(model, graph, rows["test"], every, reference=test_ref, **kw)
    log(f"ceiling: every node ablated drops accuracy {ceiling['accuracy_drop']:.1f} points, "
        f"logit diff by {ceiling['logit_drop']:.3f}")

    reference = cfg.s3_reference or default_reference(graph.shape, cfg.task)
    budgets = [int(b) for b in (cfg.s3_budgets or PAPER_BUDGETS)]
    rankings = {"s3martcirc": result.scores(), "s3martcirc_coefficients": result.coefficient_scores()}
    compared = compare_baselines(
        model, graph, rows, rankings, size, baselines, budgets,
        test_reference=test_ref, ig_steps=cfg.ig_steps, seed=cfg.seed,
        pruning=dict(steps=result.discovery_steps, lr=cfg.s3_np_lr, l0_weight=cfg.s3_np_l0,
                     alpha=settings.alpha, batch_size=settings.batch_size),
        recovery_reference=reference, progress=main,
        state=ResumeFile(ctx.path(BASELINES_STATE), 0.0, label="s3martcirc: "), **kw)
    metrics = dict(
        method=cfg.method, task=cfg.task, model=cfg.model, intervention=cfg.intervention,
        nodes_total=graph.n_layers * (graph.n_heads + graph.shape.d_mlp),
        n_train=len(rows["train"]), n_test=len(rows["test"]), discovery_steps=result.discovery_steps,
        resumed_at_step=state.resumed_at, resumed_seconds=state.earlier_seconds,
        s3martcirc=s3, ceiling=dict(accuracy_drop=ceiling["accuracy_drop"],
                                    logit_drop=ceiling["logit_drop"]),
        budgets=budgets, recovery_reference=reference,
        baselines={k: v for k, v in compared.items() if k not in rankings},
        s3martcirc_budgets=compared["s3martcirc"].get("budgets"),
        s3martcirc_recovery=compared["s3martcirc"].get("recovery"),
        s3martcirc_coefficient_budgets=compared["s3martcirc_coefficients"].get("budgets"),
        s3martcirc_coefficient_recovery=compared["s3martcirc_coefficients"].get("recovery"),
        done_when=done_when(s3, compared), history=result.history)
    # flat copies of the headline numbers (wandb logs scalars)
    metrics.update(size=size, accuracy_drop=s3["accuracy_drop"], logit_drop=s3["logit_drop"],
                   seconds=result.seconds)
    circuit = role_graph(graph, result, nodes)
    if main:
        write_json(ctx.path("roles.json"), dict(
            fi_thresholds=result.thresholds, nodes=roles_table(graph, result, nodes)))
        plot_history(result.history, ctx.path("training.png"), f"S3martCirc on {cfg.task}: {size} nodes")
    return save_run(ctx, metrics, circuit)


register("s3martcirc", S3Config, run_s3martcirc, data_parallel=True,
         help="S3martCirc: node roles (unimportant / passthrough / functional) and node baselines")
