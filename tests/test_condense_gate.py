"""The gate's reuse of what it measured, and heals that stop once the gate accepts
(heal_gate_every), on a tiny random GPT-2."""
import pytest
import torch

from condense import evaluate as evaluation
from condense.methods.condensation import gate as gating
from condense.methods.condensation import healing
from tests.test_condense import _recipe, _rounds, _run, load_config_for, tiny_model  # noqa: F401


def _setup(tiny_model, tmp_path, *overrides):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from condense import tasks
    from condense.graph import Graph
    model = AutoModelForCausalLM.from_pretrained(tiny_model).eval()
    tok = AutoTokenizer.from_pretrained(tiny_model)
    cfg = load_config_for(tmp_path, *overrides)
    rows = tasks.load_task("ioi", tok, "train", n=8, seed=0)
    blocks = list(tasks.general_text(tok, "val")["input_ids"])[:2]
    full = Graph.from_model(model)
    return model, cfg, rows, blocks, full


def _random_circuit(full, seed):
    g = full.copy()
    g.in_graph = (torch.rand(g.in_graph.shape, generator=torch.Generator().manual_seed(seed)) < 0.5) & g.valid
    return g


def test_gate_reuses_only_what_its_adapter_and_circuit_decide(tiny_model, tmp_path, monkeypatch):
    """The empty circuit's LD and the perplexity are measured once per adapter, a verdict once
    per (adapter, circuit); every verdict equals a fresh gate's, which measures everything."""
    model, cfg, rows, blocks, full = _setup(tiny_model, tmp_path)
    model = healing.add_adapter(model, cfg)
    a, b = _random_circuit(full, 1), _random_circuit(full, 2)
    lora_b = next(p for n, p in model.named_parameters() if "lora_B" in n)

    # fresh gates (nothing to reuse), each set up like the loop's: before the adapter changes
    fresh = [gating.Gate(model, full, rows, blocks, cfg) for _ in range(3)]
    expected = dict(a=fresh[0](model, a), b=fresh[1](model, b))
    with torch.no_grad():
        lora_b.add_(0.5)
    expected["a new"] = fresh[2](model, a)
    with torch.no_grad():
        lora_b.sub_(0.5)
    gate = gating.Gate(model, full, rows, blocks, cfg)
    calls = dict(empty=0, ppl=0, evaluate=0)

    def counted(name, real):
        def f(*a, **k):
            calls[name] += 1
            return real(*a, **k)
        return f
    monkeypatch.setattr(gating, "empty_logit_diffs", counted("empty", gating.empty_logit_diffs))
    monkeypatch.setattr(gating, "perplexity", counted("ppl", gating.perplexity))
    monkeypatch.setattr(gating, "evaluate", counted("evaluate", gating.evaluate))
    assert gate(model, a) == expected["a"] and calls == dict(empty=1, ppl=1, evaluate=1)
    assert gate(model, b) == expected["b"] and calls == dict(empty=1, ppl=1, evaluate=2)
    assert gate(model, b) == expected["b"] and calls == dict(empty=1, ppl=1, evaluate=2)
    with torch.no_grad():  # a new adapter: measured again
        lora_b.add_(0.5)
    assert gate(model, a) == expected["a new"] and calls == dict(empty=2, ppl=2, evaluate=3)
    assert expected["a new"] != expected["a"]


def test_evaluate_agreements_with_the_full_model(tiny_model, tmp_path):
    """top1_agreement: the circuit's top token is the full model's; choice_agreement: it orders
    the answer and the distractor as the full model does."""
    from condense.metrics import pad_batch
    from condense.patching import run_graph
    model, cfg, rows, _, full = _setup(tiny_model, tmp_path)
    circuit = _random_circuit(full, 3)
    ref = evaluation.reference_outputs(model, full, rows, batch_size=8)
    m = evaluation.evaluate(model, circuit, rows, batch_size=8, reference=ref)
    clean, mask, lengths = pad_batch([list(r) for r in rows["clean_ids"]])
    corrupted, _, _ = pad_batch([list(r) for r in rows["corrupted_ids"]])
    with torch.no_grad():
        logits = run_graph(model, circuit, clean, corrupted, mask, logit_positions=lengths - 1)
    expected = (logits.argmax(-1) == ref.full_logits.argmax(-1)).float().mean().item()
    assert m["top1_agreement"] == pytest.approx(expected)
    answer = torch.tensor([int(a) for a in rows["answer_id"]])[:, None]
    distractor = torch.tensor([int(d) for d in rows["distractor_id"]])[:, None]
    prefers = [lg.float().gather(1, answer) > lg.float().gather(1, distractor)
               for lg in (logits, ref.full_logits)]
    assert m["choice_agreement"] == pytest.approx((prefers[0] == prefers[1]).float().mean().item())
    whole = evaluation.evaluate(model, full, rows, batch_size=8, reference=ref)
    assert whole["top1_agreement"] == whole["choice_agreement"] == 1.0


