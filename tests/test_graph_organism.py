"""The exact graph on the shipped organism: every edge on reproduces the Hugging Face logits
(with and without a LoRA adapter), the full circuit is perfectly faithful, the empty one is
the corrupted model."""
import pytest
import torch
from peft import LoraConfig, get_peft_model

from condense import tasks
from condense.evaluate import evaluate
from condense.graph import Graph
from condense.metrics import pad_batch
from condense.patching import run_graph


@pytest.fixture(scope="module")
def ioi_rows(organism_tokenizer):
    return tasks.load_task("ioi", organism_tokenizer, "test", n=64)


def test_organism_graph_size(organism):
    g = Graph.from_model(organism)
    L, H = organism.config.n_layer, organism.config.n_head
    assert g.n_senders == 1 + L * (H + 1)
    assert g.n_edges == 3 * H * sum(1 + l * (H + 1) for l in range(L)) + \
        sum((l + 1) * (H + 1) for l in range(L)) + g.n_senders


@pytest.mark.parametrize("lora", [False, True])
def test_full_graph_reproduces_organism_logits(organism, ioi_rows, lora):
    model = organism
    if lora:
        torch.manual_seed(0)
        cfg = LoraConfig(r=4, lora_alpha=8, target_modules=["c_proj"], init_lora_weights=False)
        model = get_peft_model(organism, cfg)
    try:
        clean, mask, _ = pad_batch(ioi_rows["clean_ids"][:16])
        corrupted, _, _ = pad_batch(ioi_rows["corrupted_ids"][:16])
        g = Graph.from_model(model)
        with torch.no_grad():
            want = model(input_ids=clean, attention_mask=mask).logits
            got = run_graph(model, g, clean, corrupted, mask)
            real = mask.bool()
            assert (got - want)[real].abs().max() <= 1e-4
            g.apply_topn(0)
            empty = run_graph(model, g, clean, corrupted, mask)
            want_corrupted = model(input_ids=corrupted, attention_mask=mask).logits
            assert (empty - want_corrupted)[real].abs().max() <= 1e-4
    finally:
        if lora:
            model.unload()


def test_full_circuit_faithful_empty_circuit_not(organism, ioi_rows):
    g = Graph.from_model(organism)
    full = evaluate(organism, g, ioi_rows)
    assert abs(full["faithfulness"] - 1) < 1e-4 and full["kl"] < 1e-6
    assert full["logit_diff"] > 1.0
    g.apply_topn(0)
    empty = evaluate(organism, g, ioi_rows)
    assert abs(empty["faithfulness"]) < 1e-4
