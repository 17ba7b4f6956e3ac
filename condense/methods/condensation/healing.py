"""Heal: a LoRA adapter on the residual-stream writers, trained by KL distillation to the
original model while the pruned edges are ablated (docs/design.md §5)."""
from contextlib import contextmanager, nullcontext
from typing import Optional

import torch
import torch.nn.functional as F

from condense.evaluate import dataset_columns
from condense.methods.condensation.config import ALL_LINEAR
from condense.metrics import eval_mode, kl_rows, pad_batch
from condense.model_parts import model_parts, model_shape
from condense.optimize import Diverged, FitState, fit, shard
from condense.patching import run_graph

# residual-stream writers per model family (attention output and MLP down projections)
LORA_TARGETS = {"gpt2": ["c_proj"]}
DEFAULT_LORA_TARGETS = ["o_proj", "down_proj"]

HealDiverged = Diverged  # the heal loss or the adapter became NaN/inf: the round is rejected


def lora_targets(cfg, model):
    """The recipe's module names, or "all-linear" (PEFT resolves it per family), or by default
    the family's residual-stream writers."""
    if cfg.lora_targets == ALL_LINEAR:
        return ALL_LINEAR
    if cfg.lora_targets:
        return list(cfg.lora_targets)
    return LORA_TARGETS.get(model_shape(model).model_type, DEFAULT_LORA_TARGETS)


def adapted_modules(model) -> list:
    """The names (last component, e.g. `o_proj`) of the modules that carry a LoRA adapter: what
    `lora_targets` resolved to on this model."""
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                   if hasattr(module, "lora_A") and len(module.lora_A)})


def add_adapter(model, cfg):
    """A fresh LoRA on the modules `lora_targets` names (by default every residual-stream
    writer); base weights frozen."""
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


@contextmanager
def base_weights_in(model, dtype):
    """The frozen base weights of `model` cast to `dtype` inside the block, restored bit for
    bit after it (from the originals, kept aside): the heal's forward and backward then run in
    `dtype` (the graph follows the embedding's dtype), while the LoRA weights and their AdamW
    state stay in their own dtype and peft casts activations to them and back. Tied weights
    are one parameter and are cast once. dtype None, or the weights' own: nothing changes.
    Yields `originals`, a context manager that puts the original weights back for a while."""
    from condense.models import DTYPES
    dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    kept, cast = {}, {}
    if dtype is not None:
        for name, p in model.named_parameters():
            if "lora_" not in name and p.is_floating_point() and p.dtype != dtype:
                kept[name] = p.data
                cast[name] = p.data = p.data.to(dtype)
    params = dict(model.named_parameters())

    @contextmanager
    def originals():
        """The original weights back inside this block (a gate check during the heal)."""
        for name, original in kept.items():
            params[name].data = original
        try:
            yield
        finally:
            for name, weight in cast.items():
                params[name].data = weight

    try:
        yield originals
    finally:
        for name, original in kept.items():
            params[name].data = original


def _round_seed(cfg, rnd):
    return int(cfg.seed) * 100003 + int(rnd)


# ------------------------------------------------------------------ original model outputs
@torch.no_grad()
def last_logprobs(model, rows, batch_size, prompts="clean_ids"):
    """Original model's last-position log-probs [N, V] on the clean prompts (heal target), or
    on the corrupted ones (prompts="corrupted_ids")."""
    cols, n = dataset_columns(rows)
    device = next(model.parameters()).device
    out = [None] * n
    order = sorted(range(n), key=lambda i: len(cols[prompts][i]))
    for start in range(0, n, batch_size):
        idx = order[start:start + batch_size]
        ids, mask, lengths = pad_batch([list(cols[prompts][i]) for i in idx])
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
        last = logits[torch.arange(len(idx), device=device), (lengths - 1).to(device)]
        lp = F.log_softmax(last.float(), -1).cpu()
        for j, i in enumerate(idx):
            out[i] = lp[j]
    return torch.stack(out)


# ------------------------------------------------------------------ the four phases
def heal_loss(model, graph, cols, idx, target_logp, cfg, means=None):
    device = next(model.parameters()).device
    clean, mask, lengths = pad_batch([list(cols["clean_ids"][i]) for i in idx])
    corrupted, _, _ = pad_batch([list(cols["corrupted_ids"][i]) for i in idx])
    logits = run_graph(model, graph, clean.to(device), corrupted.to(device), mask.to(device),
                       intervention=cfg.intervention, logit_positions=(lengths - 1).to(device),
                       ablated_grad=cfg.heal_ablated_grad, means=means)
    t = cfg.heal_temperature
    logp = F.log_softmax(logits.float() / t, -1)
    target = target_logp[idx].to(device)
    if t != 1.0:  # log-probabilities are logits up to a constant, so they sharpen the same way
        target = F.log_softmax(target / t, -1)
    # times t^2, the usual distillation scaling (Hinton et al.): above 1 it keeps the gradient
    # on the scale of t = 1's; at t = 1 the loss is the design's, unchanged
    return kl_rows(target, logp).mean() * t * t


