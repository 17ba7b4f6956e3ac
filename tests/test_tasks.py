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


# ---------------------------------------------------------------- organism rows are pinned
def _rows_hash(rows):
    import hashlib
    import json
    return hashlib.sha256(json.dumps(rows.to_list(), sort_keys=True).encode()).hexdigest()[:16]


# sha256 of the first 40 rows (seed 0) of each split, train / val / test, on the organism's
# tokenizer: the organism was trained and measured on exactly these prompts.
ORGANISM_ROWS = dict(
    ioi=("5536c6fdbf5cec2d", "393ff63e00c13ab0", "0b067eb14bff5f5a"),
    induction=("b6bb98ee8b65b096", "df1c73972ce2279f", "da4103488fd31664"),
    agreement=("ac84567f1ec656e5", "fd63267867e58759", "cdf993ce220f87f7"),
    docstring=("4110486d4bf8f2bf", "ba782bb02923fc05", "fa2b72ae5ea365ae"),
    acronym=("f38080f9d67d3cfb", "1b48a34861651c48", "a68707ab22a4da4c"),
    greater_than=("3368a3e6ee11a2e3", "85744772db2743ab", "ec579be28addaa8c"))


def test_organism_rows_are_pinned(organism_tokenizer):
    for name, hashes in ORGANISM_ROWS.items():
        got = tuple(_rows_hash(tasks.load_task(name, organism_tokenizer, split, n=40, seed=0))
                    for split in tasks.SPLITS)
        assert got == hashes, f"{name}: the organism's rows changed"
    first = tasks.load_task("greater_than", organism_tokenizer, "test", n=2)[1]
    assert (first["clean_text"], first["corrupted_text"], first["answer_text"],
            first["distractor_text"]) == ("The campaign began in 1705 and ended in 17",
                                          "The campaign began in 1701 and ended in 17", "42", "02")
    # the organism's tokenizer was trained on the untokenized stream (tokenizer=None)
    s = next(tasks.iter_samples("greater_than", None, "train"))
    assert s.train_text == "The project lasted from the year 1713 to 1792"
    assert tasks.words.gt_form(organism_tokenizer) == tasks.words.gt_form(None) == "number"


# ---------------------------------------------------------------- SmolLM2 (digit tokenizer)
@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from condense.models import MissingModelError, load_tokenizer
    try:
        return load_tokenizer("smollm2-135m")
    except MissingModelError as e:
        pytest.skip(f"SmolLM2 is not installed: {e}")


def _encode(tok, text):
    return tok.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("name", tasks.TASKS)
def test_row_contract_on_smollm2(name, smollm2_tokenizer):
    tok = smollm2_tokenizer
    rows = tasks.load_task(name, tok, "test", n=100)
    assert len(rows) == 100 and len(set(rows["clean_text"])) == 100
    for r in rows:
        assert r["clean_ids"] == _encode(tok, r["clean_text"])
        assert r["corrupted_ids"] == _encode(tok, r["corrupted_text"])
        assert len(r["clean_ids"]) == len(r["corrupted_ids"])
        assert r["clean_ids"] != r["corrupted_ids"]
        assert _encode(tok, r["answer_text"]) == [r["answer_id"]]
        assert _encode(tok, r["distractor_text"]) == [r["distractor_id"]]
        assert r["answer_id"] != r["distractor_id"]
        assert _encode(tok, r["clean_text"] + r["answer_text"]) == r["clean_ids"] + [r["answer_id"]]


def test_split_sizes_on_smollm2(smollm2_tokenizer):
    for name in tasks.TASKS:
        for split, n in (("test", 500), ("val", 500), ("train", 1000)):
            rows = tasks.load_task(name, smollm2_tokenizer, split, n=n)
            assert len(set(rows["clean_text"])) == n, (name, split)


