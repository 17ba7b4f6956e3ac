"""The gate (held-out accuracy, perplexity, the capability guards, and optionally faithfulness
and top-1 agreement against the original model) and the circuit metrics condensation reports."""
import math
from statistics import NormalDist

import torch

from condense import tasks
from condense.evaluate import (
    EvalReference,
    dataset_columns,
    empty_logit_diffs,
    evaluate,
    reference_outputs,
)
from condense.fidelity import FidelityConfig
from condense.full_model import OriginalOutputs, original
from condense.metrics import ACCURACY_EPS, perplexity

from .config import guarded_tasks
from .healing import adapter_state

# the guard reads second-source blocks other than the fidelity card's
CARD_TEXT_BLOCKS = FidelityConfig.text_blocks


class Gate:
    """Held-out checks against the original model (docs/design.md §5): the circuit's val
    accuracy holds, the empty circuit's (model with adapter, every edge ablated) does not
    (`gate_empty_fails`), general-text perplexity holds, and optionally faithfulness and
    top-1 agreement.

    What the gate measures of the model alone (its empty circuit's logit difference on val,
    general-text perplexity) depends on the adapter, not on the circuit, and a whole verdict
    depends on both: each is kept with an exact copy of the adapter (and circuit) it was
    measured for and reused while they are unchanged, e.g. for consecutive candidates
    accepted before healing, or the check after a heal that ended on an accepting check.

    The capability guards (`gate_tasks`, `gate_text_blocks`; they need the `tokenizer`) ask of
    the healed *full* model (adapter on, nothing ablated) what the circuit checks cannot: that
    it still does every task and still models text the heal never trains on. They depend on the
    adapter alone, so they are measured once per adapter, and only for a candidate that passes
    every other check (a rejected candidate never pays for them)."""

    def __init__(self, model, graph, rows_val, blocks, cfg, means=None, tokenizer=None):
        self.rows, self.blocks, self.cfg, self.means = rows_val, blocks, cfg, means
        self.reference = reference_outputs(model, graph, rows_val, cfg.intervention, cfg.batch_size,
                                           means)
        cols, n = dataset_columns(rows_val)
        ans = torch.tensor([int(a) for a in cols["answer_id"]])
        dis = torch.tensor([int(a) for a in cols["distractor_id"]])
        full = self.reference.full_logits
        ld = full.gather(1, ans[:, None])[:, 0] - full.gather(1, dis[:, None])[:, 0]
        self.accuracy_original = (ld > 0).float().mean().item()
        self.ppl_original = perplexity(model, blocks, cfg.batch_size) if blocks else math.nan
        self.guards = _guards(model, tokenizer, cfg)
        self._model_part = None  # (adapter, empty LD on val, general-text ppl)
        self._guard = None  # (adapter, guard fields)
        self._verdict = None  # (adapter, circuit edges, (ok, metrics), guards asked)

    def __call__(self, model, circuit, guards: bool = True):
        """(accepted, the gate's fields). guards=False leaves the capability guards out (the
        heal's early-stop checks: the round's own gate after the heal asks them)."""
        cfg = self.cfg
        adapter = adapter_state(model)
        if self._verdict is not None and _same(self._verdict[0], adapter) \
                and torch.equal(self._verdict[1], circuit.in_graph) and self._verdict[3] == guards:
            return self._verdict[2]
        if self._model_part is None or not _same(self._model_part[0], adapter):
            empty = empty_logit_diffs(model, circuit, self.rows, cfg.intervention, cfg.batch_size,
                                      self.means)
            ppl = perplexity(model, self.blocks, cfg.batch_size) if self.blocks else math.nan
            self._model_part = (adapter, empty, ppl)
        _, empty, ppl = self._model_part
        m = circuit_metrics(model, circuit, self.rows, self.reference, cfg, empty_logit_diff=empty,
                            means=self.means, per_row=True)
        ratio = ppl / self.ppl_original if self.blocks else 1.0
        floor = self.accuracy_original - cfg.gate_accuracy_tol - ACCURACY_EPS
        rows = m.pop("per_row")
        margin_low = paired_lower_bound(rows["logit_diff"] > 0, rows["logit_diff_full"] > 0,
                                        getattr(cfg, "gate_confidence", 0.0))
        ok_acc = m["accuracy"] >= floor and (
            not getattr(cfg, "gate_confidence", 0.0) or margin_low >= -cfg.gate_accuracy_tol - ACCURACY_EPS)
        # an adapter can learn to answer from the corrupted run itself; then the circuit's
        # edges carry nothing and the verifier's verdicts on its subsets are vacuous
        ok_empty = not cfg.gate_empty_fails or m["accuracy_empty"] < floor
        ok_ppl = bool(ratio <= cfg.gate_ppl_ratio)
        ok_f = cfg.gate_faithfulness <= 0 or bool(m["faithfulness"] >= cfg.gate_faithfulness)
        ok_top1 = (cfg.gate_top1_agreement <= 0
                   or bool(m["top1_agreement"] >= cfg.gate_top1_agreement - ACCURACY_EPS))
        ok = ok_acc and ok_empty and ok_ppl and ok_f and ok_top1
        f_off, floor_off = math.nan, getattr(cfg, "gate_adapter_off_faithfulness", 0.0)
        if ok and floor_off > 0:  # the circuit on the original weights, against the original
            with original(model):
                f_off = evaluate(model, circuit, self.rows, cfg.intervention, cfg.batch_size,
                                 reference=self.reference, means=self.means)["faithfulness"]
            ok = bool(f_off >= floor_off)
        guard = _NO_GUARD
        if ok and guards and self.guards is not None:
            if self._guard is None or not _same(self._guard[0], adapter):
                self._guard = (adapter, self._check_guards(model))
            guard = self._guard[1]
            ok = guard["gate_tasks"] and guard["gate_text"]
        verdict = ok, dict(
            accuracy=m["accuracy"], accuracy_empty=m["accuracy_empty"], ppl_ratio=ratio,
            kl=m["kl"], top1_agreement=m["top1_agreement"], faithfulness=m["faithfulness"],
            accuracy_margin_low=margin_low, adapter_off_faithfulness=f_off, gate_accuracy=ok_acc,
            gate_adapter_off=not floor_off or bool(f_off >= floor_off),
            gate_empty=ok_empty, gate_ppl=ok_ppl, gate_faithfulness=ok_f, gate_top1=ok_top1, **guard)
        self._verdict = (adapter, circuit.in_graph.clone(), verdict, guards)
        return verdict


    def _check_guards(self, model) -> dict:
        """The healed full model against the original on the guarded tasks and the text."""
        cfg = self.cfg
        tol = cfg.gate_task_tol if cfg.gate_task_tol is not None else cfg.gate_accuracy_tol
        c = self.guards.compare(model, tol, cfg.gate_task_kl or None)
        broken = sorted(t for t, r in c["tasks"].items() if r.get("broken"))
        drops = [r["drop"] for r in c["tasks"].values() if "drop" in r]
        text = c.get("text")
        text_ratio = text["ppl_ratio"]["value"] if text else math.nan
        max_ratio = cfg.gate_text_ppl_ratio if cfg.gate_text_ppl_ratio is not None else cfg.gate_ppl_ratio
        return dict(gate_tasks=not broken, gate_text=not text or bool(text_ratio <= max_ratio),
                    broken_tasks=",".join(broken), task_drop_max=max(drops) if drops else math.nan,
                    task_kl_max=max((r["kl"]["value"] for r in c["tasks"].values() if "kl" in r),
                                    default=math.nan),
                    text_ppl_ratio=text_ratio)


