"""Verifying small circuits: every subset (is the circuit irreducible? its minimal faithful
subsets) and every pair (which edges interact), `python -m condense.verify RUN`."""
from condense.verify.verdict import irreducibility_words  # noqa: F401

_LAZY = ("CircuitTooLarge", "verify_circuit", "verify_run")


def __getattr__(name):
    # the verifier itself needs torch; loaded on first use so that torch-free readers of its
    # reports (the HTML report page) can import the wording above without it
    if name in _LAZY:
        from condense.verify import run
        return getattr(run, name)
    raise AttributeError(f"module 'condense.verify' has no attribute {name!r}")
