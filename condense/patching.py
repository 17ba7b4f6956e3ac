"""The exact edge-level forward (DESIGN.md §2) over a model's own Hugging Face submodules.

Every receiver r (a head's q/k/v input, an MLP input, the logits input) reads

    x_r = c_r + sum_s [ m[s, r] * clean_s + (1 - m[s, r]) * ablated_s ]
        = c_r + sum_s ablated_s + sum_s m[s, r] * (clean_s - ablated_s)

over the senders s written before it. Sender outputs:
- `input`: token embeddings (+ learned positions for GPT-2; Gemma's sqrt(d) scale included);
- head `a{l}.h{h}`: o_proj applied to that head's z alone, o_proj(z_h) - o_proj(0);
- `m{l}`: the MLP's output (its own biases included).
The constant c_r is the sum of o_proj(0) (the attention output bias, plus any adapter bias)
of the layers before r: it is the same in every run, so it is kept whatever the edge mask
and ablation (under zero ablation too, as TransformerLens' hook_result ablations do).
Gemma2 normalizes the summed attention output (post-attention RMSNorm) before the residual:
there each head's output is its share g * (o_proj(z_h) + bias / H) / rms(o_proj(z)), the
rms taken over the whole layer's attention output in the same run, so the heads of a layer
sum exactly to the normalized output (and their outputs depend on each other through rms).

Ablated values: `patching` runs the same model (adapter included) on the corrupted prompt
in the same call; `mean` uses `compute_means` over a reference set; `zero` uses zeros.
Head masks mix a head's z (before o_proj) and neuron masks mix the MLP hidden units (the
input of the down projection) between clean and ablated values, the same way.

Attention is computed as HF's eager attention (scaling, Gemma2 soft-capping, causal +
sliding-window + padding mask, softmax in fp32); attention/residual/embedding dropout is not
applied (call model.eval() to compare with the HF model). Right-padded batches need an
attention_mask; positions are 0..T-1 as in HF.
"""
from dataclasses import dataclass, field

import torch

from condense.model_parts import (model_parts, model_shape, project_per_head, project_shared,
                                  split_heads_output)

INTERVENTIONS = ("patching", "mean", "zero")


@dataclass
class SenderValues:
    """Sender outputs per block (input, a0, m0, a1, m1, ...), each [n_senders_in_block, B|1, T|1, D],
    plus each layer's head z [B|1, T|1, H, head_dim] and MLP hidden units [B|1, T|1, d_mlp]
    (hidden is None unless recorded)."""
    blocks: list
    z: list
    hidden: list

    def stacked(self):
        """All sender outputs as one [n_senders, B, T, D] tensor (broadcast dims expanded)."""
        B = max(b.shape[1] for b in self.blocks)
        T = max(b.shape[2] for b in self.blocks)
        return torch.cat([b.expand(-1, B, T, -1) for b in self.blocks])


@dataclass
class GraphRun:
    logits: torch.Tensor
    clean: SenderValues        # sender outputs in the patched run
    ablated: SenderValues      # what a removed edge carries instead
    receiver_inputs: list = field(default_factory=list)  # (receivers, x [R, B, T, D]) if captured


class _MixSenders(torch.autograd.Function):
    """x = base + m.T @ cat(diffs), keeping only the per-block diffs (held anyway) for backward.

    Under autograd a plain torch.cat per receiver group would be saved by each group's matmul:
    memory quadratic in depth (50 GiB for a 16-layer 2048-wide model at 16x24 tokens)."""

    @staticmethod
    def forward(ctx, base, m, *diffs):
        ctx.save_for_backward(m, *diffs)
        return torch.addmm(base, m.T, torch.cat(diffs))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        m, *diffs = ctx.saved_tensors
        need = ctx.needs_input_grad
        grad_base = grad.sum(0) if need[0] else None
        grad_m = torch.cat([d @ grad.T for d in diffs]) if need[1] else None
        grad_diffs, start = [], 0
        for i, d in enumerate(diffs):
            grad_diffs.append(m[start:start + d.shape[0]] @ grad if need[2 + i] else None)
            start += d.shape[0]
        return (grad_base, grad_m, *grad_diffs)


