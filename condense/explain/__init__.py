"""Explaining circuit nodes: WeightLens (tokens a node reads and writes, from its weights) and
CircuitLens (the contexts that drive it and their upstream contributors),
`python -m condense.explain RUN`."""
from condense.explain.run import explain_circuit, explain_run  # noqa: F401
