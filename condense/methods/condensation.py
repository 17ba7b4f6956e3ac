"""Condensation, method `condense`: rank -> prune -> heal -> gate.

Each round:
1. rank: EAP-IG (inputs, `ig_steps`) with the current adapter on the train rows, linearised at
   the current circuit (pruned edges ablated in every pass; `rank_at_circuit=false`: at the
   full model); only the surviving edges' scores count;
2. prune: drop the lowest `cut` fraction of the surviving edges by |score|, then
   Graph.prune() drops edges left off every input -> logits path;
3. heal (`heal=true`): `heal_steps` AdamW steps on the LoRA parameters only (base frozen),
   loss = KL(original model on clean || circuit model with adapter) at the **last position**
   of each prompt (where the task metric is read), pruned edges ablated by patching with
   the same model+adapter in the same step (the gradient flows through that run too;
   `heal_ablated_grad=false` detaches it), plus
   `heal_general_weight` x KL(original || model+adapter) on general text (train split, full
   graph). The design's loss is the task term alone (heal_general_weight=0); measured on the
   organism, the task term alone moves general text until the perplexity gate rejects every
   later round (docs/condensation.md), so the default keeps general text distilled too;
   With `heal_if_needed` the candidate is gated first and healed only when that gate rejects
   it (the accepted-unhealed rounds are logged);
4. gate on held-out data: circuit accuracy on the val rows >= the original full model's
   val accuracy - `gate_accuracy_tol`, and perplexity (model+adapter, plain full forward)
   / perplexity (original) <= `gate_ppl_ratio` on `n_general` blocks of general text
   (split `val`); with `gate_faithfulness` > 0 also val faithfulness f(C) >= it (f against
   the original model's full logit difference, the empty circuit of model+adapter).
   A round whose heal loss turns NaN/inf is rejected (logged).
On rejection the last accepted adapter and circuit are restored and the cut halves (at
least `min_prune_fraction`); a rejected cut at that floor, or `max_rounds`, ends the run.
Two candidates are rejected without a heal (logged in rounds.jsonl as `skipped`): one with
no input -> logits path left, and one whose edges equal a candidate already rejected since
the last accepted round (on small circuits every halved cut still removes one edge, the
same one: its heal would only be re-seeded).
C1 = the last accepted circuit. `heal=false` gives C0; `prune=false` heals the full graph
once, then ranks with EAP-IG and reports the smallest faithful circuit (curves.smallest_faithful).

Determinism and resume: every random draw of a round comes from a generator seeded with
(seed, round), data order is fixed, so no RNG state has to be carried between rounds. After
every round `state/` gets the accepted adapter and circuit (files named by round), then
`state/state.json` (round counter, current cut, accepted files, per-round log, seeds) is
renamed into place last: a kill at any moment leaves a consistent state, and rerunning the
same command continues from it and ends with the same circuit as an uninterrupted run.

Data parallel (`ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes N` on CPU,
`--multi_gpu` on GPUs): every process runs this loop. Ranking splits the train rows over the
processes and sums the per-row scores (all-reduce); heal draws the same batch everywhere, each
process takes its share (condense.optimize.shard) and fit() averages the gradients, so every
process applies the same update; the gate and the final metrics are computed by every process
on the same data and weights (identical decisions without communication); only the main process
writes. Up to float summation order this is the one-process run, so it ends with the same
circuit (tests/test_condense.py checks it). Use heal_batch_size divisible by N.
"""
import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F

from condense import tasks
from condense.artifacts import atomic_write, write_json
from condense.attribute import attribute
from condense.curves import smallest_faithful
from condense.evaluate import EvalReference, dataset_columns, evaluate, reference_outputs
from condense.graph import Graph
from condense.metrics import ACCURACY_EPS, pad_batch, perplexity
from condense.model_parts import model_shape
from condense.config import RecipeError, RunConfig, at_least
from condense.methods import register
from condense.optimize import Diverged, all_reduce_, fit, shard, world
from condense.patching import run_graph
from condense.runs import RunContext, log

