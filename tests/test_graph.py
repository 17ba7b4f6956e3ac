"""The exact edge-level graph on a model: naming and counts, the patched forward against plain
Hugging Face models (every supported family, with and without LoRA), against hand-written hook
computations and finite differences, other ablations, and the architectures refused.
Selection, pruning and JSON are in test_graph_selection.py; evaluate() in test_evaluate.py."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import Gemma3Config, GPT2Config, GPT2LMHeadModel, GPTNeoXConfig  # noqa: E402

import condense.model_parts as model_parts  # noqa: E402
from condense.graph import Graph  # noqa: E402
from condense.model_parts import UnsupportedModelError  # noqa: E402
from condense.means import compute_means  # noqa: E402
from condense.patching import run_graph  # noqa: E402

from .tiny import CONFIGS, GEMMA3_ROPE, TOL, make_model, prompts  # noqa: E402


# ------------------------------------------------------------------ naming and counts

def test_gpt2_small_counts_and_names():
    with torch.device("meta"):
        model = GPT2LMHeadModel(GPT2Config())
    g = Graph.from_model(model)
    assert len(g.nodes) == 158 and g.n_senders == 1 + 12 * 13
    assert len(g.edges) == 32491 == g.n_edges == g.count_edges()
    for name in ("input->a0.h1<q>", "a0.h1->m0", "m3->logits", "input->logits", "a0.h0->a1.h0<v>"):
        assert name in g.edges
    for name in ("a0.h0->a0.h1<q>", "m0->m0", "a1.h0->a0.h0<k>", "logits->m0"):
        assert name not in g.edges
    e = g.edges["a0.h1->m0"]
    assert (e.parent.name, e.child.name, e.qkv, e.in_graph) == ("a0.h1", "m0", None, True)
    assert g.edges["m2->a3.h4<k>"].qkv == "k"
    for s in range(1, g.n_senders):  # a sender's node view inverts head_sender / mlp_sender
        node = g.nodes[g.sender_names[s]]
        assert s == (g.mlp_sender(node.layer) if node.head is None
                     else g.head_sender(node.layer, node.head))


def test_count_formula_with_gqa():
    cfg = CONFIGS["llama"]()
    cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads = 3, 8, 2
    g = Graph.from_model(cfg)
    L, H = 3, 8
    n_senders = 1 + L * (H + 1)
    expected = (3 * H * sum(1 + l * (H + 1) for l in range(L))
                + sum((l + 1) * (H + 1) for l in range(L)) + n_senders)
    assert g.n_edges == expected and len(g.nodes) == n_senders + 1


# ------------------------------------------------------------------ exactness vs Hugging Face

@pytest.mark.parametrize("lora", [False, True], ids=["base", "lora"])
@pytest.mark.parametrize("family", list(CONFIGS))
def test_full_graph_is_the_model_and_empty_graph_is_the_corrupted_model(family, lora):
    model = make_model(family, lora=lora)
    g = Graph.from_model(model)
    clean, corrupted, mask = prompts()
    real = mask.bool()
    with torch.no_grad():
        hf_clean = model(input_ids=clean, attention_mask=mask).logits
        hf_corrupted = model(input_ids=corrupted, attention_mask=mask).logits
        full = run_graph(model, g, clean, corrupted, mask)
        g.reset(in_graph=False)
        empty = run_graph(model, g, clean, corrupted, mask)
    assert (hf_clean - hf_corrupted)[real].abs().max() > 0.5  # the test can tell them apart
    assert (full - hf_clean)[real].abs().max() <= TOL
    assert (empty - hf_corrupted)[real].abs().max() <= TOL
    if lora:  # with autograd on (adapter weights train), the same numbers through the other path
        g.reset(in_graph=True)
        full = run_graph(model, g, clean, corrupted, mask)
        assert full.requires_grad and (full - hf_clean)[real].abs().max() <= TOL


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma2", "gemma3"])
def test_generic_module_path_equals_weight_fast_path(family, monkeypatch):
    """Projections called as modules (any adapter kind) give the same result as the fast path."""
    model = make_model(family, lora=True)
    g = Graph.from_model(model)
    g.apply_topn(40)  # scores are all zero: some arbitrary 40 edges
    clean, corrupted, mask = prompts()
    with torch.no_grad():
        fast = run_graph(model, g, clean, corrupted, mask)
        monkeypatch.setattr(model_parts, "FORCE_GENERIC_PROJECTIONS", True)
        generic = run_graph(model, g, clean, corrupted, mask)
    assert (fast - generic)[mask.bool()].abs().max() <= TOL


@pytest.mark.parametrize("family", ["mistral", "gemma2", "gemma3"])
def test_active_sliding_window_is_reproduced(family):
    windowed = make_model(family)
    unwindowed = {"mistral": lambda: make_model(family, sliding_window=None),
                  "gemma2": lambda: make_model(family, layer_types=["full_attention"] * 2),
                  # a window as long as the context: layer types (and so rotary) unchanged
                  "gemma3": lambda: make_model(family, sliding_window=64)}[family]()
    clean, corrupted, mask = prompts(T=8)
    with torch.no_grad():
        a = windowed(input_ids=clean).logits
        b = unwindowed(input_ids=clean).logits
        assert (a - b).abs().max() > 1e-3  # the window changes the output
        ours = run_graph(windowed, Graph.from_model(windowed), clean, corrupted)
    assert (ours - a).abs().max() <= TOL


def test_gemma3_local_and_global_rotary_are_reproduced():
    """Gemma3's sliding layers rotate q/k with their own rotary embedding, its full layers with
    another: the graph gives each layer its own (one shared embedding would not match)."""
    model = make_model("gemma3")
    both_local = {t: dict(GEMMA3_ROPE["sliding_attention"]) for t in GEMMA3_ROPE}
    shared = make_model("gemma3", rope_parameters=both_local)  # the same weights
    clean, corrupted, mask = prompts()
    real = mask.bool()
    with torch.no_grad():
        hf = model(input_ids=clean, attention_mask=mask).logits
        assert (hf - shared(input_ids=clean, attention_mask=mask).logits)[real].abs().max() > 1e-3
        ours = run_graph(model, Graph.from_model(model), clean, corrupted, mask)
    assert (ours - hf)[real].abs().max() <= TOL


# ------------------------------------------------------------------ single edges vs hooks

def _gpt2_hook_logits(model, clean, corrupted, which):
    """GPT-2 logits with one edge ablated (patched), computed with plain forward hooks."""
    tr = model.transformer
    H = model.config.n_head
    dh = model.config.n_embd // H
    z = {}

    def grab(key):
        def hook(module, args):
            z[key] = args[0].detach()
        return hook

    handles = [tr.h[l].attn.c_proj.register_forward_pre_hook(grab(("z", l))) for l in range(2)]
    with torch.no_grad():
        model(input_ids=corrupted)
        z_corrupted = {l: z[("z", l)] for l in range(2)}
        model(input_ids=clean)
        z_clean = {l: z[("z", l)] for l in range(2)}
    for h in handles:
        h.remove()

    def head_delta(layer, head):  # corrupted minus clean output of head `head` of layer `layer`
        rows = slice(head * dh, (head + 1) * dh)
        W = tr.h[layer].attn.c_proj.weight  # Conv1D: [in, out]
        return (z_corrupted[layer][..., rows] - z_clean[layer][..., rows]) @ W[rows]

    handles = []
    if which == "a0.h1->a1.h2<q>":
        resid = {}
        handles.append(tr.h[1].register_forward_pre_hook(lambda m, a: resid.update(x=a[0])))

        def swap_query(module, args, out):
            ln, W, b = tr.h[1].ln_1, module.weight, module.bias
            q = ln(resid["x"] + head_delta(0, 1)) @ W + b
            out = out.clone()
            out[..., 2 * dh:3 * dh] = q[..., 2 * dh:3 * dh]  # the q slice of head 2
            return out
        handles.append(tr.h[1].attn.c_attn.register_forward_hook(swap_query))
    elif which == "a1.h0->m1":
        handles.append(tr.h[1].ln_2.register_forward_pre_hook(lambda m, a: (a[0] + head_delta(1, 0),)))
    elif which == "input->logits":
        pos = tr.wpe(torch.arange(clean.shape[1]))
        delta = tr.wte(corrupted) - tr.wte(clean) + 0 * pos
        handles.append(tr.ln_f.register_forward_pre_hook(lambda m, a: (a[0] + delta,)))
    try:
        with torch.no_grad():
            return model(input_ids=clean).logits
    finally:
        for h in handles:
            h.remove()


@pytest.mark.parametrize("edge", ["a0.h1->a1.h2<q>", "a1.h0->m1", "input->logits"])
def test_one_removed_edge_matches_hand_written_hooks(edge):
    model = make_model("gpt2")
    clean, corrupted, _ = prompts(B=2, T=6)
    g = Graph.from_model(model)
    g.edges[edge].in_graph = False
    with torch.no_grad():
        ours = run_graph(model, g, clean, corrupted)
        full = model(input_ids=clean).logits
    expected = _gpt2_hook_logits(model, clean, corrupted, edge)
    assert (expected - full).abs().max() > 1e-3  # the edge matters
    assert (ours - expected).abs().max() <= TOL


def test_node_masks_equal_removing_the_nodes_out_edges():
    model = make_model("llama")
    clean, corrupted, mask = prompts()
    g = Graph.from_model(model)
    g.head_mask[0, 1] = 0
    g.neuron_mask[1] = 0
    with torch.no_grad():
        by_nodes = run_graph(model, g, clean, corrupted, mask)
        g.head_mask[:], g.neuron_mask[:] = 1, 1
        for node in ("a0.h1", "m1"):
            g.in_graph[g.sender_index[node]] = False
        by_edges = run_graph(model, g, clean, corrupted, mask)
    assert (by_nodes - by_edges)[mask.bool()].abs().max() <= TOL


def _fp64_norms(model):
    """HF's RMSNorm rounds through fp32, too coarse for comparing fp64 gradients."""
    for m in model.modules():
        if type(m).__name__.endswith("RMSNorm"):
            m.forward = lambda x, m=m: m.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True)
                                                                  + m.variance_epsilon)
    return model


