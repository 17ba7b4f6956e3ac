"""EAP, Edge Pruning and HAP at the same target sparsity, on the model organism, in one run.

    HF_HUB_OFFLINE=1 python benchmarks/hap_vs_ep.py [--tasks ioi,induction] [--steps 1000]
        [--target 0.95] [--candidates 0.3] [--n-train 200] [--n-test 200] [--threads 1]
        [--no-control] [--model checkpoints/organism] [--json PATH]

Per task, with the recipes' settings (condense/edge_pruning.py; RunConfig defaults unless a
flag says otherwise):
- EAP: score every edge on the train rows, keep the top round((1 - target) * edges) by
  |score|, prune;
- EP: Edge Pruning over all edges, `--steps` steps, target sparsity `--target`;
- HAP: EAP candidates (top `--candidates` fraction of edges), then Edge Pruning over those
  only, its step count from the same ramp rate (condense.edge_pruning.hap_schedule);
- EP@HAP steps (unless --no-control): Edge Pruning over all edges with HAP's step count, to
  show what the steps alone buy.
Each circuit is evaluated on the test rows (accuracy, logit difference, KL, faithfulness).
Time is the whole search (targets, EAP for HAP, mask training, thresholding), single
process, measured in this one run, as wall-clock and as this process's CPU time (with one
thread the two agree on an idle machine; CPU time is what other jobs disturb less); a
warm-up before any timing pays the one-off costs. Speed-up = 1 - time(HAP) / time(EP).
Also listed: the heads in HAP's circuit that EAP's top-n circuit drops (the HAP paper's
"cooperative" components).
"""
import argparse
import dataclasses
import json
import os
import sys
import time

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from condense import tasks  # noqa: E402
from condense.attribute import attribute  # noqa: E402
from condense.edge_pruning import search  # noqa: E402
from condense.evaluate import evaluate, reference_outputs  # noqa: E402
from condense.graph import Graph  # noqa: E402
from condense.models import load_model, load_tokenizer  # noqa: E402
from condense.train import RunConfig  # noqa: E402


def heads(graph):
    on = graph.nodes_in_graph()
    return {n for n, flag in zip(graph.node_names, on.tolist()) if flag and n.startswith("a")}


def evaluated(model, circuit, rows, reference, cfg):
    m = evaluate(model, circuit, rows, batch_size=cfg.batch_size, reference=reference)
    return dict(accuracy=m["accuracy"], logit_diff=m["logit_diff"], kl=m["kl"],
                faithfulness=m["faithfulness"], accuracy_full=m["accuracy_full"])


