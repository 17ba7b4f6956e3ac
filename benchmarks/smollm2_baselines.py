"""Scoring baselines on SmolLM2-135M: every `recipes/<method>/smollm2_<task>.yaml`, run as
condense runs, then one table of smallest faithful circuits, CPR/CMD and ranking times.

    HF_HUB_OFFLINE=1 python benchmarks/smollm2_baselines.py [--out runs/smollm2_baselines]
        [--jobs 2] [--only eap_ig] [--tasks docstring] [--row-check 128,256] [--json PATH]
        [--keep-circuits] [--model gemma3-270m]

Each run is `python condense/train.py --recipe <recipe> output_dir=<out>/<method>_<task>` in its
own process (`--jobs` at a time, `--threads` torch threads each, default one); a run whose metrics.json exists is
not rerun, so an interrupted benchmark resumes. The row check reruns EAP-IG on IOI with more
train and val rows (`--row-check 128,256`: `n_train=n_val=128`, then 256) and compares the
smallest faithful sizes of each doubling.
`--keep-circuits` copies each EAP-IG run's circuit (gzipped MIB JSON), metrics.json and curve
into `checkpoints/eap_ig_smollm2_<task>/`, where condensation runs compare against them.
`--model NAME` runs the same recipes with `model=NAME` added (default output folder
runs/<tag>_baselines) and keeps into `checkpoints/eap_ig_<tag>_<task>/` (tag:
`condense.models.model_tag`, e.g. gemma3), where `benchmarks/condense_grid.py --model NAME` reads them.
Ranking time is wall time of one process beside the other jobs: read it as a ratio to EAP's
on the same task.
"""
import argparse
import glob
import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from condense.methods.scoring import ATTRIBUTION_METHOD
# the kept recipe names its checkpoint folder; a model is put on and checked as the grid does
from condense_grid import DEFAULT_MODEL, check_model, keep_recipe, model_keys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
TASK_ORDER = ("ioi", "induction", "agreement", "docstring", "acronym", "greater_than")


def recipes(only, tasks=()):
    found = []
    for path in sorted(glob.glob(os.path.join(ROOT, "recipes", "*", "smollm2_*.yaml"))):
        method = os.path.basename(os.path.dirname(path))
        task = os.path.basename(path)[len("smollm2_"):-len(".yaml")]
        if method not in ATTRIBUTION_METHOD or (only and method not in only):  # scoring only
            continue
        if tasks and task not in tasks:
            continue
        found.append((method, task, path, []))
    return found


def run_name(method, task, overrides):
    """The run folder's name: a row-check run is named by its row count."""
    rows = [o.split("=")[1] for o in overrides if o.startswith("n_train=")]
    return f"{method}_{task}" + (f"_rows{rows[0]}" if rows else "")


