"""`python -m condense.organism` is `condense organism`."""
from condense.cli import module_entry

module_entry("organism")
