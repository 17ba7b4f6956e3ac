"""The gate (held-out accuracy, perplexity and optionally faithfulness against the original
model) and the circuit metrics condensation reports."""
import math

import torch

from condense import tasks
from condense.evaluate import (
    EvalReference,
    dataset_columns,
    evaluate,
    reference_outputs,
)
from condense.metrics import ACCURACY_EPS, pad_batch, perplexity
from condense.patching import run_graph


class Gate:
    """Held-out checks against the original model (docs/design.md §5)."""

    def __init__(self, model, graph, rows_val, blocks, cfg):
        self.rows, self.blocks, self.cfg = rows_val, blocks, cfg
        self.reference = reference_outputs(model, graph, rows_val, cfg.intervention, cfg.batch_size)
        cols, n = dataset_columns(rows_val)
        ans = torch.tensor([int(a) for a in cols["answer_id"]])
        dis = torch.tensor([int(a) for a in cols["distractor_id"]])
        full = self.reference.full_logits
        ld = full.gather(1, ans[:, None])[:, 0] - full.gather(1, dis[:, None])[:, 0]
        self.accuracy_original = (ld > 0).float().mean().item()
        self.ppl_original = perplexity(model, blocks, cfg.batch_size) if blocks else math.nan

    def __call__(self, model, circuit):
        cfg = self.cfg
        m = circuit_metrics(model, circuit, self.rows, self.reference, cfg)
        ppl = perplexity(model, self.blocks, cfg.batch_size) if self.blocks else math.nan
        ratio = ppl / self.ppl_original if self.blocks else 1.0
        ok_acc = m["accuracy"] >= self.accuracy_original - cfg.gate_accuracy_tol - ACCURACY_EPS
        ok_ppl = bool(ratio <= cfg.gate_ppl_ratio)
        ok_f = cfg.gate_faithfulness <= 0 or bool(m["faithfulness"] >= cfg.gate_faithfulness)
        return ok_acc and ok_ppl and ok_f, dict(
            accuracy=m["accuracy"], ppl_ratio=ratio, kl=m["kl"], faithfulness=m["faithfulness"],
            gate_accuracy=ok_acc, gate_ppl=ok_ppl, gate_faithfulness=ok_f)


def circuit_metrics(model, circuit, rows, original_ref, cfg):
    """evaluate() against the ORIGINAL model: KL and faithfulness use the original full
    logits; the empty circuit is the current model's (adapter included)."""
    own = reference_outputs(model, circuit, rows, cfg.intervention, cfg.batch_size)
    ref = EvalReference(original_ref.full_logits, own.empty_logit_diff, cfg.intervention)
    m = evaluate(model, circuit, rows, cfg.intervention, cfg.batch_size, reference=ref)
    m["top1_agreement"] = top1_agreement(model, circuit, rows, original_ref.full_logits, cfg)
    return m


def template_split_accuracy(model, circuit, rows, original_ref, cfg):
    """Test accuracy (circuit and original) on the rows of templates seen in training and of
    held-out templates, where a task has both (IOI): the gate's val rows have no held-out
    template, so this is where a circuit that fits its templates shows it. {} otherwise."""
    out = {}
    for name, idx in tasks.template_parts(rows).items():
        ref = EvalReference(original_ref.full_logits[idx], original_ref.empty_logit_diff[idx],
                            original_ref.intervention)
        m = evaluate(model, circuit, rows.select(idx), cfg.intervention, cfg.batch_size,
                     reference=ref)
        out[f"accuracy_{name}_templates"] = m["accuracy"]
        out[f"accuracy_original_{name}_templates"] = m["accuracy_full"]
    return out


@torch.no_grad()
def top1_agreement(model, circuit, rows, original_logits, cfg):
    cols, n = dataset_columns(rows)
    device = next(model.parameters()).device
    agree = 0
    order = sorted(range(n), key=lambda i: len(cols["clean_ids"][i]))
    was = model.training
    model.eval()
    for start in range(0, n, cfg.batch_size):
        idx = order[start:start + cfg.batch_size]
        clean, mask, lengths = pad_batch([list(cols["clean_ids"][i]) for i in idx])
        corrupted, _, _ = pad_batch([list(cols["corrupted_ids"][i]) for i in idx])
        logits = run_graph(model, circuit, clean.to(device), corrupted.to(device), mask.to(device),
                           intervention=cfg.intervention, logit_positions=(lengths - 1).to(device))
        agree += int((logits.float().argmax(-1).cpu() == original_logits[idx].argmax(-1)).sum())
    model.train(was)
    return agree / n
