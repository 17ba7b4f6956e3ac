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
