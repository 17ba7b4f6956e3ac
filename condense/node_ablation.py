"""One node at a time: the logit difference of a plain Hugging Face model with a single head or
MLP ablated, for every head and MLP, by forwards that start at the ablated node's layer.

Used by `condense card` (each head mean-ablated on IOI) and by the fidelity card
(condense.fidelity: where a circuit's nodes rank in the original model). No condense graph:
hooks on the model's own modules.

- A head is ablated at the input of its layer's output projection (its slice of z), so what it
  writes into the residual stream is what the ablated z gives; an MLP at its output.
- Ablated values: `patching` the node's value on the row's corrupted prompt (same length,
  same padding), `mean` a constant per head (card: its mean z over a reference set), `zero`.
- The layers below the ablated node do not see the ablation, so each ablated forward runs
  from that layer's cached input (`LayerCache`): half a forward on average, the same numbers
  as a full forward. This is checked against a full forward on the first batch and dropped
  for models where it does not match (extra logit processing the resumed forward would miss).

On a model whose heads are exactly separable (every family but Gemma2/3, which normalise the
sum of a layer's heads) a patched head equals the edge graph's "every outgoing edge of the
node removed" (tests/test_fidelity.py checks it on the organism).
"""
import sys
from contextlib import contextmanager
from typing import Optional

import torch
from tqdm.auto import tqdm

from condense.metrics import last_logits, pad_batch


