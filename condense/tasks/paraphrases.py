"""The paraphrase set: each task's behaviour in surface forms its generator never produces.

Written for the fidelity card (condense.fidelity) and never used to rank, heal or gate: no
recipe, method or split reaches these generators, only `condense.tasks.load_paraphrases`. A
circuit that fits the prompts it was found and healed on shows it here. Each form keeps the
task's counterfactual (docs/design.md §3) and the row contract.

- ioi: twelve templates none of IOI's nineteen has (other verbs, clause orders and objects);
- agreement: eight templates around the subject and its attractor;
- induction: the repeated block as a comma-separated list, and blocks of names and
  argument words instead of frequent words;
- docstring: epydoc (`@param name:`) and `:arg name:` fields, in functions without `self`;
- acronym: eight new lead-ins before the spelled-out name;
- greater_than: six new sentence frames and new nouns.
"""
from .generators import (_ioi_sample, acronym, agreement, docstring, greater_than, induction)

IOI_PARAPHRASES = [
    "After {A} and {B} had dinner at the {PLACE}, {S} handed the {OBJECT} to",
    "{A} and {B} were sitting in the {PLACE}. Eventually {S} passed a {OBJECT} to",
    "When the {PLACE} opened, {A} and {B} walked in, and {S} lent a {OBJECT} to",
    "During the trip to the {PLACE}, {A} and {B} talked for hours. Then {S} gave a {OBJECT} to",
    "It was late when {A} and {B} left the {PLACE}. {S} mailed a {OBJECT} to",
    "In the morning, {A} and {B} cleaned the {PLACE}. Afterwards {S} brought the {OBJECT} to",
    "{A} and {B} spent the whole day at the {PLACE}, and in the end {S} sold a {OBJECT} to",
    "Once {A} and {B} reached the {PLACE}, {S} returned the {OBJECT} to",
    "Both {A} and {B} worked at the {PLACE}. One day {S} gave a {OBJECT} to",
    "At noon {A} and {B} arrived at the {PLACE}, where {S} showed the {OBJECT} to",
    "{A} and {B} argued about a {OBJECT} at the {PLACE}, so {S} gave it to",
    "Because {A} and {B} were at the {PLACE} together, {S} lent the {OBJECT} to",
]

AGREEMENT_PARAPHRASES = [
    "Over there, the {s} {prep} the {a}",
    "My friend says the {s} {prep} the {a}",
    "In the picture, the {adj} {s} {prep} the {a}",
    "The {s} that my {a} wanted",
    "Yesterday the {s} {prep} the {adj} {a}",
    "We all agree that the {s} {prep} the {a}",
    "Somewhere in town, the {s} of the {a}",
    "As usual, the {s} {prep} those {adj} {a}",
]

ACRONYM_PARAPHRASES = ["According to the", "Last year the", "Experts from the",
                       "A spokesperson for the", "We visited the", "The director of the",
                       "Everyone has heard of the", "Critics of the"]

GT_PARAPHRASES = ["The {noun} started in the year {c}{yy} and finished in the year {c}",
                  "Records show the {noun} lasted from {c}{yy} to {c}",
                  "The {noun}, which began in {c}{yy}, was over by {c}",
                  "The {noun} took place between {c}{yy} and {c}",
                  "Beginning in {c}{yy}, the {noun} continued until {c}",
                  "Scholars date the {noun} from {c}{yy} to {c}"]
GT_NOUNS = "rebellion tour boom occupation partnership exile mission contract".split()


def _ioi(rng, split, P):
    t = rng.randrange(len(IOI_PARAPHRASES))
    return _ioi_sample(rng, P, IOI_PARAPHRASES[t], t, False)


def _agreement(rng, split, P):
    return agreement(rng, split, P, templates=AGREEMENT_PARAPHRASES)


def _induction(rng, split, P):
    form = rng.randrange(3)  # commas between frequent words, or names / argument words
    s = (induction(rng, split, P, sep=",") if form == 0
         else induction(rng, split, P, pool="names" if form == 1 else "args"))
    s.template = form
    return s


def _docstring(rng, split, P):
    keyword = rng.choice(["@param", ":arg"])
    s = docstring(rng, split, P, keyword=keyword, receiver="")
    s.template = 0 if keyword == "@param" else 1
    return s


def _acronym(rng, split, P):
    return acronym(rng, split, dict(P, acronym_prefixes=ACRONYM_PARAPHRASES))


def _greater_than(rng, split, P):
    return greater_than(rng, split, dict(P, gt_templates=GT_PARAPHRASES,
                                         gt_nouns=list(P["gt_nouns"]) + GT_NOUNS))


PARAPHRASES = dict(ioi=_ioi, induction=_induction, agreement=_agreement, docstring=_docstring,
                   acronym=_acronym, greater_than=_greater_than)
