"""The healed full model (adapter on, nothing ablated) against the original: on every task and on
text from a second source. Both the gate's capability guards (condensation) and the fidelity
card (condense.fidelity) read it from here; the original's side is measured once, with the
adapter off, and compared with each adapter the caller brings.

A condensation heal distils the circuit to the original on one task; nothing in that loss says
the *full* model must still do that task, or the other five. The shipped agreement_fp32 adapter
is the case: its circuit passed every gate while its full model fell from 0.95 to 0.31 on
agreement (docs/fidelity.md).
"""
import math
from typing import Optional

import torch
import torch.nn.functional as F

from . import tasks
from .intervals import bootstrap, proportion
from .metrics import block_losses, kl_rows, last_logits


def original(model):
    """Context in which `model` is the original: a PeftModel with its adapter off."""
    from contextlib import nullcontext
    return model.disable_adapter() if getattr(model, "peft_config", None) else nullcontext()


def load_rows(task: str, tokenizer, split: str, n: int, seed: int):
    """`n` rows of `split`, or as many as the split has when it has fewer (stated by len)."""
    try:
        return tasks.load_task(task, tokenizer, split, n=n, seed=seed)
    except ValueError:
        if n <= 16:
            raise
        return load_rows(task, tokenizer, split, n // 2, seed)


def logit_diffs(logits: torch.Tensor, rows) -> torch.Tensor:
    """Answer minus distractor logit of each row, from last-position logits [N, V]."""
    answer = torch.as_tensor(rows["answer_id"])
    distractor = torch.as_tensor(rows["distractor_id"])
    return logits.gather(1, answer[:, None])[:, 0] - logits.gather(1, distractor[:, None])[:, 0]


class OriginalOutputs:
    """The original model's last-position logits on `n` rows of `split` of each task in `names`
    and its per-block losses on second-source text, measured once (adapter off)."""

    def __init__(self, model, tokenizer, names, split: str, n: int, seed: int, batch_size: int,
                 text_blocks: int = 0, text_block_size: int = 128, text_path: str = tasks.SECOND_SOURCE,
                 text_exclude: int = 0):
        self.batch_size, self.tasks, self.unposable = batch_size, {}, {}
        with original(model):
            for task in names:
                try:
                    rows = load_rows(task, tokenizer, split, n, seed)
                except ValueError as e:  # a task this tokenizer cannot pose (names of several tokens)
                    self.unposable[task] = str(e)
                    continue
                self.tasks[task] = (rows, last_logits(model, rows["clean_ids"], batch_size))
            self.blocks, self.text_loss = [], None
            if text_blocks:
                self.blocks = list(tasks.second_source_text(tokenizer, text_blocks, text_block_size,
                                                            text_path, exclude=text_exclude)["input_ids"])
                self.text_loss = block_losses(model, self.blocks, batch_size)
        self.text_path, self.text_block_size = text_path, text_block_size

    def compare(self, model, accuracy_tol: float, kl_max: Optional[float] = None) -> dict:
        """The current model (adapter on) against the original: per task accuracy (with the
        drop), KL, top-1 and choice agreement, each with its 95 % interval, and whether it
        breaks the task (accuracy drop beyond `accuracy_tol`, or mean KL above `kl_max`); and
        the second-source perplexity ratio (model / original) with its interval."""
        out = dict(tasks={}, accuracy_tol=accuracy_tol, kl_max=kl_max)
        for task, error in self.unposable.items():
            out["tasks"][task] = dict(error=error)
        for task, (rows, orig) in self.tasks.items():
            healed = last_logits(model, rows["clean_ids"], self.batch_size)
            ld, ld_o = logit_diffs(healed, rows), logit_diffs(orig, rows)
            acc, acc_o = proportion(ld > 0), proportion(ld_o > 0)
            kl = bootstrap(kl_rows(F.log_softmax(orig.float(), -1), F.log_softmax(healed.float(), -1)))
            drop = acc_o["value"] - acc["value"]
            out["tasks"][task] = dict(
                n=len(rows), accuracy=acc, accuracy_original=acc_o, drop=drop, kl=kl,
                top1_agreement=proportion(healed.argmax(-1) == orig.argmax(-1)),
                choice_agreement=proportion((ld > 0) == (ld_o > 0)),
                broken=bool(drop > accuracy_tol + 1e-9 or (kl_max is not None and kl["value"] > kl_max)))
        if self.text_loss is not None:
            loss = block_losses(model, self.blocks, self.batch_size)
            ratio = bootstrap([loss, self.text_loss], lambda a, b: math.exp(float(a.mean() - b.mean())))
            out["text"] = dict(source=self.text_path, blocks=len(self.blocks),
                               tokens=len(self.blocks) * self.text_block_size,
                               ppl=math.exp(float(loss.mean())), ppl_original=math.exp(float(self.text_loss.mean())),
                               ppl_ratio=ratio)
        return out
