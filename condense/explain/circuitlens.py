"""CircuitLens: where a circuit node is active and which upstream nodes drive it there,
its contexts grouped by contributor sets (after "Circuit Insights", Golimblevskaia et al. 2025).

1. Pool: task prompts (clean) and general-text blocks; every real position is a context.
   A node's activation at a position is the distance of its output from its mean output
   over the pool, ||out_n(b, p) - mu_n|| (a head: its share of o_proj; an MLP: its output).
2. Contexts: positions with activation at or above the pool's `active_quantile` (0.9)
   quantile, split into `n_bins` (4) quantile bins of activation; from each bin up to
   n_contexts / n_bins positions are drawn by weighted sampling without replacement
   (torch.multinomial, weights = activation, seeded), so the strongest contexts are most
   likely but the range of activations is covered. The context is the prompt up to and
   including the position.
3. Contributors of a context: the edges into the node (every sender before it, in the
   circuit or not; a head's three inputs q/k/v separately) scored by
   score(s -> r) = sum over positions of (out_s - mu_s) . d act / d x_r
   in one forward of the model on that context (mean ablation to the pool's per-sender mean
   output, gradient of the node's activation at the context's last position with respect
   to the receiver's input; the edge-level forward of condense.patching with every edge on,
   so each receiver has its own input). The gradient holds the scale of the node's input
   norm fixed (LayerNorm's sigma, RMSNorm's rms; the value is exact), the usual
   linearisation through a norm: the norm is scale-invariant, so without this a residual
   stream dominated by one sender would give that sender no credit. This is EAP's
   first-order estimate of how much the edge raises the node's activation, restricted to
   one prompt; it needs no answer token, so it applies to general text as well as task
   prompts (condense.attribute's per-row LD scores would not). The contributor set: edges
   with a positive score of at least `rel_threshold` (0.2) times the context's largest,
   at most `top_contributors` (5).
4. Clusters: Jaccard distance 1 - |A ∩ B| / |A ∪ B| between contributor sets (0 for two
   empty sets); average-linkage agglomerative clustering (UPGMA) by hand: start from
   singletons and merge the two clusters with the smallest mean pairwise distance while
   that distance is below `cut` (0.5); ties go to the lowest cluster indices. Clusters are
   reported largest first with the contributors present in at least half of their members
   and their `n_top_contexts` most active contexts.
"""
from dataclasses import dataclass

import torch
from torch import nn

from condense.metrics import pad_batch
from condense.model_parts import model_parts
from condense.patching import SenderValues, block_slices, decomposed_forward
from condense.explain.weightlens import parse_node


@dataclass
class CircuitLensConfig:
    n_contexts: int = 24
    n_bins: int = 4
    active_quantile: float = 0.9
    top_contributors: int = 5
    rel_threshold: float = 0.2
    cut: float = 0.5
    n_top_contexts: int = 3
    window: int = 12            # tokens of left context shown per context
    batch_size: int = 16
    seed: int = 0


def jaccard_distances(sets):
    """[n, n] Jaccard distances between sets (two empty sets: distance 0)."""
    sets = [set(s) for s in sets]
    n = len(sets)
    D = torch.zeros(n, n)
    for i in range(n):
        for j in range(i + 1, n):
            union = len(sets[i] | sets[j])
            D[i, j] = D[j, i] = 1.0 - len(sets[i] & sets[j]) / union if union else 0.0
    return D


def average_linkage(D, cut):
    """Clusters (lists of indices) of average-linkage agglomerative clustering on the
    distance matrix D, merging while the closest pair's mean distance is < cut; largest
    cluster first (ties: smallest first member)."""
    clusters = [[i] for i in range(D.shape[0])]
    while len(clusters) > 1:
        best = None
        for a in range(len(clusters)):
            for b in range(a + 1, len(clusters)):
                d = float(D[clusters[a]][:, clusters[b]].mean())
                if best is None or d < best[0] - 1e-12:
                    best = (d, a, b)
        if best[0] >= cut:
            break
        _, a, b = best
        clusters[a] = sorted(clusters[a] + clusters[b])
        del clusters[b]
    return sorted(clusters, key=lambda c: (-len(c), c[0]))


