"""One rule on both sides: frozen EAP-IG against condensed C1, each judged by the same named rule
on the same rows (docs/fidelity.md).

    python benchmarks/one_rule.py --tasks ioi agreement --out benchmarks/results/one_rule_smollm2.json

For each task, on SmolLM2-135M:
- rule `faithfulness` (f >= 0.9): the shipped frozen EAP-IG circuit (checkpoints/eap_ig_<tag>_<task>,
  the smallest top-n with f >= 0.9 on its val rows) against the C1 condensed with
  gate_faithfulness=0.9 (checkpoints/condense_<tag>_<task>_f09: each round's val f >= 0.9 beside
  the accuracy gate) and against the shipped C1 (accuracy gate only);
- rule `gate` (accuracy within gate_accuracy_tol of the original's, the empty circuit below it):
  the frozen EAP-IG ranking searched under it on the shipped C1's own val rows (its n_val, seed),
  against the shipped C1, which its loop accepted under that rule.
Every circuit is then evaluated on the same test rows (the runs' n_test, seed 0), against the
original model's outputs: faithfulness (bootstrap 95 % interval over rows) and accuracy (Wilson).
A ratio is printed only between two circuits found under the same rule. Results are written after
each task (a rerun skips tasks already there).
"""
import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from condense import tasks  # noqa: E402
from condense.artifacts import write_json  # noqa: E402
from condense.curves import Rule, smallest_passing  # noqa: E402
from condense.evaluate import EvalReference, empty_logit_diffs, evaluate, reference_outputs  # noqa: E402
from condense.fidelity import original, to_json  # noqa: E402
from condense.graph import Graph  # noqa: E402
from condense.intervals import bootstrap, faithfulness_ratio, proportion  # noqa: E402
from condense.models import model_tag  # noqa: E402
from condense.runs import read_run  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def log(msg):
    print(f"[one rule] {msg}", file=sys.stderr, flush=True)


def judged(model, circuit, rows, ref, batch_size, healed):
    """The circuit on `rows` against the original's outputs `ref`: f and accuracy with intervals."""
    reference = ref
    if healed:  # the empty circuit is the healed model's, as the gate takes it
        reference = EvalReference(ref.full_logits, empty_logit_diffs(model, circuit, rows, "patching", batch_size),
                                  "patching")
    m = evaluate(model, circuit, rows, "patching", batch_size, reference=reference, per_row=True)
    r = m["per_row"]
    return dict(edges=circuit.count_edges(on_path=True), n=m["n"],
                faithfulness=bootstrap([r["logit_diff"], r["logit_diff_full"], r["logit_diff_empty"]],
                                       faithfulness_ratio),
                accuracy=proportion(r["logit_diff"] > 0), accuracy_original=proportion(r["logit_diff_full"] > 0),
                choice_agreement=proportion((r["logit_diff"] > 0) == (r["logit_diff_full"] > 0)))


def one_task(task, model_name, gate_search, batch_size):
    tag = model_tag(model_name)
    c1 = read_run(os.path.join(ROOT, "checkpoints", f"condense_{tag}_{task}"))
    f09_path = os.path.join(ROOT, "checkpoints", f"condense_{tag}_{task}_f09")
    eap = os.path.join(ROOT, "checkpoints", f"eap_ig_{tag}_{task}")
    net, tok, _ = c1.load_model(threads=1)
    cfg = c1.config
    test = tasks.load_task(task, tok, "test", n=cfg.n_test, seed=cfg.seed)
    with original(net):
        ref = reference_outputs(net, Graph.from_model(net), test, "patching", batch_size)
    with open(os.path.join(eap, "metrics.json")) as f:
        eap_metrics = json.load(f)
    frozen = Graph.from_json(os.path.join(eap, "circuit.json.gz"), net)
    out = dict(task=task, test_rows=len(test), seed=cfg.seed)
    start = time.perf_counter()
    with original(net):
        out["eap_ig_faithfulness_rule"] = dict(judged(net, frozen, test, ref, batch_size, False),
                                               found_on=f"val, {eap_metrics['n_val']} rows, f >= 0.9")
    out["c1_gate_rule"] = dict(judged(net, c1.circuit(net), test, ref, batch_size, True),
                               found_on=f"val, {cfg.n_val} rows, accuracy within {cfg.gate_accuracy_tol:g}")
    if os.path.isdir(f09_path):
        f09 = read_run(f09_path)
        net9, _, _ = f09.load_model(threads=1)
        out["c1_faithfulness_rule"] = dict(judged(net9, f09.circuit(net9), test, ref, batch_size, True),
                                           found_on=f"val, {f09.config.n_val} rows, accuracy within "
                                                    f"{f09.config.gate_accuracy_tol:g} and f >= 0.9")
        del net9
    log(f"{task}: judged on test in {time.perf_counter() - start:.0f} s")
    if gate_search:  # the frozen ranking under C1's own rule, on C1's own val rows
        val = tasks.load_task(task, tok, "val", n=cfg.n_val, seed=cfg.seed)
        ranking = Graph.from_json(os.path.join(eap, "circuit.json.gz"), net)
        ranking.reset()
        rule = Rule("gate", accuracy_tol=cfg.gate_accuracy_tol, empty_fails=cfg.gate_empty_fails)
        start = time.perf_counter()
        with original(net):
            found = smallest_passing(net, ranking, val, rule, batch_size=batch_size, resolution=0.01,
                                     progress=lambda m: log(f"{task} gate search: {m}"))
            out["eap_ig_gate_rule"] = dict(
                judged(net, found.graph, test, ref, batch_size, False) if found.graph is not None else {},
                found_on=f"val, {len(val)} rows (C1's), {rule.describe()}", search=found.evaluated_json(),
                seconds=time.perf_counter() - start)
    sizes = lambda a, b: (out[a]["edges"] / out[b]["edges"]) if a in out and b in out and out[b].get("edges") else None  # noqa: E731
    out["ratios"] = dict(faithfulness_rule=sizes("eap_ig_faithfulness_rule", "c1_faithfulness_rule"),
                         gate_rule=sizes("eap_ig_gate_rule", "c1_gate_rule"))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="base model of the shipped runs")
    ap.add_argument("--tasks", nargs="+", default=["ioi", "agreement"], help="tasks with a shipped EAP-IG run and C1s")
    ap.add_argument("--no-gate-search", action="store_true", help="skip the frozen search under `gate`")
    ap.add_argument("--batch-size", type=int, default=16, help="prompts per pass")
    ap.add_argument("--out", required=True, help="JSON of the results, written after each task")
    args = ap.parse_args(argv)
    results = {}
    if os.path.exists(args.out):
        with open(args.out) as f:
            results = json.load(f).get("tasks", {})
    for task in args.tasks:
        if task in results:
            continue
        results[task] = to_json(one_task(task, args.model, not args.no_gate_search, args.batch_size))
        geo = {}
        for rule in ("faithfulness_rule", "gate_rule"):
            r = [v["ratios"][rule] for v in results.values() if v["ratios"].get(rule)]
            geo[rule] = dict(tasks=len(r), geometric_mean=math.exp(sum(map(math.log, r)) / len(r)) if r else None)
        write_json(args.out, dict(command="python benchmarks/one_rule.py " + " ".join(sys.argv[1:]),
                                  model=args.model, tasks=results, geometric_means=geo))
        log(f"{task}: ratios {results[task]['ratios']}")
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main())
