"""Edge Pruning (Bhaskar et al. 2024, "Finding Transformer Circuits with Edge Pruning") and
HAP (Gu et al. 2025, "Discovering Transformer Circuits via a Hybrid Attribution and Pruning
Framework", arXiv:2510.03282): methods `edge_pruning` and `hap`.

Edge Pruning
------------
Every edge e of the graph gets a hard-concrete gate (Louizos et al. 2018)
with a learned location log_alpha_e, stretch limits (l, r) = (-0.1, 1.1) and temperature
beta = 2/3:

    u ~ U(0, 1),  s = sigmoid((log u - log(1 - u) + log_alpha) / beta),
    z = clamp(s * (r - l) + l, 0, 1)                          (the sampled mask)
    P(z != 0) = sigmoid(log_alpha - beta * log(-l / r))      (its L0 expectation)

The masked model is condense.patching.run_graph with edge_mask = z: each receiver reads
z * clean + (1 - z) * ablated for each sender (`patching`: the corrupted prompt of the same
row, run in the same call). One u per edge per step, shared by the rows of the batch.

Sparsity s = the expected fraction of the graph's edges that are *removed*,
1 - sum_e P(z_e != 0) / n_edges, over all valid edges of the graph. The loss of a step is

    KL(P_full || P_masked) at the last position of each clean prompt (mean over rows)
    + lambda1 * (s - t) + lambda2 * (s - t)^2

where P_full is the original model's distribution (computed once, without gradients),
t ramps linearly from the start sparsity (0) to `ep_target_sparsity` over the first
`ep_ramp_fraction` of the steps and stays there, and lambda1, lambda2 (initially 0) are
*maximised* (gradient ascent, `maximize: True` in condense.optimize.fit), so that the
constraint s = t is enforced as a min-max Lagrangian. Only log_alpha and the lambdas train;
the model is frozen and in eval mode. log_alpha starts at `ep_init_log_alpha` (10) plus
N(0, 0.01^2) noise, i.e. every edge in (P(z != 0) = 1 - 1e-5).

The final binary circuit thresholds the masks to the learned sparsity: K = round(sum_e
P(z_e != 0)) edges, those with the largest log_alpha (the deterministic mask
clamp(sigmoid(log_alpha) * (r - l) + l, 0, 1) orders them the same way). The written
circuit is then Graph.prune()d (edges off every input -> logits path dropped; under
`patching` this changes no output: a node with no surviving input computes its corrupted
value, which is what its ablated edges carry). metrics.json has both counts: `edges_kept`
(K, the thresholding) and `edges` (on a path, docs/design.md §4).

HAP
---
Score every edge with EAP (`hap_attribution`, default `eap`: one forward + backward per
batch on the train rows), keep the top `hap_candidates` edges by |score| (or, when null,
the top `hap_candidate_fraction` of all edges; default 0.3, i.e. about six times the edges
a 0.95 target keeps: conservative), and run the same Edge Pruning with gates *only* on the
candidates. Every other edge is fixed off (mask 0, no parameter). Sparsity is still counted
over all edges of the graph, so targets are comparable with Edge Pruning: training starts
at s0 = 1 - n_candidates / n_edges, the target ramps from s0 to the same final t.

Where HAP's speed-up comes from (honest work saved, nothing else differs: same data, batch
size, learning rates, per-step cost, seed): the candidate set already meets most of the
sparsity. Edge Pruning's ramp moves the target from 0 to t in `ramp` steps; HAP keeps the
same ramp *rate* (sparsity per step), so its ramp from s0 to t takes ramp * (t - s0) / t
steps, followed by the same settle phase (ep_steps - ramp steps) at the target. With the
defaults (t = 0.95, ramp 0.8 of the steps, 30 % candidates) that is 0.8 * 0.263 + 0.2 =
0.41 of Edge Pruning's steps, plus the EAP pass. `hap_steps` overrides the count. A step
costs the same in both (one patched forward + backward of the whole model: run_graph does
not skip senders whose edges are all off), so the saving is in steps.

Known behaviour (measured by benchmarks/hap_vs_ep.py on the organism): the gates start
saturated (z = 1, no KL gradient), so under Adam they descend together at about lr per step
and can cross the active region at once, overshooting the target before the multiplier
reopens them. Two settings keep this in check: log-alphas are clamped to +-max(10, init)
(a gate thrown far past 10 has a sigmoid gradient of exactly 0 in float32 and never moves
again), and the gate lr is 0.1 (at 0.3 HAP kept 49 edges for a 24-edge target on induction).
HAP's start is harsher: its target ramps from s0 = 0.70 while its gates
cannot move (64 steps on IOI, the lambdas growing to |lambda| ~ 30), then the expected size
collapses from 144 to 24 edges in ~30 steps (steps 80-112), so which edges survive is
decided with little KL signal (yet gates started in their active range, log-alpha 3 or 1,
did no better, so this is not the whole cause). Over nine seeds HAP's test KL at the
target's edge count is 1.03x Edge Pruning's on IOI and 1.06x on induction (per seed
0.64-1.49; three seeds alone had given 1.34x on IOI), HAP fitting its own train rows less
tightly (2.2x on IOI) (docs/edge_pruning.md).

Departures from the papers' code: edge gates only (no node gates: Edge Pruning's own IOI
sweeps run with --disable_node_loss); a constant learning rate (fit has no warm-up
schedule; Edge Pruning warms the lr up over 200 of 3000 steps); fewer steps (CPU budget;
Edge Pruning ramps over 2500 of 3000 steps, our default ramp fraction 0.8 keeps that
shape); learning rates 0.1 for the log-alphas and 0.3 for the lambdas (Edge Pruning: 0.8 over
3000 steps; Adam moves a log-alpha about lr per step, so at 0.1 the first ~100 steps move the
saturated gates down together, and at 0.3 they overshoot, see above); the KL is read at the last position only (where the task metric is read, as the
heal step does), not over a span of positions.

Artifacts (docs/design.md §6; writes atomic, metrics.json last): circuit.json (MIB; `score` =
P(z != 0) of each edge, 0 for HAP's non-candidates; `in_graph` = the final circuit),
circuit.png, training.png (expected edges, target and KL per step), training.jsonl (the
logged steps), state/masks.safetensors (log_alpha [n_senders, n_receivers], -inf where no
gate), metrics.json. recipe.yaml is written by condense.runs. There is no adapter (the model is
frozen). A run is short, so it does not resume: rerunning starts over.

Data parallel (`runner.data_parallel`): every process draws the same batch indices and gate
noise from the same seeded generators and trains on its share of each batch
(condense.optimize.shard); fit averages the gradients, so N processes take the steps of one
(use an ep_batch_size divisible by N). Every process evaluates; only the main one writes.
"""
import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F

