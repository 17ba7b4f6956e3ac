"""How many accepted rounds of the shipped condensation runs sit within sampling noise of the gate's
accuracy floor (recipe key gate_confidence; docs/condensation.md).

    python benchmarks/gate_noise.py --out benchmarks/results/gate_noise.json

A round is accepted when its circuit's val accuracy is at least the original's minus
gate_accuracy_tol. On n_val rows that accuracy carries sampling noise, and C1s stop at the floor
by design. For each accepted round this reads rounds.jsonl (no model is loaded) and asks whether
the margin over the floor is inside the one-sided 95 % bound of the paired difference, with the
*least* noise the two accuracies allow: only the rows that make up the accuracy difference are
discordant, all one way. A round within that much noise is within noise under any pairing, so the
counts are lower bounds. Runs without rounds (EAP-IG scorings, heal-only controls) are skipped.
"""
import argparse
import json
import math
import os
import sys
from statistics import NormalDist

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from condense.artifacts import read_json, read_jsonl, write_json  # noqa: E402
from condense.runs import read_run  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def least_noise(accuracy: float, original: float, n: int) -> float:
    """Standard error of the paired mean difference when only |accuracy - original| * n rows
    are discordant, all one way: the least noise two accuracies on the same n rows allow."""
    k = round(abs(accuracy - original) * n)
    p = k / n
    return math.sqrt(p * (1 - p) * n / max(1, n - 1) / n)


def run_rounds(path: str, z: float) -> dict:
    run = read_run(path)
    metrics = read_json(os.path.join(path, "metrics.json"))
    n, original = int(metrics["n_val"]), float(metrics["accuracy_original_val"])
    tol = run.config.gate_accuracy_tol
    floor = original - tol
    rounds = [r for r in read_jsonl(os.path.join(path, "rounds.jsonl")) if r.get("accepted")]
    out = []
    for r in rounds:
        margin = r["accuracy"] - floor
        se = least_noise(r["accuracy"], original, n)
        out.append(dict(round=r["round"], edges=r["edges"], accuracy=r["accuracy"], margin=margin,
                        least_se=se, within_noise=bool(margin < z * se - 1e-12)))
    final = out[-1] if out else None
    return dict(task=run.config.task, n_val=n, accuracy_original_val=original, accuracy_tol=tol,
                accepted_rounds=len(out), within_noise=sum(r["within_noise"] for r in out),
                c1_within_noise=bool(final and final["within_noise"]),
                c1_margin=final["margin"] if final else None, rounds=out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON of every run's accepted rounds")
    ap.add_argument("--confidence", type=float, default=0.95, help="one-sided confidence of the bound")
    args = ap.parse_args(argv)
    z = NormalDist().inv_cdf(args.confidence)
    folder = os.path.join(ROOT, "checkpoints")
    runs = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name.startswith("condense_") and os.path.exists(os.path.join(path, "rounds.jsonl")):
            runs[name] = run_rounds(path, z)
            r = runs[name]
            print(f"{name}: {r['within_noise']} of {r['accepted_rounds']} accepted rounds within noise "
                  f"of the floor; C1 margin {r['c1_margin']:+.3f}{' (within noise)' if r['c1_within_noise'] else ''}",
                  file=sys.stderr)
    total = sum(r["accepted_rounds"] for r in runs.values())
    within = sum(r["within_noise"] for r in runs.values())
    c1 = sum(r["c1_within_noise"] for r in runs.values())
    summary = dict(runs=len(runs), accepted_rounds=total, within_noise=within, c1s=len(runs), c1s_within_noise=c1)
    print(f"{within} of {total} accepted rounds, and {c1} of {len(runs)} C1s, are within the one-sided "
          f"{args.confidence:.0%} noise of the floor (least-noise pairing: lower bounds)", file=sys.stderr)
    write_json(args.out, dict(command=" ".join(["python", "benchmarks/gate_noise.py", *(argv or sys.argv[1:])]),
                              confidence=args.confidence, summary=summary, runs=runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
