"""Speed of the exact graph and of edge attribution on a real model, against plain floors.

    HF_HUB_OFFLINE=1 python benchmarks/real_model_speed.py [--model smollm2-135m] [--task ioi]
        [--batch 16] [--repeats 5] [--threads 1] [--no-memory] [--json PATH]

One batch of task rows (train split, `--batch` rows, their natural length). Medians of calls
interleaved round by round, so that load from other processes falls on all alike; every
figure is a ratio within this run:
- `plain`: the Hugging Face model on the clean and on the corrupted prompt (no grad);
- `run_graph` with every edge on (logits at every position, as the plain forward gives them,
  and at the last position only), and at partial circuits (a random 15 % of the edges, and
  the 500 edges of largest EAP score) for comparison;
- the EAP floor: the plain corrupted forward (no grad) plus a plain clean forward and
  backward of the logit difference, once with parameter gradients (as a training step
  takes them) and once with input gradients only (what attribution needs);
- `eap` and `eap_ig_inputs` (5 steps) through condense.attribute on the same batch.
Peak memory of plain, EAP and EAP-IG: in a fresh subprocess each, the process's peak resident
set during one call minus its level just before the call.
"""
import argparse
import json
import subprocess
import sys
import time

import torch

from condense import tasks
from condense.attribute import attribute
from condense.evaluate import dataset_columns, row_batches
from condense.graph import Graph
from condense.models import load_model, load_tokenizer
from condense.patching import run_graph
from process_memory import peak_mib, reset_peak, rss_mib


def setup(model_name, task, batch):
    model = load_model(model_name)
    tok = load_tokenizer(model_name)
    rows = tasks.load_task(task, tok, "train", n=batch, seed=0)
    cols, n = dataset_columns(rows)
    _, clean, corrupted, mask, last = next(row_batches(cols, n, batch, "cpu"))
    return model, rows, clean, corrupted, mask, last


def calls(model, rows, clean, corrupted, mask, last):
    graph = Graph.from_model(model)
    B = clean.shape[0]
    params = [p for p in model.parameters()]
    logit_rows = torch.arange(B)
    # the floor's metric reads row 0's answer and distractor in every row: the cost is the same
    answer = torch.tensor(rows["answer_id"][:1] * B)
    distractor = torch.tensor(rows["distractor_id"][:1] * B)

    def plain():
        with torch.no_grad():
            model(input_ids=clean, attention_mask=mask)
            model(input_ids=corrupted, attention_mask=mask)

    def floor(param_grads):
        def fn():
            with torch.no_grad():
                model(input_ids=corrupted, attention_mask=mask)
            for p in params:
                p.requires_grad_(param_grads)
            embeds = model.get_input_embeddings()(clean).detach().requires_grad_(not param_grads)
            logits = model(inputs_embeds=embeds, attention_mask=mask).logits[logit_rows, last]
            ld = (logits.gather(1, answer[:, None]) - logits.gather(1, distractor[:, None])).sum()
            inputs = params if param_grads else [embeds]
            torch.autograd.grad(ld, inputs)
            for p in params:
                p.requires_grad_(False)
        return fn

    def graph_all(positions):
        def fn():
            with torch.no_grad():
                run_graph(model, graph, clean, corrupted, mask, logit_positions=positions)
        return fn

    def circuit(edge_mask):
        def fn():
            with torch.no_grad():
                run_graph(model, graph, clean, corrupted, mask, edge_mask=edge_mask, logit_positions=last)
        return fn

    def method(name):
        def fn():
            attribute(model, graph.copy(), rows, name, batch_size=B, progress=False)
        return fn

    def top500():  # built only when timed: the peak-memory runs must not pay for it
        g = graph.copy()
        attribute(model, g, rows, "eap", batch_size=B, progress=False)
        g.apply_topn(500)
        return g.in_graph.float()

    # partial circuits: a random 15 % of the edges, and EAP's top 500
    gen = torch.Generator().manual_seed(0)
    random15 = (torch.rand(graph.n_senders, graph.n_receivers, generator=gen) < 0.15) & graph.valid
    return {
        "plain clean + corrupted forward": plain,
        "run_graph, every edge on, logits at every position": graph_all(None),
        "run_graph, every edge on, last position": graph_all(last),
        "run_graph, random 15 % of edges": circuit(random15.float()),
        "run_graph, EAP top 500 edges": lambda: circuit(top500()),
        "floor: corrupted forward + clean forward/backward (parameter grads)": floor(True),
        "floor: corrupted forward + clean forward/backward (input grads)": floor(False),
        "eap": method("eap"),
        "eap_ig_inputs (5 steps)": method("eap_ig_inputs"),
    }


def timed(fns, repeats):
    fns = {k: (fn() if k == "run_graph, EAP top 500 edges" else fn) for k, fn in fns.items()}
    for fn in fns.values():
        fn()
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    return {k: sorted(v)[len(v) // 2] for k, v in times.items()}


def one_peak(args, which):
    """In a fresh subprocess: peak RSS growth of one call of `which`."""
    out = subprocess.run([sys.executable, __file__, "--model", args.model, "--task", args.task,
                          "--batch", str(args.batch), "--threads", str(args.threads),
                          "--peak", which], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_mib"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="model name or folder")
    ap.add_argument("--task", default="ioi", help="task whose train rows make the batch")
    ap.add_argument("--batch", type=int, default=16, help="rows in the one batch")
    ap.add_argument("--repeats", type=int, default=5, help="timed rounds after a warm-up (median)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--peak", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, rows, clean, corrupted, mask, last = setup(args.model, args.task, args.batch)
    if args.peak:  # a fresh process: its peak resident set during one call, over the level before
        fn = calls(model, rows, clean, corrupted, mask, last)[args.peak]
        before = rss_mib()
        # the process's high-water mark would include loading the model (dequantising a
        # GGUF peaks far above what a call needs): reset it
        reset_peak()
        fn()
        print(json.dumps(dict(peak_mib=peak_mib() - before)))
        return
    start = time.time()
    fns = calls(model, rows, clean, corrupted, mask, last)
    t = timed(fns, args.repeats)
    plain = t["plain clean + corrupted forward"]
    floor = t["floor: corrupted forward + clean forward/backward (parameter grads)"]
    floor_in = t["floor: corrupted forward + clean forward/backward (input grads)"]
    eap = t["eap"]
    ratios = {
        "run_graph all edges (every position) / plain": t["run_graph, every edge on, logits at every position"] / plain,
        "run_graph all edges (last position) / plain": t["run_graph, every edge on, last position"] / plain,
        "run_graph random 15 % / plain": t["run_graph, random 15 % of edges"] / plain,
        "run_graph EAP top 500 / plain": t["run_graph, EAP top 500 edges"] / plain,
        "eap / floor (parameter grads)": eap / floor,
        "eap / floor (input grads)": eap / floor_in,
        "eap_ig_inputs / eap": t["eap_ig_inputs (5 steps)"] / eap,
    }
    out = dict(model=args.model, task=args.task, batch=list(clean.shape), threads=args.threads,
               repeats=args.repeats, seconds=t, ratios=ratios)
    if not args.no_memory:
        out["peak_mib"] = {w: one_peak(args, w) for w in (
            "plain clean + corrupted forward", "eap", "eap_ig_inputs (5 steps)")}
    out["wall_seconds"] = time.time() - start
    out["command"] = "python benchmarks/real_model_speed.py " + " ".join(argv or sys.argv[1:])
    print(json.dumps(out, indent=1))
    if args.json:
        from condense.artifacts import write_json
        write_json(args.json, out)


if __name__ == "__main__":
    main()
