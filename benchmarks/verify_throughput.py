"""Throughput of exhaustive subset verification against the plain Hugging Face forward.

    HF_HUB_OFFLINE=1 python benchmarks/verify_throughput.py [--model checkpoints/organism]
        [--task ioi] [--n 64] [--batch-size 32] [--sizes 12 16 20] [--max-subsets 65536]
        [--sources eap random] [--threads 2] [--json PATH]

Circuits of 12, 16 and 20 edges on the organism, two ways (`--sources`):
- `eap`: EAP scores (condense.attribute, logit difference, on --n train rows); the greedy
  growth from the logits (Graph.apply_greedy) of the smallest size whose pruned circuit
  (Graph.prune) has at least the target edges, then its lowest-|score| edges dropped until
  exactly the target remain (a dropped edge may leave another dangling: all in-graph edges
  are enumerated, as the verifier does);
- `random`: the same from seeded random scores: a connected circuit no attribution chose.
Subset throughput: SubsetEvaluator.mean_logit_diffs (the verifier's evaluation) on --n test
rows over the first min(2^n, --max-subsets) subset ids, contiguous as the verifier
enumerates them; one subset x prompt counts as one forward, and the wall time includes the
corrupted and empty-circuit runs of every prompt batch. Plain throughput: the HF model
(model(input_ids, attention_mask), no graph) on the same test prompts, right-padded per batch
by length as evaluate() does; the best of batch sizes 32, 128 and all rows, in prompts/s,
measured right before each circuit (a shared machine's load drifts). ratio = subset
throughput / that plain throughput; the target is >= 0.5. A few subsets are also
checked against evaluate() (max_abs_error, in logit-difference units). Times are from one
shared machine: compare ratios within a run.
"""
import argparse
import os
import sys
import time

import torch

ROOT = os.path.join(os.path.dirname(__file__), "..")


def pick_circuit(model, graph, scores, target):
    """Graph with exactly `target` in-graph edges grown greedily from `scores` (see above)."""
    g = graph.copy()
    g.scores = scores.clone()
    for k in range(target, int(g.valid.sum()) + 1):
        g.apply_greedy(k)
        g.prune()
        if g.count_edges() >= target:
            break
    while g.count_edges() > target:
        on = g.in_graph & g.valid
        weakest = g.scores.abs().masked_fill(~on, float("inf")).flatten().argmin()
        g.in_graph.view(-1)[weakest] = False
    return g


@torch.no_grad()
def plain_throughput(model, rows, batch_sizes, repeats=3):
    """Best prompts/s of the plain HF forward over the test prompts, per batch size."""
    from condense.evaluate import dataset_columns, row_batches
    cols, n = dataset_columns(rows)
    device = next(model.parameters()).device
    out = {}
    for bs in batch_sizes:
        batches = [(c, m) for _, c, _, m, _ in row_batches(cols, n, bs, device)]
        model(input_ids=batches[0][0], attention_mask=batches[0][1])  # warm-up
        times = []
        for _ in range(repeats):
            _sync(device)
            start = time.perf_counter()
            for c, m in batches:
                model(input_ids=c, attention_mask=m)
            _sync(device)
            times.append(time.perf_counter() - start)
        out[bs] = n / min(times)
    return out


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def subset_throughput(model, graph, rows, batch_size, max_subsets):
    from condense.verify.subsets import SubsetEvaluator
    ev = SubsetEvaluator(model, graph, rows, batch_size=batch_size)
    n_subsets = min(2 ** ev.n_edges, max_subsets)
    ev.mean_logit_diffs(torch.arange(min(n_subsets, 64)))  # warm-up
    device = next(model.parameters()).device
    _sync(device)
    start = time.perf_counter()
    ld = ev.mean_logit_diffs(torch.arange(n_subsets))
    _sync(device)
    seconds = time.perf_counter() - start
    return ev, ld, n_subsets, seconds


