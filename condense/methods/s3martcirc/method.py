"""S3martCirc: joint circuit discovery and role assignment over attention heads and MLP neurons,
(`method: s3martcirc`).

Every node (head `a{l}.h{h}`, neuron `m{l}.n{i}`; docs/design.md §1) has three coefficients
c = (c_u, c_p, c_f) (unimportant, passthrough, functional) = softmax of three trained logits,
so they sum to one exactly. In training a node is kept with the soft mask c_p + c_f = 1 - c_u
(run_graph's node masks: m * clean + (1 - m) * ablated, ablation = the recipe's
`intervention`). At evaluation the coefficients are hard: a node is a *candidate* (in the
circuit) when c_p + c_f > c_u, and a candidate's role is the larger of c_p and c_f
(passthrough on a tie); every other node is unimportant.

Losses (both through condense.optimize.fit, one AdamW over the logits):
- discovery, on a batch of train rows:
      alpha * KL(P_orig || P_mask) - (1 - alpha) * log P_mask(answer)     (last position)
    + s3_sparsity * mean over nodes of (c_p + c_f)
    + s3_binary_weight * mean over nodes of sum_k c_k (1 - c_k)            (each c_k -> 0 or 1)
- classification, on the candidates: binary cross-entropy pushing c_f / (c_p + c_f) to 1 for
  nodes of high functional importance (FI >= threshold) and to 0 (c_p up) for low FI. The
  ratio c_f / (c_p + c_f) = sigmoid(logit_f - logit_p) leaves c_u alone, so classification
  assigns roles without moving nodes in or out of the circuit.
Schedule: `s3_warmup_epochs` epochs of discovery steps only, then rounds of one discovery step
and `s3_k` classification steps until `s3_epochs` epochs of discovery batches are done.

Functional importance (FI): with Sim(X) the token-by-token cosine-similarity matrix of X's
rows (row-normalised activations, [T, T], diagonal removed, padding left out),
    FI(X, Y) = ||Sim(X) - Sim(Y)||_F / ||Sim(X)||_F,
averaged over the train rows (rows of one real token are skipped), on the full model:
- head: X = the residual stream the head reads (before its layer norm), Y = the head's output
  (after its slice of the output projection);
- neuron: a single neuron's output a_t * w (activation a_t times its write vector w, a row of
  the down projection) is one direction for every token, so its Sim is all +-1 and says
  nothing; we take X = the residual stream the MLP reads and Y = X + a_t * w, the stream after
  that neuron alone writes to it (Gram-matrix algebra, no [T, d_mlp, D] tensor). FI = 0 for a
  neuron that leaves the geometry of the tokens unchanged. (Gemma2's post-MLP norm is not
  applied to w.)
The threshold is `s3_fi_threshold`, or (null) the median FI of the node's kind (heads and
neurons separately: their FI are on different scales).
FI depends only on the full model, so it is computed once; classification steps need no
forward pass, which is what keeps the k classification steps per round cheap.

Evaluation (test split), as in the paper: ablate only the circuit nodes (everything else
kept) -> accuracy drop (percentage points) and logit-difference drop; circuit size = the
candidates left after removing nodes not on an input -> logits path; also the circuit alone
(faithfulness). Optional node baselines (condense.methods.s3martcirc.node_baselines, `s3_baselines`) are run on
the same train rows and evaluated at the same circuit size and at the `s3_budgets`; for a
GPT-2-small-shaped model the ranking by c_p + c_f (and each baseline's) is scored against the
published circuit (condense.methods.s3martcirc.recovery).

Artifacts (output_dir): circuit.json (MIB format; the node circuit as node masks and the edges
between kept nodes; head and MLP node entries carry `role`, neurons are under `neurons`),
circuit.png (nodes coloured by role), roles.json (every head and every circuit neuron: role,
coefficients, FI), training.png, metrics.json (last). The run itself (recipe checks,
evaluation, artifacts) is condense/methods/s3martcirc/run.py; this module is the method.

Data parallel (runner.data_parallel): every process runs the same loop; each discovery batch
is split over the processes (condense.optimize.shard) and fit averages the gradients, so every
process holds the same coefficients; only the main process writes.
"""
import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from condense.evaluate import dataset_columns, row_batches
from condense.model_parts import model_parts
from condense.methods.s3martcirc.node_baselines import (
    NodeScores,
    NodeSet,
    TrainData,
    discovery_loss,
    masked_logits,
)
from condense.metrics import eval_mode
from condense.optimize import all_reduce_, fit, shard
from condense.patching import decomposed_forward

