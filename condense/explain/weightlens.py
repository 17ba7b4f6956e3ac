"""WeightLens: what a circuit node reads and writes, from its fixed weights, checked by
single-token forward passes (after "Circuit Insights", Golimblevskaia et al. 2025).

Notation. E [V, d]: the token embedding module applied to every token id (no position
embedding, Gemma's sqrt(d) scale included); ln_l: the node's own input norm (a head's
attention norm, an MLP's pre-MLP norm), applied to each row, i.e. exact for a residual
stream equal to that row; U [V, d]: the unembedding (lm_head weight). The final norm is
*folded, not simulated*: a residual write y moves logit o by y . u*_o with
u*_o = center(gamma ⊙ u_o) for LayerNorm (gamma ⊙ u_o for RMSNorm, gamma = norm(ones));
the final norm's 1/scale is left out because it is positive and the same for every token
of one row, so it changes no ranking, sign or z-score used here. "z" is a z-score over
the vocabulary (mean and std of the score over all V tokens).

Read and write directions, per node kind:
- head a{l}.h{h}, OV: o_h(x) = W_O^h (W_V^h ln_l(x) + b_V^h), the head's output when it
  attends only to a position whose residual is x. Input (OV) tokens: z(||o_h(e_t)||) >= z
  (default 4). Output tokens: the head can only write inside span(W_O^h); token o's score
  is ||W_O^h^T u*_o||, how strongly a unit of the head's z moves o's logit at most;
  candidates: z >= z. The sign (promoted or suppressed) comes from validation.
- head, QK (rotary / positions ignored): q(t), k(t) from ln_l(e_t); key tokens:
  z((k(t) - mean_t k) . mean_t q) >= z, the keys that an average query prefers.
- MLP m{l}: explained by its top neurons (chosen by the caller: circuit attribution or
  weights, see condense/explain.py). Neuron i: input tokens z(h_i(ln_l(e_t))) >= z, with
  h = the MLP's hidden units (the input of the down projection) computed by the MLP module
  itself on the normalised embedding; output tokens: z(w_i . u*_o) >= z (promoted) or
  <= -z (suppressed), w_i = column i of the down projection.
- inherited tokens: for a circuit edge u -> n (u not `input`), the tokens u has validated
  (a head's OV input tokens, an MLP's neurons' input tokens) that n reads once u has
  processed them: n's read score on x_t = e_t + out_u(e_t) (out_u = o_u for a head, the
  whole MLP on ln(e_t) for an MLP) is z-scored over the vocabulary and tokens of u with
  z >= z_inherit (default 3) become n's candidates too (marked `via`). A <v> edge feeds
  OV inputs, a <k> edge key tokens, an MLP edge neuron inputs; <q> edges feed nothing.

Validation (forward passes of the real model, adapter included). Each candidate token t
runs in two settings: isolation ([t], after `prefix_ids` such as a BOS token) and a short
neutral context (`neutral_ids` + [t]); a node's value is read at the last position from
condense.patching.decomposed_forward's recorded outputs. Baseline: `n_baseline` (256)
random vocabulary tokens in the same settings.
- input token: activation = ||out_h - mean over baseline tokens of out_h|| for a head,
  h_i for a neuron; kept when it exceeds the baseline's 95th percentile in *both* settings.
- key token: t is placed before the last neutral token ([t, q] and neutral[:-1] + [t, q],
  q = neutral[-1]); the attention from the last position to t must exceed the baseline's
  95th percentile in both settings (attention from the HF model's eager attentions).
- output token o, tested with inputs t (a head: o itself, i.e. copying, and its validated
  OV inputs; a neuron: its validated inputs; at most `n_output_tests`): the effect row
  D_t = U* (out(t) - mean over baseline inputs of out) is what input t makes the node
  write *beyond what a baseline token would*; o is kept when |D_t(o)| exceeds the 99th
  percentile of |D_t| over the vocabulary (o is among what t makes the node write most)
  and the 95th percentile of |D_b(o)| over the baseline inputs b (t moves o more than a
  baseline token does), in both settings with the same sign; the sign says whether the
  node promotes or suppresses o.
Values below 1e-4 of the node's largest value in its validation runs count as zero.
A node with no validated input, key or output token is `context_dependent`.

Not covered: query-side tokens of QK (they are reported only through CircuitLens's <q>
contributors) and transcoder features (a feature is a read vector, an activation and a
write vector, like a neuron: explain_mlp is the template).
"""
from dataclasses import dataclass, field

