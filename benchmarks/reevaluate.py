"""A condensation run's test metrics measured again with the current code, beside the numbers
its metrics.json recorded: after a change to the patched forward, which shipped results moved.

    HF_HUB_OFFLINE=1 python benchmarks/reevaluate.py RUN [RUN ...] [--threads 1] [--json PATH]

For each run folder (circuit.json, adapter, recipe.yaml): the run's test rows, the original
model's reference (the base with the adapter off) and the circuit with its adapter, measured as
the loop's final evaluation measures them (condense.methods.condensation.gate.circuit_metrics):
accuracy, faithfulness, KL, top-1 agreement and the empty circuit's accuracy, each with the
recorded value and the difference. A scoring run (EAP, EAP-IG, ...; no adapter): its circuit's
faithfulness on the val rows it was chosen on (`faithfulness_val`, the search's criterion) and
its test metrics.
"""
import argparse
import contextlib
import json
import os
import time

KEYS = ("accuracy", "accuracy_original", "faithfulness", "faithfulness_val", "kl", "top1_agreement",
        "accuracy_empty")


def reevaluate(run_dir: str, threads: int = 1) -> dict:
    from condense import tasks
    from condense.evaluate import reference_outputs
    from condense.methods.condensation.gate import circuit_metrics
    from condense.runs import read_run

    start = time.time()
    run = read_run(run_dir, "re-evaluate")
    cfg = run.config
    net, tokenizer, _ = run.load_model(threads=threads)
    rows = tasks.load_task(cfg.task, tokenizer, "test", n=cfg.n_test, seed=cfg.seed)
    circuit = run.circuit(net)
    # under mean ablation removed edges carry the run's own means (the original's, for condense)
    means = run.means(net, circuit, tokenizer)
    with net.disable_adapter() if run.adapter else contextlib.nullcontext():  # the original
        original = reference_outputs(net, circuit, rows, cfg.intervention, cfg.batch_size,
                                     means=means)
    now = circuit_metrics(net, circuit, rows, original, cfg, means=means)
    now["accuracy_original"] = now["accuracy_full"]
    if cfg.method != "condense":  # a frozen-model search: also the val rows that chose it
        from condense.evaluate import evaluate
        val = tasks.load_task(cfg.task, tokenizer, "val", n=cfg.n_val, seed=cfg.seed)
        now["faithfulness_val"] = evaluate(net, circuit, val, cfg.intervention,
                                           cfg.batch_size, means=means)["faithfulness"]
    with open(os.path.join(run_dir, "metrics.json")) as f:
        recorded = json.load(f)
    out = dict(run=run_dir, task=cfg.task, edges=circuit.count_edges(), rows=len(rows),
               seconds=time.time() - start)
    for k in KEYS:
        out[k] = now.get(k)
        out[f"{k}_recorded"] = recorded.get(k)
        if out[k] is not None and recorded.get(k) is not None:
            out[f"{k}_change"] = out[k] - recorded[k]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+",
                    help="run folders (circuit.json, recipe.yaml, metrics.json; an adapter if healed)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--json", default=None, help="also write the results here as JSON")
    args = ap.parse_args(argv)
    rows = []
    for run_dir in args.runs:
        r = reevaluate(run_dir, args.threads)
        print(json.dumps(r), flush=True)
        rows.append(r)
    if args.json:
        from condense.artifacts import command_line, write_json
        write_json(args.json, dict(command=command_line("benchmarks/reevaluate.py", argv), rows=rows))


if __name__ == "__main__":
    main()
