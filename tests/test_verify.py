"""Verifiers for small circuits (condense.verify, condense.verify.subsets): the batched subset
evaluation equals evaluate() subset by subset (several families, LoRA, every intervention);
on a hand-built model with two redundant paths the verifier finds the circuit reducible with
the right minimal subsets and pairwise deltas; oversize circuits are refused before any model
loads; the CLI runs end to end on a saved tiny model with and without an adapter."""
import json
import os

import pytest
import torch
import yaml
from transformers import (AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, Gemma2Config,
                          Gemma3TextConfig, LlamaConfig, MistralConfig, Qwen3Config)

from condense.evaluate import evaluate, reference_outputs
from condense.graph import Graph
from condense.means import compute_means
from condense.verify.subsets import SubsetEvaluator, subset_masks
from condense.verify.analysis import analyse
from condense.verify.run import CircuitTooLarge, check_size, main, verify_circuit, verify_run

from .tiny import randomize_weights

TOL = 1e-4


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models gain nothing from a second thread, and on a busy machine two threads that
    wait on each other make these many small operations several times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             vocab_size=50, max_position_embeddings=64)
CONFIGS = {
    "gpt2": lambda: GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=50, n_positions=64),
    "llama": lambda: LlamaConfig(**SMALL, num_key_value_heads=2, attention_bias=True, mlp_bias=True),
    "qwen3": lambda: Qwen3Config(**SMALL, num_key_value_heads=1, head_dim=16),
    "mistral": lambda: MistralConfig(**SMALL, num_key_value_heads=2, sliding_window=3),
    "gemma2": lambda: Gemma2Config(**SMALL, num_key_value_heads=2, head_dim=8, sliding_window=3,
                                   attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
                                   query_pre_attn_scalar=8),
    "gemma3": lambda: Gemma3TextConfig(**SMALL, num_key_value_heads=2, head_dim=8, sliding_window=3,
                                       layer_types=["sliding_attention", "full_attention"],
                                       query_pre_attn_scalar=8, final_logit_softcapping=3.0),
}
# Edges of a 2-layer, 4-head model: queries read only at the last position (a1.h3's, m0's),
# keys and values at every position (a0.h1 -> a1.h3<k>), MLPs, a node reached through two
# layers, direct logits edges and an edge into a node whose output nobody reads (a1.h0).
MIXED_CIRCUIT = ["input->a0.h0<q>", "input->a0.h1<k>", "input->m0", "a0.h1->m0",
                 "a0.h0->a1.h2<v>", "m0->a1.h2<q>", "a0.h1->a1.h3<k>", "m0->a1.h3<q>",
                 "a1.h2->m1", "a1.h3->logits", "m1->logits", "input->logits", "a0.h0->logits",
                 "input->a1.h0<q>"]


def random_model(family, lora=False, seed=0):
    torch.manual_seed(seed)  # LoRA's random init
    model = randomize_weights(AutoModelForCausalLM.from_config(CONFIGS[family](), attn_implementation="eager"),
                          seed)
    if lora:
        from peft import LoraConfig, get_peft_model
        cfg = LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, fan_in_fan_out=True,
                         target_modules=["c_attn", "c_proj", "c_fc"])
        model = get_peft_model(model, cfg).eval()
    return model


def random_rows(n=6, vocab=50, seed=1):
    """Rows of varied lengths (so batches are right-padded)."""
    gen = torch.Generator().manual_seed(seed)
    rows = dict(clean_ids=[], corrupted_ids=[], answer_id=[], distractor_id=[])
    for i in range(n):
        T = 4 + i % 4
        rows["clean_ids"].append(torch.randint(vocab, (T,), generator=gen).tolist())
        rows["corrupted_ids"].append(torch.randint(vocab, (T,), generator=gen).tolist())
        a, d = torch.randperm(vocab, generator=gen)[:2].tolist()
        rows["answer_id"].append(a)
        rows["distractor_id"].append(d)
    return rows


