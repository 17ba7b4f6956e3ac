"""Mean logit differences of many sub-circuits of one small circuit, many per forward pass.

Verification (docs/design.md §7) evaluates up to 2^20 subsets of a circuit C of n edges on the
same prompts. A subset is an integer id: bit i set = edge i on; `SubsetEvaluator.edges`
lists the edges in bit order. Under the intervention of §2 a receiver r reads

    x_r = base_r + sum over the subset's edges e = (s, r) of (clean_s - ablated_s)

where base_r is its input with every edge off (ablated sender values plus the output-projection
bias constants). Every edge outside C is off in every subset, so (the "sparse" method):
- base_r, the ablated values and the clean output of every sender that no circuit edge enters
  do not depend on the subset: one corrupted run and one empty-circuit run per prompt batch;
- per subset, only the *circuit nodes* (a circuit edge enters and one leaves them) are
  recomputed, each alone (one head or one MLP, never the whole model);
- a circuit node depends only on the circuit edges upstream of it (its cone): within a pass
  over many subsets it is computed once per distinct setting of its cone (early nodes have
  few), and a head's query, key and value each once per setting of their own cones;
- a node whose output is only read at the last position (by the logits, or by MLPs and
  queries that are themselves only read there) is computed at the last position only;
- the logits' input for all subsets of a pass is one matrix product (subset x source-version
  coefficients times the stacked source versions), and only the answer and distractor rows
  of the unembedding are applied.
It equals evaluate() on each subset's circuit up to float rounding (tests/test_verify.py).

Node masks (head_mask, neuron_mask) are applied as patching applies them. Where one head's
output depends on the layer's other heads (Gemma2/3 normalise the sum of its heads), a layer's
heads are recomputed together, once per setting of their joint cone (condense.verify.plan's
HeadGroup). The "dense" method runs the exact forward (patching.decomposed_forward) once per
subset, still with one corrupted run per prompt batch: a check of the sparse path, and a
fallback for anything it does not cover.
"""
from dataclasses import dataclass

import torch

from condense.evaluate import dataset_columns, row_batches
from condense.model_parts import affine_weight, split_heads_output
from condense.patching import (at_least_fp32, attention_masks, checked_parts, resolve_node_mask,
                               ablated_values, decomposed_forward, normed_head_shares)
from condense.verify.plan import HeadGroup, plan, reads_last_only
from condense.verify.versions import (at_last, matmul_versions, project_rows, sender_output,
                                      versions_of)

METHODS = ("auto", "sparse", "dense")


def circuit_edges(graph):
    """The graph's in-graph edges (sender, receiver) in bit order: receivers from last (logits)
    to first, then senders. Late edges take the low bits, which vary fastest over contiguous
    subset ids; an edge into the logits changes no circuit node, so chunks recompute little."""
    s_idx, r_idx = torch.nonzero(graph.in_graph & graph.valid, as_tuple=True)
    return sorted(zip(s_idx.tolist(), r_idx.tolist()), key=lambda e: (-e[1], e[0]))


def subset_masks(ids, n_edges):
    """Subset ids [M] (int64) -> bool masks [M, n_edges] (column i = bit i)."""
    bits = torch.arange(n_edges, device=ids.device)
    return ((ids[:, None] >> bits) & 1).bool()


@dataclass
class _Batch:
    """What does not depend on the subset, for one prompt batch."""
    last: torch.Tensor               # [B] last real position
    answer: torch.Tensor
    distractor: torch.Tensor
    base: dict                       # receiver -> input with every edge off [B, T, D]
    fixed_diff: dict                 # sender outside the circuit nodes -> clean - ablated [B, T, D]
    ablated: dict                    # circuit node -> its ablated output [B, T, D]
    attn_masks: dict                 # sliding window -> additive mask [B, 1, T, T]
    rotary: list                     # per layer: (cos, sin) or None
    node_mix: dict                   # circuit node -> (node mask, ablated z or hidden [B, T, .])
    heads_out: dict                  # HeadGroup layer -> (every head's output with every edge off
                                     # [B, T, H, D] before the layer's norm, o_proj(0) or None)