import torch
from torch import nn

from condense.model_parts import (
    affine_weight,
    model_parts,
    project_shared,
    split_heads_output,
)
from condense.patching import decomposed_forward


@dataclass
class LensConfig:
    z: float = 4.0                 # vocabulary z-score for weight candidates
    z_inherit: float = 3.0         # z-score for inherited tokens
    max_candidates: int = 32       # per list, highest |z| first
    n_baseline: int = 256          # random tokens for the validation baselines
    act_percentile: float = 95.0   # input / key tokens: baseline percentile to exceed
    out_percentile: float = 99.0   # output tokens: percentile of |effect| over the vocabulary
    n_output_tests: int = 8        # input tokens tried per output candidate
    chunk: int = 4096              # vocabulary rows per weight computation
    batch_size: int = 256          # prompts per validation forward
    seed: int = 0


# values below FLOOR times a node's largest value in its validation runs count as zero (the
# exact zeros of hand-built weights would otherwise be compared by rounding noise)
FLOOR = 1e-4


def top_quantile(x, q: float, dim=None):
    """torch.quantile(x, q, dim) (linear interpolation), bit for bit, from topk rather than a
    full sort: the high percentiles used here need only the few largest values of each row
    (of [256, vocabulary] effects for a head)."""
    if dim is None:
        x, dim = x.reshape(-1), 0
    n = x.shape[dim]
    rank = torch.tensor(q, dtype=x.dtype) * (n - 1)   # as torch.quantile computes it
    lo, hi = int(rank), int(torch.ceil(rank))
    top = x.topk(n - lo, dim=dim).values               # the n - lo largest, descending
    return torch.lerp(top.select(dim, n - 1 - lo), top.select(dim, n - 1 - hi), rank - lo)


def zscore(x, dim=0):
    x = x.float()
    return (x - x.mean(dim, keepdim=True)) / x.std(dim, keepdim=True).clamp_min(1e-12)


def _top(z, thresh, k, sign=1):
    """Indices with sign*z >= thresh, highest sign*z first, at most k."""
    s = sign * z
    idx = torch.nonzero(s >= thresh).flatten()
    return idx[s[idx].argsort(descending=True)][:k].tolist()


@dataclass
class _Runs:
    """Last-position values of every token run in one validation setting."""
    senders: dict = field(default_factory=dict)   # token -> [S, d]
    hidden: dict = field(default_factory=dict)    # token -> [L, d_mlp]
    attn: dict = field(default_factory=dict)      # token -> [L, H] (key settings)


