"""`condense explain` stopped part way and run again: does the second run explain only the nodes
the first did not finish, and write what an uninterrupted run writes?

    HF_HUB_OFFLINE=1 python benchmarks/explain_resume.py checkpoints/condense_gemma3_ioi \\
        --stop-after-nodes 1 --out runs/explain_resume \\
        --json benchmarks/results/explain_resume_gemma3_ioi.json

The run folder is explained three times, one thread each: once without interruption (into
--uninterrupted), then into --out killed (SIGTERM, as a batch scheduler ends a job at its time
limit) as soon as its resume file holds --stop-after-nodes explained nodes, then the same
command again. explain.json of the resumed run is compared with the uninterrupted one's, every
value but the times."""
import argparse
import json
import os
import sys

import torch

from interrupted import ROOT, run_command

sys.path.insert(0, ROOT)
from condense.artifacts import command_line, read_json, write_json  # noqa: E402
from condense.explain.run import STATE_FILE  # noqa: E402

TIMES = ("seconds", "resumed_seconds")


def saved_nodes(out: str) -> list[str]:
    """The nodes the resume file in `out` holds (none while it is absent or being replaced)."""
    try:
        state = torch.load(os.path.join(out, STATE_FILE), weights_only=True)
    except Exception:  # absent, or caught mid-write
        return []
    return list(json.loads(state["nodes"]))


def run(run_dir, out, threads, stop_after_nodes=None):
    """(seconds, return code, its log, the nodes saved when killed) of one explain command."""
    cmd = [sys.executable, "-m", "condense.explain", run_dir, "--out", out, "--threads", str(threads)]
    os.makedirs(out, exist_ok=True)
    def watch():
        return len(saved_nodes(out)) >= stop_after_nodes
    seconds, rc, log = run_command(cmd, os.path.join(out, "explain_resume.log"), watch,
                                   None if stop_after_nodes is None else 0.0)
    return seconds, rc, log, saved_nodes(out) if stop_after_nodes is not None else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a run folder with circuit.json (and its recipe, its adapter)")
    ap.add_argument("--stop-after-nodes", type=int, default=1,
                    help="SIGTERM the first run once this many nodes are saved")
    ap.add_argument("--out", default="runs/explain_resume", help="where both runs write")
    ap.add_argument("--uninterrupted", default="runs/explain_resume_whole",
                    help="where the same command runs once without interruption")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of every run")
    ap.add_argument("--json", help="write the times and the comparison here")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    for folder in (args.out, args.uninterrupted):
        for name in ("explain.json", STATE_FILE):
            if os.path.exists(os.path.join(folder, name)):
                os.remove(os.path.join(folder, name))
    whole_s, whole_rc, whole_log, _ = run(args.run, args.uninterrupted, args.threads)
    if whole_rc != 0:
        sys.exit(f"the uninterrupted run failed (rc {whole_rc}):\n{whole_log[-2000:]}")
    first_s, first_rc, first_log, saved = run(args.run, args.out, args.threads,
                                              args.stop_after_nodes)
    if os.path.exists(os.path.join(args.out, "explain.json")):
        sys.exit("the first run finished before it was stopped")
    print(f"first run killed after {first_s:.0f}s (rc {first_rc}), nodes saved: {saved}", flush=True)
    second_s, second_rc, second_log, _ = run(args.run, args.out, args.threads)
    if second_rc != 0:
        sys.exit(f"the second run failed (rc {second_rc}):\n{second_log[-2000:]}")
    resumed, whole = (read_json(os.path.join(d, "explain.json")) for d in (args.out, args.uninterrupted))
    differing = sorted(k for k in set(resumed) | set(whole)
                       if k not in TIMES + ("run_dir",) and resumed.get(k) != whole.get(k))
    result = dict(
        command=command_line("benchmarks/explain_resume.py", argv, "HF_HUB_OFFLINE=1"),
        run=args.run, threads=args.threads,
        uninterrupted_run=dict(seconds=whole_s, return_code=whole_rc, explain_seconds=whole["seconds"]),
        first_run=dict(seconds=first_s, return_code=first_rc, nodes_saved=saved),
        second_run=dict(seconds=second_s, return_code=second_rc,
                        went_on="resuming:" in second_log,
                        explain_seconds=resumed["seconds"], resumed_seconds=resumed["resumed_seconds"]),
        nodes=list(whole["nodes"]),
        same_nodes=resumed["nodes"] == whole["nodes"], keys_differing=differing)
    print(json.dumps({k: v for k, v in result.items() if k != "command"}, indent=1))
    if args.json:
        write_json(args.json, result)
    return 0 if result["same_nodes"] and not differing else 1


if __name__ == "__main__":
    sys.exit(main())
