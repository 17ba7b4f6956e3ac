"""Node explanations (condense.explain.weightlens, condense.explain.circuitlens, condense.explain).

A hand-built one-layer GPT-2 whose right answers are known by construction:
- head a0.h0 attends uniformly and its OV circuit maps token A's embedding onto token B's
  unembedding: WeightLens must list A as input and B as (promoted) output, and keep both;
- head a0.h1 maps C onto D but always attends to position 0: its weights name C and D,
  yet C only "works" when it is the first token, so validation in a neutral context must
  reject it and the head must come out context-dependent;
- MLP neuron 3 reads F and writes G; neuron 5 reads B's direction (what a0.h0 writes) and
  writes H, so it must read B directly and *inherit* A through a0.h0.
Every token embedding is orthogonal to the special directions, so no other token may
appear. Then: Jaccard distances and average-linkage clustering on hand-made sets (cases
where single or complete linkage would give other clusters), weighted context sampling,
CircuitLens separating m0's two mechanisms (F through input->m0, A through a0.h0->m0),
and the CLI on the tiny model saved with the organism's tokenizer."""
import json
import os

import pytest
import torch
import yaml
from transformers import GPT2Config, GPT2LMHeadModel

from condense.explain.circuitlens import (
    CircuitLens,
    CircuitLensConfig,
    average_linkage,
    jaccard_distances,
    sample_contexts,
)
from condense.explain.run import main, name_fractions, neuron_attribution
from condense.graph import Graph
from condense.explain.weightlens import LensConfig, WeightLens

from .conftest import ORGANISM

D_MODEL, V = 64, 4096
WORDS = dict(A=" table", B=" Mary", C=" book", D=" John", F=" water", G=" Tom", H=" Anna")
NEUTRAL = "The next word is"


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def ids(organism_tokenizer):
    out = {k: organism_tokenizer.encode(w) for k, w in WORDS.items()}
    assert all(len(v) == 1 for v in out.values())
    out = {k: v[0] for k, v in out.items()}
    out["neutral"] = organism_tokenizer.encode(NEUTRAL)
    assert not set(out["neutral"]) & {out[k] for k in WORDS}
    return out


def hand_built(ids):
    cfg = GPT2Config(vocab_size=V, n_embd=D_MODEL, n_layer=1, n_head=2, n_inner=16, n_positions=128,
                     attn_implementation="eager")
    model = GPT2LMHeadModel(cfg)
    gen = torch.Generator().manual_seed(0)
    d, dh, sq = D_MODEL, D_MODEL // 2, D_MODEL ** 0.5
    # 8 orthonormal directions, all orthogonal to the ones vector (LayerNorm keeps them)
    basis = torch.randn(d, 8, generator=gen)
    basis = torch.linalg.qr(basis - basis.mean(0))[0]
    u = dict(zip("ABCDFGH", basis.T[:7]))
    u_pos = basis[:, 7]
    E = torch.randn(V, d, generator=gen)
    E = E - E.mean(1, keepdim=True)
    E = E - (E @ basis) @ basis.T
    E = sq * E / E.norm(dim=1, keepdim=True)
    for k in "ABCDFGH":
        E[ids[k]] = sq * u[k]
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        for ln in (model.transformer.h[0].ln_1, model.transformer.h[0].ln_2, model.transformer.ln_f):
            ln.weight.fill_(1.0)
        model.transformer.wte.weight.copy_(E)          # tied: also the unembedding
        model.transformer.wpe.weight[0] = sq * u_pos   # a mark on position 0 only
        at, mlp = model.transformer.h[0].attn, model.transformer.h[0].mlp
        W, b = at.c_attn.weight, at.c_attn.bias        # Conv1D: x @ W + b; columns q | k | v
        # head 0: q = k = 0 (uniform attention); v unit 0 = LN(x).u_A; writes u_B
        W[:, 2 * d + 0] = u["A"]
        at.c_proj.weight[0] = u["B"]
        # head 1: constant query, key = LN(x).u_pos (position 0 wins); v unit 0 = LN(x).u_C; writes u_D
        b[dh] = 10.0
        W[:, d + dh] = 10.0 * u_pos
        W[:, 2 * d + dh] = u["C"]
        at.c_proj.weight[dh] = u["D"]
        # neuron 3: gelu(LN(x).u_F - 2) writes u_G; neuron 5: gelu(3 LN(x).u_B - 1) writes u_H
        mlp.c_fc.weight[:, 3], mlp.c_fc.bias[3] = u["F"], -2.0
        mlp.c_fc.weight[:, 5], mlp.c_fc.bias[5] = 3.0 * u["B"], -1.0
        mlp.c_proj.weight[3], mlp.c_proj.weight[5] = u["G"], u["H"]
    return model.eval()


