"""`condense verify` stopped part way and run again: does the second run go on where the first
stopped, and end with the verdict of an uninterrupted run?

    HF_HUB_OFFLINE=1 python benchmarks/verify_resume.py checkpoints/condense_smollm2_induction_continued \\
        --stop-after 10 --out runs/verify_resume --json benchmarks/results/verify_resume_smollm2_induction.json \\
        -- --local --singles --max-removals 256 --no-reduce --threads 1

The first run is killed (SIGTERM, as a batch scheduler ends a job at its time limit; a job
started in the background ignores Ctrl-C's SIGINT) --stop-after seconds after its first save;
the second is the same command. Both write into --out, so the run folder and its own verify.json (the
uninterrupted run made with the same options) stay as they are and serve as the reference."""
import argparse
import json
import os
import sys

from interrupted import run_command

COMPARED = ("circuit_faithful", "irreducible", "one_minimal", "removable_edges",
            "accuracy_circuit", "faithfulness_circuit", "accuracy_without_edge",
            "faithfulness_without_edge", "subsets_evaluated")


def verify(run, out, extra, stop_after=None):
    """(seconds, return code, output) of one `condense verify` run; with stop_after, SIGTERM that
    many seconds after its first save (verify_state.pt appearing in `out`)."""
    cmd = [sys.executable, "-m", "condense.verify", run, "--out", out, *extra]
    return run_command(cmd, os.path.join(out, "verify_resume.log"),
                       os.path.join(out, "verify_state.pt"), stop_after)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="condense verify's own options follow a --")
    ap.add_argument("run", help="a run folder whose verify.json was made with the same options")
    ap.add_argument("--stop-after", type=float, default=10.0,
                    help="seconds after the first run's first save (a minute into its subsets) "
                         "before it gets SIGTERM")
    ap.add_argument("--out", default="runs/verify_resume", help="where both runs write")
    ap.add_argument("--json", help="write the times and the comparison here")
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)  # condense verify's options follow --
    args = ap.parse_args(argv[:cut])
    args.extra = argv[cut + 1:]
    os.makedirs(args.out, exist_ok=True)
    for name in ("verify.json", "verify_state.pt"):
        if os.path.exists(os.path.join(args.out, name)):
            os.remove(os.path.join(args.out, name))
    first_s, first_rc, _ = verify(args.run, args.out, args.extra, args.stop_after)
    state_left = os.path.exists(os.path.join(args.out, "verify_state.pt"))
    second_s, second_rc, err = verify(args.run, args.out, args.extra)
    resumed_line = next((line for line in err.splitlines() if "going on from" in line), None)
    with open(os.path.join(args.out, "verify.json")) as f:
        got = json.load(f)
    with open(os.path.join(args.run, "verify.json")) as f:
        reference = json.load(f)
    same = {k: got.get(k) == reference.get(k) for k in COMPARED}
    result = dict(
        command="HF_HUB_OFFLINE=1 python benchmarks/verify_resume.py " + " ".join(argv),
        run=args.run, verify_options=args.extra, stop_after_s=args.stop_after,
        first_run=dict(seconds=first_s, return_code=first_rc, state_left=state_left),
        second_run=dict(seconds=second_s, return_code=second_rc, resumed_line=resumed_line,
                        resumed_subset_prompts=got.get("resumed_subset_prompts"),
                        subset_prompts=got["subsets_evaluated"] * got["n_rows"],
                        subsets_s=got["timing"]["subsets_s"]),
        reference_subsets_s=reference.get("timing", {}).get("subsets_s"),
        same_as_reference=same, all_same=all(same.values()))
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if result["all_same"] and second_rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
