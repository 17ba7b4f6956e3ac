"""Model cards: `condense.card` for any model and the organism's wrapper around it."""
import json
import os
import shutil

import pytest
import torch

from condense import card as C
from condense import tasks
from condense.organism import card as organism_card
from condense.metrics import task_scores

from .conftest import ORGANISM


def _independent_drop(model, rows, means_rows, layer, head):
    """Mean-ablation LD drop of one head, computed without condense.card: head means from
    one unpadded forward per prompt, then one unpadded forward per prompt with the head's
    slice of c_proj's input replaced by that mean."""
    block = model.transformer.h[layer]
    n_head = model.config.n_head
    zs = []

    def grab(mod, args):
        zs.append(args[0][0].reshape(args[0].shape[1], n_head, -1)[:, head])
    hk = block.attn.c_proj.register_forward_pre_hook(grab)
    with torch.no_grad():
        for ids in means_rows["clean_ids"]:
            model(input_ids=torch.tensor([ids]))
    hk.remove()
    mean = torch.cat(zs).mean(0)

    def ablate(mod, args):
        z = args[0].clone()
        d = z.shape[-1] // n_head
        z[..., head * d:(head + 1) * d] = mean
        return (z,)

    def ld(r):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([r["clean_ids"]])).logits[0, -1]
        return (logits[r["answer_id"]] - logits[r["distractor_id"]]).item()
    clean = [ld(r) for r in rows]
    hk = block.attn.c_proj.register_forward_pre_hook(ablate)
    try:
        ablated = [ld(r) for r in rows]
    finally:
        hk.remove()
    return sum(clean) / len(clean) - sum(ablated) / len(ablated)


def test_card_on_organism_matches_independent_numbers(tmp_path, organism, organism_tokenizer):
    # a copy of the organism under another name: the card goes into the model folder
    folder = tmp_path / "some-gpt2"
    shutil.copytree(ORGANISM, folder)
    for f in ("README.md", "card.json", "ioi_head_ablation.png"):
        os.remove(folder / f)
    C.main([str(folder), "--n", "40", "--ablation-rows", "16"])
    for f in ("README.md", "card.json", "ioi_head_ablation.png"):
        assert (folder / f).stat().st_size > 0
    card = json.load(open(folder / "card.json"))
    readme = open(folder / "README.md").read()
    assert "organism" not in readme.replace(str(folder), "MODEL").lower()
    assert f"python -m condense.card {folder} --n 40 --out {folder} --ablation-rows 16" in readme
    assert card["rows"] == 40 and card["ablation_rows"] == 16
    assert card["model"]["layers"] == 4 and card["greater_than_form"] == "number"

    rows = tasks.load_task("induction", organism_tokenizer, "test", n=40)
    s = task_scores(organism, rows)
    assert card["tasks"]["induction"]["accuracy_clean"] == round(s["clean"]["accuracy"], 4)
    assert card["tasks"]["induction"]["logit_diff_corrupted"] == pytest.approx(
        s["corrupted"]["logit_diff"], abs=1e-3)

    ioi = tasks.load_task("ioi", organism_tokenizer, "test", n=40)
    drop = card["ioi_head_ablation"]["drop"]
    assert len(drop) == 4 and len(drop[0]) == 4
    top = max(((l, h) for l in range(4) for h in range(4)), key=lambda c: drop[c[0]][c[1]])
    for layer, head in (top, (0, 1)):
        want = _independent_drop(organism, ioi.select(range(16)), ioi, layer, head)
        assert drop[layer][head] == pytest.approx(want, abs=2e-3), (layer, head)
    assert drop[top[0]][top[1]] > 1.0  # some head matters for IOI


def test_card_needs_out_for_a_named_model(capsys):
    with pytest.raises(SystemExit):
        C.main(["smollm2-135m", "--n", "5"])
    assert "--out is required" in capsys.readouterr().err


def test_organism_card_wrapper(tmp_path):
    out = tmp_path / "report"
    card = organism_card.write_card(ORGANISM, n=30, out=str(out))
    shipped = json.load(open(os.path.join(ORGANISM, "card.json")))
    assert set(card) == set(shipped) and set(card["tasks"]["ioi"]) == set(shipped["tasks"]["ioi"])
    assert card["training"] == shipped["training"]  # from training.json
    readme = open(out / "README.md").read()
    assert readme.startswith("# condense organism")
    assert "python -m condense.organism.card" in readme and "steps" in readme
    assert (out / "ioi_head_ablation.png").stat().st_size > 0


