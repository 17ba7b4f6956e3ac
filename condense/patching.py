"""The exact edge-level forward (docs/design.md §2) over a model's own Hugging Face submodules.

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
Gemma2/3 normalize the summed attention output (post-attention RMSNorm) before the residual:
there each head's output is its share g * (o_proj(z_h) + bias / H) / rms(o_proj(z)), the
rms taken over the whole layer's attention output in the same run, so the heads of a layer
sum exactly to the normalized output (and their outputs depend on each other through rms).

Ablated values: `patching` runs the same model (adapter included) on the corrupted prompt
in the same call; `mean` uses `condense.means.compute_means` over a reference set; `zero` uses
zeros.
Head masks mix a head's z (before o_proj) and neuron masks mix the MLP hidden units (the
input of the down projection) between clean and ablated values, the same way.

Attention is computed as HF's eager attention (scaling, Gemma2 soft-capping, causal +
sliding-window + padding mask, softmax in fp32); attention/residual/embedding dropout is not
applied (call model.eval() to compare with the HF model). Right-padded batches need an
attention_mask; positions are 0..T-1 as in HF.
"""
from dataclasses import dataclass, field

import torch

from condense.model_parts import (Projection, heads_output_sum, model_parts, model_shape,
                                  project_per_head, project_shared, split_heads_output)
from condense.sender_mixing import MixSenders, SenderDiffs, mix, unique_columns

INTERVENTIONS = ("patching", "mean", "zero")


@dataclass
class SenderValues:
    """Sender outputs per block (input, a0, m0, a1, m1, ...), each [n_senders_in_block, B|1, T|1, D],
    plus each layer's head z [B|1, T|1, H, head_dim] and MLP hidden units [B|1, T|1, d_mlp]
    (hidden is None unless recorded)."""
    blocks: list
    z: list
    hidden: list
    # a patched run's clean - ablated per sender [n_senders, B, T, D], when every sender has one
    differences: torch.Tensor | None = None

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


def _heads_of(proj, heads):
    """The projection restricted to query heads `heads` (each still reads its own KV head)."""
    return Projection(proj.module, proj.offset, proj.head_of.to(heads.device)[heads])


def normed_head_shares(norm, out, const):
    """Split Gemma2/3's post-attention RMSNorm(sum_h out_h + const) exactly into per-head shares."""
    wide = at_least_fp32(out.dtype)  # Gemma2RMSNorm and Gemma3RMSNorm compute in fp32
    total = (out.sum(2) + (0 if const is None else const)).to(wide)
    inv_rms = torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + norm.eps)[:, :, None]
    share = out.to(wide) + (0 if const is None else const.to(wide) / out.shape[2])
    return (share * inv_rms * (1.0 + norm.weight.to(wide))).to(out.dtype)


def _storage_plan(graph, edge_mask):
    """Per block of senders (input, a0, m0, a1, ...): "none" when no receiver reads any of them
    (nothing to compute or store), "sum" when they all have the same mask row (only their summed
    difference matters: one row), else "each" (one row per sender)."""
    with torch.no_grad():
        mask = edge_mask.detach()
        plan = []
        for sl in block_slices(graph):
            readers = graph.valid[sl.start].nonzero()
            first = int(readers[0]) if len(readers) else graph.n_receivers
            rows = mask[sl, first:]  # every receiver from the block's first reader on reads it
            if not bool(rows.any()):
                plan.append("none")
            elif sl.stop - sl.start > 1 and bool((rows == rows[:1]).all()):
                plan.append("sum")
            else:
                plan.append("each")
    return plan