def circuit(model, names):
    g = Graph.from_model(model)
    g.in_graph.zero_()
    for name in names:
        g.edges[name].in_graph = True
    return g


def subset_edge_mask(graph, edges, mask):
    em = torch.zeros(graph.n_senders, graph.n_receivers)
    for on, (s, r) in zip(mask.tolist(), edges):
        em[s, r] = float(on)
    return em


def reference_logit_diffs(model, graph, rows, edges, ids, intervention="patching", means=None):
    """The slow way: evaluate() once per subset."""
    ref = reference_outputs(model, graph, rows, intervention, batch_size=4, means=means)
    return torch.tensor([evaluate(model, graph, rows, intervention, batch_size=4, means=means,
                                  reference=ref, edge_mask=subset_edge_mask(graph, edges, m))["logit_diff"]
                         for m in subset_masks(ids, len(edges))], dtype=torch.float64)


# ------------------------------------------------------------------ batched == evaluate()

@pytest.mark.parametrize("family,lora", [("gpt2", False), ("gpt2", True), ("llama", False),
                                         ("qwen3", False), ("mistral", False), ("gemma2", False),
                                         ("gemma3", False)])
def test_subsets_equal_evaluate(family, lora):
    model = random_model(family, lora)
    rows = random_rows()
    g = circuit(model, MIXED_CIRCUIT)
    gen = torch.Generator().manual_seed(0)
    n = len(MIXED_CIRCUIT)
    ids = torch.cat([torch.tensor([0, 2 ** n - 1]), torch.randint(2 ** n, (6,), generator=gen)])
    # small passes and element budget: versions and subsets are split across several passes
    ev = SubsetEvaluator(model, g, rows, batch_size=4, max_elements=4096, max_subsets_per_pass=3)
    assert ev.method == "sparse"
    got = ev.mean_logit_diffs(ids)
    want = reference_logit_diffs(model, g, rows, ev.edges, ids)
    assert (got - want).abs().max() < TOL


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_subsets_equal_evaluate_with_node_masks(family):
    """Circuits of node-level methods carry head and MLP-neuron masks: applied as patching does."""
    model = random_model(family)
    rows = random_rows()
    g = circuit(model, MIXED_CIRCUIT)
    gen = torch.Generator().manual_seed(3)
    g.head_mask = torch.rand(g.head_mask.shape, generator=gen)
    g.neuron_mask = torch.rand(g.neuron_mask.shape, generator=gen)
    ids = torch.tensor([0, 3, 500, 7777, 2 ** len(MIXED_CIRCUIT) - 1])
    ev = SubsetEvaluator(model, g, rows, batch_size=4)
    assert ev.method == "sparse"
    got = ev.mean_logit_diffs(ids)
    want = reference_logit_diffs(model, g, rows, ev.edges, ids)
    assert (got - want).abs().max() < TOL


@pytest.mark.parametrize("intervention", ["mean", "zero"])
def test_subsets_equal_evaluate_other_interventions(intervention):
    model = random_model("gpt2")
    rows = random_rows()
    g = circuit(model, MIXED_CIRCUIT)
    means = compute_means(model, g, rows["clean_ids"]) if intervention == "mean" else None
    ids = torch.tensor([0, 1, 77, 4096, 9999, 2 ** len(MIXED_CIRCUIT) - 1])
    for method in ("sparse", "dense"):
        ev = SubsetEvaluator(model, g, rows, intervention, means=means, batch_size=4, method=method)
        got = ev.mean_logit_diffs(ids)
        want = reference_logit_diffs(model, g, rows, ev.edges, ids, intervention, means)
        assert (got - want).abs().max() < TOL, method


# ------------------------------------------------------------------ two redundant paths

A, C, P, N = 0, 1, 2, 3  # clean token, corrupted (neutral) token, answer, distractor
REDUNDANT = ["input->a0.h0<v>", "a0.h0->logits", "input->a0.h1<v>", "a0.h1->logits",
             "input->logits", "input->a0.h0<q>"]


