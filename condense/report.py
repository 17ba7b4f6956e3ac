"""One self-contained HTML page per run folder: `condense report RUN_DIR` writes report.html.

    condense report RUN_DIR [--out DIR|FILE.html] [--edges N]

The page holds everything inline (SVG; CSS and script from condense/report_assets/; no network
access): the command
and resolved recipe, headline metrics beside the original model's, the circuit laid out by
layer (input at the bottom, logits at the top, each layer's heads then its MLP; edge width by
|score|; q/k/v receivers in their own colours), hover cards for nodes (S3martCirc role,
WeightLens tokens, CircuitLens clusters) and edges (score, verify's interaction partners), a
click on a node to highlight its paths to input and logits, then the run's curves (rounds or
training steps, the faithfulness curve), the verifier's pictures, and links to the raw files.

Every run writes it at its end; verify and explain refresh it. Large circuits (tens of
thousands of edges) draw their strongest `--edges` edges first, with a control for more.
`report.html#edges=all` opens with every edge drawn, `#node=a9.h6` with a node's paths lit.
"""
from __future__ import annotations

import argparse
import html
import json
import math
import os
import sys
from typing import Optional

from condense.artifacts import atomic_write, damaged, read_json, read_jsonl, read_text
from condense.verify.verdict import summary_items

DEFAULT_SHOWN_EDGES = 1000
# metrics.json's numbers that are finite in every finished run (faithfulness and ppl_ratio may
# be NaN by design: no logit difference to compare, no text): NaN there is a damaged file
METRICS_FINITE = ("edges", "accuracy", "logit_diff")
KIND_COLOURS = {"q": "#2f6fdf", "k": "#1a9a50", "v": "#e07b00", "": "#666666"}


# ---------------------------------------------------------------- reading the folder
def _read_json(path: str, finite=()):
    """The checked JSON of `path` (condense.artifacts.read_json: a damaged file fails in one
    line naming it), None when there is none."""
    if not os.path.exists(path):
        return None
    return read_json(path, finite=finite)


def _read_jsonl(path: str) -> list:
    """A JSON Lines log's records (a cut-off last line dropped with a warning), [] if none."""
    if not os.path.exists(path):
        return []
    return read_jsonl(path)


def circuit_path(run_dir: str) -> Optional[str]:
    for name in ("circuit.json", "circuit.json.gz"):
        if os.path.exists(os.path.join(run_dir, name)):
            return os.path.join(run_dir, name)
    return None


def split_edge(name: str) -> tuple:
    """'a3.h1->a5.h2<q>' -> ('a3.h1', 'a5.h2', 'q'); 'm0->logits' -> ('m0', 'logits', '')."""
    sender, receiver = name.split("->")
    kind = ""
    if receiver.endswith(">"):
        receiver, kind = receiver[:-1].split("<")
    return sender, receiver, kind


def circuit_data(circuit: dict) -> dict:
    """The circuit's in-graph edges, strongest |score| first, and the nodes they touch."""
    edges = [(name, e["score"]) for name, e in circuit["edges"].items() if e["in_graph"]]
    edges.sort(key=lambda item: -abs(item[1] or 0.0))
    rows = []
    touched = set()
    for name, score in edges:
        s, r, kind = split_edge(name)
        rows.append([s, r, kind, score])
        touched.update((s, r))
    roles = {n: v["role"] for n, v in circuit.get("nodes", {}).items() if "role" in v}
    neurons = circuit.get("neurons", {})
    by_mlp = {}  # S3martCirc's neuron roles, counted per MLP ("m3.n17" belongs to "m3")
    for name, v in neurons.items():
        counts = by_mlp.setdefault(name.split(".")[0], {})
        counts[v.get("role", "?")] = counts.get(v.get("role", "?"), 0) + 1
    return dict(cfg=circuit.get("cfg", {}), edges=rows, nodes=sorted(touched), roles=roles,
                neurons=sorted(neurons), neuron_roles=by_mlp)


