"""The CPU time of one mask-training step (forward and backward of the patched graph) on
SmolLM2-135M induction, 8 rows, one thread, for three edge masks: every gate at 1 (Edge
Pruning's first steps from log alpha 10, where every hard-concrete sample is exactly 1), a mask
like HAP's start (a random 40 % of the edges at 1, the rest at 0; HAP keeps EAP's top 40 %) and
a mid-training mask (uniform values).
The patched forward computes a block of senders once when every receiver reads it with the same
mask value, so an all-ones mask is cheaper; HAP's steps never have one.

    HF_HUB_OFFLINE=1 python benchmarks/mask_step_cost.py [--json PATH]

Three repetitions per mask, interleaved; the median is reported.
"""
import argparse
import json
import time

import torch

from condense import tasks
from condense.artifacts import command_line
from condense.evaluate import dataset_columns
from condense.graph import Graph
from condense.metrics import pad_batch
from condense.models import load_model, load_tokenizer
from condense.patching import run_graph


def step_seconds(model, graph, batch, mask) -> float:
    """CPU seconds of one forward and backward through the patched graph under `mask`."""
    clean, corrupted, attn, lengths = batch
    mask = mask.clone().requires_grad_(True)
    start = time.process_time()
    logits = run_graph(model, graph, clean, corrupted, attn, edge_mask=mask,
                       logit_positions=lengths - 1)
    logits.float().logsumexp(-1).sum().backward()
    return time.process_time() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=None, help="write the numbers here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model, tokenizer = load_model("smollm2-135m"), load_tokenizer("smollm2-135m")
    for p in model.parameters():
        p.requires_grad_(False)
    cols, _ = dataset_columns(tasks.load_task("induction", tokenizer, "train", n=8, seed=0))
    clean, attn, lengths = pad_batch([list(ids) for ids in cols["clean_ids"]])
    corrupted, _, _ = pad_batch([list(ids) for ids in cols["corrupted_ids"]])
    graph = Graph.from_model(model)
    valid = graph.valid.float()
    gen = torch.Generator().manual_seed(0)
    masks = {"all gates at 1": valid.clone(),
             "HAP start (40 % at 1)": (torch.rand(valid.shape, generator=gen) < 0.4).float() * valid,
             "mid-training (uniform values)": torch.rand(valid.shape, generator=gen) * valid}
    seconds = {name: [] for name in masks}
    for _ in range(3):
        for name, mask in masks.items():
            seconds[name].append(step_seconds(model, graph, (clean, corrupted, attn, lengths), mask))
    median = {name: sorted(ts)[1] for name, ts in seconds.items()}
    for name, ts in seconds.items():
        print(f"{name}: CPU s per step {median[name]:.2f} (of {', '.join(f'{x:.2f}' for x in ts)})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(command=command_line("benchmarks/mask_step_cost.py"),
                           cpu_seconds=seconds, median=median), f, indent=1)


if __name__ == "__main__":
    main()
