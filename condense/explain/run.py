"""Explain every node of a run's circuit: WeightLens (what it reads and writes, from weights,
checked by single-token forward passes; condense/explain/weightlens.py) and CircuitLens (where it
is active and which upstream nodes drive it there, clustered; condense/explain/circuitlens.py).

    python -m condense.explain checkpoints/<run> [--out DIR] [--z 4] [--z-inherit 3]
                               [--n-contexts 24] [--max-nodes N] [--neurons 8] ...

Reads the run's circuit.json and recipe.yaml (model, tokenizer, task) and loads the model
with the run's adapter when the folder has one (as condense.verify does). Nodes explained:
the heads and MLPs of the circuit (nodes with an in-graph edge), in layer order; with
--max-nodes only the N with the largest circuit importance (sum of |score| of their
in-graph outgoing edges). An MLP node is explained through its top --neurons neurons by
circuit attribution: d LD / d neuron_mask on --n-task rows of the task under the circuit
(attribution patching of each neuron, intervention as in the recipe), ranked by |score|
(ties by the weights); without a task or with --neuron-ranking weights, by the weights
(std over the vocabulary of the neuron's embedding activation times the norm of its
output weights).
Writes `explain.json` (every candidate token with its z-score, validation values and
verdict; contexts, contributors and clusters) and `explain.md` (one section per node) into
the run folder or --out. For IOI circuits the summary also holds the measurement of the
issue: per head, the share of its validated output tokens (promoted and suppressed) that
are IOI names, and whether the circuit's highest-scoring head into `logits` is among the
heads whose share is >= 0.8.

Natural-language descriptions are optional: `--describe module:function` names a function
that receives a node's report (a dict) and returns a string; nothing calls a network by
default.
"""
import argparse
import importlib
import json
import os
import time
from typing import Callable, Optional

import torch

from condense.explain.circuitlens import CircuitLens, CircuitLensConfig
from condense.explain.weightlens import LensConfig, WeightLens, parse_node

DEFAULT_NEUTRAL = "The next word is"


def say(msg: str) -> None:
    """Progress lines, flushed: explain runs for minutes on a real model, often into a log file."""
    print(msg, flush=True)


# ---------------------------------------------------------------- the circuit

def circuit_nodes(graph):
    """[(name, importance)] of the circuit's heads and MLPs in layer order (heads first)."""
    on = graph.in_graph & graph.valid
    present = graph.nodes_in_graph()
    out = []
    for s, name in enumerate(graph.sender_names):
        if name == "input" or not bool(present[s]):
            continue
        out.append((name, float(graph.scores[s][on[s]].abs().sum())))
    return out


def upstream_edges(graph, node):
    """(sender, role) of the circuit's edges into `node` from heads/MLPs (role q/k/v/None)."""
    on = graph.in_graph & graph.valid
    idx = graph.node_index[node]
    out = []
    for r in torch.nonzero(graph.receiver_node == idx).flatten().tolist():
        name = graph.receiver_names[r]
        role = name[-2] if name.endswith(">") else None
        for s in torch.nonzero(on[:, r]).flatten().tolist():
            if s > 0:
                out.append((graph.sender_names[s], role))
    return out


def top_logits_head(graph):
    """The head with the highest |score| in-graph edge into `logits`, or None."""
    r = graph.logits_receiver
    best = None
    for s in torch.nonzero(graph.in_graph[:, r] & graph.valid[:, r]).flatten().tolist():
        name = graph.sender_names[s]
        if name.startswith("a") and (best is None or abs(graph.scores[s, r]) > best[1]):
            best = (name, abs(float(graph.scores[s, r])))
    return best[0] if best else None


def neuron_attribution(model, graph, rows, intervention="patching", batch_size=16, means=None):
    """[L, d_mlp]: mean over rows of d LD / d neuron_mask under the circuit (in_graph)."""
    from condense.evaluate import dataset_columns, row_batches
    from condense.patching import run_graph
    device = next(model.parameters()).device
    cols, n = dataset_columns(rows)
    total = torch.zeros(graph.n_layers, graph.shape.d_mlp)
    for idx, clean, corrupted, mask, last in row_batches(cols, n, batch_size, device):
        nm = torch.ones(graph.n_layers, graph.shape.d_mlp, device=device, requires_grad=True)
        with torch.enable_grad():
            logits = run_graph(model, graph, clean, corrupted, mask, intervention=intervention,
                               neuron_mask=nm, means=means, logit_positions=last).float()
            a = torch.tensor([int(cols["answer_id"][i]) for i in idx], device=device)
            d = torch.tensor([int(cols["distractor_id"][i]) for i in idx], device=device)
            ld = (logits.gather(1, a[:, None]) - logits.gather(1, d[:, None])).sum()
            (g,) = torch.autograd.grad(ld, nm)
        total += g.float().cpu()
    return total / n


