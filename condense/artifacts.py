"""Atomic writes of run artifacts (docs/design.md §6): write a temporary file beside the target,
then rename it over the target, so a killed run never leaves half a file behind. Also the one
reader of JSON artifacts, gzipped or not, the command line a benchmark records in its JSON, and
the file a long job saves itself into so that a rerun goes on from it (ResumeFile)."""
import gzip
import json
import os
import shlex
import sys
import tempfile
import time
from typing import Optional


def atomic_write(path, data, mode=None):
    """Write `data` to `path` atomically. `data` is a str, bytes, or a function taking the
    open file (e.g. `lambda f: fig.savefig(f, format="png")`); `mode` defaults to "w" for
    str and functions and "wb" for bytes."""
    if mode is None:
        mode = "wb" if isinstance(data, (bytes, bytearray)) else "w"
    write = data if callable(data) else (lambda f: f.write(data))
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files; give the usual mode
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path, obj):
    atomic_write(path, json.dumps(obj, indent=1) + "\n")


def command_line(script: str, argv: list[str] | None = None, env: str = "") -> str:
    """The command that reruns `script` with `argv` (default: this process's arguments), quoted
    so that an argument with spaces or shell characters pastes back as it was given; `env`
    (e.g. "HF_HUB_OFFLINE=1") goes in front."""
    words = shlex.join(["python", script, *(sys.argv[1:] if argv is None else argv)])
    return f"{env} {words}" if env else words


def read_json(path):
    """Load a JSON file; a path ending in .gz is read as gzipped JSON (large circuits ship so)."""
    with (gzip.open(path, "rt") if str(path).endswith(".gz") else open(path)) as f:
        return json.load(f)


def read_output(path, key: str, kind: type = list):
    """An earlier --json output of a benchmark, pooled by its --combine: the JSON object at
    `path`, which must hold `key` as a `kind` (e.g. 'rows', a list). A missing, unreadable or
    foreign file raises ValueError naming the path and what it should hold, so that the script
    refuses it in one line instead of a traceback."""
    try:
        d = read_json(path)
        if not isinstance(d, dict) or not isinstance(d[key], kind):
            raise TypeError(f"'{key}' is not a {kind.__name__}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a --json output of this script (a JSON object with a "
                         f"'{key}' {kind.__name__}): {type(e).__name__}: {e}") from None
    return d


class ResumeFile:
    """A torch file that a long job saves itself into now and then, so that a rerun of the same
    command goes on from it (condense.optimize.FitState, condense.verify.resume.SubsetSums).
    Written atomically at most every `every` seconds (`due`), read back only when it names the
    same job (`key`); a file that does not load, or names another job, is ignored with a
    message, and the next write replaces it."""

    def __init__(self, path: str, every: float, label: str = "", clock=time.monotonic):
        self.path, self.every, self.label, self.clock = path, every, label, clock
        self.saved_at = clock()

    def read(self, key: str):
        """The saved dict when it is this job's (its "key"), else None. Starts the save clock."""
        import torch
        self.saved_at = self.clock()
        if not os.path.exists(self.path):
            return None
        try:
            state = torch.load(self.path, weights_only=True)
        except Exception as e:  # not a save of ours: start over rather than fail
            print(f"{self.label}ignoring {self.path} ({e})", file=sys.stderr, flush=True)
            return None
        if state.get("key") != key:
            print(f"{self.label}{self.path} is from another job; starting over",
                  file=sys.stderr, flush=True)
            return None
        return state

    def due(self, final: bool = False) -> bool:
        """Whether a save is due: `every` seconds since the last (or since read), or final."""
        return final or self.clock() - self.saved_at >= self.every

    def write(self, state: dict) -> None:
        import torch
        atomic_write(self.path, lambda f: torch.save(state, f), mode="wb")
        self.saved_at = self.clock()

    def remove(self) -> None:
        if os.path.exists(self.path):
            os.remove(self.path)


class TimedResumeFile(ResumeFile):
    """A ResumeFile that also keeps the wall and CPU seconds spent on the job, so that a resumed
    command reports its whole time: `load` returns this job's saved dict (or {}) and notes the
    seconds saved in it (`before`, `before_cpu`); `save` writes a dict with the key and the
    seconds so far. The key may be set after construction, before `load` (a training names
    itself once it knows its parameters)."""

    def __init__(self, path: str, key: Optional[str], every: float, label: str = "",
                 begin: Optional[float] = None, clock=time.monotonic):
        super().__init__(path, every, label, clock=clock)
        self.key = key
        self.begin = time.perf_counter() if begin is None else begin  # perf_counter() at the start
        self.begin_cpu = time.process_time()  # process_time() at the start
        self.before = self.before_cpu = 0.0

    def load(self) -> dict:
        state = self.read(self.key) or {}
        self.before = float(state.get("seconds", 0.0))
        self.before_cpu = float(state.get("cpu_seconds", 0.0))
        return state

    def seconds(self) -> float:
        """The job's seconds: this process's since `begin`, and the killed processes' saved."""
        return self.before + time.perf_counter() - self.begin

    def cpu_seconds(self) -> float:
        """The same in CPU time: this process's since `begin_cpu`, and the saved."""
        return self.before_cpu + time.process_time() - self.begin_cpu

    def save(self, state: dict, final: bool = False) -> None:
        """Write `state` (with the key and the seconds) when a save is due, or when final."""
        if self.due(final):
            self.write(dict(state, key=self.key, seconds=self.seconds(),
                            cpu_seconds=self.cpu_seconds()))
