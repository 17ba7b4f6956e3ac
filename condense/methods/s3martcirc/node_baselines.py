"""Node-level circuit baselines (for S3martCirc, condense/methods/s3martcirc/method.py): a score for every
attention head `a{l}.h{h}` and every MLP neuron `m{l}.n{i}` (docs/design.md §1), and the
node-level evaluation they are compared with.

Nodes are addressed by the node masks of condense.patching.run_graph: head_mask [L, H] mixes a
head's z (before its slice of the output projection) and neuron_mask [L, d_mlp] an MLP hidden
unit (the input of the down projection) between the clean and the ablated value (`patching`:
the corrupted prompt; `mean`; `zero`). Mask 1 = the node as in the model, 0 = ablated.

Scores are signed estimates of how much a node *helps* the metric, the logit difference
LD = logit[answer] - logit[distractor] at the last real position, averaged over rows:

- `exact_patching`: LD(full) - LD(that one node ablated), run_graph's patched forward with
  that node's mask at 0, per node and batch (exact, and the slowest: n_nodes + 1 patched
  forwards per batch);
- `exact_patching_heads`: `exact_patching` over the attention heads only, every neuron ranked
  after every head (score -inf): on a real model (SmolLM2-135M: 270 heads, 46,080 neurons)
  exact patching of every neuron costs hours to days on a CPU, of the heads minutes. Its
  time per node is the same, so the full method's time is this one's times
  (n_nodes + 1) / (n_heads + 1) (`exact_patching_seconds_estimate`);
- `attribution_patching`: dLD/dm at m = 1 (every node mask), the first-order estimate of
  the same difference: one forward + backward per batch;
- `attribution_patching_ig`: integrated gradients along m = alpha * 1 (all node masks scaled
  together from ablated to clean), midpoint rule over `steps` points; the scores sum to
  LD(full) - LD(all nodes ablated) as steps grow;
- `node_pruning`: hard-concrete (L0) gates on the nodes (Louizos et al. 2018), trained with
  condense.optimize.fit on the S3martCirc discovery loss plus an expected-L0 penalty; the
  score is each gate's log alpha;
- `random`: seeded standard-normal scores.

A circuit of n nodes is the top n by score (ties broken by node order: heads first, then
neurons, each in layer order). `ablation_metrics` evaluates a node set the way the S3martCirc
paper does: every node of the set ablated, everything else kept, then accuracy and logit
difference against the full model (accuracy drop, logit drop); `circuit_metrics` keeps only
the set (sufficiency).
"""
import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from condense.evaluate import dataset_columns, evaluate, reference_outputs, row_batches
from condense.metrics import eval_mode, kl_rows, last_logits, pad_batch
from condense.optimize import fit, shard
from condense.patching import (
    ablated_values,
    checked_parts,
    decomposed_forward,
    run_graph,
)

BASELINES = ("exact_patching", "exact_patching_heads", "attribution_patching", "attribution_patching_ig", "node_pruning",
             "random")


# ---------------------------------------------------------------- node scores and sets

def node_names(shape):
    """Names in the flat node order: every head a{l}.h{h}, then every neuron m{l}.n{i}."""
    heads = [f"a{l}.h{h}" for l in range(shape.n_layers) for h in range(shape.n_heads)]
    neurons = [f"m{l}.n{i}" for l in range(shape.n_layers) for i in range(shape.d_mlp)]
    return heads + neurons


@dataclass
class NodeScores:
    """One value per node: heads [L, H], neurons [L, d_mlp] (higher = more important)."""
    heads: torch.Tensor
    neurons: torch.Tensor

    @property
    def n_nodes(self):
        return self.heads.numel() + self.neurons.numel()

    def flat(self):
        return torch.cat([self.heads.flatten(), self.neurons.flatten()]).float().cpu()

    @classmethod
    def from_flat(cls, flat, like):
        nh = like.heads.numel()
        return cls(flat[:nh].view_as(like.heads), flat[nh:].view_as(like.neurons))

    def order(self):
        """Flat node indices, best first; equal scores keep node order."""
        return torch.sort(-self.flat(), stable=True).indices

    def top(self, n):
        """NodeSet of the n best nodes."""
        if not 0 <= n <= self.n_nodes:
            raise ValueError(f"top({n}): outside [0, {self.n_nodes}] nodes")
        chosen = torch.zeros(self.n_nodes, dtype=torch.bool)
        chosen[self.order()[:n]] = True
        return NodeSet.from_flat(chosen, self)

    def ranked_names(self, shape, n=None):
        names = node_names(shape)
        return [names[i] for i in self.order()[:n].tolist()]

    def to_dict(self):
        return dict(heads=self.heads.tolist(), neurons=self.neurons.tolist())