ROLES = ("unimportant", "passthrough", "functional")


# ---------------------------------------------------------------- functional importance

def similarity(x, real=None, eps=1e-12):
    """Token-by-token cosine similarity of x [..., T, D] -> [..., T, T], diagonal set to 0,
    rows and columns of padding (real [..., T] False) set to 0."""
    xn = x / x.norm(dim=-1, keepdim=True).clamp_min(eps)
    return _finish_similarity(xn @ xn.transpose(-1, -2), real)


def _finish_similarity(sim, real):
    T = sim.shape[-1]
    sim = sim * (1 - torch.eye(T, dtype=sim.dtype, device=sim.device))
    if real is not None:
        r = real.to(sim.dtype)
        sim = sim * r[..., :, None] * r[..., None, :]
    return sim


def fi_from_similarities(sim_x, sim_y, eps=1e-12):
    """||Sim(X) - Sim(Y)||_F / ||Sim(X)||_F over the last two dims; NaN where ||Sim(X)|| = 0."""
    den = sim_x.flatten(-2).norm(dim=-1)
    num = (sim_x - sim_y).flatten(-2).norm(dim=-1)
    return torch.where(den > eps, num / den.clamp_min(eps), torch.full_like(den, float("nan")))


def functional_importance(x, y, real=None):
    """FI(X, Y) = ||Sim(X) - Sim(Y)||_F / ||Sim(X)||_F for x, y [..., T, D] (broadcasting);
    NaN where Sim(X) is all zero (e.g. a single real token)."""
    return fi_from_similarities(similarity(x, real), similarity(y, real))


def neuron_functional_importance(x, acts, write, real=None, chunk=256, eps=1e-12):
    """FI(X, X + a w) of every neuron at once: x [B, T, D] the MLP's input residual, acts
    [B, T, N] the neurons' activations, write [N, D] their write vectors; returns [B, N].
    Uses <x_s + a_s w, x_t + a_t w> = G_st + a_s p_t + a_t p_s + a_s a_t |w|^2 (p = x . w)."""
    x = x.float()
    gram = x @ x.transpose(-1, -2)                                          # [B, T, T]
    sim_x = _finish_similarity(gram / _outer_norms(gram.diagonal(dim1=-2, dim2=-1), eps), real)
    out = []
    for start in range(0, acts.shape[-1], chunk):
        a = acts[..., start:start + chunk].float().transpose(1, 2)          # [B, n, T]
        w = write[start:start + chunk].float()                              # [n, D]
        p = torch.einsum("btd,nd->bnt", x, w)                               # [B, n, T]
        w2 = (w * w).sum(-1)[None, :, None]                                 # [1, n, 1]
        g = (gram[:, None] + a[..., :, None] * p[..., None, :] + a[..., None, :] * p[..., :, None]
             + a[..., :, None] * a[..., None, :] * w2[..., None])           # [B, n, T, T]
        diag = gram.diagonal(dim1=-2, dim2=-1)[:, None] + 2 * a * p + a * a * w2
        sim_y = _finish_similarity(g / _outer_norms(diag, eps), None if real is None else real[:, None])
        out.append(fi_from_similarities(sim_x[:, None], sim_y))
    return torch.cat(out, -1)


def _outer_norms(sq_norms, eps):
    n = sq_norms.clamp_min(0).sqrt().clamp_min(eps)
    return n[..., :, None] * n[..., None, :]


def write_vectors(module, d_in, device, dtype):
    """Rows w_i = module(e_i) - module(0) [d_in, d_out] of an affine module (the down
    projection: each hidden unit's write direction, adapters included)."""
    with torch.no_grad():
        eye = torch.eye(d_in, device=device, dtype=dtype)
        return (module(eye) - module(torch.zeros(1, d_in, device=device, dtype=dtype))).float()