def test_greater_than_digit_form(smollm2_tokenizer):
    tok = smollm2_tokenizer
    assert tasks.words.gt_form(tok) == "digit"  # " 1732" -> " ", "1", "7", "3", "2"
    answers = set()
    for r in tasks.load_task("greater_than", tok, "test", n=200):
        century, tens, ones = re.search(r"(\d\d)(\d)(\d) ", r["clean_text"]).groups()
        tens = int(tens)
        assert r["clean_text"].endswith(century) and len(r["answer_text"]) == 1
        # answer and distractor straddle the start year's tens digit; never 0 (the
        # corruption's own decade) and never the tens digit itself (ambiguous)
        assert int(r["answer_text"]) > tens > int(r["distractor_text"]) >= 1
        assert r["corrupted_text"] == r["clean_text"].replace(f"{century}{tens}{ones} ",
                                                               f"{century}01 ")
        answers.add(int(r["answer_text"]))
    assert answers == set(range(3, 10))


def test_ioi_from_given_templates(organism_tokenizer):
    """templates= draws IOI rows from the given templates only, every one in every split, with
    the split still fixed by the prompt's text; the task's own rows are not disturbed."""
    given = ["{A} and {B} sat in the {PLACE}. {S} lent a {OBJECT} to",
             "After dinner {A} and {B} talked, and {S} wrote to"]
    patterns = [re.compile(re.escape(t).replace(r"\{PLACE\}", r".+").replace(r"\{OBJECT\}", r".+")
                           .replace(r"\{A\}", r"(\w+)").replace(r"\{B\}", r"(\w+)")
                           .replace(r"\{S\}", r"(\w+)") + "$") for t in given]
    for split in tasks.SPLITS:
        rows = tasks.load_task("ioi", organism_tokenizer, split, n=40, seed=3, templates=given)
        assert set(rows["template"]) == {0, 1}
        assert not any(rows["heldout_template"])
        for r in rows:
            m = patterns[r["template"]].match(r["clean_text"])
            assert m, r["clean_text"]
            a, b, s = m.groups()
            assert s in (a, b) and r["answer_text"] == " " + (b if s == a else a)
            assert tasks.split_of(r["clean_text"]) == split
    again = tasks.load_task("ioi", organism_tokenizer, "train", n=40, seed=3, templates=given)
    assert again["clean_text"] == tasks.load_task("ioi", organism_tokenizer, "train", n=40, seed=3,
                                                  templates=given)["clean_text"]
    own = tasks.load_task("ioi", organism_tokenizer, "train", n=40, seed=3)
    assert not set(own["clean_text"]) & set(again["clean_text"])


@pytest.mark.parametrize("name, templates, message", [
    ("agreement", ["{A} and {B} met. {S} waved to"], "for task 'ioi' only"),
    ("ioi", [], "at least one template"),
    ("ioi", ["{A} and {B} met, and then someone waved to"], "must use {A}, {B} and {S}"),
    ("ioi", ["{A} and {B} met at {TIME}. {S} waved to"], "no field but those"),
    ("ioi", ["{A} and {B} met at {}. {S} waved to"], "no field but those"),
])
def test_bad_templates_are_named(organism_tokenizer, name, templates, message):
    with pytest.raises(tasks.TaskError, match=re.escape(message)):
        tasks.load_task(name, organism_tokenizer, "train", n=5, templates=templates)


def test_heal_objective_row_sets(heal_objective, organism_tokenizer, capsys):
    """benchmarks/heal_objective.py's heal rows: `novel` and `reserved` keep the task's first
    rows and swap the given share for rows from other templates, all train prompts; bad
    arguments are refused by name."""
    task = heal_objective.heal_rows("task", "ioi", organism_tokenizer, 40, 0, 0.25)
    test = set(tasks.load_task("ioi", organism_tokenizer, "test", n=200)["clean_text"])
    reserved = set(tasks.IOI_TEMPLATES[-tasks.IOI_HELDOUT:])
    for kind, templates in (("novel", heal_objective.NOVEL_IOI_TEMPLATES), ("reserved", reserved)):
        rows = heal_objective.heal_rows(kind, "ioi", organism_tokenizer, 40, 0, 0.25)
        assert len(rows) == 40 and rows["clean_text"][:30] == task["clean_text"][:30]
        assert not set(rows["template"][30:]) - set(range(len(templates)))
        assert all(tasks.split_of(t) == "train" for t in rows["clean_text"])
        assert not set(rows["clean_text"]) & test
    assert not set(heal_objective.NOVEL_IOI_TEMPLATES) & set(tasks.IOI_TEMPLATES)
    for argv, message in ((["--heal-rows", "task,mixed"], "unknown heal rows ['mixed']"),
                          (["--extra-fraction", "1"], "strictly between 0 and 1"),
                          (["--task", "agreement", "--heal-rows", "novel"], "for --task ioi only")):
        with pytest.raises(SystemExit) as e:
            heal_objective.main(argv)
        assert e.value.code != 0
        assert message in str(e.value.code) + capsys.readouterr().err