def decomposed_forward(parts, graph, ids, attention_mask=None, *, ablated=None, edge_mask=None,
                       head_mask=None, neuron_mask=None, keep_hidden=False, receiver_hook=None,
                       capture_receivers=False, logit_positions=None, compute_logits=True,
                       skip_unread=False, per_sender_values=True, input_delta=None):
    """One forward pass that records every sender's output.

    Without `ablated` it is the plain model (every receiver reads the full residual stream).
    With `ablated` (SenderValues) it is the patched model under `edge_mask` [S, R] and the
    optional node masks (head_mask [L, H], neuron_mask [L, d_mlp]). `receiver_hook(receivers,
    x)` sees (and may replace) each group of receiver inputs x [R, B, T, D], `receivers` being
    their slice of the graph's receiver axis. `input_delta` [B, T, D] is added to the input
    embeddings (the `input` sender's clean value).

    Work the mask makes unnecessary is skipped when nothing needs per-receiver gradients (the
    edge mask without grad, no capture, no hook); each shortcut computes the same values:
    - receivers that read the same mix (every edge on, say) are computed once, and a layer
      whose q/k/v inputs are all equal runs the model's own projections;
    - with `per_sender_values=False` (the caller reads only the logits), a node that no
      receiver reads is not computed, and a block of senders whose mask rows are equal is
      stored as its sum (the heads' summed output is o_proj(z) - o_proj(0));
    - with `skip_unread` (`ablated` is the same model's run on the corrupted prompt, i.e.
      patching), a node whose receivers read only ablated senders is not recomputed: its
      clean value is its ablated one. This one also applies with `capture_receivers` (the
      skipped node's receivers are not captured).
    Returns (logits or None, clean SenderValues, captured (receivers, x) pairs). Entries of
    the clean SenderValues that were not computed hold the ablated value or None."""
    B, T = ids.shape
    H, dh = parts.shape.n_heads, parts.shape.head_dim
    patched = ablated is not None
    x_in = parts.embed(ids)
    if input_delta is not None:
        x_in = x_in + input_delta
    dtype, device = x_in.dtype, x_in.device
    masks = attention_masks(attention_mask, B, T, [lp.sliding_window for lp in parts.layers], dtype, device)
    rotary = parts.rotary_tables(x_in, T)  # per layer (Gemma3: local and global differ)
    clean = SenderValues([], [], [])
    # const: o_proj(0) terms so far; resid (plain): sum of sender outputs; patched: the
    # differences of the senders so far (diffs), the sums of their ablated and clean values,
    # and the differences not yet handed to a receiver group under autograd (new)
    state = dict(const=None, resid=None, abl_sum=None, clean_sum=None, new=[], any_grad=False)
    captured = []
    per_receiver = patched and (edge_mask.requires_grad or capture_receivers
                                or receiver_hook is not None)
    # nodes that read only ablated senders are skipped under capture too (their receivers are
    # not captured: their gradients matter only for edges outside the circuit), not when the
    # mask itself needs a gradient or a hook may change what a receiver reads
    skip_unread = (skip_unread and patched and not edge_mask.requires_grad
                   and receiver_hook is None)
    plan = None
    if patched:
        diffs = SenderDiffs(graph.n_senders, B * T * x_in.shape[-1], x_in)
        if not per_receiver and not per_sender_values:
            plan = _storage_plan(graph, edge_mask)

    def mode(block_index):
        return "each" if plan is None else plan[block_index]

    def add_block(block, first_sender, skipped=False, summed=None):
        """Record a block of senders. Skipped blocks keep their ablated value (D = 0, no row);
        `summed` [1, B, T, D] stands for the sum of a block stored as one row."""
        k = len(clean.blocks)
        if not patched:
            clean.blocks.append(block)
            s = block.sum(0)
            state["resid"] = s if state["resid"] is None else state["resid"] + s
            return
        abl = ablated.blocks[k]
        abl_total = abl.sum(0)
        state["abl_sum"] = abl_total if state["abl_sum"] is None else state["abl_sum"] + abl_total
        if skipped:
            clean.blocks.append(abl)
            clean_total = abl_total
        else:
            clean.blocks.append(block)
            if summed is not None:
                diff = (summed[0] - abl_total).flatten()[None]
                clean_total = summed[0]
            else:
                diff = (block - abl).flatten(1)
                clean_total = block.sum(0)
            if diff.requires_grad:
                state["new"].append((diffs.n, diff))
                state["any_grad"] = True
            diffs.add(first_sender, diff)
        with torch.no_grad():
            t = clean_total.detach()
            state["clean_sum"] = t if state["clean_sum"] is None else state["clean_sum"] + t

    def add_const(c):
        if c is not None:
            state["const"] = c if state["const"] is None else state["const"] + c

    def reads_nothing(receivers):
        """True when every receiver in the slice reads only ablated senders (skip_unread)."""
        return skip_unread and not bool(diffs.mask_rows(edge_mask, receivers).any())

    def flat(v):
        v = v if state["const"] is None else v + state["const"]
        return v.expand(B, T, -1).reshape(-1)

    def receiver_input(receivers, shared_ok=False):
        """Inputs [R, B, T, D] of `receivers` (a slice), which read every sender recorded so far;
        with shared_ok, [1, B, T, D] when all of them read the same mix."""
        if not patched:
            x = state["resid"][None]
            if state["const"] is not None:
                x = x + state["const"]
        else:
            base = flat(state["abl_sum"])
            with torch.no_grad():
                full = flat(state["clean_sum"]).detach()
            m = diffs.mask_rows(edge_mask, receivers)
            if shared_ok and not per_receiver and m.shape[1] > 1 and bool((m == m[:, :1]).all()):
                m = m[:, :1]  # every receiver reads the same mix: compute it once
            if torch.is_grad_enabled() and (m.requires_grad or base.requires_grad or state["any_grad"]):
                starts = tuple(start for start, _ in state["new"])
                x = MixSenders.apply(base, m, diffs, full, starts, *(d for _, d in state["new"]))
                state["new"] = []
            else:  # one product per distinct column
                unique = None if per_receiver else unique_columns(m)
                x = mix(diffs, base, full, m if unique is None else unique[0])
                if unique is not None:
                    x = x.expand(len(unique[1]), -1) if x.shape[0] == 1 else x.index_select(0, unique[1])
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

    def active_heads(receivers):
        """Indices of the heads of a layer whose q, k or v reads a sender (skip_unread), or None
        when all do: the others compute exactly their ablated z."""
        reads = diffs.mask_rows(edge_mask, receivers).detach().any(0).view(3, H).any(0)
        return None if bool(reads.all()) else reads.nonzero().flatten()

    def attend_heads(lp, l, heads):
        """z [B, T, H or len(heads), dh] of the layer's heads (all when `heads` is None)."""
        receivers = graph.attn_receivers(l)
        if heads is not None:  # their q, then k, then v receivers
            receivers = receivers.start + torch.cat([heads, heads + H, heads + 2 * H])
        n_heads = H if heads is None else len(heads)
        x = receiver_input(receivers, shared_ok=True)
        if x.shape[0] > 1:  # different inputs: q of every head, then k, then v
            xn = lp.attn_norm(x).view(3, n_heads, B, T, -1)
            projections = (lp.q, lp.k, lp.v) if heads is None else (
                _heads_of(lp.q, heads), _heads_of(lp.k, heads), _heads_of(lp.v, heads))
            # unbind, not xn[i]: each indexing's backward would zero-fill a tensor of xn's size
            q, k, v = (project_per_head(p, xi, dh) for xi, p in zip(xn.unbind(0), projections))
        else:  # every head reads the same input: the model's own projections
            xn = lp.attn_norm(x[0])
            q, k, v = (project_shared(p, xn, dh) for p in (lp.q, lp.k, lp.v))
            if heads is not None:
                q, k, v = (t[:, :, heads] for t in (q, k, v))
        return _attend(parts, lp, q, k, v, rotary[l], masks[lp.sliding_window])

    if mode(0) == "none":
        add_block(None, 0, skipped=True)
    else:
        add_block(x_in[None], 0)
    for l, lp in enumerate(parts.layers):
        heads, how = graph.attn_senders(l), mode(2 * l + 1)
        if patched and (how == "none" or reads_nothing(graph.attn_receivers(l))):
            clean.z.append(ablated.z[l])
            add_block(None, heads.start, skipped=True)
            if lp.post_attn_norm is None:  # o_proj(0) is the same in every run: keep it
                add_const(split_heads_output(lp.o_proj, ablated.z[l][:1, :1])[1])
        else:
            active = active_heads(graph.attn_receivers(l)) if skip_unread else None
            if active is not None:  # only the heads that read something are recomputed
                z = ablated.z[l].expand(B, T, H, dh).clone()
                z[:, :, active] = attend_heads(lp, l, active)
            else:
                z = attend_heads(lp, l, None)
            if head_mask is not None:
                z_abl = ablated.z[l]
                z = z_abl + head_mask[l][:, None] * (z - z_abl)
            clean.z.append(z)
            if how == "sum" and lp.post_attn_norm is None:
                total, const = heads_output_sum(lp.o_proj, z)
                add_block(None, heads.start, summed=total[None])
            else:
                out, const = split_heads_output(lp.o_proj, z)
                if lp.post_attn_norm is not None:
                    out, const = normed_head_shares(lp.post_attn_norm, out, const), None
                block = out.permute(2, 0, 1, 3)
                add_block(block, heads.start, summed=block.sum(0, keepdim=True) if how == "sum" else None)
            add_const(const)

        if patched and (mode(2 * l + 2) == "none" or reads_nothing(one(graph.mlp_receiver(l)))):
            clean.hidden.append(ablated.hidden[l])
            add_block(None, graph.mlp_sender(l), skipped=True)
            continue
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
        add_block(y[None], graph.mlp_sender(l))

    if patched and diffs.contiguous and diffs.n == graph.n_senders:
        clean.differences = diffs.data.view(graph.n_senders, B, T, -1)
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
    """What a removed edge carries (docs/design.md §2) for a clean batch of `shape` [B, T]: the
    sender outputs of the corrupted run (`patching`), reference means (`mean`) or zeros."""
    device, dtype = like.device, like.dtype
    if intervention == "patching":
        _, ablated, _ = decomposed_forward(parts, graph, corrupted_ids.to(device), attention_mask,
                                           keep_hidden=keep_hidden, compute_logits=False)
        return ablated
    if intervention == "mean":
        if means is None:
            raise ValueError("intervention='mean' needs "
                             "means=condense.means.compute_means(model, graph, reference)")
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


