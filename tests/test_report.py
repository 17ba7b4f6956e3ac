"""The run report (condense.report) rendered in a real browser: headless Chromium loads the
page from disk, runs its script, and the DOM it leaves is checked against the run's files:
node and edge counts, metrics, lit paths, no console message at all."""
import gzip
import json
import os
import re
import shutil
import subprocess

import pytest

from condense.report import circuit_data, write_report

ROOT = os.path.join(os.path.dirname(__file__), "..")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# CI installs Chromium (.ci/run) and sets this, so that there a missing browser fails, not skips
REQUIRED = os.environ.get("CONDENSE_REQUIRE_BROWSER") == "1"
needs_browser = pytest.mark.skipif(
    CHROMIUM is None and not REQUIRED,
    reason="no Chromium: apt-get install chromium (CI installs it)")


def render(path, tmp_path, fragment=""):
    """(DOM after the page's script ran, console lines) from headless Chromium."""
    assert CHROMIUM, "CONDENSE_REQUIRE_BROWSER=1 but no chromium on PATH"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", f"--user-data-dir={tmp_path / 'chromium'}", "--enable-logging=stderr",
           "--v=0", "--virtual-time-budget=10000", "--dump-dom",
           "file://" + os.path.abspath(path) + fragment]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return done.stdout, console


def circuit_file(folder):
    for name in ("circuit.json", "circuit.json.gz"):
        path = os.path.join(folder, name)
        if os.path.exists(path):
            with (gzip.open(path, "rt") if name.endswith(".gz") else open(path)) as f:
                return json.load(f)


def count(dom, pattern):
    return len(re.findall(pattern, dom))


def check_page(dom, console, folder):
    """The checks every report passes: script ran, no console output, counts, metrics."""
    assert console == [], console
    assert 'data-ready="1"' in dom
    assert re.search(r'<pre id="errors"></pre>', dom)
    data = circuit_data(circuit_file(folder))
    svg = re.search(r'<svg id="circuit"[^>]*>', dom).group(0)
    assert f'data-edges="{len(data["edges"])}"' in svg
    assert count(dom, r'<g class="node on[" ]') == len(data["nodes"])
    with open(os.path.join(folder, "metrics.json")) as f:
        metrics = json.load(f)
    shown = dict(re.findall(r'data-key="(\w+)" data-value="([^"]*)"', dom))
    if "edges" in metrics:
        assert shown["edges"] == repr(metrics["edges"])
    assert shown  # some metric is on the page
    for key, value in shown.items():
        if key != "baseline_edges":
            assert float(value) == pytest.approx(metrics[key], rel=1e-12), key
    return data


def check_run_report(out, tmp_path):
    """The report a run wrote at its end: rendered in Chromium when there is one (other
    method's tests call this on their own run folders)."""
    page = os.path.join(out, "report.html")
    assert os.path.getsize(page) > 0
    if CHROMIUM is None and not REQUIRED:
        return None
    dom, console = render(page, tmp_path, "#edges=all")
    data = check_page(dom, console, out)
    assert count(dom, r'<line [^>]*class="edge[" ]') == len(data["edges"])
    return dom


@needs_browser
def test_report_of_a_smollm2_eap_ig_run(tmp_path):
    folder = os.path.join(ROOT, "checkpoints", "eap_ig_smollm2_ioi")
    page = write_report(folder, out=str(tmp_path / "report.html"))
    dom, console = render(page, tmp_path)
    data = check_page(dom, console, folder)
    assert len(data["edges"]) == 7451
    assert count(dom, r'<line [^>]*class="edge[" ]') == 1000  # strongest first, not all at once
    assert "showing 1,000 of 7,451 edges" in dom
    dom, console = render(page, tmp_path, "#edges=all")
    assert console == [] and count(dom, r'<line [^>]*class="edge[" ]') == 7451
    draw_ms = float(re.search(r'data-draw-ms="([\d.]+)"', dom).group(1))
    assert draw_ms < 3000, draw_ms


