"""`python -m condense.verify` is `condense verify`."""
from condense.cli import module_entry

module_entry("verify")