@pytest.mark.parametrize("heal_dtype", [None, "bfloat16"])
def test_heal_stops_at_the_first_accepting_check(tiny_model, tmp_path, heal_dtype):
    """heal_gate_every=2 over 6 steps asks at steps 2 and 4 (never the last), in eval mode with
    the base in float32, and the heal ends at the first yes with the uninterrupted heal's losses
    so far (same batches)."""
    model, cfg, rows, _, full = _setup(tiny_model, tmp_path, "heal_steps=6", "heal_gate_every=2",
                                       "heal_general_weight=0", f"heal_dtype={heal_dtype or 'null'}")
    target = healing.last_logprobs(model, rows, 8)
    circuit = _random_circuit(full, 4)
    model = healing.add_adapter(model, cfg)
    start = healing.adapter_state(model)
    asked = []

    def never():
        asked.append((model.get_input_embeddings().weight.dtype, model.training))
        return False
    whole = healing.heal(model, circuit, rows, target, cfg, 1, progress=False, accepts=never)
    assert len(whole) == 6 and asked == [(torch.float32, False)] * 2
    healing.load_adapter_state(model, start)
    stopped = healing.heal(model, circuit, rows, target, cfg, 1, progress=False,
                           accepts=lambda: len(asked) >= 3 or asked.append(None))
    assert stopped == whole[:4]
    assert {p.dtype for p in model.parameters()} == {torch.float32} and not model.training


def test_heal_gate_every_in_the_loop(tiny_model, tmp_path):
    """A gate that accepts everything ends every heal after heal_gate_every steps; rounds.jsonl
    records the steps; the key is part of the resume fingerprint and checked."""
    out = str(tmp_path / "run")
    recipe = _recipe(tmp_path, tiny_model, max_rounds=2, heal_steps=5, heal_gate_every=2)
    _run(recipe, f"output_dir={out}")
    assert [r["heal_steps"] for r in _rounds(out)] == [2, 2]
    control = str(tmp_path / "heal_only")  # the heal-only control heals in full
    _run(recipe, f"output_dir={control}", "prune=false")
    assert [r["heal_steps"] for r in _rounds(control)] == [5]
    from condense.config import RecipeError
    with pytest.raises(RecipeError, match="heal_gate_every"):
        _run(recipe, f"output_dir={out}", "heal_gate_every=0")
    with pytest.raises(RecipeError, match="heal_gate_every"):
        load_config_for(tmp_path, "heal_gate_every=-1")


@pytest.mark.parametrize("empty_fails", [True, False])
def test_gate_rejects_a_circuit_whose_empty_circuit_passes(tiny_model, tmp_path, empty_fails):
    """gate_empty_fails: when the corrupted run itself answers (here corrupted = clean, and
    every row's answer is the one the model prefers), the empty circuit passes the accuracy
    gate, so any circuit's edges carry nothing: rejected; with the check off, accepted."""
    model, cfg, rows, blocks, full = _setup(tiny_model, tmp_path, "gate_accuracy_tol=0.05",
                                            f"gate_empty_fails={str(empty_fails).lower()}")
    cols = {k: list(rows[k]) for k in ("clean_ids", "answer_id", "distractor_id")}
    ref = evaluation.reference_outputs(model, full, rows, batch_size=8)
    for i, logits in enumerate(ref.full_logits):  # the model's preferred token is the answer
        a, d = cols["answer_id"][i], cols["distractor_id"][i]
        if logits[a] < logits[d]:
            cols["answer_id"][i], cols["distractor_id"][i] = d, a
    cols["corrupted_ids"] = cols["clean_ids"]
    gate = gating.Gate(model, full, cols, blocks, cfg)
    assert gate.accuracy_original == 1.0
    ok, g = gate(model, _random_circuit(full, 4))
    assert g["accuracy_empty"] == 1.0 and g["accuracy"] == 1.0 and g["gate_accuracy"]
    assert g["gate_empty"] is not empty_fails and ok is not empty_fails
    # real rows: the verdict's empty accuracy is evaluate's, and decides against the floor
    gate = gating.Gate(model, full, rows, blocks, cfg)
    ok, g = gate(model, full)
    m = evaluation.evaluate(model, full, rows, batch_size=8, reference=gate.reference)
    assert g["accuracy_empty"] == m["accuracy_empty"]
    assert g["gate_empty"] == (not empty_fails or m["accuracy_empty"] < gate.accuracy_original - 0.05 - 1e-6)


