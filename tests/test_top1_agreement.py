"""benchmarks/top1_agreement.py on the organism: its --top-n cuts of a frozen scoring run
measure what the run itself measured at its own size, and the original at the full graph."""
import json

import pytest


def test_top_n_cuts_of_a_scoring_run(tmp_path, top1_agreement):
    from condense.runs import load_config, run

    out = str(tmp_path / "eap_ig")
    run(load_config("recipes/eap_ig/organism.yaml",
                    [f"output_dir={out}", "n_train=32", "n_val=32", "n_test=64", "threads=1"]))
    with open(f"{out}/metrics.json") as f:
        m = json.load(f)
    own, full = top1_agreement.breakdown(out, n=64, top_n=[m["n_requested"], m["total_edges"]])
    # the run's own cut, pruned as its search pruned: the same circuit and the same test numbers
    assert own["edges"] == m["edges"] and own["n_requested"] == m["n_requested"]
    assert own["accuracy"] == pytest.approx(m["accuracy"])
    assert own["kl"] == pytest.approx(m["kl"], rel=1e-3, abs=1e-5)
    # every edge on is the original itself
    assert full["edges"] == m["total_edges"]
    assert full["top1_agreement"] == 1.0 and abs(full["kl"]) < 1e-5
    assert full["choice_agreement"] == 1.0
    # the circuit's choice differs from the original's on at least the rows where exactly one
    # of the two gets the answer right
    assert 1 - own["choice_agreement"] >= abs(own["accuracy"] - full["accuracy"]) - 1e-6
    assert full["accuracy"] == pytest.approx(m["accuracy_full"])


def test_counterfactual_draws(tmp_path, top1_agreement):
    """Drawing IOI's third name again: only that token changes, never to a name of the clean
    prompt; the first draw is the run's own measurement, and with every edge on (nothing
    patched) no draw can move the circuit, which is then the original."""
    from condense import tasks
    from condense.models import load_tokenizer
    from condense.runs import load_config, run

    out = str(tmp_path / "eap_ig")
    run(load_config("recipes/eap_ig/organism.yaml",
                    [f"output_dir={out}", "n_train=32", "n_val=32", "n_test=64", "threads=1"]))
    tok = load_tokenizer("checkpoints/organism")
    rows = tasks.load_task("ioi", tok, "test", n=64)
    draws = top1_agreement.redrawn_counterfactuals(rows, tok, 4)
    assert draws[0] == [list(x) for x in rows["corrupted_ids"]]
    for clean, own, *others in zip(rows["clean_ids"], *draws):
        (at,) = [p for p, (a, b) in enumerate(zip(clean, own)) if a != b]
        for d in others:
            assert [p for p, (a, b) in enumerate(zip(own, d)) if a != b] == [at]
            assert d[at] not in clean
    assert any(draws[1][i] != draws[2][i] for i in range(64))

    with open(f"{out}/metrics.json") as f:
        m = json.load(f)
    own, full = top1_agreement.breakdown(out, n=64, top_n=[m["n_requested"], m["total_edges"]],
                                         counterfactuals=4)
    c = own["counterfactual_draws"]
    assert c["draws"] == 4 and c["top1_agreement"][0] == own["top1_agreement"]
    assert c["kl"][0] == pytest.approx(own["kl"], rel=1e-5)
    assert c["agree_every_draw"] <= min(c["top1_agreement"]) <= max(c["top1_agreement"]) \
        <= c["agree_some_draw"]
    assert c["rows_changing"] > 0  # the small circuit reads the third name
    f = full["counterfactual_draws"]
    assert f["rows_changing"] == 0 and f["top1_agreement"] == [1.0] * 4
    assert max(f["kl"]) < 1e-5 and f["averaged_top1_agreement"] == 1.0


def test_counterfactual_draws_need_ioi(top1_agreement):
    from condense import tasks
    from condense.models import load_tokenizer

    tok = load_tokenizer("checkpoints/organism")
    rows = tasks.load_task("induction", tok, "test", n=8)
    with pytest.raises(SystemExit, match="supported task: ioi"):
        top1_agreement.redrawn_counterfactuals(rows, tok, 2)


def test_a_mean_ablation_run(tmp_path, top1_agreement, reevaluate_bench):
    """A run that ablated by the mean is measured with its own means: the breakdown and
    benchmarks/reevaluate.py repeat the run's test numbers. Drawing counterfactuals again is
    refused there, since its pruned edges never carry a corrupted prompt."""
    from condense.runs import load_config, run

    out = str(tmp_path / "eap_ig_mean")
    run(load_config("recipes/eap_ig/organism.yaml",
                    [f"output_dir={out}", "n_train=32", "n_val=32", "n_test=64", "threads=1",
                     "intervention=mean"]))
    with open(f"{out}/metrics.json") as f:
        m = json.load(f)
    (own,) = top1_agreement.breakdown(out, n=64)
    assert own["edges"] == m["edges"]
    assert own["accuracy"] == pytest.approx(m["accuracy"])
    assert own["kl"] == pytest.approx(m["kl"], rel=1e-3, abs=1e-5)
    with pytest.raises(SystemExit, match="ablates by 'mean'"):
        next(top1_agreement.breakdown(out, n=64, counterfactuals=2))
    again = reevaluate_bench.reevaluate(out)
    for key in ("accuracy", "faithfulness", "faithfulness_val", "kl"):
        assert again[f"{key}_change"] == pytest.approx(0, abs=1e-5), key
