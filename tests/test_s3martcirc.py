"""S3martCirc (condense.methods.s3martcirc.method), the node baselines (condense.methods.s3martcirc.node_baselines) and
known-circuit recovery (condense.methods.s3martcirc.recovery): FI on hand-made activations and against plain HF
hooks, coefficients and roles, the training schedule, exact per-node patching against
evaluate(), attribution patching (and its IG variant) against a hand-written hook gradient,
recovery on a hand-made reference, and a short recipe run whose circuit.json carries roles."""
import json
import math
import os
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config

from condense.methods.s3martcirc import recovery as rec
from condense import train
from condense.config import RecipeError
from condense.evaluate import evaluate
from condense.graph import Graph
from condense.metrics import pad_batch
from condense.methods.s3martcirc.node_baselines import (
    NodeScores,
    attribution_patching,
    attribution_patching_ig,
    exact_patching,
    hard_concrete,
    node_circuit_graph,
    node_names,
    paired_drop_difference,
)
from condense.methods.s3martcirc.method import (
    ROLES,
    S3Settings,
    coefficients,
    functional_importance,
    initial_logits,
    neuron_functional_importance,
    node_fi,
    roles_of,
    train_s3martcirc,
)

from .conftest import ORGANISM
from .tiny import moved_token_rows, randomize_weights

VOCAB = 60


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_gpt2(seed=0):
    cfg = GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=VOCAB, n_positions=32,
                     bos_token_id=0, eos_token_id=0)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    return randomize_weights(model, seed, 2.0).double().eval()


def synthetic_rows(model, n=6, seed=3):
    """Random prompts of lengths 4..7 whose answer/distractor the corruption moves most."""
    return moved_token_rows(model, n, seed, (4, 7), vocab=VOCAB)


# ------------------------------------------------------------------ functional importance

def test_fi_identity_is_zero_and_a_hand_computed_value():
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    assert functional_importance(x, x).item() == 0.0
    assert functional_importance(x, 3 * x).abs().item() < 1e-6        # cosine: scale-free
    # Sim(X) off-diagonal: (1,2) 0, (1,3) = (2,3) = 1/sqrt2; Y = [[1,0],[1,0],[0,1]]:
    # (1,2) 1, (1,3) = (2,3) = 0. ||diff||^2 = 2 (1 + 1/2 + 1/2) = 4, ||Sim(X)||^2 = 2 -> sqrt 2
    y = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    assert functional_importance(x, y).item() == pytest.approx(math.sqrt(2), abs=1e-6)
    # the diagonal is left out: rows of different norms change nothing
    assert functional_importance(x, y * torch.tensor([[2.0], [5.0], [0.5]])).item() == pytest.approx(
        math.sqrt(2), abs=1e-6)
    # padding is left out: a garbage fourth token behind real=False changes nothing
    xp = torch.cat([x, torch.tensor([[7.0, -3.0]])])
    yp = torch.cat([y, torch.tensor([[-1.0, 9.0]])])
    real = torch.tensor([True, True, True, False])
    assert functional_importance(xp, yp, real).item() == pytest.approx(math.sqrt(2), abs=1e-6)
    assert functional_importance(xp, yp).item() != pytest.approx(math.sqrt(2), abs=1e-3)
    # one real token: no off-diagonal similarity, FI undefined
    assert math.isnan(functional_importance(x[:1], y[:1]).item())


def test_neuron_fi_equals_fi_of_the_stream_after_the_neuron():
    gen = torch.Generator().manual_seed(0)
    B, T, D, N = 3, 5, 8, 7
    x = torch.randn(B, T, D, generator=gen, dtype=torch.float64)
    acts = torch.randn(B, T, N, generator=gen, dtype=torch.float64)
    write = torch.randn(N, D, generator=gen, dtype=torch.float64)
    real = torch.arange(T)[None] < torch.tensor([5, 3, 4])[:, None]
    got = neuron_functional_importance(x, acts, write, real, chunk=3)
    for i in range(N):
        y = x + acts[..., i:i + 1] * write[i]
        want = functional_importance(x.float(), y.float(), real)
        assert torch.allclose(got[:, i], want, atol=1e-5), i


