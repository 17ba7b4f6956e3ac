"""Run folder files, written and read in one place (docs/design.md §6).

Writes are atomic: a temporary file beside the target, renamed over it, so a killed run never
leaves half a file behind; a write that fails for want of space or permission (a full disk, a
read-only mount) raises CannotWrite, one line naming the path and the free space there.

Reads go through the checked readers here (JSON, gzipped or not; JSON Lines logs; text;
tensor files): a file that is damaged (cut off, another format) or foreign (not what condense
writes there), or that holds NaN/Inf where numbers must be finite, raises DamagedFile, one
line naming the file, what is wrong and what to do. A JSON Lines log whose last line was cut
off keeps the lines before it, with a warning.

Also the command line a benchmark records in its JSON, and the file a long job saves itself
into so that a rerun goes on from it (ResumeFile)."""
import errno
import gzip
import json
import math
import os
import shlex
import shutil
import sys
import tempfile
import time
import zlib
from contextlib import contextmanager
from typing import Iterable, Iterator, Optional


class ArtifactError(Exception):
    """A file condense reads that is damaged or foreign, or a folder it cannot write. The
    message is one line: the path, what is wrong, what to do (the command line prints it as
    `error: ...`, condense.cli.user_errors)."""


class DamagedFile(ArtifactError, ValueError):
    """A file that does not read back as what condense wrote there: cut off, another format,
    another kind of file, or NaN/Inf where numbers must be finite. (A ValueError too: callers
    that refused a bad file by ValueError before still do.)"""


class CannotWrite(ArtifactError):
    """A write that failed for want of space or permission: a full disk, a read-only folder."""


# the errors of a write that the machine refuses (space, quota, permission, read-only mount),
# as opposed to a bug: they become CannotWrite
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM,
                          errno.EFBIG})


