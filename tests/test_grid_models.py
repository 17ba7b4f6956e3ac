"""benchmarks/condense_grid.py on a model other than SmolLM2: the same recipes with the model
overridden, against that model's own EAP-IG baseline."""
import json

import pytest


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
    assert condense_grid.model_args("smollm2-135m") == []
    assert condense_grid.model_args("gemma3-270m") == ["model=gemma3-270m"]


def test_grid_refuses_an_unknown_model_before_running(condense_grid, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(condense_grid, "run_one", lambda *a: (_ for _ in ()).throw(AssertionError("ran")))
    with pytest.raises(SystemExit) as e:
        condense_grid.main(["--model", "no-such-model", "--tasks", "ioi", "--out", str(tmp_path)])
    assert e.value.code == 2