def test_node_fi_against_hf_hooks():
    """Head: X = the block's input residual, Y = the head's share of c_proj; neuron: X = the
    MLP's input residual, Y = X + activation * its c_proj row; means over rows."""
    model = tiny_gpt2().float()
    rows = synthetic_rows(model, n=4)
    g = Graph.from_model(model)
    fi = node_fi(model, g, rows, batch_size=4)
    H, dh = 2, 8
    heads = torch.zeros(2, H)
    neurons = torch.zeros(2, 64)
    for ids in rows["clean_ids"]:
        store = {}
        hooks = []
        for l, block in enumerate(model.transformer.h):
            for key, module in (("x", block.ln_1), ("xm", block.ln_2), ("z", block.attn.c_proj),
                                ("h", block.mlp.c_proj)):
                hooks.append(module.register_forward_pre_hook(
                    lambda m, a, key=key, l=l, into=store: into.__setitem__((key, l), a[0])))
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]))
        for hk in hooks:
            hk.remove()
        for l, block in enumerate(model.transformer.h):
            W = block.attn.c_proj.weight  # Conv1D [in, out]
            for h in range(H):
                y = store[("z", l)][..., h * dh:(h + 1) * dh] @ W[h * dh:(h + 1) * dh]
                heads[l, h] += functional_importance(store[("x", l)], y)[0] / len(rows["clean_ids"])
            Wm = block.mlp.c_proj.weight
            for i in range(64):
                y = store[("xm", l)] + store[("h", l)][..., i:i + 1] * Wm[i]
                neurons[l, i] += functional_importance(store[("xm", l)], y)[0] / len(rows["clean_ids"])
    assert torch.allclose(fi.heads, heads, atol=1e-4)
    assert torch.allclose(fi.neurons, neurons, atol=1e-4)
    assert float(fi.heads.min()) > 0


# ------------------------------------------------------------------ coefficients and roles

def test_coefficients_sum_to_one_and_argmax_roles():
    logits = torch.randn(5, 7, 3) * 4
    c = coefficients(logits)
    assert torch.allclose(c.sum(-1), torch.ones(5, 7)) and bool((c >= 0).all())
    init = coefficients(initial_logits((2, 3), 0.2))
    assert torch.allclose(init, torch.tensor([0.2, 0.4, 0.4]).expand(2, 3, 3))
    hand = torch.tensor([[0.5, 0.3, 0.2],    # c_p + c_f = c_u: not a candidate
                         [0.4, 0.3, 0.3],    # candidate although c_u is the largest; tie -> passthrough
                         [0.2, 0.3, 0.5],    # functional
                         [0.1, 0.6, 0.3],    # passthrough
                         [0.9, 0.05, 0.05]])
    assert roles_of(hand).tolist() == [0, 1, 2, 1, 0]
    assert ROLES == ("unimportant", "passthrough", "functional")


def test_schedule_warmup_then_one_discovery_and_k_classification_steps():
    s = S3Settings(epochs=3, warmup_epochs=1, k=6, batch_size=4)
    steps = s.schedule(n_rows=7)           # 2 batches per epoch
    kinds = "".join(k for k, _, _ in steps)
    assert kinds == "dd" + ("d" + "c" * 6) * 4
    assert [(e, j) for k, e, j in steps if k == "d"] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]


# ------------------------------------------------------------------ node baselines

def _mean_ld(model, graph, rows):
    return evaluate(model, graph, rows, batch_size=4)["logit_diff"]


def test_exact_patching_is_evaluate_with_that_node_masked():
    model = tiny_gpt2()
    rows = synthetic_rows(model)
    g = Graph.from_model(model)
    scores = exact_patching(model, g, rows, batch_size=4, progress=False)
    assert scores.heads.shape == (2, 2) and scores.neurons.shape == (2, 64)
    full = _mean_ld(model, g, rows)
    for kind, (l, i) in (("heads", (1, 0)), ("heads", (0, 1)), ("neurons", (0, 5)), ("neurons", (1, 63))):
        masked = g.copy()
        getattr(masked, "head_mask" if kind == "heads" else "neuron_mask")[l, i] = 0
        want = full - _mean_ld(model, masked, rows)
        assert getattr(scores, kind)[l, i].item() == pytest.approx(want, abs=1e-5), (kind, l, i)
    assert float(scores.heads.abs().max()) > 1e-3  # the test would notice all-zero scores
    # heads only: the same head scores, every neuron ranked after every head
    only = exact_patching(model, g, rows, batch_size=4, progress=False, heads_only=True)
    assert torch.equal(only.heads, scores.heads)
    assert torch.isinf(only.neurons).all() and (only.neurons < 0).all()
    assert set(only.ranked_names(g.shape, 4)) == {f"a{l}.h{h}" for l in range(2) for h in range(2)}


