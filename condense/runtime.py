"""How condense uses the CPU: a thread policy that holds up when the machine is busy.

Small models run many tiny operations. With several OpenMP threads, every operation ends at a
barrier where the threads wait for each other; when another process holds a core, one thread
is preempted and the rest wait for it at every barrier, so a 2-thread run beside two busy
processes can be many times slower than a 1-thread run. Two measures:
- OpenMP threads *sleep* while they wait instead of spinning (`OMP_WAIT_POLICY=PASSIVE`, set
  in condense/__init__.py before torch loads, unless the environment sets it);
- the thread count follows the model and the cores that are free now: one thread for models
  whose layers are too narrow to split (below `WIDE_ENOUGH` hidden units), otherwise the free
  cores this process may use (its CPU affinity, shared by the processes of an `accelerate
  launch`), at least one. A recipe's `threads:` (or a command's --threads) overrides it.
`apply_thread_policy` sets torch's thread count and returns what it chose and why; runs write
that into `runtime.json`.

Memory: glibc's allocator gives freed memory back to the kernel (blocks it mapped on their
own, and the free top of its heap beyond a trim threshold; its own thresholds adapt only so
far), so a pass that allocates the same tens of MB again pays a page fault for every 4 KB of
it, each time. EAP-IG's interpolation passes do exactly that (one [27, batch, tokens, width]
tensor per attention layer and step: 20 MB on SmolLM2 at 16 x 20 tokens): measured there
(benchmarks/freed_memory.py), 1.1 million page faults per call and 13 % of its CPU time.
`keep_freed_memory` (called when condense is imported, on glibc) keeps blocks of up to 32 MiB
(glibc's largest setting) in the heap for reuse instead; peak memory grows by about 1 %. Set
`CONDENSE_KEEP_FREED_MEMORY=0`, or glibc's own `MALLOC_MMAP_THRESHOLD_`,
`MALLOC_TRIM_THRESHOLD_`, `MALLOC_TOP_PAD_` or `GLIBC_TUNABLES=glibc.malloc...`, to leave the
allocator as it was (or as you set it).
"""
import os
import time
from typing import Optional

# mallopt parameters (glibc's malloc.h) and the values keep_freed_memory sets
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_KEPT = {"mmap_threshold": (_M_MMAP_THRESHOLD, 32 * 1024 * 1024),  # blocks up to 32 MiB from the heap
         "trim_threshold": (_M_TRIM_THRESHOLD, 2 ** 31 - 1),  # keep up to 2 GiB free at its top
         "top_pad": (_M_TOP_PAD, 64 * 1024 * 1024)}  # grow it 64 MiB at a time
_malloc_settings: Optional[dict] = None


def keep_freed_memory() -> Optional[dict]:
    """On glibc, keep freed blocks of up to 32 MiB for reuse (see the module docstring); returns
    the settings made, or None where nothing was changed (opted out, or not glibc)."""
    global _malloc_settings
    own = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
    if (os.environ.get("CONDENSE_KEEP_FREED_MEMORY", "1") == "0" or any(k in os.environ for k in own)
            or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", "")):
        return None  # the user's own allocator settings stand
    try:
        import ctypes
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not Linux, or a C library without mallopt
        return None
    if not all(mallopt(param, value) == 1 for param, value in _KEPT.values()):
        return None
    _malloc_settings = {name: value for name, (_, value) in _KEPT.items()}
    return _malloc_settings

WIDE_ENOUGH = 512  # hidden size from which a layer's matrix products gain from a second thread


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _cpu_times():
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return idle, sum(values)


def free_cores(seconds: float = 0.25) -> Optional[float]:
    """Cores idle over the next `seconds` (from /proc/stat), or None where that is unknown."""
    try:
        idle0, total0 = _cpu_times()
        time.sleep(seconds)
        idle1, total1 = _cpu_times()
    except OSError:
        return None
    if total1 <= total0:
        return None
    return (idle1 - idle0) / (total1 - total0) * (os.cpu_count() or 1)


def hidden_size(model) -> Optional[int]:
    config = getattr(model, "config", model)
    for key in ("hidden_size", "n_embd", "d_model"):
        if isinstance(getattr(config, key, None), int):
            return getattr(config, key)
    return None


def default_threads(width: Optional[int], processes: int = 1, free: Optional[float] = None) -> tuple[int, str]:
    """(threads, why) for a model of hidden size `width` in one of `processes` processes."""
    if width is not None and width < WIDE_ENOUGH:
        return 1, f"hidden size {width} < {WIDE_ENOUGH}: layers too narrow to split"
    share = max(1, usable_cores() // max(1, processes))
    if free is None:
        return share, f"{share} usable core(s) per process"
    n = max(1, min(share, int(free / max(1, processes) + 0.5)))
    return n, f"{free:.1f} core(s) free now, {share} usable per process"


def apply_thread_policy(threads: Optional[int] = None, model=None, processes: int = 1,
                        width: Optional[int] = None) -> dict:
    """Set torch's CPU threads: `threads` when given, else the policy (see the module
    docstring) for `model` (or a model of hidden size `width`). Returns what was chosen, for
    the run's records."""
    import torch
    if threads is not None:
        chosen, why = int(threads), "set by the recipe or command"
    else:
        width = hidden_size(model) if model is not None else width
        chosen, why = default_threads(width, processes, None if width and width < WIDE_ENOUGH
                                      else free_cores())
    torch.set_num_threads(chosen)
    return dict(threads=chosen, why=why, usable_cores=usable_cores(), processes=processes,
                omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"), malloc=_malloc_settings)