def run_graph(model: torch.nn.Module, graph, clean_ids: torch.Tensor,
              corrupted_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None, *,
              intervention: str = "patching", edge_mask: torch.Tensor | None = None,
              head_mask: torch.Tensor | None = None, neuron_mask: torch.Tensor | None = None,
              means=None, logit_positions: torch.Tensor | None = None,
              ablated_grad: bool = False, receiver_hook=None, capture_receivers: bool = False,
              return_run: bool = False, ablated: SenderValues | None = None) -> "torch.Tensor | GraphRun":
    """Logits of the circuit model on `clean_ids` [B, T].

    edge_mask: [n_senders, n_receivers] in [0, 1] (default graph.in_graph), may require grad.
    head_mask / neuron_mask: default graph.head_mask / graph.neuron_mask.
    intervention: "patching" (needs corrupted_ids, same shape; same attention_mask),
    "mean" (needs means=condense.means.compute_means(...)), or "zero".
    logit_positions: [B] positions to read; then logits are [B, V] instead of [B, T, V].
    ablated_grad: let gradients flow through the corrupted run too (default: it is detached).
    return_run: return a GraphRun with clean/ablated sender values and captured receiver inputs
    (capture_receivers=True makes each receiver group's input retain its grad, for EAP).
    ablated: what removed edges carry for this batch, from an earlier run's GraphRun.ablated on
    the same batch and intervention (the corrupted run does not depend on the circuit, so many
    circuits can share it); recomputed when it lacks the MLP hidden units a neuron mask needs."""
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
    if ablated is None or (neuron_mask is not None and any(h is None for h in ablated.hidden)):
        with torch.set_grad_enabled(ablated_grad and torch.is_grad_enabled()):
            ablated = ablated_values(parts, graph, intervention, clean_ids.shape, corrupted_ids,
                                     attention_mask, means, keep_hidden=neuron_mask is not None,
                                     like=edge_mask)
    logits, clean, captured = decomposed_forward(
        parts, graph, clean_ids, attention_mask, ablated=ablated, edge_mask=edge_mask,
        head_mask=head_mask, neuron_mask=neuron_mask, receiver_hook=receiver_hook,
        capture_receivers=capture_receivers, logit_positions=logit_positions,
        skip_unread=intervention == "patching", per_sender_values=return_run)
    if return_run:
        return GraphRun(logits, clean, ablated, captured)
    return logits