@torch.no_grad()
def node_fi(model, graph, rows, batch_size=32):
    """Mean FI over `rows` of every head [L, H] and neuron [L, d_mlp] of the full model."""
    parts = model_parts(model)
    cols, n = dataset_columns(rows)
    p = next(model.parameters())
    device, dtype = p.device, parts.token_embed.weight.dtype
    L, H, d = graph.n_layers, graph.n_heads, graph.shape.d_mlp
    writes = [write_vectors(lp.mlp_down, d, device, dtype) for lp in parts.layers]
    sums = [torch.zeros(L, H, dtype=torch.float64), torch.zeros(L, d, dtype=torch.float64)]
    counts = [torch.zeros(L, H, dtype=torch.float64), torch.zeros(L, d, dtype=torch.float64)]
    with eval_mode(model):
        for idx, clean, _, mask, _ in row_batches(cols, n, batch_size, device):
            resid, hooks = {}, []
            for l, lp in enumerate(parts.layers):
                for key, module in (("attn", lp.attn_norm), ("mlp", lp.mlp_norm)):
                    hooks.append(module.register_forward_pre_hook(
                        lambda m, args, key=key, l=l, into=resid: into.__setitem__((key, l), args[0])))
            try:
                _, vals, _ = decomposed_forward(parts, graph, clean, mask, keep_hidden=True,
                                                compute_logits=False)
            finally:
                for h in hooks:
                    h.remove()
            real = mask.bool()
            for l in range(L):
                heads_out = vals.blocks[1 + 2 * l].float()                     # [H, B, T, D]
                fi_h = functional_importance(resid[("attn", l)].float()[None], heads_out, real[None])
                fi_n = neuron_functional_importance(resid[("mlp", l)], vals.hidden[l], writes[l], real)
                for k, fi in ((0, fi_h.T), (1, fi_n)):                          # fi: [B, nodes]
                    ok = torch.isfinite(fi)
                    sums[k][l] += torch.where(ok, fi, torch.zeros_like(fi)).sum(0).double().cpu()
                    counts[k][l] += ok.sum(0).double().cpu()
    heads, neurons = (s / c.clamp_min(1) for s, c in zip(sums, counts))
    return NodeScores(heads.float(), neurons.float())


# ---------------------------------------------------------------- coefficients and roles

def initial_logits(shape, init_unimportant):
    """Logits [*shape, 3] whose softmax is (u, (1 - u) / 2, (1 - u) / 2)."""
    u = float(init_unimportant)
    if not 0 < u < 1:
        raise ValueError(f"init_unimportant must be in (0, 1), got {u}")
    init = torch.tensor([math.log(u), math.log((1 - u) / 2), math.log((1 - u) / 2)])
    return init.expand(*shape, 3).clone()


def coefficients(logits):
    """(c_u, c_p, c_f) = softmax over the last dim: each in [0, 1], summing to 1."""
    return torch.softmax(logits.float(), -1)


def roles_of(coeffs):
    """Role index per node: 0 unimportant unless c_p + c_f > c_u, then 1 (passthrough) or 2
    (functional), whichever coefficient is larger (passthrough on a tie)."""
    candidate = coeffs[..., 1] + coeffs[..., 2] > coeffs[..., 0]
    role = torch.where(coeffs[..., 2] > coeffs[..., 1], 2, 1)
    return torch.where(candidate, role, 0)


@dataclass
class S3Settings:
    lr: float = 0.005
    weight_decay: float = 5e-4
    epochs: int = 60
    warmup_epochs: int = 5
    sparsity: float = 0.3
    alpha: float = 0.75
    k: int = 6
    batch_size: int = 32
    binary_weight: float = 0.3
    init_unimportant: float = 1 / 3
    fi_threshold: float | None = None
    intervention: str = "patching"
    seed: int = 42

    def schedule(self, n_rows):
        """[(kind, epoch, batch)] per fit step: 'd' (discovery on that batch) or 'c'."""
        per_epoch = math.ceil(n_rows / self.batch_size)
        steps = []
        for e in range(self.epochs):
            for j in range(per_epoch):
                steps.append(("d", e, j))
                if e >= self.warmup_epochs:
                    steps += [("c", e, j)] * self.k
        return steps


