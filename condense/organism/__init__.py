"""The shipped model organism: a small GPT-2 trained from scratch on the six tasks
(`python -m condense.organism --recipe recipes/organism.yaml`) and its model card."""
