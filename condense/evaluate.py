"""Circuit metrics of docs/design.md §4 on a task dataset, through the exact edge-level forward.

For every row, at its last real position: the logit difference LD = logit[answer] -
logit[distractor] of the circuit C, of the full model (the plain HF model, adapter included)
and of the empty circuit (every edge ablated); accuracy (LD > 0), top-1, KL(P_full || P_C)
over the full vocabulary, and faithfulness (LD(C) - LD(∅)) / (LD(full) - LD(∅)) on the means.
Rows of different lengths are sorted by length and right-padded per batch.
"""
import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from condense.metrics import eval_mode, kl_rows, pad_batch
from condense.patching import run_graph


@dataclass
class EvalReference:
    """What does not depend on the circuit: full-model last-position logits [N, V] and the
    empty circuit's LD [N], for one dataset, intervention and ablation means. Reuse it across
    many circuits (e.g. CPR/CMD sweeps) with evaluate(..., reference=...). `ablated`, when
    kept, holds what removed edges carry (the corrupted run's sender values) for each batch of
    row_batches(batch_size): evaluate then skips the corrupted forward, about half of each
    evaluation, at the cost of keeping those values in memory."""
    full_logits: torch.Tensor
    empty_logit_diff: torch.Tensor
    intervention: str
    ablated: Optional[list] = None
    batch_size: Optional[int] = None


def dataset_columns(dataset):
    cols = {}
    for key in ("clean_ids", "corrupted_ids", "answer_id", "distractor_id"):
        cols[key] = list(dataset[key])
    n = len(cols["clean_ids"])
    for i in range(n):
        if len(cols["clean_ids"][i]) != len(cols["corrupted_ids"][i]):
            raise ValueError(f"row {i}: clean_ids and corrupted_ids differ in length")
    return cols, n


def rows_digest(*datasets) -> str:
    """A hash of the task rows (their token columns), to name what a resume file was made on."""
    import hashlib
    digest = hashlib.sha256()
    for dataset in datasets:
        digest.update(repr(dataset_columns(dataset)[0]).encode())
    return digest.hexdigest()


def row_batches(cols, n, batch_size, device):
    """(row indices, clean ids, corrupted ids, attention mask, last positions) by length."""
    order = sorted(range(n), key=lambda i: len(cols["clean_ids"][i]))
    for start in range(0, n, batch_size):
        idx = order[start:start + batch_size]
        clean, mask, lengths = pad_batch([list(cols["clean_ids"][i]) for i in idx])
        corrupted, _, _ = pad_batch([list(cols["corrupted_ids"][i]) for i in idx])
        yield idx, clean.to(device), corrupted.to(device), mask.to(device), (lengths - 1).to(device)


def _logit_diff(logits, cols, idx):
    answer = torch.tensor([int(cols["answer_id"][i]) for i in idx])
    distractor = torch.tensor([int(cols["distractor_id"][i]) for i in idx])
    logits = logits.float().cpu()
    return logits.gather(1, answer[:, None])[:, 0] - logits.gather(1, distractor[:, None])[:, 0], answer


@torch.no_grad()
def reference_outputs(model: torch.nn.Module, graph, dataset, intervention: str = "patching",
                      batch_size: int = 32, means=None, keep_ablated: bool = False) -> EvalReference:
    """The full model's last-position logits and the empty circuit's logit difference on
    `dataset`: what every circuit's metrics are measured against. keep_ablated: also keep the
    corrupted run of every batch for evaluate to reuse (sweeps over many circuits of one
    model whose weights do not change meanwhile; memory: every sender's output for every row
    and position)."""
    cols, n = dataset_columns(dataset)
    device = next(model.parameters()).device
    with eval_mode(model):
        full = [None] * n
        for idx, clean, _, mask, last in row_batches(cols, n, batch_size, device):
            logits = model(input_ids=clean, attention_mask=mask).logits
            logits = logits[torch.arange(len(idx), device=device), last].float().cpu()
            for j, i in enumerate(idx):
                full[i] = logits[j]
    empty, ablated = _empty_runs(model, graph, dataset, intervention, batch_size, means, keep_ablated)
    return EvalReference(torch.stack(full), empty, intervention, ablated,
                         batch_size if keep_ablated else None)


@torch.no_grad()
def empty_logit_diffs(model: torch.nn.Module, graph, dataset, intervention: str = "patching",
                      batch_size: int = 32, means=None) -> torch.Tensor:
    """The empty circuit's (every edge ablated) logit difference per row [N]: the half of
    reference_outputs that a model with new weights (an adapter) changes but a new circuit
    does not."""
    return _empty_runs(model, graph, dataset, intervention, batch_size, means, False)[0]