def bench_task(model, tokenizer, task, args):
    cfg = RunConfig(task=task, n_train=args.n_train, n_test=args.n_test, batch_size=32,
                    ep_steps=args.steps, ep_target_sparsity=args.target,
                    hap_candidate_fraction=args.candidates, seed=args.seed)
    rows = {s: tasks.load_task(task, tokenizer, s, n=n, seed=cfg.seed)
            for s, n in (("train", args.n_train), ("test", args.n_test))}
    reference = reference_outputs(model, Graph.from_model(model), rows["test"], batch_size=32)
    # warm-up: one-off costs (allocator, kernels) are paid here, not by the first method
    warm = RunConfig(task=task, ep_steps=5, hap_steps=5, batch_size=32)
    search(model, rows["train"].select(range(32)), warm, hap=True, progress=False)

    results = []

    def add(method, circuit, seconds, cpu_seconds, steps=None, extra=None):
        m = evaluated(model, circuit, rows["test"], reference, cfg)
        r = dict(task=task, method=method, seconds=seconds, cpu_seconds=cpu_seconds, steps=steps,
                 edges=circuit.count_edges(on_path=True), **m, **(extra or {}))
        results.append(r)
        print(f"  {task:10s} {method:14s} {seconds:7.1f}s (CPU {cpu_seconds:7.1f}s)  steps {steps!s:>5}  edges "
              f"{r['edges']:4d}  acc {m['accuracy']:.3f}  LD {m['logit_diff']:6.2f}  KL "
              f"{m['kl']:.4f}  f {m['faithfulness']:.3f}", flush=True)
        return r

    graph = Graph.from_model(model)
    n_edges = int(graph.valid.sum())
    n_target = round((1 - args.target) * n_edges)
    start, cpu_start = time.perf_counter(), time.process_time()
    attribute(model, graph, rows["train"], "eap", batch_size=cfg.batch_size, progress=False)
    eap = graph.copy()
    eap.apply_topn(n_target)
    eap.prune()
    add("eap", eap, time.perf_counter() - start, time.process_time() - cpu_start, extra=dict(edges_kept=n_target))

    ep = search(model, rows["train"], cfg, hap=False, progress=False)
    add("edge_pruning", ep["circuit"], ep["search_seconds"], ep["cpu_seconds"], ep["steps"],
        dict(edges_kept=ep["edges_kept"], train_seconds=ep["train_seconds"]))
    hap = search(model, rows["train"], cfg, hap=True, progress=False)
    add("hap", hap["circuit"], hap["search_seconds"], hap["cpu_seconds"], hap["steps"],
        dict(edges_kept=hap["edges_kept"], train_seconds=hap["train_seconds"],
             rank_seconds=hap["rank_seconds"], n_candidates=hap["n_candidates"]))
    if args.control:
        short = dataclasses.replace(cfg, ep_steps=hap["steps"])
        ctl = search(model, rows["train"], short, hap=False, progress=False)
        add("ep@hap_steps", ctl["circuit"], ctl["search_seconds"], ctl["cpu_seconds"], ctl["steps"],
            dict(edges_kept=ctl["edges_kept"], train_seconds=ctl["train_seconds"]))

    by = {r["method"]: r for r in results}
    summary = dict(
        task=task, target_sparsity=args.target, n_target_edges=n_target, total_edges=n_edges,
        hap_speedup=1 - by["hap"]["seconds"] / by["edge_pruning"]["seconds"],
        hap_speedup_cpu=1 - by["hap"]["cpu_seconds"] / by["edge_pruning"]["cpu_seconds"],
        hap_step_saving=1 - by["hap"]["steps"] / by["edge_pruning"]["steps"],
        hap_kl_ratio=by["hap"]["kl"] / by["edge_pruning"]["kl"],
        hap_accuracy_diff=by["hap"]["accuracy"] - by["edge_pruning"]["accuracy"],
        heads_hap_not_eap=sorted(heads(hap["circuit"]) - heads(eap)),
        heads_eap_not_hap=sorted(heads(eap) - heads(hap["circuit"])),
        heads_hap=sorted(heads(hap["circuit"])), heads_eap=sorted(heads(eap)))
    quality = summary["hap_kl_ratio"] <= 1.10 and abs(summary["hap_accuracy_diff"]) <= 0.03
    summary["done_when"] = bool(summary["hap_speedup"] >= 0.46 and quality)
    summary["done_when_cpu"] = bool(summary["hap_speedup_cpu"] >= 0.46 and quality)
    print(f"  {task}: HAP {100 * summary['hap_speedup']:.1f} % faster than EP (CPU time "
          f"{100 * summary['hap_speedup_cpu']:.1f} %) "
          f"({100 * summary['hap_step_saving']:.1f} % fewer steps), KL ratio "
          f"{summary['hap_kl_ratio']:.3f}, accuracy diff {summary['hap_accuracy_diff']:+.3f}; "
          f"heads HAP keeps that EAP drops: {', '.join(summary['heads_hap_not_eap']) or 'none'}",
          flush=True)
    return results, summary


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", default="ioi,induction")
    ap.add_argument("--steps", type=int, default=1000, help="Edge Pruning steps (ep_steps)")
    ap.add_argument("--target", type=float, default=0.95, help="target sparsity (fraction removed)")
    ap.add_argument("--candidates", type=float, default=0.3, help="HAP candidate fraction")
    ap.add_argument("--n-train", type=int, default=200)
    ap.add_argument("--n-test", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-control", dest="control", action="store_false",
                    help="skip Edge Pruning at HAP's step count")
    ap.add_argument("--model", default=os.path.join(ROOT, "checkpoints", "organism"))
    ap.add_argument("--json", default=None, help="write the numbers here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    model = load_model(args.model)
    for p in model.parameters():
        p.requires_grad_(False)
    tokenizer = load_tokenizer(args.model)
    results, summaries = [], []
    for task in args.tasks.split(","):
        r, s = bench_task(model, tokenizer, task, args)
        results += r
        summaries.append(s)

    print("\n| task | method | steps | wall s | CPU s | CPU time / EP | edges | accuracy | logit diff | KL | faithfulness |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        ep_s = next(x["cpu_seconds"] for x in results if x["task"] == r["task"] and x["method"] == "edge_pruning")
        print(f"| {r['task']} | {r['method']} | {r['steps'] if r['steps'] is not None else '—'} | "
              f"{r['seconds']:.1f} | {r['cpu_seconds']:.1f} | {r['cpu_seconds'] / ep_s:.2f} | {r['edges']} | {r['accuracy']:.3f} | "
              f"{r['logit_diff']:.2f} | {r['kl']:.4f} | {r['faithfulness']:.3f} |")
    total = time.perf_counter() - start
    print(f"\ntotal {total:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), results=results, summary=summaries, total_seconds=total),
                      f, indent=1)


if __name__ == "__main__":
    main()