# the guard fields of a verdict whose guards were not asked (off, or another check failed)
_NO_GUARD = dict(gate_tasks=True, gate_text=True, broken_tasks="", task_drop_max=math.nan,
                 task_kl_max=math.nan, text_ppl_ratio=math.nan)


def _guards(model, tokenizer, cfg):
    """The original's outputs the capability guards compare with (None when both are off)."""
    names = guarded_tasks(getattr(cfg, "gate_tasks", "none"))
    text_blocks = getattr(cfg, "gate_text_blocks", 0)
    if tokenizer is None or not (names or text_blocks):
        return None
    return OriginalOutputs(model, tokenizer, names, "val", cfg.gate_task_rows, cfg.seed, cfg.batch_size,
                           text_blocks=text_blocks, text_path=cfg.gate_text_path,
                           text_exclude=CARD_TEXT_BLOCKS)


def _same(a: dict, b: dict) -> bool:
    """Two adapter states (name -> tensor) hold exactly the same values."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def paired_lower_bound(circuit_right: torch.Tensor, original_right: torch.Tensor,
                       confidence: float) -> float:
    """One-sided lower bound at `confidence` on mean(circuit right - original right) over the
    same rows (normal approximation of the paired difference; the point estimate at 0)."""
    d = circuit_right.double() - original_right.double()
    mean = float(d.mean())
    if not confidence or len(d) < 2:
        return mean
    z = NormalDist().inv_cdf(confidence)
    return mean - z * float(d.std(unbiased=True)) / math.sqrt(len(d))


def circuit_metrics(model, circuit, rows, original_ref, cfg, empty_logit_diff=None, means=None,
                    per_row=False):
    """evaluate() against the ORIGINAL model: KL, faithfulness and top-1 agreement use the
    original full logits; the empty circuit is the current model's (adapter included; pass
    its per-row logit difference if it is known already). `means`: what removed edges carry
    under mean ablation (the original model's sender means, condense.means)."""
    if empty_logit_diff is None:
        empty_logit_diff = empty_logit_diffs(model, circuit, rows, cfg.intervention, cfg.batch_size,
                                             means)
    ref = EvalReference(original_ref.full_logits, empty_logit_diff, cfg.intervention)
    return evaluate(model, circuit, rows, cfg.intervention, cfg.batch_size, reference=ref, means=means,
                    per_row=per_row)


def template_split_metrics(model, circuit, rows, original_ref, cfg, means=None):
    """Test accuracy (circuit and original) and the circuit's top-1 agreement with the original
    on the rows of templates seen in training and of held-out templates, where a task has both
    (IOI): the gate's val rows have no held-out template, so this is where a circuit that fits
    its templates shows it. {} otherwise."""
    out = {}
    for name, idx in tasks.template_parts(rows).items():
        ref = EvalReference(original_ref.full_logits[idx], original_ref.empty_logit_diff[idx],
                            original_ref.intervention)
        m = evaluate(model, circuit, rows.select(idx), cfg.intervention, cfg.batch_size,
                     reference=ref, means=means)
        out[f"accuracy_{name}_templates"] = m["accuracy"]
        out[f"accuracy_original_{name}_templates"] = m["accuracy_full"]
        out[f"top1_agreement_{name}_templates"] = m["top1_agreement"]
    return out
