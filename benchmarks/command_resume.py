"""`condense explain` or `condense card` stopped part way and run again: does the second run go
on from what the first saved, and write what an uninterrupted run writes?

    HF_HUB_OFFLINE=1 python benchmarks/command_resume.py explain checkpoints/condense_gemma3_ioi \\
        --stop-at 1 --out runs/explain_resume --uninterrupted runs/explain_resume_whole \\
        --json benchmarks/results/explain_resume_gemma3_ioi.json
    HF_HUB_OFFLINE=1 python benchmarks/command_resume.py card smollm2-135m --n 64 \\
        --ablation-rows 32 --stop-at 20 --out runs/card_resume \\
        --uninterrupted runs/card_resume_whole --json benchmarks/results/card_resume_smollm2.json

The command runs three times, one thread each: once without interruption (into
--uninterrupted), then into --out killed (SIGTERM, as a batch scheduler ends a job at its time
limit) as soon as its resume file holds --stop-at units of work (explain: nodes explained;
card: tasks measured plus head-ablation layers done), then the same command again. The resumed
output (explain.json, card.json) is compared with the uninterrupted one's, every value but the
times and the output folder."""
import argparse
import json
import os
import sys

import torch

from interrupted import ROOT, run_command

sys.path.insert(0, ROOT)
from condense.artifacts import command_line, read_json, write_json  # noqa: E402
from condense.card import STATE_FILE as CARD_STATE  # noqa: E402
from condense.explain.run import STATE_FILE as EXPLAIN_STATE  # noqa: E402

# per command: its module, its resume file, its output, the keys that may differ between runs
COMMANDS = dict(
    explain=("condense.explain", EXPLAIN_STATE, "explain.json", ("seconds", "resumed_seconds")),
    card=("condense.card", CARD_STATE, "card.json",
          ("seconds", "resumed_seconds", "command", "threads")))


def work_saved(kind: str, out: str) -> int:
    """The units of work the resume file in `out` holds (0 while absent or being replaced)."""
    try:
        state = torch.load(os.path.join(out, COMMANDS[kind][1]), weights_only=True)
    except Exception:  # absent, or caught mid-write
        return 0
    if kind == "explain":
        return len(json.loads(state["nodes"]))
    memo = state["memo"]
    return len(memo.get("tasks", {})) + sum(memo.get("ablation", {}).get("layers_done", {}).values())


def run(kind, target, out, extra, stop_at=None):
    """(seconds, return code, its log, the work saved when killed) of one command."""
    cmd = [sys.executable, "-m", COMMANDS[kind][0], target, "--out", out, *extra]
    os.makedirs(out, exist_ok=True)

    def watch():
        return work_saved(kind, out) >= stop_at
    seconds, rc, log = run_command(cmd, os.path.join(out, f"{kind}_resume.log"), watch,
                                   None if stop_at is None else 0.0)
    return seconds, rc, log, work_saved(kind, out) if stop_at is not None else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=sorted(COMMANDS), help="the command")
    ap.add_argument("target", help="explain: a run folder; card: a model")
    ap.add_argument("--stop-at", type=int, default=1,
                    help="SIGTERM the first run once its resume file holds this much work")
    ap.add_argument("--out", default=None, help="where the two resumed runs write")
    ap.add_argument("--uninterrupted", default=None,
                    help="where the same command runs once without interruption")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of every run")
    ap.add_argument("--n", type=int, default=None, help="card: test prompts per task")
    ap.add_argument("--ablation-rows", type=int, default=None, help="card: IOI rows of the ablation")
    ap.add_argument("--json", help="write the times and the comparison here")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    out = args.out or f"runs/{args.kind}_resume"
    whole_dir = args.uninterrupted or f"runs/{args.kind}_resume_whole"
    _, state_file, output, times = COMMANDS[args.kind]
    extra = ["--threads", str(args.threads)]
    for flag, value in (("--n", args.n), ("--ablation-rows", args.ablation_rows)):
        if value is not None:
            extra += [flag, str(value)]
    for folder in (out, whole_dir):
        for name in (output, state_file):
            if os.path.exists(os.path.join(folder, name)):
                os.remove(os.path.join(folder, name))
    whole_s, whole_rc, whole_log, _ = run(args.kind, args.target, whole_dir, extra)
    if whole_rc != 0:
        sys.exit(f"the uninterrupted run failed (rc {whole_rc}):\n{whole_log[-2000:]}")
    first_s, first_rc, first_log, saved = run(args.kind, args.target, out, extra, args.stop_at)
    if os.path.exists(os.path.join(out, output)):
        sys.exit("the first run finished before it was stopped")
    print(f"first run killed after {first_s:.0f}s (rc {first_rc}), work saved: {saved}", flush=True)
    second_s, second_rc, second_log, _ = run(args.kind, args.target, out, extra)
    if second_rc != 0:
        sys.exit(f"the second run failed (rc {second_rc}):\n{second_log[-2000:]}")
    resumed, whole = (read_json(os.path.join(d, output)) for d in (out, whole_dir))
    differing = sorted(k for k in set(resumed) | set(whole)
                       if k not in times and resumed.get(k) != whole.get(k))
    result = dict(
        command=command_line("benchmarks/command_resume.py", argv, "HF_HUB_OFFLINE=1"),
        kind=args.kind, target=args.target, threads=args.threads,
        uninterrupted_run=dict(seconds=whole_s, return_code=whole_rc, reported_seconds=whole["seconds"]),
        first_run=dict(seconds=first_s, return_code=first_rc, work_saved=saved),
        second_run=dict(seconds=second_s, return_code=second_rc,
                        went_on=any(w in second_log for w in ("resuming:", "going on:")),
                        reported_seconds=resumed["seconds"],
                        resumed_seconds=resumed["resumed_seconds"]),
        keys_compared=sorted(k for k in whole if k not in times),
        keys_differing=differing)
    print(json.dumps({k: v for k, v in result.items() if k != "command"}, indent=1))
    if args.json:
        write_json(args.json, result)
    return 0 if not differing else 1


if __name__ == "__main__":
    sys.exit(main())