@dataclass
class NodeSet:
    """A set of nodes as bool masks: heads [L, H], neurons [L, d_mlp]."""
    heads: torch.Tensor
    neurons: torch.Tensor

    @classmethod
    def from_flat(cls, flat, like):
        nh = like.heads.numel()
        return cls(flat[:nh].view(like.heads.shape).clone(), flat[nh:].view(like.neurons.shape).clone())

    def __len__(self):
        return int(self.heads.sum()) + int(self.neurons.sum())

    @property
    def n_heads(self):
        return int(self.heads.sum())

    @property
    def n_neurons(self):
        return int(self.neurons.sum())

    def names(self, shape):
        names = node_names(shape)
        flat = torch.cat([self.heads.flatten(), self.neurons.flatten()])
        return [names[i] for i in torch.nonzero(flat).flatten().tolist()]


def node_circuit_graph(graph, nodes):
    """A copy of `graph` holding the node circuit `nodes`: node masks 1 on the set and 0 off
    it, and every edge between kept nodes (input and logits always kept; an MLP is kept when
    one of its neurons is) in the graph, then pruned to input -> logits paths. Evaluating it
    runs the circuit alone; its circuit.json carries the node masks."""
    g = graph.copy()
    g.head_mask = nodes.heads.float().clone()
    g.neuron_mask = nodes.neurons.float().clone()
    keep = torch.zeros(len(g.node_names), dtype=torch.bool)
    keep[0] = keep[-1] = True
    for l in range(g.n_layers):
        for h in range(g.n_heads):
            keep[g.head_sender(l, h)] = bool(nodes.heads[l, h])
        keep[g.mlp_sender(l)] = bool(nodes.neurons[l].any())
    g.in_graph = g.valid & keep[: g.n_senders, None] & keep[g.receiver_node][None, :]
    return g.prune()


def connected_nodes(graph, nodes):
    """The nodes of `nodes` on an input -> logits path of their node circuit (the paper's
    circuit size removes the others). Every node of a residual model reads `input` and
    writes to `logits` directly, so with the complete graph between kept nodes none is
    removed; the check is kept so that the count means what it says for any graph."""
    g = node_circuit_graph(graph, nodes)
    on = g.nodes_in_graph()
    heads = nodes.heads.clone()
    neurons = nodes.neurons.clone()
    for l in range(g.n_layers):
        for h in range(g.n_heads):
            heads[l, h] &= bool(on[g.head_sender(l, h)])
        if not bool(on[g.mlp_sender(l)]):
            neurons[l] = False
    return NodeSet(heads, neurons)


def ablation_metrics(model, graph, rows, nodes, *, intervention="patching", batch_size=32,
                     means=None, reference=None):
    """Ablate the nodes of `nodes` (everything else as in the model) on `rows`: accuracy,
    logit difference, and their drops from the full model (accuracy_drop in percentage
    points, 100 * (acc_full - acc); logit_drop = LD_full - LD), and correct_rows: one
    character per row, "1" where the answer still wins, so that two node sets can be compared
    row by row (paired_drop_difference)."""
    g = graph.copy()
    g.reset(in_graph=True)
    g.head_mask = 1.0 - nodes.heads.float()
    g.neuron_mask = 1.0 - nodes.neurons.float()
    out = evaluate(model, g, rows, intervention=intervention, batch_size=batch_size, means=means,
                   reference=reference, per_row=True)
    correct = out["per_row"]["logit_diff"] > 0
    return dict(nodes=len(nodes), heads=nodes.n_heads, neurons=nodes.n_neurons,
                accuracy=out["accuracy"], accuracy_full=out["accuracy_full"],
                accuracy_drop=100.0 * (out["accuracy_full"] - out["accuracy"]),
                logit_diff=out["logit_diff"], logit_diff_full=out["logit_diff_full"],
                logit_drop=out["logit_diff_full"] - out["logit_diff"], kl=out["kl"],
                correct_rows="".join("1" if c else "0" for c in correct.tolist()))


