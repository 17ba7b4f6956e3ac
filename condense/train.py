"""The single entry point of every condense run (DESIGN.md §8):

    accelerate launch condense/train.py --recipe recipes/eap_ig/organism_ioi.yaml [key=value ...]
    python condense/train.py --recipe ...      # the same, without accelerate
    python -m condense.train --recipe ...

A recipe is a YAML mapping of RunConfig fields; `key=value` arguments override it. The recipe
is checked (unknown keys, wrong types, unknown method/task/...) before any model loads. The
run writes its artifacts to `output_dir` (default `checkpoints/<method>_<recipe name>`),
starting with the fully resolved `recipe.yaml`. `--help` lists every recipe key.

`method` picks a runner from RUNNERS. One-shot edge scorers (the attribution methods of
condense.attribute, with `eap_ig` = `eap_ig_inputs`) run condense.methods.scoring.
"""
import argparse
import dataclasses
import importlib
import os
import sys
from dataclasses import dataclass, field
from typing import Optional

if __package__ in (None, ""):
    # Run by path (`python condense/train.py`, which is what `accelerate launch` does): Python
    # put condense/ itself first on sys.path, where its modules would shadow top-level
    # packages (e.g. our evaluate.py the `evaluate` library). Import from the repo root instead.
    _here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
    sys.path.insert(0, os.path.dirname(_here))

from condense.attribute import METRICS  # noqa: E402
from condense.config import RecipeError, load_recipe, to_yaml  # noqa: E402
from condense.patching import INTERVENTIONS  # noqa: E402
from condense.methods.scoring import ATTRIBUTION_METHOD  # noqa: E402

# method -> "module:function" of its runner, imported only when that method runs. A runner is
# called as runner(cfg, accelerator, output_dir) and returns the metrics it wrote to
# metrics.json. It runs on the main process only, unless it sets `runner.data_parallel = True`:
# then it runs on every process (sharing work through condense.optimize) and writes on the
# main one. New methods (edge_pruning, hap, s3martcirc) add a line.
RUNNERS = {name: "condense.methods.scoring:score_once" for name in ATTRIBUTION_METHOD}
RUNNERS["condense"] = "condense.methods.condensation:run_condense"
RUNNERS["s3martcirc"] = "condense.methods.s3martcirc.run:run_s3martcirc"
RUNNERS["edge_pruning"] = "condense.methods.edge_pruning:run_edge_pruning"
RUNNERS["hap"] = "condense.methods.edge_pruning:run_hap"

REPORT_TO = ("none", "wandb")


