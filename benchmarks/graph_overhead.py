"""Cost of the exact edge-level forward against the plain Hugging Face forward.

    HF_HUB_OFFLINE=1 python benchmarks/graph_overhead.py [--repeats 20] [--json PATH]

For the organism and a GPT-2-small-shaped model with random weights (batch 8, 32 tokens):
wall time of `run_graph` with every edge on under patching (which runs the corrupted prompt
too) against plain forwards over the same clean and corrupted prompts, and the peak extra
memory of each, measured in a fresh subprocess (a thread samples the resident set every
millisecond during the call; peak minus the level just before).
Then `evaluate` on 200 organism IOI rows against plain forwards over the same prompts.
Times are ratios within one run: the machine is shared and noisy.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import torch

from process_memory import rss_mib

ROOT = os.path.join(os.path.dirname(__file__), "..")


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


def peak_during(fn):
    """Peak resident-set growth (MiB) while `fn` runs, sampled every millisecond."""
    import threading
    base, peak, done = rss_mib(), [0.0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss_mib() - base)
            time.sleep(0.001)
    t = threading.Thread(target=sample)
    t.start()
    try:
        fn()
    finally:
        done.set()
        t.join()
    return max(peak[0], rss_mib() - base)


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
        if kind == "plain":
            mib = peak_during(lambda: (model(input_ids=clean), model(input_ids=corrupted)))
        else:
            mib = peak_during(lambda: run_graph(model, graph, clean, corrupted))
    print(json.dumps(dict(peak_mib=mib)))


def peak(which, kind):
    out = subprocess.run([sys.executable, __file__, "--one", which, kind, "--threads", "1"],
                         capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_mib"]


def timed(fns, repeats):
    """Median wall time of each function, calls interleaved so that load from other
    processes falls on all of them alike."""
    for fn in fns:
        fn()
    times = [[] for _ in fns]
    for _ in range(repeats):
        for fn, ts in zip(fns, times):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
    return [sorted(ts)[len(ts) // 2] for ts in times]


@torch.no_grad()
def forward_costs(which, repeats):
    from condense.graph import Graph
    from condense.patching import run_graph
    model = build(which)
    graph = Graph.from_model(model)
    clean, corrupted = inputs(model)
    plain, patched = timed([lambda: (model(input_ids=clean), model(input_ids=corrupted)),
                            lambda: run_graph(model, graph, clean, corrupted)], repeats)
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
    ref = reference_outputs(model, graph, rows)
    plain, circuit_only, whole = timed([
        lambda: (last_logits(model, rows["clean_ids"], 32), last_logits(model, rows["corrupted_ids"], 32)),
        lambda: evaluate(model, graph, rows, reference=ref),
        lambda: evaluate(model, graph, rows)], repeats)
    return dict(rows=200, plain_clean_plus_corrupted_s=plain, evaluate_s=whole,
                evaluate_ratio=whole / plain, evaluate_with_reference_s=circuit_only,
                evaluate_with_reference_ratio=circuit_only / plain)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=20, help="timed rounds after a warm-up (median)")
    ap.add_argument("--json", default=None, help="also write the numbers here")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is steadiest)")
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
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