def _hand_mask_gradient(model, rows, alpha):
    """dLD/d(node masks) at every mask = alpha, with pre-hooks on the HF model's c_proj
    modules mixing z (attention) and the MLP hidden units with their corrupted-run values."""
    clean, mask, lengths = pad_batch(rows["clean_ids"])
    corrupted, _, _ = pad_batch(rows["corrupted_ids"])
    tr = model.transformer
    store = {}

    def record(key):
        return lambda m, a: store.__setitem__(key, a[0].detach())

    hooks = [mod.register_forward_pre_hook(record((kind, l))) for l, b in enumerate(tr.h)
             for kind, mod in (("z", b.attn.c_proj), ("h", b.mlp.c_proj))]
    with torch.no_grad():
        model(input_ids=corrupted, attention_mask=mask)
    for hk in hooks:
        hk.remove()
    hm = torch.full((2, 2), alpha, dtype=torch.float64, requires_grad=True)
    nm = torch.full((2, 64), alpha, dtype=torch.float64, requires_grad=True)

    def mix(kind, l):
        def hook(m, a):
            x, abl = a[0], store[(kind, l)]
            if kind == "z":
                m_full = hm[l].repeat_interleave(8)  # head h owns z[..., 8h:8h+8]
            else:
                m_full = nm[l]
            return (abl + m_full * (x - abl),)
        return hook

    hooks = [mod.register_forward_pre_hook(mix(kind, l)) for l, b in enumerate(tr.h)
             for kind, mod in (("z", b.attn.c_proj), ("h", b.mlp.c_proj))]
    try:
        logits = model(input_ids=clean, attention_mask=mask).logits[torch.arange(len(lengths)), lengths - 1]
    finally:
        for hk in hooks:
            hk.remove()
    answer, distractor = torch.tensor(rows["answer_id"]), torch.tensor(rows["distractor_id"])
    ld = logits.gather(1, answer[:, None])[:, 0] - logits.gather(1, distractor[:, None])[:, 0]
    gh, gn = torch.autograd.grad(ld.mean(), (hm, nm))
    return gh, gn


def test_attribution_patching_is_the_hand_written_mask_gradient():
    model = tiny_gpt2(seed=1)
    rows = synthetic_rows(model, seed=4)
    g = Graph.from_model(model)
    ap = attribution_patching(model, g, rows, batch_size=4, progress=False)
    gh, gn = _hand_mask_gradient(model, rows, 1.0)
    assert torch.allclose(ap.heads.double(), gh, atol=1e-5)
    assert torch.allclose(ap.neurons.double(), gn, atol=1e-5)
    assert float(gh.abs().max()) > 1e-3
    ig = attribution_patching_ig(model, g, rows, steps=2, batch_size=4, progress=False)
    hand = [_hand_mask_gradient(model, rows, a) for a in (0.25, 0.75)]
    assert torch.allclose(ig.heads.double(), (hand[0][0] + hand[1][0]) / 2, atol=1e-5)
    assert torch.allclose(ig.neurons.double(), (hand[0][1] + hand[1][1]) / 2, atol=1e-5)


def test_node_scores_top_and_circuit_graph():
    shape = Graph.from_model(tiny_gpt2()).shape
    scores = NodeScores(torch.tensor([[0.0, 5.0], [1.0, 1.0]]), torch.zeros(2, 64))
    scores.neurons[1, 7] = 3.0
    top = scores.top(3)
    assert top.names(shape) == ["a0.h1", "a1.h0", "m1.n7"]   # equal scores keep node order
    assert scores.ranked_names(shape, 4) == ["a0.h1", "m1.n7", "a1.h0", "a1.h1"]
    assert len(node_names(shape)) == 2 * 2 + 2 * 64
    g = node_circuit_graph(Graph.from_model(tiny_gpt2()), top)
    on = g.nodes_in_graph()
    assert [n for n, o in zip(g.node_names, on.tolist()) if o] == ["input", "a0.h1", "a1.h0", "m1", "logits"]
    assert g.head_mask.tolist() == [[0.0, 1.0], [1.0, 0.0]] and g.neuron_mask.sum() == 1
    gate = hard_concrete(torch.tensor([-10.0, 0.0, 10.0]), torch.Generator().manual_seed(0))
    assert gate[0] == 0 and gate[2] == 1 and 0 <= gate[1] <= 1


# ------------------------------------------------------------------ recovery