def redundant_model():
    """One layer, two identical heads: each averages "is the token A" (LayerNorm'd embedding,
    dim 0) over the prompt and writes it, times 10, into dims 2 (+) and 3 (-), which the
    answer reads (+) and the distractor (-). Attention is uniform (q, k zero), the MLP zero.
    The final LayerNorm saturates: one head's signal gives almost all of the logit difference,
    so either path {input->a0.hX<v>, a0.hX->logits} alone is faithful. Token C (the corrupted
    prompt) lives in dims 4, 5: it carries no signal and the same norm as A."""
    cfg = GPT2Config(n_layer=1, n_head=2, n_embd=6, vocab_size=8, n_positions=16,
                     tie_word_embeddings=False)
    model = GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.fill_(1.0 if ("ln" in name and name.endswith("weight")) else 0.0)
        t = model.transformer
        t.wte.weight[A] = torch.tensor([1., -1, 0, 0, 0, 0])
        t.wte.weight[C] = torch.tensor([0., 0, 0, 0, 1, -1])
        attn = t.h[0].attn
        for h in range(2):
            attn.c_attn.weight[0, 12 + 3 * h] = 1.0     # v_h = LN(x)[0]
            attn.c_proj.weight[3 * h, 2] = 10.0         # out_h = 10 v_h (e2 - e3)
            attn.c_proj.weight[3 * h, 3] = -10.0
        model.lm_head.weight[P] = torch.tensor([0., 0, 1, -1, 0, 0])
        model.lm_head.weight[N] = -model.lm_head.weight[P]
    return model


def redundant_rows(n=8):
    gen = torch.Generator().manual_seed(0)
    rows = dict(clean_ids=[], corrupted_ids=[], answer_id=[P] * n, distractor_id=[N] * n)
    for i in range(n):
        T = 3 + i % 4
        clean = [A if x < 0.7 else C for x in torch.rand(T, generator=gen).tolist()]
        clean[0] = A
        rows["clean_ids"].append(clean)
        rows["corrupted_ids"].append([C] * T)
    return rows


def test_redundant_paths_reducible():
    model, rows = redundant_model(), redundant_rows()
    g = circuit(model, REDUNDANT)
    report, f, minimal = verify_circuit(model, g, rows, batch_size=3, tau=0.05)
    n = len(REDUNDANT)
    assert report["circuit_faithful"] and not report["irreducible"]
    assert sorted(map(sorted, report["minimal_faithful_subsets"])) == sorted(
        [sorted(REDUNDANT[0:2]), sorted(REDUNDANT[2:4])])
    assert report["faithful_subset_sizes"]["2"] == 2 and report["faithful_subset_sizes"]["0"] == 0

    # the slow way: evaluate() on every subset, the faithfulness rule, minimality by brute force
    edges = SubsetEvaluator(model, g, rows).edges
    ids = torch.arange(2 ** n)
    ref = reference_outputs(model, g, rows, batch_size=3)
    slow_f = torch.tensor([evaluate(model, g, rows, batch_size=3, reference=ref,
                                    edge_mask=subset_edge_mask(g, edges, m))["faithfulness"]
                           for m in subset_masks(ids, n)], dtype=torch.float64)
    assert (f - slow_f).abs().max() < TOL
    faithful = slow_f >= 0.9
    slow_minimal = [k for k in range(2 ** n) if faithful[k] and
                    not any(faithful[j] for j in range(2 ** n) if j != k and j & k == j)]
    assert torch.nonzero(minimal).flatten().tolist() == slow_minimal

    # pairwise: every delta equals evaluate() of the ablated circuit; only cross-path pairs interact
    names = report["edges"]
    m_c = evaluate(model, g, rows, batch_size=3)["logit_diff"]

    def without(*drop):
        em = g.in_graph.float()
        for name in drop:
            e = g.edges[name]
            em[e.s, e.r] = 0.0
        return evaluate(model, g, rows, batch_size=3, reference=ref, edge_mask=em)["logit_diff"] - m_c

    for p in report["pairs"]:
        i, j = names[p["i"]], names[p["j"]]
        assert abs(p["delta_i"] - without(i)) < TOL and abs(p["delta_j"] - without(j)) < TOL
        assert abs(p["delta_ij"] - without(i, j)) < TOL
        cross = {i, j} & set(REDUNDANT[0:2]) and {i, j} & set(REDUNDANT[2:4])
        assert p["interacts"] == bool(cross), (i, j)
    assert report["n_interacting_pairs"] == 4
    assert report["partners"][REDUNDANT[0]] == 2 and report["partners"]["input->logits"] == 0
    assert report["partners_median"] == 2.0  # partners 2, 2, 2, 2, 0, 0