@dataclass
class CondenseConfig(RunConfig):
    """Condensation's keys (the module docstring describes the loop)."""
    # a run may be capped or extended on resume: the rounds done so far do not depend on it
    rerun_free = ("max_rounds", "n_test")
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
    heal_ablated_grad: bool = field(default=True, metadata={
        "help": "backpropagate the heal loss through the corrupted run too (the "
                "adapter also changes what pruned edges carry); false: that run is detached"})
    lora_rank: int = field(default=16, metadata={"help": "LoRA rank"})
    lora_alpha: float = field(default=32, metadata={"help": "LoRA alpha"})
    lora_targets: Optional[list] = field(default=None, metadata={
        "help": "LoRA target module names (null: the residual-stream writers of the "
                "family: c_proj for GPT-2, o_proj and down_proj otherwise)"})
    gate_accuracy_tol: float = field(default=0.05, metadata={
        "help": "accept a round when val circuit accuracy >= original - this"})
    gate_ppl_ratio: float = field(default=1.05, metadata={
        "help": "accept a round when general-text ppl (adapter) / ppl (original) <= this"})
    gate_faithfulness: float = field(default=0.0, metadata={
        "help": "also require val faithfulness f(C) >= this (a faithful circuit: 0.9); "
                "0 = the design's gate (accuracy and perplexity only)"})
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
        for key in ("heal_general_weight", "heal_stop_loss", "n_general"):
            at_least(self, key, 0)
        at_least(self, "heal_lr", 0, strict=True)

        def bad(key, why):
            raise RecipeError(f"recipe key {key!r}: {why}, got {getattr(self, key)!r}")
        if not 0 <= self.gate_faithfulness <= 1:
            bad("gate_faithfulness", "must lie in [0, 1] (0: off)")
        if not 0 < self.prune_fraction <= 1:
            bad("prune_fraction", "must lie in (0, 1]")
        if not 0 < self.min_prune_fraction <= self.prune_fraction:
            bad("min_prune_fraction", f"must lie in (0, prune_fraction = {self.prune_fraction}]")
        if self.init_circuit:
            self._check_init_circuit()
        if self.rank_rows is not None and not 1 <= self.rank_rows <= self.n_train:
            bad("rank_rows", f"must lie in [1, n_train = {self.n_train}] or be null")
        if self.early_rank_method is not None:
            from condense.attribute import METHODS
            if self.early_rank_method not in METHODS:
                bad("early_rank_method", f"must be one of {', '.join(METHODS)} or null")
        at_least(self, "early_rank_edges", 0)


# residual-stream writers per model family (attention output and MLP down projections)
LORA_TARGETS = {"gpt2": ["c_proj"]}
DEFAULT_LORA_TARGETS = ["o_proj", "down_proj"]
STATE_FILE = "state.json"


HealDiverged = Diverged  # the heal loss or the adapter became NaN/inf: the round is rejected


def is_main():
    return world()[0] == 0


def barrier():
    if world()[1] > 1:
        import torch.distributed as dist
        dist.barrier()


def lora_targets(cfg, model):
    if cfg.lora_targets:
        return list(cfg.lora_targets)
    return LORA_TARGETS.get(model_shape(model).model_type, DEFAULT_LORA_TARGETS)


def add_adapter(model, cfg):
    """A fresh LoRA on every residual-stream writer; base weights frozen."""
    from peft import LoraConfig, get_peft_model
    targets = lora_targets(cfg, model)
    gpt2 = model_shape(model).model_type == "gpt2"
    torch.manual_seed(cfg.seed)  # LoRA A init
    config = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, target_modules=targets,
                        lora_dropout=0.0, bias="none", fan_in_fan_out=gpt2)
    peft_model = get_peft_model(model, config)
    for name, p in peft_model.named_parameters():
        p.requires_grad_("lora_" in name)
    return peft_model.eval()


def adapter_state(model):
    return {k: v.detach().clone() for k, v in model.named_parameters() if "lora_" in k}


def load_adapter_state(model, state):
    params = dict(model.named_parameters())
    with torch.no_grad():
        for k, v in state.items():
            params[k].copy_(v)


def _round_seed(cfg, rnd):
    return int(cfg.seed) * 100003 + int(rnd)


# ------------------------------------------------------------------ original model outputs
@torch.no_grad()
def last_logprobs(model, rows, batch_size):
    """Original model's last-position log-probs [N, V] on the clean prompts (heal target)."""
    cols, n = dataset_columns(rows)
    device = next(model.parameters()).device
    out = [None] * n
    order = sorted(range(n), key=lambda i: len(cols["clean_ids"][i]))
    for start in range(0, n, batch_size):
        idx = order[start:start + batch_size]
        ids, mask, lengths = pad_batch([list(cols["clean_ids"][i]) for i in idx])
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        last = logits[torch.arange(len(idx), device=device), (lengths - 1).to(device)]
        lp = F.log_softmax(last.float(), -1).cpu()
        for j, i in enumerate(idx):
            out[i] = lp[j]
    return torch.stack(out)


