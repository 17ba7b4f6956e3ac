"""The fidelity card (condense.fidelity, docs/fidelity.md) and what it is built from: intervals,
searches under a named rule, node ablation and the paraphrase sets, on tiny models."""
import json
import math
import os

import pytest
import torch

from condense import fidelity, tasks
from condense.curves import Rule, smallest_passing
from condense.evaluate import evaluate, reference_outputs
from condense.graph import Graph
from condense.intervals import bootstrap, proportion, wilson
from condense.node_ablation import node_ablation_effects

from .test_condense import full_run, tiny_model  # noqa: F401 - the module-scoped condensation run

ROOT = os.path.join(os.path.dirname(__file__), "..")
ORGANISM = os.path.join(ROOT, "checkpoints", "organism")


# ---------------------------------------------------------------- intervals
def test_wilson_matches_the_formula_and_stays_in_bounds():
    low, high = wilson(0, 10)
    assert low == 0.0 and abs(high - 0.2775) < 1e-3  # the textbook 0/10 interval
    low, high = wilson(95, 100)
    assert 0.88 < low < 0.89 and 0.978 < high < 0.979
    assert all(math.isnan(x) for x in wilson(0, 0))
    p = proportion([True, False, True, True])
    assert p["k"] == 3 and p["n"] == 4 and p["value"] == 0.75


def test_bootstrap_is_seeded_and_brackets_the_statistic():
    x = torch.arange(100, dtype=torch.float64)
    a, b = bootstrap(x), bootstrap(x)
    assert a == b  # a rerun gives the same interval
    low, high = a["interval"]
    assert low < a["value"] == 49.5 < high and high - low < 20
    ratio = bootstrap([x + 1, x + 2], lambda u, v: float(u.mean() / v.mean()))
    assert ratio["interval"][0] <= ratio["value"] <= ratio["interval"][1] < 1


# ---------------------------------------------------------------- paraphrase sets
@pytest.mark.parametrize("task", sorted(tasks.PARAPHRASES))
def test_paraphrases_are_rows_of_the_task_contract_never_its_prompts(task, organism_tokenizer):
    rows = tasks.load_paraphrases(task, organism_tokenizer, n=40, seed=0)
    assert len(rows) == 40
    for r in rows:
        assert len(r["clean_ids"]) == len(r["corrupted_ids"])
        assert r["answer_id"] != r["distractor_id"]
    seen = set()
    for split in ("train", "val", "test"):
        seen |= set(tasks.load_task(task, organism_tokenizer, split, n=100, seed=0)["clean_text"])
    assert not seen & set(rows["clean_text"])  # new surface forms, not the generator's prompts


def test_second_source_text_is_not_the_general_text(organism_tokenizer):
    blocks = tasks.second_source_text(organism_tokenizer, n_blocks=16, block_size=64)
    assert len(blocks) == 16 and all(len(b) == 64 for b in blocks["input_ids"])
    general = set(tasks.general_text(organism_tokenizer, "val", block_size=64)["text"])
    assert not general & set(blocks["text"])


# ---------------------------------------------------------------- node ablation
def test_node_patching_equals_the_graph_without_the_nodes_outgoing_edges(organism):
    """Patching a head (or MLP) alone with its corrupted value is the graph with every edge out
    of that node removed: two computations of one number."""
    rows = tasks.load_task("ioi", _tok(), "test", n=12, seed=0)
    effects = node_ablation_effects(organism, rows, "patching", batch_size=12, progress=False)
    graph = Graph.from_model(organism)
    ref = reference_outputs(organism, graph, rows, "patching", 12)
    full_ld = evaluate(organism, graph, rows, "patching", 12, reference=ref)["logit_diff"]
    assert abs(full_ld - effects["logit_diff"]) < 1e-4
    for node, (l, h) in (("head", (1, 1)), ("mlp", (0, None))):
        g = graph.copy()
        sender = g.head_sender(l, h) if node == "head" else g.mlp_sender(l)
        g.in_graph[sender, :] = False
        ld = evaluate(organism, g, rows, "patching", 12, reference=ref)["logit_diff"]
        want = effects["heads"][l, h] if node == "head" else effects["mlps"][l]
        assert abs((full_ld - ld) - float(want)) < 1e-4, node


def _tok():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(ORGANISM)


# ---------------------------------------------------------------- one rule, and the completion
def _ranked_graph(model, rows):
    from condense.attribute import attribute
    g = Graph.from_model(model)
    attribute(model, g, rows, "eap_ig_inputs", ig_steps=2, batch_size=16, progress=False)
    return g


def test_searches_under_a_named_rule_return_circuits_that_pass_it(organism):
    tok = _tok()
    train = tasks.load_task("ioi", tok, "train", n=16, seed=0)
    val = tasks.load_task("ioi", tok, "val", n=32, seed=0)
    ranked = _ranked_graph(organism, train)
    for rule in (Rule("faithfulness", 0.8), Rule("gate", accuracy_tol=0.05), Rule("both", 0.8)):
        found = smallest_passing(organism, ranked, val, rule, batch_size=32)
        assert found.n is not None
        m = evaluate(organism, found.graph, val, "patching", 32)
        assert rule.passes(m), rule.name  # evaluated again, apart from the search
        if found.n > 1:  # a boundary: one fewer ranked edge fails
            assert not rule.passes(found.evaluations[max(k for k in found.evaluations if k < found.n)])
    with pytest.raises(ValueError, match="choose one of"):
        Rule("nonsense")


