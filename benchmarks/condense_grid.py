"""Condensation on SmolLM2-135M beside the published grid: C1, C0 and heal-only per task and
seed, against EAP-IG's smallest faithful circuit, and the verifier on every small C1.

    HF_HUB_OFFLINE=1 python benchmarks/condense_grid.py [--tasks ioi,agreement,induction,docstring]
        [--seeds 0] [--variants c1,c0,heal_only] [--out runs/condense_grid] [--max-verify 20]
        [--keep] [--json PATH] [--plot PNG] [--model gemma3-270m] [--baselines DIR] [key=value ...]
    HF_HUB_OFFLINE=1 python benchmarks/condense_grid.py --combine A.json B.json [--json PATH] [--plot PNG]

Each run is `condense run --recipe recipes/condense/smollm2_<task>.yaml seed=<s> [variant keys]
[key=value ...] output_dir=<out>/<variant>_<task>_s<seed>` in its own process, one after the
other; a finished run (metrics.json) is not rerun, and an interrupted one resumes. C0 is
`heal=false`; heal-only is `prune=false heal_if_needed=false early_rank_method=null
search_resolution=0.01` (heal the full graph, then rank with EAP-IG and take the smallest
faithful circuit, searched as the baselines are). Every C1 with at most --max-verify edges is
verified (`condense verify`, the run's own criterion). EAP-IG's smallest faithful circuit comes from
checkpoints/eap_ig_smollm2_<task>/metrics.json (benchmarks/smollm2_baselines.py), or with
`--baselines DIR` from DIR/eap_ig_<task>/metrics.json (a baselines run's folder, e.g. under
another intervention: EAP-IG's circuit must have been found under the runs' own, which is
checked before any run). The table
ends with the geometric mean of EAP-IG / C1 and of EAP-IG / C0 next to the paper's 8.1x and
7.4x: over task-seed rows and, when tasks have unequal seeds, with each task weighed once.
`--keep` copies each C1 run (adapter, circuit, metrics, rounds, pictures) into
checkpoints/condense_smollm2_<task>/ (seed 0 only). `--model NAME` runs the same recipes on
another model against checkpoints/eap_ig_<tag>_<task>/ and keeps into
checkpoints/condense_<tag>_<task>/ (tag: `condense.models.model_tag`, e.g. gemma3): with the
model's own recipe recipes/condense/<tag>_<task>.yaml where one is shipped, otherwise with the
SmolLM2 recipe and `model=NAME` added to every run.
`--combine` pools the rows of earlier
`--json` outputs (for example seeds run on different days; a later file's row replaces an
earlier one of the same task and seed) and prints the table and the means over all of them,
running nothing. `--plot` draws every row's circuit sizes (EAP-IG, heal-only, C0, C1) on a
log scale, one column per task and seed.
"""
import argparse
import collections
import json
import math
import os
import shutil
import subprocess
import sys
import time

from condense.artifacts import command_line, read_output
from condense.verify.verdict import irreducibility_words

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
# heal-only: heal the full graph, then EAP-IG (not the recipe's early EAP shortcut, which would
# rank the full graph with EAP) and the smallest faithful circuit at the baselines' 1 % resolution
VARIANTS = {"c1": [], "c0": ["heal=false"],
            "heal_only": ["prune=false", "heal_if_needed=false", "early_rank_method=null",
                          "search_resolution=0.01"]}
PAPER = dict(eap_ig_over_c1=8.1, eap_ig_over_c0=7.4)
KEEP = ("adapter_config.json", "adapter_model.safetensors", "circuit.json", "circuit.png",
        "metrics.json", "rounds.jsonl", "rounds.png", "recipe.yaml", "runtime.json", "verify.json",
        "verify_subsets.png", "verify_pairs.png", "verify_removals.png")


def _env():
    return dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", WANDB_MODE="disabled")


DEFAULT_MODEL = "smollm2-135m"


def recipe_of(task, model):
    """The recipe a run of `task` on `model` starts from, and the override that puts it on the
    model: the model's own recipe where one is shipped (no override), else SmolLM2's with
    `model=NAME` (none for SmolLM2 itself, so that the grid's earlier commands stay as they were)."""
    own = os.path.join(ROOT, "recipes", "condense", f"{tag_of(model)}_{task}.yaml")
    if os.path.exists(own):
        return own, []
    smollm2 = os.path.join(ROOT, "recipes", "condense", f"smollm2_{task}.yaml")
    return smollm2, model_keys(model)


