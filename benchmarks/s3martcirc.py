"""S3martCirc against the node baselines (organism, SmolLM2-135M or Gemma-3-270M), in one run.

    HF_HUB_OFFLINE=1 python benchmarks/s3martcirc.py [--model organism|smollm2|gemma3] [--tasks ioi,acronym]
        [--threads 1] [--baselines exact_patching,attribution_patching,...]
        [--out runs/s3martcirc_bench] [--json PATH] [key=value ...]
    HF_HUB_OFFLINE=1 python benchmarks/s3martcirc.py --combine A.json B.json [--json PATH] [--plot PNG]

Per task, the shipped recipe recipes/s3martcirc/<model>_<task>.yaml runs through
`condense run` (method `s3martcirc`) with every node baseline added
(s3_baselines): S3martCirc trains its coefficients on the recipe's train rows; each baseline
scores every head and neuron on the same rows; then on the test rows each method's circuit is
ablated (those nodes patched with the corrupted prompt, everything else kept): accuracy drop
(percentage points) and logit-difference drop. Baselines are evaluated at S3martCirc's circuit
size (their top-n nodes, n = S3martCirc's size) and every method at the recipe's node budgets.
Wall time: S3martCirc = FI + training; a baseline = its scoring. S3martCirc's budget order:
its circuit first, ranked by the discovery loss's mask gradient averaged over training, then
the rest by c_p + c_f; the row "budgets in c_p + c_f order" ranks by the coefficients alone. `key=value` overrides go to
both recipes (e.g. n_train=32). Artifacts of each run land in --out/<task>/.
The ceiling row is every node ablated (the corrupted run), for reference; the largest possible
drop is 100 x the full model's accuracy, and budgets where S3martCirc, exact patching and the
gradient baselines (attribution patching, with and without IG) all come within 5 points of it
are listed: there the ranking cannot tell them apart. A second table gives the
logit-difference drop at every budget beside the full model's logit difference. The last lines
check, per budget, that S3martCirc's drop is at least every gradient baseline's, in accuracy
and in logit difference, and then compare the rankings row by row: S3martCirc's drop minus each
baseline's and the exact McNemar p of the rows only one of the two ablations breaks, so that a
shortfall of a few rows is not read as a result (runs stored before the rows were kept skip
this). `--combine` rebuilds the tables from the stored runs, so a file written
before a column existed gains it.
On the organism the defaults take about 8-10 minutes on one CPU core (exact patching is most of
it). On SmolLM2 (46,350 nodes) and Gemma-3-270M (36,936) exact patching of every node is out of
reach on a CPU; the default there is `exact_patching_heads` (the heads exactly, its time
extrapolated to every node).
"""
import argparse
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

from condense import runs
from condense.artifacts import command_line, read_output, write_json
from condense.methods.s3martcirc.node_baselines import BASELINES, paired_drop_difference

NAMES = {"s3martcirc": "S3martCirc",
         "s3martcirc_coefficients": "S3martCirc, budgets in c_p + c_f order",
         "exact_patching": "exact activation patching",
         "exact_patching_heads": "exact activation patching, heads only",
         "attribution_patching": "attribution patching", "attribution_patching_ig": "AP + IG",
         "node_pruning": "node pruning (hard concrete)", "random": "random"}


MODELS = ("organism", "smollm2", "gemma3")


def default_baselines(model: str) -> list[str]:
    """Every baseline; exact patching of every node only on the organism (2,064 nodes); on a real
    model (tens of thousands of nodes, hours on a CPU) the heads only, its time extrapolated."""
    skip = "exact_patching_heads" if model == "organism" else "exact_patching"
    return [b for b in BASELINES if b != skip]


def run_task(task, args):
    recipe = os.path.join(ROOT, "recipes", "s3martcirc", f"{args.model}_{task}.yaml")
    overrides = [f"s3_baselines=[{','.join(args.baselines)}]", f"threads={args.threads}",
                 f"output_dir={os.path.join(args.out, task)}", *args.overrides]
    cfg = runs.load_config(recipe, overrides)
    metrics = runs.run(cfg)
    return metrics


def _drops(budgets):
    """Per budget, the accuracy drop (points) and the logit-difference drop of one ranking."""
    return dict(budgets={b: v["accuracy_drop"] for b, v in budgets.items()},
                logit_budgets={b: v["logit_drop"] for b, v in budgets.items()})


