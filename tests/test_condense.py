"""The condensation trainer (docs/design.md §5, §6) end to end on a tiny random GPT-2."""
import json
import os

import pytest
import torch

from condense.methods.condensation import healing, loop
from condense.config import RecipeError

ORGANISM = os.path.join(os.path.dirname(__file__), "..", "checkpoints", "organism")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel
    folder = tmp_path_factory.mktemp("tiny_gpt2")
    tok = AutoTokenizer.from_pretrained(ORGANISM)
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=128, vocab_size=len(tok),
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    GPT2LMHeadModel(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def _recipe(tmp_path, model, **over):
    data = dict(method="condense", model=model, task="ioi", n_train=8, n_val=8, n_test=8,
                ig_steps=1, batch_size=8, heal_steps=3, heal_batch_size=4, heal_lr=1e-3,
                lora_rank=2, lora_alpha=4, n_general=2, max_rounds=3, threads=1,
                gate_accuracy_tol=1.0, gate_empty_fails=False, gate_ppl_ratio=10.0, report_to="none",
                fidelity=False)  # the card has its own tests (test_fidelity.py)
    data.update(over)
    path = tmp_path / "recipe.yaml"
    import yaml
    path.write_text(yaml.safe_dump(data))
    return str(path)


def load_config_for(tmp_path, *overrides):
    from condense.runs import load_config
    return load_config(_recipe(tmp_path, "nowhere"), list(overrides))


def _run(recipe, *overrides):
    from condense.runs import load_config, run
    return run(load_config(recipe, list(overrides)))


def _rounds(out):
    with open(os.path.join(out, "rounds.jsonl")) as f:
        return [json.loads(line) for line in f]


def _edges(out):
    with open(os.path.join(out, "circuit.json")) as f:
        return sorted(k for k, e in json.load(f)["edges"].items() if e["in_graph"])


@pytest.fixture(scope="module")
def full_run(tiny_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("full")
    out = str(tmp / "out")
    metrics = _run(_recipe(tmp, tiny_model, fidelity=True), f"output_dir={out}")
    return out, metrics


def test_run_writes_artifacts(full_run, tiny_model):
    out, metrics = full_run
    for name in ("adapter_config.json", "adapter_model.safetensors", "circuit.json", "recipe.yaml",
                 "metrics.json", "rounds.jsonl", "circuit.png", "rounds.png", "state/state.json"):
        assert os.path.exists(os.path.join(out, name)), name
    rounds = _rounds(out)
    assert [r["round"] for r in rounds] == [1, 2, 3]
    assert all(r["accepted"] for r in rounds)
    assert rounds[0]["edges"] > rounds[-1]["edges"] == metrics["edges"]
    assert all(0 <= r["top1_agreement"] <= 1 for r in rounds)  # the gate's, on val
    for key in ("edges", "accuracy", "logit_diff", "faithfulness", "kl", "top1_agreement",
                "choice_agreement", "ppl_ratio", "wall_seconds"):
        assert key in metrics
    assert not [f for f in os.listdir(out) if f.endswith(".tmp") or f.startswith(".adapter-")]


def test_metrics_split_test_accuracy_by_template(full_run, tiny_model):
    from transformers import AutoTokenizer

    from condense import tasks
    _, metrics = full_run
    flags = list(tasks.load_task("ioi", AutoTokenizer.from_pretrained(tiny_model), "test", n=8,
                                 seed=0)["heldout_template"])
    assert 0 < sum(flags) < len(flags)  # this seed's 8 test rows have both kinds
    held, seen = sum(flags), len(flags) - sum(flags)
    for prefix in ("accuracy_", "accuracy_original_", "top1_agreement_"):
        key = prefix[:-1]
        pooled = (metrics[prefix + "seen_templates"] * seen
                  + metrics[prefix + "heldout_templates"] * held) / len(flags)
        assert pooled == pytest.approx(metrics[key], abs=1e-6)


def test_adapter_reloads_and_reproduces_accuracy(full_run, tiny_model):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from condense import tasks
    from condense.evaluate import evaluate
    from condense.graph import Graph
    out, metrics = full_run
    base = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation="eager")
    model = PeftModel.from_pretrained(base, out).eval()
    circuit = Graph.from_json(os.path.join(out, "circuit.json"), model)
    rows = tasks.load_task("ioi", AutoTokenizer.from_pretrained(tiny_model), "test", n=8, seed=0)
    m = evaluate(model, circuit, rows, batch_size=8)
    assert m["accuracy"] == pytest.approx(metrics["accuracy"], abs=1e-6)
    assert circuit.count_edges(on_path=True) == metrics["edges"]


@pytest.mark.parametrize("heal_dtype", [None, "bfloat16"])
def test_base_weights_unchanged(tiny_model, tmp_path, monkeypatch, heal_dtype):
    """Neither healing nor healing in bfloat16 (the base cast for the heal, then restored)
    changes a base weight by a bit."""
    from transformers import AutoModelForCausalLM
    before = {k: v.clone() for k, v in AutoModelForCausalLM.from_pretrained(tiny_model).state_dict().items()}
    seen = {}
    real = loop.add_adapter

    def spy(model, cfg):
        seen["model"] = model
        return real(model, cfg)
    monkeypatch.setattr(loop, "add_adapter", spy)
    _run(_recipe(tmp_path, tiny_model, max_rounds=1, heal_dtype=heal_dtype),
         f"output_dir={tmp_path / 'out'}")
    after = seen["model"].state_dict()
    for k, v in before.items():
        key = k if k in after else next(a for a in after if a.endswith(k.replace(".weight", ".base_layer.weight").replace(".bias", ".base_layer.bias")))
        assert torch.equal(after[key], v), k


def test_rejected_cut_halves_and_rolls_back(tiny_model, tmp_path):
    out = str(tmp_path / "out")
    metrics = _run(_recipe(tmp_path, tiny_model, gate_ppl_ratio=1e-6, max_rounds=10), f"output_dir={out}")
    rounds = _rounds(out)
    assert [r["cut"] for r in rounds] == [0.3, 0.15, 0.075, 0.05]
    assert not any(r["accepted"] for r in rounds)
    assert metrics["edges"] == metrics["total_edges"]  # nothing accepted: the full graph
    assert metrics["ppl_ratio"] == pytest.approx(1.0, abs=1e-5)  # adapter rolled back to init (B = 0)


def test_nan_in_heal_rejects_round(tiny_model, tmp_path, monkeypatch):
    real = healing.heal_loss
    calls = {"n": 0}

    def nan_once(*a, **k):
        calls["n"] += 1
        loss = real(*a, **k)
        return loss * float("nan") if calls["n"] == 2 else loss
    monkeypatch.setattr(healing, "heal_loss", nan_once)
    out = str(tmp_path / "out")
    _run(_recipe(tmp_path, tiny_model, max_rounds=2), f"output_dir={out}")
    rounds = _rounds(out)
    assert not rounds[0]["accepted"] and "diverged" in rounds[0]["note"]
    assert rounds[1]["cut"] == 0.15 and rounds[1]["accepted"]


def test_faithfulness_gate_decides_rounds(tiny_model, tmp_path):
    # accuracy and perplexity gates are lax here, so f >= gate_faithfulness alone decides
    out = str(tmp_path / "out")
    _run(_recipe(tmp_path, tiny_model, max_rounds=4, gate_faithfulness=0.97), "heal=false",
         f"output_dir={out}")
    gated = [r for r in _rounds(out) if not r["note"]]
    assert {r["accepted"] for r in gated} == {True, False}  # this seed: both outcomes
    assert all(r["accepted"] == (r["faithfulness"] >= 0.97) for r in gated)


def test_top1_gate_decides_rounds(tmp_path):
    # the trained organism (a random model's top token never moves); lax accuracy and
    # perplexity gates, so top-1 agreement >= gate_top1_agreement alone decides
    out = str(tmp_path / "out")
    _run(_recipe(tmp_path, ORGANISM, max_rounds=8, gate_top1_agreement=0.95, n_val=16,
                 prune_fraction=0.5), "heal=false", f"output_dir={out}")
    gated = [r for r in _rounds(out) if not r["note"]]
    assert {r["accepted"] for r in gated} == {True, False}  # this seed: both outcomes
    assert all(r["accepted"] == (r["top1_agreement"] >= 0.95) for r in gated)


def test_unknown_key_fails_before_model_load(tmp_path, monkeypatch):
    import condense.runs as runs

    def boom(*a, **k):
        raise AssertionError("model loaded")
    monkeypatch.setattr(runs, "load_model", boom)
    with pytest.raises(RecipeError, match="heal_stepz"):
        _run(_recipe(tmp_path, "nowhere", heal_stepz=3))
    with pytest.raises(RecipeError, match="heal_steps"):
        _run(_recipe(tmp_path, "nowhere"), "heal_steps=abc")
    # out-of-range values fail in the method's check, still before any model loads
    for override, key in (("init_circuit=nope.json", "init_circuit"),
                          ("heal_stop_loss=-1", "heal_stop_loss"),
                          ("heal_general_batch=0", "heal_general_batch"),
                          ("gate_faithfulness=1.5", "gate_faithfulness"),
                          ("gate_top1_agreement=-0.1", "gate_top1_agreement"),
                          ("min_prune_fraction=0.5", "min_prune_fraction")):
        with pytest.raises(RecipeError, match=key):
            _run(_recipe(tmp_path, "nowhere"), override, f"output_dir={tmp_path / 'o'}")
    for override, key in (("s3_epochs=0", "s3_epochs"), ("s3_baselines=[nope]", "s3_baselines")):
        with pytest.raises(RecipeError, match=key):
            load_config_for(tmp_path, "method=s3martcirc", override)
    # a key of another method is named as such
    with pytest.raises(RecipeError, match="belongs to method"):
        _run(_recipe(tmp_path, "nowhere"), "ep_steps=3")


def test_recipes_parse():
    from condense.runs import load_config
    folder = os.path.join(os.path.dirname(__file__), "..", "recipes", "condense")
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        with open(path) as f:
            first = f.readline()
        assert first.startswith("# condense run --recipe recipes/condense/" + name)
        assert load_config(path).method == "condense"


def test_controls_c0_and_heal_only(tiny_model, tmp_path):
    out0 = str(tmp_path / "c0")
    m0 = _run(_recipe(tmp_path, tiny_model, max_rounds=2), "heal=false", f"output_dir={out0}")
    assert m0["heal"] is False and m0["edges"] < m0["total_edges"]
    assert m0["ppl_ratio"] == pytest.approx(1.0, abs=1e-5)  # no heal: the adapter stays the identity
    out1 = str(tmp_path / "heal_only")
    m1 = _run(_recipe(tmp_path, tiny_model, faithfulness_threshold=0.5), "prune=false",
              f"output_dir={out1}")
    rounds = _rounds(out1)
    assert len(rounds) == 1 and rounds[0]["cut"] == 0.0
    assert rounds[0]["edges"] == m1["total_edges"]
    assert "faithful_on_val" in m1 and m1["edges"] <= m1["total_edges"]


def test_two_processes_give_the_same_circuit(tmp_path):
    """Data parallel (docs/design.md §5): the same recipe on two CPU processes
    (ranking rows and heal batches split, gradients averaged) ends with the circuit, rounds
    and (up to float summation order) adapter of the one-process run. On the organism, whose
    heal losses are far from zero, unlike a random tiny model's."""
    import socket
    import subprocess
    import sys

    from safetensors.torch import load_file
    recipe = _recipe(tmp_path, ORGANISM, n_train=16, n_val=16, n_test=16, heal_steps=4,
                     batch_size=8, gate_accuracy_tol=0.05, gate_ppl_ratio=1.05, max_rounds=4)
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    _run(recipe, f"output_dir={one}")
    with socket.socket() as s:  # a free port for the process group
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = os.path.join(os.path.dirname(__file__), "..")
    env = dict(os.environ, ACCELERATE_USE_CPU="1", HF_HUB_OFFLINE="1", WANDB_MODE="disabled",
               OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
           "2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(port), os.path.join(root, "condense", "train.py"),
           "--recipe", recipe, f"output_dir={two}"]
    proc = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("[condense] wrote") == 1  # only the main process writes
    r1, r2 = _rounds(one), _rounds(two)
    assert [(r["edges"], r["accepted"]) for r in r2] == [(r["edges"], r["accepted"]) for r in r1]
    assert any(r["accepted"] for r in r1) and any(r["edges"] < 479 for r in r1)
    assert _edges(two) == _edges(one)
    for x, y in zip(r1, r2):  # same batches, same updates
        assert y["heal_loss"] == pytest.approx(x["heal_loss"], rel=1e-2, abs=1e-8)
        assert y["accuracy"] == pytest.approx(x["accuracy"], abs=1e-9)
    a = load_file(os.path.join(one, "adapter_model.safetensors"))
    b = load_file(os.path.join(two, "adapter_model.safetensors"))
    assert a.keys() == b.keys()
    diff = max(float((b[k] - a[k]).abs().max()) for k in a)
    size = max(float(a[k].abs().max()) for k in a)
    print(f"adapter max |diff| {diff:.3g}, max |weight| {size:.3g}")
    assert diff <= 0.05 * size  # Adam: near-zero gradient entries step +-lr on float noise


def test_bf16_model_with_fp32_adapter(tiny_model, tmp_path):
    """The GPT-2 recipe's setting: a bf16 base with peft's fp32 LoRA weights runs the whole
    loop (rank, heal, gate) and the final metrics are finite."""
    out = str(tmp_path / "bf16")
    metrics = _run(_recipe(tmp_path, tiny_model, max_rounds=1), "dtype=bfloat16",
                   f"output_dir={out}")
    assert metrics["edges"] > 0
    for key in ("accuracy", "kl", "ppl_ratio", "logit_diff"):
        assert metrics[key] == metrics[key], key  # not NaN


def test_heal_dtype_computes_the_heal_in_bf16_and_keeps_the_adapter_fp32(tiny_model, tmp_path, monkeypatch):
    """heal_dtype=bfloat16: inside the heal the base computes in bf16 (the loss sees a bf16
    embedding), its first loss is the float32 heal's up to bf16 rounding, the LoRA weights
    stay float32 and train, and afterwards every base weight is float32 again."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from condense import tasks
    from condense.graph import Graph
    from .tiny import randomize_weights
    # weights of unit gain: at GPT-2's init scale the outputs are near uniform and the first
    # loss is ~1e-6, where bf16 rounding alone moves it by more than the tolerance
    model = randomize_weights(AutoModelForCausalLM.from_pretrained(tiny_model), seed=0)
    tok = AutoTokenizer.from_pretrained(tiny_model)
    rows = tasks.load_task("ioi", tok, "train", n=8, seed=0)
    target = healing.last_logprobs(model, rows, 8)
    circuit = Graph.from_model(model)
    circuit.in_graph[:] = torch.rand(circuit.in_graph.shape, generator=torch.Generator().manual_seed(1)) < 0.5
    first, dtypes = {}, {}
    for heal_dtype in (None, "bfloat16"):
        cfg = load_config_for(tmp_path, f"heal_dtype={heal_dtype or 'null'}", "heal_steps=4",
                              "heal_general_weight=0")
        peft_model = healing.add_adapter(model, cfg)
        lora = {k: v.clone() for k, v in healing.adapter_state(peft_model).items()}
        seen = []

        def spy(m, *args, real=healing.heal_loss):
            seen.append(m.get_input_embeddings().weight.dtype)
            return real(m, *args)
        monkeypatch.setattr(healing, "heal_loss", spy)
        losses = healing.heal(peft_model, circuit, rows, target, cfg, 1, progress=False)
        monkeypatch.undo()
        first[heal_dtype], dtypes[heal_dtype] = losses[0], set(seen)
        after = healing.adapter_state(peft_model)
        assert all(v.dtype == torch.float32 for v in after.values())
        assert any(not torch.equal(after[k], lora[k]) for k in lora)  # the adapter trained
        assert {p.dtype for p in peft_model.parameters()} == {torch.float32}
        model = peft_model.unload()  # the bare base again, for the next setting
    assert dtypes == {None: {torch.float32}, "bfloat16": {torch.bfloat16}}
    assert first[None] > 1e-3  # a loss bf16 rounding cannot swamp (at init scale ~1e-6)
    assert first["bfloat16"] == pytest.approx(first[None], rel=0.05)
    assert first["bfloat16"] != first[None]  # it did compute in bf16


def test_heal_dtype_is_checked(tmp_path):
    with pytest.raises(RecipeError, match="heal_dtype.*float32"):
        load_config_for(tmp_path, "heal_dtype=float8")


def test_init_circuit_and_rejected_candidates_are_not_reheal(tiny_model, tmp_path):
    """init_circuit starts round 1 from a given circuit; a candidate equal to one already
    rejected since the last acceptance, or with no input -> logits path, is rejected without
    a heal (note 'skipped'), so the run ends quickly with the starting circuit."""
    from transformers import AutoModelForCausalLM

    from condense.graph import Graph
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    start = Graph.from_model(model)
    start.reset(in_graph=False)
    for name in ("input->m0", "m0->logits", "input->logits"):
        start.edges[name].in_graph = True
    path = str(tmp_path / "start.json")
    start.to_json(path)
    out = str(tmp_path / "out")
    # an impossible gate: every healed candidate is rejected
    metrics = _run(_recipe(tmp_path, tiny_model, max_rounds=10, gate_accuracy_tol=-1.0),
                   f"init_circuit={path}", f"output_dir={out}")
    rounds = _rounds(out)
    assert rounds[0]["note"] == "" and not rounds[0]["accepted"]
    assert len(rounds) == 4  # cuts 0.3, 0.15, 0.075, 0.05: the last is the floor
    assert all(r["note"].startswith("skipped: the same edges") for r in rounds[1:])
    assert all(r["edges"] == rounds[0]["edges"] for r in rounds)
    assert metrics["edges"] == 3 and _edges(out) == ["input->logits", "input->m0", "m0->logits"]


def test_shortcuts_heal_if_needed_early_rank_method_and_rank_rows(tiny_model, tmp_path, monkeypatch):
    """heal_if_needed heals only candidates the gate rejects unhealed; early_rank_method ranks
    while the circuit is larger than early_rank_edges; rank_rows limits the ranking rows."""
    seen = []
    real = loop.attribute

    def spy(model, graph, rows, method, **kw):
        seen.append((graph.count_edges(on_path=True), method, len(rows)))
        return real(model, graph, rows, method, **kw)
    monkeypatch.setattr(loop, "attribute", spy)
    healed = []
    real_heal = loop.heal
    monkeypatch.setattr(loop, "heal", lambda *a, **k: healed.append(1) or real_heal(*a, **k))
    out = str(tmp_path / "lax")  # every candidate passes unhealed: nothing is healed
    _run(_recipe(tmp_path, tiny_model, max_rounds=3, heal_if_needed=True, rank_rows=4,
                 early_rank_method="eap", early_rank_edges=30), f"output_dir={out}")
    rounds = _rounds(out)
    assert all(r["accepted"] and r["note"] == "accepted before healing" for r in rounds)
    assert healed == [] and all(r["heal_loss"] is None for r in rounds)
    assert all(n == 4 for _, _, n in seen)
    assert [m for _, m, _ in seen] == ["eap" if e > 30 else "eap_ig_inputs" for e, _, _ in seen]
    assert {"eap", "eap_ig_inputs"} == {m for _, m, _ in seen}
    seen.clear()
    out = str(tmp_path / "strict")  # the unhealed candidate fails the faithfulness gate: heal
    _run(_recipe(tmp_path, tiny_model, max_rounds=2, heal_if_needed=True, gate_faithfulness=0.999),
         f"output_dir={out}")
    rounds = _rounds(out)
    assert healed and any(r["note"].startswith("healed") and r["heal_loss"] is not None for r in rounds)


def test_init_circuit_is_checked_before_the_model_loads(tiny_model, full_run, tmp_path, monkeypatch):
    """A folder, an empty circuit, a circuit without cfg or for another model, and a string
    in_graph are refused in one line before any model loads or anything is written."""
    import condense.runs as runs
    monkeypatch.setattr(runs, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    with open(os.path.join(full_run[0], "circuit.json")) as f:
        good = json.load(f)

    def circuit(name, change):
        d = json.loads(json.dumps(good))
        change(d)
        path = tmp_path / name
        path.write_text(json.dumps(d))
        return str(path)

    def off(d):
        for e in d["edges"].values():
            e["in_graph"] = False

    def other_model(d):
        key = next(k for k, v in d["cfg"].items() if isinstance(v, int) and not isinstance(v, bool))
        d["cfg"][key] += 1

    def string_in_graph(d):
        next(iter(d["edges"].values()))["in_graph"] = "false"
    cases = {str(tmp_path): "folder",
             circuit("empty.json", off): "no edge",
             circuit("nocfg.json", lambda d: d.pop("cfg")): "no cfg",
             circuit("other.json", other_model): "another model",
             circuit("string.json", string_in_graph): "in_graph must be true or false"}
    out = tmp_path / "out"
    for path, words in cases.items():
        with pytest.raises(RecipeError, match=words):
            _run(_recipe(tmp_path, tiny_model), f"init_circuit={path}", f"output_dir={out}")
        assert not out.exists()


def test_verify_refuses_a_run_without_its_adapter(full_run, tmp_path):
    """Half an adapter, or none in a condensation run, is refused (the circuit would be scored
    on the base model)."""
    import shutil

    from condense.runs import read_run
    assert read_run(full_run[0]).adapter
    for gone in (["adapter_model.safetensors"], ["adapter_config.json"],
                 ["adapter_model.safetensors", "adapter_config.json"]):
        out = str(tmp_path / "_".join(gone))
        shutil.copytree(full_run[0], out)
        for name in gone:
            os.unlink(os.path.join(out, name))
        with pytest.raises(RecipeError, match="adapter"):
            read_run(out, "verify")


def test_grid_means_weigh_each_task_once(condense_grid):
    """The grid's pooled geometric mean counts every task-seed row; with three seeds of one
    task and one of another it also gives the mean with each task weighed once."""
    grid = condense_grid
    rows = [dict(task="a", seed=s, eap_ig_over_c1=100.0, eap_ig_over_c0=1.0) for s in range(3)]
    rows.append(dict(task="b", seed=0, eap_ig_over_c1=1.0, eap_ig_over_c0=4.0))
    summary = grid.summarize(rows)
    assert abs(summary["eap_ig_over_c1"] - 100 ** 0.75) < 1e-9  # three rows of 100, one of 1
    assert abs(summary["tasks_weighted_equally"]["eap_ig_over_c1"] - 10.0) < 1e-9
    assert abs(summary["tasks_weighted_equally"]["eap_ig_over_c0"] - 2.0) < 1e-9
    assert "Each task weighed once" in grid.markdown(rows, summary)
    assert "Each task weighed once" not in grid.markdown(rows[:3], grid.summarize(rows[:3]))
    # every row has the header's cells, choice agreement given or not (older runs lack it)
    rows[0].update(top1_agreement=0.875, choice_agreement=0.98)
    table = [ln for ln in grid.markdown(rows, summary).splitlines() if ln.startswith("|")]
    assert len({ln.count("|") for ln in table}) == 1 and "| 0.875 | 0.980 |" in table[2]


def test_grid_combine_refuses_a_file_it_did_not_write(condense_grid, tmp_path, capsys):
    """--combine names a foreign file and what it should hold, and exits 2 like the other
    pooling benchmarks (argparse's usage error), not with a traceback."""
    for text in ('{"runs": {}}', "not json"):
        path = tmp_path / "other.json"
        path.write_text(text)
        with pytest.raises(SystemExit) as e:
            condense_grid.main(["--combine", str(path)])
        err = capsys.readouterr().err
        assert e.value.code == 2 and f"--combine {path}" in err and "'rows' list" in err, err


def test_grid_plot_draws_every_row(condense_grid, tmp_path):
    """The grid picture takes rows with missing variants (a C1-only grid) and writes a PNG."""
    rows = [dict(task="ioi", seed=0, eap_ig_edges=7451, c1_edges=13, c0_edges=9601,
                 heal_only_edges=13542, eap_ig_over_c1=573.2),
            dict(task="ioi", seed=1, eap_ig_edges=7451, c1_edges=11, c0_edges=None,
                 heal_only_edges=None, eap_ig_over_c1=677.4),
            dict(task="agreement", seed=0, eap_ig_edges=None, c1_edges=4),
            dict(task="ioi", seed=2, eap_ig_edges=7451, c1_edges=13, eap_ig_over_c1=573.2)]
    path = condense_grid.plot(rows, str(tmp_path / "grid.png"))
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    grid_json = tmp_path / "grid.json"
    grid_json.write_text(json.dumps({"rows": rows}))
    with pytest.raises(SystemExit):  # a folder that does not exist fails before any run
        condense_grid.main(["--combine", str(grid_json), "--plot", str(tmp_path / "no" / "grid.png")])
