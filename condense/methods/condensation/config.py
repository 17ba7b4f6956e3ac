"""Condensation's recipe keys (CondenseConfig) and the checks that run before any model loads."""
import os
from dataclasses import dataclass, field
from typing import Optional, Union

from condense.artifacts import DamagedFile, read_json
from condense.config import RecipeError, RunConfig, at_least, refuse
from condense.tasks import SECOND_SOURCE, TASKS

# PEFT's shorthand for every linear (and GPT-2 Conv1D) layer but the output head
ALL_LINEAR = "all-linear"


@dataclass
class CondenseConfig(RunConfig):
    """Condensation's keys (the module docstring describes the loop)."""
    # a run may be capped or extended on resume: the rounds done so far do not depend on it
    rerun_free = ("max_rounds", "n_test", "final_heal_steps", "final_heal_rows", "fidelity")
    # keys added after runs were shipped, with the value a run folder that lacks one ran with
    # (its recipe.yaml lists every key it had): the old gate, without guards or bound
    added_later = dict(gate_tasks="none", gate_text_blocks=0, gate_confidence=0.0, fidelity=False)
    method: str = field(default="condense", metadata={"help": "condense (this config's method)"})
    heal: bool = field(default=True, metadata={
        "help": "heal with a LoRA adapter after each cut (false: the C0 control)"})
    prune: bool = field(default=True, metadata={
        "help": "prune each round (false: heal the full graph once, then rank and "
                "report the smallest faithful circuit)"})
    prune_fraction: float = field(default=0.3, metadata={
        "help": "first cut, the fraction of surviving edges removed per round"})
    min_prune_fraction: float = field(default=0.05, metadata={
        "help": "cut floor; a rejected cut halves, a rejected cut at the floor stops"})
    max_rounds: int = field(default=100, metadata={"help": "most rounds to run"})
    heal_steps: int = field(default=500, metadata={"help": "AdamW steps per heal"})
    heal_lr: float = field(default=1e-4, metadata={"help": "heal learning rate"})
    heal_batch_size: int = field(default=16, metadata={"help": "rows per heal step"})
    heal_general_weight: float = field(default=1.0, metadata={
        "help": "weight of KL(original || model+adapter) on general text (train "
                "split, full graph) added to the heal loss; 0 = the task-only loss of the design (docs/design.md)"})
    heal_general_batch: int = field(default=4, metadata={
        "help": "general-text blocks per heal step for that term"})
    heal_stop_loss: float = field(default=0.0, metadata={
        "help": "end a heal early once its mean loss over 10 steps is below this "
                "(0: always run heal_steps)"})
    heal_corrupted_weight: float = field(default=0.0, metadata={
        "help": "weight of KL(original || model+adapter) at the last position of the corrupted "
                "prompts (full graph) added to the heal loss: keeps the empty circuit (the "
                "adapted model on the corrupted prompt) from learning to answer from the "
                "corruption, which gate_empty_fails would reject. 0: the design's loss"})
    heal_full_weight: float = field(default=0.0, metadata={
        "help": "lever toward the original: weight of KL(original || model+adapter) at the last "
                "position of the clean task prompts with every edge on, added to the heal loss: "
                "the healed full model is held at the original on the task itself, not only the "
                "circuit. 0: the design's loss"})
    heal_adapter_penalty: float = field(default=0.0, metadata={
        "help": "lever toward the original: weight of sum ||dW||^2 / sum ||W||^2 over the adapted "
                "modules (dW = the LoRA's scaling * B A), added to the heal loss: a small adapter "
                "changes the original little. 0: no penalty"})
    lora_on_circuit: bool = field(default=False, metadata={
        "help": "lever toward the original: before each heal, the adapter keeps (and trains) only "
                "what writes from the candidate's own nodes: the output-projection columns of its "
                "heads and the modules of its MLPs (with wider lora_targets, the attention modules "
                "of layers with a circuit head); the rest is zeroed and frozen, so no new route "
                "grows elsewhere. false: every adapted module heals"})
    heal_temperature: float = field(default=1.0, metadata={
        "help": "temperature of the task-row distillation: KL between the original's and the "
                "circuit's next-token distributions both divided by it, times its square; below "
                "1 sharpens both, weighting which token is on top over the tail "
                "(benchmarks/heal_objective.py). The general-text and corrupted-prompt terms "
                "stay at 1. 1: the design's loss"})
    heal_gate_every: int = field(default=0, metadata={
        "help": "during a heal, run the gate on the candidate every this many steps (with the "
                "base in its own dtype) and end the heal as soon as it accepts; the heal's "
                "batches are the same, so this only stops sooner; the heal-only control "
                "(prune=false) always heals in full. 0: always run heal_steps (the design)"})
    heal_ablated_grad: bool = field(default=True, metadata={
        "help": "backpropagate the heal loss through the corrupted run too (the "
                "adapter also changes what pruned edges carry); false: that run is detached"})
    heal_dtype: Optional[str] = field(default=None, metadata={
        "help": "dtype a heal computes in: bfloat16 casts the base model's weights for the heal "
                "and restores them exactly after (the adapter and its optimizer stay float32; "
                "the gate and ranking never see it); SmolLM2's heal steps ran 1.6x faster on a CPU "
                "with bf16 instructions (benchmarks/heal_dtype.py). null: the model's own dtype "
                "(the design)"})
    final_heal_steps: int = field(default=0, metadata={
        "help": "after the last round, heal the final circuit this many steps more (no early "
                "stop) and keep that adapter only if the gate still accepts it; with "
                "heal_if_needed the last accepted cuts may never have been healed at their "
                "own size. 0: no final heal (the design's loop)"})
    final_heal_rows: Optional[int] = field(default=None, metadata={
        "help": "train rows for the final heal (the first this many of the train split, "
                "a superset of the run's; null: the run's n_train rows)"})
    lora_rank: int = field(default=16, metadata={"help": "LoRA rank"})
    lora_alpha: float = field(default=32, metadata={"help": "LoRA alpha"})
    lora_targets: Optional[Union[list, str]] = field(default=None, metadata={
        "help": f"LoRA target module names, or \"{ALL_LINEAR}\" for every linear layer but the "
                "output head (q, k, v, o, gate, up, down on Llama; c_attn, c_proj, c_fc on "
                "GPT-2); null: the residual-stream writers of the family: c_proj for GPT-2, "
                "o_proj and down_proj otherwise"})
    gate_accuracy_tol: float = field(default=0.05, metadata={
        "help": "accept a round when val circuit accuracy >= original - this"})
    gate_empty_fails: bool = field(default=True, metadata={
        "help": "also require the empty circuit (model with adapter, every edge ablated) to "
                "fail the accuracy gate on val: an adapter that answers from the corrupted "
                "run leaves a circuit whose edges carry nothing (false: the design's gate)"})
    gate_confidence: float = field(default=0.95, metadata={
        "help": "accept only when the one-sided lower bound at this confidence (e.g. 0.95) on "
                "the circuit's val accuracy minus the original's, paired over the same rows, is "
                ">= -gate_accuracy_tol: an accepted round is above the floor beyond sampling "
                "noise (benchmarks/gate_noise.py: 134 of 313 accepted rounds and 13 of 15 C1s of "
                "the runs shipped before it were not). 0: the point rule (the design's gate)"})
    gate_adapter_off_faithfulness: float = field(default=0.0, metadata={
        "help": "lever toward the original: also require the circuit's val faithfulness on the "
                "original weights (adapter off; f against the original's full and empty logit "
                "differences) >= this: C1 must describe the original, not only the healed model. "
                "0: off"})
    gate_ppl_ratio: float = field(default=1.05, metadata={
        "help": "accept a round when general-text ppl (adapter) / ppl (original) <= this"})
    gate_faithfulness: float = field(default=0.0, metadata={
        "help": "also require val faithfulness f(C) >= this (a faithful circuit: 0.9); "
                "0 = the design's gate (accuracy and perplexity only)"})
    gate_top1_agreement: float = field(default=0.0, metadata={
        "help": "also require the circuit's val top-1 token (whole vocabulary) to equal the "
                "original model's on at least this fraction of rows (e.g. 0.95); "
                "0 = the design's gate (accuracy and perplexity only)"})
    gate_tasks: str = field(default="all", metadata={
        "help": "capability guard: the healed full model (adapter on, nothing ablated) must stay "
                "within gate_task_tol of the original's accuracy, and under gate_task_kl of KL, on "
                "gate_task_rows val rows of each of these tasks: all (the six built-in tasks), a "
                "comma-separated list, or none (off: the design's gate, which let an adapter "
                "break its own task's full model, docs/fidelity.md)"})
    gate_task_rows: int = field(default=50, metadata={
        "help": "val rows per task for the capability guard"})
    gate_task_tol: Optional[float] = field(default=None, metadata={
        "help": "largest accuracy drop of the healed full model on a guarded task (null: "
                "gate_accuracy_tol)"})
    gate_task_kl: float = field(default=0.5, metadata={
        "help": "largest mean KL(original || healed full model) at the last position on a "
                "guarded task's rows (0: no KL guard); the shipped SmolLM2 C1s reach 0.28 on their "
                "own task, 0.04 on the others"})
    gate_text_blocks: int = field(default=64, metadata={
        "help": "capability guard: blocks of 128 tokens of second-source text (gate_text_path; "
                "no heal trains on it, and none of the blocks the fidelity card reads) on which "
                "perplexity (healed / original) must stay <= gate_text_ppl_ratio; its bootstrap "
                "95-percent interval at 64 blocks is about +-0.01 (0: off)"})
    gate_text_ppl_ratio: Optional[float] = field(default=None, metadata={
        "help": "largest second-source perplexity ratio (null: gate_ppl_ratio)"})
    gate_text_path: str = field(default=SECOND_SOURCE, metadata={
        "help": "folder (or file) of plain-text documents for that guard"})
    n_general: int = field(default=64, metadata={
        "help": "blocks of held-out general text (val split) for the perplexity gate"})
    rank_at_circuit: bool = field(default=True, metadata={
        "help": "rank by linearising at the current circuit (pruned edges ablated); "
                "false: at the full model, as one-shot EAP-IG does"})
    init_circuit: Optional[str] = field(default=None, metadata={
        "help": "start from this circuit.json (e.g. an edge_pruning or hap run's) "
                "instead of the full graph (null: the full graph)"})
    # shortcuts for large models (each off by default: the design's loop)
    rank_rows: Optional[int] = field(default=None, metadata={
        "help": "rank on the first this many train rows (null: all of them; heal uses all)"})
    early_rank_method: Optional[str] = field(default=None, metadata={
        "help": "attribution method for rounds whose circuit has more than early_rank_edges "
                "edges, e.g. eap (one pass instead of EAP-IG's ig_steps; null: EAP-IG always)"})
    early_rank_edges: int = field(default=0, metadata={
        "help": "circuit size above which early_rank_method ranks"})
    fidelity: bool = field(default=True, metadata={
        "help": "measure the fidelity card at the end (fidelity.json, metrics.json's "
                "\"fidelity\"; docs/fidelity.md): how much of C1 the original model carries, the "
                "healed full model on every task, new text and paraphrases (minutes on SmolLM2)"})
    heal_if_needed: bool = field(default=False, metadata={
        "help": "gate each candidate before healing it and accept it unhealed when it passes "
                "(heal only what the gate rejects); false: heal every round"})

    def _check_init_circuit(self):
        read_circuit_file(self.init_circuit)

    def check(self):
        """Refuse condensation values the loop cannot use, naming the key, before any model loads."""
        super().check()
        for key in ("heal_steps", "heal_batch_size", "heal_general_batch", "lora_rank", "max_rounds"):
            at_least(self, key, 1)
        for key in ("heal_general_weight", "heal_corrupted_weight", "heal_stop_loss", "n_general", "final_heal_steps",
                    "heal_gate_every"):
            at_least(self, key, 0)
        at_least(self, "heal_lr", 0, strict=True)
        at_least(self, "heal_temperature", 0, strict=True)
        at_least(self, "gate_task_rows", 1)
        at_least(self, "gate_text_blocks", 0)
        at_least(self, "gate_task_kl", 0)
        if self.gate_task_tol is not None:
            at_least(self, "gate_task_tol", 0)
        if self.gate_text_ppl_ratio is not None:
            at_least(self, "gate_text_ppl_ratio", 0, strict=True)
        bad = sorted(set(guarded_tasks(self.gate_tasks)) - set(TASKS)) if self.gate_tasks not in ("all", "none") else []
        if bad:
            refuse(self, "gate_tasks", f"{', '.join(bad)} not a task: all, none, or of {', '.join(TASKS)}")
        if self.gate_text_blocks and not os.path.exists(self.gate_text_path):
            refuse(self, "gate_text_path", "no such file or folder (gate_text_blocks=0 turns the guard off)")
        for key in ("heal_full_weight", "heal_adapter_penalty"):
            at_least(self, key, 0)
        if not 0 <= self.gate_adapter_off_faithfulness <= 1:
            refuse(self, "gate_adapter_off_faithfulness", "must lie in [0, 1] (0: off)")
        if not 0 <= self.gate_confidence < 1:
            refuse(self, "gate_confidence", "must lie in [0, 1) (0: the point rule)")
        if not 0 <= self.gate_faithfulness <= 1:
            refuse(self, "gate_faithfulness", "must lie in [0, 1] (0: off)")
        if not 0 <= self.gate_top1_agreement <= 1:
            refuse(self, "gate_top1_agreement", "must lie in [0, 1] (0: off)")
        if not 0 < self.prune_fraction <= 1:
            refuse(self, "prune_fraction", "must lie in (0, 1]")
        if not 0 < self.min_prune_fraction <= self.prune_fraction:
            refuse(self, "min_prune_fraction", f"must lie in (0, prune_fraction = {self.prune_fraction}]")
        if self.init_circuit:
            self._check_init_circuit()
        if self.final_heal_rows is not None and self.final_heal_rows < 1:
            refuse(self, "final_heal_rows", "must be at least 1 or null")
        if self.rank_rows is not None and not 1 <= self.rank_rows <= self.n_train:
            refuse(self, "rank_rows", f"must lie in [1, n_train = {self.n_train}] or be null")
        if self.heal_dtype is not None:
            from condense.models import DTYPES
            if self.heal_dtype not in DTYPES:
                refuse(self, "heal_dtype", f"must be one of {', '.join(DTYPES)} or null")
            if self.quantization:
                refuse(self, "heal_dtype", "cannot be combined with a quantized base (its layers "
                       "compute in the dtype they were loaded with); use null")
        if self.early_rank_method is not None:
            from condense.attribute import METHODS
            if self.early_rank_method not in METHODS:
                refuse(self, "early_rank_method", f"must be one of {', '.join(METHODS)} or null")
        at_least(self, "early_rank_edges", 0)
        self._check_lora_targets()

    def _check_lora_targets(self):
        targets = self.lora_targets
        if isinstance(targets, str) and targets != ALL_LINEAR:
            refuse(self, "lora_targets", f'must be a list of module names, "{ALL_LINEAR}" or null')
        if isinstance(targets, list):
            if not targets:
                refuse(self, "lora_targets", "must name at least one module (null: the family's default)")
            bad = [t for t in targets if not isinstance(t, str) or not t]
            if bad:
                refuse(self, "lora_targets", "every entry must be a module name", bad[0])