def _shortcut_masks(g, seed=0):
    """Masks that exercise every shortcut of the patched forward: the empty and full circuit,
    a small sparse circuit (nodes that read nothing, nodes nobody reads), whole blocks on or
    off (equal mask rows, summed), equal q/k/v columns, and continuous values."""
    gen = torch.Generator().manual_seed(seed)
    valid = g.valid.float()
    sparse = (torch.rand(g.valid.shape, generator=gen) < 0.03).float() * valid
    sparse[0, g.receiver_index["a0.h1<v>"]] = 1
    sparse[g.sender_index["a0.h1"], g.logits_receiver] = 1
    blocks = valid.clone()
    blocks[g.attn_senders(0)] = 0                 # layer 0's heads: nobody reads them
    blocks[g.sender_index["m0"], g.attn_receivers(1)] = 0
    blocks[:, g.mlp_receiver(1)] = 0              # m1 reads nothing
    continuous = torch.rand(g.valid.shape, generator=gen) * valid
    columns = valid.clone()
    columns[:, g.attn_receivers(1)] = (torch.rand(g.n_senders, 1, generator=gen) < 0.5).float()
    # layer 1: only the last two heads read anything; under GQA (Llama here: 4 heads over 2 KV
    # heads) both read the second KV head, so the heads recomputed must keep their own K/V rows
    late_heads = valid.clone()
    for h in range(g.shape.n_heads - 2):
        for kind in "qkv":
            late_heads[:, g.receiver_index[f"a1.h{h}<{kind}>"]] = 0
    late_heads[0, g.receiver_index["a1.h2<q>"]] = 0  # inputs that differ: projected per head
    # no edge out of the input: its block is skipped, so the recorded rows start at a0.h0
    no_input = sparse.clone()
    no_input[0] = 0
    return dict(empty=torch.zeros_like(valid), full=valid, sparse=sparse, blocks=blocks,
                continuous=continuous, columns=columns * valid, late_heads=late_heads,
                no_input=no_input)


