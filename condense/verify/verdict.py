"""One wording of a verify report's `irreducible` field, shared by the command line, the HTML
report and the grid table, and the report page's summary rows (torch-free, so that the report
page can import it)."""
from typing import Optional


def irreducibility_words(irreducible: Optional[bool], local: bool = False, brief: bool = False) -> str:
    """True: irreducible; False: reducible (a proper subset passes); None: no verdict. A full
    check gives None only when the circuit fails its own criterion and no proper subset passes
    ("irreducible" would then say nothing); a local check (one- and two-edge removals) gives None
    whenever no removal passes, since irreducibility needs every subset. `brief` drops the
    reason (a table cell)."""
    if irreducible is None and brief:
        return "irreducibility not checked" if local else "no verdict"
    if irreducible is None:
        return ("not checked (local: no one- or two-edge removal passes)" if local else
                "no verdict (the circuit fails its own criterion and no subset passes)")
    return "irreducible" if irreducible else "reducible"


def summary_items(verify: dict) -> list:
    """(label, value) rows that summarise a verify.json for the report page."""
    local = verify.get("mode") == "local"  # one- and two-edge removals only
    verdict = [("criterion", verify.get("criterion")), ("judged against", verify.get("reference")),
               ("circuit passes it", verify.get("circuit_faithful")),
               ("irreducible", irreducibility_words(verify.get("irreducible"), local)),
               ("1-minimal (no edge or pair can go)" if local else "minimal faithful subsets",
                verify.get("one_minimal") if local else verify.get("n_minimal_faithful_subsets"))]
    reductions = []  # what the local check and the greedy reduction found, beside the verdict
    if local and verify.get("removable_edges") is not None:
        reductions.append(("edges that can go one at a time",
                           f"{len(verify['removable_edges'])}/{verify.get('n_edges')}"))
    for key, label in (("greedy_subset", "greedy reduction (passes, no edge can leave it)"),
                       ("minimal_subset", "a minimal passing subset (every subset of the greedy "
                                          "one checked)")):
        if verify.get(key):
            reductions.append((label, f"{len(verify[key])} edges: {', '.join(verify[key])}"))
    interactions = [
        ("interacting pairs", f"{verify.get('n_interacting_pairs')}/{len(verify.get('pairs') or [])}"),
        ("median partners", verify.get("partners_median")),
        ("rows", verify.get("n_rows")), ("base quantization", verify.get("quantization"))]
    return verdict + reductions + interactions
