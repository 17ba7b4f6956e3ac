"""Edge Pruning's and HAP's searches: the sparsity schedules, the min-max training of the masks
against the KL to the original model, and HAP's attribution-ranked candidate edges (the
package docstring describes both searches)."""
import time

import torch
import torch.nn.functional as F

from condense.evaluate import dataset_columns
from condense.graph import Graph
from condense.methods.edge_pruning.masks import EdgeMasks, lagrangian, sample_uniform
from condense.metrics import eval_mode, kl_rows, last_logits, pad_batch
from condense.optimize import FitState, all_reduce_, fit, shard
from condense.patching import run_graph

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
                start_sparsity=0.0, means=None, desc="edge pruning", progress=True,
                state=None):
    """Edge Pruning's min-max training of `masks` (EdgeMasks) through condense.optimize.fit.
    Returns (history: logged steps, lambdas [2]). state (condense.optimize.FitState): save the
    training there as it goes, and go on from it; its batch and noise draws and its history
    are saved too."""
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

    if state is not None:
        state.generators.update(batch=batch_gen, noise=noise_gen)
        state.logs.update(history=history)
    with eval_mode(model):  # dropout off: the masks learn on the frozen model's own outputs
        fit(groups, loss_fn, steps, lr=cfg.ep_lr, weight_decay=0.0, desc=desc, progress=progress,
            after_step=clamp, state=state)
    return history, lambdas.detach()


# ------------------------------------------------------------------ EP and HAP searches
def candidate_count(cfg, n_edges):
    if cfg.hap_candidates is not None:
        return min(int(cfg.hap_candidates), n_edges)
    return max(1, min(n_edges, round(cfg.hap_candidate_fraction * n_edges)))


def hap_start_sparsity(cfg, n_edges):
    """HAP's sparsity before its first step: every edge outside its candidates is off."""
    return 1.0 - candidate_count(cfg, n_edges) / n_edges


def hap_candidates(model, graph, rows, cfg, means=None, progress=True):
    """Bool [S, R]: the top edges by |attribution score| (graph.scores is filled)."""
    from condense.attribute import attribute
    attribute(model, graph, rows, cfg.hap_attribution, ig_steps=cfg.ig_steps,
              intervention=cfg.intervention, metric=cfg.metric, batch_size=cfg.batch_size,
              seed=cfg.seed, means=means, progress=progress, gp_step=cfg.gp_step)
    ranked = graph.copy()
    ranked.apply_topn(candidate_count(cfg, int(graph.valid.sum())))
    return ranked.in_graph.clone()


def search(model, rows, cfg, hap=False, means=None, progress=True, state_path=None):
    """Edge Pruning (or HAP) on `rows` (the train split). Returns a dict: circuit (pruned
    Graph), masks, history, lambdas, steps, ramp_steps, start_sparsity, n_candidates,
    candidates (bool [S, R] or None), scores (HAP's attribution), edges_kept, n_edges, and
    seconds: rank (HAP's attribution), train (the mask optimisation), search (everything,
    targets included; wall clock) and cpu (the same span in this process's CPU time, which
    other jobs on the machine disturb less), and resumed_at (the mask training's first step
    when it went on from a save at `state_path`; else 0). A resumed search's train, search and
    cpu seconds add what earlier processes spent on the saved steps (resumed_seconds; the
    ranking is done again, and counted once)."""
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
    start_sparsity = hap_start_sparsity(cfg, n_edges) if hap else 0.0
    steps, ramp = hap_schedule(cfg, start_sparsity) if hap else ep_schedule(cfg)
    t0 = time.perf_counter()
    state = FitState(state_path) if state_path else None
    history, lambdas = train_masks(model, graph, masks, rows, target_logp, cfg, steps=steps,
                                   ramp_steps=ramp, start_sparsity=start_sparsity, means=means,
                                   desc="hap" if hap else "edge pruning", progress=progress,
                                   state=state)
    resumed_at = state.resumed_at if state else 0
    earlier, earlier_cpu = (state.earlier_seconds, state.earlier_cpu_seconds) if state else (0.0, 0.0)
    train_seconds = earlier + time.perf_counter() - t0
    circuit = masks.circuit(graph)
    kept = circuit.count_edges()
    circuit.prune()
    return dict(circuit=circuit, masks=masks, history=history, lambdas=lambdas, steps=steps,
                ramp_steps=ramp, start_sparsity=start_sparsity, n_candidates=masks.n_trainable,
                candidates=candidates, scores=scores, edges_kept=kept, n_edges=n_edges,
                rank_seconds=rank_seconds, train_seconds=train_seconds, resumed_at=resumed_at,
                resumed_seconds=earlier, search_seconds=earlier + time.perf_counter() - start,
                cpu_seconds=earlier_cpu + time.process_time() - cpu_start)
