"""The documentation's links resolve: every relative link in the README and the doc pages names
a file in the repository and, where it has one, a heading of that page (GitHub's anchors)."""
import re
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]*)(#[^)\s]*)?\)")


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, letters, digits, '-', '_' kept, spaces to '-'."""
    kept = (ch for ch in heading.strip().lower()
            if ch in "-_ " or unicodedata.category(ch)[0] in "LN")
    return "".join(kept).replace(" ", "-")


def headings(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # a '#' comment in code is no heading
    return {anchor(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def test_anchor_matches_github():
    assert anchor("The discovery loss's α on SmolLM2") == "the-discovery-losss-α-on-smollm2"
    assert anchor("Circuits too large to enumerate: `--local`") == "circuits-too-large-to-enumerate---local"


def test_links_resolve():
    broken = []
    for page in PAGES:
        for path, frag in LINK.findall(page.read_text()):
            if path.startswith(("http://", "https://", "mailto:")):
                continue
            target = (page.parent / path).resolve() if path else page
            if not target.exists():
                broken.append(f"{page.relative_to(ROOT)}: {path} (no such file)")
            elif frag and target.suffix == ".md" and frag[1:] not in headings(target):
                broken.append(f"{page.relative_to(ROOT)}: {path}{frag} (no such heading)")
    assert not broken, "\n".join(broken)


def test_links_stay_in_the_repository():
    """The docs stand alone: no link leaves the repository, to the web or to a folder beside it."""
    outside = [f"{page.relative_to(ROOT)}: {path}" for page in PAGES
               for path, _ in LINK.findall(page.read_text())
               if path and (path.startswith(("http://", "https://"))
                            or ROOT not in (page.parent / path).resolve().parents)]
    assert not outside, "\n".join(outside)


def test_readme_python_runs_on_the_organism(tmp_path, monkeypatch):
    """The README's Python example runs as written, with the organism its comment names in place
    of SmolLM2-135M (whose EAP-IG takes minutes on a CPU), and its comments' numbers hold."""
    import torch
    block = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    assert '"smollm2-135m"' in block and "# 123,211 edges (the organism: 479)" in block
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    scope: dict = {}
    exec(block.replace('"smollm2-135m"', repr(str(ROOT / "checkpoints" / "organism"))), scope)
    assert scope["graph"].n_edges == 479
    assert 0 < scope["found"].edges < 479
    assert (tmp_path / "circuit.json").stat().st_size > 0 and (tmp_path / "circuit.png").stat().st_size > 0