@pytest.fixture(scope="module")
def tiny(ids):
    return hand_built(ids)


def _lens(model, ids):
    return WeightLens(model, Graph.from_model(model), ids["neutral"], config=LensConfig())


def test_head_ov_tokens_are_found_and_validated(tiny, ids):
    lens = _lens(tiny, ids)
    r = lens.explain_head("a0.h0")
    assert [e["id"] for e in r["ov_input"]] == [ids["A"]]
    assert r["validated"]["input"] == [ids["A"]]
    assert [e["id"] for e in r["output_tokens"]] == [ids["B"]]
    assert r["validated"]["promoted"] == [ids["B"]] and r["validated"]["suppressed"] == []
    assert r["output_tokens"][0]["tested_with"] == ids["A"]
    assert not r["context_dependent"]
    # activation in isolation and in context both above the baseline thresholds
    act, thr = r["ov_input"][0]["activation"], r["thresholds"]["input"]
    assert act[0] > thr[0] and act[1] > thr[1]


def test_validation_rejects_what_only_the_weights_say(tiny, ids):
    """a0.h1's weights say C -> D, but it attends to position 0: C at the end of a neutral
    context does nothing, so nothing survives validation."""
    lens = _lens(tiny, ids)
    r = lens.explain_head("a0.h1")
    assert [e["id"] for e in r["ov_input"]] == [ids["C"]]
    assert [e["id"] for e in r["output_tokens"]] == [ids["D"]]
    iso, ctx = r["ov_input"][0]["activation"]
    t_iso, t_ctx = r["thresholds"]["input"]
    assert iso > t_iso and not ctx > t_ctx      # works alone (position 0), not in context
    assert r["validated"] == dict(input=[], keys=[], promoted=[], suppressed=[])
    assert r["context_dependent"]


def test_neurons_direct_and_inherited_tokens(tiny, ids):
    lens = _lens(tiny, ids)
    lens.explain_head("a0.h0")                   # its validated tokens feed inheritance
    r = lens.explain_mlp("m0", [3, 5], upstream=[("a0.h0", None)])
    n3, n5 = r["neurons"]
    assert [e["id"] for e in n3["input_tokens"]] == [ids["F"]]
    assert n3["validated"]["input"] == [ids["F"]] and n3["validated"]["promoted"] == [ids["G"]]
    assert n3["validated"]["suppressed"] == []
    via = {e["id"]: e["via"] for e in n5["input_tokens"]}
    assert via == {ids["B"]: "direct", ids["A"]: "inherited:a0.h0"}
    assert set(n5["validated"]["input"]) == {ids["A"], ids["B"]}
    assert n5["validated"]["promoted"] == [ids["H"]]
    assert set(r["validated"]["input"]) == {ids["A"], ids["B"], ids["F"]}
    # without the upstream edge nothing is inherited
    r2 = _lens(tiny, ids).explain_mlp("m0", [5])
    assert [e["id"] for e in r2["neurons"][0]["input_tokens"]] == [ids["B"]]


def test_top_quantile_is_torch_quantile_bit_for_bit():
    from condense.explain.weightlens import top_quantile
    gen = torch.Generator().manual_seed(0)
    for shape, dim in [((256, 999), 0), ((6, 5000), 1), ((5000,), None), ((7, 3), 0), ((1, 1), 1)]:
        x = torch.randn(*shape, generator=gen).abs()
        x[0] = x.flatten()[-1]  # ties
        for q in (0.0, 0.123, 0.5, 0.9, 0.95, 0.99, 1.0):
            want = torch.quantile(x, q) if dim is None else torch.quantile(x, q, dim=dim)
            assert torch.equal(top_quantile(x, q, dim), want), (shape, dim, q)


