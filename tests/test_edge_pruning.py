"""Edge Pruning and HAP (condense/methods/edge_pruning/): the hard-concrete math against direct
formulas, the Lagrangian's signs under fit's maximisation, HAP's fixed-off non-candidates,
the thresholding to the learned sparsity, and short recipe runs that write artifacts."""
import json
import math

import pytest
import torch
from transformers import AutoTokenizer, GPT2LMHeadModel

from condense.methods import edge_pruning as ep
from condense.methods.edge_pruning import HAPConfig
from condense import tasks, train
from condense import runs
from condense.attribute import attribute
from condense.config import RecipeError
from condense.graph import Graph

from .conftest import tiny_gpt2_folder



@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """Weights redrawn (tiny.randomize_weights, scale 2) so that edges matter."""
    return tiny_gpt2_folder(tmp_path_factory.mktemp("tiny_ep"), randomize=(1, 2.0))


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    model = GPT2LMHeadModel.from_pretrained(tiny_dir).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    rows = tasks.load_task("ioi", tokenizer, "train", n=16, seed=0)
    return model, rows


def cfg_for(**keys):
    base = dict(ep_batch_size=8, batch_size=8, ep_lr=0.1, ep_lambda_lr=0.1, threads=1)
    base.update(keys)
    return HAPConfig(**base)


# ------------------------------------------------------------------ hard-concrete math
def test_hard_concrete_sample_and_expectation_match_the_formulas():
    log_alpha = torch.tensor([-3.0, -0.5, 0.0, 0.7, 2.5, 10.0], dtype=torch.float64)
    u = torch.tensor([0.01, 0.3, 0.5, 0.62, 0.9, 0.999], dtype=torch.float64)
    beta, l, r = 2 / 3, -0.1, 1.1
    for la, uu, z in zip(log_alpha.tolist(), u.tolist(), ep.hard_concrete(log_alpha, u).tolist()):
        s = 1 / (1 + math.exp(-(math.log(uu) - math.log(1 - uu) + la) / beta))
        assert z == pytest.approx(min(1.0, max(0.0, s * (r - l) + l)), abs=1e-12)
    # the L0 expectation P(z != 0) = sigmoid(log_alpha - beta log(-l/r)), and Monte Carlo agrees
    expected = [1 / (1 + math.exp(-(la - beta * math.log(-l / r)))) for la in log_alpha.tolist()]
    assert ep.keep_probability(log_alpha).tolist() == pytest.approx(expected, abs=1e-12)
    gen = torch.Generator().manual_seed(0)
    uu = ep.sample_uniform(200_000, gen, dtype=torch.float64)
    for la, p in zip(log_alpha.tolist(), expected):
        z = ep.hard_concrete(torch.full_like(uu, la), uu)
        assert float((z > 0).double().mean()) == pytest.approx(p, abs=0.005)
        assert float(z.min()) >= 0.0 and float(z.max()) <= 1.0
    # the stretch makes exact zeros and ones (a gate is really off or on)
    z = ep.hard_concrete(torch.zeros_like(uu), uu)
    assert bool((z == 0).any()) and bool((z == 1).any())
    det = ep.deterministic_mask(log_alpha)
    assert det.tolist() == pytest.approx(
        [min(1, max(0, (1 / (1 + math.exp(-la))) * (r - l) + l)) for la in log_alpha.tolist()])