@needs_browser
def test_report_of_20000_edges_stays_responsive(tmp_path):
    """A circuit of 20,000 edges (EAP-IG's scores, top 20,000 kept) draws all of them."""
    circuit = circuit_file(os.path.join(ROOT, "checkpoints", "eap_ig_smollm2_ioi"))
    top = sorted(circuit["edges"], key=lambda k: -abs(circuit["edges"][k]["score"]))[:20000]
    keep = set(top)
    for name, e in circuit["edges"].items():
        e["in_graph"] = name in keep
    run = tmp_path / "run"
    run.mkdir()
    (run / "circuit.json").write_text(json.dumps(circuit))
    (run / "metrics.json").write_text(json.dumps({"edges": 20000, "total_edges": 123211}))
    dom, console = render(write_report(str(run)), tmp_path, "#edges=all")
    check_page(dom, console, str(run))
    assert count(dom, r'<line [^>]*class="edge[" ]') == 20000
    assert float(re.search(r'data-draw-ms="([\d.]+)"', dom).group(1)) < 5000


@needs_browser
def test_report_of_the_shipped_smollm2_c1_lights_a_nodes_paths(tmp_path):
    folder = os.path.join(ROOT, "checkpoints", "condense_smollm2_ioi")
    page = write_report(folder, out=str(tmp_path / "report.html"))
    data = circuit_data(circuit_file(folder))
    node = next(n for n in data["nodes"] if n.startswith("a"))
    dom, console = render(page, tmp_path, f"#node={node}")
    check_page(dom, console, folder)
    assert count(dom, r'<line [^>]*class="edge[" ]') == len(data["edges"])  # under 1,000: all drawn
    assert f'data-focus="{node}"' in dom
    # what the page lights: every edge on a path from input through the node to logits
    down, up = {}, {}
    for s, r, _, _ in data["edges"]:
        down.setdefault(r, []).append(s)
        up.setdefault(s, []).append(r)
    lit = set()
    for graph, forward in ((down, False), (up, True)):
        stack, seen = [node], {node}
        while stack:
            n = stack.pop()
            for m in graph.get(n, []):
                lit.add((n, m) if forward else (m, n))
                if m not in seen:
                    seen.add(m)
                    stack.append(m)
    assert lit and count(dom, r'class="edge lit"') == len(lit)
    assert "EAP-IG smallest faithful circuit" in dom  # the baseline beside it is found


@needs_browser
def test_report_of_an_organism_condensation_with_verify_and_explain(tmp_path):
    """A condensation run on the organism, verified and explained: the run writes its report,
    verify and explain refresh it with their pictures and hover cards."""
    from condense.explain.run import main as explain_main
    from condense.runs import load_config, run
    from condense.verify.run import verify_run

    from .conftest import write_recipe
    out = str(tmp_path / "c1")
    recipe = write_recipe(str(tmp_path), method="condense", model=os.path.join(ROOT, "checkpoints", "organism"),
                          task="ioi", n_train=16, n_val=16, n_test=16, ig_steps=1, batch_size=16,
                          heal_steps=4, heal_batch_size=8, lora_rank=2, n_general=4, threads=1,
                          gate_accuracy_tol=1.0, gate_empty_fails=False, gate_ppl_ratio=10.0,
                          max_rounds=12, report_to="none", fidelity=False)
    run(load_config(recipe, [f"output_dir={out}"]))
    page = os.path.join(out, "report.html")
    dom, console = render(page, tmp_path)
    check_page(dom, console, out)
    assert "Not verified yet" in dom and "Rounds: circuit size" in dom
    rounds_svg = re.search(r"<svg(?:(?!</svg>).)*Rounds: circuit size.*?</svg>", dom, re.S).group(0)
    assert ">top-1 agreement<" in rounds_svg  # each round's, from rounds.jsonl
    verify_run(out, n=16, progress=False)
    assert explain_main([out, "--n-contexts", "4", "--n-task", "8", "--n-general", "4"]) == 0
    dom, console = render(page, tmp_path, "#edges=all")
    data = check_page(dom, console, out)
    assert count(dom, r'<line [^>]*class="edge[" ]') == len(data["edges"])
    assert 'id="subset-histogram"' in dom and 'id="pair-heatmap"' in dom
    assert "interacting pairs" in dom
    payload = json.loads(re.search(r'<script type="application/json" id="report-data">(.*?)</script>',
                                   dom, re.S).group(1).replace("<\\/", "</"))
    with open(os.path.join(out, "verify.json")) as f:
        verify = json.load(f)
    assert set(payload["partners"]) == set(verify["edges"])
    for edge, partners in payload["partners"].items():  # the hover card's list is verify's count
        assert len(partners) == verify["partners"][edge]
    assert set(payload["cards"]) <= set(data["nodes"]) and payload["cards"]
    assert any(line.startswith("WeightLens") for card in payload["cards"].values() for line in card)
