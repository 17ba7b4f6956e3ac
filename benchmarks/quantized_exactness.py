"""The graph against a quantized model's own forward, with and without condense's pinning.

    HF_HUB_OFFLINE=1 python benchmarks/quantized_exactness.py [--model checkpoints/organism]
        [--rows 16] [--json benchmarks/results/quantized_exactness.json]

For 4-bit and 8-bit: the model loaded by condense.models.load_model (its quantized layers
pinned to the dequantized-weight computation, condense.quantized) and the same load with the
pinning skipped (bitsandbytes as shipped). On `--rows` IOI test rows, in eval mode: the largest
logit difference between run_graph with every edge on and the model's own forward, and between
a random half of the edges computed through the dequantized weights and through the quantized
modules called head by head (model_parts.FORCE_GENERIC_PROJECTIONS). Unpinned, the graph calls
the quantized modules head by head throughout (it refuses to read a repacked weight).
"""
import argparse
import json
import os

import torch

import condense.model_parts as model_parts
import condense.quantized as quantized
from condense import tasks
from condense.artifacts import command_line
from condense.evaluate import dataset_columns, row_batches
from condense.graph import Graph
from condense.models import load_model, load_tokenizer
from condense.patching import run_graph


def measure(model_name, quantization, pinned, rows):
    real_pin = quantized.pin_dequantized_compute
    if not pinned:  # load_model looks the function up at call time
        quantized.pin_dequantized_compute = lambda model, dtype: 1
    try:
        model = load_model(model_name, quantization=quantization, device="cpu")
    finally:
        quantized.pin_dequantized_compute = real_pin
    cols, n = dataset_columns(rows)
    _, clean, corrupted, mask, _ = next(row_batches(cols, n, n, "cpu"))
    real = mask.bool()
    g = Graph.from_model(model)

    def through_modules(graph):
        model_parts.FORCE_GENERIC_PROJECTIONS = True
        try:
            return run_graph(model, graph, clean, corrupted, mask)
        finally:
            model_parts.FORCE_GENERIC_PROJECTIONS = False
    with torch.no_grad():
        own = model(input_ids=clean, attention_mask=mask).logits
        # unpinned, the graph cannot read a repacked weight (condense.quantized refuses it):
        # it calls the quantized modules head by head instead
        try:
            full = run_graph(model, g, clean, corrupted, mask) if pinned else through_modules(g)
        except RuntimeError as e:  # unpinned 8-bit layers take no input of more than 3 dims
            return dict(quantization=quantization, pinned=pinned, full_graph_vs_model=None,
                        half_circuit_weights_vs_modules=None,
                        logit_scale=float(own[real].abs().max()),
                        error=f"{type(e).__name__}: {str(e).splitlines()[0]}")
        half = None
        if pinned:
            g.scores = torch.rand(g.scores.shape, generator=torch.Generator().manual_seed(0))
            g.apply_topn(g.n_edges // 2)
            fast = run_graph(model, g, clean, corrupted, mask)
            half = float((fast - through_modules(g))[real].abs().max())
    return dict(quantization=quantization, pinned=pinned,
                full_graph_vs_model=float((full - own)[real].abs().max()),
                half_circuit_weights_vs_modules=half, logit_scale=float(own[real].abs().max()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="checkpoints/organism", help="model name or folder")
    ap.add_argument("--rows", type=int, default=16, help="IOI test rows (one batch)")
    ap.add_argument("--json", default="benchmarks/results/quantized_exactness.json",
                    help="write the results here as JSON "
                         "(default: benchmarks/results/quantized_exactness.json)")
    args = ap.parse_args()
    rows = tasks.load_task("ioi", load_tokenizer(args.model), "test", n=args.rows, seed=0)
    results = []
    for quantization in ("4bit", "8bit"):
        for pinned in (True, False):
            r = measure(args.model, quantization, pinned, rows)
            results.append(r)
            half = r["half_circuit_weights_vs_modules"]
            if r["full_graph_vs_model"] is None:
                print(f"{quantization} as shipped: the graph fails ({r['error']})", flush=True)
                continue
            print(f"{quantization} {'pinned' if pinned else 'as shipped'}: full graph vs model "
                  f"{r['full_graph_vs_model']:.2e}" + ("" if half is None else
                  f", half circuit weights vs modules {half:.2e}")
                  + f" (logits up to {r['logit_scale']:.1f})", flush=True)
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(dict(command=command_line("benchmarks/quantized_exactness.py", env="HF_HUB_OFFLINE=1"),
                       model=args.model, rows=args.rows,
                       results=results), f, indent=1)
    print(f"-> {args.json}")


if __name__ == "__main__":
    main()