def test_minimality_needs_every_proper_subset():
    """Faithfulness is not monotone, so minimality looks at every proper subset: {e0, e1, e2} is
    faithful and none of its one-edge removals is, yet {e0} alone is faithful."""
    n = 3
    ld = torch.zeros(2 ** n, dtype=torch.float64)
    ld[0b001] = 1.0          # {e0} faithful
    ld[0b011] = 0.0          # {e0, e1} not
    ld[0b111] = 1.0          # {e0, e1, e2} faithful; its one-edge removals are not
    report, _, minimal = analyse(ld, ["e0", "e1", "e2"], 1.0, 0.0, 0.9, 0.05)
    assert report["minimal_faithful_subsets"] == [["e0"]]
    assert not report["irreducible"]


# ------------------------------------------------------------------ refusals and the CLI

def write_run(path, model_path, graph, task="ioi", adapter_model=None, method="eap", **recipe):
    os.makedirs(path, exist_ok=True)
    graph.to_json(os.path.join(path, "circuit.json"))
    with open(os.path.join(path, "recipe.yaml"), "w") as f:
        yaml.safe_dump(dict(method=method, model=str(model_path), task=task, intervention="patching",
                            faithfulness_threshold=0.9, seed=0, batch_size=4, **recipe), f)
    if adapter_model is not None:
        adapter_model.save_pretrained(path)


def test_oversize_message_suggests_what_can_run():
    with pytest.raises(CircuitTooLarge) as small:
        check_size(24)  # within reach: a higher limit is suggested, with its exact cost
    assert "--max-edges 24" in str(small.value) and "16,777,216 subsets" in str(small.value)
    with pytest.raises(CircuitTooLarge) as large:
        check_size(7076)  # 2^7076 is written as a power of ten, and no limit is suggested
    text = str(large.value)
    assert "about 10^2130 subsets, out of reach" in text and "--max-edges 7076" not in text
    assert "--local" in text and "25,038,427 subsets" in text and len(text) < 500


def test_oversize_circuit_refused_before_loading(tmp_path, capsys):
    with torch.device("meta"):
        model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=50))
    g = Graph.from_model(model)  # every edge in the graph: far more than 20
    run = tmp_path / "run"
    write_run(run, tmp_path / "no_such_model", g)  # loading it would fail: it must not be tried
    with pytest.raises(CircuitTooLarge, match=r"limited to 20 edges.*--max-edges"):
        verify_run(str(run))
    assert main([str(run)]) == 2
    err = capsys.readouterr().err
    assert f"{g.n_edges} in-graph edges" in err and "--max-edges 20" in err
    with pytest.raises(CircuitTooLarge, match="limited to 5 edges"):
        verify_circuit(model, g, random_rows(), max_edges=5)
    # a large circuit shipped gzipped is read, and counted, the same way
    (run / "circuit.json").unlink()
    g.to_json(run / "circuit.json.gz")
    with pytest.raises(CircuitTooLarge, match=rf"{g.n_edges} in-graph edges.*limited to 20 edges"):
        verify_run(str(run))