def _log(msg: str) -> None:
    print(f"[condense] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- where things are
def blocks(model) -> torch.nn.ModuleList:
    """The decoder layers of a GPT-2 or a Llama-like model (a PEFT model's base included)."""
    model = model.get_base_model() if hasattr(model, "get_base_model") else model
    return model.transformer.h if hasattr(model, "transformer") else model.model.layers


def out_proj(block) -> torch.nn.Module:
    """The output projection of a layer's attention, whose input is every head's z."""
    return block.attn.c_proj if hasattr(block, "attn") else block.self_attn.o_proj


def mlp(block) -> torch.nn.Module:
    return block.mlp


def final_norm(model) -> Optional[torch.nn.Module]:
    model = model.get_base_model() if hasattr(model, "get_base_model") else model
    base = model.base_model
    for name in ("norm", "ln_f", "final_layernorm"):
        if isinstance(getattr(base, name, None), torch.nn.Module):
            return getattr(base, name)
    return None


def n_heads(model) -> int:
    return model.config.num_attention_heads


# ---------------------------------------------------------------- ablation hooks
@contextmanager
def heads_replaced(model, values: dict):
    """Replace heads' z at the input of their layer's output projection: `values` maps
    (layer, head) to what z[..., head slice] becomes (a tensor broadcastable to [B, T, head
    dim]: a per-head mean, zeros, or the corrupted prompt's z)."""
    H = n_heads(model)
    hooks = []
    for layer, block in enumerate(blocks(model)):
        mine = {h: v for (l, h), v in values.items() if l == layer}
        if not mine:
            continue

        def pre(mod, args, mine=mine):
            z = args[0].clone()
            d = z.shape[-1] // H
            for h, v in mine.items():
                z[..., h * d:(h + 1) * d] = v
            return (z,) + args[1:]
        hooks.append(out_proj(block).register_forward_pre_hook(pre))
    try:
        yield
    finally:
        for hk in hooks:
            hk.remove()


@contextmanager
def head_means_ablated(model, head_means, heads):
    """Mean-ablate each (layer, head) of `heads`: its z becomes head_means[layer, head]."""
    with heads_replaced(model, {(l, h): head_means[l, h] for l, h in heads}):
        yield


@contextmanager
def mlp_replaced(model, layer: int, value):
    """Replace the output of layer `layer`'s MLP by `value` (broadcastable to [B, T, width])."""
    def post(mod, args, out):
        return torch.zeros_like(out) + value
    hook = mlp(blocks(model)[layer]).register_forward_hook(post)
    try:
        yield
    finally:
        hook.remove()


@torch.no_grad()
def head_means(model, seqs):
    """Mean of each head's z over every position of `seqs`: [layers, heads, head_dim]."""
    H = n_heads(model)
    sums, count, hooks = {}, [0], []
    for layer, block in enumerate(blocks(model)):
        def pre(mod, args, layer=layer):
            z = args[0]
            sums[layer] = sums.get(layer, 0) + z.reshape(-1, H, z.shape[-1] // H).sum(0)
            if layer == 0:
                count[0] += z.shape[0] * z.shape[1]
        hooks.append(out_proj(block).register_forward_pre_hook(pre))
    device = next(model.parameters()).device
    try:
        for s in seqs:  # one at a time: no padding enters the mean
            model(input_ids=torch.tensor([s], device=device))
    finally:
        for hk in hooks:
            hk.remove()
    return torch.stack([sums[layer] for layer in range(len(sums))]) / count[0]


@torch.no_grad()
def node_values(model, ids, mask) -> tuple:
    """(every layer's z [L][B, T, H*d], every layer's MLP output [L][B, T, width]) of one
    forward of `ids`: what a node carries on these prompts (patching takes the corrupted
    prompt's)."""
    layers = blocks(model)
    zs, outs, hooks = [None] * len(layers), [None] * len(layers), []
    for i, block in enumerate(layers):
        hooks.append(out_proj(block).register_forward_pre_hook(
            lambda mod, args, i=i: zs.__setitem__(i, args[0].detach().clone())))
        hooks.append(mlp(block).register_forward_hook(
            lambda mod, args, out, i=i: outs.__setitem__(i, out.detach().clone())))
    try:
        model(input_ids=ids, attention_mask=mask, use_cache=False)
    finally:
        for hk in hooks:
            hk.remove()
    return zs, outs


# ---------------------------------------------------------------- forwards from a layer
class LayerCache:
    """One clean forward of a padded batch that keeps every block's call (its input
    hidden state and the other arguments: masks, position embeddings), so that a forward
    can be resumed at any layer."""

    @torch.no_grad()
    def __init__(self, model, ids, mask, lengths):
        self.model, self.blocks, self.lengths = model, blocks(model), lengths
        self.norm = final_norm(model)
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.unembed = base.get_output_embeddings()
        self.calls = [None] * len(self.blocks)

        def keep(mod, args, kwargs, i):
            args = tuple(a.clone() if i_a == 0 and torch.is_tensor(a) else a
                         for i_a, a in enumerate(args))
            kwargs = dict(kwargs)
            if not args:
                kwargs["hidden_states"] = kwargs["hidden_states"].clone()
            self.calls[i] = (args, kwargs)
        hooks = [b.register_forward_pre_hook(lambda m, a, k, i=i: keep(m, a, k, i),
                                             with_kwargs=True)
                 for i, b in enumerate(self.blocks)]
        try:
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        finally:
            for hk in hooks:
                hk.remove()
        self.last = logits[torch.arange(len(lengths)), lengths - 1].float()

    @torch.no_grad()
    def resume(self, layer):
        """Last-position logits of a forward that starts at block `layer` (whose input
        is the cached one); hooks on blocks >= `layer` act as in a full forward."""
        args, kwargs = self.calls[layer]
        h = args[0] if args else kwargs["hidden_states"]
        for i in range(layer, len(self.blocks)):
            args, kwargs = self.calls[i]
            out = (self.blocks[i](h, *args[1:], **kwargs) if args
                   else self.blocks[i](**dict(kwargs, hidden_states=h)))
            h = out[0] if isinstance(out, (tuple, list)) else out
        h = h[torch.arange(len(self.lengths)), self.lengths - 1]
        return self.unembed(self.norm(h)).float()


def resumes_exactly(model, cache: LayerCache, seqs: list, ablate) -> bool:
    """Whether forwards resumed from `cache` give the full forwards' logits on this batch, with
    nothing ablated and with `ablate()` (a context manager ablating something in the last
    layer) active: otherwise the model post-processes logits in a way the resumed forward
    misses, and callers run full forwards."""
    if final_norm(model) is None:
        return False
    L = len(blocks(model))
    full = cache.last.cpu()
    with ablate():
        full_abl = last_logits(model, seqs, batch_size=len(seqs))
        res_abl = cache.resume(L - 1).cpu()
    tol = 1e-4 * max(1.0, full.abs().max().item())
    return bool((cache.resume(0).cpu() - full).abs().max() <= tol
                and (res_abl - full_abl).abs().max() <= tol)


# ---------------------------------------------------------------- every node of a task
@torch.no_grad()
def node_ablation_effects(model, rows, intervention: str = "patching", batch_size: int = 16,
                          progress: bool = True) -> dict:
    """For every head a{l}.h{h} and every MLP m{l}: mean over `rows` of LD(model) - LD(model
    with that node alone ablated), LD = logit[answer] - logit[distractor] at the last real
    position. Positive: the node helps the answer. `intervention`: patching (the node's value
    on each row's corrupted prompt), zero, or mean (its mean over every position of the
    rows' clean prompts). Returns {"heads": [L, H], "mlps": [L], "logit_diff": mean clean LD,
    "rows": N, "resumed": whether forwards started at the ablated layer}."""
    if intervention not in ("patching", "mean", "zero"):
        raise ValueError(f"intervention {intervention!r}: patching, mean or zero")
    L, H = len(blocks(model)), n_heads(model)
    clean_seqs = [list(s) for s in rows["clean_ids"]]
    corrupted_seqs = [list(s) for s in rows["corrupted_ids"]]
    answer = torch.as_tensor(rows["answer_id"])
    distractor = torch.as_tensor(rows["distractor_id"])
    device = next(model.parameters()).device
    heads, mlps, base_sum = torch.zeros(L, H, dtype=torch.float64), torch.zeros(L, dtype=torch.float64), 0.0
    means = None
    if intervention == "mean":
        order_all = list(range(len(clean_seqs)))
        ids, mask, _ = pad_batch([clean_seqs[i] for i in order_all])
        zs, outs = node_values(model, ids.to(device), mask.to(device))
        m = mask.to(device)[..., None].float()
        means = ([(z * m).sum((0, 1)) / m.sum() for z in zs], [(o * m).sum((0, 1)) / m.sum() for o in outs])
    order = sorted(range(len(clean_seqs)), key=lambda i: len(clean_seqs[i]))
    resume = None
    with tqdm(total=len(order) * (L * (H + 1)), desc="node ablation", unit="row", unit_scale=True,
              disable=not progress, mininterval=2.0) as bar:
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            idx = torch.tensor(batch)
            ids, mask, lengths = pad_batch([clean_seqs[i] for i in batch])
            ids, mask, lengths = ids.to(device), mask.to(device), lengths.to(device)
            if intervention == "patching":
                cids, _, _ = pad_batch([corrupted_seqs[i] for i in batch])
                zs, outs = node_values(model, cids.to(device), mask)
            elif intervention == "zero":
                zs = outs = None
            else:
                zs, outs = means
            d = None

            def head_value(layer, h):
                nonlocal d
                if zs is None:
                    return 0.0
                z = zs[layer]
                d = z.shape[-1] // H
                return z[..., h * d:(h + 1) * d]

            def mlp_value(layer):
                return 0.0 if outs is None else outs[layer]

            cache = LayerCache(model, ids, mask, lengths)
            if resume is None:
                resume = resumes_exactly(model, cache, [clean_seqs[i] for i in batch],
                                         lambda: heads_replaced(model, {(L - 1, 0): head_value(L - 1, 0)}))
                if not resume:
                    _log("resumed forwards do not match full ones for this model: running full forwards")

            def ld(logits):
                logits = logits.cpu()
                return (logits.gather(1, answer[idx, None])[:, 0]
                        - logits.gather(1, distractor[idx, None])[:, 0]).double()

            def run(layer):
                if resume:
                    return cache.resume(layer)
                return last_logits(model, [clean_seqs[i] for i in batch], batch_size=len(batch))

            base = ld(cache.last)
            base_sum += float(base.sum())
            for layer in range(L):
                for h in range(H):
                    with heads_replaced(model, {(layer, h): head_value(layer, h)}):
                        heads[layer, h] += float((base - ld(run(layer))).sum())
                with mlp_replaced(model, layer, mlp_value(layer)):
                    mlps[layer] += float((base - ld(run(layer))).sum())
                bar.update(len(batch) * (H + 1))
    n = len(order)
    return dict(heads=(heads / n).float(), mlps=(mlps / n).float(), logit_diff=base_sum / n, rows=n,
                resumed=bool(resume), intervention=intervention)