def weight_neuron_scores(lens, layer):
    """[d_mlp]: std over the vocabulary of the neuron's embedding activation x ||w_out||."""
    return lens.mlp_hidden(layer, lens.E).std(0) * lens.neuron_writes(layer).norm(dim=-1)


# ---------------------------------------------------------------- explaining

def explain_circuit(model, graph, *, decode=None, neutral_ids, prefix_ids=(), vocab_size=None,
                    task_rows=None, pool=None, nodes=None, max_nodes=None, n_neurons=8,
                    neuron_ranking="attribution", intervention="patching", means=None,
                    lens_config=None, lens_circuit_config=None, describe=None, progress=say,
                    memo: Optional[dict] = None, on_update: Optional[Callable[[], None]] = None):
    """Explanations of the circuit's nodes (`nodes`: names to explain, default all circuit
    nodes). `task_rows`: task rows (clean/corrupted/answer/distractor) for neuron
    attribution (under `intervention`, with `means` for mean ablation: condense.means);
    `pool`: (sequences, sources) for CircuitLens (None: skip CircuitLens).
    `memo` holds what is done ("attribution", and "nodes" by name): what it already holds is
    taken from it, what is made is put into it, and `on_update` is called after each addition
    (so that a caller can save it and a rerun go on)."""
    decode = decode or (lambda ids: " ".join(map(str, ids)))
    memo = {} if memo is None else memo
    done = memo.setdefault("nodes", {})
    imp = dict(circuit_nodes(graph))
    if nodes is None:
        nodes = list(imp)
        if max_nodes is not None:
            keep = set(sorted(nodes, key=lambda n: -imp[n])[:max_nodes])
            nodes = [n for n in nodes if n in keep]
    todo = [n for n in nodes if n not in done]
    if done and progress:
        progress(f"resuming: {len(nodes) - len(todo)} of {len(nodes)} nodes explained before")
    if not todo:
        return {name: done[name] for name in nodes}
    lens = WeightLens(model, graph, neutral_ids, prefix_ids, vocab_size, lens_config)
    for name in nodes:  # in layer order, as explained: what a node inherits is its upstream's
        if name in done:
            lens.remember(name, done[name]["weightlens"])
    attribution = memo.get("attribution")
    if (attribution is None and task_rows is not None and neuron_ranking == "attribution"
            and any(parse_node(n)[0] == "mlp" for n in todo)):
        attribution = memo["attribution"] = neuron_attribution(model, graph, task_rows, intervention,
                                                               means=means)
        if on_update:
            on_update()
    circuit_edges = [e.name for e in graph.edges.values() if e.in_graph]
    clens = None
    if pool is not None:
        clens = CircuitLens(model, graph, pool[0], pool[1], decode, lens_circuit_config, todo)
    for name in todo:
        start = time.perf_counter()
        kind, l, _ = parse_node(name)
        up = upstream_edges(graph, name)
        if kind == "attention":
            wl = lens.explain_head(name, up, progress=progress)
        else:
            w = weight_neuron_scores(lens, l)
            if attribution is not None and neuron_ranking == "attribution":
                sc, how = attribution[l], ("circuit attribution (d LD / d neuron mask), |score| "
                                           "(ties: weights)")
            else:
                sc, how = w, "weights (embedding activation std x ||w_out||)"
            order = sorted(range(sc.numel()), key=lambda i: (-abs(float(sc[i])), -float(w[i])))
            top = order[:n_neurons]
            wl = lens.explain_mlp(name, top, up, progress=progress)
            wl["neuron_selection"] = how
            for r in wl["neurons"]:
                r["selection_score"] = float(sc[r["neuron"]])
        _label(wl, decode)
        node = dict(name=name, importance=imp.get(name, 0.0),
                    upstream=[f"{u}<{r}>" if r else u for u, r in up], weightlens=wl)
        if clens is not None:
            node["circuitlens"] = clens.explain(name, circuit_edges)
        node["description"] = describe(node) if describe else None
        done[name] = node
        if on_update:
            on_update()
        if progress:
            v = wl["validated"]
            progress(f"{name}: {len(v['input'])} inputs, {len(v['promoted'])}+/{len(v['suppressed'])}- "
                     f"outputs validated{' (context-dependent)' if wl['context_dependent'] else ''}; "
                     f"{time.perf_counter() - start:.1f}s")
    return {name: done[name] for name in nodes}