def test_a_neurons_outputs_are_validated_alike_through_its_one_direction():
    """A neuron writes one direction: _validate_outputs with `effect` = U* w (thresholds from
    quantiles of |value| and |effect|) keeps the same tokens with the same signs as with the
    [tokens, V] products of the general path, on the organism's first MLP."""
    from condense.models import load_model, load_tokenizer
    model, tok = load_model(ORGANISM), load_tokenizer(ORGANISM)
    lens = WeightLens(model, Graph.from_model(model), tok("The next word is")["input_ids"])
    writes, hidden, checked = lens.neuron_writes(0), lens.mlp_hidden(0, lens.E), 0
    for i in range(0, writes.shape[0], 32):
        def what(s, h, i=i):
            return h[0, i:i + 1]
        effect = writes[i] @ lens.U_star.T
        candidates = torch.cat([effect.topk(8).indices, (-effect).topk(8).indices]).tolist()
        tests = hidden[:, i].topk(6).indices.tolist()  # the tokens that drive it most
        general = lens._validate_outputs(f"n{i}", candidates, lambda o: tests, what,
                                         write=lambda d, i=i: d * writes[i])
        one_direction = lens._validate_outputs(f"n{i}", candidates, lambda o: tests, what,
                                               effect=effect)
        assert one_direction == general, i
        checked += len(general)
    assert checked > 0  # some outputs validated: the comparison is not between empty sets


def test_jaccard_and_average_linkage():
    sets = [{"a", "b"}, {"a", "b"}, {"a", "b", "c"}, {"x", "y"}, {"x", "y", "z"}, {"x", "y"}, set(), set()]
    D = jaccard_distances(sets)
    assert D[0, 1] == 0 and abs(D[0, 2] - 1 / 3) < 1e-6 and D[0, 3] == 1 and D[6, 7] == 0
    assert D[0, 6] == 1
    assert average_linkage(D, 0.5) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert average_linkage(D, 1e-9) == [[0, 1], [3, 5], [6, 7], [2], [4]]  # only identical sets
    assert average_linkage(D, 1.01) == [list(range(8))]
    # average linkage, not single: 2 is 0.45 from 0 but 0.7 from 1 -> mean 0.575 >= 0.5
    D3 = torch.tensor([[0, 0.1, 0.45], [0.1, 0, 0.7], [0.45, 0.7, 0]])
    assert average_linkage(D3, 0.5) == [[0, 1], [2]]
    # ... and not complete: 0.45 and 0.52 -> mean 0.485 < 0.5 merges
    D3[1, 2] = D3[2, 1] = 0.52
    assert average_linkage(D3, 0.5) == [[0, 1, 2]]


def test_sample_contexts_bins_without_replacement():
    acts = torch.arange(1000, dtype=torch.float)
    gen = torch.Generator().manual_seed(0)
    picked = sample_contexts(acts, 20, n_bins=4, quantile=0.9, generator=gen)
    assert len(picked) == len(set(picked)) == 20
    assert all(p >= 900 for p in picked)                # only active positions (top 10 %)
    assert picked == sorted(picked, reverse=True)
    edges = torch.quantile(acts[acts >= torch.quantile(acts, 0.9)], torch.linspace(0, 1, 5))
    per_bin = [sum(edges[b] <= p < edges[b + 1] for p in picked) for b in range(3)]
    assert per_bin == [5, 5, 5]                         # every bin drawn from
    assert sample_contexts(acts, 500, quantile=0.9) == list(range(999, 899, -1))  # all 100 active


