"""Damaged, read-only and full run folders (issue 74): every case ends in one line (exit 1)
naming the file or the folder, or in a correct result; never a traceback. On copies of the
shipped organism C1 (checkpoints/condense_organism_ioi) and of tiny random-GPT-2 runs; the last
test kills runs of four methods at random writes and checks that every file is then valid or
absent and that a rerun ends with the uninterrupted run's circuit."""
import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys

import pytest
import torch

from condense import artifacts, cli, runs
from condense.artifacts import CannotWrite, DamagedFile
from condense.optimize import Diverged, FitState, fit

from .conftest import write_recipe

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
C1 = os.path.join(ROOT, "checkpoints", "condense_organism_ioi")


@pytest.fixture
def c1(tmp_path, monkeypatch):
    """A copy of the organism C1 without its state and outputs; the working folder is the
    repository's (its recipe names checkpoints/organism)."""
    if not os.path.exists(os.path.join(C1, "circuit.json")):
        pytest.skip("needs the shipped organism C1")
    folder = str(tmp_path / "c1")
    shutil.copytree(C1, folder, ignore=shutil.ignore_patterns("state", "verify*", "explain*"))
    monkeypatch.chdir(ROOT)
    return folder


def one_line(monkeypatch, *argv) -> str:
    """Run `condense ARGV` as the console script does; the one line it exits with."""
    monkeypatch.setattr(sys, "argv", ["condense", *argv])
    with pytest.raises(SystemExit) as e:
        cli.entry()
    message = e.value.code
    assert isinstance(message, str), f"exit {message!r}, not a one-line error"  # exit status 1
    assert message.startswith("error: ") and "\n" not in message, message
    return message


@pytest.fixture
def no_model(monkeypatch):
    """Any model load fails the test: the refusal must come before it."""
    def refused(*a, **k):
        raise AssertionError("a model was loaded before the refusal")
    monkeypatch.setattr(runs, "load_model", refused)


def cut(path, keep):
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:keep] if keep >= 0 else data[:keep])


# ---------------------------------------------------------------- damaged files
@pytest.mark.parametrize("command", ["verify", "explain", "report"])
def test_a_cut_off_circuit_is_one_line(c1, monkeypatch, no_model, command):
    cut(os.path.join(c1, "circuit.json"), 300)
    message = one_line(monkeypatch, command, c1)
    assert "circuit.json: cut off after 300 characters" in message and "rerun" in message


def test_a_cut_off_rounds_log_keeps_its_lines(c1, monkeypatch, capsys):
    cut(os.path.join(c1, "rounds.jsonl"), -40)
    records = artifacts.read_jsonl(os.path.join(c1, "rounds.jsonl"))
    assert "last line" in capsys.readouterr().err and len(records) >= 1
    os.remove(os.path.join(c1, "report.html"))
    from condense import report
    assert report.main([c1]) == 0
    assert os.path.getsize(os.path.join(c1, "report.html")) > 0
    # verify goes on, and now its refresh of the report is written too
    os.remove(os.path.join(c1, "report.html"))
    from condense.verify.run import verify_run
    verify_run(c1, n=8, threads=1, progress=False)
    assert os.path.exists(os.path.join(c1, "verify.json"))
    assert os.path.exists(os.path.join(c1, "report.html"))
    # a bad line before the last is damage, not a cut-off append
    with open(os.path.join(c1, "rounds.jsonl"), "a") as f:
        f.write('\n{"round": 99}\n')  # a whole line after the cut one
    with pytest.raises(DamagedFile, match="line"):
        artifacts.read_jsonl(os.path.join(c1, "rounds.jsonl"))


def test_a_truncated_adapter_is_one_line(c1, monkeypatch, no_model):
    cut(os.path.join(c1, "adapter_model.safetensors"), 5)
    message = one_line(monkeypatch, "verify", c1, "--n", "8")
    assert "adapter_model.safetensors: not a whole tensor file" in message