def test_heal_objective_adapters(heal_objective, capsys):
    """benchmarks/heal_objective.py's --adapters: `recipe` is the recipe's config itself,
    RANK:MODULES sets rank, alpha 2 × rank and the modules, and the adapter lands on them;
    bad adapters and heal seeds are refused by name."""
    import os

    from condense.methods.condensation import healing
    from condense.runs import load_config

    from .tiny import make_model
    specs = heal_objective._adapters("recipe,64:recipe,8:all")
    assert specs == [(None, "recipe"), (64, "recipe"), (8, "all")]
    cfg = load_config(os.path.join(os.path.dirname(__file__), "..", "recipes", "condense",
                                  "smollm2_ioi.yaml"), [])
    assert heal_objective.adapter_config(cfg, None, "recipe") is cfg
    wide = heal_objective.adapter_config(cfg, 64, "recipe")
    assert (wide.lora_rank, wide.lora_alpha, wide.lora_targets) == (64, 128, cfg.lora_targets)
    everywhere = heal_objective.adapter_config(cfg, 8, "all")
    assert (everywhere.lora_rank, everywhere.lora_alpha) == (8, 16)

    def wrapped(c):
        return set(healing.adapted_modules(healing.add_adapter(make_model("llama"), c)))
    assert wrapped(everywhere) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                   "down_proj"}
    assert wrapped(cfg) == set(healing.lora_targets(cfg, make_model("llama"))) == {"o_proj", "down_proj"}
    for bad in ("16", "16:attention", "0:all", "x:recipe"):
        with pytest.raises(SystemExit):
            heal_objective.main(["--adapters", bad])
        assert f"bad adapter '{bad}'" in capsys.readouterr().err
    assert heal_objective._seeds("0,1,7") == [0, 1, 7]
    for bad, message in (("1,a", "must be integers"), ("-1", "must not be negative")):
        with pytest.raises(SystemExit):
            heal_objective.main(["--heal-seeds", bad])
        assert message in capsys.readouterr().err


class _WithBos:
    """The organism's tokenizer, but putting a BOS token before every text by default, as
    Gemma's and Llama 3's tokenizers do."""

    def __init__(self, tokenizer, bos=0):
        self._t, self.bos_token_id = tokenizer, bos

    def __getattr__(self, name):
        return getattr(self._t, name)

    def __len__(self):
        return len(self._t)

    def encode(self, text, add_special_tokens=True):
        ids = self._t.encode(text, add_special_tokens=False)
        return [self.bos_token_id] + ids if add_special_tokens else ids


def test_prompts_start_as_the_tokenizer_starts_a_text(organism_tokenizer):
    # a model trained with BOS in front of every sequence sees it in front of every prompt and
    # general-text block; tokenizers that add nothing (the organism's, SmolLM2's) keep their rows
    with_bos = _WithBos(organism_tokenizer)
    assert tasks.prompt_prefix(organism_tokenizer) == []
    assert tasks.prompt_prefix(with_bos) == [0]
    plain = tasks.load_task("ioi", organism_tokenizer, "val", n=8)
    rows = tasks.load_task("ioi", with_bos, "val", n=8)
    assert rows["clean_ids"] == [[0] + ids for ids in plain["clean_ids"]]
    assert rows["corrupted_ids"] == [[0] + ids for ids in plain["corrupted_ids"]]
    assert rows["answer_id"] == plain["answer_id"]
    blocks = tasks.general_text(with_bos, "test", block_size=32)["input_ids"]
    assert all(len(b) == 32 and b[0] == 0 for b in blocks)
    assert blocks[1][1:] == tasks.general_text(organism_tokenizer, "test", block_size=31)["input_ids"][1]