def test_resumed_ablation_is_exact_on_llama():
    """Forwards resumed at the ablated layer equal full forwards (GQA, rotary, RMSNorm)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from .tiny import randomize_weights
    torch.manual_seed(0)
    model = randomize_weights(LlamaForCausalLM(LlamaConfig(
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, attn_implementation="eager")), scale=2.0)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 50, (int(n),), generator=g).tolist() for n in (5, 7, 7, 9, 12)]
    rows = dict(clean_ids=seqs, answer_id=[1, 2, 3, 4, 5], distractor_id=[6, 7, 8, 9, 10])
    means = C.head_means(model, seqs)
    base_r, fast = C.head_ablation_drops(model, rows, means, batch_size=3, resume=True)
    base_f, slow = C.head_ablation_drops(model, rows, means, batch_size=3, resume=False)
    assert torch.equal(base_r, base_f)
    assert (fast - slow).abs().max() < 1e-5
    assert (fast - base_r).abs().max() > 0.1  # the ablations do something


def test_an_interrupted_card_goes_on_where_it_stopped(tmp_path, monkeypatch):
    """Killed half way through its head ablation, the rerun measures no task again and ablates
    only the layers left, and writes the card an uninterrupted run writes."""
    args = ["--n", "40", "--ablation-rows", "16", "--threads", "1"]
    C.main([ORGANISM, "--out", str(tmp_path / "whole")] + args)
    monkeypatch.setattr(C, "SAVE_EVERY", 0.0)  # the organism's card takes seconds: save at each step
    out = tmp_path / "card"   # a model folder, the card's default place: its files change meanwhile
    shutil.copytree(ORGANISM, out)
    for f in ("README.md", "card.json", "ioi_head_ablation.png"):
        os.remove(out / f)
    real = C.head_means_ablated
    layers = []

    def ablated(model, means, heads):
        layers.append(heads[0][0])
        if heads == [(2, 0)] and stop:
            raise KeyboardInterrupt
        return real(model, means, heads)
    monkeypatch.setattr(C, "head_means_ablated", ablated)
    stop = True
    with pytest.raises(KeyboardInterrupt):
        C.main([str(out)] + args)
    assert (out / C.STATE_FILE).exists() and not (out / "card.json").exists()
    stop, layers[:] = False, []
    monkeypatch.setattr(C, "task_scores", lambda *a, **k: pytest.fail("a task measured again"))
    monkeypatch.setattr(C, "perplexity", lambda *a, **k: pytest.fail("perplexity measured again"))
    C.main([str(out)] + args)
    assert sorted(set(layers)) == [2, 3]   # the check of resumed forwards uses the last layer
    assert not (out / C.STATE_FILE).exists()
    got, want = (json.load(open(d / "card.json")) for d in (out, tmp_path / "whole"))
    for key in ("tasks", "ppl_test", "ppl_val", "ioi_head_ablation", "parameters"):
        assert got[key] == want[key], key
    assert got["resumed_seconds"] > 0 and want["resumed_seconds"] == 0


def test_the_organisms_card_goes_on_too(tmp_path, monkeypatch):
    """The organism's own card keeps what it measures the same way: killed in its head
    ablation, the rerun measures no task again."""
    out = tmp_path / "report"
    monkeypatch.setattr(C, "SAVE_EVERY", 0.0)
    real = C.head_means_ablated

    def killed(model, means, heads):
        if heads == [(2, 0)]:
            raise KeyboardInterrupt
        return real(model, means, heads)
    monkeypatch.setattr(C, "head_means_ablated", killed)
    with pytest.raises(KeyboardInterrupt):
        organism_card.write_card(ORGANISM, n=20, out=str(out))
    assert (out / C.STATE_FILE).exists()
    monkeypatch.setattr(C, "head_means_ablated", real)
    monkeypatch.setattr(C, "task_scores", lambda *a, **k: pytest.fail("a task measured again"))
    card = organism_card.write_card(ORGANISM, n=20, out=str(out))
    assert len(card["ioi_head_ablation"]["drop"]) == 4 and not (out / C.STATE_FILE).exists()