@pytest.mark.parametrize("intervention", ["patching", "mean", "zero"])
@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma2"])
def test_shortcuts_equal_the_plain_mixing(family, intervention):
    """run_graph skips nodes, merges equal rows and shares equal columns; with a mask that
    requires grad it does none of that (every receiver mixes every sender): same logits."""
    model = make_model(family)
    g = Graph.from_model(model)
    clean, corrupted, mask = prompts()
    means = compute_means(model, g, corrupted.tolist()) if intervention == "mean" else None
    for name, edge_mask in _shortcut_masks(g).items():
        with torch.no_grad():
            fast = run_graph(model, g, clean, corrupted, mask, edge_mask=edge_mask,
                             intervention=intervention, means=means)
            plain = run_graph(model, g, clean, corrupted, mask, edge_mask=edge_mask.clone().requires_grad_(),
                              intervention=intervention, means=means)
        assert (fast - plain)[mask.bool()].abs().max() <= TOL, name


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_shortcuts_give_the_same_adapter_gradients(family):
    """Heal's case: a fixed circuit, gradients for LoRA weights through the clean and the
    corrupted run. The shortcuts must not change them."""
    model = _fp64_norms(make_model(family, dtype=torch.float64, lora=True))
    g = Graph.from_model(model)
    clean, corrupted, mask = prompts()
    params = [p for n, p in model.named_parameters() if "lora_" in n]
    for p in params:
        p.requires_grad_(True)
    for name, edge_mask in _shortcut_masks(g).items():
        grads = []
        for m in (edge_mask.double(), edge_mask.double().requires_grad_()):
            out = run_graph(model, g, clean, corrupted, mask, edge_mask=m, ablated_grad=True)
            grads.append(torch.autograd.grad(out[mask.bool()].pow(2).mean(), params, allow_unused=True))
        for a, b in zip(*grads):
            a = torch.zeros_like(b) if a is None else a
            b = torch.zeros_like(a) if b is None else b
            assert (a - b).abs().max() <= 1e-8 * max(1.0, float(b.abs().max())), name


