"""Nothing lost, nothing silent: checks run before a run folder changes, one writer per
folder, a PEFT folder is not a model, task capacity, recipe values, one-line errors and the
Ctrl-C message. (Round-state atomicity and init_circuit checks: tests/test_condense.py.)"""
import os
import subprocess
import sys
import time

import pytest

from condense import runs, tasks
from condense.config import RecipeError
from condense.runs import FolderInUse, FolderLock

from .conftest import write_recipe

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def small(folder, model, **keys):
    return write_recipe(folder, model=model, task="ioi", n_train=8, n_val=8, n_test=8,
                       batch_size=8, threads=1, **dict(dict(method="eap"), **keys))


def run(recipe, *overrides):
    return runs.run(runs.load_config(recipe, list(overrides)))


@pytest.fixture(scope="module")
def finished_run(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("finished")
    out = str(tmp / "out")
    run(small(str(tmp), tiny_model_dir), f"output_dir={out}")
    return out


def snapshot(folder):
    found = {}
    for base, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(base, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, folder)] = f.read()
    return found


def test_rejected_command_leaves_the_run_folder_alone(finished_run, tiny_model_dir, tmp_path):
    """Another task, or a value a method's own check refuses, on a finished run's folder: an
    error naming what differs, and not one byte of the folder changes."""
    before = snapshot(finished_run)
    recipe = small(str(tmp_path), tiny_model_dir)
    with pytest.raises(RecipeError, match="task"):
        run(recipe, "task=induction", f"output_dir={finished_run}")
    with pytest.raises(RecipeError, match="ep_target_sparsity"):
        run(recipe, "method=hap", "ep_target_sparsity=1.5", f"output_dir={finished_run}")
    assert snapshot(finished_run) == before
    # rerunning the same recipe (threads may differ) is allowed and ends with the same files
    run(recipe, "threads=2", f"output_dir={finished_run}")
    assert set(snapshot(finished_run)) == set(before)


def test_one_writer_per_folder(finished_run, tiny_model_dir, tmp_path):
    """A live writer's lock refuses a second run, naming its pid, before anything is
    written; a lock left by a process that is gone is taken over."""
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with open(os.path.join(finished_run, ".lock"), "w") as f:
            f.write(str(live.pid))
        before = snapshot(finished_run)
        with pytest.raises(FolderInUse, match=str(live.pid)):
            run(small(str(tmp_path), tiny_model_dir), f"output_dir={finished_run}")
        assert snapshot(finished_run) == before
    finally:
        live.kill()
        live.wait()
    # the same pid, now dead: its lock is taken over, and released when the run ends
    run(small(str(tmp_path), tiny_model_dir), f"output_dir={finished_run}")
    assert not os.path.exists(os.path.join(finished_run, ".lock"))
    lock = FolderLock(str(tmp_path / "x")).acquire()
    assert open(lock.path).read() == str(os.getpid())
    lock.release()
    assert not os.path.exists(lock.path)


def test_output_folders_follow_method_model_and_task(tmp_path):
    recipe = write_recipe(str(tmp_path), method="eap_ig", model="smollm2-135m", task="ioi")
    assert runs.load_config(recipe).output_dir == os.path.join("checkpoints", "eap_ig_smollm2_ioi")
    assert runs.load_config(recipe, ["task=induction"]).output_dir.endswith("eap_ig_smollm2_induction")


def test_stray_temporary_files_are_removed_when_a_run_starts(finished_run, tiny_model_dir, tmp_path):
    strays = [os.path.join(finished_run, ".circuit.json.123.tmp"),
              os.path.join(finished_run, ".adapter-abc", "x")]
    os.makedirs(os.path.dirname(strays[1]))
    for path in strays:
        with open(path, "w") as f:
            f.write("half")
    run(small(str(tmp_path), tiny_model_dir), f"output_dir={finished_run}")
    assert not any(os.path.exists(p) for p in strays)
    assert not os.path.exists(os.path.dirname(strays[1]))


