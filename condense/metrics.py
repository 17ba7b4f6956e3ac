"""Metrics of docs/design.md §4 on plain (unpatched) models: logit difference at the last
position, accuracy, top-1, and perplexity on general text."""
import contextlib
import math

import torch
import torch.nn.functional as F

# Accuracies are float32 means over rows. Comparisons of an accuracy with another minus a
# tolerance allow this much, so that 93/100 against 98/100 - 0.05 passes (in float32 it is
# 0.93 < 0.98 - 0.05; a SmolLM2 condensation rejected a 46-edge circuit on that).
ACCURACY_EPS = 1e-6


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module):
    """The model in eval mode inside (no dropout while measuring or while masks learn on frozen
    weights), the caller's mode restored after."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def kl_rows(target_logp: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """KL(P_target || P) per row, summed over the last (vocabulary) dimension, from
    log-probabilities: the distillation loss of heal and Edge Pruning and the KL evaluation
    reports."""
    return F.kl_div(logp, target_logp, reduction="none", log_target=True).sum(-1)


def pad_batch(seqs, pad_id=0):
    """Right-pad lists of ids; returns ids [B, T], attention mask [B, T] and lengths [B]."""
    lengths = torch.tensor([len(s) for s in seqs])
    ids = torch.full((len(seqs), int(lengths.max())), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.as_tensor(s)
    mask = torch.arange(ids.shape[1])[None] < lengths[:, None]
    return ids, mask.long(), lengths


@torch.no_grad()
def last_logits(model, seqs, batch_size=64, forward=None):
    """Logits at the last real position of each sequence, [N, vocab], in input order.

    Rows are sorted by length so that a batch pads little; right padding under a causal
    mask leaves every real position unchanged. `forward(ids, mask)` may replace the plain
    model call (e.g. with an ablation hook); it returns logits [B, T, V]."""
    device = next(model.parameters()).device
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    out = [None] * len(seqs)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        ids, mask, lengths = pad_batch([seqs[i] for i in idx])
        ids, mask = ids.to(device), mask.to(device)
        logits = forward(ids, mask) if forward else model(input_ids=ids, attention_mask=mask).logits
        last = logits[torch.arange(len(idx), device=device), (lengths - 1).to(device)].float()
        for j, i in enumerate(idx):
            out[i] = last[j].cpu()
    return torch.stack(out)


def logit_diff_stats(logits, rows):
    """Per-row logit difference, accuracy (LD > 0) and top-1 (= answer)."""
    answer = torch.as_tensor(rows["answer_id"])
    distractor = torch.as_tensor(rows["distractor_id"])
    ld = logits.gather(1, answer[:, None])[:, 0] - logits.gather(1, distractor[:, None])[:, 0]
    return dict(logit_diff=ld.mean().item(), accuracy=(ld > 0).float().mean().item(),
                top1=(logits.argmax(-1) == answer).float().mean().item(), per_row=ld)


def task_scores(model, rows, batch_size=64, forward=None):
    """Clean and corrupted logit-difference stats of a task dataset on a plain model."""
    clean = logit_diff_stats(last_logits(model, rows["clean_ids"], batch_size, forward), rows)
    corrupted = logit_diff_stats(last_logits(model, rows["corrupted_ids"], batch_size, forward), rows)
    return dict(clean=clean, corrupted=corrupted)


@torch.no_grad()
def block_losses(model, blocks, batch_size=16) -> torch.Tensor:
    """Mean next-token cross-entropy of each block of ids [N] (float64), in eval mode: what a
    perplexity averages, kept per block so that a ratio of two models' perplexities on the same
    blocks can carry a bootstrap interval over blocks (condense.intervals)."""
    device = next(model.parameters()).device
    out = []
    with eval_mode(model):
        for start in range(0, len(blocks), batch_size):
            ids = torch.as_tensor(blocks[start:start + batch_size], device=device)
            logits = model(input_ids=ids).logits[:, :-1].float()
            loss = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
            out.append(loss.double().mean(-1).cpu())
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.float64)


@torch.no_grad()
def perplexity(model, blocks, batch_size=16):
    """exp(mean next-token cross-entropy) over equal-length blocks of ids, in eval mode."""
    device = next(model.parameters()).device
    total, count = 0.0, 0
    with eval_mode(model):
        for start in range(0, len(blocks), batch_size):
            ids = torch.as_tensor(blocks[start:start + batch_size], device=device)
            logits = model(input_ids=ids).logits[:, :-1].float()
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                                   reduction="sum")
            total, count = total + loss.item(), count + ids[:, 1:].numel()
    return math.exp(total / count)