# ------------------------------------------------------------------ the four phases
def read_circuit_file(path, what="init_circuit"):
    """The JSON of circuit file `path` with at least one edge in the graph, or a RecipeError
    naming the problem (a folder, no such file, not JSON, not a circuit, no edge on)."""
    import gzip
    if os.path.isdir(path):
        raise RecipeError(f"recipe key {what!r}: {path} is a folder; give its circuit.json")
    if not os.path.exists(path):
        raise RecipeError(f"recipe key {what!r}: no such circuit file {path}")
    try:
        with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
            d = json.load(f)
    except (ValueError, OSError) as e:
        raise RecipeError(f"recipe key {what!r}: {path} is not a circuit JSON file ({e})") from None
    edges = d.get("edges") if isinstance(d, dict) else None
    if not isinstance(edges, dict):
        raise RecipeError(f"recipe key {what!r}: {path} is not a circuit file (no edges)")
    bad = [n for n, e in edges.items() if not isinstance(e, dict) or not isinstance(e.get("in_graph"), bool)]
    if bad:
        raise RecipeError(f"recipe key {what!r}: {path}: edge {bad[0]}: in_graph must be true or false")
    if not any(e["in_graph"] for e in edges.values()):
        raise RecipeError(f"recipe key {what!r}: {path} has no edge in its circuit")
    if not isinstance(d.get("cfg"), dict):
        raise RecipeError(f"recipe key {what!r}: {path} has no cfg: cannot tell which model it is for")
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


def rank_method(graph, cfg):
    """EAP-IG, or `early_rank_method` while the circuit has more than `early_rank_edges` edges."""
    if cfg.early_rank_method and graph.count_edges(on_path=True) > cfg.early_rank_edges:
        return cfg.early_rank_method
    return "eap_ig_inputs"


def rank(model, graph, rows, cfg, progress=True):
    """Scores (EAP-IG, see rank_method) into graph.scores; pruned (not in_graph) edges' scores
    set to 0. With several processes each scores its share of the rows and the sums are
    all-reduced. `rank_rows` limits the rows."""
    if cfg.rank_rows is not None and cfg.rank_rows < len(rows):
        rows = rows.select(range(cfg.rank_rows))
    n = len(rows)
    mine = shard(list(range(n)))
    local = rows.select(mine) if len(mine) < n else rows
    scores = attribute(model, graph, local, rank_method(graph, cfg), ig_steps=cfg.ig_steps,
                       intervention=cfg.intervention, metric=cfg.metric,
                       batch_size=cfg.batch_size, seed=cfg.seed, progress=progress and is_main(),
                       at_circuit=cfg.rank_at_circuit)
    if world()[1] > 1:  # attribute returns a mean over its rows: back to sums, then the mean
        device = next(model.parameters()).device
        total = all_reduce_(scores.to(device, torch.float64) * len(mine))
        scores = (total / n).float().cpu()
    graph.scores = scores.masked_fill(~(graph.in_graph & graph.valid), 0.0)
    return graph


def cut_edges(graph, fraction):
    """A copy of `graph` without the lowest `fraction` of its surviving edges by |score|."""
    g = graph.copy()
    alive = g.in_graph & g.valid
    n_alive = int(alive.sum())
    n_drop = min(n_alive, max(1, int(round(fraction * n_alive))))
    ranked = g.scores.abs().masked_fill(~alive, float("inf")).flatten()
    # stable order: ties broken by edge position, so runs are reproducible
    order = torch.sort(ranked, stable=True).indices[:n_drop]
    flat = g.in_graph.flatten().clone()
    flat[order] = False
    g.in_graph = flat.view_as(g.in_graph) & g.valid
    g.prune()
    return g


def heal_loss(model, graph, cols, idx, target_logp, cfg):
    device = next(model.parameters()).device
    clean, mask, lengths = pad_batch([list(cols["clean_ids"][i]) for i in idx])
    corrupted, _, _ = pad_batch([list(cols["corrupted_ids"][i]) for i in idx])
    logits = run_graph(model, graph, clean.to(device), corrupted.to(device), mask.to(device),
                       intervention=cfg.intervention, logit_positions=(lengths - 1).to(device),
                       ablated_grad=cfg.heal_ablated_grad)
    logp = F.log_softmax(logits.float(), -1)
    target = target_logp[idx].to(device)
    return (target.exp() * (target - logp)).sum(-1).mean()