def _label(obj, decode):
    """Add readable token text next to every token id of a WeightLens report."""
    if isinstance(obj, dict):
        for k in ("id", "tested_with"):
            if obj.get(k) is not None and isinstance(obj[k], int):
                obj["token" if k == "id" else "tested_with_token"] = decode([obj[k]])
        if "validated" in obj and isinstance(obj["validated"], dict):
            obj["validated_tokens"] = {k: [decode([t]) for t in v] for k, v in obj["validated"].items()}
        for v in list(obj.values()):
            if isinstance(v, (dict, list)):
                _label(v, decode)
    elif isinstance(obj, list):
        for v in obj:
            _label(v, decode)


def name_fractions(nodes, names):
    """Per head: share of its validated output tokens (promoted + suppressed, and each alone)
    whose text (stripped) is in `names`."""
    names = set(names)
    out = {}
    for name, node in nodes.items():
        wl = node["weightlens"]
        if wl["kind"] != "attention":
            continue
        vt = wl["validated_tokens"]
        row = {}
        for key, toks in (("all", vt["promoted"] + vt["suppressed"]), ("promoted", vt["promoted"]),
                          ("suppressed", vt["suppressed"])):
            hit = sum(t.strip() in names for t in toks)
            row[key] = dict(n=len(toks), names=hit, fraction=hit / len(toks) if toks else None)
        out[name] = row
    return out


# ---------------------------------------------------------------- the report

def _toks(entries, limit=16):
    items = [f"`{e['token']!r}` (z {e['z']:.1f})" for e in entries[:limit]]
    more = len(entries) - limit
    if not items:
        return "—"
    return ", ".join(items) + (f", … {more} more" if more > 0 else "")


def _outputs(entries, sign):
    return [e for e in entries if e["validated"] and e["sign"] == sign]


def _share(x):
    return "—" if x["fraction"] is None else f"{x['fraction']:.2f} ({x['n']})"


def _names_table(s):
    lines = ["## IOI names among validated output tokens", "",
             "| head | validated outputs | names | share (n) | promoted | suppressed |",
             "|---|---|---|---|---|---|"]
    for h, row in s["ioi_names"].items():
        lines.append(f"| {h} | {row['all']['n']} | {row['all']['names']} | {_share(row['all'])} | "
                     f"{_share(row['promoted'])} | {_share(row['suppressed'])} |")
    verdict = "included" if s["done"] else "NOT included"
    heads = ", ".join(s["name_heads"]) or "none"
    end = (f"Heads with share >= 0.8: {heads}; the highest-scoring head into logits, "
           f"{s['top_logits_head']}, is {verdict}.")
    return lines + ["", end, ""]


def _weightlens_lines(wl):
    if wl["kind"] == "attention":
        ov, outs = wl["ov_input"], wl["output_tokens"]
        rejected = _toks([e for e in ov if not e["validated"]], 8)
        return [f"- OV input tokens, validated: {_toks([e for e in ov if e['validated']])}",
                f"- OV input candidates rejected by validation: {rejected}",
                f"- key tokens, validated: {_toks([e for e in wl['key_tokens'] if e['validated']])}",
                f"- output tokens promoted: {_toks(_outputs(outs, '+'))}",
                f"- output tokens suppressed: {_toks(_outputs(outs, '-'))}",
                f"- output candidates not validated: {_toks([e for e in outs if not e['validated']], 8)}"]
    lines = [f"- neurons chosen by {wl['neuron_selection']}"]
    for r in wl["neurons"]:
        flag = ", context-dependent" if r["context_dependent"] else ""
        inputs = _toks([e for e in r["input_tokens"] if e["validated"]], 8)
        lines.append(f"- **n{r['neuron']}** (score {r['selection_score']:.3g}{flag}): inputs {inputs}; "
                     f"promotes {_toks(_outputs(r['output_tokens'], '+'), 8)}; "
                     f"suppresses {_toks(_outputs(r['output_tokens'], '-'), 8)}")
    return lines


