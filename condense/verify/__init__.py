"""Verifying small circuits: every subset (is the circuit irreducible? its minimal faithful
subsets) and every pair (which edges interact), `python -m condense.verify RUN`."""
from condense.verify.run import CircuitTooLarge, verify_circuit, verify_run  # noqa: F401