def general_loss(model, blocks):
    """KL(original || model with adapter) per token on general-text blocks, full graph: the
    original is the same peft model with its adapter disabled (no stored logits, so this
    scales to 50k-token vocabularies)."""
    device = next(model.parameters()).device
    ids = torch.as_tensor(blocks, device=device)
    with torch.no_grad(), model.disable_adapter():
        target = F.log_softmax(model(input_ids=ids).logits.float(), -1)
    logp = F.log_softmax(model(input_ids=ids).logits.float(), -1)
    return (target.exp() * (target - logp)).sum(-1).mean()


def heal(model, graph, rows, target_logp, cfg, rnd, progress=True, general_blocks=None):
    """`heal_steps` AdamW steps on the LoRA parameters (condense.optimize.fit); raises
    Diverged on NaN/inf. Every process draws the same batch and trains on its share.
    With `heal_general_weight` > 0 and general-text blocks (train split), the loss adds that
    weight times KL(original || adapter model) on a batch of `heal_general_batch` blocks."""
    cols, n = dataset_columns(rows)
    params = [p for p in model.parameters() if p.requires_grad]
    gen = torch.Generator().manual_seed(_round_seed(cfg, rnd))
    bs = min(cfg.heal_batch_size, n)
    use_general = cfg.heal_general_weight > 0 and general_blocks
    n_blocks = len(general_blocks) if use_general else 0

    def loss_fn(step):
        idx = shard(torch.randperm(n, generator=gen)[:bs].tolist())
        loss = heal_loss(model, graph, cols, idx, target_logp, cfg)
        if use_general:
            picks = shard(torch.randperm(n_blocks, generator=gen)[:cfg.heal_general_batch].tolist())
            loss = loss + cfg.heal_general_weight * general_loss(
                model, [general_blocks[i] for i in picks])
        return loss

    model.train()
    try:
        return fit(params, loss_fn, cfg.heal_steps, lr=cfg.heal_lr, desc=f"heal round {rnd}",
                   progress=progress, stop_below=cfg.heal_stop_loss or None)
    finally:
        model.eval()


class Gate:
    """Held-out checks against the original model (docs/design.md §5)."""

    def __init__(self, model, graph, rows_val, blocks, cfg):
        self.rows, self.blocks, self.cfg = rows_val, blocks, cfg
        self.reference = reference_outputs(model, graph, rows_val, cfg.intervention, cfg.batch_size)
        cols, n = dataset_columns(rows_val)
        ans = torch.tensor([int(a) for a in cols["answer_id"]])
        dis = torch.tensor([int(a) for a in cols["distractor_id"]])
        full = self.reference.full_logits
        ld = full.gather(1, ans[:, None])[:, 0] - full.gather(1, dis[:, None])[:, 0]
        self.accuracy_original = (ld > 0).float().mean().item()
        self.ppl_original = perplexity(model, blocks, cfg.batch_size) if blocks else math.nan

    def __call__(self, model, circuit):
        cfg = self.cfg
        m = circuit_metrics(model, circuit, self.rows, self.reference, cfg)
        ppl = perplexity(model, self.blocks, cfg.batch_size) if self.blocks else math.nan
        ratio = ppl / self.ppl_original if self.blocks else 1.0
        ok_acc = m["accuracy"] >= self.accuracy_original - cfg.gate_accuracy_tol - ACCURACY_EPS
        ok_ppl = bool(ratio <= cfg.gate_ppl_ratio)
        ok_f = cfg.gate_faithfulness <= 0 or bool(m["faithfulness"] >= cfg.gate_faithfulness)
        return ok_acc and ok_ppl and ok_f, dict(
            accuracy=m["accuracy"], ppl_ratio=ratio, kl=m["kl"], faithfulness=m["faithfulness"],
            gate_accuracy=ok_acc, gate_ppl=ok_ppl, gate_faithfulness=ok_f)


def circuit_metrics(model, circuit, rows, original_ref, cfg):
    """evaluate() against the ORIGINAL model: KL and faithfulness use the original full
    logits; the empty circuit is the current model's (adapter included)."""
    own = reference_outputs(model, circuit, rows, cfg.intervention, cfg.batch_size)
    ref = EvalReference(original_ref.full_logits, own.empty_logit_diff, cfg.intervention)
    m = evaluate(model, circuit, rows, cfg.intervention, cfg.batch_size, reference=ref)
    m["top1_agreement"] = top1_agreement(model, circuit, rows, original_ref.full_logits, cfg)
    return m