def _explain_cards(explain: Optional[dict]) -> dict:
    """node -> short hover text from explain.json (WeightLens tokens, CircuitLens clusters)."""
    if not explain:
        return {}
    cards = {}
    for name, node in explain.get("nodes", {}).items():
        lines = []
        wl = node.get("weightlens") or {}
        for key, label in (("input", "reads"), ("promoted", "promotes"), ("suppressed", "suppresses")):
            tokens = (wl.get("validated_tokens") or {}).get(key)
            if tokens is None and key != "input":
                tokens = [t["token"] for t in wl.get("output_tokens", [])
                          if t.get("validated") and t.get("sign", "") == ("+" if key == "promoted" else "-")]
            if tokens is None:
                tokens = [t["token"] for t in wl.get("ov_input", []) if t.get("validated")]
            if tokens:
                lines.append(f"WeightLens {label}: " + ", ".join(repr(t) for t in tokens[:8]))
        for c in (node.get("circuitlens") or {}).get("clusters", [])[:3]:
            text = (c.get("top_contexts") or [{}])[0].get("text", "")
            lines.append(f"CircuitLens cluster of {c.get('size')}: …{text[-60:]}")
        if node.get("description"):
            lines.append(str(node["description"]))
        cards[name] = lines
    return cards


def interaction_partners(verify: Optional[dict]) -> dict:
    """edge -> the edges it interacts with (verify's pairs), strongest first."""
    if not verify:
        return {}
    partners = {}
    for p in sorted(verify.get("pairs") or [], key=lambda p: -abs(p["interaction"])):
        if p.get("interacts"):
            partners.setdefault(p["edge_i"], []).append(p["edge_j"])
            partners.setdefault(p["edge_j"], []).append(p["edge_i"])
    for e in verify.get("edges") or []:
        partners.setdefault(e, [])
    return partners