def free_space(path: str) -> str:
    """The free space on the filesystem that holds `path` (or its nearest existing folder)."""
    folder = os.path.abspath(path)
    while not os.path.exists(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    try:
        free = float(shutil.disk_usage(folder).free)
    except OSError:
        return "unknown space"
    units = ["B", "kB", "MB", "GB", "TB"]
    while free >= 1000 and len(units) > 1:
        free, units = free / 1000, units[1:]
    return f"{free:.0f} B" if units[0] == "B" else f"{free:.1f} {units[0]}"


def cannot_write(path: str, error: OSError, hint: Optional[str] = None) -> CannotWrite:
    """The one-line CannotWrite of a write to `path` that failed with `error`; `hint` says how
    to go on (default: free space and rerun, which goes on where it stopped)."""
    hint = hint or ("free space (or make the folder writable) and rerun the same command: it "
                    "goes on where it stopped")
    why = error.strerror or str(error)
    return CannotWrite(f"cannot write {path}: {why} ({free_space(path)} free there); {hint}")


@contextmanager
def writing(path: str, hint: Optional[str] = None) -> Iterator[None]:
    """Writes to `path` in this block that the machine refuses (WRITE_ERRNOS) raise CannotWrite
    (see cannot_write); other errors pass unchanged."""
    try:
        yield
    except OSError as e:
        if e.errno not in WRITE_ERRNOS:
            raise
        raise cannot_write(path, e, hint) from None


def check_writable(folder: str, hint: str) -> None:
    """Before any work: `folder` takes a new file (a folder not made yet: its nearest existing
    parent, which is left as it was), else CannotWrite naming it, why, and `hint` (how to write
    elsewhere, e.g. give --out DIR)."""
    probe_in = os.path.abspath(folder)
    while not os.path.isdir(probe_in) and os.path.dirname(probe_in) != probe_in:
        probe_in = os.path.dirname(probe_in)
    with writing(folder, hint):
        fd, probe = tempfile.mkstemp(dir=probe_in, prefix=".", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)


def atomic_write(path, data, mode=None):
    """Write `data` to `path` atomically. `data` is a str, bytes, or a function taking the
    open file (e.g. `lambda f: fig.savefig(f, format="png")`); `mode` defaults to "w" for
    str and functions and "wb" for bytes. A refused write raises CannotWrite and leaves the
    previous file (or none)."""
    if mode is None:
        mode = "wb" if isinstance(data, (bytes, bytearray)) else "w"
    write = data if callable(data) else (lambda f: f.write(data))
    folder = os.path.dirname(os.path.abspath(path))
    with writing(path):
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


# ---------------------------------------------------------------- the checked readers
def remedy(path: str) -> str:
    """What to do about a damaged file, from where it lies and its name: rerun the step that
    writes it, or restore it."""
    name = os.path.basename(path)
    folder = os.path.basename(os.path.dirname(os.path.abspath(path)))
    if name == "recipe.yaml":
        return ("restore it from a copy (a run writes it when it starts, from the recipe it was "
                "given)")
    if folder == "state":
        return (f"remove {os.path.dirname(path) or '.'} to start the run over, or restore the file "
                "from a copy")
    for prefix, step in (("verify", "condense verify"), ("explain", "condense explain"),
                         ("card", "condense card"), ("report", "condense report")):
        if name.startswith(prefix):
            return f"rerun `{step}` (it writes the file), or restore it from a copy"
    return ("rerun the run that wrote it (the command on the first line of its recipe.yaml), or "
            "restore it from a copy")


def damaged(path, problem: str, what_to_do: Optional[str] = None) -> DamagedFile:
    """The one-line DamagedFile of `path`: what is wrong with it, and what to do (remedy)."""
    return DamagedFile(f"{path}: {problem}; {what_to_do or remedy(str(path))}")


def count_nonfinite(obj, floats: bool = True) -> int:
    """NaN and Inf values in `obj`: floating tensors and arrays, and (with `floats`) Python
    floats, through dicts, lists and tuples."""
    if isinstance(obj, dict):
        return sum(count_nonfinite(v, floats) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(count_nonfinite(v, floats) for v in obj)
    if isinstance(obj, float):
        return int(floats and not math.isfinite(obj))
    if type(obj).__module__ == "torch" and hasattr(obj, "is_floating_point"):  # a tensor
        import torch
        return int((~torch.isfinite(obj)).sum()) if obj.is_floating_point() else 0
    if type(obj).__module__ == "numpy" and getattr(obj, "dtype", None) is not None:
        import numpy as np
        return int((~np.isfinite(obj)).sum()) if np.issubdtype(obj.dtype, np.floating) else 0
    return 0


def _check_finite(path, data, finite: Iterable[str], what_to_do: Optional[str]) -> None:
    keys = [k for k in finite if isinstance(data, dict) and k in data]
    bad = {k: count_nonfinite(data[k]) for k in keys}
    bad = {k: n for k, n in bad.items() if n}
    if bad:
        raise damaged(path, f"{sum(bad.values())} NaN/Inf values where numbers must be finite "
                            f"({', '.join(bad)})", what_to_do)


def read_text(path, what_to_do: Optional[str] = None) -> str:
    """The text of `path` (UTF-8): DamagedFile if it is not text or cannot be read; a missing
    file raises FileNotFoundError."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (FileNotFoundError, IsADirectoryError):
        raise
    except UnicodeDecodeError as e:
        raise damaged(path, f"not a UTF-8 text file (byte {e.start})", what_to_do) from None
    except OSError as e:
        raise damaged(path, f"cannot be read ({e.strerror or e})", what_to_do) from None


def read_json(path, finite: Iterable[str] = (), what_to_do: Optional[str] = None):
    """The JSON of `path`; a path ending in .gz is read as gzipped JSON (large circuits ship
    so). A file that is not whole JSON raises DamagedFile (cut off, another format, not
    readable), and so does a NaN/Inf at any top-level key named in `finite` (numbers that
    cannot be undefined); a missing file raises FileNotFoundError."""
    gz = str(path).endswith(".gz")
    try:
        if gz:
            with gzip.open(path, "rt", encoding="utf-8") as f:
                text = f.read()
        else:
            text = read_text(path, what_to_do)
    except (FileNotFoundError, IsADirectoryError, DamagedFile):
        raise
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as e:  # gzip's own errors
        raise damaged(path, f"not a whole gzipped JSON file ({e})", what_to_do) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        if not text.strip():
            problem = "empty"
        elif e.pos >= len(text.rstrip()) or e.msg.startswith("Unterminated string"):
            problem = f"cut off after {len(text)} characters (an interrupted write or copy)"
        else:
            problem = f"not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})"
        raise damaged(path, problem, what_to_do) from None
    _check_finite(path, data, finite, what_to_do)
    return data


def read_jsonl(path, what_to_do: Optional[str] = None) -> list:
    """The records (JSON objects, one a line) of a JSON Lines log. A last line that does not
    parse is what a kill in the middle of an append leaves: it is dropped with a warning on
    stderr, and every line before it kept. A bad line before the last raises DamagedFile."""
    lines = read_text(path, what_to_do).split("\n")
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            if any(rest.strip() for rest in lines[i + 1:]):
                raise damaged(path, f"line {i + 1} is not valid JSON ({e.msg})", what_to_do) from None
            print(f"warning: {path}: its last line ({i + 1}) is cut off (an interrupted write); "
                  f"keeping the {len(records)} records before it", file=sys.stderr, flush=True)
            break
        if not isinstance(record, dict):
            raise damaged(path, f"line {i + 1} is not a JSON object", what_to_do)
        records.append(record)
    return records


def read_tensors(path, what_to_do: Optional[str] = None, allow_inf: bool = False) -> dict:
    """The tensors of a safetensors file (or a torch .bin of a state dict), every value finite:
    a file cut off or of another format, or one holding NaN/Inf, raises DamagedFile naming the
    count; a missing file raises FileNotFoundError. `allow_inf`: only NaN is refused (Edge
    Pruning's log_alpha is -inf where no gate is)."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file")
    try:
        tensors = (load_file(path) if str(path).endswith(".safetensors")
                   else torch.load(path, map_location="cpu", weights_only=True))
    except (SafetensorError, OSError, ValueError, RuntimeError, EOFError) as e:
        raise damaged(path, f"not a whole tensor file ({e})", what_to_do) from None
    if not isinstance(tensors, dict) or not all(torch.is_tensor(t) for t in tensors.values()):
        raise damaged(path, "not a file of named tensors", what_to_do)
    bad = (sum(int(t.isnan().sum()) for t in tensors.values() if t.is_floating_point())
           if allow_inf else count_nonfinite(tensors))
    if bad:
        total = sum(t.numel() for t in tensors.values() if t.is_floating_point())
        raise damaged(path, f"{bad} of its {total:,} values are NaN or Inf", what_to_do)
    return tensors


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
        if not isinstance(state, dict) or state.get("key") != key:
            print(f"{self.label}{self.path} is from another job; starting over",
                  file=sys.stderr, flush=True)
            return None
        bad = count_nonfinite(state, floats=False)  # parameters, moments, sums: never NaN
        if bad:
            print(f"{self.label}ignoring {self.path} (it holds {bad} NaN/Inf values); starting over",
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