def test_nan_in_adapter_weights_and_metrics_is_refused_with_the_count(c1, monkeypatch, no_model):
    from safetensors.torch import load_file, save_file
    path = os.path.join(c1, "adapter_model.safetensors")
    weights = load_file(path)
    name = sorted(weights)[0]
    weights[name].view(-1)[:3] = float("nan")
    save_file(weights, path)
    assert "3 of its" in one_line(monkeypatch, "verify", c1, "--n", "8")
    metrics = json.load(open(os.path.join(c1, "metrics.json")))
    metrics["accuracy"] = float("nan")
    with open(os.path.join(c1, "metrics.json"), "w") as f:
        json.dump(metrics, f)
    message = one_line(monkeypatch, "report", c1)
    assert "metrics.json: 1 NaN/Inf" in message and "accuracy" in message


def test_nan_scores_are_refused_as_init_circuit(c1, tmp_path, monkeypatch):
    circuit = json.load(open(os.path.join(c1, "circuit.json")))
    for e in list(circuit["edges"].values())[:2]:
        e["score"] = float("nan")
    bad = str(tmp_path / "nan_circuit.json")
    with open(bad, "w") as f:
        json.dump(circuit, f)
    recipe = write_recipe(str(tmp_path), method="condense", model="checkpoints/organism",
                          task="ioi", init_circuit=bad, output_dir=str(tmp_path / "out"))
    message = one_line(monkeypatch, "run", "--recipe", recipe)
    assert "init_circuit" in message and "2 of its" in message and "NaN" in message
    assert not os.path.exists(tmp_path / "out")


# ---------------------------------------------------------------- read-only folders
def read_only(monkeypatch, folder):
    """Make `folder` read-only: chmod, and where that does not stop this process (root) a
    refusal of new files there as a read-only mount gives."""
    for base, dirs, files in os.walk(folder):
        os.chmod(base, 0o555)
    real = artifacts.tempfile.mkstemp

    def mkstemp(*a, dir=None, **k):
        if dir is not None and os.path.abspath(dir).startswith(os.path.abspath(folder)):
            raise OSError(errno.EROFS, "Read-only file system")
        return real(*a, dir=dir, **k)
    if os.geteuid() == 0:
        monkeypatch.setattr(artifacts.tempfile, "mkstemp", mkstemp)


@pytest.mark.parametrize("command", ["verify", "explain", "report"])
def test_a_read_only_run_folder_names_out_before_any_model_loads(c1, monkeypatch, command):
    read_only(monkeypatch, c1)
    with monkeypatch.context() as m:
        m.setattr(runs, "load_model", lambda *a, **k: pytest.fail("model loaded"))
        message = one_line(monkeypatch, command, c1)
    assert "cannot write" in message and "Read-only" in message and "--out" in message
    assert "free there" in message


def test_out_writes_elsewhere(c1, tmp_path, monkeypatch):
    before = sorted(os.listdir(c1))
    read_only(monkeypatch, c1)
    elsewhere = str(tmp_path / "elsewhere")
    from condense import report
    from condense.verify.run import verify_run
    verify_run(c1, n=8, threads=1, progress=False, out_dir=elsewhere)
    assert report.main([c1, "--out", elsewhere]) == 0
    assert {"verify.json", "report.html"} <= set(os.listdir(elsewhere))
    assert sorted(os.listdir(c1)) == before
    for base, dirs, files in os.walk(c1):
        os.chmod(base, 0o755)