def rows_of(task, m):
    s3 = m["s3martcirc"]
    out = [dict(task=task, method="s3martcirc", size=s3["size"], heads=s3["heads"],
                neurons=s3["neurons"], accuracy_drop=s3["accuracy_drop"], logit_drop=s3["logit_drop"],
                seconds=s3["seconds"], circuit_faithfulness=s3["circuit_faithfulness"],
                **_drops(m["s3martcirc_budgets"]))]
    if "ceiling" in m:
        out.append(dict(task=task, method="ceiling", size=None, ceiling=True,
                        budgets={b: m["ceiling"]["accuracy_drop"] for b in out[0]["budgets"]},
                        logit_budgets={b: m["ceiling"]["logit_drop"] for b in out[0]["budgets"]}))
    if m.get("s3martcirc_coefficient_budgets"):  # the same circuit, budgets in c_p + c_f order
        out.append(dict(task=task, method="s3martcirc_coefficients", size=None,
                        **_drops(m["s3martcirc_coefficient_budgets"])))
    for method, rec in m["baselines"].items():
        a = rec["at_size"]
        out.append(dict(task=task, method=method, size=a["nodes"], heads=a["heads"],
                        neurons=a["neurons"], accuracy_drop=a["accuracy_drop"],
                        logit_drop=a["logit_drop"], seconds=rec["seconds"],
                        seconds_estimate=rec.get("exact_patching_seconds_estimate"),
                        circuit_faithfulness=a["circuit_faithfulness"], **_drops(rec["budgets"])))
    return out


def full_logit_diff(m):
    """The full model's mean logit difference on the test rows (what a logit drop is out of)."""
    return next(iter(m["s3martcirc_budgets"].values()))["logit_diff_full"]


def cell(r, b, key="budgets", digits=1):
    v = r.get(key, {}).get(str(b))
    return "—" if v is None else f"{v:.{digits}f}"


def table(rows, budgets):
    head = ("| task | method | size (heads + neurons) | accuracy drop (pts) | logit drop | "
            "circuit alone f | wall s | " + " | ".join(f"drop @{b}" for b in budgets) + " |")
    lines = [head, "|" + "---|" * (7 + len(budgets))]
    for r in rows:
        if r["size"] is None:
            lines.append(f"| {r['task']} | {NAMES.get(r['method'], r['method'])} | | | | | | "
                         + " | ".join(cell(r, b) for b in budgets) + " |")
            continue
        wall = f"{r['seconds']:.1f}"
        if r.get("seconds_estimate"):
            wall += f" (every node: ~{r['seconds_estimate']:.0f})"
        lines.append(f"| {r['task']} | {NAMES.get(r['method'], r['method'])} | {r['size']} "
                     f"({r['heads']} + {r['neurons']}) | {r['accuracy_drop']:.1f} | "
                     f"{r['logit_drop']:.2f} | {r['circuit_faithfulness']:.2f} | {wall} | "
                     + " | ".join(cell(r, b) for b in budgets) + " |")
    return "\n".join(lines)


def logit_table(rows, results, budgets):
    """The logit-difference drop of each ranking's top-n nodes ablated, per budget, beside the
    full model's logit difference (a drop is out of it; unlike accuracy it is not capped, so it
    can still order methods where every accuracy drop is at the ceiling)."""
    head = ("| task | method | full model's logit diff. | "
            + " | ".join(f"logit drop @{b}" for b in budgets) + " |")
    lines = [head, "|" + "---|" * (3 + len(budgets))]
    for r in rows:
        if "logit_budgets" in r:
            lines.append(f"| {r['task']} | {NAMES.get(r['method'], r['method'])} | "
                         f"{full_logit_diff(results[r['task']]):.2f} | "
                         + " | ".join(cell(r, b, "logit_budgets", 2) for b in budgets) + " |")
    return "\n".join(lines)


GRADIENT = ("attribution_patching", "attribution_patching_ig")  # the paper's gradient baselines
EXACT = ("exact_patching", "exact_patching_heads")


def saturated(rows, results, budgets, margin=5.0):
    """{task: [budgets at which S3martCirc, exact patching and the gradient baselines all drop
    accuracy to within `margin` points of the largest possible drop, 100 x the full model's
    accuracy]}: there the ranking no longer tells the methods apart. (Every node ablated is
    not a ceiling: on IOI ablating a few nodes can drop accuracy further than the corrupted
    run does.)"""
    out = {}
    for task in dict.fromkeys(r["task"] for r in rows):
        top = 100.0 * results[task]["s3martcirc"]["accuracy_full"]
        methods = [r for r in rows if r["task"] == task
                   and r["method"] in ("s3martcirc",) + GRADIENT + EXACT]
        out[task] = [b for b in budgets if str(b) in methods[0]["budgets"]
                     and all(r["budgets"][str(b)] >= top - margin for r in methods)]
    return out


