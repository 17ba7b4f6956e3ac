"""Cost of the exact edge-level forward against the plain Hugging Face forward.

    HF_HUB_OFFLINE=1 python benchmarks/graph_overhead.py [--repeats 20] [--json PATH]

For the organism and a GPT-2-small-shaped model with random weights (batch 8, 32 tokens):
wall time of `run_graph` with every edge on under patching (which runs the corrupted prompt
too) against plain forwards over the same clean and corrupted prompts, and the peak extra
memory of each, measured in a fresh subprocess as the growth of the peak resident set.
Then `evaluate` on 200 organism IOI rows against plain forwards over the same prompts.
Times are ratios within one run: the machine is shared and noisy.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch

ROOT = os.path.join(os.path.dirname(__file__), "..")
sys.path.insert(0, ROOT)


def build(which):
    from transformers import GPT2Config, GPT2LMHeadModel
    from condense.models import load_model
    if which == "organism":
        return load_model(os.path.join(ROOT, "checkpoints", "organism"))
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(attn_implementation="eager")).eval()


def inputs(model, batch=8, tokens=32):
    g = torch.Generator().manual_seed(0)
    V = model.config.vocab_size
    return torch.randint(V, (batch, tokens), generator=g), torch.randint(V, (batch, tokens), generator=g)


def run_one(which, kind):
    """Runs once in a subprocess: peak RSS growth (MiB) of one call of `kind`."""
    from condense.graph import Graph
    from condense.patching import run_graph
    model = build(which)
    graph = Graph.from_model(model)
    clean, corrupted = inputs(model)
    with torch.no_grad():
        model(input_ids=clean[:1, :4])  # warm up allocators and lazy imports
        run_graph(model, graph, clean[:1, :4], corrupted[:1, :4])
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        if kind == "plain":
            model(input_ids=clean), model(input_ids=corrupted)
        else:
            run_graph(model, graph, clean, corrupted)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps(dict(peak_mib=(after - before) / 1024)))


def peak(which, kind):
    out = subprocess.run([sys.executable, __file__, "--one", which, kind], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_mib"]


def timed(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]  # median


@torch.no_grad()
def forward_costs(which, repeats):
    from condense.graph import Graph
    from condense.patching import run_graph
    model = build(which)
    graph = Graph.from_model(model)
    clean, corrupted = inputs(model)
    plain = timed(lambda: (model(input_ids=clean), model(input_ids=corrupted)), repeats)
    patched = timed(lambda: run_graph(model, graph, clean, corrupted), repeats)
    return dict(model=which, edges=graph.n_edges if hasattr(graph, "n_edges") else None,
                plain_clean_plus_corrupted_s=plain, run_graph_s=patched, time_ratio=patched / plain,
                plain_peak_mib=peak(which, "plain"), run_graph_peak_mib=peak(which, "graph"))


@torch.no_grad()
def evaluate_cost(repeats):
    from condense import tasks
    from condense.evaluate import evaluate, reference_outputs
    from condense.graph import Graph
    from condense.metrics import last_logits
    from condense.models import load_tokenizer
    model = build("organism")
    rows = tasks.load_task("ioi", load_tokenizer(os.path.join(ROOT, "checkpoints", "organism")),
                           "test", n=200)
    graph = Graph.from_model(model)
    plain = timed(lambda: (last_logits(model, rows["clean_ids"], 32),
                           last_logits(model, rows["corrupted_ids"], 32)), repeats)
    ref = reference_outputs(model, graph, rows)
    circuit_only = timed(lambda: evaluate(model, graph, rows, reference=ref), repeats)
    whole = timed(lambda: evaluate(model, graph, rows), max(3, repeats // 4))
    return dict(rows=200, plain_clean_plus_corrupted_s=plain, evaluate_s=whole,
                evaluate_ratio=whole / plain, evaluate_with_reference_s=circuit_only,
                evaluate_with_reference_ratio=circuit_only / plain)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", default=None, help="also write the numbers here")
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(2)
    if args.one:
        return run_one(*args.one)
    out = dict(forward=[forward_costs(w, args.repeats) for w in ("organism", "gpt2-small-shape")],
               evaluate=evaluate_cost(args.repeats), threads=torch.get_num_threads())
    text = json.dumps(out, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