def model_keys(model):
    """The override that puts a SmolLM2 recipe on `model` (none for SmolLM2 itself, so that
    earlier commands and run folders stay as they were)."""
    return [] if model == DEFAULT_MODEL else [f"model={model}"]


def check_model(ap, model):
    """Exit 2 naming the offline models unless `model` loads: before hours of runs, not after."""
    if model == DEFAULT_MODEL:
        return
    from condense.models import model_config
    try:
        model_config(model)
    except OSError as e:
        ap.error(f"--model {model}: {e}")  # the error lists the named offline models


def check_plan(ap, tasks, variants, model):
    """Exit 2 naming the bad variant or task and the allowed ones: before hours of runs, not
    in the middle of them."""
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        ap.error(f"--variants: unknown {', '.join(bad)}; allowed: {', '.join(VARIANTS)}")
    bad = [t for t in tasks if not os.path.exists(recipe_of(t, model)[0])]
    if bad:
        from condense.tasks import TASKS
        shipped = sorted(t for t in TASKS if os.path.exists(recipe_of(t, model)[0]))
        ap.error(f"--tasks: no condensation recipe for {', '.join(bad)}; tasks with one: {', '.join(shipped)}")


def baseline_folder(task, model, baselines=None):
    """Where the row of `task` reads EAP-IG's circuit: DIR/eap_ig_<task> or the shipped one."""
    return (os.path.join(baselines, f"eap_ig_{task}") if baselines
            else os.path.join(ROOT, "checkpoints", f"eap_ig_{tag_of(model)}_{task}"))


def check_baselines(ap, tasks, model, baselines, extra):
    """Exit 2 before any run when `--baselines` lacks a task's EAP-IG circuit, or when a task's
    EAP-IG circuit was found under another intervention than the runs would use (row_of would
    refuse that table only after hours of runs)."""
    from condense.runs import load_config
    for task in tasks:
        path = os.path.join(baseline_folder(task, model, baselines), "metrics.json")
        if not os.path.exists(path):
            if baselines:
                ap.error(f"--baselines {baselines}: no eap_ig_{task}/metrics.json (give a folder of "
                         f"baselines runs, one eap_ig_<task>/ per task)")
            continue
        found = _load(path).get("intervention", "patching")
        recipe, keys = recipe_of(task, model)
        runs = load_config(recipe, keys + list(extra)).intervention
        if runs != found:
            ap.error(f"{task}: EAP-IG's circuit ({path}) was found under {found}, the runs would "
                     f"run under {runs}; give --baselines a folder of baselines run under {runs}")


def tag_of(model):
    from condense.models import model_tag
    return model_tag(model)


def run_one(out, variant, task, seed, extra, model=DEFAULT_MODEL):
    folder = os.path.join(out, f"{variant}_{task}_s{seed}")
    if os.path.exists(os.path.join(folder, "metrics.json")):
        return folder
    os.makedirs(out, exist_ok=True)
    recipe, model_keys = recipe_of(task, model)
    cmd = [sys.executable, "-m", "condense.cli", "run", "--recipe", recipe, f"seed={seed}",
           *VARIANTS[variant], *model_keys, *extra, f"output_dir={folder}"]
    start = time.time()
    with open(folder + ".log", "a") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env(), cwd=ROOT).returncode
    print(f"[grid] {variant} {task} seed {seed}: exit {rc} after {time.time() - start:.0f}s", flush=True)
    return folder


def keep_recipe(src, dst):
    """The kept recipe names its new folder (its first-line command and output_dir), so that
    `condense run --recipe <checkpoint>/recipe.yaml` resumes there, not in the grid's folder."""
    from condense.runs import load_config, recipe_text
    cfg = load_config(os.path.join(src, "recipe.yaml"), [f"output_dir={os.path.relpath(dst, ROOT)}"])
    with open(os.path.join(dst, "recipe.yaml"), "w") as f:
        f.write(recipe_text(cfg))


def verify(folder, max_edges):
    with open(os.path.join(folder, "metrics.json")) as f:
        if json.load(f)["edges"] > max_edges:
            return None
    if not os.path.exists(os.path.join(folder, "verify.json")):
        subprocess.run([sys.executable, "-m", "condense.cli", "verify", folder, "--max-edges",
                        str(max_edges)], env=_env(), cwd=ROOT, check=True)
    with open(os.path.join(folder, "verify.json")) as f:
        return json.load(f)


def _load(path):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def intervention_of(folder):
    """The `intervention` a run folder's recipe ran under (None: no run there)."""
    if not os.path.exists(os.path.join(folder, "recipe.yaml")):
        return None
    from condense.runs import load_config
    return load_config(os.path.join(folder, "recipe.yaml"), []).intervention


