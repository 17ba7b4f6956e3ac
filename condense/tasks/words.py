"""Word pools shared by the task generators (and by the organism's tokenizer, which makes
every word here a single token so that answers and counterfactual swaps are one token each).

Each pool is plain data. A generator only uses words that are single tokens under the
tokenizer it is given (see `single_tokens`), so the same tasks run on GPT-2 or Llama.
"""

NAMES = """Mary John Alice Bob Tom Anna James Sarah David Emma Paul Laura Mark Lisa Peter Kate
Daniel Susan Michael Julia Robert Linda Kevin Rachel Brian Helen Steven Karen Jason Amy
Eric Nancy Adam Rose Ryan Grace Frank Diana Henry Claire Simon Jane Oliver Lucy Victor
Sophie George Ellen Martin Emily Scott Megan Carl Nina Louis Irene Dennis Carol Oscar Ruth""".split()

PLACES = """store school park garden station hospital library market office restaurant
beach museum church bank hotel farm lake forest bakery cafe theater stadium airport
harbor castle bridge village island factory temple kitchen cinema zoo gym pharmacy
studio court mall palace valley desert mountain river cave tower prison camp port
university shop club""".split()

OBJECTS = """drink book ring bag letter key apple ball basket bottle candle card coin cup
dress flower gift hat kite lamp map necklace pen phone pencil pillow plate rose scarf
shirt shoe snack spoon sweater ticket toy umbrella watch wallet brush camera clock
cookie doll guitar jacket knife medal mirror orange radio""".split()

# Singular / plural noun pairs for subject-verb agreement.
NOUN_PAIRS = [tuple(p.split("/")) for p in """key/keys dog/dogs cat/cats book/books car/cars
tree/trees boy/boys girl/girls house/houses bird/birds student/students teacher/teachers
friend/friends door/doors table/tables window/windows doctor/doctors farmer/farmers
song/songs road/roads player/players worker/workers river/rivers flower/flowers
officer/officers painter/painters writer/writers singer/singers cabinet/cabinets
machine/machines lawyer/lawyers author/authors""".split()]

VERB_PAIRS = [("is", "are"), ("was", "were"), ("has", "have")]  # (singular, plural)

PREPOSITIONS = "near behind beside with under above for from".split()
ADJECTIVES = "old new small big red green happy quiet tall young".split()

# Argument names for the docstring task.
ARG_WORDS = """alpha beta gamma size name value data path count index key mode shape
order limit width height depth color label level scale speed state style title token
type unit user weight field file format group image item length line list model node
number offset option owner page point port query range rate score seed source target
text time total url version""".split()

DOC_DESCRIPTIONS = """the input value|the number of items|a list of values|the name to use|
the output path|the current state|an optional flag|the maximum size|the model to load|
the text to parse""".replace("\n", "").split("|")

FUNCTION_NAMES = """load save parse build update check run compute fetch apply merge split
render create delete convert process validate encode decode""".split()

DOC_SUMMARIES = ["Run the step.", "Load the data.", "Build the model.", "Update the state.",
                 "Parse the input.", "Compute the result.", "Check the value.",
                 "Create a new object."]

# Capitalised words for acronyms, grouped so that every letter has several choices.
ACRONYM_WORDS = """Central Processing Unit National Science Foundation World Health
Organization United Nations Security Council Federal Bureau Investigation General Motors
Electric Power Research Institute Public Broadcasting Service Royal Air Force European
Space Agency Modern Art Museum Digital Signal Network Global Trade Union Medical Data
Center Free Software Open Source Local Area Vehicle Quality Control Board Young Justice
League Education Kingdom Heritage Industrial Labor Party Western Energy Division Army
Theater Radio Youth Ocean Bank Train Library Office Market Group Island Press Zone Hotel
Justice Venture Fund Capital Design Knowledge""".split()

ACRONYM_PREFIXES = ["The", "She works at the", "A report from the", "Members of the",
                    "He joined the", "Yesterday the", "Funding for the",
                    "In a statement, the", "Officials at the"]

GT_NOUNS = """war expedition project reign strike journey drought campaign treaty
festival siege trial voyage study survey""".split()

GT_TEMPLATES = ["The {noun} lasted from the year {c}{yy} to {c}",
                "The {noun} went on from the year {c}{yy} to the year {c}",
                "It was a long {noun}, lasting from {c}{yy} to {c}",
                "The {noun} began in {c}{yy} and ended in {c}",
                "Historians say the {noun} ran from the year {c}{yy} until {c}"]

# Frequent, word-like tokens for induction: the block is random, so only copying helps.
COMMON_WORDS = """the of and to in is that for it as with be on not this are by or from
an at which if can but all an will one has its have more used also their when there been
other only these such than into some value may any each used function new file name list
object type return first class line code number time module string call method set error
default data two use same case must way example text first second following module option
mode each value table point state word data form part system order version result field
world house water light night power place group work book play music paper money story
fact month right study point child family world school country problem""".split()
COMMON_WORDS = list(dict.fromkeys(COMMON_WORDS))  # keep first occurrence, drop repeats


def single_tokens(tokenizer, words, prefix=" "):
    """The words of `words` that `tokenizer` encodes as exactly one token (after `prefix`)."""
    return [w for w in words
            if len(tokenizer.encode(prefix + w, add_special_tokens=False)) == 1]


def gt_form(tokenizer):
    """How `tokenizer` writes the two digits after a century ("17|32"): "number" when every
    two-digit number 00..99 is one token (the organism's; also `tokenizer=None`), or
    "digit" when it splits numbers into single-digit tokens (Llama-style tokenizers such as
    SmolLM2's). Read off the tokenizer, not its name. Anything else gets "number", whose
    rows the contract check then keeps only where they fit."""
    if tokenizer is None:
        return "number"

    def enc(text):
        return tokenizer.encode(text, add_special_tokens=False)

    if all(len(enc(f"{i:02d}")) == 1 for i in range(100)):
        return "number"
    digit = [enc(str(i)) for i in range(10)]
    if all(len(x) == 1 for x in digit) and all(
            enc(f"{c}{i:02d}") == digit[c // 10] + digit[c % 10] + digit[i // 10] + digit[i % 10]
            for c in (15, 16, 17, 18) for i in range(100)):
        return "digit"
    return "number"
