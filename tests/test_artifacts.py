"""The command a benchmark records in its JSON pastes back into a shell as it was given."""
import shlex

from condense.artifacts import command_line


def test_command_line_quotes_what_a_shell_would_split():
    argv = ["--recipe", "recipes/condense/smollm2_ioi.yaml", "notes=two words", "--tasks", "ioi,induction"]
    line = command_line("benchmarks/condense_grid.py", argv, env="HF_HUB_OFFLINE=1")
    assert line.startswith("HF_HUB_OFFLINE=1 python benchmarks/condense_grid.py ")
    # the shell splits it back into the same words: "notes=two words" stays one argument
    assert shlex.split(line)[3:] == argv
    assert shlex.split(command_line("benchmarks/x.py", []))[:2] == ["python", "benchmarks/x.py"]


def test_command_line_defaults_to_this_process_arguments(monkeypatch):
    monkeypatch.setattr("sys.argv", ["benchmarks/hap_vs_ep.py", "--seeds", "0,1", "--json", "a b.json"])
    assert command_line("benchmarks/hap_vs_ep.py") == (
        "python benchmarks/hap_vs_ep.py --seeds 0,1 --json 'a b.json'")