def read_circuit_file(path, what="init_circuit"):
    """The JSON of circuit file `path` with at least one edge in the graph, or a RecipeError
    naming the problem (a folder, no such file, not JSON, not a circuit, NaN/Inf scores, no
    edge on)."""
    from condense.graph import check_circuit_json
    if os.path.isdir(path):
        raise RecipeError(f"recipe key {what!r}: {path} is a folder; give its circuit.json")
    if not os.path.exists(path):
        raise RecipeError(f"recipe key {what!r}: no such circuit file {path}")
    try:
        d = read_json(path)
        check_circuit_json(d, path)
    except DamagedFile as e:
        raise RecipeError(f"recipe key {what!r}: {e}") from None
    if not any(e["in_graph"] for e in d["edges"].values()):
        raise RecipeError(f"recipe key {what!r}: {path} has no edge in its circuit")
    return d


def check_init_circuit_model(cfg):
    """Before the model loads: init_circuit was found for a model of this shape."""
    if not cfg.init_circuit:
        return
    from condense.graph import Graph
    from condense.models import model_config
    read_circuit_file(cfg.init_circuit)
    try:
        start = Graph.from_json(cfg.init_circuit, model_config(cfg.model))
    except (ValueError, KeyError) as e:
        raise RecipeError(f"recipe key 'init_circuit': {e}") from None
    if start.prune().count_edges() == 0:
        raise RecipeError(f"recipe key 'init_circuit': {cfg.init_circuit} has no edge on an "
                          f"input -> logits path")


def guarded_tasks(value: str) -> tuple:
    """The tasks a gate_tasks value names: all, none, or a comma-separated list."""
    if value == "all":
        return TASKS
    if value in ("none", "", None):
        return ()
    return tuple(t.strip() for t in value.split(",") if t.strip())