def test_heal_corrupted_term_is_the_empty_circuits_kl_to_the_original(tiny_model, tmp_path):
    """heal_corrupted_weight: corrupted_loss is KL(original || model with adapter) at the last
    position of the corrupted prompts, which is also what the empty circuit (every edge
    patched) outputs; 0 for a fresh adapter (the original itself); the heal's loss adds it."""
    from condense.metrics import pad_batch
    from condense.patching import run_graph
    model, cfg, rows, _, full = _setup(tiny_model, tmp_path, "heal_steps=1", "heal_general_weight=0",
                                       "heal_corrupted_weight=0.5")
    target = healing.last_logprobs(model, rows, 8)
    corrupted = healing.last_logprobs(model, rows, 8, "corrupted_ids")
    model = healing.add_adapter(model, cfg)
    cols, idx = {k: list(rows[k]) for k in rows.column_names}, list(range(8))
    assert healing.corrupted_loss(model, cols, idx, corrupted).item() == pytest.approx(0, abs=1e-6)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn(p.shape, generator=gen) * 5)
    got = healing.corrupted_loss(model, cols, idx, corrupted)
    clean, mask, lengths = pad_batch(cols["clean_ids"])
    bad, _, _ = pad_batch(cols["corrupted_ids"])
    with torch.no_grad():
        empty = run_graph(model.eval(), full, clean, bad, mask, logit_positions=lengths - 1,
                          edge_mask=torch.zeros(full.n_senders, full.n_receivers))
    logp = torch.log_softmax(empty.float(), -1)
    assert got.item() == pytest.approx((corrupted.exp() * (corrupted - logp)).sum(-1).mean().item(),
                                       rel=1e-3) and got.item() > 1e-3
    start = healing.adapter_state(model)
    with_term = healing.heal(model, full, rows, target, cfg, 1, progress=False, corrupted_logp=corrupted)
    healing.load_adapter_state(model, start)
    import dataclasses
    without = healing.heal(model, full, rows, target, dataclasses.replace(cfg, heal_corrupted_weight=0.0),
                           1, progress=False)
    assert with_term[0] > without[0]
    from condense.config import RecipeError
    with pytest.raises(RecipeError, match="heal_corrupted_weight"):
        load_config_for(tmp_path, "heal_corrupted_weight=-1")
    # in the loop, the final heal on more rows included; part of the resume fingerprint
    out = str(tmp_path / "run")
    recipe = _recipe(tmp_path, tiny_model, max_rounds=1, heal_corrupted_weight=0.5,
                     final_heal_steps=2, final_heal_rows=12)
    assert _run(recipe, f"output_dir={out}")["final_heal"]["rows"] == 12
    with pytest.raises(RecipeError, match="heal_corrupted_weight"):
        _run(recipe, f"output_dir={out}", "heal_corrupted_weight=0")


def test_heal_temperature_sharpens_both_distributions(tiny_model, tmp_path):
    """heal_temperature t: the task-row loss is t^2 KL(P_t || Q_t), where P_t is the original's
    distribution raised to the power 1/t and renormalised (computed here that way, not through
    logits); t = 1 is the recipe's loss; the key is checked and is part of the resume fingerprint."""
    import dataclasses
    from condense.config import RecipeError
    from condense.metrics import pad_batch
    from condense.patching import run_graph
    model, cfg, rows, _, full = _setup(tiny_model, tmp_path)
    target = healing.last_logprobs(model, rows, 8)
    model = healing.add_adapter(model, cfg)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(torch.randn(p.shape, generator=gen) * 5)
    circuit = _random_circuit(full, 0)
    cols, idx = {k: list(rows[k]) for k in rows.column_names}, list(range(8))
    clean, mask, lengths = pad_batch(cols["clean_ids"])
    bad, _, _ = pad_batch(cols["corrupted_ids"])
    with torch.no_grad():
        q = torch.softmax(run_graph(model, circuit, clean, bad, mask,
                                    logit_positions=lengths - 1).double(), -1)
    p = target.double().exp()
    for t in (1.0, 0.5, 0.25):
        pt, qt = p ** (1 / t), q ** (1 / t)
        pt, qt = pt / pt.sum(-1, keepdim=True), qt / qt.sum(-1, keepdim=True)
        expected = t * t * (pt * (pt.log() - qt.log())).sum(-1).mean().item()
        with torch.no_grad():
            got = healing.heal_loss(model, circuit, cols, idx, target,
                                    dataclasses.replace(cfg, heal_temperature=t)).item()
        assert got == pytest.approx(expected, rel=1e-3) and got > 1e-3
    with pytest.raises(RecipeError, match="heal_temperature"):
        load_config_for(tmp_path, "heal_temperature=0")
    from condense.methods.condensation.state import _fingerprint
    assert "heal_temperature" not in _fingerprint(cfg)  # 1: states written before it resume
    assert _fingerprint(dataclasses.replace(cfg, heal_temperature=0.5))["heal_temperature"] == 0.5