from condense.artifacts import atomic_write
from condense.config import RecipeError, RunConfig, at_least
from condense.evaluate import dataset_columns, evaluate
from condense.graph import Graph
from condense.metrics import eval_mode, kl_rows, last_logits, pad_batch
from condense.optimize import all_reduce_, fit, shard
from condense.methods import register
from condense.patching import run_graph
from condense.runs import RunContext, log, save_run

LIMIT_LEFT, LIMIT_RIGHT = -0.1, 1.1
TEMPERATURE = 2 / 3
EPS = 1e-6
INIT_STD = 0.01


# ------------------------------------------------------------------ hard-concrete gates
def sample_uniform(n, generator=None, dtype=torch.float32):
    """u ~ U(EPS, 1 - EPS), n values (kept off 0 and 1 so that log u and log(1 - u) are finite)."""
    return torch.rand(n, generator=generator, dtype=dtype) * (1 - 2 * EPS) + EPS


def hard_concrete(log_alpha, u):
    """The sampled mask z = clamp(sigmoid((log u - log(1-u) + log_alpha) / beta) * (r-l) + l, 0, 1)."""
    s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + log_alpha) / TEMPERATURE)
    return (s * (LIMIT_RIGHT - LIMIT_LEFT) + LIMIT_LEFT).clamp(0.0, 1.0)


