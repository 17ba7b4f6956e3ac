"""evaluate() on tiny models: the full circuit is the model and the empty one the corrupted
run (with and without LoRA), and a kept corrupted run gives the same metrics bit for bit."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from condense.evaluate import evaluate, reference_outputs  # noqa: E402
from condense.graph import Graph  # noqa: E402

from .tiny import make_model, moved_token_rows  # noqa: E402


def _dataset(model, n=10, seed=5):
    """Rows of lengths 4..8 whose answer/distractor the corruption moves most."""
    import datasets
    return datasets.Dataset.from_dict(moved_token_rows(model, n, seed, (4, 8), vocab=100))


@pytest.mark.parametrize("lora", [False, True], ids=["base", "lora"])
def test_evaluate_full_and_empty(lora):
    model = make_model("gpt2", lora=lora)
    g = Graph.from_model(model)
    data = _dataset(model)
    ref = reference_outputs(model, g, data, batch_size=4)
    full = evaluate(model, g, data, batch_size=4, reference=ref)
    assert abs(full["logit_diff_full"] - full["logit_diff_empty"]) > 0.1
    assert abs(full["faithfulness"] - 1) < 1e-4 and abs(full["kl"]) < 1e-6
    assert abs(full["logit_diff"] - full["logit_diff_full"]) < 1e-4
    assert full["accuracy"] == full["accuracy_full"] and full["top1"] == full["top1_full"]
    g.apply_topn(0)
    empty = evaluate(model, g, dict(data.to_dict()), batch_size=3)  # dict of lists, own reference
    assert abs(empty["faithfulness"]) < 1e-4 and empty["kl"] > 1e-3
    assert abs(empty["logit_diff"] - empty["logit_diff_empty"]) < 1e-4


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_kept_corrupted_run_gives_the_same_metrics_bit_for_bit(family, monkeypatch):
    import condense.patching as patching
    model = make_model(family)
    g = Graph.from_model(model)
    data = _dataset(model)
    kept = reference_outputs(model, g, data, batch_size=4, keep_ablated=True)
    fresh = reference_outputs(model, g, data, batch_size=4)
    assert len(kept.ablated) == 3 and fresh.ablated is None  # 10 rows in batches of 4
    assert torch.equal(kept.empty_logit_diff, fresh.empty_logit_diff)
    calls = []
    real = patching.ablated_values
    monkeypatch.setattr(patching, "ablated_values", lambda *a, **k: calls.append(1) or real(*a, **k))
    g.scores = torch.randn(g.scores.shape, generator=torch.Generator().manual_seed(1))
    for n in (5, 40):
        g.apply_topn(n)
        calls.clear()
        reused = evaluate(model, g, data, batch_size=4, reference=kept, per_row=True)
        assert not calls  # no corrupted forward: the kept one was used
        again = evaluate(model, g, data, batch_size=4, reference=fresh, per_row=True)
        assert len(calls) == 3
        assert torch.equal(reused["per_row"]["logit_diff"], again["per_row"]["logit_diff"])
        assert torch.equal(reused["per_row"]["kl"], again["per_row"]["kl"])
    calls.clear()  # other batches than the kept ones: computed afresh
    other = evaluate(model, g, data, batch_size=3, reference=kept, per_row=True)
    assert len(calls) == 4
    assert torch.allclose(other["per_row"]["logit_diff"], again["per_row"]["logit_diff"], atol=1e-5)
    # a neuron mask needs the MLP hidden units, which the kept run did not record: recomputed
    g.neuron_mask = (torch.rand(g.neuron_mask.shape, generator=torch.Generator().manual_seed(2)) < 0.5).float()
    calls.clear()
    masked = evaluate(model, g, data, batch_size=4, reference=kept, per_row=True)
    assert len(calls) == 3
    assert torch.equal(masked["per_row"]["logit_diff"],
                       evaluate(model, g, data, batch_size=4, reference=fresh, per_row=True)["per_row"]["logit_diff"])