# ---------------------------------------------------------------- full disks
def test_a_full_disk_stops_in_one_line_and_the_rerun_ends_with_the_same_circuit(
        tiny_model_dir, tmp_path, monkeypatch):
    recipe = write_recipe(str(tmp_path), method="condense", model=tiny_model_dir, task="ioi",
                          n_train=8, n_val=8, n_test=8, ig_steps=1, batch_size=8, heal_steps=2,
                          heal_batch_size=4, lora_rank=2, lora_alpha=4, n_general=2,
                          max_rounds=3, threads=1, gate_accuracy_tol=1.0, gate_ppl_ratio=10.0,
                          report_to="none")
    whole = str(tmp_path / "whole")
    runs.run(runs.load_config(recipe, [f"output_dir={whole}"]))
    out = str(tmp_path / "full")
    real, calls = os.replace, {"n": 0}

    def full(src, dst):
        if str(dst).startswith(out):
            calls["n"] += 1
            if calls["n"] >= 6:  # in round 2: the disk is full from here on
                raise OSError(errno.ENOSPC, "No space left on device")
        return real(src, dst)
    monkeypatch.setattr(os, "replace", full)
    message = one_line(monkeypatch, "run", "--recipe", recipe, f"output_dir={out}")
    assert "cannot write " + out in message and "No space left" in message and "free there" in message
    monkeypatch.setattr(os, "replace", real)  # space freed
    assert not [f for f in os.listdir(out) if f.endswith(".tmp")]
    runs.run(runs.load_config(recipe, [f"output_dir={out}"]))
    assert edges(out) == edges(whole)


def edges(folder):
    with open(os.path.join(folder, "circuit.json")) as f:
        return sorted(k for k, e in json.load(f)["edges"].items() if e["in_graph"])


# ---------------------------------------------------------------- one writer
@pytest.mark.parametrize("command", ["verify", "explain", "report", "card"])
def test_one_writer_for_verify_explain_report_and_card(c1, monkeypatch, no_model, command):
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with open(os.path.join(c1, ".lock"), "w") as f:
            f.write(str(live.pid))
        argv = ([command, "checkpoints/organism", "--out", c1] if command == "card"
                else [command, c1])
        message = one_line(monkeypatch, *argv)
        assert f"pid {live.pid}" in message and "being written" in message
    finally:
        live.kill()
        live.wait()


# ---------------------------------------------------------------- NaN losses
def test_a_nan_loss_stops_training_at_once_keeping_the_last_good_state(tmp_path):
    w = torch.nn.Parameter(torch.ones(3))
    seen = []

    def loss(step):
        seen.append(step)
        return (w * w).sum() * (float("nan") if step == 3 else 1.0)
    path = str(tmp_path / "training.pt")
    with pytest.raises(Diverged, match="step 3.*last good state"):
        fit([w], loss, 10, lr=0.1, progress=False, state=FitState(path, every=1e9, what="t"))
    assert seen == [0, 1, 2, 3] and torch.isfinite(w).all()
    saved = torch.load(path, weights_only=True)
    assert saved["step"] == 3 and torch.equal(saved["params"][0], w.detach())
    assert Diverged in cli.user_errors()  # the command line prints it in one line


# ---------------------------------------------------------------- random kills
HOOK = """
import os, signal, sys
kill_at, counted = int(os.environ["KILL_AT"]), [0]
real = os.replace
def replace(src, dst):
    if str(src).endswith(".tmp"):
        counted[0] += 1
        if counted[0] == kill_at:  # mid-write: the temporary file written, not yet renamed
            with open(src, "r+b") as f:
                f.truncate(os.path.getsize(src) // 2)
            os.kill(os.getpid(), signal.SIGKILL)
    return real(src, dst)
os.replace = replace
from condense import cli
sys.argv = ["condense", *sys.argv[1:]]
cli.entry()
"""


def count_writes(monkeypatch, do) -> int:
    real, calls = os.replace, {"n": 0}

    def counting(src, dst):
        calls["n"] += str(src).endswith(".tmp")
        return real(src, dst)
    with monkeypatch.context() as m:
        m.setattr(os, "replace", counting)
        do()
    return calls["n"]