@dataclass
class RunConfig:
    method: str = field(default="eap_ig", metadata={
        "help": f"what to run; one of: {', '.join(RUNNERS)}"})
    model: str = field(default="checkpoints/organism", metadata={
        "help": "model folder or hub name (relative paths are from the working directory)"})
    tokenizer: Optional[str] = field(default=None, metadata={
        "help": "tokenizer folder or hub name (null: the model's)"})
    task: str = field(default="ioi", metadata={
        "help": "task: ioi, induction, agreement, docstring, acronym or greater_than"})
    n_train: int = field(default=200, metadata={"help": "train rows (rank edges on these)"})
    n_val: int = field(default=100, metadata={
        "help": "val rows (MIB curves and the smallest-faithful-circuit search)"})
    n_test: int = field(default=200, metadata={"help": "test rows (the reported numbers)"})
    seed: int = field(default=0, metadata={"help": "seed for task rows and random scores"})
    ig_steps: int = field(default=5, metadata={
        "help": "points per path for eap_ig_inputs, eap_ig_activations and eap_gp"})
    gp_step: Optional[float] = field(default=None, metadata={
        "help": "eap_gp step length (null: |clean - ablated input| / ig_steps per row)"})
    intervention: str = field(default="patching", metadata={
        "help": "what a removed edge carries: patching (corrupted prompt), mean (over the "
                "train prompts) or zero"})
    metric: str = field(default="logit_diff", metadata={
        "help": "attribution metric: logit_diff or kl"})
    batch_size: int = field(default=16, metadata={"help": "rows per forward pass"})
    faithfulness_threshold: float = field(default=0.9, metadata={
        "help": "a circuit is faithful when f(C) >= this (DESIGN.md §4)"})
    search_resolution: float = field(default=0.0, metadata={
        "help": "end the smallest-faithful bisection once the bracket is narrower than this "
                "fraction of the circuit size (0: to the exact boundary; 0.01 saves about seven "
                "evaluations on a 100k-edge graph)"})
    absolute_scores: bool = field(default=True, metadata={
        "help": "search the smallest faithful circuit over edges ranked by |score| (false: "
                "by signed score)"})
    output_dir: Optional[str] = field(default=None, metadata={
        "help": "where artifacts go (null: checkpoints/<method>_<recipe file name>)"})
    report_to: str = field(default="none", metadata={
        "help": "none or wandb (offline unless WANDB_MODE says otherwise)"})
    wandb_project: str = field(default="condense", metadata={"help": "wandb project name"})
    dtype: Optional[str] = field(default=None, metadata={
        "help": "model dtype: float32, bfloat16, float16 (null: as saved)"})
    device: Optional[str] = field(default=None, metadata={
        "help": "cpu, cuda, cuda:1, ... (null: accelerate's choice)"})
    threads: Optional[int] = field(default=None, metadata={
        "help": "torch CPU threads (null: torch's default)"})
    # condensation (method: condense; DESIGN.md §5)
    heal: bool = field(default=True, metadata={
        "help": "condense: heal with a LoRA adapter after each cut (false: the C0 control)"})
    prune: bool = field(default=True, metadata={
        "help": "condense: prune each round (false: heal the full graph once, then rank and "
                "report the smallest faithful circuit)"})
    prune_fraction: float = field(default=0.3, metadata={
        "help": "condense: first cut, the fraction of surviving edges removed per round"})
    min_prune_fraction: float = field(default=0.05, metadata={
        "help": "condense: cut floor; a rejected cut halves, a rejected cut at the floor stops"})
    max_rounds: int = field(default=100, metadata={"help": "condense: most rounds to run"})
    heal_steps: int = field(default=500, metadata={"help": "condense: AdamW steps per heal"})
    heal_lr: float = field(default=1e-4, metadata={"help": "condense: heal learning rate"})
    heal_batch_size: int = field(default=16, metadata={"help": "condense: rows per heal step"})
    heal_general_weight: float = field(default=1.0, metadata={
        "help": "condense: weight of KL(original || model+adapter) on general text (train "
                "split, full graph) added to the heal loss; 0 = DESIGN.md's task-only loss"})
    heal_general_batch: int = field(default=4, metadata={
        "help": "condense: general-text blocks per heal step for that term"})
    heal_stop_loss: float = field(default=0.0, metadata={
        "help": "condense: end a heal early once its mean loss over 10 steps is below this "
                "(0: always run heal_steps)"})
    heal_ablated_grad: bool = field(default=True, metadata={
        "help": "condense: backpropagate the heal loss through the corrupted run too (the "
                "adapter also changes what pruned edges carry); false: that run is detached"})
    lora_rank: int = field(default=16, metadata={"help": "condense: LoRA rank"})
    lora_alpha: float = field(default=32, metadata={"help": "condense: LoRA alpha"})
    lora_targets: Optional[list] = field(default=None, metadata={
        "help": "condense: LoRA target module names (null: the residual-stream writers of the "
                "family: c_proj for GPT-2, o_proj and down_proj otherwise)"})
    gate_accuracy_tol: float = field(default=0.05, metadata={
        "help": "condense: accept a round when val circuit accuracy >= original - this"})
    gate_ppl_ratio: float = field(default=1.05, metadata={
        "help": "condense: accept a round when general-text ppl (adapter) / ppl (original) <= this"})
    gate_faithfulness: float = field(default=0.0, metadata={
        "help": "condense: also require val faithfulness f(C) >= this (DESIGN.md §4's "
                "faithful circuit: 0.9); 0 = DESIGN.md §5's gate (accuracy and perplexity only)"})
    n_general: int = field(default=64, metadata={
        "help": "condense: blocks of held-out general text (val split) for the perplexity gate"})
    rank_at_circuit: bool = field(default=True, metadata={
        "help": "condense: rank by linearising at the current circuit (pruned edges ablated); "
                "false: at the full model, as one-shot EAP-IG does"})
    init_circuit: Optional[str] = field(default=None, metadata={
        "help": "condense: start from this circuit.json (e.g. an edge_pruning or hap run's) "
                "instead of the full graph (null: the full graph)"})
    # edge pruning / HAP (methods: edge_pruning, hap; condense/edge_pruning.py)
    ep_steps: int = field(default=1000, metadata={
        "help": "edge_pruning/hap: AdamW steps of the mask training (hap: see hap_steps)"})
    ep_lr: float = field(default=0.1, metadata={
        "help": "edge_pruning/hap: learning rate of the hard-concrete log-alphas"})
    ep_lambda_lr: float = field(default=0.3, metadata={
        "help": "edge_pruning/hap: learning rate of the Lagrange multipliers (maximised)"})
    ep_target_sparsity: float = field(default=0.95, metadata={
        "help": "edge_pruning/hap: target fraction of the graph's edges REMOVED (expected, over "
                "all edges; 0.95 keeps 5 %)"})
    ep_ramp_fraction: float = field(default=0.8, metadata={
        "help": "edge_pruning/hap: fraction of ep_steps over which the target ramps linearly "
                "from 0 to ep_target_sparsity (then it stays there)"})
    ep_batch_size: int = field(default=32, metadata={
        "help": "edge_pruning/hap: train rows per mask-training step"})
    ep_init_log_alpha: float = field(default=10.0, metadata={
        "help": "edge_pruning/hap: initial log-alpha of every gate (plus N(0, 0.01^2) noise; "
                "10 = every edge on)"})
    hap_attribution: str = field(default="eap", metadata={
        "help": "hap: attribution method that ranks the candidate edges (eap as in the HAP "
                "paper; any condense.attribute method)"})
    hap_candidates: Optional[int] = field(default=None, metadata={
        "help": "hap: keep this many top edges by |attribution| as candidates (null: use "
                "hap_candidate_fraction)"})
    hap_candidate_fraction: float = field(default=0.3, metadata={
        "help": "hap: candidate edges as a fraction of all edges, when hap_candidates is null"})
    hap_steps: Optional[int] = field(default=None, metadata={
        "help": "hap: mask-training steps (null: Edge Pruning's ramp rate over the sparsity the "
                "candidates leave to learn, plus Edge Pruning's settle steps)"})
    # S3martCirc / node baselines (method: s3martcirc; condense/s3martcirc.py, s3martcirc_run.py,
    # node_baselines.py)
    s3_lr: float = field(default=0.005, metadata={
        "help": "s3martcirc: AdamW learning rate of the node coefficient logits (paper: 0.005)"})
    s3_weight_decay: float = field(default=5e-4, metadata={
        "help": "s3martcirc: AdamW weight decay of the coefficient logits (paper: 5e-4)"})
    s3_epochs: int = field(default=60, metadata={
        "help": "s3martcirc: epochs over the train rows (paper: 60); one discovery step per batch"})
    s3_warmup_epochs: int = field(default=5, metadata={
        "help": "s3martcirc: first epochs with discovery steps only (paper: 5)"})
    s3_sparsity: float = field(default=0.3, metadata={
        "help": "s3martcirc: weight of the sparsity loss, mean over all nodes (heads and neurons) "
                "of c_p + c_f (paper: 0.3)"})
    s3_alpha: float = field(default=0.75, metadata={
        "help": "s3martcirc: discovery loss alpha * KL(P_orig || P_mask) - (1 - alpha) * log "
                "P_mask(answer) (paper: 0.75)"})
    s3_k: int = field(default=6, metadata={
        "help": "s3martcirc: classification steps after each discovery step once warmup is over"})
    s3_seed: int = field(default=42, metadata={
        "help": "s3martcirc: seed of the batch order (paper: 42)"})
    s3_batch_size: Optional[int] = field(default=None, metadata={
        "help": "s3martcirc: train rows per discovery step, also node_pruning's (null: batch_size)"})
    s3_binary_weight: float = field(default=0.3, metadata={
        "help": "s3martcirc: weight of the loss pushing each coefficient to 0 or 1, mean over "
                "nodes of sum_k c_k (1 - c_k) (the paper gives none; default = s3_sparsity's)"})
    s3_init_unimportant: float = field(default=1 / 3, metadata={
        "help": "s3martcirc: initial c_u of every node, c_p = c_f = (1 - c_u) / 2 (1/3: all "
                "three equal, where the 0-or-1 loss has no gradient)"})
    s3_fi_threshold: Optional[float] = field(default=None, metadata={
        "help": "s3martcirc: FI at or above which a circuit node is pushed to functional, below "
                "to passthrough (null: the median FI of its kind, heads and neurons apart)"})
    s3_baselines: Optional[list] = field(default=None, metadata={
        "help": "s3martcirc: node baselines run on the same train rows and compared at the same "
                "circuit size and at s3_budgets: exact_patching, attribution_patching, "
                "attribution_patching_ig, node_pruning, random (null: none)"})
    s3_budgets: Optional[list] = field(default=None, metadata={
        "help": "s3martcirc: node budgets (top-n nodes by score) for the ablation numbers and "
                "known-circuit recovery (null: the paper's 50, 100, 150, 200 for GPT-2 small)"})
    s3_reference: Optional[str] = field(default=None, metadata={
        "help": "s3martcirc: reference circuit for recovery: a key of condense/data/"
                "known_circuits.json or a JSON file (null: gpt2_ioi / gpt2_acronym / "
                "gpt2_greater_than by task when the model is GPT-2 small, else none)"})
    s3_np_lr: float = field(default=0.1, metadata={
        "help": "node_pruning baseline: learning rate of the hard-concrete log-alphas (it "
                "trains as many steps as S3martCirc has discovery steps)"})
    s3_np_l0: float = field(default=0.3, metadata={
        "help": "node_pruning baseline: weight of the mean expected-L0 penalty over nodes"})