def _circuitlens_lines(cl):
    c, a = cl["clustering"], cl["activation"]
    head = (f"CircuitLens: {len(cl['contexts'])} contexts (activation >= {a['active_threshold']:.3g}, "
            f"the {c['active_quantile']:g} quantile of {a['pool_positions']} positions), "
            f"{len(cl['clusters'])} clusters ({c['algorithm']}, cut {c['cut']:g}).")
    lines = ["", head, ""]
    for k, cluster in enumerate(cl["clusters"]):
        contrib = ", ".join(f"{x['edge']} ({x['fraction']:.0%}{', circuit' if x['in_circuit'] else ''})"
                            for x in cluster["contributors"]) or "—"
        src = ", ".join(f"{name} {n}" for name, n in cluster["sources"].items())
        lines.append(f"{k + 1}. {cluster['size']} contexts ({src}), mean activation "
                     f"{cluster['mean_activation']:.3g}; contributors: {contrib}")
        for t in cluster["top_contexts"]:
            text = t["text"].replace("\n", "⏎").replace("`", "'")
            lines.append(f"    - `{text}` ({t['activation']:.3g})")
    return lines


def markdown(report):
    cfg = report["config"]
    adapter = " + adapter" if report["adapter"] else ""
    intro = (f"model `{report['model']}`{adapter}, task `{report['task']}`; WeightLens z = {cfg['z']}, "
             f"inherited z = {cfg['z_inherit']}; neutral context {cfg['neutral_text']!r}. Definitions: "
             "the docstrings of condense/explain/weightlens.py and condense/explain/circuitlens.py.")
    lines = [f"# Node explanations: {report['run_dir']}", "", intro, ""]
    if "ioi_names" in report["summary"]:
        lines += _names_table(report["summary"])
    for name, node in report["nodes"].items():
        wl = node["weightlens"]
        cd = "; **context-dependent** (nothing validated)" if wl["context_dependent"] else ""
        about = (f"{wl['kind']} node, layer {wl['layer']}; circuit importance {node['importance']:.3g}; "
                 f"circuit inputs from {', '.join(node['upstream']) or 'input only'}{cd}.")
        lines += [f"## {name}", "", about, ""]
        if node.get("description"):
            lines += [f"> {node['description']}", ""]
        lines += _weightlens_lines(wl)
        if node.get("circuitlens"):
            lines += _circuitlens_lines(node["circuitlens"])
        lines.append("")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- a run folder

def load_run(run_dir, model=None, device=None, dtype=None, threads=None, run=None):
    """(run folder, model with the run's adapter, tokenizer, circuit, model name); `run`: the
    folder when read already (condense.runs.read_run)."""
    from condense.runs import read_run
    run = run or read_run(run_dir, "explain")
    net, tokenizer, _ = run.load_model(model, device, dtype, threads)
    return run, net, tokenizer, run.circuit(net), model or run.config.model


STATE_FILE = "explain_state.pt"  # the nodes explained so far, in the output folder until the end


class NodeMemo:
    """The explained nodes (and the neuron attribution) of one explain command, saved after each
    node into `path` so that a rerun of the same command explains only the nodes still to do.
    `key` names the command (run files, model, rows, settings); a file of another key is ignored.
    Nodes are kept as JSON text, as explain.json will hold them."""

    def __init__(self, path: str, key: str, begin: Optional[float] = None):
        from condense.artifacts import TimedResumeFile
        self.file = TimedResumeFile(path, key, every=0.0, label="explain: ", begin=begin)
        state = self.file.load()
        self.memo = {"nodes": json.loads(state.get("nodes", "{}"))}
        if state.get("attribution") is not None:
            self.memo["attribution"] = state["attribution"]

    def save(self) -> None:
        self.file.save(dict(attribution=self.memo.get("attribution"),
                            nodes=json.dumps(self.memo["nodes"])))


def _describer(spec):
    if not spec:
        return None
    module, _, fn = spec.partition(":")
    if not fn:
        raise ValueError(f"--describe {spec!r}: expected module:function")
    return getattr(importlib.import_module(module), fn)


