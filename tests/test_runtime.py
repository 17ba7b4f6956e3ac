"""The CPU runtime: freed blocks of up to 32 MiB stay in the heap (condense.runtime)."""
import json
import os
import subprocess
import sys

import pytest

# Eight 20 MB blocks held at once and freed, five times over (as a pass holds and frees its
# activations; EAP-IG's per-layer tensors on SmolLM2 are 20 MB), through glibc's malloc itself;
# the page faults of the last four rounds: a kept block costs none.
PROBE = """
import ctypes, json, resource
import condense, condense.runtime as runtime
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
def one_round(n=20_000_000):
    blocks = [libc.malloc(n) for _ in range(8)]
    for b in blocks:
        ctypes.memset(b, 1, n)
    for b in blocks:
        libc.free(b)
one_round()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    one_round()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps(dict(faults=faults, settings=runtime._malloc_settings,
                      recorded=runtime.apply_thread_policy(1)["malloc"])))
"""


def _probe(**env):
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True,
                         env={**{k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")},
                              **env})
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_blocks_are_reused_without_page_faults():
    kept = _probe()
    assert kept["settings"] == {"mmap_threshold": 32 * 2 ** 20, "trim_threshold": 2 ** 31 - 1,
                                "top_pad": 64 * 2 ** 20}
    assert kept["recorded"] == kept["settings"]  # runs write it into runtime.json
    assert kept["faults"] < 100
    default = _probe(CONDENSE_KEEP_FREED_MEMORY="0")
    assert default["settings"] is None and default["recorded"] is None
    # glibc's default hands the freed blocks back: every 4 KB page of them faults again
    assert default["faults"] > 4 * 8 * 20_000_000 // 4096 // 2
    # the user's own settings win
    assert _probe(MALLOC_TRIM_THRESHOLD_="131072")["settings"] is None
    assert _probe(GLIBC_TUNABLES="glibc.malloc.trim_threshold=131072")["settings"] is None
