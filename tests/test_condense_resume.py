"""Interrupted and extended condensation runs: resume after a kill at any write, a state
with a missing file, max_rounds and the final heal changed on resume (tiny random GPT-2)."""
import json
import os
import time

import pytest
import torch

from condense.config import RecipeError
from condense.methods.condensation import healing, loop
from condense.methods.condensation import state as saved_state
from tests.test_condense import _edges, _recipe, _rounds, _run, full_run, tiny_model  # noqa: F401


def test_resume_gives_same_circuit(full_run, tiny_model, tmp_path, monkeypatch):
    out_full, _ = full_run
    out = str(tmp_path / "out")
    recipe = _recipe(tmp_path, tiny_model)
    real = loop.rank
    calls = {"n": 0}

    def crash_in_round_2(*a, **k):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt("killed")
        return real(*a, **k)
    monkeypatch.setattr(loop, "rank", crash_in_round_2)
    with pytest.raises(KeyboardInterrupt):
        _run(recipe, f"output_dir={out}")
    assert not os.path.exists(os.path.join(out, "metrics.json"))
    with open(os.path.join(out, "state", "state.json")) as f:
        assert json.load(f)["round"] == 1
    monkeypatch.setattr(loop, "rank", real)
    _run(recipe, f"output_dir={out}")
    assert [r["round"] for r in _rounds(out)] == [1, 2, 3]
    assert _edges(out) == _edges(out_full)


@pytest.mark.parametrize("kill_after", [1, 2, 3])
def test_kill_between_state_writes_then_rerun(full_run, tiny_model, tmp_path, monkeypatch, kill_after):
    """A round's commit writes the adapter, the circuit and then state.json (and deletes the
    previous round's files). Killed after each of those writes in round 2, the rerun resumes
    and ends with the uninterrupted run's circuit."""
    from condense.graph import Graph
    out_full, _ = full_run
    out = str(tmp_path / "out")
    writes = {"n": 0, "armed": False}

    def counting(real):
        def wrapper(*a, **k):
            result = real(*a, **k)
            path = str(a[1] if real is real_to_json else a[0])
            if os.sep + "state" + os.sep in path and writes["armed"]:
                writes["n"] += 1
                if writes["n"] == kill_after:
                    raise KeyboardInterrupt(f"killed after writing {path}")
            return result
        return wrapper

    real_to_json = Graph.to_json
    real_save = loop._save_state

    def save_state(out_, model, circuit, state):
        writes["armed"] = state["round"] == 2
        return real_save(out_, model, circuit, state)
    monkeypatch.setattr(saved_state, "atomic_write", counting(saved_state.atomic_write))
    monkeypatch.setattr(saved_state, "write_json", counting(saved_state.write_json))
    monkeypatch.setattr(Graph, "to_json", counting(real_to_json))
    monkeypatch.setattr(loop, "_save_state", save_state)
    recipe = _recipe(tmp_path, tiny_model)
    with pytest.raises(KeyboardInterrupt):
        _run(recipe, f"output_dir={out}")
    monkeypatch.undo()
    _run(recipe, f"output_dir={out}")
    assert [r["round"] for r in _rounds(out)] == [1, 2, 3]
    assert _edges(out) == _edges(out_full)
    left = sorted(os.listdir(os.path.join(out, "state")))  # one committed state, nothing else
    assert len(left) == 3 and left[0].startswith("adapter_r") and left[1].startswith("circuit_r")
    assert left[2] == "state.json"


def test_state_with_a_missing_part_is_refused(full_run, tmp_path):
    """A state.json naming a file that is gone is a clear error, not a FileNotFoundError."""
    import shutil
    out = str(tmp_path / "copy")
    shutil.copytree(full_run[0], out)
    for name in ("metrics.json",):
        os.unlink(os.path.join(out, name))
    with open(os.path.join(out, "state", "state.json")) as f:
        state = json.load(f)
    os.unlink(os.path.join(out, "state", state["circuit_file"]))
    recipe = os.path.join(out, "recipe.yaml")
    with pytest.raises(RecipeError, match="missing"):
        _run(recipe, f"output_dir={out}")


def test_max_rounds_caps_or_extends_a_run_on_resume(tiny_model, tmp_path):
    """max_rounds (and n_test) may change between runs in one folder: a run capped at one round
    ends there, and the same command with more rounds resumes it instead of refusing."""
    out = str(tmp_path / "out")
    recipe = _recipe(tmp_path, tiny_model)
    first = _run(recipe, "max_rounds=1", f"output_dir={out}")
    assert first["rounds"] == 1 and len(_rounds(out)) == 1
    again = _run(recipe, "max_rounds=3", f"output_dir={out}")
    assert again["rounds"] == 3 and [r["round"] for r in _rounds(out)] == [1, 2, 3]
    with pytest.raises(RecipeError, match="heal_steps"):  # a key that changes what rounds do
        _run(recipe, "max_rounds=3", "heal_steps=7", f"output_dir={out}")


