"""One generator per task. Each draws a `Sample` from a `random.Random` and word pools.

A sample carries the evaluation row (clean / corrupted prompt, answer, distractor) and the
text the organism trains on, with the character spans that carry the loss. Positions and
lengths vary in every task (several template shapes, variable counts), so a model must use
content, not fixed offsets (docs/design.md §3).
"""
from dataclasses import dataclass, field


@dataclass
class Sample:
    clean: str
    corrupted: str
    answer: str  # one token, appended directly to `clean`
    distractor: str
    train_text: str  # clean + answer and, where useful, more of the same example
    targets: list = field(default_factory=list)  # (start, end, weight) char spans of train_text
    template: int = -1
    heldout: bool = False  # drawn from a template reserved for the test split


def _span(text, piece, start=0):
    i = text.index(piece, start)
    return i, i + len(piece)


# ---------------------------------------------------------------- IOI (Wang et al. 2022)
# {A} and {B} are the first mentions (ABBA puts the indirect object first), {S} the
# second mention of the subject. The last IOI_HELDOUT templates appear only in `test`.
IOI_TEMPLATES = [
    "When {A} and {B} went to the {PLACE}, {S} gave a {OBJECT} to",
    "Then, {A} and {B} went to the {PLACE}. {S} gave a {OBJECT} to",
    "Then, {A} and {B} had a lot of fun at the {PLACE}. {S} gave a {OBJECT} to",
    "Then, {A} and {B} were working at the {PLACE}. {S} decided to give a {OBJECT} to",
    "Then, {A} and {B} were thinking about going to the {PLACE}. {S} wanted to give a {OBJECT} to",
    "Then, {A} and {B} had a long argument, and afterwards {S} said to",
    "After {A} and {B} went to the {PLACE}, {S} gave a {OBJECT} to",
    "When {A} and {B} got a {OBJECT} at the {PLACE}, {S} decided to give it to",
    "While {A} and {B} were working at the {PLACE}, {S} gave a {OBJECT} to",
    "While {A} and {B} were walking to the {PLACE}, {S} handed a {OBJECT} to",
    "After lunch, {A} and {B} went to the {PLACE}. {S} gave a {OBJECT} to",
    "{A} and {B} met at the {PLACE}, where {S} gave a {OBJECT} to",
    "Yesterday {A} and {B} visited the {PLACE} and {S} brought a {OBJECT} to",
    "At the {PLACE}, {A} and {B} found a {OBJECT}. {S} gave it to",
    "The {PLACE} was busy when {A} and {B} arrived, so {S} passed the {OBJECT} to",
    # reserved for the test split
    "Later, {A} and {B} walked to the {PLACE}, and {S} offered a {OBJECT} to",
    "Since {A} and {B} were at the {PLACE} early, {S} threw the {OBJECT} to",
    "On Sunday {A} and {B} left the {PLACE}. Then {S} sent a {OBJECT} to",
    "{A} and {B} were cleaning the {PLACE} when {S} showed a {OBJECT} to",
]
IOI_HELDOUT = 4


def _ioi_sample(rng, P, template, t, heldout):
    io, s, third = rng.sample(P["names"], 3)
    first, second = (io, s) if rng.random() < 0.5 else (s, io)  # ABBA or BABA
    slots = dict(A=first, B=second, PLACE=rng.choice(P["places"]), OBJECT=rng.choice(P["objects"]))
    clean = template.format(S=s, **slots)
    corrupted = template.format(S=third, **slots)  # ABC: S2 becomes a third name
    train = clean + " " + io
    return Sample(clean, corrupted, " " + io, " " + s, train, [(len(clean), len(train), 1.0)],
                  template=t, heldout=heldout)


def ioi(rng, split, P):
    n_train = len(IOI_TEMPLATES) - IOI_HELDOUT
    heldout = split == "test" and rng.random() < 0.3
    t = rng.randrange(n_train, len(IOI_TEMPLATES)) if heldout else rng.randrange(n_train)
    return _ioi_sample(rng, P, IOI_TEMPLATES[t], t, heldout)


def ioi_from(templates):
    """An IOI generator that draws from `templates` (each with {A}, {B}, {S}, and optionally
    {PLACE} and {OBJECT}) in every split, none held out: for experiments on template variety.
    A sample's `template` is its index in `templates`."""
    templates = list(templates)

    def gen(rng, split, P):
        t = rng.randrange(len(templates))
        return _ioi_sample(rng, P, templates[t], t, False)
    return gen


# ---------------------------------------------------------------- induction
def _words(ws, sep=""):
    return sep.join(" " + w for w in ws)