def test_a_second_backward_through_the_same_run_gives_the_same_gradients():
    """The patched forward collects sender-difference gradients in a shared buffer; a second
    backward through the same graph (retain_graph, as EAP-GP does) must start afresh."""
    model = make_model("llama", dtype=torch.float64)
    g = Graph.from_model(model)
    clean, corrupted, mask = prompts()
    edge_mask = torch.rand(g.valid.shape, dtype=torch.float64,
                           generator=torch.Generator().manual_seed(0)).requires_grad_()
    out = run_graph(model, g, clean, corrupted, mask, edge_mask=edge_mask)
    first, = torch.autograd.grad(out[:, -1].sum(), edge_mask, retain_graph=True)
    second, = torch.autograd.grad(out[:, -1].sum(), edge_mask)
    assert first.abs().max() > 0
    assert torch.equal(first, second)


# ------------------------------------------------------------------ gradients

@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_mask_gradients_match_finite_differences(family):
    model = _fp64_norms(make_model(family, dtype=torch.float64))
    g = Graph.from_model(model)
    clean, corrupted, mask = prompts(B=2, T=5)
    gen = torch.Generator().manual_seed(3)
    edge_mask = torch.rand(g.n_senders, g.n_receivers, generator=gen, dtype=torch.float64)
    head_mask = torch.rand(g.head_mask.shape, generator=gen, dtype=torch.float64)
    neuron_mask = torch.rand(g.neuron_mask.shape, generator=gen, dtype=torch.float64)

    def f(e, h, n):
        out = run_graph(model, g, clean, corrupted, mask, edge_mask=e, head_mask=h, neuron_mask=n)
        return out[0, -1, 7] - out[1, 3, 11]

    leaves = [t.clone().requires_grad_(True) for t in (edge_mask, head_mask, neuron_mask)]
    f(*leaves).backward()
    checks = [(0, (g.sender_index["input"], g.receiver_index["a1.h2<k>"])),
              (0, (g.sender_index["a0.h3"], g.receiver_index["a1.h0<q>"])),
              (0, (g.sender_index["m0"], g.receiver_index["a1.h1<v>"])),
              (0, (g.sender_index["a1.h1"], g.receiver_index["m1"])),
              (0, (g.sender_index["m1"], g.receiver_index["logits"])),
              (1, (0, 2)), (2, (0, 5))]
    eps = 1e-5
    for which, idx in checks:
        plus = [edge_mask, head_mask, neuron_mask]
        minus = list(plus)
        plus[which] = plus[which].clone()
        plus[which][idx] += eps
        minus[which] = minus[which].clone()
        minus[which][idx] -= eps
        with torch.no_grad():
            fd = (f(*plus) - f(*minus)) / (2 * eps)
        grad = leaves[which].grad[idx]
        assert abs(fd) > 1e-6, "a probe with zero effect tests nothing"
        assert abs(grad - fd) <= 1e-6 * max(1.0, abs(fd)), (which, idx, float(grad), float(fd))


