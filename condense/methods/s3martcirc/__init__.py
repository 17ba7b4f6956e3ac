"""S³martCirc (node roles: unimportant / passthrough / functional) with its node baselines and
known-circuit recovery."""
from condense.methods.s3martcirc import run as _run  # noqa: F401  (registers `s3martcirc`)