def keep_probability(log_alpha):
    """P(z != 0) = sigmoid(log_alpha - beta * log(-l / r)), the gate's L0 expectation."""
    return torch.sigmoid(log_alpha - TEMPERATURE * math.log(-LIMIT_LEFT / LIMIT_RIGHT))


def deterministic_mask(log_alpha):
    """The gate without noise: clamp(sigmoid(log_alpha) * (r - l) + l, 0, 1)."""
    return (torch.sigmoid(log_alpha) * (LIMIT_RIGHT - LIMIT_LEFT) + LIMIT_LEFT).clamp(0.0, 1.0)


def lagrangian(sparsity, target, lambda1, lambda2):
    """lambda1 (s - t) + lambda2 (s - t)^2; the lambdas are maximised, the gates minimise it."""
    gap = sparsity - target
    return lambda1 * gap + lambda2 * gap * gap


class EdgeMasks:
    """Hard-concrete gates on the `trainable` edges of `graph` (default: every valid edge);
    every other entry of the [n_senders, n_receivers] mask is fixed at 0. The gates live on
    `device` (the model's, so that data-parallel all-reduces work on GPUs); the init noise is
    drawn on the CPU from `generator`. Masks for the Graph come back on the CPU."""

    def __init__(self, graph, trainable=None, init=10.0, generator=None, device="cpu"):
        self.shape = (graph.n_senders, graph.n_receivers)
        trainable = graph.valid if trainable is None else (trainable & graph.valid)
        self.index = torch.nonzero(trainable.flatten()).flatten().to(device)
        self.n_edges = int(graph.valid.sum())
        noise = torch.randn(len(self.index), generator=generator) * INIT_STD
        self.log_alpha = (init + noise).to(device).requires_grad_(True)

    @property
    def n_trainable(self):
        return len(self.index)

    def _scatter(self, values, fill=0.0):
        full = values.new_full((self.shape[0] * self.shape[1],), fill)
        return full.scatter(0, self.index, values).view(self.shape)

    def sample(self, u):
        """A sampled [S, R] mask (differentiable in log_alpha); u: n_trainable uniforms."""
        return self._scatter(hard_concrete(self.log_alpha, u))

    def deterministic(self):
        return self._scatter(deterministic_mask(self.log_alpha.detach())).cpu()

    def expected_kept(self):
        """Expected number of edges in the circuit (differentiable)."""
        return keep_probability(self.log_alpha).sum()

    def sparsity(self):
        """Expected fraction of the graph's edges removed, over ALL valid edges."""
        return 1.0 - self.expected_kept() / self.n_edges

    def learned_sparsity(self):
        """sparsity() as a float (no graph)."""
        with torch.no_grad():
            return float(self.sparsity())

    def n_kept(self):
        """K = round(expected kept edges): the size the learned sparsity asks for."""
        return min(round(float(self.expected_kept().detach())), self.n_trainable)

    def binary(self, k=None):
        """Bool [S, R]: the K gated edges with the largest log_alpha (ties: lower index);
        K = n_kept() (the learned sparsity) unless `k` is given."""
        k = self.n_kept() if k is None else min(int(k), self.n_trainable)
        order = torch.sort(self.log_alpha.detach(), descending=True, stable=True).indices[:k]
        flat = torch.zeros(self.shape[0] * self.shape[1], dtype=torch.bool)
        flat[self.index[order].cpu()] = True
        return flat.view(self.shape)

    def keep_scores(self):
        """P(z != 0) per edge as an [S, R] tensor (0 where there is no gate)."""
        return self._scatter(keep_probability(self.log_alpha.detach())).cpu()

    def full_log_alpha(self):
        return self._scatter(self.log_alpha.detach(), fill=float("-inf")).cpu()

    def circuit(self, graph, k=None):
        """A copy of `graph` with in_graph = the thresholded circuit (not yet pruned; `k`: see
        binary) and scores = P(z != 0)."""
        g = graph.copy()
        g.scores = self.keep_scores().float()
        g.in_graph = self.binary(k) & g.valid
        return g


# ------------------------------------------------------------------ schedule
LOG_ALPHA_BOUND = 10.0


