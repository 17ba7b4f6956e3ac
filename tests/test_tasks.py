import re

import pytest

from condense import tasks
from condense.tasks import words as W

N = 120


@pytest.fixture(scope="module", params=tasks.TASKS)
def test_rows(request, organism_tokenizer):
    return request.param, tasks.load_task(request.param, organism_tokenizer, "test", n=N)


def test_row_contract(test_rows, organism_tokenizer):
    name, rows = test_rows
    assert len(rows) == N
    for r in rows:
        assert len(r["clean_ids"]) == len(r["corrupted_ids"])
        assert r["answer_id"] != r["distractor_id"]
        assert r["clean_ids"] != r["corrupted_ids"]
        assert organism_tokenizer.decode(r["clean_ids"]) == r["clean_text"]
        assert organism_tokenizer.decode([r["answer_id"]]) == r["answer_text"]
    lengths = {len(r["clean_ids"]) for r in rows}
    assert len(lengths) >= 3, f"{name}: prompts must vary in length, got {lengths}"


def test_deterministic_per_seed(organism_tokenizer):
    for name in tasks.TASKS:
        a = tasks.load_task(name, organism_tokenizer, "val", n=20, seed=3)
        b = tasks.load_task(name, organism_tokenizer, "val", n=20, seed=3)
        c = tasks.load_task(name, organism_tokenizer, "val", n=20, seed=4)
        assert a["clean_text"] == b["clean_text"]
        assert a["clean_text"] != c["clean_text"]


def test_splits_share_no_prompt(organism_tokenizer):
    for name in tasks.TASKS:
        seen = {s: set(tasks.load_task(name, organism_tokenizer, s, n=200)["clean_text"])
                for s in tasks.SPLITS}
        assert not seen["train"] & seen["val"]
        assert not seen["train"] & seen["test"]
        assert not seen["val"] & seen["test"]


def test_ioi_follows_wang_et_al(organism_tokenizer):
    assert len(tasks.IOI_TEMPLATES) >= 15
    assert len(W.NAMES) >= 50 and len(W.PLACES) >= 50 and len(W.OBJECTS) >= 50
    rows = tasks.load_task("ioi", organism_tokenizer, "test", n=300)
    held = [r for r in rows if r["heldout_template"]]
    assert 30 < len(held) < 150
    reserved = range(len(tasks.IOI_TEMPLATES) - tasks.IOI_HELDOUT, len(tasks.IOI_TEMPLATES))
    assert all(r["template"] in reserved for r in held)
    for split in ("train", "val"):
        stream = tasks.iter_samples("ioi", organism_tokenizer, split)
        assert not any(next(stream).template in reserved for _ in range(500))
    orders = set()
    for r in rows:  # IO and S both appear once before S2; the answer is the IO
        io, s = r["answer_text"].strip(), r["distractor_text"].strip()
        clean, corrupted = re.findall(r"\w+", r["clean_text"]), re.findall(r"\w+", r["corrupted_text"])
        assert clean.count(io) == 1 and clean.count(s) == 2
        assert corrupted.count(s) == 1 and corrupted.count(io) == 1  # ABC: S2 is a third name
        orders.add(clean.index(io) < clean.index(s))
    assert orders == {True, False}  # ABBA and BABA


def test_counterfactuals(organism_tokenizer):
    tok = organism_tokenizer
    for r in tasks.load_task("induction", tok, "test", n=50):
        words = r["clean_text"].split()
        assert r["answer_text"].strip() in words  # the answer was seen in the first copy
        assert r["answer_text"].strip() in r["corrupted_text"].split()
    for r in tasks.load_task("greater_than", tok, "test", n=50):
        yy = int(re.search(r"\d\d(\d\d)", r["clean_text"]).group(1))
        assert int(r["answer_text"]) > yy > int(r["distractor_text"])
        assert re.search(r"\d\d01", r["corrupted_text"])
    for r in tasks.load_task("acronym", tok, "test", n=50):
        assert r["clean_text"].endswith(r["clean_text"].split("(")[1])
        assert r["answer_text"].isupper() and len(r["answer_text"]) == 1


def test_unknown_task_lists_valid_names(organism_tokenizer):
    with pytest.raises(ValueError, match="ioi, induction, agreement, docstring, acronym, greater_than"):
        tasks.load_task("ioii", organism_tokenizer)


def test_general_text_is_held_out(organism_tokenizer):
    train = tasks.general_text(organism_tokenizer, "train")
    test = tasks.general_text(organism_tokenizer, "test")
    assert len(train) > 5 * len(test) > 0
    assert all(len(b) == 128 for b in test["input_ids"])
    titles = {t: tasks.general_split_of(t) for t, _ in tasks.general_documents()}
    assert {"train", "val", "test"} == set(titles.values())