def budget_checks(rows, budgets, key="budgets"):
    """{task: {budget: S3martCirc's drop >= every gradient baseline's}} (the issue's bar), on
    the accuracy drops (key "budgets") or the logit-difference drops ("logit_budgets")."""
    out = {}
    for task in dict.fromkeys(r["task"] for r in rows):
        s3 = next(r for r in rows if r["task"] == task and r["method"] == "s3martcirc")
        grad = [r for r in rows if r["task"] == task and r["method"] in GRADIENT]
        out[task] = {str(b): all(s3[key][str(b)] >= g[key][str(b)] for g in grad)
                     for b in budgets if str(b) in s3[key]}
    return out


def paired_checks(results, budgets):
    """{task: {budget: {baseline: paired_drop_difference(S3martCirc, baseline)}}} for the
    gradient and exact-patching baselines, from the rows each ablation still gets right (runs
    stored before ablation_metrics kept them have none and are skipped). With 100 test rows
    one row is one point, so a shortfall of a few points may be the rows' draw: the exact
    McNemar p says whether the rows can tell the two rankings apart."""
    out = {}
    for task, m in results.items():
        s3 = m.get("s3martcirc_budgets") or {}
        per = {}
        for b in budgets:
            mine = s3.get(str(b), {}).get("correct_rows")
            if mine is None:
                continue
            vs = {g: paired_drop_difference(mine, rec["budgets"][str(b)]["correct_rows"])
                  for g, rec in m["baselines"].items()
                  if g in GRADIENT + EXACT and "correct_rows" in rec["budgets"].get(str(b), {})}
            if vs:  # e.g. a run with only the random baseline has nothing to compare
                per[str(b)] = vs
        if per:
            out[task] = per
    return out


def paired_summary(per, alpha=0.05):
    """The budgets at which S3martCirc's drop is below some gradient baseline's by a margin
    the rows can tell (p < alpha), below only within the rows' noise, or not below any."""
    short, noise = [], []
    for b, vs in per.items():
        grad = [v for g, v in vs.items() if g in GRADIENT]
        if any(v["difference"] < 0 and v["p"] < alpha for v in grad):
            short.append(b)
        elif any(v["difference"] < 0 for v in grad):
            noise.append(b)
    return dict(short=short, short_within_noise=noise,
                not_short=[b for b in per if b not in short + noise])


def report(rows, results):
    """Print the tables and the checks; return them as {'saturated', 'budget_checks',
    'budget_checks_logit', 'budget_checks_paired'} for the --json output."""
    budgets = sorted({int(b) for r in rows for b in r["budgets"]})
    print()
    print(table(rows, budgets))
    print()
    print(logit_table(rows, results, budgets))
    checks = dict(saturated=saturated(rows, results, budgets),
                  budget_checks=budget_checks(rows, budgets),
                  budget_checks_logit=budget_checks(rows, budgets, "logit_budgets"),
                  budget_checks_paired=paired_checks(results, budgets))
    for task, bs in checks["saturated"].items():
        m = results[task]
        print(f"{task}: full-model accuracy {m['s3martcirc']['accuracy_full']:.3f}, so the largest "
              f"possible drop is {100 * m['s3martcirc']['accuracy_full']:.1f} points; every node "
              f"ablated drops {m['ceiling']['accuracy_drop']:.1f}; budgets where S3martCirc, exact "
              f"patching and the gradient baselines are all within 5 points of the largest: "
              f"{', '.join(map(str, bs)) or 'none'}")
        print(f"{task}: S3martCirc's accuracy drop >= every gradient baseline's, per budget: "
              f"{checks['budget_checks'][task]}")
        print(f"{task}: S3martCirc's logit drop >= every gradient baseline's, per budget: "
              f"{checks['budget_checks_logit'][task]} (full model's logit difference "
              f"{full_logit_diff(m):.2f}; every node ablated drops it by {m['ceiling']['logit_drop']:.2f})")
    for task, per in checks["budget_checks_paired"].items():
        n = next(iter(next(iter(per.values())).values()))["n"]
        print(f"{task}: S3martCirc's accuracy drop minus each baseline's, row by row on the {n} "
              f"test rows (points; exact McNemar p):")
        for b, vs in per.items():
            print(f"  @{b}: " + "; ".join(f"{NAMES.get(g, g)} {v['difference']:+.1f} (p {v['p']:.2g})"
                                          for g, v in vs.items()))
        summary = paired_summary(per)
        print(f"{task}: budgets where S3martCirc is short of a gradient baseline by more than the "
              f"rows' noise (p < 0.05): {', '.join(summary['short']) or 'none'}; short only within "
              f"it: {', '.join(summary['short_within_noise']) or 'none'}; not short: "
              f"{', '.join(summary['not_short']) or 'none'}")
    for task, m in results.items():
        holds = all(m["done_when"].values()) if m["done_when"] else None
        print(f"{task}: S3martCirc size {m['size']}, the run's done-when checks "
              f"{'hold' if holds else 'FAIL'}: {m['done_when']}")
    return checks


