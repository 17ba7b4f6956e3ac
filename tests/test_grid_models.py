"""benchmarks/condense_grid.py on a model other than SmolLM2: the same recipes with the model
overridden, against that model's own EAP-IG baseline."""
import dataclasses
import json
import os

import pytest

from condense.runs import load_config


def _write(path, data):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_grid_on_another_model_reads_its_own_baseline(condense_grid, tmp_path, monkeypatch):
    monkeypatch.setattr(condense_grid, "ROOT", str(tmp_path))
    for tag, edges in (("smollm2", 7451), ("gemma3", 30)):
        _write(tmp_path / "checkpoints" / f"eap_ig_{tag}_ioi" / "metrics.json", dict(edges=edges))
    c1 = dict(edges=5, accuracy=0.99, accuracy_original=1.0, kl=0.1, top1_agreement=0.9,
              ppl_ratio=1.0, faithfulness=0.95, wall_seconds=60.0, rounds=12)
    _write(tmp_path / "grid" / "c1_ioi_s0" / "metrics.json", c1)
    gemma = condense_grid.row_of(str(tmp_path / "grid"), "ioi", 0, 0, "gemma3-270m")
    assert gemma["eap_ig_edges"] == 30 and gemma["eap_ig_over_c1"] == 6
    assert condense_grid.row_of(str(tmp_path / "grid"), "ioi", 0, 0)["eap_ig_edges"] == 7451


def test_grid_refuses_an_unknown_model_before_running(condense_grid, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(condense_grid, "run_one", lambda *a: (_ for _ in ()).throw(AssertionError("ran")))
    with pytest.raises(SystemExit) as e:
        condense_grid.main(["--model", "no-such-model", "--tasks", "ioi", "--out", str(tmp_path)])
    assert e.value.code == 2


def test_a_model_with_its_own_recipe_runs_it_and_others_override_smollm2s(condense_grid):
    recipe, keys = condense_grid.recipe_of("ioi", "smollm2-135m")
    assert recipe.endswith("smollm2_ioi.yaml") and keys == []
    recipe, keys = condense_grid.recipe_of("ioi", "gemma3-270m")
    assert recipe.endswith("gemma3_ioi.yaml") and keys == []
    recipe, keys = condense_grid.recipe_of("agreement", "gemma3-270m")
    assert recipe.endswith("gemma3_agreement.yaml") and keys == []
    recipe, keys = condense_grid.recipe_of("agreement", "Qwen/Qwen2.5-0.5B")  # no Qwen recipe shipped
    assert recipe.endswith("smollm2_agreement.yaml") and keys == ["model=Qwen/Qwen2.5-0.5B"]


def test_gemma_recipes_are_smollm2s_with_the_model_and_heal_dtype_changed(condense_grid):
    # the Gemma IOI grid ran as the SmolLM2 recipe with model=gemma3-270m heal_dtype=null; the
    # Gemma recipes must stay exactly those runs
    folder = os.path.join(condense_grid.ROOT, "recipes", "condense")
    gemma = sorted(n for n in os.listdir(folder) if n.startswith("gemma3_"))
    assert {f"gemma3_{t}.yaml" for t in ("ioi", "agreement", "docstring", "induction")} <= set(gemma)
    for name in gemma:
        ours = dataclasses.asdict(load_config(os.path.join(folder, name)))
        theirs = dataclasses.asdict(load_config(os.path.join(folder, name.replace("gemma3_", "smollm2_"))))
        assert (ours.pop("model"), theirs.pop("model")) == ("gemma3-270m", "smollm2-135m")
        assert ours.pop("heal_dtype") is None
        theirs.pop("heal_dtype")
        assert ours.pop("output_dir") == theirs.pop("output_dir").replace("smollm2", "gemma3")
        assert ours == theirs, name


@pytest.mark.parametrize("argv, named", [
    (["--variants", "c1,c2"], "c2; allowed: c1, c0, heal_only"),
    (["--tasks", "ioi,acronym"], "acronym; tasks with one: agreement, docstring, induction, ioi"),
    (["--seeds", "0,one"], "--seeds 0,one"),
])
def test_grid_names_a_bad_plan_before_running(condense_grid, tmp_path, monkeypatch, capsys, argv, named):
    monkeypatch.setattr(condense_grid, "run_one", lambda *a: (_ for _ in ()).throw(AssertionError("ran")))
    with pytest.raises(SystemExit) as e:
        condense_grid.main([*argv, "--out", str(tmp_path)])
    assert e.value.code == 2 and named in capsys.readouterr().err