def template_split_accuracy(model, circuit, rows, original_ref, cfg):
    """Test accuracy (circuit and original) on the rows of templates seen in training and of
    held-out templates, where a task has both (IOI): the gate's val rows have no held-out
    template, so this is where a circuit that fits its templates shows it. {} otherwise."""
    out = {}
    for name, idx in tasks.template_parts(rows).items():
        ref = EvalReference(original_ref.full_logits[idx], original_ref.empty_logit_diff[idx],
                            original_ref.intervention)
        m = evaluate(model, circuit, rows.select(idx), cfg.intervention, cfg.batch_size,
                     reference=ref)
        out[f"accuracy_{name}_templates"] = m["accuracy"]
        out[f"accuracy_original_{name}_templates"] = m["accuracy_full"]
    return out


@torch.no_grad()
def top1_agreement(model, circuit, rows, original_logits, cfg):
    cols, n = dataset_columns(rows)
    device = next(model.parameters()).device
    agree = 0
    order = sorted(range(n), key=lambda i: len(cols["clean_ids"][i]))
    was = model.training
    model.eval()
    for start in range(0, n, cfg.batch_size):
        idx = order[start:start + cfg.batch_size]
        clean, mask, lengths = pad_batch([list(cols["clean_ids"][i]) for i in idx])
        corrupted, _, _ = pad_batch([list(cols["corrupted_ids"][i]) for i in idx])
        logits = run_graph(model, circuit, clean.to(device), corrupted.to(device), mask.to(device),
                           intervention=cfg.intervention, logit_positions=(lengths - 1).to(device))
        agree += int((logits.float().argmax(-1).cpu() == original_logits[idx].argmax(-1)).sum())
    model.train(was)
    return agree / n


# ------------------------------------------------------------------ state (resume)
def _save_state(out, model, circuit, state):
    """Commit a round (main process writes; every process returns the same state)."""
    from safetensors.torch import save
    tag = f"r{state['accepted_round']:04d}"
    adapter_file, circuit_file = f"adapter_{tag}.safetensors", f"circuit_{tag}.json"
    if not is_main():
        barrier()
        return dict(state, adapter_file=adapter_file, circuit_file=circuit_file)
    sdir = os.path.join(out, "state")
    os.makedirs(sdir, exist_ok=True)
    # both parts, each atomically, every time (a kill between them leaves the last committed
    # state.json pointing at files of the previous commit, which are still there)
    atomic_write(os.path.join(sdir, adapter_file),
                 save({k: v.contiguous().cpu() for k, v in adapter_state(model).items()}))
    circuit.to_json(os.path.join(sdir, circuit_file))
    state = dict(state, adapter_file=adapter_file, circuit_file=circuit_file)
    write_json(os.path.join(sdir, STATE_FILE), state)  # last: commits the round
    for f in os.listdir(sdir):  # older accepted states are no longer referenced
        if f.startswith(("adapter_r", "circuit_r")) and f not in (adapter_file, circuit_file):
            os.unlink(os.path.join(sdir, f))
    barrier()
    return state


def _load_state(out, model, peft_model, cfg):
    from safetensors.torch import load_file
    path = os.path.join(out, "state", STATE_FILE)
    if not os.path.exists(path):
        return None, None
    with open(path) as f:
        state = json.load(f)
    if state.get("fingerprint") != _fingerprint(cfg):
        raise RecipeError(f"{path} was written by a different recipe; remove {out}/state to "
                          f"start over")
    missing = [f for f in (state["adapter_file"], state["circuit_file"])
               if not os.path.exists(os.path.join(out, "state", f))]
    if missing:  # a committed state always has both: someone removed them
        raise RecipeError(f"{path} names {', '.join(missing)}, which is missing; remove "
                          f"{out}/state to start over")
    load_adapter_state(peft_model, load_file(os.path.join(out, "state", state["adapter_file"])))
    circuit = Graph.from_json(os.path.join(out, "state", state["circuit_file"]), model)
    return state, circuit


RESUME_KEYS = ("model", "task", "n_train", "n_val", "seed", "ig_steps", "intervention", "metric",
               "heal", "prune", "prune_fraction", "min_prune_fraction", "heal_steps", "heal_lr",
               "heal_batch_size", "lora_rank", "lora_alpha", "lora_targets",
               "gate_accuracy_tol", "gate_ppl_ratio", "n_general", "init_circuit", "rank_at_circuit",
               "heal_general_weight", "heal_general_batch", "heal_ablated_grad",
               "heal_stop_loss", "gate_faithfulness", "rank_rows", "early_rank_method",
               "early_rank_edges", "heal_if_needed")
# a key at this value is left out of the fingerprint, so a state written before it existed resumes
OFF = dict(gate_faithfulness=0.0, rank_rows=None, early_rank_method=None, early_rank_edges=0,
           heal_if_needed=False)