def test_recovery_on_a_hand_made_reference(tmp_path):
    reference = {"source": "made up", "movers": ["1.0", "1.1"], "mlp": ["0"], "prev": ["0.1", "1.0"]}
    ranked = ["a1.h0", "m0.n5", "a0.h0", "a1.h1", "a0.h1"]
    out = rec.recovery(ranked, reference, budgets=(1, 2, 4, 5))
    assert out[1]["overall"] == pytest.approx(1 / 4) and out[1]["found"] == 1 and out[1]["total"] == 4
    assert out[2]["overall"] == pytest.approx(2 / 4) and out[2]["classes"]["mlp"] == 1.0
    assert out[4]["classes"] == {"movers": 1.0, "mlp": 1.0, "prev": 0.5}
    assert out[5]["overall"] == 1.0
    path = tmp_path / "ref.json"
    path.write_text(json.dumps({"mine": reference}))
    assert rec.load_reference(f"{path}#mine") == {"movers": ["a1.h0", "a1.h1"], "mlp": ["m0"],
                                                  "prev": ["a0.h1", "a1.h0"]}
    ioi = rec.load_reference("gpt2_ioi")
    assert "a9.h9" in ioi["name_mover"] and "a7.h3" in ioi["s_inhibition"]
    assert rec.load_reference("gpt2_greater_than")["mlp"][0] == "m0"
    gpt2 = Graph.from_model(GPT2Config()).shape
    assert rec.default_reference(gpt2, "ioi") == "gpt2_ioi"
    assert rec.default_reference(gpt2, "acronym") == "gpt2_acronym"
    assert rec.default_reference(Graph.from_model(GPT2Config(n_layer=4)).shape, "ioi") is None
    with pytest.raises(KeyError, match="gpt2_ioi"):
        rec.load_reference("no_such_circuit")
    assert os.path.exists(rec.KNOWN_CIRCUITS)


# ------------------------------------------------------------------ training and the runner

@pytest.fixture(scope="module")
def organism_rows():
    if not os.path.exists(os.path.join(ORGANISM, "config.json")):
        pytest.skip("needs checkpoints/organism")
    from condense import tasks
    from condense.models import load_model, load_tokenizer
    model = load_model(ORGANISM)
    tok = load_tokenizer(ORGANISM)
    return model, tasks.load_task("ioi", tok, "train", n=16, seed=0)


def test_short_training_assigns_roles_by_fi(organism_rows):
    model, rows = organism_rows
    g = Graph.from_model(model)
    s = S3Settings(epochs=2, warmup_epochs=1, k=2, batch_size=8, sparsity=3.0, binary_weight=3.0)
    result = train_s3martcirc(model, g, rows, s, progress=False)
    assert result.discovery_steps == 4 and len(result.history) == 2
    c_n = result.coefficients[1]
    assert torch.allclose(c_n.sum(-1), torch.ones(4, 512))
    r_h, r_n = result.roles()
    # candidates are classified by their FI against the per-kind threshold (median)
    for roles, fi, thr in ((r_h, result.fi.heads, result.thresholds["heads"]),
                           (r_n, result.fi.neurons, result.thresholds["neurons"])):
        cand = roles > 0
        assert bool(cand.any())
        assert torch.equal(roles[cand] == 2, fi[cand] >= thr)
    assert result.thresholds["heads"] == pytest.approx(float(result.fi.heads.median()))
    # the budget ranking puts the circuit first, ordered by the training-gradient importance
    cand = result.candidates()
    top = result.scores().top(len(cand))
    assert torch.equal(top.heads, cand.heads) and torch.equal(top.neurons, cand.neurons)
    first = result.scores().ranked_names(g.shape, 2)
    imp = {n: float(v) for n, v in zip(node_names(g.shape), result.importance.flat())}
    assert imp[first[0]] >= imp[first[1]] and imp[first[0]] == max(
        imp[n] for n in cand.names(g.shape))
    # and that importance means what it says: S3martCirc's first node is one of the three
    # nodes attribution patching finds most helpful on the same rows
    ap = attribution_patching(model, g, rows, batch_size=8, progress=False)
    assert first[0] in ap.ranked_names(g.shape, 3)


def s3_full(saved):
    return saved["s3martcirc"]["accuracy_full"]