def check(cfg):
    """Refuse values no runner could use, before anything heavy happens."""
    from condense.models import DTYPES
    from condense.tasks import TASKS

    def one_of(key, allowed):
        value = getattr(cfg, key)
        if value not in allowed:
            raise RecipeError(f"recipe key {key!r}: unknown value {value!r}; valid: "
                              f"{', '.join(str(a) for a in allowed)}")

    one_of("method", RUNNERS)
    one_of("task", TASKS)
    one_of("intervention", INTERVENTIONS)
    one_of("metric", METRICS)
    one_of("report_to", REPORT_TO)
    if cfg.dtype is not None:
        one_of("dtype", DTYPES)
    for key in ("n_train", "n_val", "n_test", "ig_steps", "batch_size"):
        if getattr(cfg, key) < 1:
            raise RecipeError(f"recipe key {key!r}: must be >= 1, got {getattr(cfg, key)}")
    if cfg.threads is not None and cfg.threads < 1:
        raise RecipeError(f"recipe key 'threads': must be >= 1, got {cfg.threads}")
    if not 0 <= cfg.search_resolution < 1:
        raise RecipeError(f"recipe key 'search_resolution': must lie in [0, 1), got {cfg.search_resolution}")
    if not cfg.faithfulness_threshold > 0:
        raise RecipeError("recipe key 'faithfulness_threshold': must be > 0")