def _empty_runs(model, graph, dataset, intervention, batch_size, means, keep_ablated):
    """(the empty circuit's LD per row [N], each batch's ablated values or None)."""
    cols, n = dataset_columns(dataset)
    device = next(model.parameters()).device
    kept = [] if keep_ablated else None
    with eval_mode(model):
        empty = torch.zeros(n)
        nothing = torch.zeros(graph.n_senders, graph.n_receivers)
        for idx, clean, corrupted, mask, last in row_batches(cols, n, batch_size, device):
            run = run_graph(model, graph, clean, corrupted, mask, intervention=intervention,
                            edge_mask=nothing, means=means, logit_positions=last, return_run=True)
            empty[idx] = _logit_diff(run.logits, cols, idx)[0]
            if keep_ablated:
                kept.append(run.ablated)
    return empty, kept


@torch.no_grad()
def evaluate(model: torch.nn.Module, graph, dataset, intervention: str = "patching",
             batch_size: int = 32, *, means=None, edge_mask: Optional[torch.Tensor] = None,
             reference: Optional[EvalReference] = None, per_row: bool = False) -> dict:
    """Metrics of the circuit `graph` (or `edge_mask`) on `dataset` (a datasets.Dataset or a dict
    of lists with clean_ids, corrupted_ids, answer_id, distractor_id).

    Returns logit_diff, accuracy, top1, kl, faithfulness, top1_agreement (the circuit's top
    token is the full model's), choice_agreement (the circuit puts the answer above the
    distractor on the rows where the full model does, and below it on the others) of the
    circuit, logit_diff_full, accuracy_full, top1_full, logit_diff_empty, accuracy_empty, n;
    per_row=True adds per-row tensors. The model is evaluated in eval mode (its mode is
    restored afterwards)."""
    if reference is None:
        reference = reference_outputs(model, graph, dataset, intervention, batch_size, means)
    elif reference.intervention != intervention:
        raise ValueError(f"reference was computed for {reference.intervention!r}, not {intervention!r}")
    cols, n = dataset_columns(dataset)
    device = next(model.parameters()).device
    ld, kl = torch.zeros(n), torch.zeros(n)
    top1, agree = torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.bool)
    kept = reference.ablated if reference.batch_size == batch_size else None
    with eval_mode(model):
        for k, (idx, clean, corrupted, mask, last) in enumerate(row_batches(cols, n, batch_size, device)):
            logits = run_graph(model, graph, clean, corrupted, mask, intervention=intervention,
                               edge_mask=edge_mask, means=means, logit_positions=last,
                               ablated=kept[k] if kept is not None else None)
            ld[idx], answer = _logit_diff(logits, cols, idx)
            logits = logits.float().cpu()
            top1[idx] = logits.argmax(-1) == answer
            agree[idx] = logits.argmax(-1) == reference.full_logits[idx].argmax(-1)
            full_logp = F.log_softmax(reference.full_logits[idx], -1)
            kl[idx] = kl_rows(full_logp, F.log_softmax(logits, -1))

    ld_full, _ = _logit_diff(reference.full_logits, cols, range(n))
    answers = torch.tensor([int(a) for a in cols["answer_id"]])
    ld_empty = reference.empty_logit_diff
    denom = ld_full.mean() - ld_empty.mean()
    out = dict(
        logit_diff=ld.mean().item(), accuracy=(ld > 0).float().mean().item(),
        top1=top1.float().mean().item(), kl=kl.mean().item(),
        top1_agreement=agree.float().mean().item(),
        choice_agreement=((ld > 0) == (ld_full > 0)).float().mean().item(),
        faithfulness=((ld.mean() - ld_empty.mean()) / denom).item() if denom.abs() > 1e-12 else math.nan,
        logit_diff_full=ld_full.mean().item(), accuracy_full=(ld_full > 0).float().mean().item(),
        top1_full=(reference.full_logits.argmax(-1) == answers).float().mean().item(),
        logit_diff_empty=ld_empty.mean().item(), accuracy_empty=(ld_empty > 0).float().mean().item(),
        n=n)
    if per_row:
        out["per_row"] = dict(logit_diff=ld, logit_diff_full=ld_full, logit_diff_empty=ld_empty, kl=kl,
                              top1=top1, top1_agreement=agree)
    return out
