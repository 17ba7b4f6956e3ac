"""condense: find, condense and verify circuits in Hugging Face causal language models."""
import os

# OpenMP threads sleep rather than spin while they wait for each other (condense.runtime says
# why). The OpenMP runtime reads this once, when torch loads it: so it is set before any
# condense module imports torch, unless the environment already says otherwise.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Freed blocks of up to 32 MiB stay in the heap for the next pass instead of going back to the
# kernel (condense.runtime says why; CONDENSE_KEEP_FREED_MEMORY=0 leaves the allocator alone).
from condense.runtime import keep_freed_memory  # noqa: E402

keep_freed_memory()

__version__ = "0.1.0"

# peft imports bitsandbytes when it is installed, and on CPUs with AVX512-BF16 bitsandbytes
# then warns that the optional `kernels` package (a faster CPU 4-bit matmul) is absent. It
# would be the first line of every command, including one-line error messages; condense
# does not run 4-bit matmuls on CPU, so that one logger is quieted. With the `kernels` package
# installed (transformers requires it) bitsandbytes instead tries to fetch that kernel, and in
# offline mode (how condense's tests and most CPU runs work) kernels first warns that it skips
# the publisher check: the only warning of that logger, quieted for the same reason.
import logging  # noqa: E402

logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
logging.getLogger("kernels._internals.hf_hub").setLevel(logging.ERROR)