def row_of(out, task, seed, max_verify, model=DEFAULT_MODEL, baselines=None):
    runs = {v: _load(os.path.join(out, f"{v}_{task}_s{seed}", "metrics.json")) for v in VARIANTS}
    base = baseline_folder(task, model, baselines)
    eap_ig = _load(os.path.join(base, "metrics.json"))
    # a size ratio means something only between circuits found under the same ablation
    ablations = {v: intervention_of(os.path.join(out, f"{v}_{task}_s{seed}")) for v in VARIANTS}
    wanted = eap_ig.get("intervention", "patching") if eap_ig else None
    differ = {v: i for v, i in ablations.items() if i is not None and wanted and i != wanted}
    if differ:
        raise SystemExit(f"{task} seed {seed}: EAP-IG's circuit ({base}) was found under "
                         f"{wanted}, but {', '.join(f'{v} ran under {i}' for v, i in differ.items())}; "
                         f"give --baselines a baselines folder run under the same intervention")
    c1 = runs["c1"]
    row = dict(task=task, seed=seed, eap_ig_edges=eap_ig["edges"] if eap_ig else None,
               **{f"{v}_edges": (m["edges"] if m else None) for v, m in runs.items()},
               **({"intervention": wanted} if wanted and wanted != "patching" else {}))
    if c1:
        row.update(accuracy=c1["accuracy"], accuracy_original=c1["accuracy_original"],
                   kl=c1["kl"], top1_agreement=c1["top1_agreement"],
                   choice_agreement=c1.get("choice_agreement"),  # runs before it was measured: none
                   ppl_ratio=c1["ppl_ratio"],
                   faithfulness=c1["faithfulness"],
                   # all rounds across resumes (older runs: this process's wall time only)
                   wall_seconds=c1.get("rounds_seconds", c1["wall_seconds"]),
                   rounds=c1["rounds"])
        report = verify(os.path.join(out, f"c1_{task}_s{seed}"), max_verify)
        if report:
            pairs = report["pairs"]
            row.update(verified=True, criterion=report["criterion"], passes=report["circuit_faithful"],
                       irreducible=report["irreducible"],
                       minimal_subset_sizes=sorted({len(s) for s in report["minimal_faithful_subsets"]}),
                       interacting_pairs=f"{report['n_interacting_pairs']}/{len(pairs)}",
                       median_partners=report["partners_median"])
    for v in ("c1", "c0", "heal_only"):
        if row.get("eap_ig_edges") and row.get(f"{v}_edges"):
            row[f"eap_ig_over_{v}"] = row["eap_ig_edges"] / row[f"{v}_edges"]
    return row


def geomean(values):
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def markdown(rows, summary):
    def f(x, spec=".3f"):
        return "–" if x is None else format(x, spec)
    lines = ["| task | seed | EAP-IG | C1 | C0 | heal-only | EAP-IG / C1 | C0 / C1 | accuracy (original) "
             "| KL | top-1 agr. | choice agr. | ppl ratio | verify | C1 rounds' wall |", "|" + "---|" * 15]
    for r in rows:
        ver = "–"
        if r.get("verified"):
            ver = (f"{'passes' if r['passes'] else 'fails'} ({r['criterion']}); "
                   f"{irreducibility_words(r.get('irreducible'), brief=True)}; "
                   f"minimal {r['minimal_subset_sizes']}; "
                   f"pairs {r['interacting_pairs']}, median {r['median_partners']}")
        c0c1 = r["c0_edges"] / r["c1_edges"] if r.get("c0_edges") and r.get("c1_edges") else None
        task = r["task"] + (f" ({r['intervention']} ablation)" if r.get("intervention") else "")
        lines.append(f"| {task} | {r['seed']} | {f(r.get('eap_ig_edges'), 'd')} "
                     f"| {f(r.get('c1_edges'), 'd')} | {f(r.get('c0_edges'), 'd')} "
                     f"| {f(r.get('heal_only_edges'), 'd')} | {f(r.get('eap_ig_over_c1'), '.1f')} | {f(c0c1, '.2f')} | "
                     f"{f(r.get('accuracy'))} ({f(r.get('accuracy_original'))}) | {f(r.get('kl'))} | "
                     f"{f(r.get('top1_agreement'))} | {f(r.get('choice_agreement'))} | "
                     f"{f(r.get('ppl_ratio'))} | {ver} | "
                     f"{f((r.get('wall_seconds') or 0) / 60, '.0f')} min |")
    lines += ["", f"Geometric mean EAP-IG / C1: {f(summary['eap_ig_over_c1'], '.2f')}x (paper: "
              f"{PAPER['eap_ig_over_c1']}x); EAP-IG / C0: {f(summary['eap_ig_over_c0'], '.2f')}x "
              f"(paper: {PAPER['eap_ig_over_c0']}x)."]
    seeds = collections.Counter(r["task"] for r in rows)
    if len(set(seeds.values())) > 1:  # unequal seeds: the pooled mean leans to the tasks with more
        eq = summary["tasks_weighted_equally"]
        lines.append(f"Each task weighed once (its seeds' geometric mean first): EAP-IG / C1 "
                     f"{f(eq['eap_ig_over_c1'], '.2f')}x; EAP-IG / C0 {f(eq['eap_ig_over_c0'], '.2f')}x.")
    for v, name in (("c0", "C0"), ("heal_only", "heal-only")):
        both = [r for r in rows if r.get(f"{v}_edges") and r.get("c1_edges")]
        if both:
            larger = sum(r[f"{v}_edges"] > r["c1_edges"] for r in both)
            lines.append(f"{name} larger than C1 in {larger} of {len(both)} task-seed pairs.")
    return "\n".join(lines)


