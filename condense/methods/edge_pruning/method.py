"""The `edge_pruning` and `hap` methods: their recipe keys, the run (search, test evaluation,
artifacts) and their registration."""
import json
import os
import time
from dataclasses import dataclass, field
from typing import Optional

from condense.artifacts import atomic_write
from condense.config import RunConfig, at_least, refuse
from condense.evaluate import evaluate
from condense.methods import register
from condense.methods.edge_pruning.search import search
from condense.runs import TRAINING_STATE, RunContext, log, save_run


# ------------------------------------------------------------------ recipe checks and runners
@dataclass
class EdgePruningConfig(RunConfig):
    """Edge Pruning's keys (the package docstring describes the search)."""
    method: str = field(default="edge_pruning", metadata={"help": "edge_pruning (this config's method)"})
    ep_steps: int = field(default=1000, metadata={
        "help": "AdamW steps of the mask training (hap: see hap_steps)"})
    ep_lr: float = field(default=0.1, metadata={
        "help": "learning rate of the hard-concrete log-alphas"})
    ep_lambda_lr: float = field(default=0.3, metadata={
        "help": "learning rate of the Lagrange multipliers (maximised)"})
    ep_target_sparsity: float = field(default=0.95, metadata={
        "help": "target fraction of the graph's edges REMOVED (expected, over "
                "all edges; 0.95 keeps 5 %)"})
    ep_ramp_fraction: float = field(default=0.8, metadata={
        "help": "fraction of ep_steps over which the target ramps linearly "
                "from 0 to ep_target_sparsity (then it stays there)"})
    ep_batch_size: int = field(default=32, metadata={
        "help": "train rows per mask-training step"})
    ep_init_log_alpha: float = field(default=10.0, metadata={
        "help": "initial log-alpha of every gate (plus N(0, 0.01^2) noise; "
                "10 = every edge on)"})

    def check(self):
        """Refuse values the search cannot use, before any model loads."""
        super().check()
        for key in ("ep_steps", "ep_batch_size"):
            at_least(self, key, 1)
        for key in ("ep_lr", "ep_lambda_lr"):
            at_least(self, key, 0, strict=True)
        if not 0.0 < self.ep_target_sparsity < 1.0:
            refuse(self, "ep_target_sparsity", "must lie in (0, 1) (the fraction of edges removed)")
        if not 0.0 <= self.ep_ramp_fraction <= 1.0:
            refuse(self, "ep_ramp_fraction", "must lie in [0, 1]")


@dataclass
class HAPConfig(EdgePruningConfig):
    """HAP: Edge Pruning over the top edges of an attribution (its candidates)."""
    method: str = field(default="hap", metadata={"help": "hap (this config's method)"})
    hap_attribution: str = field(default="eap", metadata={
        "help": "attribution method that ranks the candidate edges (eap as in the HAP "
                "paper; any condense.attribute method)"})
    hap_candidates: Optional[int] = field(default=None, metadata={
        "help": "keep this many top edges by |attribution| as candidates (null: use "
                "hap_candidate_fraction)"})
    hap_candidate_fraction: float = field(default=0.3, metadata={
        "help": "candidate edges as a fraction of all edges, when hap_candidates is null"})
    hap_steps: Optional[int] = field(default=None, metadata={
        "help": "mask-training steps (null: Edge Pruning's ramp rate over the sparsity the "
                "candidates leave to learn, plus Edge Pruning's settle steps)"})

    def check(self):
        super().check()
        from condense.attribute import METHODS
        if self.hap_attribution not in METHODS:
            refuse(self, "hap_attribution", f"must be one of {', '.join(METHODS)}")
        if self.hap_candidates is not None and self.hap_candidates < 1:
            refuse(self, "hap_candidates", "must be >= 1 or null")
        if not 0.0 < self.hap_candidate_fraction <= 1.0:
            refuse(self, "hap_candidate_fraction", "must lie in (0, 1]")
        if self.hap_steps is not None and self.hap_steps < 1:
            refuse(self, "hap_steps", "must be >= 1 or null")


def plot_training(history, path, title):
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    steps = [h["step"] for h in history]
    ax.plot(steps, [h["expected_edges"] for h in history], color="tab:blue", label="expected edges")
    n = history[0]["expected_edges"] / max(1e-9, 1 - history[0]["sparsity"]) if history else 0
    ax.plot(steps, [(1 - h["target"]) * n for h in history], "--", color="tab:blue", label="target")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("edges", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(steps, [h["kl"] for h in history], color="tab:red", alpha=0.6)
    ax2.set_ylabel("KL (train batch)", color="tab:red")
    ax.legend(loc="upper right", fontsize=7)
    ax.set_title(title)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100), mode="wb")
    plt.close(fig)