class WeightLens:
    def __init__(self, model, graph, neutral_ids, prefix_ids=(), vocab_size=None, config=None):
        self.model, self.graph, self.cfg = model, graph, config or LensConfig()
        self.parts = model_parts(model)
        self.shape = self.parts.shape
        self.neutral, self.prefix = list(neutral_ids), list(prefix_ids)
        if not self.neutral:
            raise ValueError("WeightLens needs at least one neutral context token")
        p = next(model.parameters())
        self.device, self.dtype = p.device, self.parts.token_embed.weight.dtype
        n_embed = self.parts.token_embed.weight.shape[0]
        self.V = min(n_embed, vocab_size) if vocab_size else n_embed
        with torch.no_grad():
            ids = torch.arange(self.V, device=self.device)
            self.E = torch.cat([self.parts.token_embed(ids[i:i + self.cfg.chunk])
                                for i in range(0, self.V, self.cfg.chunk)]).float()
            self.U_star = self._fold_unembedding()
        gen = torch.Generator().manual_seed(self.cfg.seed)
        self.baseline = torch.randperm(self.V, generator=gen)[: self.cfg.n_baseline].tolist()
        self.runs = {k: _Runs() for k in ("iso", "ctx", "key_iso", "key_ctx")}
        self.validated = {}   # node -> set of validated input tokens (feeds inheritance)
        self._base_cache = {}

    def remember(self, name: str, report: dict) -> None:
        """Take a node's earlier report (explain_head / explain_mlp) as explained here: its
        validated inputs are what nodes downstream of it inherit (a resumed explain)."""
        self.validated[name] = set(report["validated"]["input"])

    # ------------------------------------------------------------ weights
    def _fold_unembedding(self):
        """U* [V, d]: logit o of a residual write y is y . U*[o] (up to the final norm's scale)."""
        W = self.parts.lm_head.weight[: self.V].float()
        norm = self.parts.final_norm
        if isinstance(norm, nn.LayerNorm):
            g = norm.weight.float() if norm.weight is not None else 1.0
            W = W * g
            return W - W.mean(-1, keepdim=True)
        ones = torch.ones(1, W.shape[1], device=W.device, dtype=self.dtype)
        return W * norm(ones).float()[0]  # RMSNorm variants: their gain (Gemma's 1 + w too)

    def _chunks(self, X, fn):
        return torch.cat([fn(X[i:i + self.cfg.chunk]) for i in range(0, X.shape[0], self.cfg.chunk)])

    def head_ov(self, l, X):
        """o_h(x) for every head: [N, H, d]."""
        lp, dh = self.parts.layers[l], self.shape.head_dim

        def fn(x):
            xn = lp.attn_norm(x.to(self.dtype))[None]
            v = project_shared(lp.v, xn, dh)
            return split_heads_output(lp.o_proj, v)[0][0].float()
        with torch.no_grad():
            return self._chunks(X, fn)

    def head_qk(self, l, X):
        lp, dh = self.parts.layers[l], self.shape.head_dim

        def fn(x):
            xn = lp.attn_norm(x.to(self.dtype))[None]
            q, k = project_shared(lp.q, xn, dh)[0], project_shared(lp.k, xn, dh)[0]
            if lp.q_norm is not None:
                q, k = lp.q_norm(q), lp.k_norm(k)
            return torch.cat([q, k], -1).float()
        with torch.no_grad():
            qk = self._chunks(X, fn)
        return qk[..., :dh], qk[..., dh:]

    def mlp_hidden(self, l, X):
        """The MLP's hidden units on ln(x): [N, d_mlp]."""
        return self._mlp(l, X)[0]

    def mlp_out(self, l, X):
        return self._mlp(l, X)[1]

    def _mlp(self, l, X):
        lp = self.parts.layers[l]
        hs, outs = [], []

        def grab(module, args):
            hs.append(args[0].float())
        with torch.no_grad():
            hook = lp.mlp_down.register_forward_pre_hook(grab)
            try:
                for i in range(0, X.shape[0], self.cfg.chunk):
                    outs.append(lp.mlp(lp.mlp_norm(X[i:i + self.cfg.chunk].to(self.dtype))).float())
            finally:
                hook.remove()
        return torch.cat(hs), torch.cat(outs)

    def head_write_basis(self, l):
        """W_O^h as [H, dh, d]: row j = what unit j of head h's z writes."""
        H, dh = self.shape.n_heads, self.shape.head_dim
        z = torch.zeros(1, dh, H, dh, device=self.device, dtype=self.dtype)
        for h in range(H):
            z[0, torch.arange(dh), h, torch.arange(dh)] = 1.0
        with torch.no_grad():
            out = split_heads_output(self.parts.layers[l].o_proj, z)[0][0]  # [dh, H, d]
        return out.permute(1, 0, 2).float()

    def neuron_writes(self, l):
        """[d_mlp, d]: row i = what a unit of neuron i writes."""
        down = self.parts.layers[l].mlp_down
        wb = affine_weight(down)
        with torch.no_grad():
            if wb is not None:
                return wb[0].detach().T.float()
            eye = torch.eye(self.shape.d_mlp, device=self.device, dtype=self.dtype)
            return (down(eye) - down(torch.zeros_like(eye[:1]))).float()

    # ------------------------------------------------------------ forward validation
    def _contexts(self, setting, t):
        if setting == "iso":
            return self.prefix + [t]
        if setting == "ctx":
            return self.prefix + self.neutral + [t]
        if setting == "key_iso":
            return self.prefix + [t, self.neutral[-1]]
        return self.prefix + self.neutral[:-1] + [t, self.neutral[-1]]

    @torch.no_grad()
    def _ensure(self, setting, tokens):
        runs = self.runs[setting]
        store = runs.attn if setting.startswith("key") else runs.senders
        todo = [t for t in dict.fromkeys(tokens) if t not in store]
        for i in range(0, len(todo), self.cfg.batch_size):
            batch = todo[i:i + self.cfg.batch_size]
            ids = torch.tensor([self._contexts(setting, t) for t in batch], device=self.device)
            if setting.startswith("key"):
                pos = ids.shape[1] - 2
                # only the attention weights are read: logits for one position, not every one
                att = self.model(input_ids=ids, output_attentions=True, logits_to_keep=1).attentions
                a = torch.stack([x[:, :, -1, pos] for x in att], 1).float().cpu()  # [B, L, H]
                for j, t in enumerate(batch):
                    runs.attn[t] = a[j]
            else:
                _, vals, _ = decomposed_forward(self.parts, self.graph, ids, keep_hidden=True,
                                                compute_logits=False)
                s = vals.stacked()[:, :, -1].float().cpu()                      # [S, B, d]
                h = torch.stack([x[:, -1] for x in vals.hidden], 1).float().cpu()  # [B, L, d_mlp]
                for j, t in enumerate(batch):
                    runs.senders[t], runs.hidden[t] = s[:, j], h[j]

    def _values(self, setting, tokens, what):
        """what(senders [S, d], hidden [L, d_mlp]) for each token -> stacked."""
        self._ensure(setting, tokens)
        r = self.runs[setting]
        return torch.stack([what(r.senders[t], r.hidden[t]) for t in tokens])

    def _attention(self, setting, tokens, l, h):
        self._ensure(setting, tokens)
        return torch.tensor([float(self.runs[setting].attn[t][l, h]) for t in tokens])

    def _baseline(self, key, setting, what):
        """(mean value over baseline tokens, baseline values) for a node measure, cached."""
        if (key, setting) not in self._base_cache:
            v = self._values(setting, self.baseline, what)
            self._base_cache[key, setting] = (v.mean(0), v)
        return self._base_cache[key, setting]

    def _validate_inputs(self, key, tokens, what, act):
        """Tokens whose activation exceeds the baseline percentile in both settings, their
        activations {token: [iso, ctx]} and the two thresholds."""
        per = {}
        for setting in ("iso", "ctx"):
            mean, base = self._baseline(key, setting, what)
            a = act(self._values(setting, tokens, what), mean) if tokens else torch.zeros(0)
            per[setting] = (act(base, mean), a)
        floor = FLOOR * max(float(torch.cat(v).abs().max()) for v in per.values())
        acts, thresholds = {t: [] for t in tokens}, []
        ok = torch.ones(len(tokens), dtype=torch.bool)
        for setting, (base, a) in per.items():
            thr = max(float(top_quantile(base, self.cfg.act_percentile / 100)), floor)
            thresholds.append(thr)
            ok &= a > thr
            for t, v in zip(tokens, a.tolist()):
                acts[t].append(v)
        return [t for t, good in zip(tokens, ok.tolist()) if good], acts, thresholds

    def _validate_outputs(self, key, candidates, tests_for, what, write=None, effect=None):
        """{o: (sign, tested_with)} for output candidates o (see the module docstring);
        `write(values - baseline mean)` maps recorded node values to residual writes [N, d].
        A node that writes one direction w (a neuron: one recorded value v, writing v * w)
        passes `effect` = U* w [V] instead: every logit effect is then v * effect, and each
        threshold a quantile of |v| times |effect| or of |effect| times |v|, without the
        [baseline tokens, V] products (on a 262k vocabulary most of a neuron's time)."""
        tests = list(dict.fromkeys(t for o in candidates for t in tests_for(o)))
        if not tests:
            return {}
        q_act, q_out = self.cfg.act_percentile / 100, self.cfg.out_percentile / 100
        rows, base_thr, row_thr = {}, {}, {}
        for setting in ("iso", "ctx"):
            mean, base = self._baseline(key, setting, what)
            if effect is None:
                rows[setting] = write(self._values(setting, tests, what) - mean) @ self.U_star.T  # [n, V]
                base_eff = (write(base - mean) @ self.U_star.T).abs()                             # [n_b, V]
                base_thr[setting] = top_quantile(base_eff, q_act, dim=0)
                row_thr[setting] = top_quantile(rows[setting].abs(), q_out, dim=1)
            else:
                v = (self._values(setting, tests, what) - mean)[:, 0]                            # [n]
                rows[setting] = v[:, None] * effect[None]                                        # [n, V]
                base_thr[setting] = effect.abs() * top_quantile((base - mean)[:, 0].abs(), q_act)
                row_thr[setting] = v.abs() * top_quantile(effect.abs(), q_out)
        floor = FLOOR * max(float(r.abs().max()) for r in rows.values())
        index = {t: i for i, t in enumerate(tests)}
        result = {}
        for o in candidates:
            for t in tests_for(o):
                i, good = index[t], True
                signs = []
                for setting in ("iso", "ctx"):
                    e = rows[setting][i, o]
                    thr = max(float(row_thr[setting][i]), float(base_thr[setting][o]), floor)
                    good &= bool(e.abs() > thr)
                    signs.append(float(torch.sign(e)))
                if good and signs[0] == signs[1] != 0:
                    result[o] = ("+" if signs[0] > 0 else "-", t)
                    break
        return result

    # ------------------------------------------------------------ inheritance
    def _upstream_writes(self, u):
        """out_u(e_t) for every token [V, d]."""
        kind, l, h = parse_node(u)
        if kind == "attention":
            return self.head_ov(l, self.E)[:, h]
        return self.mlp_out(l, self.E)

    def _inherited(self, upstream, score_fn):
        """{token: (u, z)} for upstream nodes u: u's validated tokens t whose score
        score_fn(e_t + out_u(e_t)) has a vocabulary z-score >= z_inherit."""
        out = {}
        for u in upstream:
            toks = self.validated.get(u)
            if not toks:
                continue
            z = zscore(score_fn(self.E + self._upstream_writes(u)))
            for t in sorted(toks, key=lambda t: -float(z[t])):
                if float(z[t]) >= self.cfg.z_inherit and t not in out:
                    out[t] = (u, float(z[t]))
        return out

    # ------------------------------------------------------------ nodes
    def explain_head(self, name, upstream=(), progress=None):
        """upstream: (node, role) pairs of circuit edges into this head (role q/k/v);
        progress(text) hears as its inputs and then its keys are validated."""
        _, l, h = parse_node(name)
        cfg, key = self.cfg, name
        sender = self.graph.head_sender(l, h)

        def ov_score(X):
            return self.head_ov(l, X)[:, h].norm(dim=-1)

        def key_score(X):
            q, k = self.head_qk(l, X)
            return (k[:, h] - k[:, h].mean(0)) @ q[:, h].mean(0)

        z_ov = zscore(ov_score(self.E))
        ov = {t: ("direct", float(z_ov[t])) for t in _top(z_ov, cfg.z, cfg.max_candidates)}
        for t, (u, z) in self._inherited([u for u, r in upstream if r == "v"], ov_score).items():
            ov.setdefault(t, ("inherited:" + u, z))
        qk_q, qk_k = self.head_qk(l, self.E)
        z_key = zscore((qk_k[:, h] - qk_k[:, h].mean(0)) @ qk_q[:, h].mean(0))
        keys = {t: ("direct", float(z_key[t])) for t in _top(z_key, cfg.z, cfg.max_candidates)}
        for t, (u, z) in self._inherited([u for u, r in upstream if r == "k"], key_score).items():
            keys.setdefault(t, ("inherited:" + u, z))
        W_O = self.head_write_basis(l)[h]                   # [dh, d]
        z_out = zscore((self.U_star @ W_O.T).norm(dim=-1))  # [V]
        out_cand = _top(z_out, cfg.z, cfg.max_candidates)

        def what(s, hid):
            return s[sender]

        def dev(vals, mean):
            return (vals - mean).norm(dim=-1)

        ov_ok, ov_acts, ov_thr = self._validate_inputs(key, list(ov), what, dev)
        self.validated[name] = set(ov_ok)
        if progress is not None:
            progress(f"{name}: {len(ov_ok)} of {len(ov)} input tokens validated")
        key_att, key_thr = {}, []
        ok = torch.ones(len(keys), dtype=torch.bool)
        for setting in ("key_iso", "key_ctx"):
            thr = top_quantile(self._attention(setting, self.baseline, l, h), cfg.act_percentile / 100)
            key_thr.append(float(thr))
            if keys:
                a = self._attention(setting, list(keys), l, h)
                ok &= a > thr
                for t, v in zip(keys, a.tolist()):
                    key_att.setdefault(t, []).append(v)
        key_ok = [t for t, good in zip(keys, ok.tolist()) if good]
        if progress is not None:
            progress(f"{name}: {len(key_ok)} of {len(keys)} key tokens validated")
        tests = sorted(ov_ok, key=lambda t: -ov_acts[t][1])[: cfg.n_output_tests]
        outs = self._validate_outputs(key, out_cand, lambda o: [o] + [t for t in tests if t != o],
                                      what, lambda d: d)
        return dict(
            kind="attention", layer=l, head=h,
            ov_input=[dict(id=t, via=v, z=z, validated=t in ov_ok, activation=ov_acts[t])
                      for t, (v, z) in ov.items()],
            key_tokens=[dict(id=t, via=v, z=z, validated=t in key_ok, attention=key_att[t])
                        for t, (v, z) in keys.items()],
            output_tokens=[dict(id=o, z=float(z_out[o]), validated=o in outs,
                                sign=outs[o][0] if o in outs else None,
                                tested_with=outs[o][1] if o in outs else None) for o in out_cand],
            thresholds=dict(input=ov_thr, keys=key_thr),
            validated=dict(input=ov_ok, keys=key_ok,
                           promoted=[o for o in out_cand if o in outs and outs[o][0] == "+"],
                           suppressed=[o for o in out_cand if o in outs and outs[o][0] == "-"]),
            context_dependent=not (ov_ok or key_ok or outs))

    def explain_mlp(self, name, neurons, upstream=(), progress=None):
        """neurons: indices of the neurons that explain this MLP (e.g. its top 8); progress(text)
        hears as each is done (a neuron takes seconds to tens of seconds on a real model)."""
        _, l, _ = parse_node(name)
        cfg = self.cfg
        hid = self.mlp_hidden(l, self.E)                         # [V, d_mlp]
        writes = self.neuron_writes(l)                           # [d_mlp, d]
        inherited_hidden = {}
        for u, _ in upstream:
            if self.validated.get(u):
                inherited_hidden[u] = zscore(self.mlp_hidden(l, self.E + self._upstream_writes(u)))
        reports, all_inputs = [], set()
        for k, i in enumerate(neurons):
            z_in = zscore(hid[:, i])
            cand = {t: ("direct", float(z_in[t])) for t in _top(z_in, cfg.z, cfg.max_candidates)}
            for u, zu in inherited_hidden.items():
                for t in sorted(self.validated[u], key=lambda t: -float(zu[t, i])):
                    if float(zu[t, i]) >= cfg.z_inherit:
                        cand.setdefault(t, ("inherited:" + u, float(zu[t, i])))
            key = f"{name}.n{i}"

            def what(s, h, i=i):
                return h[l, i:i + 1]

            ok, acts, thr = self._validate_inputs(key, list(cand), what, lambda v, m: v[:, 0])
            effect = writes[i] @ self.U_star.T
            z_out = zscore(effect)
            out_cand = _top(z_out, cfg.z, cfg.max_candidates) + _top(z_out, cfg.z, cfg.max_candidates, -1)
            tests = sorted(ok, key=lambda t: -acts[t][1])[: cfg.n_output_tests]
            outs = self._validate_outputs(key, out_cand, lambda o, tests=tests: tests, what,
                                          effect=effect)
            all_inputs |= set(ok)
            reports.append(dict(
                neuron=i, name=key,
                input_tokens=[dict(id=t, via=v, z=z, validated=t in ok, activation=acts[t])
                              for t, (v, z) in cand.items()],
                output_tokens=[dict(id=o, z=float(z_out[o]), validated=o in outs,
                                    sign=outs[o][0] if o in outs else None,
                                    tested_with=outs[o][1] if o in outs else None) for o in out_cand],
                thresholds=dict(input=thr),
                validated=dict(input=ok,
                               promoted=[o for o in out_cand if o in outs and outs[o][0] == "+"],
                               suppressed=[o for o in out_cand if o in outs and outs[o][0] == "-"]),
                context_dependent=not (ok or outs)))
            if progress is not None:
                progress(f"{name}: neuron {k + 1}/{len(neurons)} (n{i}), {len(ok)} inputs, "
                         f"{len(outs)} outputs validated")
        self.validated[name] = all_inputs

        def union(k):
            return list(dict.fromkeys(t for r in reports for t in r["validated"][k]))
        return dict(kind="mlp", layer=l, neurons=reports,
                    validated=dict(input=union("input"), keys=[], promoted=union("promoted"),
                                   suppressed=union("suppressed")),
                    context_dependent=all(r["context_dependent"] for r in reports))


def parse_node(name):
    """('attention', l, h) | ('mlp', l, None)."""
    if name.startswith("a"):
        l, h = name[1:].split(".h")
        return "attention", int(l), int(h)
    if name.startswith("m"):
        return "mlp", int(name[1:].split(".")[0]), None
    raise ValueError(f"not a head or MLP node: {name!r}")