def run_one(job, out, threads=1, model=DEFAULT_MODEL):
    method, task, recipe, overrides = job
    name = run_name(method, task, overrides)
    folder = os.path.join(out, name)
    if os.path.exists(os.path.join(folder, "metrics.json")):
        return name, folder, "done before"
    os.makedirs(out, exist_ok=True)
    cmd = [sys.executable, os.path.join(ROOT, "condense", "train.py"), "--recipe", recipe,
           f"output_dir={folder}", f"threads={threads}", *model_keys(model), *overrides]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", WANDB_MODE="disabled",
               OMP_NUM_THREADS=str(threads))
    start = time.time()
    with open(os.path.join(out, name + ".log"), "w") as logf:
        rc = subprocess.run(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode
    seconds = time.time() - start
    print(f"[baselines] {name}: exit {rc} after {seconds:.0f}s", flush=True)
    if rc == 0:  # the whole process (loading, ranking, curves, search, test), for the budget
        with open(os.path.join(folder, "process_seconds.txt"), "w") as f:
            f.write(f"{seconds:.1f}\n")
    return name, folder, rc


def summary(out, jobs):
    rows = []
    for method, task, recipe, overrides in jobs:
        name = run_name(method, task, overrides)
        path = os.path.join(out, name, "metrics.json")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            m = json.load(f)
        timed = os.path.join(out, name, "process_seconds.txt")
        process = float(open(timed).read()) if os.path.exists(timed) else None
        rows.append(dict(run=name, method=method, task=task, recipe=os.path.relpath(recipe, ROOT),
                         overrides=overrides, edges=m["edges"], total_edges=m["total_edges"],
                         faithful_on_val=m["faithful_on_val"], faithfulness_val=m["faithfulness_val"],
                         faithfulness_test=m["faithfulness"], accuracy=m["accuracy"],
                         accuracy_full=m["accuracy_full"], kl=m["kl"], cpr=m["cpr"], cmd=m["cmd"],
                         rank_seconds=m["rank_seconds"], n_train=m["n_train"], n_val=m["n_val"],
                         n_test=m["n_test"],
                         wall_seconds=m["rank_seconds"] + m["curve_seconds"] + m["search_seconds"],
                         curve_seconds=m["curve_seconds"], search_seconds=m["search_seconds"],
                         process_seconds=process))
    eap = {r["task"]: r["rank_seconds"] for r in rows if r["method"] == "eap" and not r["overrides"]}
    for r in rows:
        r["rank_time_vs_eap"] = r["rank_seconds"] / eap[r["task"]] if r["task"] in eap else None
    return rows


def row_counts(text):
    """--row-check's value: comma-separated row counts of at least 2 ('' for none)."""
    try:
        counts = [int(n) for n in text.split(",") if n.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated row counts such as 128,256, "
                                         f"got {text!r}") from None
    if any(n < 2 for n in counts):
        raise argparse.ArgumentTypeError(f"row counts must be at least 2, got {text!r}")
    return counts


def row_check(rows):
    """EAP-IG IOI's smallest faithful size at each row count whose half was run too: one
    record per doubling (rows, edges, the doubled run's, the relative change)."""
    sizes = {r["n_train"]: r["edges"] for r in rows
             if r["method"] == "eap_ig" and r["task"] == "ioi" and r["n_train"] == r["n_val"]}
    return [dict(rows=n, rows_doubled=2 * n, edges=sizes[n], edges_doubled=sizes[2 * n],
                 relative_change=(sizes[2 * n] - sizes[n]) / sizes[n])
            for n in sorted(sizes) if 2 * n in sizes]


def markdown(rows):
    order = {t: i for i, t in enumerate(TASK_ORDER)}
    rows = sorted(rows, key=lambda r: (order.get(r["task"], 99), r["method"] != "eap_ig",
                                       r["method"], r["n_train"]))
    lines = ["| task | method | rows (train/val) | smallest faithful (edges) | % of graph | f val | "
             "f test | test accuracy (model) | CPR ↑ | CMD ↓ | rank s | rank / EAP |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        size = f"{r['edges']:,}" if r["faithful_on_val"] else f"none (full: {r['edges']:,})"
        ratio = "–" if r["rank_time_vs_eap"] is None else f"{r['rank_time_vs_eap']:.2f}"
        lines.append(f"| {r['task']} | {r['method']} | {r['n_train']}/{r['n_val']} | {size} | "
                     f"{100 * r['edges'] / r['total_edges']:.1f} | {r['faithfulness_val']:.3f} | "
                     f"{r['faithfulness_test']:.3f} | {r['accuracy']:.3f} ({r['accuracy_full']:.3f}) | "
                     f"{r['cpr']:.3f} | {r['cmd']:.3f} | {r['rank_seconds']:.0f} | {ratio} |")
    return "\n".join(lines)


def keep_circuits(rows, out, tag="smollm2"):
    """EAP-IG circuits into checkpoints/eap_ig_<tag>_<task>/ (gzipped JSON, metrics, curve)."""
    for r in rows:
        if r["method"] != "eap_ig" or r["overrides"]:
            continue
        src = os.path.join(out, r["run"])
        dst = os.path.join(ROOT, "checkpoints", f"eap_ig_{tag}_{r['task']}")
        os.makedirs(dst, exist_ok=True)
        with open(os.path.join(src, "circuit.json"), "rb") as f, \
                gzip.open(os.path.join(dst, "circuit.json.gz"), "wb") as g:
            shutil.copyfileobj(f, g)
        for name in ("metrics.json", "curve.png"):
            shutil.copy(os.path.join(src, name), os.path.join(dst, name))
        keep_recipe(src, dst)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="run folders (default: runs/<tag>_baselines, e.g. "
                                  "runs/smollm2_baselines)")
    ap.add_argument("--jobs", type=int, default=2, help="runs at a time")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run (--jobs 1 "
                    "--threads 2: each run alone on a 2-core machine)")
    ap.add_argument("--only", default="", help="comma-separated methods (default: all)")
    ap.add_argument("--tasks", default="", help=f"comma-separated tasks (default: all of "
                                                 f"{', '.join(TASK_ORDER)})")
    ap.add_argument("--row-check", default="128", type=row_counts,
                    help="comma-separated row counts (train = val) for EAP-IG IOI reruns, each "
                         "compared with the run of half as many rows ('' skips the check)")
    ap.add_argument("--no-double", action="store_true", help="the same as --row-check ''")
    ap.add_argument("--keep-circuits", action="store_true",
                    help="copy the EAP-IG circuits into checkpoints/eap_ig_<tag>_<task>/")
    ap.add_argument("--model", default=DEFAULT_MODEL,
                    help="run the SmolLM2 recipes on this model instead (model=NAME added)")
    ap.add_argument("--json", help="also write the table's rows here")
    args = ap.parse_args(argv)
    only = [m for m in args.only.split(",") if m]
    if args.jobs < 1 or args.threads < 1:
        ap.error(f"--jobs and --threads must be at least 1, got {args.jobs} and {args.threads}")
    tasks = [t for t in args.tasks.split(",") if t]
    unknown = sorted(set(tasks) - set(TASK_ORDER))
    if unknown:
        ap.error(f"unknown task(s) {', '.join(unknown)}; choose from {', '.join(TASK_ORDER)}")
    check_model(ap, args.model)
    from condense.models import model_tag
    tag = model_tag(args.model)
    args.out = args.out or os.path.join(ROOT, "runs", f"{tag}_baselines")
    jobs = recipes(only, tasks)
    counts = [] if args.no_double else args.row_check
    if (not only or "eap_ig" in only) and (not tasks or "ioi" in tasks):
        for n in counts:
            jobs.insert(1, ("eap_ig", "ioi", os.path.join(ROOT, "recipes", "eap_ig", "smollm2_ioi.yaml"),
                            [f"n_train={n}", f"n_val={n}"]))
    # the slowest first, so that two queues end together
    weight = dict(eap_gp=3, eap_ig=2, eap_ig_activations=2)
    jobs.sort(key=lambda j: (-weight.get(j[0], 1), -len(j[3])))
    start = time.time()
    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(lambda j: run_one(j, args.out, args.threads, args.model), jobs))
    rows = summary(args.out, jobs)
    check = row_check(rows)
    print(markdown(rows))
    for c in check:
        print(f"\nEAP-IG IOI, rows {c['rows']} -> {c['rows_doubled']}: {c['edges']} -> "
              f"{c['edges_doubled']} edges ({100 * c['relative_change']:+.1f} %)")
    if args.keep_circuits:
        keep_circuits(rows, args.out, tag)
    if args.json:
        from condense.artifacts import command_line, write_json
        write_json(args.json, dict(command=command_line("benchmarks/smollm2_baselines.py", argv),
                                   wall_seconds=time.time() - start, rows=rows, doubled_rows_check=check,
                                   table=markdown(rows)))


if __name__ == "__main__":
    main()