@dataclass
class S3Result:
    logits_heads: torch.Tensor        # [L, H, 3]
    logits_neurons: torch.Tensor      # [L, d_mlp, 3]
    fi: NodeScores
    thresholds: dict
    seconds: float
    fi_seconds: float
    discovery_steps: int
    importance: NodeScores = None     # mean over discovery steps of -d(discovery loss)/d(mask)
    history: list = field(default_factory=list)   # per epoch: losses and candidate counts

    @property
    def coefficients(self):
        return coefficients(self.logits_heads), coefficients(self.logits_neurons)

    def roles(self):
        c_h, c_n = self.coefficients
        return roles_of(c_h), roles_of(c_n)

    def candidates(self):
        r_h, r_n = self.roles()
        return NodeSet(r_h > 0, r_n > 0)

    def coefficient_scores(self):
        """log((c_p + c_f) / c_u) per node: the order of c_p + c_f, without float32 ties
        where c_p + c_f rounds to 1."""
        return NodeScores(*(torch.logsumexp(t[..., 1:].float(), -1) - t[..., 0].float()
                            for t in (self.logits_heads, self.logits_neurons)))

    def scores(self):
        """The node ranking used at node budgets and for recovery: the circuit (candidates)
        first, ordered by `importance` (the discovery loss's mask gradient averaged over
        training: the coefficients of kept nodes saturate and do not order them), then every
        other node by coefficient_scores. Returned as NodeScores (higher = earlier)."""
        cand = self.candidates()
        flat_c = torch.cat([cand.heads.flatten(), cand.neurons.flatten()])
        key = torch.where(flat_c, self.importance.flat(), self.coefficient_scores().flat())
        order = sorted(range(len(key)), key=lambda i: (not bool(flat_c[i]), -float(key[i]), i))
        rank = torch.empty(len(key))
        rank[torch.tensor(order)] = torch.arange(len(key), 0, -1, dtype=torch.float)
        return NodeScores.from_flat(rank, self.importance)


def _fi_targets(fi, threshold):
    """(targets heads, targets neurons, thresholds): 1 where FI >= threshold."""
    thr_h = float(threshold) if threshold is not None else float(fi.heads.median())
    thr_n = float(threshold) if threshold is not None else float(fi.neurons.median())
    return (fi.heads >= thr_h).float(), (fi.neurons >= thr_n).float(), dict(heads=thr_h, neurons=thr_n)


