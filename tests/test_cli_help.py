"""Every option a researcher can pass to a benchmark or a condense CLI says what it does (`help=`)."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _add_argument_calls():
    """(path, line, option, has help) of every `.add_argument(...)` call in benchmarks/ and
    condense/."""
    for path in sorted(ROOT.glob("benchmarks/*.py")) + sorted(ROOT.glob("condense/**/*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument"):
                names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                yield (str(path.relative_to(ROOT)), node.lineno, "/".join(names) or ast.unparse(node),
                       any(k.arg == "help" for k in node.keywords))


def test_every_cli_option_has_help():
    calls = list(_add_argument_calls())
    assert len(calls) > 100, f"only {len(calls)} add_argument calls found: is the walk looking in the right places?"
    bare = [f"{path}:{line}: {option} has no help=" for path, line, option, has_help in calls if not has_help]
    assert not bare, "options without a help text:\n" + "\n".join(bare)
