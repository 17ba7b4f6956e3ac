"""What keeping the corrupted run saves in a sweep over many circuits (MIB curves, the
smallest-faithful search): one `evaluate` of a top-n circuit with the reference that keeps each
batch's corrupted run (reference_outputs(keep_ablated=True)) against the reference without it.

    HF_HUB_OFFLINE=1 python benchmarks/sweep_reuse.py [--model smollm2-135m] [--tasks ioi,docstring]
        [--rows 64] [--batch 16] [--repeats 3] [--threads 1] [--json PATH]

Per task: the val rows the baselines search on (`--rows`, batches of `--batch`), the EAP-IG
scores shipped in checkpoints/eap_ig_<model>_<task>/circuit.json.gz and the circuit at that
run's smallest faithful n. Medians of calls interleaved round by
round (a ratio within this run; the machine is shared): plain Hugging Face forwards over the
clean and the corrupted prompts (the floor), evaluate with each reference; both give the same
metrics bit for bit (checked here too). Also the memory the kept runs hold.
"""
import argparse
import json
import os
import sys

import torch

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from condense import tasks
from condense.evaluate import evaluate, reference_outputs
from condense.graph import Graph
from condense.metrics import last_logits
from condense.models import load_model, load_tokenizer
from graph_overhead import timed  # medians of interleaved calls


def kept_bytes(reference):
    total = 0
    for values in reference.ablated:
        for part in (values.blocks, values.z, values.hidden):
            total += sum(t.numel() * t.element_size() for t in part if t is not None)
    return total


@torch.no_grad()
def one_task(model, tokenizer, model_name, task, rows_n, batch, repeats):
    rows = tasks.load_task(task, tokenizer, "val", n=rows_n)
    scored = os.path.join(ROOT, "checkpoints", f"eap_ig_{model_name}_{task}")
    if not os.path.exists(os.path.join(scored, "circuit.json.gz")):
        have = sorted(d[len("eap_ig_"):] for d in os.listdir(os.path.join(ROOT, "checkpoints"))
                      if d.startswith("eap_ig_"))
        sys.exit(f"no EAP-IG scores for {model_name} {task} ({scored}); shipped: {', '.join(have)}")
    graph = Graph.from_json(os.path.join(scored, "circuit.json.gz"), model)
    with open(os.path.join(scored, "metrics.json")) as f:
        n = json.load(f)["n_requested"]
    graph.apply_topn(n)
    graph.prune()
    kept = reference_outputs(model, graph, rows, batch_size=batch, keep_ablated=True)
    fresh = reference_outputs(model, graph, rows, batch_size=batch)
    a = evaluate(model, graph, rows, batch_size=batch, reference=kept, per_row=True)
    b = evaluate(model, graph, rows, batch_size=batch, reference=fresh, per_row=True)
    same = bool(torch.equal(a["per_row"]["logit_diff"], b["per_row"]["logit_diff"])
                and torch.equal(a["per_row"]["kl"], b["per_row"]["kl"]))
    plain, without, with_kept = timed([
        lambda: (last_logits(model, rows["clean_ids"], batch), last_logits(model, rows["corrupted_ids"], batch)),
        lambda: evaluate(model, graph, rows, batch_size=batch, reference=fresh),
        lambda: evaluate(model, graph, rows, batch_size=batch, reference=kept)], repeats)
    return dict(task=task, rows=len(rows), batch=batch, edges=graph.count_edges(), n=n,
                same_metrics=same, faithfulness=a["faithfulness"],
                plain_clean_plus_corrupted_s=plain, evaluate_s=without, evaluate_kept_s=with_kept,
                evaluate_over_plain=without / plain, evaluate_kept_over_plain=with_kept / plain,
                kept_over_fresh=with_kept / without, kept_mib=kept_bytes(kept) / 2 ** 20)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m",
                    help="model name; the part before the first - names checkpoints/eap_ig_<it>_<task>")
    ap.add_argument("--tasks", default="ioi,docstring", help="comma-separated tasks (shipped EAP-IG scores)")
    ap.add_argument("--rows", type=int, default=64, help="val rows")
    ap.add_argument("--batch", type=int, default=16, help="rows per batch")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds after a warm-up (median)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--json", default=None, help="also write the results here as JSON")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model), load_tokenizer(args.model)
    short = args.model.split("-")[0]  # checkpoints/eap_ig_smollm2_<task>
    out = []
    for task in [t for t in args.tasks.split(",") if t]:
        r = one_task(model, tokenizer, short, task, args.rows, args.batch, args.repeats)
        print(json.dumps(r), flush=True)
        out.append(r)
    if args.json:
        from condense.artifacts import command_line, write_json
        write_json(args.json, dict(command=command_line("benchmarks/sweep_reuse.py", argv),
                                    threads=args.threads, rows=out))


if __name__ == "__main__":
    main()
