"""Which rows move a scoring run's smallest faithful circuit: the train rows that ranked the
edges, or the val rows the search measures faithfulness on.

    HF_HUB_OFFLINE=1 python benchmarks/row_check_split.py RUN [RUN ...] --val 64,256
        [--threads 1] [--json PATH]

Each RUN is a scoring run folder (EAP-IG's, say) whose circuit.json holds every edge's score.
For each run and each val row count (the first that many val rows of its task and seed: the
smaller sets are prefixes of the larger), the smallest faithful top-n circuit is searched again
with the run's own settings (threshold, |scores| or signed, search resolution, intervention);
at the run's own val row count its metrics.json is read instead (`recorded`).
Run it on the row check's runs (64, 128, 256 train rows) to fill the train x val table: if the
size moves along a row of it, the ranking moved it; along a column, the val rows did.
"""
import argparse
import json
import os
import time


def check_run(run_dir: str):
    """The run's folder read, or a one-line error: it must be a scoring run (every edge scored)."""
    from condense.methods.scoring import ATTRIBUTION_METHOD
    from condense.runs import read_run
    try:
        run = read_run(run_dir, "search")
    except FileNotFoundError as e:
        raise SystemExit(str(e)) from None
    if run.config.method not in ATTRIBUTION_METHOD:
        raise SystemExit(f"{run_dir}: a {run.config.method!r} run; give a scoring run's folder "
                         f"(one of {', '.join(ATTRIBUTION_METHOD)}), whose circuit.json scores every edge")
    if not os.path.exists(os.path.join(run_dir, "metrics.json")):
        raise SystemExit(f"{run_dir}: no metrics.json (the run did not finish)")
    return run


def search(run, val_rows: list, threads: int = 1) -> list:
    from condense import tasks
    from condense.curves import smallest_faithful

    cfg = run.config
    net, tokenizer, _ = run.load_model(threads=threads)
    graph = run.circuit(net)
    with open(os.path.join(run.path, "metrics.json")) as f:
        recorded = json.load(f)
    out = []
    for n in val_rows:
        cell = dict(run=run.path, method=cfg.method, task=cfg.task, n_train=cfg.n_train, n_val=n)
        if n == cfg.n_val:  # the run's own search: recorded, not repeated
            out.append(dict(cell, edges=recorded["edges"] if recorded["faithful_on_val"] else None,
                            n=recorded["n_requested"], faithfulness=recorded["faithfulness_val"],
                            evaluated=recorded.get("search_evaluated"), recorded=True))
            continue
        start = time.time()
        rows = tasks.load_task(cfg.task, tokenizer, "val", n=n, seed=cfg.seed)
        found = smallest_faithful(net, graph, rows, threshold=cfg.faithfulness_threshold,
                                  absolute=cfg.absolute_scores, intervention=cfg.intervention,
                                  batch_size=cfg.batch_size, resolution=cfg.search_resolution,
                                  progress=lambda t, n=n: print(f"  {n} val rows: {t}", flush=True))
        out.append(dict(cell, edges=found.edges if found.graph is not None else None, n=found.n,
                        faithfulness=found.faithfulness, evaluated=found.evaluated_json(),
                        seconds=time.time() - start))
        print(json.dumps({k: v for k, v in out[-1].items() if k != "evaluated"}), flush=True)
    return out


def table(results: list) -> str:
    trains = sorted({r["n_train"] for r in results})
    vals = sorted({r["n_val"] for r in results})
    cell = {(r["n_train"], r["n_val"]): r for r in results}
    lines = ["| train rows \\ val rows | " + " | ".join(map(str, vals)) + " |",
             "|---" * (len(vals) + 1) + "|"]
    for t in trains:
        row = []
        for v in vals:
            r = cell.get((t, v))
            row.append("–" if r is None else "none" if r["edges"] is None else f"{r['edges']:,}")
        lines.append(f"| {t} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="scoring run folders (circuit.json with scores)")
    ap.add_argument("--val", default="64,256", help="comma-separated val row counts")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--json", default=None, help="also write the results here as JSON")
    args = ap.parse_args(argv)
    try:
        val_rows = [int(v) for v in args.val.split(",") if v.strip()]
    except ValueError:
        ap.error(f"--val: expected comma-separated row counts such as 64,256, got {args.val!r}")
    if not val_rows or min(val_rows) < 2 or args.threads < 1:
        ap.error("--val needs row counts of at least 2 and --threads at least 1")
    runs = [check_run(run_dir) for run_dir in args.runs]  # every folder before any search
    start = time.time()
    results = [r for run in runs for r in search(run, val_rows, args.threads)]
    print(table(results))
    if args.json:
        from condense.artifacts import command_line, write_json
        write_json(args.json, dict(command=command_line("benchmarks/row_check_split.py", argv),
                                    wall_seconds=time.time() - start,
            results=results, table=table(results)))


if __name__ == "__main__":
    main()
