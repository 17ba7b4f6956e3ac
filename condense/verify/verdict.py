"""One wording of a verify report's `irreducible` field, shared by the command line, the HTML
report and the grid table, and the report page's summary rows (torch-free, so that the report
page can import it)."""
from typing import Optional


def irreducibility_words(irreducible: Optional[bool], local: bool = False, brief: bool = False,
                         pairs: bool = True) -> str:
    """True: irreducible; False: reducible (a proper subset passes); None: no verdict. A full
    check gives None only when the circuit fails its own criterion and no proper subset passes
    ("irreducible" would then say nothing); a local check (one- and two-edge removals) gives None
    whenever no removal passes, since irreducibility needs every subset (`pairs` false: a local
    check of the one-edge removals only). `brief` drops the reason (a table cell)."""
    if irreducible is None and brief:
        return "irreducibility not checked" if local else "no verdict"
    if irreducible is None:
        return ("not checked (local: no one- or two-edge removal passes)" if local and pairs else
                "not checked (local: no one-edge removal passes; pairs not checked)" if local else
                "no verdict (the circuit fails its own criterion and no subset passes)")
    return "irreducible" if irreducible else "reducible"


def local_words(report: dict) -> str:
    """What a local check found, after irreducibility_words(..., local=True, brief=True): the
    removals that pass (or that none does), and the greedy reduction's outcome."""
    removable, pairs = report["removable_edges"], report.get("pairs_checked", True)
    n, checked = report["n_edges"], report.get("removals_checked", report["n_edges"])
    of = f"{n}" if checked == n else f"the first {checked:,} of {n:,}"
    if report["irreducible"] is not False and checked < n:
        words = f"; no verdict (none of {of} one-edge removals passes; pairs not checked)"
    elif report["irreducible"] is not False:
        words = "; 1-minimal (no edge or pair can go)" if pairs else \
            "; 1-minimal (no edge can go; pairs not checked)"
    elif removable:
        words = (f": {len(removable)} of {of} edges can go one at a time "
                 f"({', '.join(removable[:3])}{', ...' if len(removable) > 3 else ''})")
    else:
        words = f": pairs can go together ({report['removable_pairs'][:3]})"
    if "greedy_subset" in report:
        words += (f"; greedy reduction: a passing subset of {report['greedy_subset_size']} "
                  f"edges that no edge can leave")
    if "minimal_subset_size" in report:
        words += (f"; every subset of it: a minimal passing subset of "
                  f"{report['minimal_subset_size']} edges (the greedy subset "
                  f"{'is' if report['greedy_subset_minimal'] else 'is not'} minimal)")
    return words


def summary_items(verify: dict) -> list:
    """(label, value) rows that summarise a verify.json for the report page."""
    local = verify.get("mode") == "local"  # one- and two-edge removals only
    singles = local and not verify.get("pairs_checked", True)  # one-edge removals only
    verdict = [("criterion", verify.get("criterion")), ("judged against", verify.get("reference")),
               ("circuit passes it", verify.get("circuit_faithful")),
               ("irreducible", irreducibility_words(verify.get("irreducible"), local, pairs=not singles)),
               ("1-minimal (no edge can go; pairs not checked)" if singles else
                "1-minimal (no edge or pair can go)" if local else "minimal faithful subsets",
                verify.get("one_minimal") if local else verify.get("n_minimal_faithful_subsets"))]
    reductions = []  # what the local check and the greedy reduction found, beside the verdict
    if local and verify.get("removable_edges") is not None:
        checked = verify.get("removals_checked", verify.get("n_edges"))
        reductions.append(("edges that can go one at a time",
                           f"{len(verify['removable_edges'])}/{verify.get('n_edges')}"
                           + (f" (the first {checked} checked)" if checked != verify.get("n_edges") else "")))
    for key, label in (("greedy_subset", "greedy reduction (passes, no edge can leave it)"),
                       ("minimal_subset", "a minimal passing subset (every subset of the greedy "
                                          "one checked)")):
        if verify.get(key):
            reductions.append((label, f"{len(verify[key])} edges: {', '.join(verify[key])}"))
    interactions = [("interacting pairs", "not checked (--singles)")] if singles else [
        ("interacting pairs", f"{verify.get('n_interacting_pairs')}/{len(verify.get('pairs') or [])}"),
        ("median partners", verify.get("partners_median"))]
    interactions += [("rows", verify.get("n_rows")), ("base quantization", verify.get("quantization"))]
    return verdict + reductions + interactions