def induction(rng, split, P, pool="common", sep=""):
    """`pool` (a word pool of P) and `sep` (what follows each word but the last, e.g. ",")
    are the surface form; the paraphrase set (tasks/paraphrases.py) draws others."""
    _words_ = lambda ws: _words(ws, sep)  # noqa: E731
    n_prefix, n_block = rng.randint(0, 10), rng.randint(6, 16)
    ws = rng.sample(P[pool], n_prefix + 2 * n_block)
    prefix, block, spare = ws[:n_prefix], ws[n_prefix:n_prefix + n_block], ws[n_prefix + n_block:]
    k = rng.randint(1, n_block - 1)  # tokens of the second copy already shown
    # with a separator the prompt ends with it, so that the next token is still a word
    clean = _words_(prefix + block + block[:k]) + sep
    corrupted = _words_(prefix + block + spare[:k]) + sep  # second copy re-randomised
    distractor = rng.choice([w for w in block if w not in (block[k], block[k - 1])])
    train = _words_(prefix + block + block)
    second = len(_words_(prefix + block))
    targets, pos = [], second
    for i, w in enumerate(block):  # the first token of the copy cannot be predicted
        start, end = _span(train, " " + w, pos)
        if i > 0:
            targets.append((start, end, 1.0))
        pos = end
    return Sample(clean, corrupted, " " + block[k], " " + distractor, train, targets)


# ---------------------------------------------------------------- subject-verb agreement
AGREEMENT_TEMPLATES = [
    "The {s} {prep} the {a}",
    "The {adj} {s} {prep} the {a}",
    "The {s} {prep} the {adj} {a}",
    "The {s} that the {a} liked",
    "I think that the {s} {prep} the {a}",
    "Everyone knows the {s} of the {a}",
    "The {s} next to the {a}",
]


def agreement(rng, split, P, templates=AGREEMENT_TEMPLATES):
    """`templates`: the surface forms ({s} the subject, {a} the attractor, optionally {prep}
    and {adj}); the paraphrase set (tasks/paraphrases.py) passes others."""
    t = rng.randrange(len(templates))
    sing, plur = rng.choice(P["noun_pairs"])
    attractor = rng.choice(rng.choice([p for p in P["noun_pairs"] if p[0] != sing]))
    plural = rng.random() < 0.5
    slots = dict(a=attractor, prep=rng.choice(P["preps"]), adj=rng.choice(P["adjs"]))
    clean = templates[t].format(s=plur if plural else sing, **slots)
    corrupted = templates[t].format(s=sing if plural else plur, **slots)
    v_sing, v_plur = rng.choice(P["verbs"])
    answer, distractor = (v_plur, v_sing) if plural else (v_sing, v_plur)
    train = clean + " " + answer
    return Sample(clean, corrupted, " " + answer, " " + distractor, train,
                  [(len(clean), len(train), 1.0)], template=t)


# ---------------------------------------------------------------- docstring
def _docstring(fn, args, summary, descs, n_documented, close, keyword=":param", receiver="self, "):
    lines = [f"def {fn}({receiver}{', '.join(args)}):", f'    """{summary}', ""]
    lines += [f"    {keyword} {a}: {d}" for a, d in zip(args[:n_documented], descs)]
    text = "\n".join(lines) + f"\n    {keyword}"
    return text + (f" {args[n_documented]}: {descs[n_documented]}" + close if close else "")


def docstring(rng, split, P, keyword=":param", receiver="self, "):
    """`keyword` and `receiver` are the surface form (":param" after "self, "); the
    paraphrase set (tasks/paraphrases.py) draws others."""
    n = rng.randint(3, 5)
    ws = rng.sample(P["args"], 2 * n)
    args, other = ws[:n], ws[n:]
    k = rng.randint(1, n - 1)  # documented arguments before the one to predict
    fn, summary = rng.choice(P["functions"]), rng.choice(P["summaries"])
    descs = [rng.choice(P["descriptions"]) for _ in range(n)]
    clean = _docstring(fn, args, summary, descs, k, None, keyword, receiver)
    # other argument names in the signature; the docstring so far is unchanged
    corrupted = f"def {fn}({receiver}{', '.join(other)}):" + clean[clean.index("\n"):]
    distractor = rng.choice([a for a in args if a != args[k]])
    full = _docstring(fn, args, summary, descs, n - 1, '\n    """', keyword, receiver)
    targets, pos = [], 0
    for a in args:  # the loss sits on every documented argument name
        pos = full.index(keyword, pos) + len(keyword)
        start, end = _span(full, " " + a, pos)
        targets.append((start, end, 1.0))
    return Sample(clean, corrupted, " " + args[k], " " + distractor, full, targets)


