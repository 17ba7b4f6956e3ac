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
from condense.known_circuits import (GPT2_REFERENCES, GPT2_SMALL, KNOWN_CIRCUITS,  # noqa: F401
                                     default_reference, known_circuits, load_reference, node_name)

PAPER_BUDGETS = (50, 100, 150, 200)  # the S3martCirc paper's node budgets for GPT-2 small


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
