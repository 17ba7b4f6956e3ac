"""Condensation under mean and zero ablation (the `intervention` key): the loop runs to the end,
removed edges carry the ORIGINAL model's means, and the reported test numbers are what an
independent evaluation and `condense verify` compute from the written run."""
import os

import pytest
import torch

from condense.methods.condensation import healing
from tests.test_condense import _recipe, _run


def _independent(out, folder, intervention):
    """The written run's test numbers recomputed from its files: base + adapter from disk, the
    original (adapter off) as reference, and under mean ablation the original's sender means."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from condense import tasks
    from condense.evaluate import EvalReference, empty_logit_diffs, evaluate, reference_outputs
    from condense.graph import Graph
    from condense.means import compute_means
    tok = AutoTokenizer.from_pretrained(folder)
    base = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager")
    model = PeftModel.from_pretrained(base, out).eval()
    circuit = Graph.from_json(os.path.join(out, "circuit.json"), model)
    test = tasks.load_task("ioi", tok, "test", n=8, seed=0)
    means = None
    with model.disable_adapter():
        if intervention == "mean":
            train = tasks.load_task("ioi", tok, "train", n=8, seed=0)
            means = compute_means(model, circuit, train["clean_ids"], batch_size=8)
        original = reference_outputs(model, circuit, test, intervention, 8, means)
    empty = empty_logit_diffs(model, circuit, test, intervention, 8, means)
    ref = EvalReference(original.full_logits, empty, intervention)
    return evaluate(model, circuit, test, intervention, 8, reference=ref, means=means), model, means


@pytest.mark.parametrize("intervention", ["mean", "zero"])
def test_condensation_under_mean_and_zero_ablation(tiny_model_dir, tmp_path, monkeypatch, intervention):
    seen = []
    real = healing.run_graph

    def spy(*args, **kw):  # what the heal's circuit forward was given
        seen.append((kw["intervention"], kw.get("means")))
        return real(*args, **kw)
    monkeypatch.setattr(healing, "run_graph", spy)
    out = str(tmp_path / "out")
    metrics = _run(_recipe(tmp_path, tiny_model_dir, max_rounds=2), f"intervention={intervention}",
                   f"output_dir={out}")
    assert metrics["edges"] > 0 and metrics["rounds"] == 2
    assert seen and all(i == intervention for i, _ in seen)  # the heals ran under it
    assert all((m is not None) == (intervention == "mean") for _, m in seen)
    mine, model, means = _independent(out, tiny_model_dir, intervention)
    for key in ("accuracy", "kl", "top1_agreement", "faithfulness"):
        assert mine[key] == pytest.approx(metrics[key], abs=1e-5), key
    if intervention == "mean":
        # the heal moved the model, so the ADAPTED model's means would be other values: the
        # loop's numbers come from the original's, which a heal cannot change
        from condense.means import compute_means
        adapted = compute_means(model, model_graph(model, out), _train_ids(tiny_model_dir), batch_size=8)
        assert not torch.allclose(adapted.overall[0], means.overall[0])


def model_graph(model, out):
    from condense.graph import Graph
    return Graph.from_json(os.path.join(out, "circuit.json"), model)


def _train_ids(folder):
    from transformers import AutoTokenizer

    from condense import tasks
    return tasks.load_task("ioi", AutoTokenizer.from_pretrained(folder), "train", n=8, seed=0)["clean_ids"]


@pytest.fixture(scope="module")
def mean_run(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mean")
    out = str(tmp / "out")
    return out, _run(_recipe(tmp, tiny_model_dir, max_rounds=2), "intervention=mean", f"output_dir={out}")


def test_verify_reads_a_mean_ablation_run_as_the_loop_measured_it(mean_run):
    """verify computes the means with the adapter off, as the loop did, so its circuit accuracy
    and faithfulness on the run's own test rows are the run's."""
    from condense.verify.run import verify_run
    out, metrics = mean_run
    report = verify_run(out, n=8, progress=False, local=True, reduce=False, pairs=False)
    assert report["intervention"] == "mean"
    assert report["accuracy_circuit"] == pytest.approx(metrics["accuracy"], abs=1e-6)
    assert report["faithfulness_circuit"] == pytest.approx(metrics["faithfulness"], abs=1e-4)


def test_explain_attributes_neurons_under_the_runs_own_mean_ablation(mean_run, tiny_model_dir, tmp_path,
                                                                   monkeypatch):
    """explain's neuron attribution of a mean-ablation run ablates with the original model's
    means, as the loop did (it used to fall back to patching)."""
    from condense.explain import run as explain
    out, _ = mean_run
    seen = []

    def spy(model, graph, rows, intervention="patching", batch_size=16, means=None):
        seen.append((intervention, means))
        return torch.zeros(graph.n_layers, graph.shape.d_mlp)
    monkeypatch.setattr(explain, "neuron_attribution", spy)
    explain.explain_run(out, out_dir=str(tmp_path / "explained"), n_task=8, n_general=2, n_contexts=4,
                        circuitlens=False, progress=None, threads=1)
    assert len(seen) == 1 and seen[0][0] == "mean"
    _, _, original = _independent(out, tiny_model_dir, "mean")
    assert all(torch.equal(a, b) for a, b in zip(seen[0][1].overall, original.overall))


def test_grid_compares_sizes_only_under_one_intervention(condense_grid, tmp_path):
    """The grid refuses a C1 found under mean ablation beside an EAP-IG circuit found under
    patching (their sizes answer different questions), naming both; with `--baselines` run
    under the same intervention it gives the ratio and says which ablation the row used."""
    import json
    grid = condense_grid
    out, base = tmp_path / "runs", tmp_path / "baselines"
    c1 = out / "c1_ioi_s0"
    c1.mkdir(parents=True)
    (c1 / "recipe.yaml").write_text("method: condense\nmodel: nowhere\ntask: ioi\nintervention: mean\n")
    (c1 / "metrics.json").write_text(json.dumps(dict(
        edges=100, accuracy=0.9, accuracy_original=0.95, kl=0.1, top1_agreement=0.9, ppl_ratio=1.0,
        faithfulness=0.9, wall_seconds=60.0, rounds=3)))
    for intervention, edges in (("patching", 7451), ("mean", 71843)):
        (base / intervention / "eap_ig_ioi").mkdir(parents=True)
        (base / intervention / "eap_ig_ioi" / "metrics.json").write_text(
            json.dumps(dict(edges=edges, intervention=intervention)))
    with pytest.raises(SystemExit, match="found under patching, but c1 ran under mean"):
        grid.row_of(str(out), "ioi", 0, 20, baselines=str(base / "patching"))
    row = grid.row_of(str(out), "ioi", 0, 20, baselines=str(base / "mean"))
    assert row["eap_ig_edges"] == 71843 and row["eap_ig_over_c1"] == pytest.approx(718.43)
    assert row["intervention"] == "mean"
    assert "| ioi (mean ablation) | 0 | 71843 | 100 |" in grid.markdown([row], grid.summarize([row]))


def test_grid_refuses_mismatched_or_missing_baselines_before_any_run(condense_grid, tmp_path, capsys,
                                                                    monkeypatch):
    """The same refusal before hours of runs: a baseline found under patching for runs under
    mean ablation, and a --baselines folder without the task's EAP-IG run, exit 2 naming why."""
    import json
    grid = condense_grid
    monkeypatch.setattr(grid, "run_one", lambda *a, **k: pytest.fail("ran before the check"))
    base = tmp_path / "baselines"
    (base / "eap_ig_ioi").mkdir(parents=True)
    (base / "eap_ig_ioi" / "metrics.json").write_text(json.dumps(dict(edges=7451, intervention="patching")))
    out = str(tmp_path / "runs")
    for args, words in (([f"--baselines={base}", "intervention=mean"], "found under patching, the runs "
                                                                        "would run under mean"),
                        ([f"--baselines={tmp_path / 'none'}"], "no eap_ig_ioi/metrics.json")):
        with pytest.raises(SystemExit) as e:
            grid.main(["--tasks", "ioi", "--out", out, *args])
        assert e.value.code == 2 and words in capsys.readouterr().err
