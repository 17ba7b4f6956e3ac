"""An interrupted `condense verify` goes on where it stopped: the subset evaluation keeps its
running sums in the run folder (condense.verify.resume), and a resumed evaluation must end with
the very numbers of an uninterrupted one while skipping the passes already done."""
import json

import pytest
import torch

import condense.verify.resume as resume
from condense.verify.local import local_masks
from condense.verify.resume import STATE_FILE, SubsetSums
from condense.verify.run import main
from condense.verify.subsets import SubsetEvaluator

from .test_verify import MIXED_CIRCUIT, circuit, random_model, random_rows, saved_tiny_gpt2, write_run


def evaluator(model, rows):
    # small passes and batches: many (batch, chunk) units to stop between
    return SubsetEvaluator(model, circuit(model, MIXED_CIRCUIT), rows, batch_size=2,
                           max_subsets_per_pass=5)


class Stop(Exception):
    pass


def stop_after(calls):
    seen = []

    def progress(done, total):
        seen.append((done, total))
        if len(seen) == calls:
            raise Stop
    return progress, seen


def test_an_interrupted_evaluation_ends_with_the_uninterrupted_numbers(tmp_path):
    model, rows = random_model("gpt2", lora=True), random_rows(n=6)
    ev = evaluator(model, rows)
    masks = local_masks(ev.n_edges, True, None)
    ld, accuracy = ev.mean_logit_diffs(masks, with_accuracy=True)
    path = str(tmp_path / STATE_FILE)
    progress, _ = stop_after(4)
    with pytest.raises(Stop):
        evaluator(model, rows).mean_logit_diffs(masks, progress=progress, with_accuracy=True,
                                                sums=SubsetSums(path, "run", every=0))
    assert torch.load(path, weights_only=True)["units"] == 4
    again = evaluator(model, rows)
    progress, seen = stop_after(-1)
    ld2, accuracy2 = again.mean_logit_diffs(masks, progress=progress, with_accuracy=True,
                                            sums=SubsetSums(path, "run", every=0))
    assert torch.equal(ld2, ld) and torch.equal(accuracy2, accuracy)
    total = len(masks) * ev.n_rows
    assert 0 < again.resumed < total
    assert seen[-1] == (total - again.resumed, total - again.resumed)  # only the new work
    units = sum(-(-len(masks) // again._subsets_per_pass(b)) for b in (2, 2, 2))
    assert len(seen) == units - 4  # the four passes done before were skipped


def test_sums_of_another_evaluation_are_not_reused(tmp_path):
    model, rows = random_model("gpt2", lora=True), random_rows(n=6)
    masks = local_masks(evaluator(model, rows).n_edges, True, None)
    path = str(tmp_path / STATE_FILE)
    progress, _ = stop_after(3)
    with pytest.raises(Stop):
        evaluator(model, rows).mean_logit_diffs(masks, progress=progress,
                                                sums=SubsetSums(path, "run", every=0))
    reference = evaluator(model, rows).mean_logit_diffs(masks)
    for key, subsets in (("another run", masks), ("run", masks[:-1])):  # other key; other subsets
        ev = evaluator(model, rows)
        ld = ev.mean_logit_diffs(subsets, sums=SubsetSums(path, key, every=0))
        assert ev.resumed == 0
        assert torch.allclose(ld, reference[:len(subsets)], atol=1e-5)

def test_cli_resumes_an_interrupted_verify(tmp_path, organism_tokenizer, monkeypatch, capsys):
    base, model_dir = saved_tiny_gpt2(tmp_path, organism_tokenizer)
    names = ["input->a0.h0<v>", "a0.h0->a1.h1<k>", "a1.h1->logits", "input->logits"]
    runs = {}
    for name in ("whole", "stopped"):
        runs[name] = tmp_path / name
        write_run(runs[name], model_dir, circuit(base, names))
    args = ["--n", "8", "--batch-size", "2", "--local", "--no-reduce"]
    assert main([str(runs["whole"]), *args]) == 0

    monkeypatch.setattr(resume, "SAVE_EVERY", 0.0)
    passes = []
    real = SubsetEvaluator._sparse_pass

    def failing(self, batch, masks):
        passes.append(1)
        if len(passes) == 3:
            raise Stop
        return real(self, batch, masks)
    monkeypatch.setattr(SubsetEvaluator, "_sparse_pass", failing)
    with pytest.raises(Stop):
        main([str(runs["stopped"]), *args])
    assert (runs["stopped"] / STATE_FILE).exists() and not (runs["stopped"] / "verify.json").exists()

    monkeypatch.setattr(SubsetEvaluator, "_sparse_pass", real)
    assert main([str(runs["stopped"]), *args]) == 0
    assert "going on from" in capsys.readouterr().err
    assert not (runs["stopped"] / STATE_FILE).exists()
    whole, stopped = (json.loads((runs[k] / "verify.json").read_text()) for k in ("whole", "stopped"))
    assert whole["resumed_subset_prompts"] == 0 < stopped["resumed_subset_prompts"]
    for field in ("faithfulness_without_edge", "accuracy_without_edge", "removable_edges",
                  "pairs", "irreducible", "circuit_faithful"):
        assert stopped[field] == whole[field], field
