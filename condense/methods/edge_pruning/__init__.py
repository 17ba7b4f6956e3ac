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
frozen). state/training.pt (condense.optimize.FitState) holds the mask training while it runs:
rerunning an interrupted run goes on from its last save and ends as an uninterrupted one.

Data parallel (`runner.data_parallel`): every process draws the same batch indices and gate
noise from the same seeded generators and trains on its share of each batch
(condense.optimize.shard); fit averages the gradients, so N processes take the steps of one
(use an ep_batch_size divisible by N). Every process evaluates; only the main one writes.
"""
from condense.methods.edge_pruning.masks import (
    EPS, INIT_STD, LIMIT_LEFT, LIMIT_RIGHT, TEMPERATURE, EdgeMasks, deterministic_mask,
    hard_concrete, keep_probability, lagrangian, sample_uniform)
from condense.methods.edge_pruning.search import (
    LOG_ALPHA_BOUND, candidate_count, ep_schedule, full_logprobs, hap_candidates, hap_schedule,
    hap_start_sparsity, kl_last, search, target_at, train_masks)
from condense.methods.edge_pruning.method import (  # registers edge_pruning, hap
    EdgePruningConfig, HAPConfig, plot_training, run)

__all__ = ["EPS", "INIT_STD", "LIMIT_LEFT", "LIMIT_RIGHT", "TEMPERATURE", "EdgeMasks",
           "deterministic_mask", "hard_concrete", "keep_probability", "lagrangian", "sample_uniform",
           "LOG_ALPHA_BOUND", "candidate_count", "ep_schedule", "full_logprobs", "hap_candidates",
           "hap_schedule", "hap_start_sparsity", "kl_last", "search", "target_at", "train_masks",
           "EdgePruningConfig", "HAPConfig", "plot_training", "run"]