def _fingerprint(cfg):
    return {k: getattr(cfg, k) for k in RESUME_KEYS if not (k in OFF and getattr(cfg, k) == OFF[k])}


# ------------------------------------------------------------------ pictures
def plot_rounds(rounds, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    r = [x["round"] for x in rounds]
    ax.plot(r, [x["edges"] for x in rounds], "o-", color="tab:blue", label="edges")
    for x in rounds:
        if not x["accepted"]:
            ax.plot(x["round"], x["edges"], "x", color="red", ms=9)
    ax.set_yscale("log")
    ax.set_xlabel("round (x = rejected)")
    ax.set_ylabel("edges", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(r, [x["accuracy"] for x in rounds], "s--", color="tab:green")
    ax2.set_ylabel("val accuracy", color="tab:green")
    ax2.set_ylim(0, 1.05)
    ax.set_title(title)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100), mode="wb")
    plt.close(fig)


def _wandb_log(accelerator, cfg, record):
    if cfg.report_to == "wandb":
        accelerator.log({f"round/{k}": v for k, v in record.items()
                         if isinstance(v, (int, float)) and not isinstance(v, bool)},
                        step=record["round"])


# ------------------------------------------------------------------ the runner
class _Loop:
    """One condensation run, in phases: start (or resume), rounds, final metrics and files."""

    def __init__(self, ctx: RunContext):
        cfg = self.cfg = ctx.cfg
        self.ctx, self.out, self.rows = ctx, ctx.out, ctx.rows
        self.start_time = time.perf_counter()
        model = ctx.model
        self.blocks = list(tasks.general_text(ctx.tokenizer, "val")["input_ids"])[:cfg.n_general]
        self.train_blocks = (list(tasks.general_text(ctx.tokenizer, "train")["input_ids"])
                             if cfg.heal and cfg.heal_general_weight > 0 else None)
        log(f"condense {cfg.task}: {len(self.blocks)} general-text blocks; heal={cfg.heal} "
            f"prune={cfg.prune}")
        self.full = ctx.graph
        # the original model's outputs, before any adapter exists
        self.target_logp = last_logprobs(model, self.rows["train"], cfg.batch_size) if cfg.heal else None
        self.gate = Gate(model, self.full, self.rows["val"], self.blocks, cfg)
        self.test_ref = reference_outputs(model, self.full, self.rows["test"], cfg.intervention,
                                          cfg.batch_size)
        log(f"original model: val accuracy {self.gate.accuracy_original:.3f}, general-text ppl "
            f"{self.gate.ppl_original:.2f}")
        self.model = add_adapter(model, cfg)

    def start(self):
        """(state, circuit): the committed state of an earlier run of the same recipe, or round 0."""
        cfg = self.cfg
        state, circuit = _load_state(self.out, self.ctx.model, self.model, cfg)
        barrier()  # every process has read the state before the main one may write a first one
        if state is None:
            circuit = initial_circuit(self.full, cfg, self.ctx.model)
            state = dict(round=0, accepted_round=0, cut=cfg.prune_fraction, done=False, rounds=[],
                         fingerprint=_fingerprint(cfg),
                         seeds="round r draws from torch.Generator().manual_seed(seed*100003 + r)")
            state = _save_state(self.out, self.model, circuit, state)
        else:
            log(f"resuming after round {state['round']} (accepted round {state['accepted_round']}, "
                f"{circuit.count_edges(on_path=True)} edges, cut {state['cut']:.3f})")
        return state, circuit

    def round(self, state, circuit):
        """Rank, cut, heal and gate one round; commit it; returns the new (state, circuit)."""
        cfg, model = self.cfg, self.model
        rnd = state["round"] + 1
        t0 = time.perf_counter()
        torch.manual_seed(_round_seed(cfg, rnd))
        cut = state["cut"] if cfg.prune else 0.0
        if cfg.prune:
            rank(model, circuit, self.rows["train"], cfg)
            candidate = cut_edges(circuit, cut)
        else:
            candidate = circuit.copy()
        accepted_adapter = adapter_state(model)
        note, losses = "", []
        key = _edge_key(candidate)
        try:
            if cfg.prune and candidate.count_edges(on_path=True) == 0:
                raise _Skip("no input -> logits path left")
            if cfg.prune and key in state.get("rejected_since_accept", []):
                raise _Skip("the same edges as a cut already rejected since the last accepted "
                            "round (a smaller cut removes the same edges)")
            ok, g = (self.gate(model, candidate) if cfg.heal_if_needed or not cfg.heal
                     else (False, None))
            if cfg.heal and not ok:
                if cfg.heal_if_needed:
                    note = "healed: the gate rejected the unhealed candidate"
                losses = heal(model, candidate, self.rows["train"], self.target_logp, cfg, rnd,
                              general_blocks=self.train_blocks)
                ok, g = self.gate(model, candidate)
            elif cfg.heal:
                note = "accepted before healing"
        except (HealDiverged, _Skip) as e:  # _Skip: decided without heal or gate (resume-safe)
            note = f"heal diverged: {e}" if isinstance(e, HealDiverged) else f"skipped: {e}"
            ok, g = False, dict(accuracy=math.nan, ppl_ratio=math.nan, kl=math.nan, faithfulness=math.nan)
        if world()[1] > 1:  # the same decision everywhere, even if floats ever differed
            votes = all_reduce_(torch.tensor([float(bool(ok))], device=self.ctx.device))
            ok = bool(votes.item() == world()[1])
        record = dict(round=rnd, cut=cut, accepted=bool(ok), edges=candidate.count_edges(on_path=True),
                      accuracy=g["accuracy"], ppl_ratio=g["ppl_ratio"], kl=g["kl"],
                      faithfulness=g["faithfulness"], heal_loss=losses[-1] if losses else None,
                      note=note, time=time.perf_counter() - t0)
        log(f"round {rnd}: cut {cut:.3f} -> {record['edges']} edges, val accuracy "
            f"{record['accuracy']:.3f} (original {self.gate.accuracy_original:.3f}), ppl ratio "
            f"{record['ppl_ratio']:.4f}, f {record['faithfulness']:.3f}: {'accepted' if ok else 'rejected'}"
            + (f" ({note})" if note else ""))
        if is_main():
            _wandb_log(self.ctx.accelerator, cfg, record)
        state["rounds"].append(record)
        state["round"] = rnd
        if ok:
            circuit = candidate
            state["accepted_round"] = rnd
            state["rejected_since_accept"] = []
            state["done"] = circuit.count_edges(on_path=True) <= 1
        else:
            state.setdefault("rejected_since_accept", []).append(key)
            load_adapter_state(model, accepted_adapter)
            if not cfg.prune or cut <= cfg.min_prune_fraction + 1e-12:
                state["done"] = True
            else:
                state["cut"] = max(cut / 2, cfg.min_prune_fraction)
        state = _save_state(self.out, model, circuit, state)
        if is_main():
            _write_rounds(self.out, state["rounds"])
        return state, circuit

    def finish(self):
        """Final metrics on test from the committed state (a resumed run ends identically)."""
        cfg, model, rows = self.cfg, self.model, self.rows
        state, circuit = _load_state(self.out, self.ctx.model, model, cfg)
        extra = {}
        if not cfg.prune:  # heal-only control: rank the healed model, smallest faithful circuit
            rank(model, circuit, rows["train"], cfg)
            found = smallest_faithful(model, circuit, rows["val"], cfg.faithfulness_threshold,
                                      absolute=cfg.absolute_scores, intervention=cfg.intervention,
                                      batch_size=cfg.batch_size, resolution=cfg.search_resolution)
            if found.graph is not None:
                circuit = found.graph
            extra = dict(faithful_on_val=found.graph is not None, faithfulness_val=found.faithfulness)
        test = circuit_metrics(model, circuit, rows["test"], self.test_ref, cfg)
        extra.update(template_split_accuracy(model, circuit, rows["test"], self.test_ref, cfg))
        ppl = perplexity(model, self.blocks, cfg.batch_size) if self.blocks else math.nan
        metrics = dict(
            method=cfg.method, task=cfg.task, model=cfg.model, heal=cfg.heal, prune=cfg.prune,
            edges=circuit.count_edges(on_path=True), total_edges=int(self.full.valid.sum()),
            accuracy=test["accuracy"], accuracy_original=test["accuracy_full"], top1=test["top1"],
            top1_agreement=test["top1_agreement"], logit_diff=test["logit_diff"],
            logit_diff_original=test["logit_diff_full"], faithfulness=test["faithfulness"],
            kl=test["kl"], ppl_ratio=ppl / self.gate.ppl_original if self.blocks else math.nan,
            ppl=ppl, ppl_original=self.gate.ppl_original,
            accuracy_original_val=self.gate.accuracy_original, rounds=state["round"],
            accepted_rounds=sum(r["accepted"] for r in state["rounds"]),
            wall_seconds=time.perf_counter() - self.start_time,
            # wall_seconds counts this process only; a resumed run's rounds add up here
            rounds_seconds=sum(r.get("time", 0.0) for r in state["rounds"]),
            n_train=len(rows["train"]), n_val=len(rows["val"]), n_test=len(rows["test"]),
            n_general=len(self.blocks), **extra)
        name = "heal-only" if not cfg.prune else ("C1" if cfg.heal else "C0")
        log(f"{name}: {metrics['edges']} edges, test accuracy "
            f"{metrics['accuracy']:.3f} (original {metrics['accuracy_original']:.3f}), KL "
            f"{metrics['kl']:.4f}, ppl ratio {metrics['ppl_ratio']:.4f}")
        if is_main():
            self.write(circuit, state, metrics)
        return metrics

    def write(self, circuit, state, metrics):
        out = self.out
        save_adapter(self.model, out, self.cfg.model)
        circuit.to_json(os.path.join(out, "circuit.json"))
        circuit.to_image(os.path.join(out, "circuit.png"))
        _write_rounds(out, state["rounds"])
        if state["rounds"]:
            plot_rounds(state["rounds"], os.path.join(out, "rounds.png"),
                        f"condense {self.cfg.task}: edges and val accuracy per round")
        write_json(os.path.join(out, "metrics.json"), metrics)


