"""The sparse subset evaluator on models that normalise the sum of a layer's heads (Gemma2/3):
a layer's heads are recomputed together (condense.verify.plan.HeadGroup) and must equal the
exact patched forward, evaluate() once per subset, and the dense method."""
import pytest
import torch

from condense.means import compute_means
from condense.verify.plan import HeadGroup
from condense.verify.subsets import SubsetEvaluator

from .test_verify import (MIXED_CIRCUIT, TOL, circuit, one_thread, random_model,  # noqa: F401
                          random_rows, reference_logit_diffs)

# MIXED_CIRCUIT plus heads that circuit edges leave but none enters, beside heads whose input
# varies (a0.h2, a0.h3: their share still changes with the subset), and a layer-1 head
# read by a later MLP only
GROUPED_CIRCUIT = MIXED_CIRCUIT + ["a0.h2->a1.h1<q>", "a0.h3->logits", "a1.h1->logits",
                                   "a1.h1->m1"]


def _ids(n, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.cat([torch.tensor([0, 2 ** n - 1]), torch.randint(2 ** n, (6,), generator=gen)])


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_grouped_heads_equal_evaluate(family):
    model, rows = random_model(family), random_rows()
    g = circuit(model, GROUPED_CIRCUIT)
    ev = SubsetEvaluator(model, g, rows, batch_size=4, max_elements=4096, max_subsets_per_pass=3)
    groups = [u for u in ev.units if isinstance(u, HeadGroup)]
    assert [u.layer for u in groups] == [0, 1]
    # layer 0: a0.h2 and a0.h3 are outputs that no circuit edge enters
    assert sorted(m.head for m in groups[0].members) == [0, 1]
    assert sorted(groups[0].heads.values()) == [0, 1, 2, 3]
    ids = _ids(len(GROUPED_CIRCUIT), 0)
    got = ev.mean_logit_diffs(ids)
    want = reference_logit_diffs(model, g, rows, ev.edges, ids)
    assert (got - want).abs().max() < TOL
    dense = SubsetEvaluator(model, g, rows, batch_size=4, method="dense").mean_logit_diffs(ids)
    assert (got - dense).abs().max() < TOL


def test_grouped_heads_with_node_masks_and_mean_ablation():
    model, rows = random_model("gemma3"), random_rows()
    g = circuit(model, GROUPED_CIRCUIT)
    gen = torch.Generator().manual_seed(3)
    g.head_mask = torch.rand(g.head_mask.shape, generator=gen)
    g.neuron_mask = torch.rand(g.neuron_mask.shape, generator=gen)
    means = compute_means(model, g, rows["clean_ids"])
    ids = _ids(len(GROUPED_CIRCUIT), 1)
    for intervention in ("patching", "mean"):
        m = means if intervention == "mean" else None
        ev = SubsetEvaluator(model, g, rows, intervention, means=m, batch_size=4)
        got = ev.mean_logit_diffs(ids)
        want = reference_logit_diffs(model, g, rows, ev.edges, ids, intervention, m)
        assert (got - want).abs().max() < TOL, intervention


def test_a_layer_without_varying_heads_is_not_grouped():
    """Heads that circuit edges leave in a layer where no circuit edge enters a head keep their
    value with every edge off: nothing to recompute."""
    model, rows = random_model("gemma3"), random_rows()
    g = circuit(model, ["input->m0", "m0->a1.h0<q>", "a0.h2->logits", "a1.h0->logits"])
    ev = SubsetEvaluator(model, g, rows, batch_size=4)
    assert [(type(u).__name__, getattr(u, "layer", None)) for u in ev.units] == [
        ("Node", 0), ("HeadGroup", 1)]
    ids = torch.arange(2 ** ev.n_edges)
    want = reference_logit_diffs(model, g, rows, ev.edges, ids)
    assert (ev.mean_logit_diffs(ids) - want).abs().max() < TOL