def explain_run(run_dir, *, out_dir=None, z=4.0, z_inherit=3.0, n_contexts=24, max_nodes=None,
                n_neurons=8, neuron_ranking="attribution", split="test", n_task=64, n_general=32,
                block_size=64,
                neutral_text=DEFAULT_NEUTRAL, task=None, model=None, device=None, dtype=None,
                describe=None, seed=0, circuitlens=True, progress=say, threads=None):
    from condense.runs import open_output, read_run
    begin = time.perf_counter()
    run = read_run(run_dir, "explain")
    out = out_dir or run_dir
    # before any model loads: a folder it cannot write (read-only: --out), and one writer
    with open_output(out, reads=run_dir):
        return _explain_run(
            run, run_dir, out, begin, z=z, z_inherit=z_inherit, n_contexts=n_contexts,
            max_nodes=max_nodes, n_neurons=n_neurons, neuron_ranking=neuron_ranking, split=split,
            n_task=n_task, n_general=n_general, block_size=block_size, neutral_text=neutral_text,
            task=task, model=model, device=device, dtype=dtype, describe=describe, seed=seed,
            circuitlens=circuitlens, progress=progress, threads=threads)


def _explain_run(run, run_dir, out, begin, *, z, z_inherit, n_contexts, max_nodes, n_neurons,
                 neuron_ranking, split, n_task, n_general, block_size, neutral_text, task, model,
                 device, dtype, describe, seed, circuitlens, progress, threads):
    from condense import tasks
    from condense.artifacts import atomic_write, write_json
    from condense.evaluate import rows_digest
    from condense.verify.resume import run_state_key
    run, net, tok, graph, model_path = load_run(run_dir, model, device, dtype, threads, run)
    recipe, adapter = run.config, run.adapter
    task = task or recipe.task
    intervention = recipe.intervention

    def decode(ids):
        return tok.decode(list(ids))
    rows = tasks.load_task(task, tok, split, n=n_task, seed=seed) if task else None
    # neuron attribution ablates as the run did: under mean ablation with the run's own means
    means = run.means(net, graph, tok, task) if rows is not None else None
    pool = None
    if circuitlens:
        seqs, sources = [], []
        if rows is not None:
            seqs += [list(r) for r in rows["clean_ids"]]
            sources += ["task"] * len(rows)
        if n_general:
            gen = tasks.general_text(tok, "test", block_size=block_size)
            seqs += [list(x) for x in gen["input_ids"][:n_general]]
            sources += ["general"] * min(n_general, len(gen))
        pool = (seqs, sources)
    neutral = tok.encode(neutral_text, add_special_tokens=False)
    prefix = tasks.prompt_prefix(tok)
    lcfg = LensConfig(z=z, z_inherit=z_inherit, seed=seed)
    ccfg = CircuitLensConfig(n_contexts=n_contexts, seed=seed)
    param = next(net.parameters())
    key = run_state_key(run, model=model_path, device=param.device, dtype=param.dtype, task=task,
                        rows=rows_digest(rows) if rows is not None else None, split=split,
                        n_general=n_general, block_size=block_size, neutral=neutral, prefix=prefix,
                        lens=vars(lcfg), circuitlens=vars(ccfg) if circuitlens else None,
                        max_nodes=max_nodes, n_neurons=n_neurons, neuron_ranking=neuron_ranking,
                        intervention=intervention,
                        describe=getattr(describe, "__qualname__", describe))
    done = NodeMemo(os.path.join(out, STATE_FILE), key, begin)
    nodes = explain_circuit(net, graph, decode=decode, neutral_ids=neutral, prefix_ids=prefix,
                            vocab_size=len(tok), task_rows=rows, pool=pool, max_nodes=max_nodes,
                            n_neurons=n_neurons, neuron_ranking=neuron_ranking,
                            intervention=intervention, means=means, lens_config=lcfg,
                            lens_circuit_config=ccfg, describe=describe, progress=progress,
                            memo=done.memo, on_update=done.save)
    summary = dict(n_nodes=len(nodes), context_dependent=[n for n, v in nodes.items()
                                                          if v["weightlens"]["context_dependent"]],
                   top_logits_head=top_logits_head(graph))
    if task == "ioi":
        names = tasks.word_pools(tok)["names"]
        fr = name_fractions(nodes, names)
        heads = [h for h, row in fr.items() if row["all"]["fraction"] is not None
                 and row["all"]["fraction"] >= 0.8]
        summary.update(ioi_names=fr, name_heads=heads, done=summary["top_logits_head"] in heads)
    report = dict(run_dir=run_dir, model=model_path, adapter=adapter, task=task, split=split,
                  config=dict(z=z, z_inherit=z_inherit, n_contexts=n_contexts, max_nodes=max_nodes,
                              n_neurons=n_neurons, neuron_ranking=neuron_ranking, n_task=n_task,
                              n_general=n_general,
                              block_size=block_size, neutral_text=neutral_text,
                              neutral_ids=neutral, prefix_ids=prefix, seed=seed,
                              lens=vars(lcfg), circuitlens=vars(ccfg) if circuitlens else None),
                  summary=summary, nodes=nodes, seconds=done.file.seconds(), resumed_seconds=done.file.before)
    write_json(os.path.join(out, "explain.json"), report)
    atomic_write(os.path.join(out, "explain.md"), markdown(report))
    done.file.remove()  # explain.json holds every node now
    if os.path.abspath(out) == os.path.abspath(run_dir):
        from condense.report import refresh_report
        refresh_report(run_dir)
    return report


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="condense explain",
        description="Explain the nodes of a run's circuit (WeightLens + CircuitLens); writes "
                    "explain.json and explain.md into the run folder. Interrupted, the same "
                    "command goes on from the nodes already explained.")
    ap.add_argument("run_dir", help="run folder with circuit.json (and recipe.yaml, an adapter)")
    ap.add_argument("--out", default=None, help="write here instead of the run folder")
    ap.add_argument("--z", type=float, default=4.0, help="vocabulary z-score of weight candidates")
    ap.add_argument("--z-inherit", type=float, default=3.0, help="z-score of inherited tokens")
    ap.add_argument("--n-contexts", type=int, default=24, help="CircuitLens contexts per node")
    ap.add_argument("--max-nodes", type=int, default=None, help="explain only the N most important nodes")
    ap.add_argument("--neurons", type=int, default=8, help="top neurons per MLP node")
    ap.add_argument("--neuron-ranking", default="attribution", choices=("attribution", "weights"),
                    help="how an MLP node's top neurons are chosen (attribution needs the task)")
    ap.add_argument("--split", default="test", choices=("train", "val", "test"),
                    help="split of the --n-task rows")
    ap.add_argument("--n-task", type=int, default=64, help="task prompts (neuron attribution, contexts)")
    ap.add_argument("--n-general", type=int, default=32, help="general-text blocks for contexts")
    ap.add_argument("--block-size", type=int, default=64, help="tokens per general-text block")
    ap.add_argument("--neutral-text", default=DEFAULT_NEUTRAL, help="validation context")
    ap.add_argument("--no-circuitlens", action="store_true", help="WeightLens only")
    ap.add_argument("--task", default=None, help="task (recipe's task)")
    ap.add_argument("--model", default=None, help="base model (recipe's model)")
    ap.add_argument("--device", default=None, help="cpu, cuda, ... (recipe's, else cuda if available)")
    ap.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (recipe's, else as saved)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the task rows and of both lenses' sampling")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (default: condense.runtime's policy)")
    ap.add_argument("--describe", default=None,
                    help="module:function turning a node's report into a description (optional)")
    args = ap.parse_args(argv)
    report = explain_run(
        args.run_dir, out_dir=args.out, z=args.z, z_inherit=args.z_inherit, n_contexts=args.n_contexts,
        max_nodes=args.max_nodes, n_neurons=args.neurons, neuron_ranking=args.neuron_ranking,
        split=args.split, n_task=args.n_task,
        n_general=args.n_general, block_size=args.block_size, neutral_text=args.neutral_text,
        task=args.task, model=args.model, device=args.device, dtype=args.dtype,
        describe=_describer(args.describe), seed=args.seed, circuitlens=not args.no_circuitlens,
        threads=args.threads)
    s = report["summary"]
    msg = (f"{s['n_nodes']} nodes explained, {len(s['context_dependent'])} context-dependent; "
           f"{report['seconds']:.1f}s -> {args.out or args.run_dir}/explain.json, explain.md")
    if "ioi_names" in s:
        msg += (f"\nheads with >= 80% names among validated outputs: {s['name_heads']}; top head into "
                f"logits {s['top_logits_head']}: {'included' if s['done'] else 'not included'}")
    print(msg)
    return 0


if __name__ == "__main__":  # python -m condense.explain.run is `condense explain`
    from condense.cli import module_entry
    module_entry("explain")
