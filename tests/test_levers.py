"""Levers that keep a condensed circuit on the original's route (docs/condensation.md): the
adapter restricted to the circuit's nodes, the full-model heal term, the adapter-size penalty and
the adapter-off faithfulness floor, each checked against a brute-force computation on the
organism."""
import math
import os

import pytest
import torch

from condense import tasks
from condense.graph import Graph
from condense.methods.condensation import gate as gating
from condense.methods.condensation import healing
from condense.methods.condensation.config import CondenseConfig

ROOT = os.path.join(os.path.dirname(__file__), "..")
ORGANISM = os.path.join(ROOT, "checkpoints", "organism")
OFF = dict(gate_tasks="none", gate_text_blocks=0, gate_confidence=0.0)


def _setup(**keys):
    from transformers import AutoTokenizer

    from condense.models import load_model
    base = load_model(ORGANISM)
    tok = AutoTokenizer.from_pretrained(ORGANISM)
    cfg = CondenseConfig(**dict(dict(model=ORGANISM, task="ioi", n_val=32, batch_size=32, heal_steps=6,
                                     heal_batch_size=8, heal_lr=3e-3, heal_general_weight=0.0), **OFF, **keys))
    train = tasks.load_task("ioi", tok, "train", n=16, seed=0)
    val = tasks.load_task("ioi", tok, "val", n=32, seed=0)
    full = Graph.from_model(base)
    return base, tok, cfg, train, val, full


def _small_circuit(full):
    """Edges from input to head a0.h1 and from a0.h1 and m1 to the logits, and input -> m1."""
    g = full.copy()
    g.in_graph[:] = False
    h = full.head_sender(0, 1)
    g.in_graph[0, full.attn_receivers(0)] = True
    g.in_graph[h, full.logits_receiver] = True
    g.in_graph[0, full.mlp_receiver(1)] = True
    g.in_graph[full.mlp_sender(1), full.logits_receiver] = True
    g.in_graph &= g.valid
    return g


def _delta_w(module):
    name = next(iter(module.lora_A))
    return module.scaling[name] * module.lora_B[name].weight @ module.lora_A[name].weight


def test_lora_on_circuit_changes_only_what_the_circuits_nodes_write():
    from condense.methods.condensation.healing import heal, last_logprobs
    from condense.model_parts import model_parts
    base, tok, cfg, train, _, full = _setup(lora_on_circuit=True)
    target = last_logprobs(base, train, 16)
    model = healing.add_adapter(base, cfg)
    with torch.no_grad():  # an adapter that wrote everywhere, as earlier rounds' may have
        for _, a, b, _ in healing.lora_modules(model):
            b.normal_(0, 0.1)
    circuit = _small_circuit(full)
    heal(model, circuit, train, target, cfg, 1, progress=False)
    parts = model_parts(model)
    hd = parts.shape.head_dim
    for li, lp in enumerate(parts.layers):
        dw_attn, dw_mlp = _delta_w(lp.o_proj), _delta_w(lp.mlp_down)
        for h in range(full.n_heads):
            # a GPT-2 Conv1D's lora delta is [out, in]: columns are the heads' inputs
            block = dw_attn[:, h * hd:(h + 1) * hd]
            assert bool(block.abs().sum() > 0) == (li == 0 and h == 1), (li, h)
        assert bool(dw_mlp.abs().sum() > 0) == (li == 1), li


def test_adapter_size_is_the_frobenius_norm_of_every_delta():
    base, _, cfg, *_ = _setup()
    model = healing.add_adapter(base, cfg)
    with torch.no_grad():
        for _, a, b, _ in healing.lora_modules(model):
            b.normal_(0, 0.05)
    brute = sum(float(_delta_w(m).pow(2).sum()) for m, *_ in healing.lora_modules(model))
    norm2 = sum(float(m.base_layer.weight.pow(2).sum()) for m, *_ in healing.lora_modules(model))
    assert healing.base_norm2(model) == pytest.approx(norm2, rel=1e-6)
    assert float(healing.adapter_size(model, norm2)) == pytest.approx(brute / norm2, rel=1e-5)


def test_penalty_and_full_model_term_move_the_heal_toward_the_original():
    """The same heal with each lever on ends with a smaller adapter (penalty) or a full model
    closer to the original on the task's clean prompts (heal_full_weight)."""
    from condense.methods.condensation.healing import corrupted_loss, heal, last_logprobs
    from condense.evaluate import dataset_columns
    results = {}
    for name, keys in (("plain", {}), ("penalty", dict(heal_adapter_penalty=1e4)),
                       ("full", dict(heal_full_weight=10.0))):
        base, tok, cfg, train, _, full = _setup(**keys)
        target = last_logprobs(base, train, 16)
        model = healing.add_adapter(base, cfg)
        circuit = _small_circuit(full)
        heal(model, circuit, train, target, cfg, 1, progress=False)
        cols, n = dataset_columns(train)
        with torch.no_grad():
            kl = float(corrupted_loss(model, cols, list(range(n)), target, prompts="clean_ids"))
        results[name] = (float(healing.adapter_size(model, healing.base_norm2(model))), kl)
    assert results["penalty"][0] < 0.5 * results["plain"][0], results
    assert results["full"][1] < results["plain"][1], results


def test_full_model_term_is_zero_at_the_original():
    from condense.evaluate import dataset_columns
    from condense.methods.condensation.healing import corrupted_loss, last_logprobs
    base, _, cfg, train, _, _ = _setup()
    target = last_logprobs(base, train, 16)
    model = healing.add_adapter(base, cfg)  # B = 0: the original
    cols, n = dataset_columns(train)
    assert float(corrupted_loss(model, cols, list(range(n)), target, prompts="clean_ids")) < 1e-6


def test_adapter_off_floor_rejects_a_circuit_the_original_does_not_carry():
    base, tok, cfg, _, val, full = _setup(gate_accuracy_tol=1.0, gate_ppl_ratio=math.inf,
                                          gate_empty_fails=False, gate_adapter_off_faithfulness=0.9)
    blocks = list(tasks.general_text(tok, "val")["input_ids"])[:2]
    gate = gating.Gate(base, full, val, blocks, cfg)
    model = healing.add_adapter(base, cfg)
    whole = full.copy()
    whole.reset(in_graph=True)
    ok, g = gate(model, whole)
    assert ok and g["adapter_off_faithfulness"] == pytest.approx(1.0, abs=1e-5)
    ok, g = gate(model, _small_circuit(full))
    assert not ok and not g["gate_adapter_off"] and g["adapter_off_faithfulness"] < 0.9
    off = gating.Gate(base, full, val, blocks, CondenseConfig(**dict(vars(cfg), gate_adapter_off_faithfulness=0.0)))
    ok, g = off(model, _small_circuit(full))
    assert ok and math.isnan(g["adapter_off_faithfulness"])