def test_binary_circuit_has_the_learned_number_of_edges(tiny):
    model, _ = tiny
    graph = Graph.from_model(model)
    masks = ep.EdgeMasks(graph, init=0.0)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        masks.log_alpha.copy_(torch.randn(masks.n_trainable, generator=gen) * 4 - 3)
    k = round(float(ep.keep_probability(masks.log_alpha.detach()).sum()))
    assert 0 < k < masks.n_trainable
    binary = masks.binary()
    assert int(binary.sum()) == k == masks.n_kept()
    # the kept edges are exactly the k largest log-alphas
    full = masks.full_log_alpha()
    assert float(full[binary].min()) >= float(full[graph.valid & ~binary].max())
    circuit = masks.circuit(graph)
    assert circuit.count_edges() == k
    assert torch.allclose(circuit.scores[graph.valid], ep.keep_probability(full[graph.valid]))
    assert 1 - masks.learned_sparsity() == pytest.approx(float(masks.expected_kept().detach()) / graph.valid.sum().item())
    # a fixed size (benchmarks: like-for-like comparisons) keeps the top k' log-alphas
    for k2 in (1, k + 5):
        fixed = masks.binary(k2)
        assert int(fixed.sum()) == k2 and masks.circuit(graph, k=k2).count_edges() == k2
        assert float(full[fixed].min()) >= float(full[graph.valid & ~fixed].max())


# ------------------------------------------------------------------ the objective
def test_target_ramp_and_hap_schedule():
    assert ep.target_at(0, 0.0, 0.9, 100) == 0.0
    assert ep.target_at(50, 0.0, 0.9, 100) == pytest.approx(0.45)
    assert ep.target_at(100, 0.0, 0.9, 100) == 0.9 and ep.target_at(7, 0.2, 0.9, 0) == 0.9
    assert ep.target_at(25, 0.7, 0.9, 100) == pytest.approx(0.75)
    cfg = cfg_for(ep_steps=1000, ep_ramp_fraction=0.8, ep_target_sparsity=0.95)
    assert ep.ep_schedule(cfg) == (1000, 800)
    # HAP keeps EP's ramp rate over the sparsity left to learn, then EP's 200 settle steps
    ramp = round(800 * (0.95 - 0.7) / 0.95)
    assert ep.hap_schedule(cfg, 0.7) == (ramp + 200, ramp)
    assert ep.hap_schedule(cfg, 0.97) == (200, 0)          # candidates already sparse enough
    assert ep.hap_schedule(cfg_for(hap_steps=50, ep_ramp_fraction=0.5), 0.7) == (50, 25)


def test_lagrangian_signs_under_maximisation(tiny):
    """Too dense (s < t): lambda1 goes negative, lambda2 positive, and the gates close.
    Too sparse (s > t): lambda1 goes positive and the gates open."""
    model, rows = tiny
    graph = Graph.from_model(model)
    target_logp = ep.full_logprobs(model, rows, 8)
    s, t = torch.tensor(0.2, requires_grad=True), 0.5
    lam = torch.tensor([-1.0, 2.0], requires_grad=True)
    ep.lagrangian(s, t, lam[0], lam[1]).backward()
    assert float(s.grad) == pytest.approx(-1.0 + 2 * 2.0 * (0.2 - 0.5))
    assert lam.grad.tolist() == pytest.approx([0.2 - 0.5, (0.2 - 0.5) ** 2])

    cfg = cfg_for(ep_target_sparsity=0.5, ep_ramp_fraction=0.0)
    dense = ep.EdgeMasks(graph, init=3.0, generator=torch.Generator().manual_seed(0))
    s0 = dense.learned_sparsity()
    history, lambdas = ep.train_masks(model, graph, dense, rows, target_logp, cfg, steps=4,
                                      ramp_steps=0, progress=False)
    assert s0 < 0.5 and float(lambdas[0]) < 0 < float(lambdas[1])
    assert dense.learned_sparsity() > s0 and all(h["target"] == 0.5 for h in history)

    sparse = ep.EdgeMasks(graph, init=-5.0, generator=torch.Generator().manual_seed(0))
    s0 = sparse.learned_sparsity()
    _, lambdas = ep.train_masks(model, graph, sparse, rows, target_logp, cfg, steps=4,
                                ramp_steps=0, progress=False)
    assert s0 > 0.5 and float(lambdas[0]) > 0 and float(lambdas[1]) > 0
    assert sparse.learned_sparsity() < s0