def corrupted_loss(model, cols, idx, corrupted_logp, prompts="corrupted_ids"):
    """KL(original || model with adapter) at the last position of the corrupted prompts, full
    graph: the model with adapter on a corrupted prompt is the empty circuit, so this keeps it
    saying what the original says there instead of learning to answer from the corruption.
    With prompts="clean_ids" and the original's clean log-probs it is the full-model term
    (heal_full_weight): the healed full model kept at the original on the task itself."""
    device = next(model.parameters()).device
    ids, mask, lengths = pad_batch([list(cols[prompts][i]) for i in idx])
    logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
    last = logits[torch.arange(len(idx), device=device), (lengths - 1).to(device)]
    logp = F.log_softmax(last.float(), -1)
    target = corrupted_logp[idx].to(device)
    return kl_rows(target, logp).mean()


def general_loss(model, blocks):
    """KL(original || model with adapter) per token on general-text blocks, full graph: the
    original is the same peft model with its adapter disabled (no stored logits, so this
    scales to 50k-token vocabularies)."""
    device = next(model.parameters()).device
    ids = torch.as_tensor(blocks, device=device)
    with torch.no_grad(), model.disable_adapter():
        target = F.log_softmax(model(input_ids=ids).logits.float(), -1)
    logp = F.log_softmax(model(input_ids=ids).logits.float(), -1)
    return kl_rows(target, logp).mean()


def lora_modules(model) -> list:
    """(module, A weight, B weight, scaling) of every LoRA layer of the active adapter."""
    out = []
    for module in model.modules():
        if hasattr(module, "lora_A") and len(module.lora_A):
            name = next(iter(module.lora_A))
            out.append((module, module.lora_A[name].weight, module.lora_B[name].weight,
                        float(module.scaling[name])))
    return out


def adapter_size(model, base_norm2: float) -> torch.Tensor:
    """sum ||dW||_F^2 / `base_norm2` over the LoRA layers, dW = scaling * B A, computed through
    the r x r Gram matrices (||B A||^2 = sum (B^T B) * (A A^T)) so that it costs no d x d product."""
    total = None
    for _, a, b, scaling in lora_modules(model):
        term = (scaling ** 2) * ((b.float().T @ b.float()) * (a.float() @ a.float().T)).sum()
        total = term if total is None else total + term
    return total / base_norm2 if total is not None else torch.zeros(())


def base_norm2(model) -> float:
    """sum ||W||_F^2 of the base weights under the LoRA layers (adapter_size's denominator)."""
    return float(sum(float(m.base_layer.weight.float().pow(2).sum()) for m, *_ in lora_modules(model)))


def circuit_lora_masks(model, graph) -> list:
    """(weight, mask) for every LoRA weight: 1 where it writes from one of `graph`'s nodes (a
    sender with an in-graph edge out), 0 elsewhere (lora_on_circuit). The output projection's
    A keeps the input columns of the circuit's heads (so dW adds to those heads' outputs only);
    the MLP's modules stay whole when its MLP is in the circuit; other attention modules stay
    whole when a head of their layer is; anything else is masked."""
    parts = model_parts(model)
    hd = parts.shape.head_dim
    sends = (graph.in_graph & graph.valid).any(1)
    owner = {}  # id(module) -> (layer, kind)
    for li, lp in enumerate(parts.layers):
        for m in lp.mlp.modules():
            owner[id(m)] = (li, "mlp")
        for proj in (lp.q, lp.k, lp.v):
            owner[id(proj.module)] = (li, "attn")
        owner[id(lp.o_proj)] = (li, "o_proj")
    out = []
    for module, a, b, _ in lora_modules(model):
        li, kind = owner.get(id(module), (None, None))
        if kind == "o_proj":
            heads = torch.tensor([bool(sends[graph.head_sender(li, h)]) for h in range(graph.n_heads)])
            cols = heads.repeat_interleave(hd).to(a.dtype)
            out += [(a, cols.expand_as(a).clone()), (b, torch.ones_like(b) * float(heads.any()))]
        else:
            keep = (kind == "mlp" and bool(sends[graph.mlp_sender(li)])) or (
                kind == "attn" and any(bool(sends[graph.head_sender(li, h)]) for h in range(graph.n_heads)))
            out += [(a, torch.full_like(a, float(keep))), (b, torch.full_like(b, float(keep)))]
    return out