def train_s3martcirc(model, graph, rows, settings, *, means=None, progress=True, data=None,
                     state=None):
    """Train the node coefficients on `rows` (see the module docstring); returns S3Result.
    state (condense.optimize.FitState): save the training there as it goes, and go on from it
    (the importance sums and the epoch logs with it; batches are drawn per epoch from the seed);
    a resumed training's seconds add what earlier processes spent on the saved steps."""
    start = time.perf_counter()
    p = next(model.parameters())
    device = p.device
    dtype = model_parts(model).token_embed.weight.dtype
    s = settings
    if s.epochs < 1 or not 0 <= s.warmup_epochs <= s.epochs or s.k < 0:
        raise ValueError(f"need epochs >= 1, 0 <= warmup_epochs <= epochs, k >= 0; got {s}")
    data = data or TrainData.build(model, rows, s.batch_size)
    fi_start = time.perf_counter()
    fi = node_fi(model, graph, rows, s.batch_size)
    fi_seconds = time.perf_counter() - fi_start
    t_heads, t_neurons, thresholds = _fi_targets(fi, s.fi_threshold)
    t_heads, t_neurons = t_heads.to(device), t_neurons.to(device)
    L, H, d = graph.n_layers, graph.n_heads, graph.shape.d_mlp
    theta_h = initial_logits((L, H), s.init_unimportant).to(device).requires_grad_(True)
    theta_n = initial_logits((L, d), s.init_unimportant).to(device).requires_grad_(True)
    g = graph.copy()
    g.reset(in_graph=True)
    schedule = s.schedule(data.n)
    live = {}
    importance = [torch.zeros(L, H, dtype=torch.float64), torch.zeros(L, d, dtype=torch.float64)]
    batches = {}
    history, epoch_log = [], {}

    def epoch_batches(e):
        if e not in batches:
            batches.clear()
            batches[e] = data.epoch_batches(e, s.batch_size, s.seed)
        return batches[e]

    def discovery(e, j):
        c_h, c_n = coefficients(theta_h), coefficients(theta_n)
        batch = data.batch(shard(epoch_batches(e)[j]), device)
        masks = [(1 - c_h[..., 0]).to(dtype), (1 - c_n[..., 0]).to(dtype)]
        for m in masks:  # their gradient is the discovery loss's alone (the regularisers read c)
            m.retain_grad()
        live["masks"] = masks
        logits = masked_logits(model, g, batch, *masks, s.intervention, means)
        task = discovery_loss(logits, batch[4], batch[5], s.alpha)
        c_all = torch.cat([c_h.reshape(-1, 3), c_n.reshape(-1, 3)])
        sparse = (1 - c_all[:, 0]).mean()
        binary = (c_all * (1 - c_all)).sum(-1).mean()
        log_epoch(e, task=task.item(), sparse=sparse.item(), binary=binary.item())
        return task + s.sparsity * sparse + s.binary_weight * binary

    def classification(e):
        terms = []
        for theta, target in ((theta_h, t_heads), (theta_n, t_neurons)):
            c = coefficients(theta)
            cand = (c[..., 1] + c[..., 2] > c[..., 0]).detach()
            if bool(cand.any()):
                split = theta[..., 2] - theta[..., 1]          # logit of c_f / (c_p + c_f)
                terms.append(F.binary_cross_entropy_with_logits(split[cand], target[cand],
                                                                reduction="none"))
        if not terms:
            return (theta_h.sum() + theta_n.sum()) * 0.0
        loss = torch.cat(terms).mean()
        log_epoch(e, classification=loss.item())
        return loss

    def log_epoch(e, **values):
        rec = epoch_log.setdefault(e, {})
        for k, v in values.items():
            rec.setdefault(k, []).append(v)

    def loss_fn(step):
        kind, e, j = schedule[step]
        return discovery(e, j) if kind == "d" else classification(e)

    def after_step(step, loss):
        kind, e, _ = schedule[step]
        if kind == "d":  # importance: minus the discovery loss's gradient at the soft masks
            for acc, m in zip(importance, live.pop("masks")):
                acc -= m.grad.detach().double().cpu()
        last_of_epoch = step + 1 == len(schedule) or schedule[step + 1][1] != e
        if last_of_epoch:
            with torch.no_grad():
                r_h, r_n = roles_of(coefficients(theta_h)), roles_of(coefficients(theta_n))
            rec = {k: sum(v) / len(v) for k, v in epoch_log.pop(e, {}).items()}
            rec.update(epoch=e, heads=int((r_h > 0).sum()), neurons=int((r_n > 0).sum()),
                       functional=int((r_h == 2).sum() + (r_n == 2).sum()),
                       passthrough=int((r_h == 1).sum() + (r_n == 1).sum()))
            history.append(rec)

    if state is not None:
        state.logs.update(history=history, epoch_log=epoch_log)
        state.tensors.update(importance_heads=importance[0], importance_neurons=importance[1])
    with eval_mode(model):
        fit([theta_h, theta_n], loss_fn, len(schedule), lr=s.lr, weight_decay=s.weight_decay,
            desc="s3martcirc", progress=progress, after_step=after_step, state=state)
    n_discovery = sum(1 for kind, _, _ in schedule if kind == "d")
    importance = [all_reduce_(t.to(device), "mean").cpu() / n_discovery for t in importance]
    return S3Result(theta_h.detach().cpu(), theta_n.detach().cpu(), fi, thresholds,
                    (state.earlier_seconds if state is not None else 0.0) + time.perf_counter() - start,
                    fi_seconds, n_discovery,
                    NodeScores(*(t.float() for t in importance)), history)
