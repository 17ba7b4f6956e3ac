"""Edge attribution: a score for every edge of a Graph, from gradients through the exact
edge-level forward of condense.patching (docs/design.md §1-2).

Sign convention (all methods): score(s -> r) is a first-order estimate of how much the edge
*helps* the metric, i.e. of metric(with the edge) - metric(with it ablated); positive = the
edge helps. With x_r the input of receiver r and D_s = clean_s - ablated_s the difference
between the sender's clean output and what the edge carries when removed,

    score(s -> r) = mean over rows of  sum over positions of  D_s . g_r

where g_r is the gradient of the metric with respect to x_r at some point(s) (below). At the
full circuit this is exactly d metric / d m[s, r] for the edge mask m of patching.py
(x_r = ... + m[s, r] * D_s), so EAP is one gradient of the mask. Rows are right-padded per
batch; the metric is read at each row's last real position, so padding gets no gradient.

Methods (`ig_steps` = k):
- `eap`: g_r at the clean point (the full circuit): one forward + backward per batch.
- `eap_ig_inputs`: the input embeddings (the `input` sender) move on the straight line from
  their ablated to their clean value, the rest of the model recomputed from them; g_r is
  averaged over k points and contracted with the *true* D_s (clean run vs ablated), as
  EAP-IG does. Quadrature: the midpoint rule, alpha_j = (j + 1/2) / k. It is second order
  (error O(1/k^2)) where the left/right Riemann sums of the EAP-IG code are first order, it
  needs no more evaluations than they do (the trapezoid rule needs k + 1), and it never
  spends an evaluation on an endpoint: the clean end, where KL's gradient vanishes, or the
  corrupted end.
- `eap_ig_activations`: every edge mask entry at alpha (all senders' contributions
  interpolated between ablated and clean at once), the mask gradient averaged over the same
  midpoints. This is integrated gradients of metric(m) along m = alpha * 1, so it is
  complete: the scores sum to metric(full) - metric(empty) as k grows. Unlike the two
  input-path methods, the difference that multiplies g_r is the one *at the point*
  (clean_s(alpha) - ablated_s, the sender's output in the interpolated run), not the true
  clean-run difference: that is what the mask gradient is, and what completeness needs.
- `clean_corrupted`: the average of g_r at the clean point and at the corrupted point (the
  input at its ablated value, which under `patching` is the model on the corrupted prompt),
  contracted with the true D_s: EAP-IG's two-endpoint method.
- `eap_gp`: GradPath (Zhang et al. 2025, "EAP-GP: Mitigating Saturation Effect in
  Gradient-based Automated Circuit Identification", arXiv:2502.06852). Our reading: the path
  starts at the clean input embeddings gamma_0 and takes k steps of fixed length against the
  gradient of || G(gamma) - G* ||^2, G being the model's logits at every real position and G*
  those of the empty circuit (the corrupted run under `patching`), each step along the
  unit-norm gradient direction (per row); g_r is averaged over gamma_1..gamma_k and contracted
  with the true D_s. The path bends towards where the output actually changes, instead of
  the straight line, whose points can sit in saturated (flat) regions. The paper's steps are
  unit-norm; a step *length* of 1 depends on the embedding scale, so by default each row's
  step length is |e_clean - e_ablated| / k (the straight line's step), i.e. k steps may
  travel as far as the straight line; `gp_step=1.0` gives the literal unit step. Cost: k + 1
  forwards and 2k backwards per batch.
- `random`: seeded standard-normal scores (a baseline).

Metrics: `logit_diff` (answer - distractor logit at the last real position) and `kl`, used
as -KL(P_full || P_point) so that larger is better for both (positive score = the edge
helps). KL's gradient is exactly zero at the full circuit, so `eap` with `kl` takes the
corrupted-side linearisation instead: g_r at the corrupted point (the second half of
`clean_corrupted`); the path methods are unaffected (their points are away from the clean
end).

Linearisation point (`at_circuit`): by default every method linearises the full model (all
edges on), as EAP and EAP-IG do. With at_circuit=True the point is the graph's current circuit
(`in_graph`; every other edge ablated in every pass): the full circuit's mask 1 becomes the
circuit's mask, the interpolated input moves only along the circuit's input edges, and D_s is
measured in the circuit's run. Scores of edges in the circuit then estimate what removing each
one from *the circuit* costs, which is what condensation rounds need once most edges are gone.
Under patching, the methods that read receiver gradients (eap_ig_inputs, clean_corrupted,
eap_gp, eap with kl) then score the circuit's edges only (the others get 0): nodes that read
nothing from the circuit are not recomputed, so a small circuit costs little. EAP and
eap_ig_activations (mask gradients) score every edge, "adding it back" for edges outside.

Node masks of the graph (head_mask / neuron_mask), if not all ones, are applied in every pass,
as evaluate() applies them. The model is put in eval mode (dropout off) and restored after.
Gradients are taken with torch.autograd.grad, so no parameter (a LoRA adapter's included)
ever receives a .grad.
"""
from typing import TYPE_CHECKING, Optional

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from condense.evaluate import dataset_columns, row_batches
from condense.metrics import eval_mode, kl_rows
from condense.model_parts import model_parts, model_shape
from condense.patching import INTERVENTIONS, ablated_values, decomposed_forward