def test_log_alphas_stay_within_the_bound(tiny):
    """A large lr would throw gates far past +-10, where the sigmoid gradient underflows to 0
    and a gate never moves again: train_masks clamps them to +-max(10, init)."""
    model, rows = tiny
    graph = Graph.from_model(model)
    target_logp = ep.full_logprobs(model, rows, 8)
    masks = ep.EdgeMasks(graph, init=10.0, generator=torch.Generator().manual_seed(0))
    cfg = cfg_for(ep_lr=50.0, ep_target_sparsity=0.9, ep_ramp_fraction=0.0)
    ep.train_masks(model, graph, masks, rows, target_logp, cfg, steps=3, ramp_steps=0,
                   progress=False)
    assert float(masks.log_alpha.detach().abs().max()) <= ep.LOG_ALPHA_BOUND + 1e-6
    assert float(masks.log_alpha.detach().min()) == pytest.approx(-ep.LOG_ALPHA_BOUND)


def test_hap_trains_only_candidates_and_keeps_the_rest_off(tiny):
    model, rows = tiny
    graph = Graph.from_model(model)
    cfg = cfg_for(hap_candidates=12, ep_target_sparsity=0.9)
    candidates = ep.hap_candidates(model, graph, rows, cfg, progress=False)
    # the candidates are the top 12 edges by |EAP score|
    scores = attribute(model, Graph.from_model(model), rows, "eap", batch_size=8, progress=False)
    assert int(candidates.sum()) == 12
    assert float(scores.abs()[candidates].min()) >= float(scores.abs()[graph.valid & ~candidates].max())

    masks = ep.EdgeMasks(graph, candidates, init=10.0, generator=torch.Generator().manual_seed(0))
    n_edges = int(graph.valid.sum())
    assert masks.n_trainable == 12 and masks.log_alpha.shape == (12,)
    assert masks.learned_sparsity() == pytest.approx(1 - 12 / n_edges, abs=1e-4)  # over ALL edges
    z = masks.sample(ep.sample_uniform(12, torch.Generator().manual_seed(1)))
    assert float(z.detach()[~candidates].abs().max()) == 0.0 and float(z.detach()[candidates].min()) > 0
    before = masks.log_alpha.detach().clone()
    target_logp = ep.full_logprobs(model, rows, 8)
    ep.train_masks(model, graph, masks, rows, target_logp, cfg, steps=3, ramp_steps=0,
                   start_sparsity=1 - 12 / n_edges, progress=False)
    assert not torch.equal(before, masks.log_alpha.detach())
    assert not bool((masks.binary() & ~candidates).any())
    assert float(masks.keep_scores()[~candidates].abs().max()) == 0.0


# ------------------------------------------------------------------ runs from recipes
def run_recipe(tmp_path, model_dir, **keys):
    import yaml
    path = tmp_path / "recipe.yaml"
    base = dict(model=model_dir, task="ioi", n_train=16, n_val=8, n_test=16, batch_size=8,
                ep_batch_size=8, ep_steps=12, ep_target_sparsity=0.8, ep_ramp_fraction=0.5,
                ep_lr=0.5, ep_lambda_lr=0.5, threads=1, output_dir=str(tmp_path / "run"))
    base.update(keys)
    path.write_text(yaml.safe_dump(base))
    return train.main(["--recipe", str(path)]), tmp_path / "run"