SIZES = (("eap_ig", "EAP-IG (frozen)", "tab:gray", "s"), ("heal_only", "heal-only", "tab:orange", "^"),
         ("c0", "C0 (no heal)", "tab:blue", "v"), ("c1", "C1 (condensed)", "tab:red", "o"))


def plot(rows, path):
    """Every task-seed row's circuit sizes on a log scale, one column per row, grouped by task,
    with the per-task geometric mean of EAP-IG / C1 over each group."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    rows = sorted(rows, key=lambda r: (r["task"], r["seed"]))  # a run's rows come seed-major
    fig, ax = plt.subplots(figsize=(1.5 + 0.55 * len(rows), 4.4))
    tasks = []
    for x, r in enumerate(rows):
        for j, (v, label, color, marker) in enumerate(SIZES):
            if r.get(f"{v}_edges"):
                ax.scatter(x + (j - 1.5) * 0.08, r[f"{v}_edges"], color=color, marker=marker, s=36,
                           label=label if label not in ax.get_legend_handles_labels()[1] else None,
                           zorder=3)
        if r.get("eap_ig_edges") and r.get("c1_edges"):
            ax.plot([x - 0.12, x + 0.12], [r["eap_ig_edges"], r["c1_edges"]], color="0.75", lw=1, zorder=2)
        if not tasks or tasks[-1][0] != r["task"]:
            tasks.append([r["task"], x, x])
        tasks[-1][2] = x
    ax.set_yscale("log")
    ax.set_xticks(range(len(rows)), [f"s{r['seed']}" for r in rows])
    top = max(r.get(f"{v}_edges") or 1 for r in rows for v, *_ in SIZES)
    for task, first, last in tasks:
        ratio = geomean([r.get("eap_ig_over_c1") for r in rows[first:last + 1]])
        gap = " " if last > first else "\n"  # a one-column group has no room for a wide line
        words = f"{task}\nEAP-IG / C1{gap}{ratio:,.{0 if ratio >= 10 else 1}f}x" if ratio else task
        ax.text((first + last) / 2, top * 2, words, ha="center", va="bottom", fontsize=8)
        if last + 1 < len(rows):
            ax.axvline(last + 0.5, color="0.85", lw=0.8)
    ax.set_ylim(1, top * 40)
    ax.set_ylabel("edges in the circuit (log)")
    ax.set_xlim(-0.6, len(rows) - 0.4)
    ax.grid(axis="y", color="0.92", zorder=0)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=4, frameon=False)
    ax.set_title("Circuit size per task and seed", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def combine(paths):
    """The rows of earlier --json outputs, one per (task, seed), in task and seed order; where
    two files have the same task and seed, the later one's measured values win (a C1-only grid
    keeps an earlier file's C0 and heal-only)."""
    rows = {}
    for path in paths:
        for r in read_output(path, "rows")["rows"]:  # a foreign file: ValueError naming it
            old = rows.get((r["task"], r["seed"]), {})
            rows[(r["task"], r["seed"])] = {**old, **{k: v for k, v in r.items() if v is not None}}
    return [rows[k] for k in sorted(rows)]


