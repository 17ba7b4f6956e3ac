"""Task data: `load_task` for the six behaviours and `general_text` for perplexity guards.

Rows follow docs/design.md §3: `clean_ids` and `corrupted_ids` of equal length, single-token
`answer_id` and `distractor_id` read at the last position, and the readable texts.

Splits never share a prompt: a prompt belongs to the split that a hash of its clean text
names (80 % train, 10 % val, 10 % test), and a generator's draw that lands in another
split is redrawn. IOI templates reserved for `test` never appear in `train` or `val`.
"""
import hashlib
import random
import string
from collections import defaultdict

from datasets import Dataset

from . import words as W
from .generators import GENERATORS, IOI_HELDOUT, IOI_TEMPLATES, Sample, ioi_from  # noqa: F401
from .paraphrases import PARAPHRASES

TASKS = tuple(GENERATORS)
SPLITS = ("train", "val", "test")
class TaskError(ValueError):
    """A task cannot give what was asked (an unknown name, more rows than a split holds, a
    tokenizer that does not suit it): the user's to fix, reported in one line."""


STALE = 5000  # draws in a row without a new prompt after which a split counts as exhausted


def _stable_hash(text):
    return int.from_bytes(hashlib.sha1(text.encode()).digest()[:8], "little")


def split_of(text):
    """The split a prompt belongs to, fixed by its text alone."""
    h = _stable_hash(text) % 10
    return "train" if h < 8 else ("val" if h == 8 else "test")


def _check_name(name, allowed, what):
    if name not in allowed:
        raise TaskError(f"unknown {what} {name!r}; valid {what}s: {', '.join(allowed)}")


_POOLS = {}


def word_pools(tokenizer):
    """Word pools restricted to what `tokenizer` encodes as single tokens (no filter for
    `tokenizer=None`, which is how the organism's tokenizer gets its training text)."""
    key = None if tokenizer is None else (tokenizer.name_or_path, len(tokenizer))
    if key in _POOLS:
        return _POOLS[key]

    def one(ws, prefix=" "):
        return list(ws) if tokenizer is None else W.single_tokens(tokenizer, ws, prefix)

    pairs = [(s, p) for s, p in W.NOUN_PAIRS if one([s]) and one([p])]
    verbs = [(s, p) for s, p in W.VERB_PAIRS if one([s]) and one([p])]
    by_letter = defaultdict(list)
    for w in one(W.ACRONYM_WORDS):
        if tokenizer is None or len(tokenizer.encode(w[0], add_special_tokens=False)) == 1:
            by_letter[w[0]].append(w)
    P = dict(names=one(W.NAMES), places=W.PLACES, objects=W.OBJECTS, noun_pairs=pairs,
             verbs=verbs, preps=W.PREPOSITIONS, adjs=W.ADJECTIVES, args=one(W.ARG_WORDS),
             descriptions=W.DOC_DESCRIPTIONS, functions=W.FUNCTION_NAMES,
             summaries=W.DOC_SUMMARIES, acronym_by_letter=dict(by_letter),
             acronym_prefixes=W.ACRONYM_PREFIXES, gt_nouns=W.GT_NOUNS,
             gt_templates=W.GT_TEMPLATES, gt_form=W.gt_form(tokenizer),
             common=one(W.COMMON_WORDS))
    need = dict(names=10, noun_pairs=4, verbs=1, args=12, acronym_by_letter=8, common=60)
    short = {k: len(P[k]) for k, m in need.items() if len(P[k]) < m}
    if short:
        raise TaskError(f"tokenizer {getattr(tokenizer, 'name_or_path', None)!r} keeps too "
                         f"few single-token words (pool: count): {short}; needed: {need}")
    _POOLS[key] = P
    return P


def _rng(name, split, seed):
    return random.Random(_stable_hash(f"{name}/{split}/{seed}"))


def _template_generator(name, templates):
    """IOI's generator over `templates`, after checking that each one makes an IOI prompt."""
    if name != "ioi":
        raise TaskError(f"templates= is for task 'ioi' only, not {name!r}")
    if not templates:
        raise TaskError("templates= needs at least one template")
    for t in templates:
        fields = {f for _, f, _, _ in string.Formatter().parse(t) if f is not None}  # "{}" is ""
        if not {"A", "B", "S"} <= fields or fields - {"A", "B", "S", "PLACE", "OBJECT"}:
            raise TaskError(f"IOI template {t!r} must use {{A}}, {{B}} and {{S}}, and no field "
                            "but those, {PLACE} and {OBJECT}")
    return ioi_from(templates)