def saved_tiny_gpt2(tmp_path, tokenizer):
    """A random 2-layer GPT-2 on `tokenizer`, saved with it in tmp_path/model: (model, folder)."""
    cfg = GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=len(tokenizer), n_positions=128)
    torch.manual_seed(0)
    base = randomize_weights(GPT2LMHeadModel(cfg))
    model_dir = tmp_path / "model"
    base.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    return base, model_dir


@pytest.mark.parametrize("with_adapter", [False, True])
def test_cli_end_to_end(tmp_path, organism_tokenizer, with_adapter):
    base, model_dir = saved_tiny_gpt2(tmp_path, organism_tokenizer)
    names = ["input->a0.h0<v>", "a0.h0->a1.h1<k>", "a1.h1->logits", "input->logits", "a0.h1->m1",
             "m1->logits"]
    net = base
    if with_adapter:
        from peft import LoraConfig, get_peft_model
        net = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, init_lora_weights=False,
                                              fan_in_fan_out=True, target_modules=["c_proj"])).eval()
    run = tmp_path / "run"
    write_run(run, model_dir, circuit(net, names), adapter_model=net if with_adapter else None)

    assert main([str(run), "--n", "8", "--tau", "0.1"]) == 0
    for name in ("verify.json", "verify_subsets.png", "verify_pairs.png", "verify_faithfulness.npy"):
        assert (run / name).stat().st_size > 0
    report = json.loads((run / "verify.json").read_text())
    assert report["adapter"] == with_adapter and report["n_edges"] == len(names)
    assert report["subsets_evaluated"] == 2 ** len(names) and report["tau"] == 0.1
    assert sorted(report["edges"]) == sorted(names) and len(report["pairs"]) == 15
    for key in ("irreducible", "minimal_faithful_subsets", "faithful_subset_sizes", "partners_median",
                "threshold", "split", "timing"):
        assert key in report

    # the full circuit's numbers are evaluate()'s on the same rows, adapter included
    from condense import tasks
    rows = tasks.load_task("ioi", organism_tokenizer, "test", n=8, seed=0)
    want = evaluate(net, circuit(net, names), rows, batch_size=4)
    assert abs(report["logit_diff_circuit"] - want["logit_diff"]) < TOL
    assert abs(report["faithfulness_circuit"] - want["faithfulness"]) < 1e-3
    assert abs(report["logit_diff_full_model"] - want["logit_diff_full"]) < TOL


def test_a_condensation_run_is_judged_against_the_original_model(tmp_path, organism_tokenizer):
    """As its gate judged it: accuracy within gate_accuracy_tol of the original model's (adapter
    off), faithfulness against the original's logit difference and the adapted empty circuit."""
    from peft import LoraConfig, get_peft_model

    from condense import tasks
    from condense.evaluate import EvalReference
    base, model_dir = saved_tiny_gpt2(tmp_path, organism_tokenizer)
    net = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, init_lora_weights=False,
                                          fan_in_fan_out=True, target_modules=["c_proj"])).eval()
    for name, p in net.named_parameters():  # an adapter that moves the logits well off the base's
        if "lora_B" in name:
            p.data.mul_(20)
    names = ["input->a0.h0<v>", "a0.h0->a1.h1<k>", "a1.h1->logits", "input->logits"]
    g = circuit(net, names)
    run = tmp_path / "run"
    # a gate on top-1 agreement too: the circuit and its minimal subsets are held to it
    write_run(run, model_dir, g, adapter_model=net, method="condense", gate_top1_agreement=0.9)
    report = verify_run(str(run), n=8, progress=False)

    rows = tasks.load_task("ioi", organism_tokenizer, "test", n=8, seed=0)
    own = reference_outputs(net, g, rows, "patching", 4)
    with net.disable_adapter():
        original = reference_outputs(net, g, rows, "patching", 4).full_logits
    want = evaluate(net, g, rows, batch_size=4,
                    reference=EvalReference(original, own.empty_logit_diff, "patching"))
    adapted = evaluate(net, g, rows, batch_size=4, reference=own)
    assert report["criterion"] == "accuracy" and report["reference"].startswith("original model")
    assert abs(report["logit_diff_full_model"] - want["logit_diff_full"]) < TOL
    assert abs(want["logit_diff_full"] - adapted["logit_diff_full"]) > 0.1  # the test can tell
    assert abs(report["faithfulness_circuit"] - want["faithfulness"]) < 1e-3
    assert report["accuracy_reference"] == pytest.approx(want["accuracy_full"])
    assert report["accuracy_full_model"] == pytest.approx(adapted["accuracy_full"])
    assert report["accuracy_floor"] == pytest.approx(want["accuracy_full"] - 0.05, abs=1e-6)
    assert report["top1_floor"] == 0.9
    assert report["top1_agreement_circuit"] == pytest.approx(want["top1_agreement"])
    assert report["circuit_passes_top1"] == (want["top1_agreement"] >= 0.9)
    minimal = report["minimal_faithful_subsets"]
    assert minimal and len(report["minimal_faithful_top1_agreement"]) == len(minimal)
    for names_k, agreement in zip(minimal, report["minimal_faithful_top1_agreement"]):
        sub = evaluate(net, circuit(net, names_k), rows, batch_size=4,
                       reference=EvalReference(original, own.empty_logit_diff, "patching"))
        assert agreement == pytest.approx(sub["top1_agreement"])