@pytest.mark.parametrize("method", ["edge_pruning", "hap"])
def test_run_writes_artifacts_that_read_back(tiny_dir, tmp_path, method):
    metrics, out = run_recipe(tmp_path, tiny_dir, method=method,
                              **(dict(hap_candidates=30) if method == "hap" else {}))
    for name in ("circuit.json", "circuit.png", "training.png", "training.jsonl", "metrics.json",
                 "recipe.yaml", "state/masks.safetensors"):
        assert (out / name).stat().st_size > 0, name
    with open(out / "metrics.json") as f:
        saved = json.load(f)
    assert saved == json.loads(json.dumps(metrics)) and saved["method"] == method
    for key in ("accuracy", "logit_diff", "kl", "faithfulness", "edges", "edges_kept", "sparsity",
                "steps", "search_seconds"):
        assert key in saved, key
    model = GPT2LMHeadModel.from_pretrained(tiny_dir)
    graph = Graph.from_json(out / "circuit.json", model)
    assert graph.count_edges() == graph.count_edges(on_path=True) == saved["edges"]
    # circuit.json's scores are P(z != 0): thresholding them to round(sum) edges and pruning
    # gives the circuit, and that sum is the learned sparsity
    valid = graph.valid
    k = round(float(graph.scores[valid].double().sum()))
    assert k == saved["edges_kept"]
    assert 1 - k / int(valid.sum()) == pytest.approx(saved["sparsity"], abs=1 / int(valid.sum()))
    again = graph.copy()
    again.apply_topn(k)
    assert again.count_edges() == k
    again.prune()
    assert torch.equal(again.in_graph, graph.in_graph)
    from safetensors.torch import load_file
    log_alpha = load_file(str(out / "state" / "masks.safetensors"))["log_alpha"]
    gated = torch.isfinite(log_alpha)
    if method == "hap":
        assert int(gated.sum()) == 30 == saved["n_candidates"] == saved["n_gated"]
        assert saved["steps"] < 12  # the candidates met part of the sparsity
        assert float(graph.scores[valid & ~gated].abs().max()) == 0.0
        assert not bool((graph.in_graph & ~gated).any())
    else:
        assert torch.equal(gated, valid) and saved["steps"] == 12
    from .test_report import check_run_report
    dom = check_run_report(str(out), tmp_path)
    assert dom is None or "Training steps" in dom