def paired_drop_difference(correct_a: str, correct_b: str) -> dict:
    """How much more node set A's ablation drops accuracy than B's, on the same rows, and
    whether the rows could give that by chance. correct_a, correct_b: ablation_metrics'
    correct_rows of each. Returns difference (points, A's drop minus B's), a_only (rows that
    only A's ablation breaks), b_only, n, and p: the exact two-sided McNemar test, a binomial
    test of a_only against b_only at one half (the rows both or neither break say nothing
    about which set matters more)."""
    if len(correct_a) != len(correct_b):
        raise ValueError(f"the two sets were evaluated on {len(correct_a)} and {len(correct_b)} rows")
    a_only = sum(a == "0" and b == "1" for a, b in zip(correct_a, correct_b))
    b_only = sum(a == "1" and b == "0" for a, b in zip(correct_a, correct_b))
    k, m = min(a_only, b_only), a_only + b_only
    p = min(1.0, 2 * sum(math.comb(m, i) for i in range(k + 1)) / 2 ** m) if m else 1.0
    n = len(correct_a)
    return dict(difference=100.0 * (a_only - b_only) / n, a_only=a_only, b_only=b_only, n=n, p=p)


def circuit_metrics(model, graph, rows, nodes, *, intervention="patching", batch_size=32,
                    means=None, reference=None):
    """Keep only the nodes of `nodes` (every other node ablated): accuracy, logit difference,
    faithfulness and KL of the circuit alone."""
    g = node_circuit_graph(graph, nodes)
    out = evaluate(model, g, rows, intervention=intervention, batch_size=batch_size, means=means,
                   reference=reference)
    return {k: out[k] for k in ("accuracy", "logit_diff", "faithfulness", "kl", "accuracy_full",
                                "logit_diff_full")}


# ---------------------------------------------------------------- shared pieces

def _shape(graph):
    return graph.n_layers, graph.n_heads, graph.shape.d_mlp


def _labels(cols, idx, device):
    return [torch.tensor([int(cols[k][i]) for i in idx], device=device)
            for k in ("answer_id", "distractor_id")]


def logit_diff(logits, answer, distractor):
    logits = logits.float()
    return (logits.gather(1, answer[:, None]) - logits.gather(1, distractor[:, None]))[:, 0]


def _ones(graph, device, dtype, requires_grad=False, value=1.0):
    L, H, d = _shape(graph)
    return (torch.full((L, H), value, device=device, dtype=dtype, requires_grad=requires_grad),
            torch.full((L, d), value, device=device, dtype=dtype, requires_grad=requires_grad))


def _model_info(model):
    p = next(model.parameters())
    return p.device, (p.dtype if p.dtype.is_floating_point else torch.float32)


def _full_graph(graph):
    g = graph.copy()
    g.reset(in_graph=True)
    return g


# ---------------------------------------------------------------- exact activation patching

@torch.no_grad()
def exact_patching(model, graph, rows, *, intervention="patching", batch_size=32, means=None,
                   progress=True, heads_only=False):
    """LD(full) - LD(node ablated) per node, mean over rows: run_graph's patched forward with
    that one node's mask at 0, once per node and batch. The ablated values (the corrupted run)
    do not depend on the node, so they are computed once per batch rather than in every call.
    heads_only: score the heads only; every neuron scores -inf (ranked after every head)."""
    cols, n = dataset_columns(rows)
    device = _model_info(model)[0]
    parts = checked_parts(model, graph)
    dtype = parts.token_embed.weight.dtype
    L, H, d = _shape(graph)
    g = _full_graph(graph)
    edge_mask = g.in_graph.to(device=device, dtype=dtype)
    heads = torch.zeros(L, H, dtype=torch.float64)
    neurons = torch.zeros(L, d, dtype=torch.float64)
    n_neurons = 0 if heads_only else d
    with eval_mode(model), tqdm(total=L * (H + n_neurons) * math.ceil(n / batch_size),
                                desc="exact patching", disable=not progress, unit="run",
                                mininterval=2.0) as bar:
        for idx, clean, corrupted, mask, last in row_batches(cols, n, batch_size, device):
            answer, distractor = _labels(cols, idx, device)
            ablated = ablated_values(parts, g, intervention, clean.shape, corrupted, mask, means,
                                     keep_hidden=True, like=edge_mask)
            hm, nm = _ones(graph, device, dtype)

            def ld(batch=(clean, mask, last, ablated), labels=(answer, distractor), masks=(hm, nm)):
                logits, _, _ = decomposed_forward(parts, g, batch[0], batch[1], ablated=batch[3],
                                                  edge_mask=edge_mask, head_mask=masks[0],
                                                  neuron_mask=masks[1], logit_positions=batch[2])
                return logit_diff(logits, *labels).double().sum().cpu()

            full = ld()
            for l in range(L):
                for h in range(H):
                    hm[l, h] = 0
                    heads[l, h] += full - ld()
                    hm[l, h] = 1
                    bar.update()
                for i in range(n_neurons):
                    nm[l, i] = 0
                    neurons[l, i] += full - ld()
                    nm[l, i] = 1
                    bar.update()
    if heads_only:
        neurons.fill_(-math.inf)
    return NodeScores((heads / n).float(), (neurons / n).float())


