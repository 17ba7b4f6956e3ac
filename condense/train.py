"""Run a recipe under accelerate: `accelerate launch condense/train.py --recipe R [key=value ...]`
is `condense run --recipe R [key=value ...]` on every process accelerate starts (as are
`python -m condense.train ...` and `accelerate launch -m condense.train ...`).

accelerate runs this file by path, which would put condense/ itself first on the module path
(where its modules could shadow top-level packages of the same name); so it replaces itself
with `python -m condense.cli run ...`, which has the launch environment and a clean path.
"""
import os
import sys


def main(argv=None):
    """`condense run` with these arguments; returns the run's metrics."""
    from condense.cli import main as cli
    return cli(["run", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    if __package__ in (None, ""):  # run by path
        os.execv(sys.executable, [sys.executable, "-m", "condense.cli", "run", *sys.argv[1:]])
    sys.argv.insert(1, "run")  # python -m condense.train (or accelerate launch -m) is `condense run`
    from condense.cli import entry
    entry()
