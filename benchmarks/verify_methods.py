"""The verifier's two subset evaluations on one run's circuit: the sparse path (only circuit
nodes recomputed; on Gemma2/3 a layer's heads together) against the dense one (one exact
patched forward per subset). Same subsets, same rows, one process: time ratio and the largest
difference in mean logit difference.

    HF_HUB_OFFLINE=1 python benchmarks/verify_methods.py [--run checkpoints/condense_gemma3_induction]
        [--n 40] [--subsets 40] [--threads 1] [--json PATH]

The subsets are drawn (seeded) from what `condense verify --local` evaluates: the circuit,
every circuit without one edge, every circuit without two. The sparse path's cost per prompt
batch (the corrupted and empty-circuit runs) is fixed, so its lead grows with the number of
subsets; the dense path's cost is per subset, so its rate on a sample holds for any number.
The sparse path is also timed on every subset `--local` evaluates (`sparse_all_*`), and
`ratio_all` compares that rate with the dense one.
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", default="checkpoints/condense_gemma3_induction",
                    help="a run folder (circuit.json, recipe.yaml, adapter)")
    ap.add_argument("--n", type=int, default=40, help="test rows")
    ap.add_argument("--subsets", type=int, default=40, help="subsets drawn from --local's")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--json", default=None, help="also write the numbers here")
    args = ap.parse_args(argv)

    from condense import tasks
    from condense.artifacts import command_line, write_json
    from condense.config import RecipeError
    from condense.runs import read_run
    from condense.verify.local import local_masks
    from condense.verify.subsets import SubsetEvaluator

    try:
        run = read_run(args.run, "verify")
    except (FileNotFoundError, RecipeError) as e:
        raise SystemExit(str(e)) from None
    net, tokenizer, _ = run.load_model(None, None, None, args.threads, "as run")
    cfg = run.config
    rows = tasks.load_task(cfg.task, tokenizer, "test", n=args.n, seed=cfg.seed)
    graph = run.circuit(net)
    masks = local_masks(graph.n_edges)
    gen = torch.Generator().manual_seed(0)
    pick = masks[torch.randperm(len(masks), generator=gen)[:args.subsets]]
    out = dict(command=command_line("benchmarks/verify_methods.py", env="HF_HUB_OFFLINE=1"),
               run=args.run, model=cfg.model, task=cfg.task, edges=graph.n_edges, rows=args.n,
               subsets=len(pick), threads=args.threads)
    ld = {}
    for method in ("sparse", "dense"):
        ev = SubsetEvaluator(net, graph, rows, cfg.intervention, batch_size=cfg.batch_size,
                             method=method)
        start = time.perf_counter()
        ld[method] = ev.mean_logit_diffs(pick)
        out[f"{method}_s"] = time.perf_counter() - start
        out[f"{method}_per_s"] = len(pick) * args.n / out[f"{method}_s"]
        print(f"{method}: {out[f'{method}_s']:.1f} s, {out[f'{method}_per_s']:.0f} subset x prompt/s",
              flush=True)
    out["ratio"] = out["dense_s"] / out["sparse_s"]
    start = time.perf_counter()
    SubsetEvaluator(net, graph, rows, cfg.intervention, batch_size=cfg.batch_size,
                    method="sparse").mean_logit_diffs(masks)
    out["sparse_all_subsets"] = len(masks)
    out["sparse_all_s"] = time.perf_counter() - start
    out["sparse_all_per_s"] = len(masks) * args.n / out["sparse_all_s"]
    out["ratio_all"] = out["sparse_all_per_s"] / out["dense_per_s"]
    print(f"sparse on all {len(masks)} local subsets: {out['sparse_all_s']:.1f} s, "
          f"{out['sparse_all_per_s']:.0f} subset x prompt/s, {out['ratio_all']:.0f}x the dense rate")
    out["max_abs_difference"] = float((ld["sparse"] - ld["dense"]).abs().max())
    print(f"on the same {len(pick)} subsets sparse is {out['ratio']:.1f}x faster; largest "
          f"|difference| {out['max_abs_difference']:.2e} (logit differences "
          f"{float(ld['dense'].min()):.2f} to {float(ld['dense'].max()):.2f})")
    if args.json:
        write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