def check_valid_or_absent(folder):
    """Every file condense reads back is whole: the checked readers accept it."""
    from condense.graph import check_circuit_json
    for base, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(base, name)
            assert not name.endswith(".tmp") or name.startswith("."), path
            if name.startswith("."):
                continue  # a killed write's temporary file: never read, removed by the next writer
            if name.endswith(".jsonl"):
                artifacts.read_jsonl(path)
            elif name.endswith(".json"):
                data = artifacts.read_json(path)
                if name.startswith("circuit"):
                    check_circuit_json(data, path)
            elif name.endswith(".safetensors"):  # Edge Pruning's log_alpha is -inf where no gate is
                artifacts.read_tensors(path, allow_inf=name == "masks.safetensors")
            elif name.endswith((".png", ".html", ".npy", ".pt")):
                assert os.path.getsize(path) > 0, path


def recipes(tmp_path, model):
    small = dict(model=model, task="ioi", n_train=8, n_val=8, n_test=8, batch_size=8, threads=1,
                 report_to="none")
    return {
        "condense": dict(small, method="condense", ig_steps=1, heal_steps=2, heal_batch_size=4,
                         lora_rank=2, lora_alpha=4, n_general=2, max_rounds=3, heal_lr=1e-3,
                         gate_accuracy_tol=1.0, gate_empty_fails=False, gate_ppl_ratio=10.0),
        "edge_pruning": dict(small, method="edge_pruning", ep_batch_size=8, ep_steps=6,
                             ep_target_sparsity=0.8, ep_ramp_fraction=0.5, ep_lr=0.5,
                             ep_lambda_lr=0.5),
        "s3martcirc": dict(small, method="s3martcirc", ig_steps=1, s3_epochs=2,
                           s3_warmup_epochs=1, s3_k=1, s3_batch_size=8, s3_budgets=[2]),
    }


@pytest.mark.parametrize("method", ["condense", "edge_pruning", "s3martcirc", "verify"])
def test_a_run_killed_at_a_random_write_leaves_valid_files_and_resumes(
        tiny_model_dir, tmp_path, monkeypatch, method):
    rng = random.Random()
    recipe = write_recipe(str(tmp_path), **recipes(tmp_path, tiny_model_dir)[
        "condense" if method == "verify" else method])
    whole, out = str(tmp_path / "whole"), str(tmp_path / "killed")

    def run_into(folder):
        return lambda: runs.run(runs.load_config(recipe, [f"output_dir={folder}"]))
    n = count_writes(monkeypatch, run_into(whole))
    if method == "verify":
        from condense.verify.run import verify_run
        shutil.copytree(whole, out)
        reference = str(tmp_path / "reference")
        shutil.copytree(whole, reference)
        # --local --singles: any circuit size (one-edge removals, the greedy reduction's memo)
        n = count_writes(monkeypatch, lambda: verify_run(reference, n=8, threads=1, progress=False,
                                                         local=True, pairs=False))
        argv = ["verify", out, "--n", "8", "--threads", "1", "--local", "--singles"]
    else:
        argv = ["run", "--recipe", recipe, f"output_dir={out}"]
    kill_at = rng.randint(1, n)
    env = dict(os.environ, KILL_AT=str(kill_at), PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-c", HOOK, *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, (kill_at, n, proc.stderr[-2000:])
    check_valid_or_absent(out)
    if method == "verify":
        verify_run(out, n=8, threads=1, progress=False, local=True, pairs=False)
        got = json.load(open(os.path.join(out, "verify.json")))
        want = json.load(open(os.path.join(reference, "verify.json")))
        for key in set(want) - {"run_dir", "timing"}:
            if "resumed" in key or "replayed" in key:  # what the rerun took from the killed one's saves
                continue
            assert got[key] == want[key], (key, kill_at)
    else:
        run_into(out)()
        assert edges(out) == edges(whole), f"killed at write {kill_at} of {n}"
    check_valid_or_absent(out)
    assert not os.path.exists(os.path.join(out, ".lock"))
