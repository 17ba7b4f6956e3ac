"""A condensation adapter over the base it was healed on and over the others.

    HF_HUB_OFFLINE=1 python benchmarks/quantized_adapter.py RUN [RUN ...] [--n 200] [--threads 2]
        [--json benchmarks/results/quantized_adapter.json]

For each run folder (a condensation run: circuit.json, adapter, recipe.yaml) and each base
(full precision, 4-bit NF4, 8-bit): the run's adapter loaded with PEFT over that base, its
circuit scored on `--n` test rows against that base's own original (the same model with the
adapter disabled, every edge on): accuracy, logit difference, faithfulness, KL and top-1
agreement, as condensation reports them. The base the run was healed on is marked.
"""
import argparse
import json
import os
import time

BASES = (None, "4bit", "8bit")


def score(run_dir: str, quantization, n: int, threads: int) -> dict:
    from condense import tasks
    from condense.evaluate import reference_outputs
    from condense.graph import Graph
    from condense.methods.condensation import circuit_metrics
    from condense.runs import read_run

    begin = time.perf_counter()
    run = read_run(run_dir, "score")
    net, tok, _ = run.load_model(device="cpu", threads=threads, quantization=quantization)
    cfg = run.config
    rows = tasks.load_task(cfg.task, tok, "test", n=n, seed=cfg.seed)
    full = Graph.from_model(net)
    # under mean ablation removed edges carry the original's means over the run's train rows,
    # computed over this base, as a run healed on it would have computed them
    means = run.means(net, full, tok)
    with net.disable_adapter():
        original = reference_outputs(net, full, rows, cfg.intervention, cfg.batch_size, means=means)
    circuit = run.circuit(net)
    m = circuit_metrics(net, circuit, rows, original, cfg, means=means)
    keys = ("accuracy", "accuracy_full", "logit_diff", "faithfulness", "kl", "top1_agreement")
    return dict(run=run_dir, base=quantization or "none", healed_on=cfg.quantization or "none",
                edges=circuit.count_edges(on_path=True), n=n, seconds=time.perf_counter() - begin,
                **{k: m[k] for k in keys if k in m})


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="condensation run folders (circuit.json, adapter, recipe.yaml)")
    ap.add_argument("--n", type=int, default=200, help="test rows per run and base")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--json", default="benchmarks/results/quantized_adapter.json",
                    help="write the results here as JSON "
                         "(default: benchmarks/results/quantized_adapter.json)")
    args = ap.parse_args()
    results = []
    for run_dir in args.runs:
        for base in BASES:
            r = score(run_dir, base, args.n, args.threads)
            results.append(r)
            mark = " (healed on)" if r["base"] == r["healed_on"] else ""
            print(f"{os.path.basename(os.path.normpath(run_dir))} over {r['base']}{mark}: "
                  f"{r['edges']} edges, accuracy {r['accuracy']:.3f} (original "
                  f"{r['accuracy_full']:.3f}), faithfulness {r['faithfulness']:.3f}, KL "
                  f"{r['kl']:.3f}, top-1 {r['top1_agreement']:.3f}; {r['seconds']:.0f} s", flush=True)
    from condense.artifacts import command_line
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(dict(command=command_line("benchmarks/quantized_adapter.py", env="HF_HUB_OFFLINE=1"),
                       results=results), f, indent=1)
    print(f"-> {args.json}")


if __name__ == "__main__":
    main()
