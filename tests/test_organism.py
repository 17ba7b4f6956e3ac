"""The shipped organism shows every behaviour (plain transformers inference), and the
training script runs end to end on a tiny budget."""
import json
import os

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from condense import tasks
from condense.metrics import task_scores
from condense.organism.card import ACCURACY_BAR

from .conftest import ORGANISM


@pytest.mark.parametrize("name", tasks.TASKS)
def test_organism_behaviour(name, organism, organism_tokenizer):
    rows = tasks.load_task(name, organism_tokenizer, "test", n=200, seed=1)
    s = task_scores(organism, rows)
    assert s["clean"]["accuracy"] >= ACCURACY_BAR[name]
    assert s["corrupted"]["logit_diff"] <= 0.5 * s["clean"]["logit_diff"]


def test_organism_loads_with_plain_transformers():
    model = AutoModelForCausalLM.from_pretrained(ORGANISM)
    tok = AutoTokenizer.from_pretrained(ORGANISM)
    assert model.config.model_type == "gpt2"
    size = sum(os.path.getsize(os.path.join(ORGANISM, f)) for f in os.listdir(ORGANISM))
    assert size < 20e6
    card = json.load(open(os.path.join(ORGANISM, "card.json")))
    assert card["parameters"] == sum(p.numel() for p in model.parameters())
    assert len(tok.encode(" Mary")) == 1 and tok.tokenize(" (CPU") == ["Ġ(", "C", "P", "U"]


def test_training_script_smoke(tmp_path):
    from condense.organism.train import main
    out = tmp_path / "org"
    main(["--recipe", "recipes/organism.yaml", "--no-card", "eval_every=3", "eval_rows=8",
          "n_layer=1", "n_embd=32", "n_head=2", f"output_dir={out}",
          "phases=[{steps: 2, rows: {induction: 4}}, {steps: 1, rows: {ioi: 2}, general_rows: 1}]"])
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.n_layer == 1
    log = json.load(open(out / "training.json"))["log"]
    assert log[-1]["step"] == 3 and set(log[-1]["val_accuracy"]) == set(tasks.TASKS)


def test_an_interrupted_training_goes_on_to_the_same_model(tmp_path, monkeypatch, capsys):
    """Killed at its fourth step, the rerun goes on from the third and ends with the weights
    and validation log of an uninterrupted training, bit for bit."""
    from condense.organism import train as T
    recipe = ["--recipe", "recipes/organism.yaml", "--no-card", "eval_every=2", "eval_rows=8",
              "n_layer=1", "n_embd=32", "n_head=2", "threads=1",
              "phases=[{steps: 3, rows: {induction: 4}, general_rows: 1}, "
              "{steps: 2, rows: {ioi: 2, induction: 2}, general_rows: 1}]"]
    T.main(recipe + [f"output_dir={tmp_path / 'whole'}"])
    monkeypatch.setattr(T, "SAVE_EVERY", 0.0)
    real, calls = T.task_loss, []

    def killed(model, batch):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(model, batch)
    monkeypatch.setattr(T, "task_loss", killed)
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        T.main(recipe + [f"output_dir={out}"])
    assert (out / T.STATE_FILE).exists()
    calls.clear()
    monkeypatch.setattr(T, "task_loss", lambda model, batch: calls.append(1) or real(model, batch))
    T.main(recipe + [f"output_dir={out}"])
    assert len(calls) == 4   # phase 2's two steps, two tasks each: phase 1 is not trained again
    assert ": step 3 of 5" in capsys.readouterr().err  # FitState's one line on going on
    assert not (out / "state").exists()
    whole, resumed = (AutoModelForCausalLM.from_pretrained(d) for d in (tmp_path / "whole", out))
    for (name, a), (_, b) in zip(whole.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name
    logs = [json.load(open(d / "training.json"))["log"] for d in (tmp_path / "whole", out)]
    assert [{k: v for k, v in e.items() if k != "time"} for e in logs[1]] == \
        [{k: v for k, v in e.items() if k != "time"} for e in logs[0]]


def test_a_card_interrupted_after_training_does_not_train_again(tmp_path, monkeypatch, capsys):
    """The training's last save stays until the card is written: killed in the card, the rerun
    trains no step and writes the card."""
    from condense.organism import card as organism_card
    from condense.organism import train as T
    recipe = ["--recipe", "recipes/organism.yaml", "eval_every=2", "eval_rows=8", "card_rows=8",
              "n_layer=1", "n_embd=32", "n_head=2", "threads=1", f"output_dir={tmp_path / 'org'}",
              "phases=[{steps: 2, rows: {induction: 2}, general_rows: 1}]"]
    real_card = organism_card.write_card

    def killed(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(organism_card, "write_card", killed)
    with pytest.raises(KeyboardInterrupt):
        T.main(recipe)
    assert (tmp_path / "org" / T.STATE_FILE).exists()
    monkeypatch.setattr(organism_card, "write_card", real_card)
    monkeypatch.setattr(T, "task_loss", lambda *a, **k: pytest.fail("trained again"))
    capsys.readouterr()
    T.main(recipe)
    assert ": step 2 of 2" in capsys.readouterr().err
    assert (tmp_path / "org" / "card.json").exists() and not (tmp_path / "org" / "state").exists()