def test_frozen_completion_is_a_faithful_superset_of_the_circuit(organism):
    tok = _tok()
    train = tasks.load_task("ioi", tok, "train", n=16, seed=0)
    val = tasks.load_task("ioi", tok, "val", n=32, seed=0)
    ranked = _ranked_graph(organism, train)
    # a small circuit that is not faithful by itself: the two best-ranked edges
    circuit = ranked.copy()
    circuit.apply_topn(2)
    base_f = evaluate(organism, circuit, val, "patching", 32)["faithfulness"]
    assert base_f < 0.9
    found = smallest_passing(organism, ranked, val, Rule("faithfulness", 0.9), batch_size=32, base=circuit)
    assert found.n is not None and found.n > 0
    completed = found.graph.in_graph & found.graph.valid
    kept = circuit.copy()
    kept.prune()
    assert bool((completed | ~(kept.in_graph & kept.valid)).all())  # every circuit edge on a path stays
    assert evaluate(organism, found.graph, val, "patching", 32)["faithfulness"] >= 0.9


# ---------------------------------------------------------------- the card on a run
def test_adapter_off_equals_the_base_model_loaded_without_peft(full_run, tiny_model):  # noqa: F811
    from condense.models import load_model
    from condense.runs import read_run
    out, _ = full_run
    run = read_run(out)
    net, tok, _ = run.load_model(threads=1)
    circuit = run.circuit(net)
    rows = tasks.load_task("ioi", tok, "test", n=24, seed=0)
    with fidelity.original(net):
        ref = reference_outputs(net, circuit, rows, "patching", 8)
        off = evaluate(net, circuit, rows, "patching", 8, reference=ref, per_row=True)
    on = evaluate(net, circuit, rows, "patching", 8, per_row=True)
    base = load_model(tiny_model)
    plain = evaluate(base, circuit, rows, "patching", 8, per_row=True)
    assert torch.allclose(off["per_row"]["logit_diff"], plain["per_row"]["logit_diff"], atol=1e-5)
    assert abs(off["faithfulness"] - plain["faithfulness"]) < 1e-4
    # and the adapter is really on otherwise: the healed circuit differs from the original one
    assert not torch.allclose(on["per_row"]["logit_diff"], plain["per_row"]["logit_diff"], atol=1e-5)


def test_the_condensation_run_writes_its_card(full_run):  # noqa: F811
    out, metrics = full_run
    with open(os.path.join(out, "fidelity.json")) as f:
        card = json.load(f)
    for section in fidelity.SECTIONS:
        assert section in card, section
    assert metrics["fidelity"]["summary"]["edges"] == metrics["edges"] == card["edges"]
    s = card["summary"]
    lo, hi = s["choice_agreement"]["interval"]
    assert lo <= s["choice_agreement"]["value"] <= hi
    assert set(card["full_model"]["tasks"]) == set(tasks.TASKS)
    assert card["full_model"]["text"]["tokens"] >= 16_000
    completion = card["adapter_off"]["completion"]
    assert completion["added"] is None or completion["edges"] >= 1
    from condense.report import write_report
    page = open(write_report(out)).read()
    assert "Fidelity to the original" in page and "adapter off: faithfulness" in page


def _organism_with_adapter(scale):
    """The organism with a LoRA on its output projections; scale 0 leaves it the original,
    a large scale breaks it (what a heal gone wrong leaves)."""
    from peft import LoraConfig, get_peft_model

    from condense.models import load_model
    base = load_model(ORGANISM)
    net = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["c_proj"], init_lora_weights=True))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
    return net.eval()


class _Cfg:
    task, seed, n_val, intervention, batch_size = "ioi", 0, 32, "patching", 32


def test_card_flags_an_adapter_that_breaks_the_full_model():
    small = fidelity.FidelityConfig(sections="full_model,adapter", task_rows=40, text_blocks=8)
    broken = _organism_with_adapter(scale=3.0)
    card = fidelity.measure(broken, _tok(), Graph.from_model(broken), _Cfg(), small)
    assert any("healed full model does" in f for f in card["flags"]), card["flags"]
    assert any(v.get("broken") for v in card["full_model"]["tasks"].values())
    assert card["adapter"]["modules"][0]["ratio"] > 0.1
    intact = _organism_with_adapter(scale=0.0)  # a zero adapter: the original itself
    card = fidelity.measure(intact, _tok(), Graph.from_model(intact), _Cfg(), small)
    assert not any("healed full model" in f for f in card["flags"])
    assert all(v["drop"] == 0 for v in card["full_model"]["tasks"].values() if "drop" in v)
    assert abs(card["full_model"]["text"]["ppl_ratio"]["value"] - 1) < 1e-6


def test_fidelity_command_writes_the_card_and_refuses_bad_options(full_run, tmp_path, capsys):  # noqa: F811
    import shutil

    from condense.fidelity_command import main
    out, _ = full_run
    run = str(tmp_path / "run")
    shutil.copytree(out, run)
    os.remove(os.path.join(run, "fidelity.json"))
    assert main([run, "--sections", "distribution,adapter_off", "--rows", "16", "--error_rows", "1",
                 "--threads", "1"]) == 0
    with open(os.path.join(run, "fidelity.json")) as f:
        card = json.load(f)
    assert "adapter_off" in card and "full_model" not in card
    with open(os.path.join(run, "metrics.json")) as f:
        assert "adapter_off_faithfulness" in json.load(f)["fidelity"]["summary"]
    assert main([run, "--sections", "distribution,bogus"]) == 2
    assert "bogus" in capsys.readouterr().err
