"""verify's resume state: the running sums of a long subset evaluation, saved now and then, so
that an interrupted `condense verify` goes on where it stopped instead of starting over.

SubsetEvaluator.mean_logit_diffs works in units of (prompt batch, chunk of subsets), always in
the same order, and adds each unit's logit differences and correct counts into two sums. Those
sums and the number of units done are all it needs to go on: a resumed evaluation skips the
units already done and ends with the same sums, bit for bit (float64, added in the same order).
"""
import hashlib
import os
import sys
import time
from typing import Optional

import torch

from condense.artifacts import ResumeFile

STATE_FILE = "verify_state.pt"  # in the folder verify writes to, until verify.json is written
SAVE_EVERY = 60.0  # seconds between saves: a save costs two float64 vectors of the subsets


def run_state_key(run, **settings) -> str:
    """What a run's verify sums depend on besides the subsets: the circuit and the adapter as
    saved (their files' sizes and times) and `settings` (model, rows, ablation, dtype, ...).
    The criterion and threshold stay out: they judge the sums, so a resumed run may change them."""
    from condense.runs import ADAPTER_WEIGHTS
    files = [run.circuit_path] + [os.path.join(run.path, f) for f in ADAPTER_WEIGHTS]
    stamps = {os.path.basename(f): (os.path.getsize(f), os.stat(f).st_mtime_ns)
              for f in files if os.path.exists(f)}
    return repr((sorted(stamps.items()), sorted((k, str(v)) for k, v in settings.items())))


class SubsetSums:
    """Where an evaluation's sums are kept between runs (a torch file at `path`) and what they
    are sums of: `key` (the caller's words for the model, adapter, rows and intervention)
    hashed with the subsets and the evaluator's own settings. Saved atomically at most every
    `every` seconds (SAVE_EVERY) and when the evaluation ends; a file of other subsets or
    another key is ignored (and overwritten), so a changed command starts over."""

    def __init__(self, path: str, key: str, every: Optional[float] = None, clock=time.monotonic):
        self.path, self.key = path, key
        self.file = ResumeFile(path, SAVE_EVERY if every is None else every, "verify: ", clock)
        self.digest: Optional[str] = None

    def start(self, subsets: torch.Tensor, settings: str) -> tuple[int, torch.Tensor, torch.Tensor]:
        """(units already done, logit-difference sums, correct counts) for these subsets: from
        the file when it holds this very evaluation, else nothing done."""
        h = hashlib.sha1(self.key.encode())
        h.update(settings.encode())
        h.update(str(tuple(subsets.shape)).encode() + str(subsets.dtype).encode())
        h.update(subsets.detach().cpu().contiguous().numpy().tobytes())
        self.digest = h.hexdigest()
        state = self.file.read(self.digest)
        if state is None:
            n = subsets.shape[0]
            return 0, torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
        print(f"verify: going on from {self.path} ({int(state['units'])} passes done before)",
              file=sys.stderr, flush=True)
        return int(state["units"]), state["totals"].clone(), state["correct"].clone()

    def update(self, units: int, totals: torch.Tensor, correct: torch.Tensor,
               final: bool = False) -> None:
        """Save the sums after `units` units when `every` seconds have passed, or when final."""
        if self.file.due(final):
            self.file.write(dict(key=self.digest, units=units, totals=totals.clone(),
                                 correct=correct.clone()))

    def remove(self) -> None:
        """The evaluation's results are written elsewhere: its sums are no longer needed."""
        self.file.remove()


GREEDY_FILE = "verify_greedy.pt"  # the greedy reduction's steps, until verify.json is written


class EvaluationMemo:
    """Whole evaluations kept by the subsets they asked about. The greedy reduction after a
    reducible `--local` check asks about a few subsets at a time, step after step (minutes on a
    real model); each step's answer is saved at `path` once it comes, so that a rerun replays
    the steps done (the same answers, hence the same path) and evaluates only the rest. Named
    by `key` (the run and the evaluator's settings); another key's file is ignored."""

    def __init__(self, path: str, key: str):
        self.path, self.key = path, key
        self.file = ResumeFile(path, 0.0, "verify: ")
        state = self.file.read(key)
        self.done = dict(state["done"]) if state is not None else {}
        self.replayed = 0  # subsets answered from the file
        if self.done:
            print(f"verify: going on from {path} ({len(self.done)} reduction steps done before)",
                  file=sys.stderr, flush=True)

    def evaluate(self, evaluate, masks: torch.Tensor):
        """evaluate(masks) -> (ld, accuracy), or the saved answer to these very masks."""
        h = hashlib.sha1(str(tuple(masks.shape)).encode())
        h.update(masks.detach().cpu().contiguous().numpy().tobytes())
        digest = h.hexdigest()
        if digest in self.done:
            self.replayed += masks.shape[0]
            return tuple(t.clone() for t in self.done[digest])
        ld, accuracy = evaluate(masks)
        self.done[digest] = (ld.detach().cpu().clone(), accuracy.detach().cpu().clone())
        self.file.write(dict(key=self.key, done=self.done))
        return ld, accuracy

    def remove(self) -> None:
        self.file.remove()