def test_peft_folder_is_not_a_model(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    adapter = tmp_path / "run"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    with pytest.raises(RecipeError, match="PEFT adapter"):
        runs.load_config(small(str(tmp_path), str(adapter)))


@pytest.mark.parametrize("text, words", [
    ("", "empty"),
    ("method: eap\nmodel: m\nmethod: random\n", "twice"),
    ("method: [eap\n", "not valid YAML"),
    ("- eap\n", "mapping"),
])
def test_bad_recipe_files(tmp_path, text, words):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError, match=words) as e:
        runs.load_config(str(path))
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_missing_recipe_folder_and_out_of_range_values(tmp_path):
    with pytest.raises(RecipeError, match="no such recipe file"):
        runs.load_config(str(tmp_path / "nope.yaml"))
    with pytest.raises(RecipeError, match="a folder"):
        runs.load_config(str(tmp_path))
    recipe = small(str(tmp_path), "some/model")
    with pytest.raises(RecipeError, match="faithfulness_threshold"):
        runs.load_config(recipe, ["faithfulness_threshold=5"])
    with pytest.raises(RecipeError, match="n_train"):
        runs.load_config(recipe, ["n_train=0"])
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    with pytest.raises(RecipeError, match="is a file"):
        runs.load_config(recipe, [f"output_dir={a_file}"])


def test_load_task_capacity_and_n(organism_tokenizer):
    """A split asked for more distinct prompts than it holds fails within seconds, naming how
    many it holds; n=0 is an error, not an empty data set."""
    with pytest.raises(tasks.TaskError, match="n must be >= 1"):
        tasks.load_task("ioi", organism_tokenizer, "val", n=0)
    start = time.perf_counter()
    with pytest.raises(tasks.TaskError, match="holds about 2824 distinct prompts"):
        tasks.load_task("greater_than", organism_tokenizer, "val", n=3000)
    assert time.perf_counter() - start < 30
    assert len(tasks.load_task("greater_than", organism_tokenizer, "val", n=2824)) == 2824


def cli(*args, timeout=120):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", WANDB_MODE="disabled")
    return subprocess.run([sys.executable, "-m", "condense.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_user_errors_end_in_one_line(tmp_path):
    """Under the console command a user's mistake is one line on stderr, exit status 1."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("method: eap\nmethod: eap_ig\n")
    for args, words in ((["run", "--recipe", str(tmp_path / "nope.yaml")], "no such recipe file"),
                        (["run", "--recipe", str(bad)], "twice"),
                        (["run", "--recipe", "recipes/eap/organism.yaml", "faithfulness_threshold=5"],
                         "faithfulness_threshold"),
                        (["verify", str(tmp_path)], "circuit.json")):
        proc = cli(*args)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 1, proc.stderr
        assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], proc.stderr
        assert "Traceback" not in proc.stderr



def test_module_forms_end_in_one_line_too(tmp_path):
    """`python -m condense.verify` (and the other module forms the README names) are the
    subcommands: a user's mistake is the same one line, not a traceback."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", WANDB_MODE="disabled")
    for module, args, words in (("condense.verify", [str(tmp_path)], "no circuit.json to verify"),
                                ("condense.explain", [str(tmp_path)], "no circuit.json to explain"),
                                ("condense.verify.run", [str(tmp_path)], "no circuit.json to verify"),
                                ("condense.organism", ["--recipe", str(tmp_path / "nope.yaml")],
                                 "no such recipe file")):
        proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 1, (module, proc.stderr)
        assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], proc.stderr


def test_ctrl_c_says_how_to_resume(tmp_path, monkeypatch, capsys):
    from condense import cli as cli_module

    def interrupted(argv=None):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli_module, "main", interrupted)
    with pytest.raises(SystemExit) as e:
        cli_module.entry()
    assert e.value.code == 130
    err = capsys.readouterr().err
    assert "interrupted; rerun the same command: it goes on where it stopped" in err
    assert "Traceback" not in err


def test_a_run_folder_with_a_gzipped_circuit_reads(finished_run, tmp_path):
    # shipped scoring runs keep circuit.json.gz (every edge's score): verify and the
    # benchmarks read them as they read circuit.json
    import gzip
    import shutil

    from condense.models import load_model
    folder = str(tmp_path / "gz")
    shutil.copytree(finished_run, folder)
    plain = os.path.join(folder, "circuit.json")
    with open(plain, "rb") as f, gzip.open(plain + ".gz", "wb") as g:
        g.write(f.read())
    before = runs.read_run(finished_run)
    os.remove(plain)
    after = runs.read_run(folder)
    assert after.circuit_path.endswith("circuit.json.gz")
    model = load_model(after.config.model)
    assert (after.circuit(model).in_graph == before.circuit(model).in_graph).all()
    os.remove(plain + ".gz")
    with pytest.raises(FileNotFoundError, match="no circuit.json"):
        runs.read_run(folder)