class SubsetEvaluator:
    """Mean logit difference (docs/design.md §4) of subsets of `graph`'s in-graph edges on `dataset`.

        ev = SubsetEvaluator(model, circuit, rows, intervention="patching")
        ld = ev.mean_logit_diffs(torch.arange(2 ** ev.n_edges))   # [2^n] float64

    method: "sparse" (the fast path above), "dense" (one exact forward per subset, its check)
    or "auto" (sparse: it covers every model the graph supports). max_elements bounds every intermediate tensor (elements), so
    memory stays flat however many subsets a pass holds; node versions are computed in pieces
    of at most piece_elements (smaller pieces stay in cache). Setting `kept = {}` (sparse
    method) keeps each prompt batch's subset-independent part between calls, for callers that
    ask about a few subsets many times (verify's greedy reduction); None stops it."""

    def __init__(self, model, graph, dataset, intervention="patching", *, means=None,
                 batch_size=32, method="auto", max_elements=2 ** 23, piece_elements=2 ** 21,
                 max_subsets_per_pass=8192):
        if method not in METHODS:
            raise ValueError(f"method {method!r}; choose one of {METHODS}")
        self.model, self.graph, self.intervention, self.means = model, graph, intervention, means
        self.parts = checked_parts(model, graph)
        self.cols, self.n_rows = dataset_columns(dataset)
        self.batch_size, self.max_elements = batch_size, max_elements
        self.piece_elements = min(piece_elements, max_elements)
        self.max_subsets_per_pass = max_subsets_per_pass
        self.kept = None  # or {}: first row of a prompt batch -> its _Batch, kept between calls
        self.resumed = 0  # subset x prompt counts a resumed call found done (mean_logit_diffs)
        self.edges = circuit_edges(graph)
        self.n_edges = len(self.edges)
        self.edge_names = [f"{graph.sender_names[s]}->{graph.receiver_names[r]}" for s, r in self.edges]
        self.method = "sparse" if method == "auto" else method
        self.into = {}                          # receiver -> circuit-edge indices
        self.out_of = {}                        # sender -> circuit-edge indices
        for i, (s, r) in enumerate(self.edges):
            self.into.setdefault(r, []).append(i)
            self.out_of.setdefault(s, []).append(i)
        grouped = self.parts.layers[0].post_attn_norm is not None
        self.units = (plan(graph, self.edges, self.into, self.out_of, grouped)
                      if self.method == "sparse" else [])
        self.nodes = [m for unit in self.units for m in unit.members]  # every head / MLP computed

    # ------------------------------------------------------------ public entry point
    @torch.no_grad()
    def mean_logit_diffs(self, subsets, progress=None, with_accuracy=False, sums=None):
        """Mean LD over the dataset's rows of each subset: `subsets` is int64 ids [N] (bit i =
        edge i) or bool masks [N, n_edges]. Returns float64 [N] on the CPU, and with
        `with_accuracy` also each subset's accuracy (fraction of rows with LD > 0).
        `progress(done, total)` is called after each pass, in units of subset x prompt.
        `sums` (condense.verify.resume.SubsetSums): keep the running sums there between runs, and
        go on from them when they are this evaluation's; `self.resumed` is then the subset x
        prompt count done before, which `progress` leaves out of both its numbers."""
        device = next(self.model.parameters()).device
        if subsets.dtype == torch.bool:
            if subsets.dim() != 2 or subsets.shape[1] != self.n_edges:
                raise ValueError(f"subset masks must be [N, {self.n_edges}]")
        elif self.n_edges > 62:
            raise ValueError("subset ids need n_edges <= 62; pass bool masks instead")
        N = subsets.shape[0]
        settings = repr((self.edge_names, self.n_rows, self.batch_size, self.method,
                         self.intervention, self.max_elements, self.max_subsets_per_pass))
        units_done, totals, correct = (sums.start(subsets, settings) if sums is not None else
                                       (0, torch.zeros(N, dtype=torch.float64),
                                        torch.zeros(N, dtype=torch.float64)))
        subsets = subsets.to(device)
        self.resumed = 0
        unit = 0  # (prompt batch, chunk of subsets) pairs, in this loop's fixed order
        was_training = self.model.training
        self.model.eval()
        try:
            self._weights = self._weight_slices() if self.method == "sparse" else None
            done = 0
            for idx, clean, corrupted, attn_mask, last in row_batches(
                    self.cols, self.n_rows, self.batch_size, device):
                per_pass = self._subsets_per_pass(len(idx))
                starts = range(0, N, per_pass)
                if unit + len(starts) <= units_done:  # every chunk of this batch done before
                    unit += len(starts)
                    done += N * len(idx)
                    self.resumed = done
                    continue
                first = int(idx[0])
                if self.kept is not None and self.method == "sparse" and first in self.kept:
                    batch = self.kept[first]
                else:
                    batch = self._prepare(idx, clean, corrupted, attn_mask, last)
                    if self.kept is not None and self.method == "sparse":
                        self.kept[first] = batch
                for start in starts:
                    chunk = subsets[start:start + per_pass]
                    if unit < units_done:
                        unit += 1
                        done += len(chunk) * len(idx)
                        self.resumed = done
                        continue
                    masks = chunk if chunk.dtype == torch.bool else subset_masks(chunk, self.n_edges)
                    if self.method == "sparse":
                        ld = self._sparse_pass(batch, masks)
                    else:
                        ld = self._dense_pass(batch, clean, attn_mask, masks)
                    totals[start:start + len(chunk)] += ld.double().sum(0).cpu()
                    correct[start:start + len(chunk)] += (ld > 0).double().sum(0).cpu()
                    unit += 1
                    done += len(chunk) * len(idx)
                    if sums is not None:
                        sums.update(unit, totals, correct)
                    if progress is not None:
                        progress(done - self.resumed, N * self.n_rows - self.resumed)
            if sums is not None:
                sums.update(unit, totals, correct, final=True)
        finally:
            self._weights = None
            self.model.train(was_training)
        if with_accuracy:
            return totals / self.n_rows, correct / self.n_rows
        return totals / self.n_rows

    def _subsets_per_pass(self, B):
        D = self.parts.shape.d_model
        return max(1, min(self.max_subsets_per_pass, self.max_elements // (B * D)))

    # ------------------------------------------------------------ per prompt batch
    def _prepare(self, idx, clean, corrupted, attn_mask, last):
        parts, graph = self.parts, self.graph
        device = clean.device
        like = parts.token_embed.weight
        dtype = like.dtype
        head_mask = resolve_node_mask(None, graph.head_mask, device, dtype)
        neuron_mask = resolve_node_mask(None, graph.neuron_mask, device, dtype)
        ablated = ablated_values(parts, graph, self.intervention, clean.shape, corrupted, attn_mask,
                                 self.means, keep_hidden=neuron_mask is not None, like=like)
        self._ablated_run = ablated  # the dense pass reuses it
        wanted = {r for node in self.nodes for r in node.receivers}
        wanted.add(graph.logits_receiver)
        base = {}

        def keep_base(receivers, x):
            for r in range(receivers.start, receivers.stop):
                if r in wanted:
                    base[r] = x[r - receivers.start].clone()

        nothing = torch.zeros(graph.n_senders, graph.n_receivers, dtype=dtype, device=device)
        _, empty_run, _ = decomposed_forward(
            parts, graph, clean, attn_mask, ablated=ablated, edge_mask=nothing, head_mask=head_mask,
            neuron_mask=neuron_mask, receiver_hook=keep_base, logit_positions=last)  # (logits unused)
        answer = torch.tensor([int(self.cols["answer_id"][i]) for i in idx], device=device)
        distractor = torch.tensor([int(self.cols["distractor_id"][i]) for i in idx], device=device)
        B, T = clean.shape
        circuit_nodes = {s for unit in self.units for s in unit.senders}
        fixed_diff, ablated_out = {}, {}
        for s in self.out_of:
            if s not in circuit_nodes:
                fixed_diff[s] = (sender_output(empty_run, graph, s, B, T)
                                 - sender_output(ablated, graph, s, B, T))
        for s in circuit_nodes:
            ablated_out[s] = sender_output(ablated, graph, s, B, T)
        # node masks (head z, MLP hidden units) of the circuit nodes: mixed as patching does
        node_mix = {}
        for node in self.nodes:
            if node.head is not None and head_mask is not None and float(head_mask[node.layer, node.head]) != 1:
                z_abl = ablated.z[node.layer][:, :, node.head].expand(B, T, -1)
                node_mix[node.sender] = (head_mask[node.layer, node.head], z_abl)
            elif node.head is None and neuron_mask is not None and not bool((neuron_mask[node.layer] == 1).all()):
                hidden = ablated.hidden[node.layer].expand(B, T, -1)
                node_mix[node.sender] = (neuron_mask[node.layer], hidden)
        windows = [lp.sliding_window for lp in parts.layers]
        masks = attention_masks(attn_mask, B, T, windows, dtype, device)
        rotary = parts.rotary_tables(like.new_zeros(1, T, parts.shape.d_model), T)
        heads_out = {}
        for unit in self.units:
            if isinstance(unit, HeadGroup):
                z = empty_run.z[unit.layer].expand(B, T, -1, -1)
                heads_out[unit.layer] = split_heads_output(parts.layers[unit.layer].o_proj, z)
        return _Batch(last, answer, distractor, base, fixed_diff, ablated_out, masks, rotary, node_mix,
                      heads_out)

    def _weight_slices(self):
        """Per circuit head: (W, b) of its q, k, v rows and its o_proj columns, read once per call
        (a LoRA adapter folded in); None where the module is not a known affine map."""
        out = {}
        dh, H = self.parts.shape.head_dim, self.parts.shape.n_heads
        for node in self.nodes:
            if node.head is None:
                continue
            lp = self.parts.layers[node.layer]
            qkv = []
            for proj in (lp.q, lp.k, lp.v):
                rows = proj.offset + int(proj.head_of[node.head]) * dh + torch.arange(dh)
                wb = affine_weight(proj.module)
                if wb is None:
                    qkv.append((None, rows, proj.module))
                else:
                    W, b = wb
                    rows = rows.to(W.device)
                    qkv.append(((W[rows], None if b is None else b[rows]), rows, proj.module))
            wb = affine_weight(lp.o_proj)
            o = None if wb is None else wb[0].reshape(wb[0].shape[0], H, dh)[:, node.head]
            out[node.sender] = (qkv, o)
        return out

    # ------------------------------------------------------------ sparse pass
    def _sparse_pass(self, batch, masks):
        """Logit differences [B, M] of the M subsets in `masks` [M, n_edges]."""
        weights = masks.to(self.parts.token_embed.weight.dtype)
        versions = {}  # circuit node -> (version of each subset [M], diff [B, U, T or 1, D])
        B = batch.last.shape[0]
        T = batch.attn_masks[self.parts.layers[0].sliding_window].shape[-1]
        shape = self.parts.shape
        for unit in self.units:
            version, rep = versions_of(masks, unit.cone)
            # versions computed at once, so that no intermediate exceeds piece_elements (a head
            # read at the last position only still has keys and values at every position)
            if unit.all_positions:
                per_version = B * T * max(shape.d_model, shape.d_mlp, T)
            elif not unit.is_mlp:
                per_version = B * max(T * shape.head_dim, shape.d_model)
            else:
                per_version = B * shape.d_mlp
            if isinstance(unit, HeadGroup):  # every head of the layer at once
                per_version *= shape.n_heads + 1
            step = max(1, self.piece_elements // per_version)
            pieces = [self._unit_outputs(batch, unit, rep[i:i + step], masks, weights, versions)
                      for i in range(0, len(rep), step)]
            for s in unit.senders:
                out = torch.cat([piece[s] for piece in pieces], 1)
                abl = batch.ablated[s]
                versions[s] = (version, out - (abl[:, None] if unit.all_positions
                                               else at_last(abl[:, None], batch.last)))
        return self._logit_diff(batch, self._logits_input(batch, weights, versions))

    def _logits_input(self, batch, weights, versions):
        """The logits' input at the last position for every subset of the pass, [M, B, D].

        Subset m reads base + sum_e w[m, e] * diff_e[version_e(m)]: one matrix product of an
        [M, V] coefficient matrix (one entry per edge and subset, plus 1 for base) with the
        stacked versions [V, B*D] of the sources, instead of one pass over [M, B, D] per edge.
        V is small because the logits' edges take the fastest-varying bits; a source with many
        versions in this pass (> 64) is gathered and added instead."""
        r = self.graph.logits_receiver
        M, device = weights.shape[0], weights.device
        B, D = batch.last.shape[0], self.parts.shape.d_model
        base = at_last(batch.base[r][:, None], batch.last)[:, 0, 0]              # [B, D]
        blocks, columns, gathered = [base.reshape(1, B * D)], [], []
        offset = 1
        for i in self.into.get(r, []):
            s = self.edges[i][0]
            if s in versions:
                version, diff = versions[s]
                if diff.shape[2] != 1:
                    diff = at_last(diff, batch.last)
            else:
                version = torch.zeros(M, dtype=torch.long, device=device)
                diff = at_last(batch.fixed_diff[s][:, None], batch.last)
            diff = diff[:, :, 0].transpose(0, 1)                                # [U, B, D]
            if diff.shape[0] > 64:
                gathered.append((i, version, diff))
                continue
            blocks.append(diff.reshape(diff.shape[0], B * D))
            columns.append((i, offset + version))
            offset += diff.shape[0]
        coeff = weights.new_zeros(M, offset)
        coeff[:, 0] = 1
        rows = torch.arange(M, device=device)
        for i, col in columns:
            coeff[rows, col] = weights[:, i]
        x = (coeff @ torch.cat(blocks)).view(M, B, D)
        for i, version, diff in gathered:
            x = x + weights[:, i, None, None] * diff[version]
        return x

    def _receiver_input(self, batch, r, node, rows, weights, versions):
        """Input of receiver r [B, len(rows) or 1, T or 1, D] for the subsets `rows`."""
        last_only = reads_last_only(node, r)
        x = batch.base[r][:, None]
        x = at_last(x, batch.last) if last_only else x
        for i in self.into.get(r, []):
            s = self.edges[i][0]
            if s in versions:
                version, diff = versions[s]
                if last_only and diff.shape[2] != 1:
                    diff = at_last(diff, batch.last)  # before indexing: U versions, not M subsets
                d = diff[:, version[rows]]
            else:
                d = batch.fixed_diff[s][:, None]
                if last_only:
                    d = at_last(d, batch.last)
            x = x + weights[rows, i][None, :, None, None] * d
        return x

    def _unit_outputs(self, batch, unit, rows, masks, weights, versions):
        """Sender -> clean output [B, len(rows), T or 1, D] of a unit's senders for the subsets
        `rows`. A HeadGroup recomputes its members, takes every other head of the layer as it
        is with every edge off, and splits the normalised sum into per-head shares as the
        patched forward does (patching.normed_head_shares)."""
        if not isinstance(unit, HeadGroup):
            return {unit.sender: self._node_output(batch, unit, rows, masks, weights, versions)}
        out, const = batch.heads_out[unit.layer]                    # [B, T, H, D]
        if not unit.all_positions:
            out = at_last(out[:, None], batch.last)[:, 0]
        B, T, H, D = out.shape
        out = out[:, None].expand(B, len(rows), T, H, D).contiguous()  # (a copy)
        for node in unit.members:
            out[:, :, :, node.head] = self._node_output(batch, node, rows, masks, weights, versions)
        norm = self.parts.layers[unit.layer].post_attn_norm
        shares = normed_head_shares(norm, out.view(B * len(rows), T, H, D), const)
        shares = shares.view(B, len(rows), T, H, D)
        return {s: shares[:, :, :, unit.heads[s]] for s in unit.senders}

    def _node_output(self, batch, node, rows, masks, weights, versions):
        """Clean output [B, len(rows), T or 1, D] of a circuit node for the subsets `rows`."""
        lp = self.parts.layers[node.layer]
        mix = batch.node_mix.get(node.sender)
        if mix is not None:  # the node's mask mixes its clean and ablated z / hidden units
            keep, ablated = mix
            ablated = ablated[:, None] if node.all_positions else at_last(ablated[:, None], batch.last)
        if node.head is None:
            x = self._receiver_input(batch, node.receivers[0], node, rows, weights, versions)
            hook = None
            if mix is not None:
                def mix_hidden(module, args):
                    return (ablated + keep * (args[0] - ablated),) + tuple(args[1:])
                hook = lp.mlp_down.register_forward_pre_hook(mix_hidden)
            try:
                y = lp.mlp(lp.mlp_norm(x))
            finally:
                if hook is not None:
                    hook.remove()
            return y if lp.post_mlp_norm is None else lp.post_mlp_norm(y)
        # q, k and v each depend on part of the node's cone only: compute each once per
        # setting of its own cone (keys and values span every position), then gather
        (q, q_version), (k, k_version), (v, v_version) = (
            self._head_input(batch, node, c, rows, masks, weights, versions) for c in range(3))
        if q_version is not None:
            q = q[:, q_version]
        mask = batch.attn_masks[lp.sliding_window]
        if not node.all_positions:
            mask = at_last(mask, batch.last)
        scores = matmul_versions(q, k.transpose(-1, -2), k_version) * lp.scaling
        if lp.softcap is not None:
            scores = torch.tanh(scores / lp.softcap) * lp.softcap
        probs = torch.softmax(scores + mask, dim=-1, dtype=at_least_fp32(q.dtype)).to(q.dtype)
        z = matmul_versions(probs, v, v_version)                   # [B, U, T or 1, dh]
        if mix is not None:
            z = ablated + keep * (z - ablated)
        o_cols = self._weights[node.sender][1]
        if o_cols is not None:
            return z @ o_cols.T
        H, dh = self.parts.shape.n_heads, self.parts.shape.head_dim
        alone = z.new_zeros(*z.shape[:-1], H * dh)                  # every other head zeroed
        alone[..., node.head * dh:(node.head + 1) * dh] = z
        return lp.o_proj(alone) - lp.o_proj(z.new_zeros(1, H * dh))[0]

    def _head_input(self, batch, node, c, rows, masks, weights, versions):
        """Head `node`'s query (c=0), key (1) or value (2) for the subsets `rows`, computed once
        per setting of that receiver's cone: (values [B, versions, T or 1, head_dim], the version
        of each row of `rows` or None when there is a single version for all)."""
        lp = self.parts.layers[node.layer]
        r, cone = node.receivers[c], node.receiver_cones[c]
        if cone:
            version, rep = versions_of(masks[rows], cone)
            x = self._receiver_input(batch, r, node, rows[rep], weights, versions)
        else:  # no circuit edge enters it: every edge off, the same for every subset
            x = self._receiver_input(batch, r, node, rows[:0], weights, versions)
        y = project_rows(self._weights[node.sender][0][c], lp.attn_norm(x))
        if c < 2 and lp.q_norm is not None:
            y = (lp.q_norm if c == 0 else lp.k_norm)(y)
        if c < 2 and batch.rotary[node.layer] is not None:
            cos, sin = batch.rotary[node.layer]
            if c == 0 and not node.all_positions:  # the query's own position is each row's last
                cos, sin = (t[0, batch.last][:, None] for t in (cos, sin))
            y = self.parts.apply_rotary(y, y, cos, sin)[c]
        return (y, version) if cone else (y, None)

    def _logit_diff(self, batch, x):
        """x [M, B, D] (logits input at the last position) -> answer - distractor logit [B, M]."""
        parts = self.parts
        y = parts.final_norm(x)
        wb = affine_weight(parts.lm_head)
        if wb is not None:
            W, b = wb
            pair = torch.stack([batch.answer, batch.distractor], 1)          # [B, 2]
            logits = torch.einsum("mbd,bkd->bmk", y, W[pair])
            if b is not None:
                logits = logits + b[pair][:, None]
        else:
            logits = parts.lm_head(y).transpose(0, 1)                          # [B, M, V]
            pair = torch.stack([batch.answer, batch.distractor], 1)[:, None].expand(-1, y.shape[0], -1)
            logits = logits.gather(2, pair)
        if parts.final_softcap is not None:
            logits = torch.tanh(logits / parts.final_softcap) * parts.final_softcap
        logits = logits.float()
        return logits[..., 0] - logits[..., 1]

    # ------------------------------------------------------------ dense pass
    def _dense_pass(self, batch, clean, attn_mask, masks):
        """The exact forward once per subset (shares the batch's corrupted run)."""
        graph, dtype = self.graph, self.parts.token_embed.weight.dtype
        device = clean.device
        s_idx = torch.tensor([s for s, _ in self.edges], dtype=torch.long, device=device)
        r_idx = torch.tensor([r for _, r in self.edges], dtype=torch.long, device=device)
        head_mask = resolve_node_mask(None, graph.head_mask, device, dtype)
        neuron_mask = resolve_node_mask(None, graph.neuron_mask, device, dtype)
        rows = torch.arange(clean.shape[0], device=device)
        out = []
        for m in masks.to(dtype):
            edge_mask = torch.zeros(graph.n_senders, graph.n_receivers, dtype=dtype, device=device)
            edge_mask[s_idx, r_idx] = m
            logits, _, _ = decomposed_forward(
                self.parts, graph, clean, attn_mask, ablated=self._ablated_run, edge_mask=edge_mask,
                head_mask=head_mask, neuron_mask=neuron_mask, logit_positions=batch.last)
            logits = logits.float()
            out.append(logits[rows, batch.answer] - logits[rows, batch.distractor])
        return torch.stack(out, 1)
