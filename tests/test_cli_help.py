"""Every option a researcher can pass to a benchmark or a condense CLI says what it does (`help=`)."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _sources():
    return sorted(ROOT.glob("benchmarks/*.py")) + sorted(ROOT.glob("condense/**/*.py"))


def _is_peek_parser(value):
    """`ArgumentParser(..., add_help=False)`: a parser that never prints help. The one there is,
    in condense/cli.py's run_command, only peeks at `--recipe` (parse_known_args) so that the
    real parser can print `condense run --help` for the recipe's method; its options have no
    help text to show anyone, so they are the only ones this test lets go without."""
    if not isinstance(value, ast.Call):
        return False
    f = value.func
    name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
    return name == "ArgumentParser" and any(
        k.arg == "add_help" and isinstance(k.value, ast.Constant) and k.value.value is False
        for k in value.keywords)


def _option(call):
    names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return "/".join(names) or ast.unparse(call)


def _without_help():
    """(path, line, option, on_peek_parser) of every `.add_argument(...)` call with no `help=`
    keyword, and how many calls there are in all."""
    missing, seen = [], 0
    for path in _sources():
        tree = ast.parse(path.read_text(), filename=str(path))
        scope_of = {}  # node -> its innermost enclosing function (or the module)

        def visit(node, scope):
            for child in ast.iter_child_nodes(node):
                scope_of[child] = scope
                visit(child, child if isinstance(child, FUNCTIONS) else scope)
        visit(tree, tree)
        # (scope, name) -> [(line, made a peek parser)] for every plain `name = ...`
        assigned = {}
        for node, scope in scope_of.items():
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        assigned.setdefault((scope, target.id), []).append(
                            (node.lineno, _is_peek_parser(node.value)))
        for node, scope in scope_of.items():
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "add_argument"):
                continue
            seen += 1
            if any(k.arg == "help" for k in node.keywords):
                continue
            peek = False
            if isinstance(node.func.value, ast.Name):  # the receiver's last assignment before the call
                before = [a for a in assigned.get((scope, node.func.value.id), []) if a[0] <= node.lineno]
                peek = bool(before) and max(before)[1]
            missing.append((str(path.relative_to(ROOT)), node.lineno, _option(node), peek))
    return missing, seen


def test_every_cli_option_has_help():
    missing, seen = _without_help()
    assert seen > 100, f"only {seen} add_argument calls found: is the walk looking in the right places?"
    bare = [f"{path}:{line}: {option} has no help=" for path, line, option, peek in missing if not peek]
    assert not bare, "options without a help text:\n" + "\n".join(bare)


def test_only_the_recipe_peek_parser_goes_without_help():
    missing, _ = _without_help()
    assert {path for path, _, _, peek in missing if peek} <= {"condense/cli.py"}