def target_at(step, start, target, ramp_steps):
    """The sparsity target of `step`: linear from `start` to `target` over `ramp_steps`."""
    if ramp_steps <= 0 or step >= ramp_steps:
        return target
    return start + (target - start) * step / ramp_steps


def ep_schedule(cfg):
    """(steps, ramp steps) of Edge Pruning."""
    ramp = round(cfg.ep_steps * cfg.ep_ramp_fraction)
    return cfg.ep_steps, ramp


def hap_schedule(cfg, start_sparsity):
    """(steps, ramp steps) of HAP: Edge Pruning's ramp *rate* over the sparsity still to be
    learned (target - start), then Edge Pruning's settle phase; `hap_steps` overrides."""
    if cfg.hap_steps is not None:
        return cfg.hap_steps, round(cfg.hap_steps * cfg.ep_ramp_fraction)
    steps, ramp = ep_schedule(cfg)
    t = cfg.ep_target_sparsity
    left = min(max((t - start_sparsity) / t, 0.0), 1.0) if t > 0 else 0.0
    hap_ramp = round(ramp * left)
    return hap_ramp + (steps - ramp), hap_ramp


# ------------------------------------------------------------------ the objective
@torch.no_grad()
def full_logprobs(model, rows, batch_size):
    """The original model's last-position log-probs [N, V] on the clean prompts (KL target)."""
    cols, _ = dataset_columns(rows)
    seqs = [list(s) for s in cols["clean_ids"]]
    return F.log_softmax(last_logits(model, seqs, batch_size).float(), -1)


def kl_last(logits, target_logp):
    """Mean over rows of KL(P_target || softmax(logits)) ([B, V] each)."""
    logp = F.log_softmax(logits.float(), -1)
    return kl_rows(target_logp, logp).mean()


