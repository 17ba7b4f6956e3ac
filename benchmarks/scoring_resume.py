"""An edge scoring run stopped part way and run again: does the second run go on where the first
stopped (no second ranking, only the top-n evaluations left), and end with the circuit and
numbers of an uninterrupted run?

    HF_HUB_OFFLINE=1 python benchmarks/scoring_resume.py checkpoints/eap_ig_smollm2_agreement \\
        --stop-after 60 --out runs/scoring_resume \\
        --json benchmarks/results/scoring_resume_smollm2_agreement.json

The recipe.yaml of a finished scoring run is run three times: once without interruption (into
--uninterrupted), then into --out killed (SIGTERM, as a batch scheduler ends a job at its time
limit) --stop-after seconds after its ranking is saved (state/scoring.pt appearing), that is part
way through its curves, then the same command again. The resumed run is compared with the
uninterrupted one (exactly) and with the shipped run (made by an earlier build: float noise)."""
import argparse
import json
import os
import sys

import torch

from interrupted import ROOT, run_command

sys.path.insert(0, ROOT)
from condense.artifacts import command_line, read_json, write_json  # noqa: E402

TIMES = ("rank_seconds", "curve_seconds", "search_seconds")


def run(recipe, out, extra, stop_after=None):
    """(seconds, return code, its log, the state file's contents when killed) of one run."""
    cmd = [sys.executable, "-m", "condense.train", "--recipe", recipe, f"output_dir={out}", *extra]
    state = os.path.join(out, "state", "scoring.pt")
    seconds, rc, log = run_command(cmd, os.path.join(out, "scoring_resume.log"), state, stop_after)
    saved = (torch.load(state, weights_only=True)
             if stop_after is not None and os.path.exists(state) else None)
    return seconds, rc, log, saved


def circuit(folder):
    path = os.path.join(folder, "circuit.json")
    return read_json(path if os.path.exists(path) else path + ".gz")


def compare(out, reference_dir):
    """How the resumed run in `out` compares with the run in `reference_dir`."""
    resumed, reference = (read_json(os.path.join(d, "metrics.json")) for d in (out, reference_dir))
    differing = sorted(k for k in set(resumed) | set(reference)
                       if k not in TIMES and resumed.get(k) != reference.get(k))
    return dict(run=reference_dir, same_circuit_json=circuit(out) == circuit(reference_dir),
                metrics_differing=differing, times={k: reference[k] for k in TIMES},
                **{k: reference[k] for k in ("edges", "faithfulness", "cpr", "cmd")})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a finished scoring run (its recipe.yaml is run again)")
    ap.add_argument("--stop-after", type=float, default=60.0,
                    help="seconds after the first run saves its ranking before it gets SIGTERM")
    ap.add_argument("--out", default="runs/scoring_resume", help="where both runs write")
    ap.add_argument("--uninterrupted", default="runs/scoring_resume_whole",
                    help="where the same recipe runs once without interruption, for the exact "
                         "comparison (the shipped run may come from another torch build)")
    ap.add_argument("--json", help="write the times and the comparison here")
    ap.add_argument("overrides", nargs="*", help="key=value overrides for every run (threads=1)")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    recipe = os.path.join(args.run, "recipe.yaml")
    for folder in (args.out, args.uninterrupted):
        if os.path.exists(os.path.join(folder, "metrics.json")):
            os.remove(os.path.join(folder, "metrics.json"))
    whole_s, whole_rc, whole_err, _ = run(recipe, args.uninterrupted, args.overrides)
    if whole_rc != 0:
        sys.exit(f"the uninterrupted run failed (rc {whole_rc}):\n{whole_err[-2000:]}")
    first_s, first_rc, first_err, saved = run(recipe, args.out, args.overrides, args.stop_after)
    if saved is None:
        sys.exit(f"the first run ended before it saved its ranking (rc {first_rc}):\n"
                 f"{first_err[-2000:]}")
    done = {name: len(memo) for name, memo in saved["memos"].items()}
    print(f"first run killed after {first_s:.0f}s (rc {first_rc}): ranking saved, "
          f"evaluations saved {done}", flush=True)
    second_s, second_rc, second_err, _ = run(recipe, args.out, args.overrides)
    if second_rc != 0:
        sys.exit(f"the second run failed (rc {second_rc}):\n{second_err[-2000:]}")
    resumed = read_json(os.path.join(args.out, "metrics.json"))
    result = dict(
        command=command_line("benchmarks/scoring_resume.py", argv, "HF_HUB_OFFLINE=1"),
        stop_after=args.stop_after,
        uninterrupted_run=dict(seconds=whole_s, return_code=whole_rc),
        first_run=dict(seconds=first_s, return_code=first_rc, evaluations_saved=done,
                       rank_seconds_saved=saved["rank_seconds"]),
        second_run=dict(seconds=second_s, return_code=second_rc,
                        went_on_from_ranking="ranking: done before" in second_err),
        resumed=dict(times={k: resumed[k] for k in TIMES},
                     **{k: resumed[k] for k in ("edges", "faithfulness", "cpr", "cmd")}),
        against_uninterrupted=compare(args.out, args.uninterrupted),
        against_shipped=compare(args.out, args.run))
    print(json.dumps({k: v for k, v in result.items() if k != "command"}, indent=1))
    if args.json:
        write_json(args.json, result)
    return 0 if (result["against_uninterrupted"]["same_circuit_json"]
                 and not result["against_uninterrupted"]["metrics_differing"]) else 1


if __name__ == "__main__":
    sys.exit(main())
