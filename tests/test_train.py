"""The run entry point condense/train.py with one-shot edge scorers: a recipe run end to end on
a tiny random GPT-2 (artifacts, circuit.json against metrics.json), the checks that fail
before a model loads, key=value overrides, and the shipped recipes."""
import glob
import json
import os
import subprocess
import sys

import pytest
from transformers import GPT2LMHeadModel

from condense import runs, train
from condense.methods import methods
from condense.config import RecipeError
from condense.graph import Graph

from .conftest import write_recipe

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def small_recipe(folder, model, **keys):
    return write_recipe(folder, model=model, task="ioi", n_train=8, n_val=8, n_test=8,
                        batch_size=8, **keys)


def test_recipe_run_writes_artifacts(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    recipe = small_recipe(tmp_path, tiny_model_dir, method="eap")
    # the override replaces the recipe's method, and output_dir goes where we say
    metrics = train.main(["--recipe", recipe, "method=eap_ig", "ig_steps=2", f"output_dir={out}"])
    for name in ("circuit.json", "recipe.yaml", "metrics.json", "circuit.png", "curve.png"):
        assert (out / name).stat().st_size > 0, name
    assert not glob.glob(str(out / "*.tmp")) and not glob.glob(str(out / ".*.tmp"))
    with open(out / "metrics.json") as f:
        saved = json.load(f)
    assert saved == json.loads(json.dumps(metrics))
    assert saved["method"] == "eap_ig" and saved["attribution_method"] == "eap_ig_inputs"
    assert saved["n_train"] == saved["n_val"] == saved["n_test"] == 8
    for key in ("faithfulness", "accuracy", "logit_diff", "kl", "cpr", "cmd", "rank_seconds",
                "search_seconds", "n_requested"):
        assert key in saved, key

    model = GPT2LMHeadModel.from_pretrained(tiny_model_dir)
    graph = Graph.from_json(out / "circuit.json", model)
    assert graph.count_edges() == graph.count_edges(on_path=True) == saved["edges"]
    assert bool(graph.scores.abs().sum() > 0)  # every edge's score is kept, not only the circuit's

    # recipe.yaml is the fully resolved recipe: it starts with the command that reruns it and
    # parses back into the same config
    with open(out / "recipe.yaml") as f:
        first = f.readline()
    assert first.strip() == f"# condense run --recipe {out}/recipe.yaml"
    again = runs.load_config(str(out / "recipe.yaml"))
    assert again.method == "eap_ig" and again.ig_steps == 2 and again.output_dir == str(out)


def test_an_interrupted_scoring_run_goes_on_from_its_scores_and_evaluations(tiny_model_dir, tmp_path,
                                                                             monkeypatch):
    """state/scoring.pt keeps the scores once ranked and each top-n evaluation as it is made:
    killed at the curves' fifth evaluation, the rerun does not rank again, evaluates only what
    is left, and writes the uninterrupted run's circuit and numbers (and the killed run's
    ranking time)."""
    import condense.curves
    import condense.methods.scoring as scoring
    import torch
    recipe = small_recipe(tmp_path, tiny_model_dir, method="eap_ig", ig_steps=2)
    real_attribute, real_evaluate = scoring.attribute, condense.curves.evaluate
    calls = {"rank": 0, "evaluate": 0, "kill_at": None}

    def ranking(*a, **k):
        calls["rank"] += 1
        return real_attribute(*a, **k)

    def evaluating(*a, **k):
        calls["evaluate"] += 1
        if calls["evaluate"] == calls["kill_at"]:
            raise KeyboardInterrupt
        return real_evaluate(*a, **k)
    monkeypatch.setattr(scoring, "attribute", ranking)
    monkeypatch.setattr(condense.curves, "evaluate", evaluating)
    whole = train.main(["--recipe", recipe, f"output_dir={tmp_path / 'whole'}"])
    whole_evaluations = calls["evaluate"]
    out = tmp_path / "out"
    calls.update(rank=0, evaluate=0, kill_at=5)
    with pytest.raises(KeyboardInterrupt):
        train.main(["--recipe", recipe, f"output_dir={out}"])
    saved = torch.load(out / "state" / "scoring.pt", weights_only=True)
    assert calls["rank"] == 1 and sum(len(m) for m in saved["memos"].values()) == 4
    calls.update(rank=0, evaluate=0, kill_at=None)
    resumed = train.main(["--recipe", recipe, f"output_dir={out}"])
    assert calls["rank"] == 0 and calls["evaluate"] == whole_evaluations - 4
    assert not (out / "state").exists()  # it held only the resume file
    timings = ("rank_seconds", "curve_seconds", "search_seconds")
    assert {k: v for k, v in resumed.items() if k not in timings} == \
        {k: v for k, v in whole.items() if k not in timings}
    assert resumed["rank_seconds"] == saved["rank_seconds"] > 0
    assert resumed["curve_seconds"] >= saved["seconds"]["curve"] > 0
    assert (out / "circuit.json").read_text() == (tmp_path / "whole" / "circuit.json").read_text()


def test_unknown_key_fails_before_any_model_loads(tmp_path, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded")
    monkeypatch.setattr(runs, "load_model", no_loading)
    recipe = small_recipe(tmp_path, "no/such/model", method="eap", learning_rat=0.1)
    with pytest.raises(RecipeError) as e:
        train.main(["--recipe", recipe])
    message = str(e.value)
    assert "learning_rat" in message and "allowed keys" in message
    assert all(k in message for k in ("method", "task", "ig_steps", "faithfulness_threshold"))
    with pytest.raises(RecipeError, match="n_train"):  # a wrong type, from an override
        train.main(["--recipe", small_recipe(tmp_path, "no/such/model"), "n_train=many"])


def test_unknown_method_names_the_valid_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    recipe = small_recipe(tmp_path, "no/such/model", method="eap_ig")
    with pytest.raises(RecipeError) as e:
        train.main(["--recipe", recipe, "method=acdc"])
    message = str(e.value)
    assert "acdc" in message
    assert all(m in message for m in ("eap", "eap_ig", "eap_ig_activations", "eap_gp", "random"))
    for key, value in (("task", "sorting"), ("intervention", "resample"), ("report_to", "mlflow")):
        with pytest.raises(RecipeError, match=key):
            train.main(["--recipe", recipe, f"{key}={value}"])


def test_overrides_and_default_output_dir(tmp_path):
    recipe = small_recipe(tmp_path, "some/model", method="eap")
    cfg = runs.load_config(recipe, ["n_val=3", "faithfulness_threshold=0.8", "report_to=wandb"])
    assert (cfg.n_val, cfg.faithfulness_threshold, cfg.report_to) == (3, 0.8, "wandb")
    # the folder follows method, model and task, so a task override does not share a folder
    assert cfg.output_dir == os.path.join("checkpoints", "eap_model_ioi")
    assert runs.load_config(recipe, ["method=random", "task=induction"]).output_dir.endswith(
        "random_model_induction")
    assert runs.load_config(recipe, ["model=smollm2-135m"]).output_dir.endswith("eap_smollm2_ioi")


def test_shipped_recipes_parse_and_name_their_command():
    paths = sorted(glob.glob(os.path.join(ROOT, "recipes", "*", "*.yaml")))
    assert len(paths) >= 30
    for path in paths:
        rel = os.path.relpath(path, ROOT)
        with open(path) as f:
            first = f.readline().strip()
        assert first == f"# condense run --recipe {rel}" or first.startswith(f"# condense run --recipe {rel} [")
        cfg = runs.load_config(path)
        assert cfg.method in methods() and cfg.output_dir


def test_shipped_runs_recipes_rerun_them():
    """Each shipped run's recipe.yaml is the command that reruns it, for today's keys (the
    organism's is its training recipe, `condense organism --recipe`)."""
    paths = [p for p in sorted(glob.glob(os.path.join(ROOT, "checkpoints", "*", "recipe.yaml")))
             if os.path.basename(os.path.dirname(p)) != "organism"]
    assert len(paths) >= 20
    for path in paths:
        cfg = runs.load_config(path)
        assert cfg.method in methods(), path


def test_runs_by_path_under_accelerate_launch(tiny_model_dir, tmp_path):
    """accelerate runs the script by path (no package), which must still import condense."""
    out = tmp_path / "launched"
    recipe = small_recipe(tmp_path, tiny_model_dir, method="random")
    env = dict(os.environ, PYTHONPATH="", WANDB_MODE="disabled", HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           os.path.join(ROOT, "accelerate_configs", "cpu.yaml"),
           os.path.join(ROOT, "condense", "train.py"), "--recipe", recipe, f"output_dir={out}",
           "threads=1"]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(out / "metrics.json") as f:
        assert json.load(f)["method"] == "random"
    bad = subprocess.run([sys.executable, os.path.join(ROOT, "condense", "train.py"), "--recipe",
                          recipe, "method=acdc"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode != 0 and "valid: " in bad.stderr and "eap_ig" in bad.stderr
    # as a module, the same (python -m condense.train, accelerate launch -m condense.train)
    by_module = tmp_path / "by_module"
    done = subprocess.run([sys.executable, "-m", "condense.train", "--recipe", recipe,
                           f"output_dir={by_module}", "threads=1"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(by_module / "metrics.json") as f:
        assert json.load(f)["method"] == "random"