if TYPE_CHECKING:
    from condense.graph import Graph

METHODS = ("eap", "eap_ig_inputs", "eap_ig_activations", "clean_corrupted", "eap_gp", "random")
METRICS = ("logit_diff", "kl")


def attribute(model: torch.nn.Module, graph: "Graph", dataset, method: str, ig_steps: int = 5,
              intervention: str = "patching", metric: str = "logit_diff", batch_size: int = 16,
              seed: int = 0, means=None, progress: bool = True, gp_step: Optional[float] = None,
              at_circuit: bool = False) -> torch.Tensor:
    """Fill `graph.scores` ([n_senders, n_receivers], 0 where no edge exists) with `method`'s
    edge scores on `dataset` (a datasets.Dataset or dict of lists with clean_ids,
    corrupted_ids, answer_id, distractor_id) and return them. See the module docstring for
    the methods, the sign convention and the metrics.

    ig_steps: points per path (eap_ig_inputs, eap_ig_activations, eap_gp).
    intervention: "patching" | "mean" (needs means=condense.means.compute_means(...)) | "zero".
    seed: only `random` draws random numbers; every other method is deterministic.
    gp_step: eap_gp's step length (None: |clean - ablated input| / ig_steps per row).
    at_circuit: linearise at the graph's circuit (in_graph) instead of the full model."""
    if method not in METHODS:
        raise ValueError(f"unknown attribution method {method!r}; valid methods: {', '.join(METHODS)}")
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; valid metrics: {', '.join(METRICS)}")
    if intervention not in INTERVENTIONS:
        raise ValueError(f"intervention {intervention!r}; choose one of {INTERVENTIONS}")
    if intervention == "mean" and means is None:
        raise ValueError("intervention='mean' needs "
                         "means=condense.means.compute_means(model, graph, reference)")
    if int(ig_steps) < 1:
        raise ValueError(f"ig_steps must be >= 1, got {ig_steps}")
    if model_shape(model) != graph.shape:
        raise ValueError(f"graph was built for {graph.shape}, model is {model_shape(model)}")

    if method == "random":
        gen = torch.Generator().manual_seed(int(seed))
        scores = torch.randn(graph.n_senders, graph.n_receivers, generator=gen)
    else:
        scores = _Attributor(model, graph, intervention, metric, means, int(ig_steps),
                             gp_step, at_circuit).run(dataset, method, batch_size, progress)
    graph.scores = scores.masked_fill(~graph.valid, 0.0)
    return graph.scores


def _midpoints(k):
    return [(j + 0.5) / k for j in range(k)]


class _Batch:
    """One right-padded batch: ids, attention mask, last real positions and the labels."""

    def __init__(self, clean, corrupted, mask, last, answer, distractor):
        self.clean, self.corrupted, self.mask, self.last = clean, corrupted, mask, last
        self.answer, self.distractor = answer, distractor
        self.real = mask.bool()[..., None]  # [B, T, 1]
        self.size = clean.shape[0]


