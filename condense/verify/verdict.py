"""One wording of a verify report's `irreducible` field, shared by the command line, the HTML
report and the grid table (torch-free, so that the report page can import it)."""
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