@contextmanager
def restricted_to(masks):
    """Zero the masked LoRA weights now and mask their gradients inside the block: the adapter
    keeps and trains only what `masks` (circuit_lora_masks) allows."""
    with torch.no_grad():
        for p, m in masks:
            p.mul_(m.to(p.device))
    hooks = [p.register_hook(lambda g, m=m: g * m.to(g.device)) for p, m in masks]
    try:
        yield
    finally:
        for h in hooks:
            h.remove()


def edge_key(graph) -> str:
    """A short fingerprint of a circuit's edge set ('already rejected' checks, heal saves)."""
    import hashlib
    on = (graph.in_graph & graph.valid).flatten().nonzero().flatten().tolist()
    return hashlib.sha1(",".join(map(str, on)).encode()).hexdigest()[:16]


def heal(model, graph, rows, target_logp, cfg, rnd, progress=True, general_blocks=None, desc=None,
         accepts=None, corrupted_logp=None, state_path=None, resumed: Optional[dict] = None,
         means=None):
    """`heal_steps` AdamW steps on the LoRA parameters (condense.optimize.fit); raises
    Diverged on NaN/inf. Every process draws the same batch and trains on its share.
    With `heal_general_weight` > 0 and general-text blocks (train split), the loss adds that
    weight times KL(original || adapter model) on a batch of `heal_general_batch` blocks.
    With `heal_corrupted_weight` > 0 it adds that weight times corrupted_loss (the original's
    last-position log-probs on the corrupted prompts in `corrupted_logp`) on the same rows.
    `heal_dtype` (e.g. bfloat16): the steps compute in that dtype (base_weights_in).
    `accepts()` -> bool (the gate on this candidate): with `heal_gate_every` > 0 it is asked
    every that many steps, in eval mode with the base weights in their own dtype, and the heal
    ends once it accepts (never at the last step: the caller gates the result anyway).
    state_path: save the heal there as it goes (condense.optimize.FitState, named by the
    circuit's edges) and go on from it, so that a heal killed mid-way resumes.
    resumed: a dict that gets `seconds`, the wall seconds earlier processes spent on the steps
    a resumed heal went on from (0.0 on a fresh start), so that the caller's timings count the
    whole heal.
    means: what removed edges carry under mean ablation (the original model's sender means)."""
    cols, n = dataset_columns(rows)
    params = [p for p in model.parameters() if p.requires_grad]
    gen = torch.Generator().manual_seed(_round_seed(cfg, rnd))
    bs = min(cfg.heal_batch_size, n)
    use_general = cfg.heal_general_weight > 0 and general_blocks
    n_blocks = len(general_blocks) if use_general else 0
    every = cfg.heal_gate_every if accepts is not None else 0
    full_weight = getattr(cfg, "heal_full_weight", 0.0)
    penalty = getattr(cfg, "heal_adapter_penalty", 0.0)
    norm2 = base_norm2(model) if penalty else 1.0

    def loss_fn(step):
        idx = shard(torch.randperm(n, generator=gen)[:bs].tolist())
        loss = heal_loss(model, graph, cols, idx, target_logp, cfg, means)
        if cfg.heal_corrupted_weight > 0:
            loss = loss + cfg.heal_corrupted_weight * corrupted_loss(model, cols, idx, corrupted_logp)
        if full_weight > 0:
            loss = loss + full_weight * corrupted_loss(model, cols, idx, target_logp, prompts="clean_ids")
        if penalty > 0:
            loss = loss + penalty * adapter_size(model, norm2)
        if use_general:
            picks = shard(torch.randperm(n_blocks, generator=gen)[:cfg.heal_general_batch].tolist())
            loss = loss + cfg.heal_general_weight * general_loss(
                model, [general_blocks[i] for i in picks])
        return loss

    def gate_accepts(step):
        if not every or (step + 1) % every or step + 1 >= cfg.heal_steps:
            return False
        with eval_mode(model), originals():
            return accepts()

    model.train()
    restrict = restricted_to(circuit_lora_masks(model, graph)) if getattr(cfg, "lora_on_circuit", False) \
        else nullcontext()
    try:
        with restrict, base_weights_in(model, cfg.heal_dtype) as originals:
            state = (FitState(state_path, generators={"batches": gen}, what=f"{edge_key(graph)}, {n} rows")
                     if state_path else None)
            losses = fit(params, loss_fn, cfg.heal_steps, lr=cfg.heal_lr,
                         desc=desc or f"heal round {rnd}", progress=progress,
                         stop_below=cfg.heal_stop_loss or None, stop_if=gate_accepts, state=state)
            if resumed is not None:
                resumed["seconds"] = state.earlier_seconds if state else 0.0
            return losses
    finally:
        model.eval()