def block_slices(graph):
    """Sender slices per block: input, a0, m0, a1, m1, ..."""
    out = [slice(0, 1)]
    for l in range(graph.n_layers):
        out += [graph.attn_senders(l), slice(graph.mlp_sender(l), graph.mlp_sender(l) + 1)]
    return out


def attention_masks(attention_mask, B, T, windows, dtype, device):
    """Additive masks [B, 1, T, T] per sliding window (None = full causal), as HF builds them."""
    i = torch.arange(T, device=device)[:, None]
    j = torch.arange(T, device=device)[None, :]
    keys = (attention_mask.bool()[:, None, None, :] if attention_mask is not None
            else torch.ones(B, 1, 1, T, dtype=torch.bool, device=device))
    out = {}
    for w in set(windows):
        allowed = (j <= i) if w is None else (j <= i) & (j > i - w)
        out[w] = torch.zeros(B, 1, T, T, dtype=dtype, device=device).masked_fill(
            ~(allowed[None, None] & keys), torch.finfo(dtype).min)
    return out


def _attend(parts, lp, q, k, v, rotary, mask):
    """Per-head attention from per-head q, k, v [B, T, H, dh] -> z [B, T, H, dh]."""
    if lp.q_norm is not None:
        q, k = lp.q_norm(q), lp.k_norm(k)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if rotary is not None:
        q, k = parts.apply_rotary(q, k, *rotary)
    scores = torch.matmul(q, k.transpose(-1, -2)) * lp.scaling
    if lp.softcap is not None:
        scores = torch.tanh(scores / lp.softcap) * lp.softcap
    # softmax in at least fp32, as HF's eager attention (fp64 stays fp64 for gradient checks)
    probs = torch.softmax(scores + mask, dim=-1, dtype=at_least_fp32(q.dtype)).to(q.dtype)
    return torch.matmul(probs, v).transpose(1, 2)


def at_least_fp32(dtype):
    return torch.promote_types(dtype, torch.float32)


def _gemma2_head_outputs(norm, out, const):
    """Split Gemma2's post-attention RMSNorm(sum_h out_h + const) exactly into per-head shares."""
    wide = at_least_fp32(out.dtype)  # Gemma2RMSNorm computes in fp32
    total = (out.sum(2) + (0 if const is None else const)).to(wide)
    inv_rms = torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + norm.eps)[:, :, None]
    share = out.to(wide) + (0 if const is None else const.to(wide) / out.shape[2])
    return (share * inv_rms * (1.0 + norm.weight.to(wide))).to(out.dtype)


