"""Edge attribution methods compared on the model organism, task by task.

    HF_HUB_OFFLINE=1 python benchmarks/attribution.py [--tasks ioi,induction] [--methods eap,eap_ig_inputs]
        [--n 64] [--ig-steps 5] [--repeats 1] [--threads 1] [--model checkpoints/organism] [--json PATH]
        [--device cuda] [--dtype bfloat16] [--no-search]

The one-shot flow of `condense run` (condense.methods.scoring), per task and method: rank the
edges on `n` train rows, then on `n` val rows the MIB curves (CPR, CMD) and the smallest
top-n circuit with faithfulness >= 0.9 (by |score|), whose faithfulness is then measured on
`n` test rows. Ranking wall time is given as a ratio to EAP's on the same task in the same
run (the machine is shared, so absolute seconds drift; EAP always runs, first). Before any
timing, each task warms up (a small attribution and evaluation) so that no method pays the
one-off costs. With --repeats k, each ranking time is the minimum of k runs.
Defaults take about 4 minutes on one CPU core.
"""
import argparse
import os
import statistics
import sys
import time

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

from condense import tasks
from condense.attribute import METHODS
from condense.evaluate import evaluate
from condense.graph import Graph
from condense.models import load_model, load_tokenizer
from condense.methods.scoring import ScoringConfig, rank_edges, search_circuit


def bench_task(model, tokenizer, task, methods, args):
    cfg = ScoringConfig(task=task, n_train=args.n, n_val=args.n, n_test=args.n, ig_steps=args.ig_steps,
                    batch_size=args.batch_size)
    rows = {s: tasks.load_task(task, tokenizer, s, n=args.n, seed=cfg.seed) for s in ("train", "val", "test")}
    warm = Graph.from_model(model)
    rank_edges(model, warm, rows["train"].select(range(4)), cfg, "eap", None, progress=False)
    evaluate(model, warm, rows["val"].select(range(4)), batch_size=cfg.batch_size)

    results = []
    for method in methods:
        graph = Graph.from_model(model)
        seconds = min(rank_edges(model, graph, rows["train"], cfg, method, None, progress=False)
                      for _ in range(args.repeats))
        if args.no_search:  # timing only (e.g. a random model, where circuits mean nothing)
            results.append(dict(task=task, method=method, rank_seconds=seconds))
            print(f"  {task:12s} {method:18s} rank {seconds:6.3f}s", flush=True)
            continue
        curves, found, _, search_seconds = search_circuit(model, graph, rows["val"], cfg, None)
        f_test = None
        if found.graph is not None:
            f_test = evaluate(model, found.graph, rows["test"], batch_size=cfg.batch_size)["faithfulness"]
        results.append(dict(task=task, method=method, rank_seconds=seconds, cpr=curves["cpr"],
                            cmd=curves["cmd"], n_requested=found.n, edges=found.edges,
                            faithfulness_val=found.faithfulness, faithfulness_test=f_test,
                            search_seconds=search_seconds))
        print(f"  {task:12s} {method:18s} rank {seconds:6.2f}s  CPR {curves['cpr']:.3f}  "
              f"CMD {curves['cmd']:.3f}  smallest faithful: {found.edges} edges", flush=True)
    eap = next(r["rank_seconds"] for r in results if r["method"] == "eap")
    for r in results:
        r["time_vs_eap"] = r["rank_seconds"] / eap
    return results


def _fmt(x, spec=".3f"):
    return "–" if x is None else format(x, spec)


def markdown(results, methods, total):
    lines = [f"| task | method | rank time / EAP | CPR ↑ | CMD ↓ | smallest faithful (edges of {total}) "
             "| f val | f test |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        size = str(r["edges"]) if r["n_requested"] is not None else f"none ({r['edges']})"
        lines.append(f"| {r['task']} | {r['method']} | {r['time_vs_eap']:.2f} | {_fmt(r['cpr'])} | "
                     f"{_fmt(r['cmd'])} | {size} | {_fmt(r['faithfulness_val'])} | "
                     f"{_fmt(r['faithfulness_test'])} |")
    lines += ["", "Means over tasks (median smallest-faithful size):", "",
              "| method | rank time / EAP | CPR ↑ | CMD ↓ | smallest faithful (median edges) |",
              "|---|---|---|---|---|"]
    for m in methods:
        mine = [r for r in results if r["method"] == m]
        lines.append(f"| {m} | {statistics.mean(r['time_vs_eap'] for r in mine):.2f} | "
                     f"{statistics.mean(r['cpr'] for r in mine):.3f} | "
                     f"{statistics.mean(r['cmd'] for r in mine):.3f} | "
                     f"{statistics.median(r['edges'] for r in mine):g} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "checkpoints", "organism"),
                    help="model name or folder (default: checkpoints/organism)")
    ap.add_argument("--tasks", default=",".join(tasks.TASKS), help="comma-separated tasks (default: all)")
    ap.add_argument("--methods", default=",".join(METHODS),
                    help="comma-separated attribution methods (default: all; eap always runs, first)")
    ap.add_argument("--n", type=int, default=64, help="rows per split")
    ap.add_argument("--ig-steps", type=int, default=5,
                    help="points per path (eap_ig_inputs, eap_ig_activations, eap_gp)")
    ap.add_argument("--batch-size", type=int, default=16, help="rows per batch (ranking and evaluation)")
    ap.add_argument("--repeats", type=int, default=1, help="ranking time = min over this many runs")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads; 1 keeps time ratios steady on a shared machine, where "
                         "spare threads wait on busy cores")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, ...")
    ap.add_argument("--dtype", default=None, help="float32, bfloat16 (default: as saved)")
    ap.add_argument("--no-search", action="store_true",
                    help="time the rankings only (no curves or circuit search)")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    task_names = [t for t in args.tasks.split(",") if t]
    bad = [m for m in methods if m not in METHODS] + [t for t in task_names if t not in tasks.TASKS]
    if bad:
        sys.exit(f"unknown method or task {bad[0]!r}; methods: {', '.join(METHODS)}; "
                 f"tasks: {', '.join(tasks.TASKS)}")
    methods = ["eap"] + [m for m in methods if m != "eap"]  # the time baseline runs first
    torch.set_num_threads(args.threads)
    start = time.time()
    model = load_model(args.model, dtype=args.dtype, device=args.device)
    tokenizer = load_tokenizer(args.model)
    results = []
    for task in task_names:
        results += bench_task(model, tokenizer, task, methods, args)
    if args.no_search:
        for r in results:
            print(f"{r['task']:12s} {r['method']:18s} time / EAP {r['time_vs_eap']:.2f}")
        if args.json:
            from condense.artifacts import write_json
            write_json(args.json, dict(model=args.model, device=args.device, n=args.n,
                                       ig_steps=args.ig_steps, results=results))
        return
    total = int(Graph.from_model(model).valid.sum())
    table = markdown(results, methods, total)
    print(f"\n{args.model}: n={args.n} rows per split, ig_steps={args.ig_steps}, "
          f"{args.threads} threads, {time.time() - start:.0f}s\n\n{table}")
    if args.json:
        from condense.artifacts import write_json
        write_json(args.json, dict(model=args.model, n=args.n, ig_steps=args.ig_steps,
                                   threads=args.threads, repeats=args.repeats,
                                   batch_size=args.batch_size, results=results))


if __name__ == "__main__":
    main()