def train_masks(model, graph, masks, rows, target_logp, cfg, *, steps, ramp_steps,
                start_sparsity=0.0, means=None, desc="edge pruning", progress=True):
    """Edge Pruning's min-max training of `masks` (EdgeMasks) through condense.optimize.fit.
    Returns (history: logged steps, lambdas [2])."""
    cols, n = dataset_columns(rows)
    device = next(model.parameters()).device
    batch_gen = torch.Generator().manual_seed(int(cfg.seed))          # same batches for EP and HAP
    noise_gen = torch.Generator().manual_seed(int(cfg.seed) + 1)
    lambdas = torch.zeros(2, device=masks.log_alpha.device, requires_grad=True)
    target_final = max(cfg.ep_target_sparsity, start_sparsity)
    bs = min(cfg.ep_batch_size, n)
    every = max(1, steps // 200)
    history = []

    def loss_fn(step):
        idx = shard(torch.randperm(n, generator=batch_gen)[:bs].tolist())
        u = sample_uniform(masks.n_trainable, noise_gen).to(masks.log_alpha.device)
        clean, attn, lengths = pad_batch([list(cols["clean_ids"][i]) for i in idx])
        corrupted, _, _ = pad_batch([list(cols["corrupted_ids"][i]) for i in idx])
        logits = run_graph(model, graph, clean.to(device), corrupted.to(device), attn.to(device),
                           intervention=cfg.intervention, edge_mask=masks.sample(u), means=means,
                           logit_positions=(lengths - 1).to(device))
        kl = kl_last(logits, target_logp[idx].to(device)).to(masks.log_alpha.device)
        s = masks.sparsity()
        t = target_at(step, start_sparsity, target_final, ramp_steps)
        loss = kl + lagrangian(s, t, lambdas[0], lambdas[1])
        if step % every == 0 or step == steps - 1:  # the same steps on every process
            kl_all = float(all_reduce_(kl.detach().clone(), "mean"))  # the whole batch's KL
            history.append(dict(step=step, loss=float(loss.detach() - kl.detach()) + kl_all,
                                kl=kl_all, sparsity=float(s.detach()),
                                target=t, expected_edges=float(masks.expected_kept().detach()),
                                lambda1=float(lambdas[0].detach()),
                                lambda2=float(lambdas[1].detach())))
        return loss

    groups = [{"params": [masks.log_alpha], "lr": cfg.ep_lr},
              {"params": [lambdas], "lr": cfg.ep_lambda_lr, "maximize": True}]
    # log-alphas stay within +-max(10, init): a gate that Adam's momentum throws far past it
    # has a sigmoid gradient that underflows to exactly 0 in float32 and never moves again
    # (seen: HAP's gates overshot, reopened and then stayed at sparsity 0.70 for 350 steps)
    bound = max(LOG_ALPHA_BOUND, abs(float(cfg.ep_init_log_alpha)))

    def clamp(step, loss):
        with torch.no_grad():
            masks.log_alpha.clamp_(-bound, bound)

    with eval_mode(model):  # dropout off: the masks learn on the frozen model's own outputs
        fit(groups, loss_fn, steps, lr=cfg.ep_lr, weight_decay=0.0, desc=desc, progress=progress,
            after_step=clamp)
    return history, lambdas.detach()


# ------------------------------------------------------------------ EP and HAP searches
def candidate_count(cfg, n_edges):
    if cfg.hap_candidates is not None:
        return min(int(cfg.hap_candidates), n_edges)
    return max(1, min(n_edges, round(cfg.hap_candidate_fraction * n_edges)))


def hap_candidates(model, graph, rows, cfg, means=None, progress=True):
    """Bool [S, R]: the top edges by |attribution score| (graph.scores is filled)."""
    from condense.attribute import attribute
    attribute(model, graph, rows, cfg.hap_attribution, ig_steps=cfg.ig_steps,
              intervention=cfg.intervention, metric=cfg.metric, batch_size=cfg.batch_size,
              seed=cfg.seed, means=means, progress=progress, gp_step=cfg.gp_step)
    ranked = graph.copy()
    ranked.apply_topn(candidate_count(cfg, int(graph.valid.sum())))
    return ranked.in_graph.clone()


def search(model, rows, cfg, hap=False, means=None, progress=True):
    """Edge Pruning (or HAP) on `rows` (the train split). Returns a dict: circuit (pruned
    Graph), masks, history, lambdas, steps, ramp_steps, start_sparsity, n_candidates,
    candidates (bool [S, R] or None), scores (HAP's attribution), edges_kept, n_edges, and
    seconds: rank (HAP's attribution), train (the mask optimisation), search (everything,
    targets included; wall clock) and cpu (the same span in this process's CPU time, which
    other jobs on the machine disturb less)."""
    start, cpu_start = time.perf_counter(), time.process_time()
    graph = Graph.from_model(model)
    n_edges = int(graph.valid.sum())
    candidates, rank_seconds, scores = None, 0.0, None
    if hap:
        candidates = hap_candidates(model, graph, rows, cfg, means, progress)
        scores = graph.scores.clone()
        rank_seconds = time.perf_counter() - start
    target_logp = full_logprobs(model, rows, cfg.batch_size)
    gen = torch.Generator().manual_seed(int(cfg.seed) + 2)
    masks = EdgeMasks(graph, candidates, init=cfg.ep_init_log_alpha, generator=gen,
                      device=next(model.parameters()).device)
    start_sparsity = 1.0 - masks.n_trainable / n_edges if hap else 0.0
    steps, ramp = hap_schedule(cfg, start_sparsity) if hap else ep_schedule(cfg)
    t0 = time.perf_counter()
    history, lambdas = train_masks(model, graph, masks, rows, target_logp, cfg, steps=steps,
                                   ramp_steps=ramp, start_sparsity=start_sparsity, means=means,
                                   desc="hap" if hap else "edge pruning", progress=progress)
    train_seconds = time.perf_counter() - t0
    circuit = masks.circuit(graph)
    kept = circuit.count_edges()
    circuit.prune()
    return dict(circuit=circuit, masks=masks, history=history, lambdas=lambdas, steps=steps,
                ramp_steps=ramp, start_sparsity=start_sparsity, n_candidates=masks.n_trainable,
                candidates=candidates, scores=scores, edges_kept=kept, n_edges=n_edges,
                rank_seconds=rank_seconds, train_seconds=train_seconds,
                search_seconds=time.perf_counter() - start,
                cpu_seconds=time.process_time() - cpu_start)


# ------------------------------------------------------------------ recipe checks and runners
@dataclass
class EdgePruningConfig(RunConfig):
    """Edge Pruning's keys (the module docstring describes the search)."""
    method: str = field(default="edge_pruning", metadata={"help": "edge_pruning (this config's method)"})
    ep_steps: int = field(default=1000, metadata={
        "help": "AdamW steps of the mask training (hap: see hap_steps)"})
    ep_lr: float = field(default=0.1, metadata={
        "help": "learning rate of the hard-concrete log-alphas"})
    ep_lambda_lr: float = field(default=0.3, metadata={
        "help": "learning rate of the Lagrange multipliers (maximised)"})
    ep_target_sparsity: float = field(default=0.95, metadata={
        "help": "target fraction of the graph's edges REMOVED (expected, over "
                "all edges; 0.95 keeps 5 %)"})
    ep_ramp_fraction: float = field(default=0.8, metadata={
        "help": "fraction of ep_steps over which the target ramps linearly "
                "from 0 to ep_target_sparsity (then it stays there)"})
    ep_batch_size: int = field(default=32, metadata={
        "help": "train rows per mask-training step"})
    ep_init_log_alpha: float = field(default=10.0, metadata={
        "help": "initial log-alpha of every gate (plus N(0, 0.01^2) noise; "
                "10 = every edge on)"})

    def check(self):
        """Refuse values the search cannot use, before any model loads."""
        super().check()
        for key in ("ep_steps", "ep_batch_size"):
            at_least(self, key, 1)
        for key in ("ep_lr", "ep_lambda_lr"):
            at_least(self, key, 0, strict=True)
        if not 0.0 < self.ep_target_sparsity < 1.0:
            self._bad("ep_target_sparsity", "must lie in (0, 1) (the fraction of edges removed)")
        if not 0.0 <= self.ep_ramp_fraction <= 1.0:
            self._bad("ep_ramp_fraction", "must lie in [0, 1]")

    def _bad(self, key, why):
        raise RecipeError(f"recipe key {key!r}: {why}, got {getattr(self, key)!r}")


@dataclass
class HAPConfig(EdgePruningConfig):
    """HAP: Edge Pruning over the top edges of an attribution (its candidates)."""
    method: str = field(default="hap", metadata={"help": "hap (this config's method)"})
    hap_attribution: str = field(default="eap", metadata={
        "help": "attribution method that ranks the candidate edges (eap as in the HAP "
                "paper; any condense.attribute method)"})
    hap_candidates: Optional[int] = field(default=None, metadata={
        "help": "keep this many top edges by |attribution| as candidates (null: use "
                "hap_candidate_fraction)"})
    hap_candidate_fraction: float = field(default=0.3, metadata={
        "help": "candidate edges as a fraction of all edges, when hap_candidates is null"})
    hap_steps: Optional[int] = field(default=None, metadata={
        "help": "mask-training steps (null: Edge Pruning's ramp rate over the sparsity the "
                "candidates leave to learn, plus Edge Pruning's settle steps)"})

    def check(self):
        super().check()
        from condense.attribute import METHODS
        if self.hap_attribution not in METHODS:
            self._bad("hap_attribution", f"must be one of {', '.join(METHODS)}")
        if self.hap_candidates is not None and self.hap_candidates < 1:
            self._bad("hap_candidates", "must be >= 1 or null")
        if not 0.0 < self.hap_candidate_fraction <= 1.0:
            self._bad("hap_candidate_fraction", "must lie in (0, 1]")
        if self.hap_steps is not None and self.hap_steps < 1:
            self._bad("hap_steps", "must be >= 1 or null")


def plot_training(history, path, title):
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    steps = [h["step"] for h in history]
    ax.plot(steps, [h["expected_edges"] for h in history], color="tab:blue", label="expected edges")
    n = history[0]["expected_edges"] / max(1e-9, 1 - history[0]["sparsity"]) if history else 0
    ax.plot(steps, [(1 - h["target"]) * n for h in history], "--", color="tab:blue", label="target")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("edges", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(steps, [h["kl"] for h in history], color="tab:red", alpha=0.6)
    ax2.set_ylabel("KL (train batch)", color="tab:red")
    ax.legend(loc="upper right", fontsize=7)
    ax.set_title(title)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100), mode="wb")
    plt.close(fig)


