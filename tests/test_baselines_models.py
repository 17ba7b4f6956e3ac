"""benchmarks/smollm2_baselines.py on a model other than SmolLM2: the same recipes with the model
overridden, kept where benchmarks/condense_grid.py --model reads them."""
import importlib.util
import json
import os

import pytest

BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "benchmarks")


@pytest.fixture
def baselines(monkeypatch):
    monkeypatch.syspath_prepend(BENCHMARKS)  # the script imports condense_grid beside it
    spec = importlib.util.spec_from_file_location(
        "smollm2_baselines", os.path.join(BENCHMARKS, "smollm2_baselines.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_runs_add_the_model_only_when_it_is_not_smollm2(baselines, tmp_path, monkeypatch):
    commands = []

    def fake_run(cmd, **kwargs):
        commands.append(cmd)
        return type("Done", (), {"returncode": 1})()  # failed: nothing timed or kept
    monkeypatch.setattr(baselines.subprocess, "run", fake_run)
    job = ("eap_ig", "ioi", "recipes/eap_ig/smollm2_ioi.yaml", [])
    baselines.run_one(job, str(tmp_path / "a"))
    baselines.run_one(job, str(tmp_path / "b"), model="gemma3-270m")
    assert not any(k.startswith("model=") for k in commands[0])
    assert "model=gemma3-270m" in commands[1]


def test_keep_writes_the_models_own_baseline_folder(baselines, tmp_path, monkeypatch):
    monkeypatch.setattr(baselines, "ROOT", str(tmp_path))
    run = tmp_path / "runs" / "eap_ig_ioi"
    run.mkdir(parents=True)
    (run / "circuit.json").write_text("{}")
    (run / "metrics.json").write_text(json.dumps(dict(edges=49)))
    (run / "curve.png").write_bytes(b"png")
    (run / "recipe.yaml").write_text("method: eap_ig\nmodel: gemma3-270m\ntask: ioi\n"
                                     "output_dir: runs/eap_ig_ioi\n")
    rows = [dict(method="eap_ig", task="ioi", run="eap_ig_ioi", overrides=[]),
            dict(method="eap_ig", task="ioi", run="eap_ig_ioi_rows128", overrides=["n_train=128"])]
    baselines.keep_circuits(rows, str(tmp_path / "runs"), "gemma3")
    kept = tmp_path / "checkpoints" / "eap_ig_gemma3_ioi"
    assert json.loads((kept / "metrics.json").read_text()) == dict(edges=49)
    assert (kept / "circuit.json.gz").exists() and "eap_ig_gemma3_ioi" in (kept / "recipe.yaml").read_text()
    assert not (tmp_path / "checkpoints" / "eap_ig_smollm2_ioi").exists()


def test_an_unknown_model_is_refused_before_any_run(baselines, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(baselines, "run_one", lambda *a: (_ for _ in ()).throw(AssertionError("ran")))
    with pytest.raises(SystemExit) as e:
        baselines.main(["--model", "no-such-model", "--only", "eap_ig", "--tasks", "ioi",
                        "--out", str(tmp_path)])
    assert e.value.code == 2 and "named offline models: smollm2-135m" in capsys.readouterr().err