# ---------------------------------------------------------------- acronym
def acronym(rng, split, P):
    m = rng.choice([3, 3, 4])
    by_letter = P["acronym_by_letter"]
    letters = rng.sample(sorted(by_letter), 2 * m)
    words = [rng.choice(by_letter[c]) for c in letters[:m]]
    other = [rng.choice(by_letter[c]) for c in letters[m:]]  # other initials at every place
    k = rng.randint(1, m - 1)
    prefix = rng.choice(P["acronym_prefixes"])

    def text(ws, n):
        return prefix + _words(ws) + " (" + "".join(w[0] for w in ws[:n])

    clean, corrupted = text(words, k), text(other, k)
    full = text(words, m) + ")"
    start = len(text(words, 0))
    targets = [(start + i, start + i + 1, 1.0) for i in range(m)]
    return Sample(clean, corrupted, words[k][0], other[k][0], full, targets)


# ---------------------------------------------------------------- greater-than
def greater_than(rng, split, P):
    """Greater-than (Hanna et al. 2023): "The war lasted from the year 1732 to 17" -> a
    later year. The corruption sets the start year to YY01, after which (almost) every year
    is later, so the start year's information is gone.

    Two forms, chosen per tokenizer by `words.gt_form` (stored as `P["gt_form"]`):

    - "number" (every two-digit number is one token, as for the organism's tokenizer): the
      answer is a two-digit number above YY, the distractor one below.
    - "digit" (the tokenizer splits numbers into single digits, as Llama-style ones do):
      see `_greater_than_digit`.
    """
    if P.get("gt_form", "number") == "digit":
        return _greater_than_digit(rng, split, P)
    t = rng.randrange(len(P["gt_templates"]))
    yy = rng.randint(3, 97)
    answer, distractor = rng.randint(yy + 1, 99), rng.randint(2, yy - 1)
    slots = dict(noun=rng.choice(P["gt_nouns"]), c=rng.choice(["15", "16", "17", "17", "18"]))
    clean = P["gt_templates"][t].format(yy=f"{yy:02d}", **slots)
    corrupted = P["gt_templates"][t].format(yy="01", **slots)
    train = clean + f"{answer:02d}"  # any later year is right: the target is a random one
    return Sample(clean, corrupted, f"{answer:02d}", f"{distractor:02d}", train,
                  [(len(clean), len(train), 1.0)], template=t)


def _greater_than_digit(rng, split, P):
    """Greater-than for tokenizers that split numbers into digits: after "... from the
    year 1732 to 17" the next token is the end year's tens digit.

    Let d be the start year's tens digit (3 in 1732). A tens digit above d makes the end
    year later whatever follows (1740..1799): that is right. One below d makes it earlier
    (1700..1729): that is wrong. d itself is ambiguous (1730..1739 is later only if the
    ones digit exceeds 2), so neither answer nor distractor is ever d: they straddle it,
    answer in d+1..9 and distractor in 1..d-1, hence d in 2..8.

    The distractor is never 0 because of the corruption: with the start year at YY01 every
    tens digit from 1 up names a strictly later decade, so answer and distractor are
    equally right there and the corrupted prompt carries no information that favours
    either: corrupted LD is the model's start-year-free preference between the two digits
    (SmolLM2-135M: -1.72 on 500 test rows, a lean towards the smaller, nearer decade, so
    clean accuracy is not a bias for large digits). A distractor of 0 would
    be the start year's own decade, ambiguous again (1700 is earlier, 1705 later), and
    would give the corrupted prompt a preference of its own. The ones digit of the start
    year is uniform 0..9 and plays no part in the answer.
    """
    t = rng.randrange(len(P["gt_templates"]))
    d, ones = rng.randint(2, 8), rng.randint(0, 9)
    answer, distractor = rng.randint(d + 1, 9), rng.randint(1, d - 1)
    slots = dict(noun=rng.choice(P["gt_nouns"]), c=rng.choice(["15", "16", "17", "17", "18"]))
    clean = P["gt_templates"][t].format(yy=f"{d}{ones}", **slots)
    corrupted = P["gt_templates"][t].format(yy="01", **slots)
    train = clean + f"{answer}{rng.randint(0, 9)}"  # the loss is on the tens digit only
    return Sample(clean, corrupted, str(answer), str(distractor), train,
                  [(len(clean), len(clean) + 1, 1.0)], template=t)


GENERATORS = dict(ioi=ioi, induction=induction, agreement=agreement, docstring=docstring,
                  acronym=acronym, greater_than=greater_than)