def run(ctx: RunContext) -> dict:
    """The Edge Pruning or HAP run (the config's class says which); returns metrics.json's
    contents. Data parallel: every process trains on its share of each batch."""
    from safetensors.torch import save

    cfg, model, rows, means = ctx.cfg, ctx.model, ctx.rows, ctx.means
    hap = isinstance(cfg, HAPConfig)
    start = time.perf_counter()
    method = "hap" if hap else "edge_pruning"
    log(f"{method} {cfg.task}: target sparsity {cfg.ep_target_sparsity}")
    training = ctx.path(TRAINING_STATE)  # an interrupted run goes on from it
    res = search(model, rows["train"], cfg, hap=hap, means=means, state_path=training)
    if res["resumed_at"]:
        log(f"went on from {training} at step {res['resumed_at']}")
    circuit, masks = res["circuit"], res["masks"]
    if hap:
        log(f"{cfg.hap_attribution}: {res['n_candidates']} candidate edges of {res['n_edges']} "
            f"in {res['rank_seconds']:.1f}s; start sparsity {res['start_sparsity']:.3f}")
    log(f"{res['steps']} steps (ramp {res['ramp_steps']}) in {res['train_seconds']:.1f}s; learned "
        f"sparsity {masks.learned_sparsity():.4f} -> {res['edges_kept']} edges, "
        f"{circuit.count_edges(on_path=True)} on a path")
    test = evaluate(model, circuit, rows["test"], intervention=cfg.intervention,
                    batch_size=cfg.batch_size, means=means)
    log(f"test: accuracy {test['accuracy']:.3f} (full {test['accuracy_full']:.3f}), KL "
        f"{test['kl']:.4f}, faithfulness {test['faithfulness']:.3f}")
    last = res["history"][-1]
    metrics = dict(
        method=method, task=cfg.task, model=cfg.model, intervention=cfg.intervention,
        target_sparsity=cfg.ep_target_sparsity, sparsity=masks.learned_sparsity(),
        edges_kept=res["edges_kept"], edges=circuit.count_edges(on_path=True),
        total_edges=res["n_edges"], n_gated=res["n_candidates"],
        start_sparsity=res["start_sparsity"], steps=res["steps"], ramp_steps=res["ramp_steps"],
        accuracy=test["accuracy"], top1=test["top1"], logit_diff=test["logit_diff"],
        kl=test["kl"], faithfulness=test["faithfulness"], accuracy_full=test["accuracy_full"],
        logit_diff_full=test["logit_diff_full"], logit_diff_empty=test["logit_diff_empty"],
        train_kl_last=last["kl"], lambda1=float(res["lambdas"][0]), lambda2=float(res["lambdas"][1]),
        rank_seconds=res["rank_seconds"], train_seconds=res["train_seconds"],
        resumed_at_step=res["resumed_at"], resumed_seconds=res["resumed_seconds"],
        search_seconds=res["search_seconds"], search_cpu_seconds=res["cpu_seconds"],
        wall_seconds=res["resumed_seconds"] + time.perf_counter() - start,
        n_train=len(rows["train"]), n_test=len(rows["test"]))
    if hap:
        metrics.update(hap_attribution=cfg.hap_attribution, n_candidates=res["n_candidates"])

    if ctx.is_main:  # data parallel: the main process writes
        os.makedirs(ctx.path("state"), exist_ok=True)
        atomic_write(ctx.path(os.path.join("state", "masks.safetensors")),
                     save({"log_alpha": masks.full_log_alpha().contiguous()}))
        atomic_write(ctx.path("training.jsonl"), "".join(json.dumps(h) + "\n" for h in res["history"]))
        plot_training(res["history"], ctx.path("training.png"),
                      f"{method} on {cfg.task}: expected edges and KL per step")
    return save_run(ctx, metrics, circuit)


register("edge_pruning", EdgePruningConfig, run, data_parallel=True,
         help="Edge Pruning: a hard-concrete gate per edge, trained to a target sparsity")
register("hap", HAPConfig, run, data_parallel=True,
         help="HAP: Edge Pruning over an attribution's top edges only")