class _Attributor:
    """The passes every method is assembled from, for one model / graph / intervention."""

    def __init__(self, model, graph, intervention, metric, means, steps, gp_step, at_circuit=False):
        self.model, self.graph, self.intervention, self.metric = model, graph, intervention, metric
        self.means, self.steps, self.gp_step = means, steps, gp_step
        self.parts = model_parts(model)
        self.device = next(model.parameters()).device
        self.dtype = self.parts.token_embed.weight.dtype
        self.wide = torch.promote_types(self.dtype, torch.float32)  # scores accumulate in >= fp32
        self.head_mask = self._node_mask(graph.head_mask)
        self.neuron_mask = self._node_mask(graph.neuron_mask)
        # the mask of the linearisation point: all ones (full model) or the circuit
        self.base = None
        if at_circuit and not bool(graph.in_graph[graph.valid].all()):
            self.base = (graph.in_graph & graph.valid).to(self.device, self.dtype)
        # at a circuit under patching, nodes that read nothing from it are not recomputed: only
        # scores of edges outside the circuit would need them (condensation drops those)
        self.skip_unread = self.base is not None and intervention == "patching"

    def _node_mask(self, mask):
        return None if bool((mask == 1).all()) else mask.to(self.device, self.dtype)

    def _full_mask(self, value, requires_grad=False):
        g = self.graph
        return torch.full((g.n_senders, g.n_receivers), float(value), dtype=self.dtype,
                          device=self.device, requires_grad=requires_grad)

    def _point_mask(self, value=1.0, requires_grad=False):
        """value * the linearisation point's mask (ones, or the circuit)."""
        if self.base is None:
            return self._full_mask(value, requires_grad)
        return (float(value) * self.base).requires_grad_(requires_grad)

    # ------------------------------------------------------------ driver
    def run(self, dataset, method, batch_size, progress):
        cols, n = dataset_columns(dataset)
        if n == 0:
            raise ValueError("attribute: the dataset has no rows")
        g = self.graph
        total = torch.zeros(g.n_senders, g.n_receivers, dtype=torch.float64)
        with eval_mode(self.model), tqdm(total=n, desc=f"attribute {method}",
                                         disable=not progress, unit="row") as bar:
            for idx, clean, corrupted, mask, last in row_batches(cols, n, batch_size, self.device):
                labels = [torch.tensor([int(cols[k][i]) for i in idx], device=self.device)
                          for k in ("answer_id", "distractor_id")]
                b = _Batch(clean, corrupted, mask, last, *labels)
                with torch.enable_grad():
                    total += getattr(self, "_" + method)(b).to("cpu", torch.float64)
                bar.update(len(idx))
        if self.skip_unread and self._captures(method):  # scored on the circuit only
            total.mul_(self.base.to("cpu", torch.float64))
        return (total / n).float()

    def _captures(self, method):
        """Whether `method` reads receiver gradients (captured inputs), not the mask's."""
        return method in ("eap_ig_inputs", "clean_corrupted", "eap_gp") or (
            method == "eap" and self.metric == "kl")

    # ------------------------------------------------------------ shared passes
    @torch.no_grad()
    def _ablated(self, b):
        """What a removed edge carries, per docs/design.md §2 (computed once per batch)."""
        return ablated_values(self.parts, self.graph, self.intervention, b.clean.shape,
                              b.corrupted, b.mask, self.means,
                              keep_hidden=self.neuron_mask is not None, like=self._full_mask(0))

    def _forward(self, b, ablated, edge_mask, delta=None, capture=False, all_positions=False):
        """The patched forward on the clean prompt, its input embeddings moved by `delta`
        [B, T, D] (None: not moved). The moved input reaches a receiver only along an edge that
        is on at the point (every edge, or the circuit's)."""
        return decomposed_forward(self.parts, self.graph, b.clean, b.mask, ablated=ablated,
                                  edge_mask=edge_mask, head_mask=self.head_mask,
                                  neuron_mask=self.neuron_mask, input_delta=delta,
                                  capture_receivers=capture,
                                  logit_positions=None if all_positions else b.last,
                                  skip_unread=self.skip_unread)

    @torch.no_grad()
    def _clean_run(self, b, ablated):
        """The full circuit: its last-position log-probs (KL's target), the true sender
        differences D = clean - ablated [S, B, T, D] (zero at padding), and the input
        embeddings' clean and ablated values [B, T, D]."""
        logits, clean, _ = self._forward(b, ablated, self._point_mask())
        if clean.differences is not None:  # the run's own buffer, no longer needed by it
            diff = clean.differences.to(self.wide).mul_(b.real)
        else:
            diff = (clean.stacked() - ablated.stacked()).to(self.wide) * b.real
        e_clean = clean.blocks[0][0]
        e_ablated = ablated.blocks[0][0].expand_as(e_clean)
        return F.log_softmax(logits.float(), -1), diff, e_clean, e_ablated

    def _metric(self, logits, b, target_logp):
        """Per-row metric [B] from last-position logits [B, V]; larger is better."""
        logits = logits.float()
        if self.metric == "logit_diff":
            return (logits.gather(1, b.answer[:, None]) - logits.gather(1, b.distractor[:, None]))[:, 0]
        logp = F.log_softmax(logits, -1)
        return -kl_rows(target_logp, logp)

    def _mask_gradient(self, b, ablated, value, target_logp):
        """d (summed metric) / d edge mask, at the mask filled with `value`."""
        mask = self._point_mask(value, requires_grad=True)
        logits, _, _ = self._forward(b, ablated, mask)
        (grad,) = torch.autograd.grad(self._metric(logits, b, target_logp).sum(), mask)
        return grad.to(self.wide)

    def _receiver_gradients(self, b, ablated, delta, target_logp, retain=False, all_positions=False):
        """Metric gradients at every receiver input (list of (receivers, grad [R, B, T, D]))
        at the input point e_clean + delta; also returns the logits of that pass."""
        logits, _, captured = self._forward(b, ablated, self._point_mask(), delta=delta,
                                            capture=True, all_positions=all_positions)
        last = logits[torch.arange(b.size, device=self.device), b.last] if all_positions else logits
        xs = [x for _, x in captured]
        grads = torch.autograd.grad(self._metric(last, b, target_logp).sum(), xs,
                                    retain_graph=retain, allow_unused=True)
        return [(r, torch.zeros_like(x) if gr is None else gr) for (r, x), gr in zip(captured, grads)], logits

    def _contract(self, diff, grad_sums):
        """scores[s, r] = sum over rows and positions of D_s . G_r, for each receiver group."""
        g = self.graph
        scores = torch.zeros(g.n_senders, g.n_receivers, dtype=self.wide, device=self.device)
        flat = diff.flatten(1)
        for receivers, grad in grad_sums:  # a slice of receivers, or indices within one layer
            first = receivers.start if isinstance(receivers, slice) else int(receivers[0])
            n = int(g.valid[:, first].sum())  # senders written before this group
            scores[:n, receivers] = flat[:n] @ grad.flatten(1).T
        return scores

    def _input_points(self, b, points):
        """Contract the true differences with sum_j w_j g_r(e_clean + delta_j), where each
        point is (fraction of the way from clean to ablated input, weight w_j)."""
        ablated = self._ablated(b)
        target, diff, e_clean, e_ablated = self._clean_run(b, ablated)
        towards_ablated = (e_ablated - e_clean) * b.real
        sums = None
        for fraction, weight in points:
            delta = None if fraction == 0 else fraction * towards_ablated
            grads = self._receiver_gradients(b, ablated, delta, target)[0]  # not the logits: they hold the pass's graph
            if sums is None:  # in place: each pass's gradients are as large as the run itself
                sums = [(r, gr.to(self.wide).mul_(weight)) for r, gr in grads]
            else:
                for (_, s), (_, gr) in zip(sums, grads):
                    s.add_(gr, alpha=weight)
            del grads
        return self._contract(diff, sums)

    # ------------------------------------------------------------ methods (summed over rows)
    def _eap(self, b):
        if self.metric == "kl":  # zero gradient at the clean end: linearise at the corrupted end
            return self._input_points(b, [(1.0, 1.0)])
        return self._mask_gradient(b, self._ablated(b), 1.0, None)

    def _clean_corrupted(self, b):
        return self._input_points(b, [(0.0, 0.5), (1.0, 0.5)])

    def _eap_ig_inputs(self, b):
        # alpha = share of the clean input; the point sits 1 - alpha of the way to ablated
        return self._input_points(b, [(1.0 - a, 1.0 / self.steps) for a in _midpoints(self.steps)])

    def _eap_ig_activations(self, b):
        ablated = self._ablated(b)
        target = self._clean_run(b, ablated)[0] if self.metric == "kl" else None
        return sum(self._mask_gradient(b, ablated, a, target) for a in _midpoints(self.steps)) / self.steps

    def _eap_gp(self, b):
        ablated = self._ablated(b)
        target, diff, e_clean, e_ablated = self._clean_run(b, ablated)
        with torch.no_grad():
            empty_logits, _, _ = self._forward(b, ablated, self._full_mask(0), all_positions=True)
        k, real = self.steps, b.real
        if self.gp_step is None:
            step = ((e_clean - e_ablated) * real).flatten(1).norm(dim=1) / k
        else:
            step = torch.full((b.size,), float(self.gp_step), device=self.device)
        delta = torch.zeros_like(e_clean)
        sums = None
        for j in range(k + 1):
            delta = delta.detach().requires_grad_(j < k)
            if j > 0:  # gradients at gamma_1 .. gamma_k
                grads, logits = self._receiver_gradients(b, ablated, delta, target, retain=j < k,
                                                         all_positions=True)
                grads = [(r, gr.to(self.wide) / k) for r, gr in grads]
                sums = grads if sums is None else [(r, s + gr) for (r, s), (_, gr) in zip(sums, grads)]
            else:
                logits, _, _ = self._forward(b, ablated, self._point_mask(), delta=delta,
                                             all_positions=True)
            if j < k:  # the next point: one unit-direction step towards the empty circuit's output
                distance = ((logits.float() - empty_logits.float()).pow(2) * real).sum()
                (grad,) = torch.autograd.grad(distance, delta)
                norm = grad.flatten(1).norm(dim=1).clamp_min(1e-30)
                delta = delta.detach() - (step / norm).to(grad.dtype)[:, None, None] * grad
        return self._contract(diff, sums)
