"""Published circuits as node classes: the shipped references (condense/data/known_circuits.json,
read by path relative to this module so that it works from a checkout, an editable install and
a wheel alike): `gpt2_ioi` (Wang et al. 2022), `gpt2_acronym` (Garcia-Carrasco et al. 2024),
`gpt2_greater_than` (Hanna et al. 2023) and `attn_only_4l_docstring`. Entries are "layer.head"
(an attention head, node `a{l}.h{h}`) or "layer" (a whole MLP, node `m{l}`). Read by S3martCirc's
recovery score and by the fidelity card's literature roles."""
import json
import os

KNOWN_CIRCUITS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data",
                              "known_circuits.json")

# task -> reference circuit of GPT-2 small
GPT2_REFERENCES = {"ioi": "gpt2_ioi", "acronym": "gpt2_acronym", "greater_than": "gpt2_greater_than"}
GPT2_SMALL = dict(n_layers=12, n_heads=12, d_model=768)


def known_circuits(path=KNOWN_CIRCUITS):
    with open(path) as f:
        return {k: v for k, v in json.load(f).items() if not k.startswith("_")}


def node_name(entry):
    """'9.6' -> 'a9.h6' (a head); '3' -> 'm3' (an MLP); node names pass through."""
    entry = str(entry)
    if entry[0] in "am":
        return entry
    layer, dot, head = entry.partition(".")
    return f"a{int(layer)}.h{int(head)}" if dot else f"m{int(layer)}"


def load_reference(name_or_path):
    """{class: [node names]} of a reference: a key of the shipped known_circuits.json, or a JSON
    file holding either such a mapping or a {key: mapping} file plus '#key' (path#key). Keys
    that are not lists (e.g. `source`) are skipped."""
    if isinstance(name_or_path, dict):
        raw = name_or_path
    else:
        path, _, key = str(name_or_path).partition("#")
        if os.path.exists(path):
            with open(path) as f:
                raw = json.load(f)
            if key:
                raw = raw[key]
        else:
            shipped = known_circuits()
            if path not in shipped:
                raise KeyError(f"no reference circuit {name_or_path!r}: not a file, and not one of "
                               f"{', '.join(shipped)}")
            raw = shipped[path]
    return {cls: [node_name(e) for e in entries] for cls, entries in raw.items()
            if isinstance(entries, list)}


def default_reference(shape, task):
    """The shipped reference for `task` when the model is GPT-2 small-shaped, else None."""
    if (shape.model_type == "gpt2" and shape.n_layers == GPT2_SMALL["n_layers"]
            and shape.n_heads == GPT2_SMALL["n_heads"] and shape.d_model == GPT2_SMALL["d_model"]):
        return GPT2_REFERENCES.get(task)
    return None