def test_recipe_run_writes_roles_that_graph_reads_back(organism_rows, tmp_path):
    model, _ = organism_rows
    out = tmp_path / "run"
    metrics = train.main(["--recipe", "recipes/s3martcirc/organism_ioi.yaml", "n_train=16",
                          "n_test=16", "s3_epochs=2", "s3_warmup_epochs=1", "s3_batch_size=8",
                          "s3_baselines=[attribution_patching,node_pruning,random,exact_patching_heads]",
                          "s3_budgets=[2,8]", "s3_reference=gpt2_ioi", f"output_dir={out}"])
    for name in ("circuit.json", "circuit.png", "roles.json", "training.png", "metrics.json", "recipe.yaml"):
        assert (out / name).stat().st_size > 0, name
    from .test_report import check_run_report
    dom = check_run_report(str(out), tmp_path)
    if dom is not None:  # roles reach the page's hover cards
        payload = json.loads(dom.split('id="report-data">')[1].split("</script>")[0])
        roles = payload["roles"]
        assert roles and set(roles.values()) <= {"unimportant", "passthrough", "functional"}
        raw_neurons = json.loads((out / "circuit.json").read_text()).get("neurons", {})
        counted = sum(k for per in payload["circuit"]["neuron_roles"].values() for k in per.values())
        assert counted == len(raw_neurons)  # every neuron's role reaches its MLP's hover card
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["size"] == metrics["size"] > 0
    assert set(saved["baselines"]) == {"attribution_patching", "node_pruning", "random",
                                       "exact_patching_heads"}
    heads_only = saved["baselines"]["exact_patching_heads"]  # 16 heads of 2,064 nodes
    assert heads_only["exact_patching_seconds_estimate"] == pytest.approx(
        heads_only["seconds"] * (16 + 2048 + 1) / (16 + 1))
    assert "10x_faster_than_exact_patching" in saved["done_when"]
    assert 0 <= saved["ceiling"]["accuracy_drop"] <= 100 * s3_full(saved)
    for rec_ in saved["baselines"].values():
        assert rec_["at_size"]["nodes"] == saved["size"] and set(rec_["budgets"]) == {"2", "8"}
        for at in rec_["budgets"].values():  # the rows each ablation gets right make its accuracy
            assert len(at["correct_rows"]) == 16 and at["correct_rows"].count("1") / 16 == \
                pytest.approx(at["accuracy"])
        assert set(rec_["recovery"]) == {"2", "8"}   # organism names, a GPT-2 reference: 0 found
    s3 = saved["s3martcirc"]
    assert s3["accuracy_drop"] == pytest.approx(100 * (s3["accuracy_full"] - s3["accuracy"]))

    g = Graph.from_json(out / "circuit.json", model)
    roles = json.loads((out / "roles.json").read_text())["nodes"]
    circuit_names = [n for n, r in roles.items() if r["role"] != "unimportant"]
    assert len(circuit_names) == saved["size"]
    for name, entry in roles.items():
        assert g.roles[name] == entry["role"], name
        if name.startswith("a"):
            l, h = int(name[1]), int(name.split(".h")[1])
            assert g.head_mask[l, h] == (entry["role"] != "unimportant")
        assert sum(entry[k] for k in ("c_u", "c_p", "c_f")) == pytest.approx(1, abs=1e-5)
    assert int(g.head_mask.sum() + g.neuron_mask.sum()) == saved["size"]
    raw = json.loads((out / "circuit.json").read_text())
    assert all("role" in raw["nodes"][f"a{l}.h{h}"] for l in range(4) for h in range(4))
    assert "role" not in raw["nodes"]["input"]
    # a circuit.json without roles still loads, with none
    del raw["neurons"]
    for v in raw["nodes"].values():
        v.pop("role", None)
    (tmp_path / "plain.json").write_text(json.dumps(raw))
    assert Graph.from_json(tmp_path / "plain.json", model).roles == {}


@pytest.mark.parametrize("override,words", [
    ("s3_binary_weight=-2", "'s3_binary_weight': must be >= 0"),
    ("s3_sparsity=-1", "'s3_sparsity': must be >= 0"),
    ("s3_init_unimportant=1", "'s3_init_unimportant': must lie in (0, 1)"),
    ("s3_budgets=[5,0]", "'s3_budgets': node counts must be whole numbers >= 1, got [0]"),
    ("s3_baselines=[exact]", "unknown 'exact'; valid: exact_patching"),
])
def test_bad_recipe_values_name_the_key_before_loading(override, words):
    from condense.runs import load_config
    with pytest.raises(RecipeError) as e:
        load_config("recipes/s3martcirc/smollm2_ioi.yaml", [override, "output_dir=runs/never_made"])
    assert words in str(e.value)