def summarize(rows):
    """Geometric means over every task-seed row, and over tasks with each task's seeds pooled
    first: with three seeds of one task and one of another, the first weighs the task with
    more seeds three times, the second weighs every task once."""
    keys = ("eap_ig_over_c1", "eap_ig_over_c0")
    summary = {k: geomean([r.get(k) for r in rows]) for k in keys}
    tasks = sorted({r["task"] for r in rows})
    per_task = {t: {k: geomean([r.get(k) for r in rows if r["task"] == t]) for k in keys}
                for t in tasks}
    summary["tasks_weighted_equally"] = {k: geomean([per_task[t][k] for t in tasks]) for k in keys}
    summary["per_task"] = per_task
    return summary


def report(rows, args, command, **fields):
    """Print the table of `rows` and, as asked, draw them (--plot) and write them (--json, with
    `fields` after the command)."""
    summary = summarize(rows)
    table = markdown(rows, summary)
    print(table)
    if args.plot:
        print(f"[grid] drew {plot(rows, args.plot)}")
    if args.json:
        from condense.artifacts import write_json
        write_json(args.json, dict(command=command, **fields, rows=rows, summary=summary, paper=PAPER,
                                   table=table))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default="ioi,agreement,induction,docstring",
                    help="comma-separated tasks, each with a recipe under recipes/condense/")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds (the recipe's `seed`)")
    ap.add_argument("--variants", default="c1,c0,heal_only",
                    help=f"comma-separated, of: {', '.join(VARIANTS)}")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "condense_grid"),
                    help="folder of the runs, <variant>_<task>_s<seed>/ each (finished runs are kept)")
    ap.add_argument("--max-verify", type=int, default=20,
                    help="verify every C1 with at most this many edges (condense verify --max-edges)")
    ap.add_argument("--keep", action="store_true", help="copy seed-0 C1 runs into checkpoints/")
    ap.add_argument("--json", help="write the rows, the means and the table here")
    ap.add_argument("--plot", metavar="PNG", help="draw every row's circuit sizes into this picture")
    ap.add_argument("--combine", nargs="+", metavar="JSON",
                    help="pool the rows of earlier --json outputs and print their table (no runs)")
    ap.add_argument("--model", default=DEFAULT_MODEL,
                    help="run on this model instead: its own recipes/condense/<tag>_<task>.yaml where "
                         "shipped, else the SmolLM2 recipe with model=NAME")
    ap.add_argument("--baselines", metavar="DIR",
                    help="EAP-IG's circuits from DIR/eap_ig_<task>/ (a baselines run folder, e.g. "
                         "under intervention=mean) instead of checkpoints/eap_ig_<tag>_<task>/")
    ap.add_argument("extra", nargs="*", help="key=value for every run")
    args = ap.parse_args(argv)
    if not args.combine:
        check_model(ap, args.model)
    if args.plot and not os.path.isdir(os.path.dirname(os.path.abspath(args.plot))):
        ap.error(f"--plot {args.plot}: no such folder")  # before hours of runs, not after
    tasks = [t for t in args.tasks.split(",") if t]
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s]
    except ValueError:
        ap.error(f"--seeds {args.seeds}: comma-separated integers, e.g. 0,1,2")
    if not args.combine:
        check_plan(ap, tasks, [v for v in args.variants.split(",") if v], args.model)
        check_baselines(ap, tasks, args.model, args.baselines, args.extra)
    start = time.time()
    command = command_line("benchmarks/condense_grid.py", argv)
    if args.combine:
        try:
            rows = combine(args.combine)
        except ValueError as e:
            ap.error(f"--combine {e}")  # exit 2, as the other pooling benchmarks
        report(rows, args, command, combined=args.combine)
        return
    for seed in seeds:
        for task in tasks:
            for variant in [v for v in args.variants.split(",") if v]:
                run_one(args.out, variant, task, seed, args.extra, args.model)
    rows = [row_of(args.out, t, s, args.max_verify, args.model, args.baselines) for s in seeds for t in tasks]
    if args.keep:
        for r in rows:
            src = os.path.join(args.out, f"c1_{r['task']}_s0")
            dst = os.path.join(ROOT, "checkpoints", f"condense_{tag_of(args.model)}_{r['task']}")
            # a grid folder may be a link to the shipped run itself: nothing to copy
            if (r["seed"] == 0 and os.path.exists(os.path.join(src, "metrics.json"))
                    and not (os.path.exists(dst) and os.path.samefile(src, dst))):
                os.makedirs(dst, exist_ok=True)
                for name in KEEP:
                    if os.path.exists(os.path.join(src, name)) and name != "recipe.yaml":
                        shutil.copy(os.path.join(src, name), os.path.join(dst, name))
                keep_recipe(src, dst)
    report(rows, args, command, wall_seconds=time.time() - start)


if __name__ == "__main__":
    main()