STYLE = {"s3martcirc": ("C3", "o", "-"), "exact_patching": ("C0", "s", "-"),
         "exact_patching_heads": ("C0", "s", "-"), "attribution_patching": ("C1", "v", "-"),
         "attribution_patching_ig": ("C2", "^", "-"), "node_pruning": ("C4", "D", ":"),
         "random": ("0.6", "x", ":")}  # color, marker, line of each ranking in --plot


def plot(rows, results, path):
    """Per task, the accuracy drop (top) and the logit-difference drop (bottom) of each
    ranking's top-n nodes ablated against the budget n (log scale), with every node ablated
    (dashed) and, for accuracy, the largest possible drop (dotted): where the lines meet the
    ceiling, the budget cannot tell methods apart."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    fig, axes = plt.subplots(2, len(tasks), figsize=(4.6 * len(tasks), 6.4), squeeze=False)
    for col, task in enumerate(tasks):
        m = results[task]
        for row, (key, label) in enumerate((("budgets", "accuracy drop (points)"),
                                            ("logit_budgets", "logit-difference drop"))):
            ax = axes[row][col]
            for r in rows:
                if r["task"] != task or r["method"] not in STYLE or key not in r:
                    continue
                xs = sorted(int(b) for b in r[key])
                color, marker, line = STYLE[r["method"]]
                ax.plot(xs, [r[key][str(x)] for x in xs], color=color, marker=marker, ls=line,
                        ms=4, lw=1.2, label=NAMES.get(r["method"], r["method"]))
            floor = m["ceiling"]["accuracy_drop" if row == 0 else "logit_drop"]
            ax.axhline(floor, color="0.3", ls="--", lw=0.9, label="every node ablated")
            if row == 0:
                ax.axhline(100 * m["s3martcirc"]["accuracy_full"], color="0.3", ls=":", lw=0.9,
                           label="largest possible")
            ax.set_xscale("log")
            ax.set_xlabel("nodes ablated (top-n of each ranking)")
            ax.set_ylabel(label)
            ax.grid(color="0.92")
            if row == 0:
                ax.set_title(task, fontsize=10)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=4, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="organism", choices=MODELS,
                    help="which shipped recipes: recipes/s3martcirc/<model>_<task>.yaml")
    ap.add_argument("--tasks", default="ioi,acronym", help="comma-separated tasks, each with its recipe")
    ap.add_argument("--baselines", default=None,
                    help="comma-separated (default: every baseline; on smollm2 and gemma3 exact "
                         "patching of the heads only instead of every node)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--out", default=os.path.join("runs", "s3martcirc_bench"),
                    help="folder of the runs, one per task")
    ap.add_argument("--json", default=None, help="write every number here")
    ap.add_argument("--combine", nargs="+", default=None, metavar="JSON",
                    help="run nothing: pool earlier --json files (e.g. tasks run as separate "
                         "processes; a task in two files takes the later one's run), print the "
                         "tables and write --json")
    ap.add_argument("--plot", metavar="PNG", help="draw both drops against the budget into this "
                                                  "picture, one column per task")
    ap.add_argument("overrides", nargs="*", help="key=value recipe overrides for every task")
    args = ap.parse_args(argv)
    if args.plot and not os.path.isdir(os.path.dirname(os.path.abspath(args.plot))):
        ap.error(f"--plot {args.plot}: no such folder")  # before the runs, not after
    words = sys.argv[1:] if argv is None else argv
    results, commands = {}, []
    if args.combine:
        for path in args.combine:
            try:
                d = read_output(path, "runs", dict)
            except ValueError as e:
                ap.error(f"--combine {e}")
            results.update(d["runs"])  # a task in two files: the later file's run
            commands += d.get("commands") or [d["command"]]
    else:
        if args.baselines is None:
            args.baselines = ",".join(default_baselines(args.model))
        args.baselines = [b for b in args.baselines.split(",") if b]
        for task in args.tasks.split(","):
            m = run_task(task, args)
            results[task] = m
            print(f"[bench] {task}: done-when checks {m['done_when']}", flush=True)
        commands.append(command_line("benchmarks/s3martcirc.py", words))
    # the tables' rows come from the runs, so a pooled file written before a column existed gains it
    rows = [r for task, m in results.items() for r in rows_of(task, m)]
    checks = report(rows, results)
    if args.plot:
        print(f"drew {plot(rows, results, args.plot)}")
    if args.json:
        write_json(args.json, dict(rows=rows, runs=results, **checks,
                                   command=command_line("benchmarks/s3martcirc.py", words),
                                   commands=commands))
    return results


if __name__ == "__main__":
    main()