def test_bad_values_fail_before_any_model_loads(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    for method, key, value in (("edge_pruning", "ep_target_sparsity", 1.5),
                               ("edge_pruning", "ep_steps", 0),
                               ("hap", "hap_candidate_fraction", 0.0),
                               ("hap", "hap_attribution", "acdc")):
        with pytest.raises(RecipeError, match=key):
            run_recipe(tmp_path, "no/such/model", method=method, **{key: value})


def test_hap_vs_ep_combine_refuses_a_file_it_did_not_write(tmp_path, monkeypatch, capsys, hap_vs_ep):
    """--combine names the file and what it should hold: a usage error, not a traceback."""
    import sys
    other = tmp_path / "grid.json"
    other.write_text('{"rows": []}')
    for path in (str(tmp_path / "missing.json"), str(other)):
        monkeypatch.setattr(sys, "argv", ["hap_vs_ep.py", "--combine", path])
        with pytest.raises(SystemExit) as exit:
            hap_vs_ep.main()
        err = capsys.readouterr().err
        assert exit.value.code == 2 and f"--combine {path}" in err, err
        assert "'results' list" in err


def test_hap_vs_ep_control_only_is_the_control_of_a_full_run(tmp_path, monkeypatch, hap_vs_ep):
    """--control-only (for runs made with --no-control) gives the control a full run makes, and
    --combine pools it with the --no-control run into the full run's control ratios."""
    import json
    import sys
    flags = ["--tasks", "ioi", "--seeds", "0", "--steps", "16", "--n-train", "16", "--n-test", "16",
             "--batch-size", "8", "--candidates", "0.4", "--init-log-alpha", "1", "--no-progress"]

    def run(name, *args):
        path = str(tmp_path / f"{name}.json")
        monkeypatch.setattr(sys, "argv", ["hap_vs_ep.py", *args, "--json", path])
        hap_vs_ep.main()
        return path, json.load(open(path))

    _, full = run("full", *flags)
    no_control, _ = run("no_control", *flags, "--no-control")
    control, only = run("control", *flags, "--control-only")
    in_run = [r for r in full["results"] if r["method"].startswith("ep@hap_steps")]
    assert [r["method"] for r in only["results"]] == ["ep@hap_steps", "ep@hap_steps@target"]
    for a, b in zip(in_run, only["results"]):
        assert a["steps"] == b["steps"] < 16  # HAP's step count, from the schedule alone
        for key in ("edges", "accuracy", "kl", "logit_diff"):
            assert a[key] == pytest.approx(b[key], abs=1e-6), key
    _, combined = run("combined", "--combine", no_control, control)
    pooled, whole = combined["aggregate"]["ioi"], full["aggregate"]["ioi"]
    for key in ("control_kl_ratio", "control_kl_ratio@target", "kl_ratio@target"):
        assert pooled[key] == pytest.approx(whole[key], rel=1e-6), key
    assert "control_kl_ratio" not in json.load(open(no_control))["aggregate"]["ioi"]


def test_hap_vs_ep_bar_is_judged_at_the_target_edge_count(hap_vs_ep):
    """The pooled verdict asks >= 46 % faster and KL within 10 % once both circuits are cut to the
    target's edge count, not at their learned sizes (which differ)."""
    def rows(seed, hap_s, hap_kl_target):
        return [dict(task="ioi", seed=seed, method=m, seconds=s, cpu_seconds=s, kl=kl, accuracy=0.9)
                for m, s, kl in (("edge_pruning", 100.0, 0.05), ("edge_pruning@target", 100.0, 0.10),
                                 ("hap", hap_s, 0.50), ("hap@target", hap_s, hap_kl_target))]
    met = hap_vs_ep.aggregate_over_seeds(rows(0, 50.0, 0.105) + rows(1, 52.0, 0.11))["ioi"]
    assert met["kl_ratio"] == 10.0 and met["bar_met"] and met["bar_met_cpu"]
    slow = hap_vs_ep.aggregate_over_seeds(rows(0, 60.0, 0.05))["ioi"]
    worse = hap_vs_ep.aggregate_over_seeds(rows(0, 50.0, 0.12))["ioi"]
    assert not slow["bar_met"] and not worse["bar_met"]


@pytest.mark.parametrize("method", ["edge_pruning", "hap"])
def test_an_interrupted_run_goes_on_to_the_uninterrupted_circuit(tiny_dir, tmp_path, monkeypatch, method):
    import condense.optimize
    import importlib
    ep_search = importlib.import_module("condense.methods.edge_pruning.search")  # the module, not search()
    keys = dict(method=method, **(dict(hap_candidates=30) if method == "hap" else {}))
    for name in ("whole", "stopped"):
        (tmp_path / name).mkdir()
    whole, whole_dir = run_recipe(tmp_path / "whole", tiny_dir, **keys)
    monkeypatch.setattr(condense.optimize, "SAVE_EVERY", 0.0)
    real, calls = ep_search.run_graph, []

    def failing(*args, **kwargs):
        if kwargs.get("edge_mask") is not None:  # a training step's forward
            calls.append(1)
            if len(calls) == 5:
                raise KeyboardInterrupt
        return real(*args, **kwargs)
    monkeypatch.setattr(ep_search, "run_graph", failing)
    with pytest.raises(KeyboardInterrupt):
        run_recipe(tmp_path / "stopped", tiny_dir, **keys)
    state = tmp_path / "stopped" / "run" / "state" / "training.pt"
    saved = torch.load(state, weights_only=True)
    assert saved["step"] == 4
    monkeypatch.setattr(ep_search, "run_graph", real)
    resumed, out = run_recipe(tmp_path / "stopped", tiny_dir, **keys)
    assert resumed["resumed_at_step"] == 4 and whole["resumed_at_step"] == 0
    # the times count the killed process's four steps too
    assert resumed["resumed_seconds"] == saved["seconds"] > 0 and whole["resumed_seconds"] == 0
    assert resumed["train_seconds"] > saved["seconds"]
    assert not state.exists()
    for key in ("edges", "edges_kept", "sparsity", "kl", "accuracy", "lambda1", "lambda2", "steps"):
        assert resumed[key] == whole[key], key
    assert (out / "circuit.json").read_text() == (whole_dir / "circuit.json").read_text()
    assert (out / "training.jsonl").read_text() == (whole_dir / "training.jsonl").read_text()
