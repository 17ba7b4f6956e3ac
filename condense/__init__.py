"""condense: find, condense and verify circuits in Hugging Face causal language models."""
import os

# OpenMP threads sleep rather than spin while they wait for each other (condense.runtime says
# why). The OpenMP runtime reads this once, when torch loads it: so it is set before any
# condense module imports torch, unless the environment already says otherwise.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