def test_accuracy_criterion_and_the_runs_own_rule():
    """Subsets pass by accuracy (condensation's gate) when asked; a condensation run is
    verified by its gate's rule, a scoring run by faithfulness."""
    from condense.methods.condensation import CondenseConfig
    from condense.methods.scoring import ScoringConfig
    from condense.verify.run import run_criterion
    # two edges: ids 0 (none), 1 (edge 0), 2 (edge 1), 3 (both)
    ld = torch.tensor([0.0, 0.95, 0.2, 1.0], dtype=torch.float64)
    acc = torch.tensor([0.5, 0.7, 0.96, 0.97], dtype=torch.float64)
    by_f, _, _ = analyse(ld, ["a", "b"], 1.0, 0.0, 0.9, 0.05)
    by_acc, _, _ = analyse(ld, ["a", "b"], 1.0, 0.0, None, 0.05, acc, 0.95)
    both, _, _ = analyse(ld, ["a", "b"], 1.0, 0.0, 0.9, 0.05, acc, 0.95)
    assert by_f["minimal_faithful_subsets"] == [["a"]]
    assert by_acc["minimal_faithful_subsets"] == [["b"]] and by_acc["accuracy_circuit"] == 0.97
    assert both["minimal_faithful_subsets"] == [["a", "b"]] and both["irreducible"]
    assert not any(r["empty_passes"] for r in (by_f, by_acc, both))
    # the corrupted run alone passes (an adapter that learnt the corruption): flagged
    vacuous, _, _ = analyse(ld, ["a", "b"], 1.0, 0.0, None, 0.05, acc, 0.4)
    assert vacuous["empty_passes"] and vacuous["minimal_faithful_subsets"] == [[]]
    # a circuit that fails its own criterion: no irreducibility verdict, unless a proper
    # subset passes (then it holds a smaller passing circuit: reducible)
    failing, _, _ = analyse(torch.tensor([0.0, 0.3, 0.2, 0.5], dtype=torch.float64), ["a", "b"],
                            1.0, 0.0, 0.9, 0.05)
    assert not failing["circuit_faithful"] and failing["irreducible"] is None
    holds_one, _, _ = analyse(torch.tensor([0.0, 0.95, 0.2, 0.5], dtype=torch.float64), ["a", "b"],
                              1.0, 0.0, 0.9, 0.05)
    assert not holds_one["circuit_faithful"] and holds_one["irreducible"] is False
    assert run_criterion(CondenseConfig(gate_accuracy_tol=0.03)) == dict(
        criterion="accuracy", accuracy_tol=0.03, threshold=0.9, top1_floor=None)
    assert run_criterion(CondenseConfig(gate_top1_agreement=0.95))["top1_floor"] == 0.95
    assert run_criterion(CondenseConfig(gate_faithfulness=0.8))["criterion"] == "both"
    assert run_criterion(ScoringConfig())["criterion"] == "faithfulness"