def test_final_heal_is_gated_recorded_and_undone_when_its_settings_change(tiny_model, tmp_path, monkeypatch):
    """final_heal_steps heals the finished circuit once more: the run's own end is resumed into
    it (no round reruns), the adapter changes, metrics.json records it, a rerun does not heal
    again; other settings (or none) start again from the adapter the final heal started from;
    a final heal the gate rejects leaves the last accepted adapter in place."""
    from safetensors.torch import load_file

    def adapter(folder):
        return load_file(os.path.join(folder, "adapter_model.safetensors"))

    def same(a, b):
        return all(torch.equal(a[k], b[k]) for k in a)
    out = str(tmp_path / "out")
    recipe = _recipe(tmp_path, tiny_model)
    plain = _run(recipe, f"output_dir={out}")
    before = adapter(out)
    assert "final_heal" not in plain
    calls = []
    real = healing.heal
    monkeypatch.setattr(loop, "heal", lambda *a, **k: calls.append((a[4].heal_steps, len(a[2])))
                        or real(*a, **k))
    healed = _run(recipe, "final_heal_steps=5", f"output_dir={out}")
    assert calls == [(5, 8)]  # only the final heal, on the run's 8 train rows: no round reran
    fh = healed["final_heal"]
    assert fh["accepted"] and (fh["steps"], fh["rows"]) == (5, 8)
    assert healed["edges"] == plain["edges"] and healed["rounds"] == plain["rounds"]
    assert not same(before, adapter(out))
    assert _run(recipe, "final_heal_steps=5", f"output_dir={out}")["final_heal"] == fh
    assert calls == [(5, 8)]  # done: not healed again
    more = _run(recipe, "final_heal_steps=5", "final_heal_rows=12", f"output_dir={out}")
    assert calls == [(5, 8), (5, 12)] and more["final_heal"]["rows"] == 12
    off = _run(recipe, f"output_dir={out}")  # no final heal: the rounds' own adapter again
    assert "final_heal" not in off and same(before, adapter(out))
    assert sorted(os.listdir(os.path.join(out, "state")))[0] == "adapter_r" + \
        f"{json.load(open(os.path.join(out, 'state', 'state.json')))['accepted_round']:04d}.safetensors"
    # a gate no final heal can pass: the adapter of the last accepted round stays
    monkeypatch.setattr(loop.Gate, "__call__", lambda self, model, circuit: (False, dict(
        accuracy=0.0, accuracy_empty=0.0, ppl_ratio=1.0, kl=1.0, top1_agreement=0.0, faithfulness=0.0)))
    rejected = _run(recipe, "final_heal_steps=5", f"output_dir={out}")
    assert not rejected["final_heal"]["accepted"] and same(before, adapter(out))


def killed_in_a_heal_then_rerun(recipe, out, monkeypatch, kill_at, sleep=0.0):
    """Run `recipe` into `out` with a KeyboardInterrupt at the heal loss's call `kill_at` (every
    heal saving after each step, each taking `sleep` seconds more), then again undisturbed.
    Returns (the rerun's metrics, the heal steps the rerun took)."""
    import condense.optimize
    monkeypatch.setattr(condense.optimize, "SAVE_EVERY", 0.0)
    real, calls = healing.heal_loss, {"n": 0, "kill": True}

    def counting(*a, **k):
        calls["n"] += 1
        if calls["kill"] and calls["n"] == kill_at:
            raise KeyboardInterrupt("killed mid-heal")
        if calls["kill"]:
            time.sleep(sleep)
        return real(*a, **k)
    monkeypatch.setattr(healing, "heal_loss", counting)
    with pytest.raises(KeyboardInterrupt):
        _run(recipe, f"output_dir={out}")
    calls.update(n=0, kill=False)
    return _run(recipe, f"output_dir={out}"), calls["n"]


def same_adapter(a_dir, b_dir):
    from safetensors.torch import load_file
    a, b = (load_file(os.path.join(d, "adapter_model.safetensors")) for d in (a_dir, b_dir))
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_run_killed_mid_heal_goes_on_from_the_heals_last_save(tiny_model, tmp_path, monkeypatch):
    """Each heal saves itself as it goes (state/heal_rNNNN.pt): killed at the fourth step of
    round 2's heal (after round 1's six), the rerun heals only the three steps left and ends
    with the uninterrupted run's rounds, circuit and adapter. The round's time counts the
    killed process's three heal steps (0.5 s each here) as well as the rerun's."""
    recipe = _recipe(tmp_path, tiny_model, heal_steps=6, max_rounds=2)
    whole, out = str(tmp_path / "whole"), str(tmp_path / "out")
    _run(recipe, f"output_dir={whole}")
    _, healed = killed_in_a_heal_then_rerun(recipe, out, monkeypatch, kill_at=6 + 4, sleep=0.5)
    assert healed == 6 - 3 and not os.path.exists(os.path.join(out, "state", "heal_r0002.pt"))
    assert _rounds(out)[1]["time"] >= 3 * 0.5
    # the run's total wall time counts the killed process up to its last commit (round 1)
    metrics = json.loads(open(os.path.join(out, "metrics.json")).read())
    assert metrics["wall_seconds_total"] >= metrics["wall_seconds"] + _rounds(out)[0]["time"]

    def same(rounds):
        return [{k: v for k, v in r.items() if k != "time"} for r in rounds]
    assert same(_rounds(out)) == same(_rounds(whole))
    assert _edges(out) == _edges(whole) and same_adapter(out, whole)


def test_a_run_killed_in_its_final_heal_goes_on_from_its_last_save(tiny_model, tmp_path, monkeypatch):
    recipe = _recipe(tmp_path, tiny_model, heal_steps=2, max_rounds=1, final_heal_steps=6)
    whole, out = str(tmp_path / "whole"), str(tmp_path / "out")
    whole_metrics = _run(recipe, f"output_dir={whole}")
    metrics, healed = killed_in_a_heal_then_rerun(recipe, out, monkeypatch, kill_at=2 + 5)
    assert healed == 6 - 4 and not os.path.exists(os.path.join(out, "state", "heal_final.pt"))
    fields = ("accepted", "accuracy", "kl", "heal_loss", "steps")
    assert {k: metrics["final_heal"][k] for k in fields} == {k: whole_metrics["final_heal"][k] for k in fields}
    assert same_adapter(out, whole)