def iter_samples(name, tokenizer, split="train", seed=0, templates=None, paraphrase=False):
    """An endless stream of `Sample`s of task `name` whose prompts belong to `split` (IOI's
    from `templates` instead of its own, where given). `paraphrase`: from the paraphrase set
    instead (tasks/paraphrases.py), in no split: its forms are none of the generators', so
    its prompts are in none of the splits."""
    _check_name(name, TASKS, "task")
    _check_name(split, SPLITS, "split")
    if paraphrase:
        gen, rng = PARAPHRASES[name], _rng(f"{name}/paraphrase", split, seed)
    else:
        gen = GENERATORS[name] if templates is None else _template_generator(name, templates)
        rng = _rng(name, split, seed)
    P = word_pools(tokenizer)
    while True:
        s = gen(rng, split, P)
        if paraphrase or split_of(s.clean) == split:  # held-out templates only in test
            yield s


def _encode(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def prompt_prefix(tokenizer) -> list:
    """The special tokens `tokenizer` puts before a text by default: `[bos]` for tokenizers
    whose models were trained with one in front of every sequence (Gemma, Llama 3), none for
    GPT-2's, SmolLM2's or the organism's. Prompts and general-text blocks start with it:
    without it Gemma-3-270M picks the IOI answer on 2 of 16 val prompts (docs/models.md)."""
    if tokenizer is None:
        return []
    plain, default = _encode(tokenizer, "a"), tokenizer.encode("a")
    return list(default[:len(default) - len(plain)]) if default[-len(plain):] == plain else []


def _row(tokenizer, s, prefix=()):
    """The evaluation row of sample `s` (its prompts after `prefix`, the tokenizer's
    `prompt_prefix`), or None when the tokenizer breaks the contract."""
    clean, corrupted = _encode(tokenizer, s.clean), _encode(tokenizer, s.corrupted)
    answer, distractor = _encode(tokenizer, s.answer), _encode(tokenizer, s.distractor)
    if (len(clean) != len(corrupted) or len(answer) != 1 or len(distractor) != 1
            or answer == distractor
            or _encode(tokenizer, s.clean + s.answer) != clean + answer):
        return None
    clean, corrupted = list(prefix) + clean, list(prefix) + corrupted
    return dict(clean_ids=clean, corrupted_ids=corrupted, answer_id=answer[0],
                distractor_id=distractor[0], clean_text=s.clean, corrupted_text=s.corrupted,
                answer_text=s.answer, distractor_text=s.distractor, template=s.template,
                heldout_template=s.heldout)


def load_task(name: str, tokenizer, split: str = "test", n: int = 500, seed: int = 0,
              templates: list | None = None, paraphrase: bool = False) -> Dataset:
    """`n` distinct rows of task `name` (one of TASKS) from `split`, as a `datasets.Dataset`.

    `templates` (IOI only) replaces IOI's template list, every template in every split: heal
    rows with more template variety, for example (benchmarks/heal_objective.py). The split
    is still fixed by each prompt's text, so such rows share no prompt with another split.

    Deterministic for (name, split, seed, tokenizer). Draws that the tokenizer cannot
    encode under the row contract (e.g. an acronym letter merged with the next) are
    redrawn; if most draws fail, the tokenizer does not suit the task and we say so. A split
    holds a finite number of distinct prompts: when `STALE` draws in a row bring no new one,
    the split is taken to be exhausted and the error says how many it holds.
    """
    if n < 1:
        raise TaskError(f"task {name!r}: n must be >= 1, got {n}")
    rows, seen, tries, fits, stale = [], set(), 0, 0, 0
    prefix = prompt_prefix(tokenizer)
    for s in iter_samples(name, tokenizer, split, seed, templates, paraphrase):
        tries += 1
        if stale >= STALE:
            raise TaskError(f"task {name!r}, split {split!r}: asked for {n} rows, but it holds "
                             f"about {len(seen)} distinct prompts ({len(rows)} fit the tokenizer's "
                             f"row contract); ask for at most {len(rows)}")
        if tries > 50 * n + 1000 and fits < tries // 10:
            raise TaskError(f"task {name!r}: only {len(rows)} of {n} rows fit tokenizer "
                             f"{tokenizer.name_or_path!r} after {tries} draws")
        if s.clean in seen:
            stale += 1
            continue
        stale = 0
        row = _row(tokenizer, s, prefix)
        seen.add(s.clean)
        if row is not None:
            fits += 1
            rows.append(row)
            if len(rows) == n:
                break
    return Dataset.from_list(rows)


def load_paraphrases(name: str, tokenizer, n: int = 200, seed: int = 0) -> Dataset:
    """`n` distinct rows of task `name` from its paraphrase set (tasks/paraphrases.py): surface
    forms the task's generator never produces, for measuring how a circuit does on prompts it
    never saw. Nothing ranks, heals or gates on them."""
    return load_task(name, tokenizer, "test", n=n, seed=seed, paraphrase=True)


def template_parts(rows):
    """{"seen": [row indices], "heldout": [row indices]} of `rows` by their heldout_template
    flag (IOI's test split has both), or {} when the rows have only one kind."""
    if "heldout_template" not in rows.column_names:
        return {}
    flags = [bool(f) for f in rows["heldout_template"]]
    if all(flags) or not any(flags):
        return {}
    return {"seen": [i for i, f in enumerate(flags) if not f],
            "heldout": [i for i, f in enumerate(flags) if f]}


# ---------------------------------------------------------------- general text
GENERAL_TEXT_SPLITS = ("train", "val", "test")


def general_documents():
    """English documentation that ships with every CPython: the `pydoc` topic pages,
    as (title, text) pairs in a fixed order."""
    from pydoc_data.topics import topics
    return sorted(topics.items())


def general_split_of(title):
    h = _stable_hash("general/" + title) % 20
    return "test" if h < 2 else ("val" if h < 4 else "train")  # 10 % test, 10 % val


def general_text(tokenizer, split="test", block_size=128):
    """General text for perplexity guards: `train` (used to train the organism) and the
    held-out `val` and `test` parts. Returns a Dataset of `input_ids` blocks of
    `block_size` tokens (the last partial block dropped) and the `text` they came from."""
    _check_name(split, GENERAL_TEXT_SPLITS, "split")
    text = "\n\n".join(t for title, t in general_documents() if general_split_of(title) == split)
    ids, prefix = _encode(tokenizer, text), prompt_prefix(tokenizer)
    step = block_size - len(prefix)  # each block starts as the model's training sequences did
    blocks = [prefix + ids[i:i + step] for i in range(0, len(ids) - step + 1, step)]
    return Dataset.from_dict(dict(input_ids=blocks,
                                  text=[tokenizer.decode(b) for b in blocks]))


# ---------------------------------------------------------------- a second source of text
# English that no heal trains on and that is not documentation: the licence texts every Debian
# and Ubuntu system keeps (package base-files). Any folder or file of text may replace it.
SECOND_SOURCE = "/usr/share/common-licenses"


def second_source_documents(path: str = SECOND_SOURCE) -> list:
    """(name, text) of every text file under `path` (a file or a folder, not recursive), in name
    order, each file once (symbolic links to a file already read are skipped)."""
    import os
    if os.path.isfile(path):
        files = [path]
    elif os.path.isdir(path):
        files = [os.path.join(path, f) for f in sorted(os.listdir(path))]
    else:
        raise TaskError(f"second-source text {path!r}: no such file or folder")
    docs, seen = [], set()
    for f in files:
        real = os.path.realpath(f)
        if real in seen or not os.path.isfile(real):
            continue
        seen.add(real)
        try:
            with open(real, encoding="utf-8") as fh:
                docs.append((os.path.basename(f), fh.read()))
        except (UnicodeDecodeError, OSError):
            continue  # not text
    if not docs:
        raise TaskError(f"second-source text {path!r}: no readable text file there")
    return docs


def _spread(starts: list, n: int) -> list:
    """`n` of `starts` evenly over the whole text, not its first files (all when fewer)."""
    if len(starts) <= n:
        return starts
    return [starts[round(i * (len(starts) - 1) / max(1, n - 1))] for i in range(n)]


def second_source_text(tokenizer, n_blocks: int = 128, block_size: int = 128,
                       path: str = SECOND_SOURCE, exclude: int = 0) -> Dataset:
    """`n_blocks` blocks of `block_size` tokens of a second source of English (`path`; by
    default the system's licence texts), spread evenly over it: for a perplexity that no heal
    trains on and that is not the general text the gate reads (pydoc). Blocks start as
    general_text's do (the tokenizer's prompt prefix). Fewer blocks than asked when the text
    is shorter; the Dataset says how many it holds. `exclude` > 0 leaves out the blocks that a
    call with n_blocks=exclude returns (the gate reads text disjoint from the fidelity card's)."""
    text = "\n\n".join(t for _, t in second_source_documents(path))
    ids, prefix = _encode(tokenizer, text), prompt_prefix(tokenizer)
    step = block_size - len(prefix)
    starts = list(range(0, len(ids) - step + 1, step))
    if exclude:
        taken = set(_spread(starts, exclude))
        starts = [s for s in starts if s not in taken]
    starts = _spread(starts, n_blocks)
    blocks = [prefix + ids[i:i + step] for i in starts]
    return Dataset.from_dict(dict(input_ids=blocks, text=[tokenizer.decode(b) for b in blocks]))
