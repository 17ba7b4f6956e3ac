"""The `condense` command.

    condense run --recipe RECIPE [key=value ...]   run a recipe (any method; --help: its keys)
    condense verify RUN [options]                  every subset and pair of a run's circuit
    condense explain RUN [options]                 WeightLens and CircuitLens for its nodes
    condense report RUN [--edges N]                one self-contained HTML page for a run
    condense card MODEL [options]                  a model card (tasks, perplexity, IOI heads)
    condense fidelity RUN [options]                how much of a run's circuit the original carries
    condense organism [--recipe R] [key=value]     train the model organism
    condense methods                               the registered methods

`accelerate launch condense/train.py --recipe R` runs `condense run` under accelerate (several
processes, GPUs); `python -m condense.verify RUN` and `python -m condense.explain RUN` are the
same as the subcommands.
"""
import argparse
import sys

SUBCOMMANDS = {
    "verify": ("condense.verify.run", "every subset and pair of a run's circuit"),
    "explain": ("condense.explain.run", "WeightLens and CircuitLens for a run's nodes"),
    "report": ("condense.report", "a run folder's self-contained report.html"),
    "card": ("condense.card", "a model card: task accuracy, perplexity, where IOI lives"),
    "fidelity": ("condense.fidelity_command", "the fidelity card: how much of a circuit the original carries"),
    "organism": ("condense.organism.train", "train the model organism from a recipe"),
}


def _run_parser(method=None):
    from condense.config import RunConfig, help_text
    from condense.methods import methods
    cls = method.config if method is not None else RunConfig
    if method is not None:
        keys = f"keys of method {method.name!r} (YAML or key=value):\n{help_text(cls)}"
    else:
        keys = ("keys every method shares (`--recipe R --help` lists the recipe's method's own):\n"
                f"{help_text(cls)}\n\nmethods: {', '.join(methods())}")
    ap = argparse.ArgumentParser(prog="condense run", description="Run a recipe (any method).",
                                 epilog=keys, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", required=True, help="YAML recipe, e.g. recipes/eap_ig/organism.yaml")
    ap.add_argument("overrides", nargs="*", help="key=value recipe overrides")
    return ap


def run_command(argv):
    """`condense run`: load and check the recipe (before anything heavy), then run it."""
    from condense.config import RecipeError, read_recipe
    from condense.methods import get
    from condense.runs import load_config, run

    if "-h" in argv or "--help" in argv:
        method = None
        ap = argparse.ArgumentParser(add_help=False)  # only peeks at the recipe's method
        ap.add_argument("--recipe", help="YAML recipe")
        ap.add_argument("overrides", nargs="*", help="key=value recipe overrides")
        known, _ = ap.parse_known_args([a for a in argv if a not in ("-h", "--help")])
        if known.recipe:
            try:
                method = get(read_recipe(known.recipe, known.overrides).get("method", "eap_ig"))
            except (RecipeError, OSError):
                method = None
        _run_parser(method).parse_args(["--help"])
    args = _run_parser().parse_args(argv)
    return run(load_config(args.recipe, args.overrides))


def main(argv=None):
    """Run a subcommand; returns what it returns (`run`: the metrics, others an exit code)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="condense", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["run", *SUBCOMMANDS, "methods"],
                    help="run | verify | explain | report | card | fidelity | organism | methods")
    if not argv or argv[0] in ("-h", "--help"):
        ap.print_help()
        return 0
    command, rest = argv[0], argv[1:]
    if command not in ("run", "methods", *SUBCOMMANDS):
        ap.parse_args([command])  # exits with argparse's message naming the choices
    if command == "run":
        return run_command(rest)
    if command == "methods":
        from condense.methods import methods
        for name, m in methods().items():
            print(f"{name:20s} {m.help}")
        return 0
    import importlib
    return importlib.import_module(SUBCOMMANDS[command][0]).main(rest)


def user_errors() -> tuple:
    """Failures a user causes or must fix (a recipe, a path, a model, a folder in use, a damaged
    file, a folder it cannot write): one line, no traceback."""
    from condense.artifacts import ArtifactError
    from condense.config import RecipeError
    from condense.model_parts import UnsupportedModelError
    from condense.models import MissingModelError
    from condense.optimize import Diverged
    from condense.runs import FolderInUse
    from condense.tasks import TaskError
    from condense.verify.run import CircuitTooLarge
    return (ArtifactError, RecipeError, TaskError, FolderInUse, MissingModelError, UnsupportedModelError, CircuitTooLarge,
            Diverged,
            FileNotFoundError, IsADirectoryError, NotADirectoryError)


def entry():
    """The console script: `condense ...`, with an exit status. A failure the user caused ends
    in one line; Ctrl-C says how to go on."""
    try:
        result = main()
    except KeyboardInterrupt:
        print("\ninterrupted; rerun the same command: it goes on where it stopped", file=sys.stderr)
        sys.exit(130)
    except user_errors() as e:
        sys.exit(f"error: {e}")
    except OSError as e:
        if str(e).startswith(("cannot load model", "cannot load tokenizer")):
            sys.exit(f"error: {e}")
        from condense.artifacts import WRITE_ERRNOS, cannot_write
        if e.errno in WRITE_ERRNOS:  # a write no atomic_write wrapped (a library's own save)
            sys.exit(f"error: {cannot_write(e.filename or 'a file', e)}")
        raise
    sys.exit(result if isinstance(result, int) else 0)


def module_entry(command: str) -> None:
    """`python -m condense.<module> ...` as `condense <command> ...`: the same one-line errors
    for a user's mistake, and Ctrl-C saying how to go on."""
    sys.argv.insert(1, command)
    entry()


if __name__ == "__main__":
    entry()