def collect(run_dir: str) -> dict:
    """Everything the page shows, from the files in `run_dir` (missing files are skipped)."""
    import yaml
    join = lambda name: os.path.join(run_dir, name)  # noqa: E731
    from condense.graph import check_circuit_json
    recipe_text = read_text(join("recipe.yaml")) if os.path.exists(join("recipe.yaml")) else ""
    try:
        recipe = (yaml.safe_load(recipe_text) or {}) if recipe_text else {}
    except yaml.YAMLError as e:
        raise damaged(join("recipe.yaml"), f"not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(recipe, dict):
        raise damaged(join("recipe.yaml"), "not a recipe (a YAML mapping of keys)")
    path = circuit_path(run_dir)
    circuit = None
    if path:
        circuit = _read_json(path)
        check_circuit_json(circuit, path)
        circuit = circuit_data(circuit)
    metrics = _read_json(join("metrics.json"), finite=METRICS_FINITE) or {}
    if not isinstance(metrics, dict):
        raise damaged(join("metrics.json"), "not a JSON object of metrics")
    verify = _read_json(join("verify.json"))
    explain = _read_json(join("explain.json"))
    fidelity = _read_json(join("fidelity.json"))
    return dict(fidelity=fidelity,
        name=os.path.basename(os.path.normpath(run_dir)), recipe_text=recipe_text, recipe=recipe,
        metrics=metrics, circuit=circuit, circuit_file=os.path.basename(path) if path else None,
        rounds=_read_jsonl(join("rounds.jsonl")), training=_read_jsonl(join("training.jsonl")),
        verify=verify, explain_cards=_explain_cards(explain), runtime=_read_json(join("runtime.json")),
        baseline=_baseline_edges(run_dir, recipe),
        files=sorted(f for f in os.listdir(run_dir)  # not the lock, nor a write under way
                     if os.path.isfile(join(f)) and f != "report.html" and not f.startswith(".")))


def _baseline_edges(run_dir: str, recipe: dict) -> Optional[dict]:
    """EAP-IG's smallest faithful circuit for the same model and task, when a run of it sits
    beside this one (checkpoints/eap_ig_<model>_<task>)."""
    from condense.models import model_tag
    if not recipe.get("model") or not recipe.get("task") or recipe.get("method") == "eap_ig":
        return None
    folder = os.path.join(os.path.dirname(os.path.normpath(run_dir)),
                          f"eap_ig_{model_tag(recipe['model'])}_{recipe['task']}")
    m = _read_json(os.path.join(folder, "metrics.json"))
    if not m or "edges" not in m:
        return None
    # that run's base is full precision (its folder name has no quantization tag)
    note = " (full-precision base)" if recipe.get("quantization") else ""
    return dict(edges=m["edges"], folder=os.path.relpath(folder, run_dir), note=note)


# ---------------------------------------------------------------- pieces of the page
HEADLINE = [  # (label, metrics key, the original model's key)
    ("edges", "edges", "total_edges"),
    ("nodes", "size", None),
    ("accuracy", "accuracy", ("accuracy_original", "accuracy_full")),
    ("logit difference", "logit_diff", ("logit_diff_original", "logit_diff_full")),
    ("faithfulness", "faithfulness", None),
    ("KL to the original", "kl", None),
    ("top-1 agreement", "top1_agreement", None),
    ("answer-or-distractor agreement", "choice_agreement", None),
    ("perplexity ratio", "ppl_ratio", None),
]


def _fmt(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != value:
            return "NaN"
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return html.escape(str(value))


def headline_rows(metrics: dict, baseline: Optional[dict]) -> list:
    """[(label, key, this run's value, the original model's value)] for what the run has."""
    rows = []
    for label, key, original in HEADLINE:
        if key not in metrics:
            continue
        keys = original if isinstance(original, tuple) else (original,)
        orig = next((metrics[k] for k in keys if k and k in metrics), None)
        rows.append((label, key, metrics[key], orig))
    if baseline is not None:
        rows.append(("EAP-IG smallest faithful circuit" + baseline.get("note", ""), "baseline_edges",
                     baseline["edges"], None))
    return rows


def metrics_table(metrics: dict, baseline: Optional[dict]) -> str:
    cells = "".join(
        f'<tr><th>{html.escape(label)}</th><td class="metric" data-key="{key}" '
        f'data-value="{html.escape(repr(value))}">{_fmt(value)}</td><td>{_fmt(orig)}</td></tr>'
        for label, key, value, orig in headline_rows(metrics, baseline))
    if not cells:
        return "<p>No metrics.json in this folder.</p>"
    return (f'<table class="metrics"><tr><th></th><th>this run</th><th>original model</th></tr>'
            f"{cells}</table>")


def _polyline(points, colour, dash="") -> str:
    pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    extra = f' stroke-dasharray="{dash}"' if dash else ""
    return f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="1.6"{extra}/>'


def line_chart(title: str, xs: list, series: list, *, log_y_first=False, x_label="",
               markers: Optional[list] = None, log_x=False, width=640, height=260) -> str:
    """An inline SVG chart. `series`: [(label, ys, colour, axis)] with axis "left" or "right"
    (right: 0..1). `markers`: per-x True/False (accepted / rejected) drawn on the first series."""
    if not xs:
        return ""
    pad_l, pad_r, pad_t, pad_b = 56, 48, 26, 34
    fx = (lambda v: math.log10(max(v, 1e-9))) if log_x else float
    x0, x1 = min(map(fx, xs)), max(map(fx, xs))
    x1 = x1 if x1 > x0 else x0 + 1
    sx = lambda v: pad_l + (fx(v) - x0) / (x1 - x0) * (width - pad_l - pad_r)  # noqa: E731
    parts = [f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}">',
             f'<text x="{pad_l}" y="16" class="title">{html.escape(title)}</text>']
    left = [ys for _, ys, _, axis in series if axis == "left"]
    lvals = [y for ys in left for y in ys if y is not None]
    ly = lambda v: v  # noqa: E731
    if lvals and log_y_first:
        ly = lambda v: math.log10(max(v, 1e-9))  # noqa: E731
    lo, hi = (min(map(ly, lvals)), max(map(ly, lvals))) if lvals else (0, 1)
    hi = hi if hi > lo else lo + 1
    inner = height - pad_t - pad_b
    syl = lambda v: pad_t + (1 - (ly(v) - lo) / (hi - lo)) * inner  # noqa: E731
    syr = lambda v: pad_t + (1 - v) * inner  # noqa: E731
    parts.append(f'<rect x="{pad_l}" y="{pad_t}" width="{width - pad_l - pad_r}" height="{inner}" '
                 f'fill="none" stroke="#ccc"/>')
    if lvals:
        for frac in (0, 0.5, 1):
            v = lo + frac * (hi - lo)
            label = f"{10 ** v:,.0f}" if log_y_first else f"{v:.3g}"
            parts.append(f'<text x="{pad_l - 4}" y="{syl(10 ** v if log_y_first else v) + 4:.1f}" '
                         f'class="tick" text-anchor="end">{label}</text>')
    if any(axis == "right" for *_, axis in series):
        for v in (0, 0.5, 1):
            parts.append(f'<text x="{width - pad_r + 4}" y="{syr(v) + 4:.1f}" class="tick">{v:g}</text>')
    for v in (xs[0], xs[len(xs) // 2], xs[-1]):
        parts.append(f'<text x="{sx(v):.1f}" y="{height - pad_b + 14}" class="tick" '
                     f'text-anchor="middle">{_fmt(v)}</text>')
    parts.append(f'<text x="{(width) / 2:.0f}" y="{height - 4}" class="tick" '
                 f'text-anchor="middle">{html.escape(x_label)}</text>')
    legend_x = pad_l + 8
    for label, ys, colour, axis in series:
        sy = syl if axis == "left" else syr
        pts = [(sx(x), sy(y)) for x, y in zip(xs, ys) if y is not None and y == y]
        parts.append(_polyline(pts, colour))
        parts.append(f'<text x="{legend_x}" y="{pad_t + 14}" class="tick" fill="{colour}">'
                     f'{html.escape(label)}</text>')
        legend_x += 10 + 7 * len(label)
    if markers is not None and series:
        _, ys, _, axis = series[0]
        sy = syl if axis == "left" else syr
        for x, y, ok in zip(xs, ys, markers):
            if y is None:
                continue
            cls = "accepted" if ok else "rejected"
            parts.append(f'<circle class="{cls}" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4">'
                         f'<title>{"accepted" if ok else "rejected"}: {_fmt(y)}</title></circle>')
    parts.append("</svg>")
    return "".join(parts)


def rounds_chart(rounds: list) -> str:
    if not rounds:
        return ""
    xs = [r["round"] for r in rounds]
    series = [("edges (log)", [r.get("edges") for r in rounds], "#333", "left"),
              ("accuracy", [r.get("accuracy") for r in rounds], "#2f6fdf", "right")]
    if any(r.get("faithfulness") is not None for r in rounds):
        series.append(("faithfulness", [min(max(r.get("faithfulness") or 0, 0), 1) for r in rounds],
                       "#e07b00", "right"))
    if any(r.get("top1_agreement") is not None for r in rounds):
        series.append(("top-1 agreement", [r.get("top1_agreement") for r in rounds], "#8a3fbf", "right"))
    return line_chart("Rounds: circuit size and gate metrics (filled: accepted, red: rejected)",
                      xs, series, log_y_first=True, x_label="round",
                      markers=[bool(r.get("accepted")) for r in rounds])


def training_chart(history: list) -> str:
    if not history or "step" not in history[0]:
        return ""
    xs = [h["step"] for h in history]
    series = []
    for key, colour in (("kl", "#333"), ("loss", "#999")):
        if key in history[0]:
            series.append((key, [h.get(key) for h in history], colour, "left"))
    for key, colour in (("sparsity", "#2f6fdf"), ("target", "#e07b00"), ("accuracy", "#1a9a50")):
        if key in history[0]:
            series.append((key, [h.get(key) for h in history], colour, "right"))
    return line_chart("Training steps", xs, series, x_label="step")


def faithfulness_chart(metrics: dict) -> str:
    curve = metrics.get("curve_absolute") or metrics.get("curve")
    if not isinstance(curve, dict) or "edges" not in curve or "faithfulness" not in curve:
        return ""
    pairs = [(e, f) for e, f in zip(curve["edges"], curve["faithfulness"]) if e and e > 0]
    if not pairs:
        return ""
    xs, ys = [e for e, _ in pairs], [min(max(f, 0), 1.2) / 1.2 for _, f in pairs]
    return line_chart("Faithfulness of the top-n circuits by |score| (right axis: f / 1.2)",
                      xs, [("faithfulness", ys, "#e07b00", "right")], log_x=True,
                      x_label="edges (log)")


def subset_histogram(verify: dict) -> str:
    sizes = verify.get("faithful_subset_sizes") or {}
    by_size = verify.get("faithfulness_by_size") or {}
    if not by_size:
        return ""
    keys = sorted(by_size, key=int)
    width, height, pad = 640, 220, 40
    total = max(by_size[k]["subsets"] for k in keys) or 1
    bw = (width - 2 * pad) / len(keys)
    parts = [f'<svg class="chart" id="subset-histogram" width="{width}" height="{height}">',
             f'<text x="{pad}" y="16" class="title">Subsets by size: all (grey) and passing the '
             f'criterion (green)</text>']
    for i, k in enumerate(keys):
        n_all, n_ok = by_size[k]["subsets"], int(sizes.get(k, by_size[k].get("faithful", 0)))
        h_all = (height - 2 * pad) * n_all / total
        h_ok = (height - 2 * pad) * n_ok / total
        x = pad + i * bw
        parts.append(f'<rect x="{x + 1:.1f}" y="{height - pad - h_all:.1f}" width="{bw - 2:.1f}" '
                     f'height="{h_all:.1f}" fill="#ddd"><title>size {k}: {n_all} subsets</title></rect>')
        parts.append(f'<rect x="{x + 1:.1f}" y="{height - pad - h_ok:.1f}" width="{bw - 2:.1f}" '
                     f'height="{h_ok:.1f}" fill="#1a9a50"><title>size {k}: {n_ok} pass</title></rect>')
        if len(keys) <= 24 or i % 2 == 0:
            parts.append(f'<text x="{x + bw / 2:.1f}" y="{height - pad + 14}" class="tick" '
                         f'text-anchor="middle">{k}</text>')
    parts.append("</svg>")
    return "".join(parts)


def pair_heatmap(verify: dict) -> str:
    edges, pairs = verify.get("edges") or [], verify.get("pairs") or []
    if not edges or not pairs:
        return ""
    n = len(edges)
    cell = max(8, min(28, 420 // n))
    pad = 12
    size = pad * 2 + cell * n
    top = max((abs(p["interaction"]) for p in pairs), default=1.0) or 1.0
    parts = [f'<svg class="chart" id="pair-heatmap" width="{size + 260}" height="{size + 24}">',
             f'<text x="{pad}" y="14" class="title">Pair interactions |Δij − Δi − Δj| '
             f'(darker: stronger; outlined: interacts)</text>']
    for p in pairs:
        for i, j in ((p["i"], p["j"]), (p["j"], p["i"])):
            shade = int(255 - 200 * min(abs(p["interaction"]) / top, 1))
            stroke = ' stroke="#c00"' if p.get("interacts") else ""
            parts.append(f'<rect x="{pad + j * cell}" y="{24 + i * cell}" width="{cell - 1}" '
                         f'height="{cell - 1}" fill="rgb({shade},{shade},255)"{stroke}><title>'
                         f'{html.escape(p["edge_i"])} × {html.escape(p["edge_j"])}: '
                         f'{p["interaction"]:.3g}</title></rect>')
    for i, e in enumerate(edges):
        parts.append(f'<text x="{pad + n * cell + 6}" y="{24 + i * cell + cell * 0.7:.1f}" '
                     f'class="tick">{i}: {html.escape(e)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def verify_summary(verify: dict) -> str:
    if not verify:
        return ('<p>Not verified yet: <code>condense verify RUN_DIR</code> (circuits up to 20 '
                'edges; <code>--local</code> for any size) adds subsets, pairs and their '
                'pictures here.</p>')
    items = summary_items(verify)
    cells = "".join(f"<tr><th>{k}</th><td>{_fmt(v)}</td></tr>" for k, v in items)
    return f'<table class="metrics" id="verify-summary">{cells}</table>'


# ---------------------------------------------------------------- the page
ASSETS = os.path.join(os.path.dirname(__file__), "report_assets")


def _asset(name: str) -> str:
    """page.css or page.js, inlined into every page (the page fetches nothing)."""
    with open(os.path.join(ASSETS, name)) as f:
        return f.read()


def _rate(entry) -> str:
    """A rate with its 95 % interval ('0.905 [0.857, 0.938]'), or a plain value."""
    if entry is None:
        return "–"
    if isinstance(entry, dict) and "interval" in entry:
        low, high = entry["interval"]
        return f"{_fmt(entry['value'])} [{_fmt(low)}, {_fmt(high)}]"
    return _fmt(entry)


def fidelity_section(card: Optional[dict]) -> str:
    """The fidelity card (condense.fidelity): how much of the circuit the original carries."""
    if not card:
        return ("<p>No fidelity.json: <code>condense fidelity RUN</code> measures how much of this "
                "circuit the original model carries.</p>")
    s = card.get("summary", {})
    rows = [
        ("rows (test; where the original errs)", f"{s.get('rows', '–')}; "
         f"{(card.get('distribution') or {}).get('original_errors', {}).get('rows', '–')}"),
        ("choice agreement with the original", _rate(s.get("choice_agreement"))),
        ("top-1 agreement with the original", _rate(s.get("top1_agreement"))),
        ("KL to the original", _rate(s.get("kl"))),
        ("original's errors the circuit repeats", _rate(s.get("errors_repeated"))),
        ("paraphrases: accuracy (original)", f"{_rate(s.get('paraphrase_accuracy'))} "
         f"({_rate(s.get('paraphrase_accuracy_original'))})"),
        ("adapter off: faithfulness", _rate(s.get("adapter_off_faithfulness"))),
        ("adapter off: accuracy", _rate(s.get("adapter_off_accuracy"))),
        ("frozen completion (edges; ranked edges added)",
         f"{_fmt(s.get('completion_edges'))}; {_fmt(s.get('completion_added'))}"),
        ("circuit heads among the original's top heads",
         _fmt((s.get("circuit_heads_in_top") or {}).get("share"))),
        ("share of the adapter's change on circuit nodes", _fmt(s.get("adapter_circuit_share"))),
        ("full model: worst task (accuracy drop)",
         f"{_fmt(s.get('full_model_worst_task'))} ({_fmt(s.get('full_model_max_drop'))})"),
        ("full model: second-source perplexity ratio (gate's)",
         f"{_rate(s.get('text_ppl_ratio'))} ({_fmt(s.get('gate_ppl_ratio'))})"),
    ]
    table = "".join(f"<tr><th>{html.escape(k)}</th><td>{v}</td></tr>" for k, v in rows)
    flags = card.get("flags") or []
    flagged = ("<ul class='flags'>" + "".join(f"<li>{html.escape(f)}</li>" for f in flags) + "</ul>"
               if flags else "<p>No flags.</p>")
    tasks_rows = ""
    fm = card.get("full_model") or {}
    for task, v in (fm.get("tasks") or {}).items():
        if "accuracy" in v:
            tasks_rows += (f"<tr><th>{html.escape(task)}</th><td>{_rate(v['accuracy'])}</td>"
                           f"<td>{_rate(v['accuracy_original'])}</td><td>{_rate(v['kl'])}</td>"
                           f"<td>{'broken' if v['broken'] else ''}</td></tr>")
    tasks_table = (f"<table class='metrics'><tr><th>task</th><th>healed full model</th><th>original</th>"
                   f"<th>KL</th><th></th></tr>{tasks_rows}</table>" if tasks_rows else "")
    return (f"<table class='metrics' id='fidelity'>{table}</table>{flagged}{tasks_table}"
            "<p>Every rate with its 95 % interval (Wilson for proportions, bootstrap over rows "
            "otherwise); docs/fidelity.md says how each is measured.</p>")


def render(data: dict, shown_edges: int = DEFAULT_SHOWN_EDGES) -> str:
    """The page for `data` (collect's)."""
    m, c = data["metrics"], data["circuit"]
    recipe = data["recipe"]
    method = recipe.get("method") or m.get("method") or "?"
    title = f"{data['name']}: {method} on {recipe.get('task', m.get('task', '?'))}, {recipe.get('model', m.get('model', '?'))}"
    command = f"condense run --recipe {data['name']}/recipe.yaml"
    first = data["recipe_text"].splitlines()[0] if data["recipe_text"] else ""
    if first.startswith("# condense run"):
        command = first[2:]
    n_edges = len(c["edges"]) if c else 0
    shown = min(shown_edges, n_edges)
    options = sorted({v for v in (100, 250, 1000, 5000, 20000) if v < n_edges} | {shown, n_edges})
    payload = dict(
        circuit=c, shown=shown, colours=KIND_COLOURS,
        roles=(c or {}).get("roles", {}), cards=data["explain_cards"],
        partners=interaction_partners(data["verify"]))
    blob = json.dumps(payload, separators=(",", ":")).replace("</", "<\\/")
    legend = "".join(f'<span><i style="background:{col}"></i>{label}</span>' for label, col in
                     (("→ query", KIND_COLOURS["q"]), ("→ key", KIND_COLOURS["k"]),
                      ("→ value", KIND_COLOURS["v"]), ("→ MLP / logits", KIND_COLOURS[""])))
    sections = [
        f"<h1>{html.escape(title)}</h1>",
        f"<p><code>{html.escape(command)}</code></p>",
        "<h2>Headline</h2>", metrics_table(m, data["baseline"]),
    ]
    if c:
        opts = "".join(f'<option value="{v}">{v:,}</option>' for v in options)
        neurons = (f"<p>{len(c['neurons']):,} neurons carry roles (S3martCirc).</p>"
                   if c["neurons"] else "")
        sections += [
            "<h2>Circuit</h2>",
            f'<p class="legend">{legend} <label>edges (strongest |score| first): '
            f'<select id="edge-limit">{opts}</select></label> <span id="edge-count"></span></p>',
            "<p>Hover a node or an edge for what is known about it; click a node to light its "
            "paths to input and logits (click elsewhere to clear).</p>",
            f'<svg id="circuit" data-edges="{n_edges}" data-nodes="{len(c["nodes"])}"></svg>',
            neurons]
    charts = [rounds_chart(data["rounds"]), training_chart(data["training"]), faithfulness_chart(m)]
    if any(charts):
        sections += ["<h2>Curves</h2>"] + [ch for ch in charts if ch]
    if data.get("fidelity") or m.get("method") == "condense":
        sections += ["<h2>Fidelity to the original</h2>", fidelity_section(data.get("fidelity"))]
    sections += ["<h2>Verification</h2>", verify_summary(data["verify"])]
    if data["verify"]:
        sections += [subset_histogram(data["verify"]), pair_heatmap(data["verify"])]
    sections += [
        "<h2>Recipe</h2>", f"<pre>{html.escape(data['recipe_text'])}</pre>",
        "<h2>Files</h2>",
        "<ul>" + "".join(f'<li><a href="{html.escape(f)}">{html.escape(f)}</a></li>'
                         for f in data["files"]) + "</ul>",
    ]
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_asset('page.css')}</style></head><body>{''.join(sections)}"
            f'<div id="tip"></div><pre id="errors"></pre>'
            f'<script type="application/json" id="report-data">{blob}</script>'
            f"<script>{_asset('page.js')}</script></body></html>")


def write_report(run_dir: str, out: Optional[str] = None,
                 shown_edges: int = DEFAULT_SHOWN_EDGES) -> str:
    """Write `run_dir`/report.html (or `out`); returns its path."""
    path = out or os.path.join(run_dir, "report.html")
    atomic_write(path, render(collect(run_dir), shown_edges))
    return path


def refresh_report(run_dir: str) -> None:
    """Rewrite a run's report after verify or explain changed the folder; a failure is
    printed, never raised (the report must not cost the work that ran before it)."""
    try:
        write_report(run_dir)
    except Exception as e:  # noqa: BLE001 - any failure: say so and keep the run's results
        from condense.artifacts import ArtifactError
        why = str(e) if isinstance(e, ArtifactError) else f"{type(e).__name__}: {e}"
        print(f"[condense] report.html not written: {why}", file=sys.stderr)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="condense report",
                                 description="Write a run folder's self-contained report.html.")
    ap.add_argument("run_dir", help="a run folder (circuit.json, metrics.json, ...)")
    ap.add_argument("--out", default=None, metavar="DIR|FILE",
                    help="write DIR/report.html (or FILE.html) instead of RUN_DIR/report.html "
                         "(a run folder on a read-only mount)")
    ap.add_argument("--edges", type=int, default=DEFAULT_SHOWN_EDGES,
                    help="edges drawn when the page opens (strongest first; the page has a "
                         "control for more); default %(default)s")
    args = ap.parse_args(argv)
    if not os.path.isdir(args.run_dir):
        print(f"condense report: {args.run_dir}: no such folder", file=sys.stderr)
        return 2
    from condense.runs import open_output
    path = report_path(args.run_dir, args.out)
    with open_output(os.path.dirname(path) or "."):  # one writer; a folder it can write
        print(write_report(args.run_dir, path, args.edges))
    return 0


def report_path(run_dir: str, out: Optional[str] = None) -> str:
    """Where the report goes: RUN_DIR/report.html, or `out`: a file (…html) or a folder (DIR/,
    an existing folder, or a name without .html), where it is DIR/report.html."""
    if out is None:
        return os.path.join(run_dir, "report.html")
    if os.path.isdir(out) or out.endswith(os.sep) or not out.lower().endswith((".html", ".htm")):
        return os.path.join(out, "report.html")
    return out


if __name__ == "__main__":  # python -m condense.report is `condense report`
    from condense.cli import module_entry
    module_entry("report")