def test_circuitlens_separates_mechanisms(tiny, ids):
    """m0 fires on F (through input->m0) and on A (B's direction, written by a0.h0): the two
    kinds of context get different contributor sets and land in different clusters."""
    gen = torch.Generator().manual_seed(1)
    special = {ids[k] for k in WORDS}
    seqs = []
    for i in range(16):
        s = [t for t in torch.randint(2000, 4000, (12,), generator=gen).tolist() if t not in special][:10]
        s[3 + i % 5] = ids["F"] if i % 2 else ids["A"]
        seqs.append(s)
    g = Graph.from_model(tiny)
    lens = CircuitLens(tiny, g, seqs, ["task"] * len(seqs), config=CircuitLensConfig(n_contexts=12))
    head = lens.explain("a0.h0")
    for c in head["contexts"]:     # q and k weights are zero: only the value input drives it
        assert [x["edge"] for x in c["contributors"]] == ["input->a0.h0<v>"]
    r = lens.explain("m0", in_circuit=["a0.h0->m0"])
    last = {ids["A"]: [], ids["F"]: []}
    for c in r["contexts"]:
        tok = seqs[c["seq"]][c["pos"]]
        if tok in last:
            last[tok].append({x["edge"] for x in c["contributors"]})
    assert last[ids["A"]] and last[ids["F"]]
    assert all("a0.h0->m0" in s for s in last[ids["A"]])
    assert all("a0.h0->m0" not in s and "input->m0" in s for s in last[ids["F"]])
    assert len(r["clusters"]) >= 2
    by_cluster = {}
    for k, cl in enumerate(r["clusters"]):
        for m in cl["members"]:
            by_cluster[m] = k
    kinds = {}
    for m, c in enumerate(r["contexts"]):
        tok = seqs[c["seq"]][c["pos"]]
        if tok in last:
            kinds.setdefault(tok, set()).add(by_cluster[m])
    assert not kinds[ids["A"]] & kinds[ids["F"]]
    assert r["clustering"]["algorithm"].startswith("average-linkage")


def test_neuron_attribution_finds_the_neuron_that_moves_the_answer(tiny, ids):
    """Clean [n, A] vs corrupted [n, n']: only neuron 5 changes (A -> a0.h0 -> u_B -> n5),
    and it writes H, the answer; neuron 3 (F) and the empty neurons get nothing."""
    n1, n2 = ids["neutral"][:2]
    rows = dict(clean_ids=[[n1, ids["A"]], [n2, n1, ids["A"]]], corrupted_ids=[[n1, n2], [n2, n1, n2]],
                answer_id=[ids["H"]] * 2, distractor_id=[ids["G"]] * 2)
    attr = neuron_attribution(tiny, Graph.from_model(tiny), rows)
    assert attr.shape == (1, 16)
    assert int(attr[0].abs().argmax()) == 5 and float(attr[0, 5]) > 0.1
    assert float(attr[0].abs().sort().values[-2]) < 1e-3 * float(attr[0, 5])


def test_name_fractions():
    nodes = {"a1.h0": dict(weightlens=dict(kind="attention", validated_tokens=dict(
        promoted=[" Mary", " table"], suppressed=[" John"]))),
             "m0": dict(weightlens=dict(kind="mlp"))}
    fr = name_fractions(nodes, ["Mary", "John"])
    assert list(fr) == ["a1.h0"]
    assert fr["a1.h0"]["all"] == dict(n=3, names=2, fraction=2 / 3)
    assert fr["a1.h0"]["suppressed"]["fraction"] == 1.0


def _tiny_run(tiny, tmp_path, run_name="run"):
    """A run folder over the tiny model: a0.h0 and m0 in the circuit, a0.h1 weakly."""
    model_dir, run = tmp_path / "model", tmp_path / run_name
    if not model_dir.exists():
        tiny.save_pretrained(model_dir)
    g = Graph.from_model(tiny)
    g.reset(in_graph=False)
    for name, score in [("input->a0.h0<v>", 2.0), ("a0.h0->logits", 3.0), ("a0.h0->m0", 1.0),
                        ("input->m0", 1.0), ("m0->logits", 1.5), ("input->a0.h1<v>", 0.5),
                        ("a0.h1->logits", 0.4)]:
        g.edges[name].in_graph, g.edges[name].score = True, score
    os.makedirs(run)
    g.to_json(run / "circuit.json")
    with open(run / "recipe.yaml", "w") as f:
        yaml.safe_dump(dict(model=str(model_dir), tokenizer=os.path.abspath(ORGANISM), task="ioi",
                            intervention="patching", device="cpu"), f)
    return run