def check_against_evaluate(model, graph, rows, ev, ld, batch_size, n_checks=4):
    from condense.evaluate import evaluate, reference_outputs
    from condense.verify.subsets import subset_masks
    ref = reference_outputs(model, graph, rows, batch_size=batch_size)
    gen = torch.Generator().manual_seed(0)
    ids = torch.cat([torch.tensor([0, len(ld) - 1]), torch.randint(len(ld), (n_checks - 2,), generator=gen)])
    worst = 0.0
    for k, m in zip(ids.tolist(), subset_masks(ids, ev.n_edges)):
        em = torch.zeros(graph.n_senders, graph.n_receivers)
        for on, (s, r) in zip(m.tolist(), ev.edges):
            em[s, r] = float(on)
        want = evaluate(model, graph, rows, batch_size=batch_size, reference=ref, edge_mask=em)["logit_diff"]
        worst = max(worst, abs(float(ld[k]) - want))
    return worst


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "checkpoints", "organism"),
                    help="model name or folder (default: checkpoints/organism)")
    ap.add_argument("--task", default="ioi", help="task of the train and test rows")
    ap.add_argument("--n", type=int, default=64, help="test rows (and train rows for EAP)")
    ap.add_argument("--batch-size", type=int, default=32, help="prompts per subset pass")
    ap.add_argument("--sizes", type=int, nargs="+", default=[12, 16, 20], help="circuit sizes in edges")
    ap.add_argument("--sources", nargs="+", default=["eap", "random"], choices=["eap", "random"],
                    help="scores the circuits grow from: EAP, or seeded random (default: both)")
    ap.add_argument("--max-subsets", type=int, default=2 ** 16,
                    help="subsets timed per circuit (the first ids; all of them when 2^n is smaller)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="cpu, cuda, ... (default: cuda where available)")
    ap.add_argument("--json", default=None, help="also write the numbers here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from condense import tasks
    from condense.attribute import attribute
    from condense.graph import Graph
    from condense.models import load_model, load_tokenizer

    model = load_model(args.model, device=args.device)
    tokenizer = load_tokenizer(args.model)
    test = tasks.load_task(args.task, tokenizer, "test", n=args.n, seed=0)
    graph = Graph.from_model(model)
    scores = {}
    if "eap" in args.sources:
        train = tasks.load_task(args.task, tokenizer, "train", n=args.n, seed=0)
        attribute(model, graph, train, "eap", batch_size=args.batch_size)
        scores["eap"] = graph.scores.clone()
    if "random" in args.sources:
        scores["random"] = torch.randn(graph.scores.shape, generator=torch.Generator().manual_seed(0))

    batch_sizes = sorted({32, 128, args.n})
    results, plain_seen = [], []
    for source, sc in scores.items():
        for size in args.sizes:
            circuit = pick_circuit(model, graph, sc, size)
            # plain throughput right before each circuit: a shared machine's load drifts
            plain = plain_throughput(model, test, batch_sizes)
            plain_seen.append(plain)
            best_plain = max(plain.values())
            ev, ld, n_subsets, seconds = subset_throughput(model, circuit, test, args.batch_size,
                                                           args.max_subsets)
            rate = n_subsets * args.n / seconds
            error = check_against_evaluate(model, circuit, test, ev, ld, args.batch_size)
            results.append(dict(
                source=source, edges=ev.n_edges, edges_on_path=circuit.count_edges(on_path=True),
                circuit_nodes=len(ev.nodes), method=ev.method, subsets_timed=n_subsets, seconds=seconds,
                subsets_per_s=n_subsets / seconds, subset_prompts_per_s=rate,
                plain_prompts_per_s=best_plain, ratio_to_plain=rate / best_plain,
                exhaustive_200_rows_s_estimate=2 ** ev.n_edges * 200 / rate,
                max_abs_error_vs_evaluate=error, edge_names=ev.edge_names))
            print(f"{source} {ev.n_edges} edges: {rate:,.0f} subset x prompt/s "
                  f"({rate / best_plain:.1f}x plain {best_plain:,.0f}/s), error {error:.1e}",
                  file=sys.stderr, flush=True)
    plain = {b: max(p[b] for p in plain_seen) for b in batch_sizes}

    print(f"\nmodel {args.model} on {args.device}, {args.threads} threads, task {args.task}, "
          f"{args.n} test prompts, {args.batch_size} prompts per pass")
    print("plain HF forward (best over the run): " +
          ", ".join(f"batch {b}: {r:,.0f} prompts/s" for b, r in plain.items()))
    print("\n| circuit | edges | circuit nodes | subsets timed | subsets/s | subset x prompt/s "
          "| plain prompts/s | ratio | 2^n x 200 rows | max err |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['source']} | {r['edges']} | {r['circuit_nodes']} | {r['subsets_timed']:,} | "
              f"{r['subsets_per_s']:,.0f} | {r['subset_prompts_per_s']:,.0f} | "
              f"{r['plain_prompts_per_s']:,.0f} | {r['ratio_to_plain']:.1f}x | "
              f"{r['exhaustive_200_rows_s_estimate']:,.0f}s | {r['max_abs_error_vs_evaluate']:.1e} |")
    if args.json:
        from condense.artifacts import write_json
        write_json(args.json, dict(model=args.model, device=args.device, threads=args.threads,
                                   task=args.task, n=args.n, batch_size=args.batch_size,
                                   plain_prompts_per_s=plain, results=results))


if __name__ == "__main__":
    main()
