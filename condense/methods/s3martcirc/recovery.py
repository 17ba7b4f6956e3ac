"""Known-circuit recovery: how much of a published circuit a node ranking finds.

References are node classes of a published circuit, e.g. the IOI circuit of GPT-2 small
(Wang et al. 2022: name movers, S-inhibition heads, ...). The shipped ones are in
condense/data/known_circuits.json (loaded by path relative to this module, so it works from a
checkout, an editable install and a wheel alike): `gpt2_ioi`, `gpt2_acronym` (García-Carrasco
et al. 2024), `gpt2_greater_than` (Hanna et al. 2023) and `attn_only_4l_docstring`. Entries
are "layer.head" (an attention head, node `a{l}.h{h}`) or "layer" (a whole MLP, node `m{l}`).

Recovery at a budget n: the fraction of the reference's nodes found among the n best nodes of
a ranking over heads and neurons. A head is found when it is among them; an MLP `m{l}` when
at least one of its neurons `m{l}.n{i}` (or `m{l}` itself) is. Reported overall and per class.
"""
import json
import os

KNOWN_CIRCUITS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "data",
                              "known_circuits.json")
PAPER_BUDGETS = (50, 100, 150, 200)  # the S3martCirc paper's node budgets for GPT-2 small

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


def _found(ranked):
    """Nodes a ranking prefix covers: each name, plus m{l} for every neuron m{l}.n{i}."""
    found = set(ranked)
    found.update(n.split(".")[0] for n in ranked if n.startswith("m") and ".n" in n)
    return found


def recovery(ranked_names, reference, budgets=PAPER_BUDGETS):
    """{budget: {"overall": fraction, "found": k, "total": n, "classes": {class: fraction}}}
    for the best `budget` names of `ranked_names` (best first). `reference`: what
    load_reference takes, or its result. A node listed in several classes counts once overall."""
    ref = reference if _is_loaded(reference) else load_reference(reference)
    everything = sorted({n for nodes in ref.values() for n in nodes})
    out = {}
    for b in budgets:
        found = _found(ranked_names[:int(b)])
        hit = [n for n in everything if n in found]
        out[int(b)] = dict(
            overall=len(hit) / len(everything) if everything else float("nan"),
            found=len(hit), total=len(everything),
            classes={cls: (sum(n in found for n in nodes) / len(nodes) if nodes else float("nan"))
                     for cls, nodes in ref.items()})
    return out


def _is_loaded(reference):
    return isinstance(reference, dict) and all(
        isinstance(v, list) and all(isinstance(e, str) and e[:1] in "am" for e in v)
        for v in reference.values())