def run(ctx: RunContext) -> dict:
    """The Edge Pruning or HAP run (the config's class says which); returns metrics.json's
    contents. Data parallel: every process trains on its share of each batch."""
    from safetensors.torch import save

    cfg, model, rows, means = ctx.cfg, ctx.model, ctx.rows, ctx.means
    hap = isinstance(cfg, HAPConfig)
    start = time.perf_counter()
    method = "hap" if hap else "edge_pruning"
    log(f"{method} {cfg.task}: target sparsity {cfg.ep_target_sparsity}")
    res = search(model, rows["train"], cfg, hap=hap, means=means)
    circuit, masks = res["circuit"], res["masks"]
    if hap:
        log(f"{cfg.hap_attribution}: {res['n_candidates']} candidate edges of {res['n_edges']} "
            f"in {res['rank_seconds']:.1f}s; start sparsity {res['start_sparsity']:.3f}")
    log(f"{res['steps']} steps (ramp {res['ramp_steps']}) in {res['train_seconds']:.1f}s; learned "
        f"sparsity {masks.learned_sparsity():.4f} -> {res['edges_kept']} edges, "
        f"{circuit.count_edges(on_path=True)} on a path")
    test = evaluate(model, circuit, rows["test"], intervention=cfg.intervention,
                    batch_size=cfg.batch_size, means=means)
    log(f"test: accuracy {test['accuracy']:.3f} (full {test['accuracy_full']:.3f}), KL "
        f"{test['kl']:.4f}, faithfulness {test['faithfulness']:.3f}")
    last = res["history"][-1]
    metrics = dict(
        method=method, task=cfg.task, model=cfg.model, intervention=cfg.intervention,
        target_sparsity=cfg.ep_target_sparsity, sparsity=masks.learned_sparsity(),
        edges_kept=res["edges_kept"], edges=circuit.count_edges(on_path=True),
        total_edges=res["n_edges"], n_gated=res["n_candidates"],
        start_sparsity=res["start_sparsity"], steps=res["steps"], ramp_steps=res["ramp_steps"],
        accuracy=test["accuracy"], top1=test["top1"], logit_diff=test["logit_diff"],
        kl=test["kl"], faithfulness=test["faithfulness"], accuracy_full=test["accuracy_full"],
        logit_diff_full=test["logit_diff_full"], logit_diff_empty=test["logit_diff_empty"],
        train_kl_last=last["kl"], lambda1=float(res["lambdas"][0]), lambda2=float(res["lambdas"][1]),
        rank_seconds=res["rank_seconds"], train_seconds=res["train_seconds"],
        search_seconds=res["search_seconds"], search_cpu_seconds=res["cpu_seconds"],
        wall_seconds=time.perf_counter() - start,
        n_train=len(rows["train"]), n_test=len(rows["test"]))
    if hap:
        metrics.update(hap_attribution=cfg.hap_attribution, n_candidates=res["n_candidates"])

    if ctx.is_main:  # data parallel: the main process writes
        os.makedirs(ctx.path("state"), exist_ok=True)
        atomic_write(ctx.path(os.path.join("state", "masks.safetensors")),
                     save({"log_alpha": masks.full_log_alpha().contiguous()}))
        atomic_write(ctx.path("training.jsonl"), "".join(json.dumps(h) + "\n" for h in res["history"]))
        plot_training(res["history"], ctx.path("training.png"),
                      f"{method} on {cfg.task}: expected edges and KL per step")
    return save_run(ctx, metrics, circuit)


register("edge_pruning", EdgePruningConfig, run, data_parallel=True,
         help="Edge Pruning: a hard-concrete gate per edge, trained to a target sparsity")
register("hap", HAPConfig, run, data_parallel=True,
         help="HAP: Edge Pruning over an attribution's top edges only")