def test_paired_drop_difference_is_the_exact_mcnemar_test():
    d = paired_drop_difference("0001", "1111")  # three rows only A's ablation breaks
    assert (d["a_only"], d["b_only"], d["n"]) == (3, 0, 4) and d["difference"] == 75.0
    assert d["p"] == pytest.approx(2 / 8)  # both tails of Binomial(3, 1/2) at its ends
    # 1 of 8 discordant rows the other way: 2 * P(X <= 1), X ~ Binomial(8, 1/2) = 2 * 9 / 256
    d = paired_drop_difference("1" + "0" * 7 + "11", "0" + "1" * 7 + "11")
    assert (d["a_only"], d["b_only"]) == (7, 1) and d["p"] == pytest.approx(18 / 256)
    assert d["difference"] == pytest.approx(60.0)
    assert paired_drop_difference("0101", "0101")["p"] == 1.0  # no discordant row
    with pytest.raises(ValueError, match="4 and 3 rows"):
        paired_drop_difference("0101", "010")


def test_an_interrupted_training_goes_on_to_the_uninterrupted_result(organism_rows, tmp_path, monkeypatch):
    import importlib
    from condense.optimize import FitState
    method = importlib.import_module("condense.methods.s3martcirc.method")
    model, rows = organism_rows
    g = Graph.from_model(model)
    s = S3Settings(epochs=2, warmup_epochs=1, k=2, batch_size=8, sparsity=3.0, binary_weight=3.0)
    whole = train_s3martcirc(model, g, rows, s, progress=False)
    real, calls = method.masked_logits, []

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # the third discovery step, after a classification step
            raise KeyboardInterrupt
        time.sleep(0.4)  # the killed process's steps take longer than the whole rerun
        return real(*args, **kwargs)
    monkeypatch.setattr(method, "masked_logits", failing)
    path = str(tmp_path / "training.pt")
    with pytest.raises(KeyboardInterrupt):
        train_s3martcirc(model, g, rows, s, progress=False, state=FitState(path, every=0))
    monkeypatch.setattr(method, "masked_logits", real)
    saved_seconds = torch.load(path, weights_only=True)["seconds"]
    state = FitState(path, every=0)
    started = time.perf_counter()
    resumed = train_s3martcirc(model, g, rows, s, progress=False, state=state)
    assert 0 < state.resumed_at < len(s.schedule(len(rows)))
    # its seconds count the killed process's steps as well as its own
    assert state.earlier_seconds == saved_seconds >= 2 * 0.4
    assert saved_seconds < resumed.seconds <= saved_seconds + time.perf_counter() - started
    assert torch.equal(resumed.logits_heads, whole.logits_heads)
    assert torch.equal(resumed.logits_neurons, whole.logits_neurons)
    assert torch.equal(resumed.importance.heads, whole.importance.heads)
    assert torch.equal(resumed.importance.neurons, whole.importance.neurons)
    assert resumed.history == whole.history


def test_a_run_killed_among_its_baselines_keeps_the_ones_it_finished(tmp_path, monkeypatch):
    """Each node baseline's record is saved once done (state/baselines.pt): a run killed while
    scoring its second baseline scores only that one and the next when run again, and writes
    the uninterrupted run's comparison; the file goes once the run is written."""
    import condense.methods.s3martcirc.run as s3_run
    args = ["--recipe", "recipes/s3martcirc/organism_ioi.yaml", "n_train=16", "n_test=16",
            "s3_epochs=2", "s3_warmup_epochs=1", "s3_batch_size=8", "s3_budgets=[2,8]",
            "s3_baselines=[attribution_patching,node_pruning,random]"]
    whole = train.main(args + [f"output_dir={tmp_path / 'whole'}"])
    real, scored, kill = s3_run.score_nodes, [], [True]

    def scoring(method, *a, **k):
        scored.append(method)
        if method == "node_pruning" and kill[0]:
            raise KeyboardInterrupt
        return real(method, *a, **k)
    monkeypatch.setattr(s3_run, "score_nodes", scoring)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        train.main(args + [f"output_dir={out}"])
    assert (out / "state" / "baselines.pt").exists() and scored == ["attribution_patching", "node_pruning"]
    scored.clear()
    kill[0] = False
    resumed = train.main(args + [f"output_dir={out}"])
    assert scored == ["node_pruning", "random"]
    assert not (out / "state" / "baselines.pt").exists()

    def without_times(baselines):
        return {m: {k: v for k, v in rec_.items() if k != "seconds"} for m, rec_ in baselines.items()}
    assert without_times(resumed["baselines"]) == without_times(whole["baselines"])
    assert resumed["baselines"]["attribution_patching"]["seconds"] > 0