def decomposed_forward(parts, graph, ids, attention_mask=None, *, ablated=None, edge_mask=None,
                       head_mask=None, neuron_mask=None, keep_hidden=False, receiver_hook=None,
                       capture_receivers=False, logit_positions=None, compute_logits=True):
    """One forward pass that records every sender's output.

    Without `ablated` it is the plain model (every receiver reads the full residual stream).
    With `ablated` (SenderValues) it is the patched model under `edge_mask` [S, R] and the
    optional node masks (head_mask [L, H], neuron_mask [L, d_mlp]). `receiver_hook(receivers,
    x)` sees (and may replace) each group of receiver inputs x [R, B, T, D], `receivers` being
    their slice of the graph's receiver axis.
    Returns (logits or None, clean SenderValues, captured (receivers, x) pairs)."""
    B, T = ids.shape
    H, dh = parts.shape.n_heads, parts.shape.head_dim
    patched = ablated is not None
    x_in = parts.embed(ids)
    dtype, device = x_in.dtype, x_in.device
    masks = attention_masks(attention_mask, B, T, [lp.sliding_window for lp in parts.layers], dtype, device)
    rotary = None
    if parts.rotary is not None:
        rotary = parts.rotary(x_in, torch.arange(T, device=device)[None])
    clean = SenderValues([], [], [])
    # const: o_proj(0) terms so far; resid (plain): sum of sender outputs; patched: the
    # clean-minus-ablated differences of the senders so far and the sum of their ablated values
    state = dict(const=None, resid=None, diffs=[], buffer=None, n=0, abl_sum=None)
    captured = []

    # Without autograd, differences are written into one preallocated [S, B*T*D] buffer (no
    # re-concatenation per receiver group); with autograd (where writing into a tensor that an
    # earlier matmul saved is not allowed) _MixSenders concatenates them per group.
    buffered = patched and not torch.is_grad_enabled()

    def add_block(block):
        k = len(clean.blocks)
        clean.blocks.append(block)
        if patched:
            abl = ablated.blocks[k]
            diff = (block - abl).flatten(1)
            if buffered:
                if state["buffer"] is None:
                    state["buffer"] = diff.new_empty(graph.n_senders, diff.shape[1])
                state["buffer"][state["n"]: state["n"] + diff.shape[0]] = diff
            else:
                state["diffs"].append(diff)
            state["n"] += diff.shape[0]
            s = abl.sum(0)
            state["abl_sum"] = s if state["abl_sum"] is None else state["abl_sum"] + s
        else:
            s = block.sum(0)
            state["resid"] = s if state["resid"] is None else state["resid"] + s

    def add_const(c):
        if c is not None:
            state["const"] = c if state["const"] is None else state["const"] + c

    def receiver_input(receivers):
        """Inputs [R, B, T, D] of `receivers` (a slice), which read every sender recorded so far."""
        if not patched:
            x = state["resid"][None]
            if state["const"] is not None:
                x = x + state["const"]
        else:
            base = state["abl_sum"] if state["const"] is None else state["abl_sum"] + state["const"]
            base = base.expand(B, T, -1).reshape(-1)
            m = edge_mask[: state["n"], receivers]
            if buffered:  # one matmul over all earlier senders
                x = torch.addmm(base, m.T, state["buffer"][: state["n"]])
            else:
                x = _MixSenders.apply(base, m, *state["diffs"])
            x = x.view(-1, B, T, x_in.shape[-1])
        if receiver_hook is not None:
            replaced = receiver_hook(receivers, x)
            x = x if replaced is None else replaced
        if capture_receivers:
            if not x.requires_grad:
                x = x.detach().requires_grad_(True)
            else:
                x.retain_grad()
            captured.append((receivers, x))
        return x

    def one(r):
        return slice(r, r + 1)

    add_block(x_in[None])
    for l, lp in enumerate(parts.layers):
        if patched:  # 3H different inputs: q of every head, then k, then v
            xn = lp.attn_norm(receiver_input(graph.attn_receivers(l))).view(3, H, B, T, -1)
            # unbind, not xn[i]: each indexing's backward would zero-fill a tensor of xn's size
            q, k, v = (project_per_head(p, x, dh) for x, p in zip(xn.unbind(0), (lp.q, lp.k, lp.v)))
        else:
            xn = lp.attn_norm(receiver_input(graph.attn_receivers(l))[0])
            q, k, v = (project_shared(p, xn, dh) for p in (lp.q, lp.k, lp.v))
        z = _attend(parts, lp, q, k, v, rotary, masks[lp.sliding_window])
        if head_mask is not None:
            z_abl = ablated.z[l]
            z = z_abl + head_mask[l][:, None] * (z - z_abl)
        clean.z.append(z)
        out, const = split_heads_output(lp.o_proj, z)
        if lp.post_attn_norm is not None:
            out, const = _gemma2_head_outputs(lp.post_attn_norm, out, const), None
        add_block(out.permute(2, 0, 1, 3))
        add_const(const)

        x = receiver_input(one(graph.mlp_receiver(l)))[0]
        clean.hidden.append(None)
        hook = None
        if neuron_mask is not None or keep_hidden:
            def mix_hidden(module, args, l=l):
                h = args[0]
                if neuron_mask is not None:
                    h_abl = ablated.hidden[l]
                    h = h_abl + neuron_mask[l] * (h - h_abl)
                clean.hidden[l] = h
                return (h,) + tuple(args[1:])
            hook = lp.mlp_down.register_forward_pre_hook(mix_hidden)
        try:
            y = lp.mlp(lp.mlp_norm(x))
        finally:
            if hook is not None:
                hook.remove()
        if lp.post_mlp_norm is not None:
            y = lp.post_mlp_norm(y)
        add_block(y[None])

    if not compute_logits:
        return None, clean, captured
    x = receiver_input(one(graph.logits_receiver))[0]
    if logit_positions is not None:
        x = x[torch.arange(B, device=device), logit_positions.to(device)]
    logits = parts.lm_head(parts.final_norm(x))
    if parts.final_softcap is not None:
        logits = torch.tanh(logits / parts.final_softcap) * parts.final_softcap
    return logits, clean, captured