def run_condense(ctx: RunContext) -> dict:
    """The condensation run (see the module docstring); returns metrics.json's contents."""
    loop = _Loop(ctx)
    state, circuit = loop.start()
    max_rounds = ctx.cfg.max_rounds if ctx.cfg.prune else 1
    while not state["done"] and state["round"] < max_rounds:
        state, circuit = loop.round(state, circuit)
    return loop.finish()


def check_state(cfg: CondenseConfig) -> None:
    """Before anything is written: init_circuit fits the model, and a state in the output
    folder was written by this recipe (else rerunning would resume another run)."""
    check_init_circuit_model(cfg)
    path = os.path.join(cfg.output_dir, "state", STATE_FILE)
    if os.path.exists(path):
        with open(path) as f:
            state = json.load(f)
        if state.get("fingerprint") != _fingerprint(cfg):
            old = state.get("fingerprint") or {}
            keys = sorted(k for k in set(old) | set(_fingerprint(cfg))
                          if old.get(k) != _fingerprint(cfg).get(k))
            raise RecipeError(f"{path} was written by a different recipe (differs in "
                              f"{', '.join(keys[:6])}); remove {cfg.output_dir}/state to start over")


register("condense", CondenseConfig, run_condense, data_parallel=True, prepare=check_state,
         help="condensation: rank -> prune -> heal (LoRA) -> gate")