def test_cli_writes_explain_json_and_report(tiny, ids, tmp_path, capsys):
    run = _tiny_run(tiny, tmp_path)
    rc = main([str(run), "--n-contexts", "6", "--n-task", "8", "--n-general", "4",
               "--neurons", "2", "--neuron-ranking", "weights", "--threads", "1",
               "--neutral-text", NEUTRAL])
    assert rc == 0
    with open(run / "explain.json") as f:
        report = json.load(f)
    assert list(report["nodes"]) == ["a0.h0", "a0.h1", "m0"]
    h0 = report["nodes"]["a0.h0"]["weightlens"]
    assert h0["validated"]["input"] == [ids["A"]] and h0["validated"]["promoted"] == [ids["B"]]
    assert h0["validated_tokens"]["promoted"] == [WORDS["B"]]
    assert report["nodes"]["a0.h1"]["weightlens"]["context_dependent"]
    m0 = report["nodes"]["m0"]["weightlens"]
    assert sorted(n["neuron"] for n in m0["neurons"]) == [3, 5]      # the only neurons that matter
    assert m0["neuron_selection"].startswith("weights")
    assert report["nodes"]["m0"]["upstream"] == ["a0.h0"]
    for node in report["nodes"].values():
        assert node["circuitlens"]["contexts"] and node["circuitlens"]["clusters"]
        assert node["description"] is None
    s = report["summary"]
    assert s["top_logits_head"] == "a0.h0" and s["context_dependent"] == ["a0.h1"]
    assert s["ioi_names"]["a0.h0"]["all"]["fraction"] == 1.0        # B is " Mary"
    assert s["name_heads"] == ["a0.h0"] and s["done"]
    md = (run / "explain.md").read_text()
    assert "## a0.h0" in md and "## m0" in md and repr(WORDS["B"]) in md and "context-dependent" in md
    assert "included" in capsys.readouterr().out


def test_an_interrupted_explain_goes_on_with_the_nodes_not_yet_done(tiny, tmp_path, monkeypatch,
                                                                      capsys):
    """Killed while explaining its MLP node, the rerun explains only that node (the two heads
    and the neuron attribution come from the resume file) and writes what one uninterrupted
    run writes; the resume file goes once explain.json is written."""
    from condense.explain import run as explain
    args = ["--n-contexts", "6", "--n-task", "8", "--n-general", "4", "--neurons", "2",
            "--threads", "1", "--neutral-text", NEUTRAL]
    whole = _tiny_run(tiny, tmp_path, "whole")
    assert main([str(whole)] + args) == 0
    run = _tiny_run(tiny, tmp_path, "run")
    real_mlp, real_head = WeightLens.explain_mlp, WeightLens.explain_head

    def killed(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(WeightLens, "explain_mlp", killed)
    with pytest.raises(KeyboardInterrupt):
        main([str(run)] + args)
    assert (run / explain.STATE_FILE).exists() and not (run / "explain.json").exists()
    calls = []

    def counted(real):
        def call(self, name, *a, **k):
            calls.append(name)
            return real(self, name, *a, **k)
        return call
    monkeypatch.setattr(WeightLens, "explain_mlp", counted(real_mlp))
    monkeypatch.setattr(WeightLens, "explain_head", counted(real_head))
    monkeypatch.setattr(explain, "neuron_attribution", lambda *a, **k: pytest.fail("attribution redone"))
    capsys.readouterr()
    assert main([str(run)] + args) == 0
    assert calls == ["m0"]
    assert "resuming: 2 of 3 nodes explained before" in capsys.readouterr().out
    assert not (run / explain.STATE_FILE).exists()
    got, want = (json.loads((d / "explain.json").read_text()) for d in (run, whole))
    assert got["nodes"] == want["nodes"] and got["summary"] == want["summary"]
    assert got["resumed_seconds"] > 0 and got["seconds"] > got["resumed_seconds"]
    assert (run / "explain.md").read_text() == (whole / "explain.md").read_text().replace(
        str(whole), str(run))