def sample_contexts(acts, n, n_bins=4, quantile=0.9, generator=None):
    """Indices into `acts` [N]: n positions from the active ones (>= the quantile), drawn per
    quantile bin by activation-weighted sampling without replacement; most active first."""
    acts = acts.float()
    cand = torch.nonzero(acts >= torch.quantile(acts, quantile)).flatten()
    if len(cand) <= n:
        return cand[acts[cand].argsort(descending=True)].tolist()
    a = acts[cand]
    edges = torch.quantile(a, torch.linspace(0, 1, n_bins + 1))
    per_bin = [n // n_bins + (1 if b >= n_bins - n % n_bins else 0) for b in range(n_bins)]
    chosen = []
    for b in range(n_bins):
        upper = a <= edges[b + 1] if b == n_bins - 1 else a < edges[b + 1]
        idx = torch.nonzero((a >= edges[b]) & upper).flatten()
        idx = idx[~torch.isin(cand[idx], torch.tensor(chosen, dtype=torch.long))]
        k = min(per_bin[b], len(idx))
        if k == 0:
            continue
        w = a[idx].clamp_min(1e-12)
        pick = torch.multinomial(w, k, replacement=False, generator=generator)
        chosen += cand[idx[pick]].tolist()
    return sorted(chosen, key=lambda i: -float(acts[i]))


class CircuitLens:
    def __init__(self, model, graph, sequences, sources, decode=None, config=None, nodes=None):
        """sequences: lists of token ids; sources: a label per sequence ('task', 'general');
        nodes: the nodes that will be explained (only their outputs are kept per position;
        default all)."""
        self.model, self.graph, self.cfg = model, graph, config or CircuitLensConfig()
        self.keep = (list(range(1, graph.n_senders)) if nodes is None
                     else sorted({_sender_of(graph, n) for n in nodes}))
        self.parts = model_parts(model)
        self.seqs, self.sources = [list(s) for s in sequences], list(sources)
        self.decode = decode or (lambda ids: " ".join(map(str, ids)))
        self.device = next(model.parameters()).device
        self.dtype = self.parts.token_embed.weight.dtype
        self._pool_cache = None

    # ------------------------------------------------------------ activations over the pool
    @torch.no_grad()
    def pool(self):
        """(positions [(seq, pos)], outputs of the kept senders {sender: [N, d]}, means of
        every sender [S, d])."""
        if self._pool_cache is not None:
            return self._pool_cache
        g = self.graph
        total, count, outs, positions = None, 0, [], []
        for start in range(0, len(self.seqs), self.cfg.batch_size):
            idx = list(range(start, min(start + self.cfg.batch_size, len(self.seqs))))
            ids, mask, lengths = pad_batch([self.seqs[i] for i in idx])
            _, vals, _ = decomposed_forward(self.parts, g, ids.to(self.device), mask.to(self.device),
                                            compute_logits=False)
            S = vals.stacked().float().cpu()             # [S, B, T, d]
            real = mask.bool()
            flat = S[:, real]                            # [S, n_real, d]
            total = flat.sum(1) if total is None else total + flat.sum(1)
            count += flat.shape[1]
            outs.append(flat[self.keep])
            for b, i in enumerate(idx):
                positions += [(i, p) for p in range(int(lengths[b]))]
        kept = torch.cat(outs, 1)
        self._pool_cache = (positions, {s: kept[i] for i, s in enumerate(self.keep)}, total / count)
        return self._pool_cache

    def activations(self, node):
        _, outs, means = self.pool()
        s = _sender_of(self.graph, node)
        return (outs[s] - means[s]).norm(dim=-1)

    # ------------------------------------------------------------ contributors
    def contributor_scores(self, node, contexts):
        """Per context (seq, pos): {edge name: score} over every edge into `node`."""
        g = self.graph
        _, _, means = self.pool()
        kind, l, h = parse_node(node)
        s_node = _sender_of(g, node)
        if kind == "attention":
            group = g.attn_receivers(l)
            rows = [c * g.n_heads + h for c in range(3)]
        else:
            group = slice(g.mlp_receiver(l), g.mlp_receiver(l) + 1)
            rows = [0]
        receivers = [group.start + r for r in rows]
        n_before = int(g.valid[:, receivers[0]].sum())
        mu = means.to(self.device, self.dtype)
        ablated = SenderValues([mu[sl][:, None, None] for sl in block_slices(g)],
                               [None] * g.n_layers, [None] * g.n_layers)
        ones = torch.ones(g.n_senders, g.n_receivers, device=self.device, dtype=self.dtype)
        lp = self.parts.layers[l]
        norm_name = "attn_norm" if kind == "attention" else "mlp_norm"
        norm = getattr(lp, norm_name)
        setattr(lp, norm_name, _FrozenScale(norm))
        try:
            return self._scores(contexts, g, group, rows, receivers, n_before, mu, ablated, ones, s_node)
        finally:
            setattr(lp, norm_name, norm)

    def _scores(self, contexts, g, group, rows, receivers, n_before, mu, ablated, ones, s_node):
        cfg = self.cfg
        result = []
        for start in range(0, len(contexts), cfg.batch_size):
            chunk = contexts[start:start + cfg.batch_size]
            ids, mask, lengths = pad_batch([self.seqs[i][:p + 1] for i, p in chunk])
            ids, mask = ids.to(self.device), mask.to(self.device)
            last = (lengths - 1).to(self.device)
            with torch.enable_grad():
                _, clean, captured = decomposed_forward(
                    self.parts, g, ids, mask, ablated=ablated, edge_mask=ones,
                    capture_receivers=True, compute_logits=False)
                out = clean.stacked()[s_node]                         # [B, T, d]
                act = (out[torch.arange(len(chunk)), last] - mu[s_node]).norm(dim=-1).sum()
                x = next(x for r, x in captured if r.start == group.start)
                (grad,) = torch.autograd.grad(act, x)
            with torch.no_grad():
                D = (clean.stacked()[:n_before] - mu[:n_before, None, None]) * mask[None, :, :, None]
                sc = torch.einsum("sbtd,jbtd->bsj", D.float(), grad[rows].float()).cpu()
            for b in range(len(chunk)):
                result.append({f"{g.sender_names[s]}->{g.receiver_names[r]}": float(sc[b, s, j])
                               for s in range(n_before) for j, r in enumerate(receivers)})
        return result

    def contributor_set(self, scores):
        cfg = self.cfg
        pos = sorted(((v, k) for k, v in scores.items() if v > 0), reverse=True)
        if not pos:
            return []
        top = pos[0][0]
        return [k for v, k in pos[: cfg.top_contributors] if v >= cfg.rel_threshold * top]

    # ------------------------------------------------------------ one node
    def context_text(self, seq, pos):
        ids = self.seqs[seq]
        left = self.decode(ids[max(0, pos - self.cfg.window):pos])
        return f"{left}⟦{self.decode(ids[pos:pos + 1])}⟧"

    def explain(self, node, in_circuit=()):
        """CircuitLens report for `node`; `in_circuit`: edge names of the circuit (marked)."""
        cfg = self.cfg
        positions, _, _ = self.pool()
        acts = self.activations(node)
        gen = torch.Generator().manual_seed(cfg.seed)
        picked = sample_contexts(acts, cfg.n_contexts, cfg.n_bins, cfg.active_quantile, gen)
        contexts = [positions[i] for i in picked]
        scores = self.contributor_scores(node, contexts) if contexts else []
        in_circuit = set(in_circuit)
        ctx = []
        for i, (seq, pos), sc in zip(picked, contexts, scores):
            members = self.contributor_set(sc)
            ctx.append(dict(source=self.sources[seq], seq=seq, pos=pos, activation=float(acts[i]),
                            text=self.context_text(seq, pos),
                            contributors=[dict(edge=e, score=sc[e], in_circuit=e in in_circuit)
                                          for e in members]))
        clusters = []
        if ctx:
            sets = [[c["edge"] for c in x["contributors"]] for x in ctx]
            for members in average_linkage(jaccard_distances(sets), cfg.cut):
                freq = {}
                for m in members:
                    for e in sets[m]:
                        freq[e] = freq.get(e, 0) + 1
                common = sorted(((f, e) for e, f in freq.items() if f >= len(members) / 2),
                                key=lambda x: (-x[0], x[1]))
                top = sorted(members, key=lambda m: -ctx[m]["activation"])[: cfg.n_top_contexts]
                clusters.append(dict(
                    size=len(members), members=members,
                    mean_activation=sum(ctx[m]["activation"] for m in members) / len(members),
                    sources={s: sum(ctx[m]["source"] == s for m in members)
                             for s in sorted({ctx[m]["source"] for m in members})},
                    contributors=[dict(edge=e, fraction=f / len(members), in_circuit=e in in_circuit)
                                  for f, e in common],
                    top_contexts=[dict(text=ctx[m]["text"], activation=ctx[m]["activation"],
                                       source=ctx[m]["source"]) for m in top]))
        return dict(
            activation=dict(definition="||out - mean out over the pool||",
                            pool_positions=len(acts), mean=float(acts.mean()),
                            active_threshold=float(torch.quantile(acts.float(), cfg.active_quantile))),
            contexts=ctx, clusters=clusters,
            clustering=dict(algorithm="average-linkage agglomerative (UPGMA), Jaccard distance",
                            cut=cfg.cut, top_contributors=cfg.top_contributors,
                            rel_threshold=cfg.rel_threshold, n_bins=cfg.n_bins,
                            active_quantile=cfg.active_quantile))


class _FrozenScale:
    """A norm whose value is exact but whose gradient holds its scale (LayerNorm's sigma,
    RMSNorm's rms) constant: d y / d x = gain * centering / sigma (centering for LayerNorm
    only)."""

    def __init__(self, norm):
        self.norm = norm

    def __call__(self, x):
        y = self.norm(x).detach()
        dx = x - x.detach()                       # zero, carrying x's gradient
        if isinstance(self.norm, nn.LayerNorm):
            xc = x.detach() - x.detach().mean(-1, keepdim=True)
            sigma = (xc.pow(2).mean(-1, keepdim=True) + self.norm.eps).sqrt()
            gain = self.norm.weight if self.norm.weight is not None else 1.0
            return y + gain * (dx - dx.mean(-1, keepdim=True)) / sigma
        eps = getattr(self.norm, "eps", getattr(self.norm, "variance_epsilon", 1e-6))
        rms = (x.detach().float().pow(2).mean(-1, keepdim=True) + eps).sqrt().to(x.dtype)
        gain = self.norm(x.detach().new_ones(1, x.shape[-1])).detach()[0]  # RMSNorm(ones) = its gain
        return y + gain * dx / rms


def _sender_of(graph, node):
    kind, l, h = parse_node(node)
    return graph.head_sender(l, h) if kind == "attention" else graph.mlp_sender(l)