class _Skip(Exception):
    """A candidate rejected without healing it (empty, or already rejected)."""


def _edge_key(graph):
    """A short fingerprint of a circuit's edge set (for 'already rejected' checks)."""
    import hashlib
    on = (graph.in_graph & graph.valid).flatten().nonzero().flatten().tolist()
    return hashlib.sha1(",".join(map(str, on)).encode()).hexdigest()[:16]


def initial_circuit(full, cfg, model):
    """The circuit round 1 starts from: the full graph, or `init_circuit` (any run's
    circuit.json, e.g. from edge_pruning or hap) pruned to its input -> logits paths."""
    circuit = full.copy()
    circuit.reset(in_graph=True)
    if cfg.init_circuit:
        if not os.path.exists(cfg.init_circuit):
            raise FileNotFoundError(f"init_circuit {cfg.init_circuit!r} does not exist")
        start = Graph.from_json(cfg.init_circuit, model)
        circuit.in_graph = start.in_graph & circuit.valid
        circuit.prune()
        log(f"starting from {cfg.init_circuit}: {circuit.count_edges(on_path=True)} edges")
    return circuit


def save_adapter(peft_model, out, base_model=None):
    """peft's save_pretrained into a scratch folder, then each file renamed into `out`.
    `base_model` (the recipe's model, e.g. "smollm2-135m") replaces the base path peft records,
    which for a named model is this machine's cache folder."""
    import shutil
    import tempfile
    tmp = tempfile.mkdtemp(dir=out, prefix=".adapter-")
    try:
        peft_model.save_pretrained(tmp)
        config = os.path.join(tmp, "adapter_config.json")
        if base_model is not None and os.path.exists(config):
            with open(config) as f:
                data = json.load(f)
            data["base_model_name_or_path"] = base_model
            with open(config, "w") as f:
                json.dump(data, f, indent=2)
        for name in sorted(os.listdir(tmp)):
            os.replace(os.path.join(tmp, name), os.path.join(out, name))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_rounds(out, rounds):
    atomic_write(os.path.join(out, "rounds.jsonl"), "".join(json.dumps(r) + "\n" for r in rounds))
