"""`python -m condense.explain` is `condense explain`."""
from condense.cli import module_entry

module_entry("explain")
