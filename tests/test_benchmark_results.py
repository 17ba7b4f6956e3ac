"""Every committed benchmark result names the command that made it, so that each number in the
docs can be measured again."""
import json
from pathlib import Path

import pytest

RESULTS = sorted((Path(__file__).resolve().parent.parent / "benchmarks" / "results").glob("*.json"))


def strings(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    values = node.values() if isinstance(node, dict) else node if isinstance(node, list) else []
    return [s for value in values for s in strings(value)]


def commands(node) -> list[str]:
    """Every string under a key that names a command ('command', 'commands', 'command_rows200', ...)."""
    if isinstance(node, dict):
        return [s for key, value in node.items()
                for s in (strings(value) if "command" in key else commands(value))]
    if isinstance(node, list):
        return [s for value in node for s in commands(value)]
    return []


def test_there_are_results():
    assert len(RESULTS) > 100


# a command that reads or writes beside the repository (a scratch folder, a home directory, a
# shared folder) cannot be run again from a checkout
OUTSIDE = ("/tmp/", "/work/", "/root/", "/home/", "../")


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.name)
def test_result_names_its_command(path: Path):
    found = commands(json.loads(path.read_text()))
    assert found, f"{path.name}: no 'command' key anywhere"
    outside = [c for c in found if any(p in c for p in OUTSIDE)]
    assert not outside, f"{path.name}: a path outside the repository in {outside[0]!r}"