# ---------------------------------------------------------------- ablations

def ablated_values(parts, graph, intervention, shape, corrupted_ids=None, attention_mask=None,
                   means=None, keep_hidden=False, like=None):
    """What a removed edge carries (DESIGN.md §2) for a clean batch of `shape` [B, T]: the
    sender outputs of the corrupted run (`patching`), reference means (`mean`) or zeros."""
    device, dtype = like.device, like.dtype
    if intervention == "patching":
        _, ablated, _ = decomposed_forward(parts, graph, corrupted_ids.to(device), attention_mask,
                                           keep_hidden=keep_hidden, compute_logits=False)
        return ablated
    if intervention == "mean":
        if means is None:
            raise ValueError("intervention='mean' needs means=compute_means(model, graph, reference)")
        B, T = shape
        lengths = attention_mask.sum(1).cpu() if attention_mask is not None else torch.full((B,), T)
        ablated = means.values(graph, lengths, T)
        return SenderValues(*[[t.to(device=device, dtype=dtype) for t in part]
                              for part in (ablated.blocks, ablated.z, ablated.hidden)])
    return zero_values(parts, graph, like)


def zero_values(parts, graph, like):
    D, H, dh = parts.shape.d_model, parts.shape.n_heads, parts.shape.head_dim
    z = like.new_zeros
    blocks = [z(sl.stop - sl.start, 1, 1, D) for sl in block_slices(graph)]
    L = parts.shape.n_layers
    return SenderValues(blocks, [z(1, 1, H, dh)] * L, [z(1, 1, parts.shape.d_mlp)] * L)


@dataclass
class SenderMeans:
    """Mean sender outputs / head z / MLP hidden over a reference set: per position for each
    reference length (`by_length[n]` = (senders [S, n, D], z [L, n, H, dh], hidden [L, n, d_mlp]))
    and over all real positions (`overall`, same without the position dim)."""
    by_length: dict
    overall: tuple

    def values(self, graph, lengths, T):
        """SenderValues for a batch whose rows have `lengths` (padded to T): a row uses the
        per-position mean of its own length when the reference has that length, else (and at
        padding) the mean over positions."""
        S_all, z_all, h_all = self.overall
        use = [int(n) in self.by_length for n in lengths.tolist()]
        if not any(use):
            tensors = (S_all[:, None, None], z_all[:, None, None], h_all[:, None, None])
        else:
            rows = []
            for n, has in zip(lengths.tolist(), use):
                row = [t[:, None].expand(t.shape[0], T, *t.shape[1:]).clone() for t in self.overall]
                if has:
                    for full, part in zip(row, self.by_length[int(n)]):
                        full[:, :n] = part
                rows.append(row)
            tensors = tuple(torch.stack(col, 1) for col in zip(*rows))  # [S|L, B, T, ...]
        senders, z, hidden = tensors
        blocks = [senders[sl] for sl in block_slices(graph)]
        return SenderValues(blocks, list(z), list(hidden))


@torch.no_grad()
def compute_means(model, graph, sequences, batch_size=32, per_position=True):
    """Mean sender outputs of the plain model over `sequences` (lists of token ids)."""
    from condense.metrics import pad_batch
    parts = checked_parts(model, graph)
    device = next(model.parameters()).device
    sums, counts, total, n_total = {}, {}, None, 0
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    for start in range(0, len(order), batch_size):
        ids, mask, lengths = pad_batch([list(sequences[i]) for i in order[start:start + batch_size]])
        _, vals, _ = decomposed_forward(parts, graph, ids.to(device), mask.to(device), keep_hidden=True,
                                        compute_logits=False)
        wide = at_least_fp32(vals.blocks[0].dtype)  # accumulate bf16 models' means in fp32
        senders = vals.stacked().to(wide)                                   # [S, B, T, D]
        z = torch.stack(vals.z).to(wide)                                    # [L, B, T, H, dh]
        hidden = torch.stack(vals.hidden).to(wide)                          # [L, B, T, d_mlp]
        real = mask.to(device).bool()
        flat = [t.movedim(0, 2)[real] for t in (senders, z, hidden)]        # [n_real, S|L, ...]
        sums_all = [f.sum(0) for f in flat]
        total = sums_all if total is None else [a + b for a, b in zip(total, sums_all)]
        n_total += int(real.sum())
        if per_position:
            for b, n in enumerate(lengths.tolist()):
                row = [t[:, b, :n] for t in (senders, z, hidden)]
                sums[n] = row if n not in sums else [a + r for a, r in zip(sums[n], row)]
                counts[n] = counts.get(n, 0) + 1
    dtype = next(model.parameters()).dtype
    overall = tuple((t / n_total).to(dtype) for t in total)
    by_length = {n: tuple((t / counts[n]).to(dtype) for t in s) for n, s in sums.items()}
    return SenderMeans(by_length, overall)


