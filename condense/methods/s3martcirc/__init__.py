"""S³martCirc (node roles: unimportant / passthrough / functional) with its node baselines and
known-circuit recovery."""
