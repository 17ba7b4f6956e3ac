"""Quantized bases (bitsandbytes 4-bit NF4 and 8-bit): the graph with every edge on is the
quantized model's own forward, the empty graph its corrupted run, with and without a LoRA
adapter over the frozen quantized base; the model is one function in train and eval mode."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

bnb = pytest.importorskip("bitsandbytes")

from condense.graph import Graph  # noqa: E402
from condense.model_parts import affine_weight  # noqa: E402
from condense.models import load_model  # noqa: E402
from condense.patching import run_graph  # noqa: E402
from condense.quantized import dequantized_weight, is_quantized_linear, pin_dequantized_compute  # noqa: E402

from .tiny import TOL, make_model, prompts  # noqa: E402

# bitsandbytes quantizes in blocks of 64 inputs: the tiny configs need a width of 64
WIDE = dict(gpt2=dict(n_embd=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
            llama=dict(hidden_size=64, intermediate_size=128))
FAMILIES = list(WIDE)
QUANTIZATIONS = ["4bit", "8bit"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """family -> (folder of a tiny random fp32 model, that model)."""
    out = {}
    for family in FAMILIES:
        model = make_model(family, **WIDE[family])
        folder = tmp_path_factory.mktemp(family)
        model.save_pretrained(folder)
        out[family] = (str(folder), model)
    return out


def _logits(model, ids, mask):
    return model(input_ids=ids, attention_mask=mask).logits


@pytest.mark.parametrize("quantization", QUANTIZATIONS)
@pytest.mark.parametrize("family", FAMILIES)
def test_graph_is_the_quantized_model(saved, family, quantization):
    folder, fp_model = saved[family]
    model = load_model(folder, quantization=quantization, device="cpu")
    n_quantized = sum(is_quantized_linear(m) for m in model.modules())
    assert n_quantized >= 4 * 2  # every block's projections (2 layers), not just a few
    g = Graph.from_model(model)
    clean, corrupted, mask = prompts()
    real = mask.bool()
    with torch.no_grad():
        hf_clean, hf_corrupted = _logits(model, clean, mask), _logits(model, corrupted, mask)
        full = run_graph(model, g, clean, corrupted, mask)
        g.reset(in_graph=False)
        empty = run_graph(model, g, clean, corrupted, mask)
        # the quantization is real: the quantized model is not the fp32 one it came from
        assert (hf_clean - _logits(fp_model, clean, mask))[real].abs().max() > 1e-3
    assert (full - hf_clean)[real].abs().max() <= TOL
    assert (empty - hf_corrupted)[real].abs().max() <= TOL
    # heal trains in train mode and the gate evaluates in eval mode: one function in both
    model.train()
    with torch.no_grad():
        assert (_logits(model, clean, mask) - hf_clean)[real].abs().max() <= TOL


@pytest.mark.parametrize("quantization", QUANTIZATIONS)
@pytest.mark.parametrize("family", FAMILIES)
def test_per_head_outputs_from_dequantized_weights_equal_the_quantized_modules(
        saved, family, quantization, monkeypatch):
    """A partial circuit computes every head on its own input: through the dequantized weight
    (the fast path) and through the quantized module called per head, the same numbers."""
    import condense.model_parts as model_parts
    model = load_model(saved[family][0], quantization=quantization, device="cpu")
    g = Graph.from_model(model)
    g.apply_topn(40)  # scores are all zero: some arbitrary 40 edges
    clean, corrupted, mask = prompts()
    with torch.no_grad():
        fast = run_graph(model, g, clean, corrupted, mask)
        monkeypatch.setattr(model_parts, "FORCE_GENERIC_PROJECTIONS", True)
        generic = run_graph(model, g, clean, corrupted, mask)
    assert (fast - generic)[mask.bool()].abs().max() <= TOL


@pytest.mark.parametrize("quantization", QUANTIZATIONS)
def test_lora_over_a_quantized_base_is_exact_and_trains(saved, quantization):
    from peft import LoraConfig, get_peft_model
    folder, _ = saved["llama"]
    base = load_model(folder, quantization=quantization, device="cpu")
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                                            target_modules=["q_proj", "v_proj", "o_proj", "down_proj"]))
    model.eval()
    wrapped = model.base_model.model.model.layers[0].self_attn.o_proj
    assert affine_weight(wrapped) is not None  # the fast path folds the adapter into the weight
    g = Graph.from_model(model)
    g.apply_topn(60)  # some arbitrary 60 edges (scores are all zero)
    clean, corrupted, mask = prompts()
    real = mask.bool()
    g.reset(in_graph=True)
    full = run_graph(model, g, clean, corrupted, mask)  # autograd on: the heal path
    with torch.no_grad():
        hf = _logits(model, clean, mask)
    assert (full - hf)[real].abs().max() <= TOL
    full[real].pow(2).mean().backward()
    grads = [p.grad for n, p in model.named_parameters() if "lora_" in n]
    assert grads and all(gr is not None and gr.abs().sum() > 0 for gr in grads)
    frozen = [p for n, p in model.named_parameters() if "lora_" not in n]
    assert all(not p.requires_grad for p in frozen)  # the quantized base stays frozen


def test_a_weight_repacked_for_the_bf16_kernel_is_unpacked_when_pinned(saved):
    """bitsandbytes repacks 4-bit weights for its bfloat16 CPU kernel at the first eval forward
    on AVX512-BF16 machines (block scales rounded to bfloat16). A model repacked before condense
    pins it is unpacked: its forward and the graph then agree again."""
    import bitsandbytes.functional as F
    folder, _ = saved["llama"]
    model = load_model(folder, quantization="4bit", device="cpu")
    layer = model.model.layers[0].mlp.up_proj
    before = dequantized_weight(layer).clone()
    layer.weight.data, layer.weight.quant_state = F._convert_weight_packed_for_cpu(
        layer.weight.data, layer.weight.quant_state)
    assert pin_dequantized_compute(model, torch.float32) >= 8
    assert not layer.weight.quant_state.packing_format_for_cpu
    after = dequantized_weight(layer)
    assert (after - before).abs().max() <= 1e-2 * before.abs().max()  # bf16 scales: close
    g = Graph.from_model(model)
    clean, corrupted, mask = prompts()
    with torch.no_grad():
        full = run_graph(model, g, clean, corrupted, mask)
        hf = _logits(model, clean, mask)
    assert (full - hf)[mask.bool()].abs().max() <= TOL


ORGANISM = os.path.join(os.path.dirname(__file__), "..", "checkpoints", "organism")


def _organism_recipe(folder, **over):
    from .conftest import write_recipe
    keys = dict(method="condense", model=ORGANISM, task="ioi", n_train=16, n_val=16, n_test=16,
                ig_steps=1, batch_size=16, heal_steps=4, heal_batch_size=8, lora_rank=2,
                n_general=4, threads=1, gate_accuracy_tol=1.0, gate_empty_fails=False, gate_ppl_ratio=10.0,
                quantization="4bit", report_to="none", fidelity=False)
    keys.update(over)
    return write_recipe(folder, **keys)


def _rounds(out):
    import json
    with open(os.path.join(out, "rounds.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_condense_resume_verify_and_explain_on_a_4bit_base(tmp_path):
    """The whole pipeline over a frozen 4-bit organism: rank, heal (LoRA), gate, resume; the
    adapter reloads over the 4-bit base with the run's numbers and over the full-precision
    base; verify and explain read the run on the base it was healed over."""
    import json

    from peft import PeftModel

    from condense import tasks
    from condense.evaluate import evaluate
    from condense.explain.run import main as explain_main
    from condense.models import load_tokenizer
    from condense.runs import load_config, run
    from condense.verify.run import verify_run
    out = str(tmp_path / "out")
    recipe = _organism_recipe(str(tmp_path))
    run(load_config(recipe, ["max_rounds=10", f"output_dir={out}"]))
    metrics = run(load_config(recipe, ["max_rounds=12", f"output_dir={out}"]))  # resumes
    assert [r["round"] for r in _rounds(out)] == list(range(1, 13))
    assert metrics["edges"] <= 12 and metrics["accuracy"] >= 0.75
    with open(os.path.join(out, "recipe.yaml")) as f:
        assert "quantization: 4bit" in f.read()

    tok = load_tokenizer(ORGANISM)
    rows = tasks.load_task("ioi", tok, "test", n=16, seed=0)
    results = {}
    for base in ("4bit", None):
        net = PeftModel.from_pretrained(load_model(ORGANISM, quantization=base), out).eval()
        circuit = Graph.from_json(os.path.join(out, "circuit.json"), net)
        results[base] = evaluate(net, circuit, rows, batch_size=16)
    assert results["4bit"]["accuracy"] == pytest.approx(metrics["accuracy"], abs=1e-6)
    assert results["4bit"]["logit_diff"] == pytest.approx(metrics["logit_diff"], rel=1e-4)
    assert results[None]["logit_diff"] != pytest.approx(metrics["logit_diff"], rel=1e-4)

    report = verify_run(out, n=16, progress=False)
    assert report["quantization"] == "4bit" and report["n_edges"] == metrics["edges"]
    assert report["accuracy_circuit"] == pytest.approx(metrics["accuracy"], abs=1e-6)
    full = verify_run(out, n=16, progress=False, quantization=None, out_dir=str(tmp_path / "fp"))
    assert full["quantization"] is None
    assert full["logit_diff_circuit"] != pytest.approx(report["logit_diff_circuit"], rel=1e-4)
    assert explain_main([out, "--n-contexts", "4", "--n-task", "8", "--n-general", "4"]) == 0
    with open(os.path.join(out, "explain.json")) as f:
        assert json.load(f)["nodes"]


def test_a_rejected_round_rolls_back_over_an_8bit_base(tmp_path):
    from condense.runs import load_config, run
    out = str(tmp_path / "out")
    metrics = run(load_config(_organism_recipe(str(tmp_path), quantization="8bit"),
                              ["max_rounds=1", "gate_ppl_ratio=1e-6", f"output_dir={out}"]))
    rounds = _rounds(out)
    assert len(rounds) == 1 and not rounds[0]["accepted"]
    assert metrics["edges"] == metrics["total_edges"]
    assert metrics["ppl_ratio"] == pytest.approx(1.0, abs=1e-5)  # the adapter is back at B = 0


def test_heal_does_not_keep_dequantized_weights_for_backward(saved, monkeypatch):
    """With autograd on (heal), the graph's per-head projections over a 4-bit base recompute
    their dequantized weights in backward: autograd keeps no per-head weight tensor (it does
    without the recomputation), and the adapter's gradients are the same."""
    import condense.model_parts as model_parts
    from peft import LoraConfig, get_peft_model
    base = load_model(saved["llama"][0], quantization="4bit", device="cpu")
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                                            target_modules=["q_proj", "v_proj", "o_proj"])).eval()
    g = Graph.from_model(model)
    g.scores = torch.rand(g.scores.shape, generator=torch.Generator().manual_seed(0))
    g.apply_topn(g.n_edges // 2)  # a random half: heads read different mixes, per-head paths run
    clean, corrupted, mask = prompts()
    cfg = base.config
    H, dh, d = cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size
    weight_shapes = {(H, dh, d), (H, d, dh), (d, H, dh), (d, H * dh), (H * dh, d)}

    def kept_and_grads():
        kept = []
        model.zero_grad()
        with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(tuple(t.shape)) or t,
                                                      lambda t: t):
            out = run_graph(model, g, clean, corrupted, mask)
        out[mask.bool()].pow(2).mean().backward()
        return set(kept), [p.grad.clone() for n, p in model.named_parameters() if "lora_" in n]

    kept, grads = kept_and_grads()
    monkeypatch.setattr(model_parts, "_quantized_base", lambda module: False)
    kept_plain, grads_plain = kept_and_grads()
    assert kept_plain & weight_shapes  # without recomputation autograd keeps weight copies
    assert not kept & weight_shapes
    for a, b in zip(grads, grads_plain):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)


def test_an_unknown_quantization_is_refused_naming_the_allowed_values(tmp_path):
    from condense.config import RecipeError
    from condense.runs import load_config
    with pytest.raises(RecipeError, match=r"'quantization': unknown value '3bit'; valid: 4bit, 8bit, or null"):
        load_config(_organism_recipe(str(tmp_path)), ["quantization=3bit"])
    with pytest.raises(ValueError, match="allowed: None, '4bit', '8bit'"):
        load_model(ORGANISM, quantization="3bit")