# ---------------------------------------------------------------- gradient methods

def _mask_gradients(model, graph, rows, values, intervention, batch_size, means, progress, desc):
    """Mean over rows of dLD/d(node masks), averaged over the mask values in `values` (every
    node mask filled with the value)."""
    cols, n = dataset_columns(rows)
    device, dtype = _model_info(model)
    L, H, d = _shape(graph)
    g = _full_graph(graph)
    heads = torch.zeros(L, H, dtype=torch.float64)
    neurons = torch.zeros(L, d, dtype=torch.float64)
    with eval_mode(model), tqdm(total=n, desc=desc, disable=not progress, unit="row") as bar:
        for idx, clean, corrupted, mask, last in row_batches(cols, n, batch_size, device):
            answer, distractor = _labels(cols, idx, device)
            for value in values:
                with torch.enable_grad():
                    hm, nm = _ones(graph, device, dtype, requires_grad=True, value=value)
                    logits = run_graph(model, g, clean, corrupted, mask, intervention=intervention,
                                       head_mask=hm, neuron_mask=nm, means=means,
                                       logit_positions=last)
                    gh, gn = torch.autograd.grad(logit_diff(logits, answer, distractor).sum(), (hm, nm))
                heads += gh.double().cpu() / len(values)
                neurons += gn.double().cpu() / len(values)
            bar.update(len(idx))
    return NodeScores((heads / n).float(), (neurons / n).float())


def attribution_patching(model, graph, rows, *, intervention="patching", batch_size=32,
                         means=None, progress=True):
    """dLD/dm at every node mask = 1: the first-order estimate of LD(full) - LD(node ablated)."""
    return _mask_gradients(model, graph, rows, [1.0], intervention, batch_size, means, progress,
                           "attribution patching")


def attribution_patching_ig(model, graph, rows, *, steps=5, intervention="patching",
                            batch_size=32, means=None, progress=True):
    """Integrated gradients over the node masks: mean of dLD/dm at m = alpha * 1 over the
    midpoints alpha = (j + 1/2) / steps (times the path length 1 - 0)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    alphas = [(j + 0.5) / steps for j in range(steps)]
    return _mask_gradients(model, graph, rows, alphas, intervention, batch_size, means, progress,
                           f"attribution patching IG ({steps} steps)")


def random_scores(graph, seed=0):
    gen = torch.Generator().manual_seed(int(seed))
    L, H, d = _shape(graph)
    return NodeScores(torch.randn(L, H, generator=gen), torch.randn(L, d, generator=gen))


# ---------------------------------------------------------------- training data

@dataclass
class TrainData:
    """Rows for mask training: columns, the original model's last-position log-probs [N, V]."""
    cols: dict
    n: int
    target_logp: torch.Tensor

    @classmethod
    def build(cls, model, rows, batch_size=32):
        cols, n = dataset_columns(rows)
        logits = last_logits(model, [list(c) for c in cols["clean_ids"]], batch_size)
        return cls(cols, n, F.log_softmax(logits.float(), -1))

    def batch(self, idx, device):
        clean, mask, lengths = pad_batch([list(self.cols["clean_ids"][i]) for i in idx])
        corrupted, _, _ = pad_batch([list(self.cols["corrupted_ids"][i]) for i in idx])
        answer = torch.tensor([int(self.cols["answer_id"][i]) for i in idx], device=device)
        return (clean.to(device), corrupted.to(device), mask.to(device), (lengths - 1).to(device),
                answer, self.target_logp[idx].to(device))

    def epoch_batches(self, epoch, batch_size, seed):
        """The batches (lists of row indices) of one epoch: a seeded permutation, chunked."""
        gen = torch.Generator().manual_seed(int(seed) * 100003 + int(epoch))
        order = torch.randperm(self.n, generator=gen).tolist()
        return [order[i:i + batch_size] for i in range(0, self.n, batch_size)]


def discovery_loss(logits, answer, target_logp, alpha):
    """alpha * KL(P_orig || P_mask) - (1 - alpha) * log P_mask(answer), mean over rows."""
    logp = F.log_softmax(logits.float(), -1)
    kl = kl_rows(target_logp, logp)
    nll = -logp.gather(1, answer[:, None])[:, 0]
    return (alpha * kl + (1 - alpha) * nll).mean()


def masked_logits(model, graph, batch, head_mask, neuron_mask, intervention, means):
    clean, corrupted, mask, last = batch[:4]
    return run_graph(model, graph, clean, corrupted, mask, intervention=intervention,
                     head_mask=head_mask, neuron_mask=neuron_mask, means=means, logit_positions=last)