def test_receiver_input_gradients_give_edge_attribution():
    """EAP's score (clean - ablated) . dM/dx_r equals the gradient wrt the edge mask."""
    model = make_model("gpt2", dtype=torch.float64)
    g = Graph.from_model(model)
    clean, corrupted, _ = prompts(B=2, T=5)
    edge_mask = torch.ones(g.n_senders, g.n_receivers, dtype=torch.float64, requires_grad=True)
    run = run_graph(model, g, clean, corrupted, edge_mask=edge_mask, capture_receivers=True,
                    return_run=True)
    run.logits[:, -1, 3].sum().backward()
    diff = run.clean.stacked() - run.ablated.stacked()              # [S, B, T, D]
    receivers, x = run.receiver_inputs[-1]                          # logits
    assert receivers == slice(g.logits_receiver, g.logits_receiver + 1)
    eap = torch.einsum("sbtd,btd->s", diff, x.grad[0])
    assert torch.allclose(eap, edge_mask.grad[:, g.logits_receiver], atol=1e-9)


# ------------------------------------------------------------------ other ablations

def test_zero_and_mean_ablation_of_the_empty_graph():
    model = make_model("gpt2")
    tr = model.transformer
    g = Graph.from_model(model)
    g.reset(in_graph=False)
    clean, _, _ = prompts(B=2, T=6)
    reference = torch.randint(0, 100, (5, 6), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        # zero: only the constant attention-output biases reach the logits
        bias = sum(block.attn.c_proj.bias for block in tr.h)
        expected = model.lm_head(tr.ln_f(bias)).expand(2, 6, -1)
        assert (run_graph(model, g, clean, intervention="zero") - expected).abs().max() <= TOL
        # mean: the mean final residual stream of the reference rows, per position
        final = {}
        h = tr.ln_f.register_forward_pre_hook(lambda m, a: final.update(x=a[0]))
        model(input_ids=reference)
        h.remove()
        expected = model.lm_head(tr.ln_f(final["x"].mean(0)))[None].expand(2, -1, -1)
        means = compute_means(model, g, reference.tolist())
        ours = run_graph(model, g, clean, intervention="mean", means=means)
        assert (ours - expected).abs().max() <= TOL
        # full graph under mean ablation is still the model
        g.reset(in_graph=True)
        ours = run_graph(model, g, clean, intervention="mean", means=means)
        assert (ours - model(input_ids=clean).logits).abs().max() <= TOL


# ------------------------------------------------------------------ refusals

def test_unsupported_architecture_is_refused():
    cfg = GPTNeoXConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, vocab_size=100)
    with pytest.raises(UnsupportedModelError, match="supported families: GPT-2.*Llama.*Gemma2"):
        Graph.from_model(cfg)


def test_gemma3_multimodal_wrapper_is_refused():
    """AutoModelForCausalLM loads the 4B+ Gemma-3 checkpoints as Gemma3ForConditionalGeneration
    (model_type gemma3): refused, pointing at the text-only model."""
    from transformers import SiglipVisionConfig
    cfg = Gemma3Config(text_config=CONFIGS["gemma3"]().to_dict(),
                       vision_config=SiglipVisionConfig(hidden_size=16, intermediate_size=32,
                                                        num_hidden_layers=1, num_attention_heads=2))
    with pytest.raises(UnsupportedModelError, match="gemma3_text.*supported families:.*Gemma3"):
        Graph.from_model(cfg)


@pytest.mark.parametrize("family,setting", [("gpt2", dict(add_cross_attention=True)),
                                            ("gemma", dict(use_bidirectional_attention=True)),
                                            ("gemma3", dict(use_bidirectional_attention=True)),
                                            ("qwen2", dict(layer_types=["chunked_attention"] * 2))])
def test_unhandled_configs_are_refused(family, setting):
    cfg = CONFIGS[family]()
    for k, v in setting.items():
        setattr(cfg, k, v)
    with pytest.raises(UnsupportedModelError, match="supports causal sequential blocks.*GPT-2"):
        Graph.from_model(cfg)
