"""How long `condense verify --local` takes for a circuit's first K one-edge removals, evaluated
in passes of P subsets: the measurement behind verify's LOCAL_SUBSETS_PER_PASS.

    HF_HUB_OFFLINE=1 python benchmarks/local_pass_cost.py checkpoints/condense_smollm2_induction_continued \\
        --removals 256 --per-pass 256 --threads 1 --json benchmarks/results/local_pass_cost_smollm2_induction.json

Each one-edge removal has its own version of every node downstream of its edge, and a pass
keeps them all, so a pass's cost grows faster than its number of subsets."""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a run folder with circuit.json (or .gz), recipe.yaml and its adapter")
    ap.add_argument("--removals", type=int, default=256, help="the first K one-edge removals (from the logits back)")
    ap.add_argument("--per-pass", type=int, default=256, help="subsets evaluated per pass")
    ap.add_argument("--n", type=int, default=200, help="test rows")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--json", help="write the timing here")
    args = ap.parse_args(argv)
    from condense import tasks
    from condense.runs import read_run
    from condense.verify.local import local_masks
    from condense.verify.subsets import SubsetEvaluator

    torch.set_num_threads(args.threads)
    run = read_run(args.run, "verify")
    cfg = run.config
    net, tokenizer, _ = run.load_model(None, None, None, args.threads, "as run")
    rows = tasks.load_task(cfg.task, tokenizer, "test", n=args.n, seed=cfg.seed)
    evaluator = SubsetEvaluator(net, run.circuit(net), rows, cfg.intervention,
                                batch_size=cfg.batch_size, max_subsets_per_pass=args.per_pass)
    masks = local_masks(evaluator.n_edges, pairs=False, removals=args.removals)[1:]
    start = time.perf_counter()
    evaluator.mean_logit_diffs(masks, with_accuracy=True)
    seconds = time.perf_counter() - start
    out = dict(run=args.run, edges=evaluator.n_edges, method=evaluator.method, removals=len(masks),
               per_pass=args.per_pass, rows=args.n, threads=args.threads, seconds=seconds,
               command="HF_HUB_OFFLINE=1 python benchmarks/local_pass_cost.py " + " ".join(argv or sys.argv[1:]))
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
