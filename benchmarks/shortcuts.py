"""Condensation's shortcuts against the design's loop on the organism: same final size (within
10 %) and the same gate outcomes?

    HF_HUB_OFFLINE=1 python benchmarks/shortcuts.py [--tasks ioi] [--out runs/shortcuts]
        [--shortcuts "heal_if_needed=true early_rank_method=eap early_rank_edges=200 rank_rows=32"]
        [--json PATH]

For each task two runs of `recipes/condense/organism_<task>.yaml` (one thread, one after the
other): `slow`, the recipe as shipped (the design's loop), and `fast`, the recipe plus
--shortcuts (the fields the SmolLM2 recipes turn on, scaled to the organism's 479 edges).
Reported per task: final edges, test accuracy, KL, the accepted/rejected sequence of both
runs, whether the fast run's size is within 10 % of the slow one's, and wall times. A finished
run (metrics.json) is not rerun.
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
SHORTCUTS = "heal_if_needed=true early_rank_method=eap early_rank_edges=200 rank_rows=32"


def run(task, variant, overrides, out):
    folder = os.path.join(out, f"{variant}_{task}")
    if not os.path.exists(os.path.join(folder, "metrics.json")):
        os.makedirs(out, exist_ok=True)
        cmd = [sys.executable, "-m", "condense.cli", "run", "--recipe",
               os.path.join(ROOT, "recipes", "condense", f"organism_{task}.yaml"), "threads=1",
               *overrides, f"output_dir={folder}"]
        env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", WANDB_MODE="disabled")
        start = time.time()
        with open(folder + ".log", "a") as log:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode
        print(f"[shortcuts] {variant} {task}: exit {rc} after {time.time() - start:.0f}s", flush=True)
    with open(os.path.join(folder, "metrics.json")) as f:
        metrics = json.load(f)
    with open(os.path.join(folder, "rounds.jsonl")) as f:
        rounds = [json.loads(line) for line in f]
    return dict(edges=metrics["edges"], accuracy=metrics["accuracy"], kl=metrics["kl"],
                accuracy_original=metrics["accuracy_original"], wall_seconds=metrics["wall_seconds"],
                rounds=[(r["edges"], r["accepted"]) for r in rounds],
                healed_rounds=sum(1 for r in rounds if r.get("heal_loss") is not None))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", default="ioi",
                    help="comma-separated tasks, each with recipes/condense/organism_<task>.yaml")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "shortcuts"),
                    help="folder for the runs (<variant>_<task>); finished ones are not rerun "
                         "(default: runs/shortcuts)")
    ap.add_argument("--shortcuts", default=SHORTCUTS, help="the overrides of the fast run")
    ap.add_argument("--json", help="also write the results here as JSON")
    args = ap.parse_args(argv)
    rows = []
    for task in [t for t in args.tasks.split(",") if t]:
        slow = run(task, "slow", [], args.out)
        fast = run(task, "fast", args.shortcuts.split(), args.out)
        rows.append(dict(task=task, slow=slow, fast=fast,
                         size_ratio=fast["edges"] / slow["edges"],
                         within_10_percent=abs(fast["edges"] - slow["edges"]) <= 0.1 * slow["edges"],
                         same_gate_outcomes=[a for _, a in fast["rounds"]] == [a for _, a in slow["rounds"]],
                         speedup=slow["wall_seconds"] / fast["wall_seconds"]))
        r = rows[-1]
        print(f"{task}: slow {slow['edges']} edges (acc {slow['accuracy']:.3f}, {slow['wall_seconds']:.0f}s, "
              f"{slow['healed_rounds']} heals), fast {fast['edges']} edges (acc {fast['accuracy']:.3f}, "
              f"{fast['wall_seconds']:.0f}s, {fast['healed_rounds']} heals); within 10 %: "
              f"{r['within_10_percent']}, same gate outcomes: {r['same_gate_outcomes']}, "
              f"speed-up {r['speedup']:.2f}x", flush=True)
    if args.json:
        from condense.artifacts import command_line, write_json
        write_json(args.json, dict(command=command_line("benchmarks/shortcuts.py", argv),
                                    shortcuts=args.shortcuts, rows=rows))


if __name__ == "__main__":
    main()