def load_config(recipe, overrides=()):
    """The checked RunConfig of `recipe` with `key=value` overrides, output_dir resolved."""
    cfg = load_recipe(recipe, RunConfig, overrides)
    check(cfg)
    if cfg.output_dir is None:
        name = os.path.splitext(os.path.basename(recipe))[0]
        cfg.output_dir = os.path.join("checkpoints", f"{cfg.method}_{name}")
    return cfg


def _runner(method):
    module, _, function = RUNNERS[method].partition(":")
    return getattr(importlib.import_module(module), function)


def _scalars(metrics):
    return {k: v for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def run(cfg):
    """Run `cfg` (a checked RunConfig) and return its metrics (None on non-main processes)."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    from condense.artifacts import atomic_write

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    wandb = cfg.report_to == "wandb"
    accelerator = Accelerator(cpu=cfg.device == "cpu", log_with="wandb" if wandb else None)
    set_seed(cfg.seed)
    out = cfg.output_dir
    if wandb:  # offline by default: our machines have no network, and a run must not hang
        accelerator.init_trackers(cfg.wandb_project, config=dataclasses.asdict(cfg), init_kwargs={
            "wandb": dict(mode=os.environ.get("WANDB_MODE", "offline"), dir=out,
                          name=os.path.basename(os.path.normpath(out)))})
    metrics = None
    runner = _runner(cfg.method)
    if accelerator.is_main_process:
        os.makedirs(out, exist_ok=True)
        atomic_write(os.path.join(out, "recipe.yaml"),
                     f"# accelerate launch condense/train.py --recipe {os.path.join(out, 'recipe.yaml')}\n"
                     + to_yaml(cfg))
    accelerator.wait_for_everyone()
    # data-parallel runners run on every process (and write only on the main one); the others
    # run on the main process while the rest wait
    if getattr(runner, "data_parallel", False) or accelerator.is_main_process:
        metrics = runner(cfg, accelerator, out)
    if accelerator.is_main_process:
        if wandb:
            accelerator.log(_scalars(metrics))
        print(f"[condense] wrote {out}/", flush=True)
    else:
        metrics = None
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return metrics


def _keys_help():
    lines = ["recipe keys (YAML or key=value):"]
    for f in dataclasses.fields(RunConfig):
        lines.append(f"  {f.name} (default {f.default!r}): {f.metadata['help']}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="condense/train.py",
                                 description="Run a recipe (DESIGN.md §8); see condense/train.py.",
                                 epilog=_keys_help(),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", required=True, help="YAML recipe, e.g. recipes/eap_ig/organism_ioi.yaml")
    ap.add_argument("overrides", nargs="*", help="key=value recipe overrides")
    args = ap.parse_args(argv)
    return run(load_config(args.recipe, args.overrides))


if __name__ == "__main__":
    try:
        main()
    except RecipeError as e:
        sys.exit(f"error: {e}")