# ---------------------------------------------------------------- node pruning (hard concrete)

HC_BETA, HC_GAMMA, HC_ZETA = 2.0 / 3.0, -0.1, 1.1


def hard_concrete(log_alpha, gen=None, training=True):
    """Hard-concrete gate values in [0, 1]: a stretched, clamped binary-concrete sample
    (training) or its deterministic mean-free version sigmoid(log_alpha) stretched (eval)."""
    if training:
        u = torch.rand(log_alpha.shape, generator=gen).clamp(1e-6, 1 - 1e-6).to(log_alpha)
        s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + log_alpha) / HC_BETA)
    else:
        s = torch.sigmoid(log_alpha)
    return (s * (HC_ZETA - HC_GAMMA) + HC_GAMMA).clamp(0.0, 1.0)


def expected_l0(log_alpha):
    """P(gate != 0) per gate."""
    return torch.sigmoid(log_alpha - HC_BETA * math.log(-HC_GAMMA / HC_ZETA))


def node_pruning(model, graph, rows, *, steps, lr=0.1, l0_weight=0.3, alpha=0.75, batch_size=32,
                 init=3.0, intervention="patching", means=None, seed=0, progress=True, data=None):
    """Hard-concrete gates on every head and neuron, trained for `steps` AdamW steps (fit) on
    the discovery loss (alpha * KL(P_orig || P_mask) - (1 - alpha) log P_mask(answer)) plus
    l0_weight * mean expected L0 over the nodes; returns the gates' log alpha as scores.
    Returns (NodeScores, per-step losses)."""
    device, dtype = _model_info(model)
    L, H, d = _shape(graph)
    data = data or TrainData.build(model, rows, batch_size)
    g = _full_graph(graph)
    la_heads = torch.full((L, H), float(init), device=device, requires_grad=True)
    la_neurons = torch.full((L, d), float(init), device=device, requires_grad=True)
    gen = torch.Generator().manual_seed(int(seed))
    per_epoch = math.ceil(data.n / batch_size)

    def loss_fn(step):
        epoch, j = divmod(step, per_epoch)
        idx = shard(data.epoch_batches(epoch, batch_size, seed)[j])
        batch = data.batch(idx, device)
        hm = hard_concrete(la_heads, gen).to(dtype)
        nm = hard_concrete(la_neurons, gen).to(dtype)
        logits = masked_logits(model, g, batch, hm, nm, intervention, means)
        l0 = torch.cat([expected_l0(la_heads).flatten(), expected_l0(la_neurons).flatten()]).mean()
        return discovery_loss(logits, batch[4], batch[5], alpha) + l0_weight * l0

    with eval_mode(model):
        losses = fit([la_heads, la_neurons], loss_fn, steps, lr=lr, desc="node pruning",
                     progress=progress)
    return NodeScores(la_heads.detach().float().cpu(), la_neurons.detach().float().cpu()), losses


# ---------------------------------------------------------------- one entry point

def score_nodes(method, model, graph, rows, *, intervention="patching", batch_size=32, means=None,
                ig_steps=5, seed=0, progress=True, pruning=None):
    """(NodeScores, seconds) of baseline `method` on `rows`. `pruning`: keyword arguments of
    node_pruning (steps, lr, l0_weight, alpha, batch_size, init)."""
    if method not in BASELINES:
        raise ValueError(f"unknown node baseline {method!r}; valid: {', '.join(BASELINES)}")
    kw = dict(intervention=intervention, batch_size=batch_size, means=means, progress=progress)
    start = time.perf_counter()
    if method in ("exact_patching", "exact_patching_heads"):
        scores = exact_patching(model, graph, rows, heads_only=method == "exact_patching_heads", **kw)
    elif method == "attribution_patching":
        scores = attribution_patching(model, graph, rows, **kw)
    elif method == "attribution_patching_ig":
        scores = attribution_patching_ig(model, graph, rows, steps=ig_steps, **kw)
    elif method == "node_pruning":
        options = dict(pruning or {})
        options.setdefault("batch_size", batch_size)
        scores, _ = node_pruning(model, graph, rows, intervention=intervention, means=means,
                                 seed=seed, progress=progress, **options)
    else:
        scores = random_scores(graph, seed)
    return scores, time.perf_counter() - start


def reference_for(model, graph, rows, intervention="patching", batch_size=32, means=None):
    """evaluate's reference (full-model logits, empty circuit) for `rows`, shared by every
    node set evaluated on them."""
    return reference_outputs(model, graph, rows, intervention, batch_size, means)