# ---------------------------------------------------------------- public entry point

def checked_parts(model, graph):
    parts = model_parts(model)
    if model_shape(model) != graph.shape:
        raise ValueError(f"graph was built for {graph.shape}, model is {model_shape(model)}")
    return parts


def resolve_node_mask(mask, default, device, dtype):
    mask = default if mask is None else mask
    if tuple(mask.shape) != tuple(default.shape):
        raise ValueError(f"node mask shape {tuple(mask.shape)}, expected {tuple(default.shape)}")
    if not mask.requires_grad and bool((mask == 1).all()):
        return None  # all ones: nothing to mix
    return mask.to(device=device, dtype=dtype)


def run_graph(model, graph, clean_ids, corrupted_ids=None, attention_mask=None, *,
              intervention="patching", edge_mask=None, head_mask=None, neuron_mask=None,
              means=None, logit_positions=None, ablated_grad=False, receiver_hook=None,
              capture_receivers=False, return_run=False):
    """Logits of the circuit model on `clean_ids` [B, T].

    edge_mask: [n_senders, n_receivers] in [0, 1] (default graph.in_graph), may require grad.
    head_mask / neuron_mask: default graph.head_mask / graph.neuron_mask.
    intervention: "patching" (needs corrupted_ids, same shape; same attention_mask),
    "mean" (needs means=compute_means(...)), or "zero".
    logit_positions: [B] positions to read; then logits are [B, V] instead of [B, T, V].
    ablated_grad: let gradients flow through the corrupted run too (default: it is detached).
    return_run: return a GraphRun with clean/ablated sender values and captured receiver inputs
    (capture_receivers=True makes each receiver group's input retain its grad, for EAP)."""
    if intervention not in INTERVENTIONS:
        raise ValueError(f"intervention {intervention!r}; choose one of {INTERVENTIONS}")
    parts = checked_parts(model, graph)
    device = next(model.parameters()).device
    dtype = parts.token_embed.weight.dtype
    clean_ids = clean_ids.to(device)
    if attention_mask is not None:
        attention_mask = attention_mask.to(device)
    edge_mask = (graph.in_graph if edge_mask is None else edge_mask).to(device=device, dtype=dtype)
    if tuple(edge_mask.shape) != (graph.n_senders, graph.n_receivers):
        raise ValueError(f"edge_mask shape {tuple(edge_mask.shape)}, expected "
                         f"{(graph.n_senders, graph.n_receivers)}")
    head_mask = resolve_node_mask(head_mask, graph.head_mask, device, dtype)
    neuron_mask = resolve_node_mask(neuron_mask, graph.neuron_mask, device, dtype)

    if intervention == "patching" and (corrupted_ids is None
                                       or tuple(corrupted_ids.shape) != tuple(clean_ids.shape)):
        raise ValueError("patching needs corrupted_ids of the same shape as clean_ids")
    with torch.set_grad_enabled(ablated_grad and torch.is_grad_enabled()):
        ablated = ablated_values(parts, graph, intervention, clean_ids.shape, corrupted_ids,
                                 attention_mask, means, keep_hidden=neuron_mask is not None,
                                 like=edge_mask)
    logits, clean, captured = decomposed_forward(
        parts, graph, clean_ids, attention_mask, ablated=ablated, edge_mask=edge_mask,
        head_mask=head_mask, neuron_mask=neuron_mask, receiver_hook=receiver_hook,
        capture_receivers=capture_receivers, logit_positions=logit_positions)
    if return_run:
        return GraphRun(logits, clean, ablated, captured)
    return logits