def test_local_verification_agrees_with_the_exhaustive_table():
    """--local evaluates the circuit and its one- and two-edge removals only: on the redundant
    model its pairs equal the exhaustive report's and it finds the circuit reducible (a one-edge
    removal passes); on MIXED_CIRCUIT (14 edges, GPT-2 with LoRA) every removal's f equals the exhaustive
    table's and 1-minimality is what that table says about the one-edge removals."""
    model, rows = redundant_model(), redundant_rows()
    g = circuit(model, REDUNDANT)
    full, _, _ = verify_circuit(model, g, rows, batch_size=3, tau=0.05)
    local, f_none, _ = verify_circuit(model, g, rows, batch_size=3, tau=0.05, local=True)
    assert f_none is None and local["mode"] == "local" and full["mode"] == "exhaustive"
    k = len(REDUNDANT)
    assert local["subsets_evaluated"] == 1 + k + k * (k - 1) // 2
    assert local["circuit_faithful"] and local["irreducible"] is False and not local["one_minimal"]
    assert local["pairs"] == full["pairs"] and local["partners"] == full["partners"]

    model = random_model("gpt2", lora=True)
    rows = random_rows(n=5)
    g = circuit(model, MIXED_CIRCUIT)
    full, f, _ = verify_circuit(model, g, rows, batch_size=4, threshold=0.5)
    local, _, _ = verify_circuit(model, g, rows, batch_size=4, threshold=0.5, local=True)
    n, names = full["n_edges"], full["edges"]
    every = 2 ** n - 1
    for i, name in enumerate(names):
        assert abs(local["faithfulness_without_edge"][name] - float(f[every ^ (1 << i)])) < TOL
    passes = [bool(f[every ^ (1 << i)] >= 0.5) for i in range(n)]
    assert local["one_minimal"] == (not any(passes))
    assert local["removable_edges"] == [names[i] for i in range(n) if passes[i]]
    for a, b in zip(local["pairs"], full["pairs"]):
        assert abs(a["delta_ij"] - b["delta_ij"]) < TOL and a["interacts"] == b["interacts"]
    # a circuit too large to enumerate or to name by subset id (over 62 edges) is checked locally
    big = Graph.from_model(model)
    big.reset(in_graph=True)
    report, _, _ = verify_circuit(model, big, rows, batch_size=4, local=True, max_edges=5)
    assert report["n_edges"] == big.n_edges > 62
    assert report["subsets_evaluated"] == 1 + report["n_edges"] + report["n_edges"] * (report["n_edges"] - 1) // 2
    assert abs(report["faithfulness_circuit"] - 1.0) < TOL  # every edge on: the full model


def test_irreducibility_has_one_wording(condense_grid):
    """The command line, the HTML report and the grid table word `irreducible` the same way: a
    circuit that fails its criterion with no passing subset gets no verdict in all three."""
    from condense.report import verify_summary
    from condense.verify import irreducibility_words
    assert [irreducibility_words(v) for v in (True, False)] == ["irreducible", "reducible"]
    assert irreducibility_words(None).startswith("no verdict")
    assert irreducibility_words(None, local=True).startswith("not checked")
    assert irreducibility_words(None, brief=True) == "no verdict"
    page = verify_summary(dict(mode="exhaustive", irreducible=None, circuit_faithful=False))
    assert irreducibility_words(None) in page and ">irreducible<" not in page.replace("<th>irreducible<", "")
    grid = condense_grid
    row = dict(task="ioi", seed=1, verified=True, passes=False, criterion="accuracy",
               irreducible=None, minimal_subset_sizes=[], interacting_pairs="35/55", median_partners=6)
    assert "| fails (accuracy); no verdict;" in grid.markdown([row], grid.summarize([row]))
