"""Heal on a full-precision, 4-bit and 8-bit base: exactness, memory and step time.

    HF_HUB_OFFLINE=1 python benchmarks/quantized_heal.py [--model smollm2-135m]
        [--circuit checkpoints/condense_smollm2_ioi_fp32/circuit.json] [--steps 4] [--threads 1]
        [--json benchmarks/results/quantized_heal.json]

Each base runs in a fresh subprocess (so that peak memory is its own), on one batch of the
condensation recipe's size (16 IOI train rows plus one general-text block per step):
- exactness: the graph with every edge on against the model's own logits, and with no edge
  on against its corrupted run (8 test rows);
- `weights_mib`: the model's parameters and buffers as stored (transformers'
  get_memory_footprint);
- `rss_after_load_mib`, `rss_before_heal_mib` and `peak_heal_mib`: the process's resident
  set after loading, before the heal steps, and its peak during them (VmHWM, reset before
  them); memory the allocator holds but nothing uses is handed back first (malloc_trim), so
  that these count live memory; `anon_*`: the anonymous part alone (tensors and allocator,
  sampled every 5 ms for the peak), without the file-backed pages of the mapped safetensors
  file that a full-precision load reads its weights from (clean pages the system takes back
  under pressure);
- `heal_needs_mib`: the anonymous peak plus, for the full-precision base, the file-backed
  pages that hold part of its weights (see heal_needs);
- `heal_step_s`: the median of `--steps` heal steps (LoRA r16 on o_proj/down_proj, the
  recipe's, over the circuit `--circuit` with its other edges ablated), after one warm-up;
- accuracy and logit difference of the model and of the circuit (no adapter) on 64 test rows.
Ratios against full precision come from one run of this script, bases one after another.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from process_memory import AnonPeak, peak_mib, reset_peak, rss_mib, rss_parts_mib

BASES = ("none", "4bit", "8bit")


def _release_free_memory():
    """Return memory the allocator holds but no object uses to the system (glibc malloc_trim),
    so that resident-set figures count live memory: quantizing at load frees the full-precision
    weights it read, and without this they would stay in the resident set."""
    import ctypes
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc: figures include freed memory
        pass


def one_base(args) -> dict:
    import torch

    from condense import tasks
    from condense.evaluate import dataset_columns, evaluate, row_batches
    from condense.graph import Graph
    from condense.methods.condensation import CondenseConfig, add_adapter, heal, last_logprobs
    from condense.models import load_model, load_tokenizer
    from condense.patching import run_graph

    torch.set_num_threads(args.threads)
    quantization = None if args.base == "none" else args.base
    begin = time.perf_counter()
    model = load_model(args.model, quantization=quantization, device="cpu")
    load_s = time.perf_counter() - begin
    for p in model.parameters():
        p.requires_grad_(False)
    tok = load_tokenizer(args.model)
    _release_free_memory()
    parts = rss_parts_mib()
    out = dict(base=args.base, load_s=load_s, weights_mib=model.get_memory_footprint() / 2**20,
               rss_after_load_mib=rss_mib(), anon_after_load_mib=parts["RssAnon"],
               file_after_load_mib=parts["RssFile"])

    graph = Graph.from_model(model)
    test = tasks.load_task("ioi", tok, "test", n=64, seed=0)
    cols, n = dataset_columns(test)
    _, clean, corrupted, mask, _ = next(row_batches(cols, 8, 8, "cpu"))
    real = mask.bool()
    with torch.no_grad():
        hf_clean = model(input_ids=clean, attention_mask=mask).logits
        hf_corrupted = model(input_ids=corrupted, attention_mask=mask).logits
        full = run_graph(model, graph, clean, corrupted, mask)
        graph.reset(in_graph=False)
        empty = run_graph(model, graph, clean, corrupted, mask)
    out["full_graph_vs_model"] = float((full - hf_clean)[real].abs().max())
    out["empty_graph_vs_corrupted"] = float((empty - hf_corrupted)[real].abs().max())
    out["logit_scale"] = float(hf_clean[real].abs().max())

    graph.reset(in_graph=True)
    model_metrics = evaluate(model, graph, test, batch_size=16)
    circuit = Graph.from_json(args.circuit, model)
    circuit_metrics = evaluate(model, circuit, test, batch_size=16)
    out.update(accuracy=model_metrics["accuracy"], logit_diff=model_metrics["logit_diff"],
               circuit_edges=circuit.count_edges(on_path=True),
               circuit_accuracy_no_adapter=circuit_metrics["accuracy"],
               circuit_logit_diff_no_adapter=circuit_metrics["logit_diff"])

    cfg = CondenseConfig(model=args.model, task="ioi", heal_steps=1, heal_batch_size=16,
                         heal_general_batch=1, lora_rank=16, lora_alpha=32, heal_stop_loss=0.0)
    train = tasks.load_task("ioi", tok, "train", n=64, seed=0)
    blocks = tasks.general_text(tok, split="train")["input_ids"][:8]
    target = last_logprobs(model, train, 16)
    peft_model = add_adapter(model, cfg)
    circuit = Graph.from_json(args.circuit, peft_model)
    heal(peft_model, circuit, train, target, cfg, 0, progress=False, general_blocks=blocks)  # warm-up
    _release_free_memory()
    rss_before_heal = rss_mib()
    reset_peak()
    times = []
    anon_before_heal = rss_parts_mib()["RssAnon"]
    with AnonPeak() as anon:
        for step in range(args.steps):
            begin = time.perf_counter()
            heal(peft_model, circuit, train, target, cfg, step + 1, progress=False,
                 general_blocks=blocks)
            times.append(time.perf_counter() - begin)
    out.update(heal_step_s=statistics.median(times), heal_step_times=times,
               rss_before_heal_mib=rss_before_heal, peak_heal_mib=peak_mib(),
               anon_before_heal_mib=anon_before_heal, anon_peak_heal_mib=anon.peak)
    return out


def heal_needs(r: dict) -> float:
    """What heal needs: its anonymous peak, plus, for the full-precision base, the file-backed
    pages of the mapped safetensors file that hold part of its weights. A quantized load holds
    its weights in anonymous memory (in the peak already); the full-precision file it was
    quantized from stays mapped too, but nothing reads it again."""
    return r["anon_peak_heal_mib"] + (r["file_after_load_mib"] if r["base"] == "none" else 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m", help="model name or folder")
    ap.add_argument("--circuit", default="checkpoints/condense_smollm2_ioi_fp32/circuit.json",
                    help="circuit.json to heal over "
                         "(default: checkpoints/condense_smollm2_ioi_fp32/circuit.json)")
    ap.add_argument("--steps", type=int, default=4, help="timed heal steps per base after a warm-up (median)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per subprocess")
    ap.add_argument("--json", default="benchmarks/results/quantized_heal.json",
                    help="write the results here as JSON (default: benchmarks/results/quantized_heal.json)")
    ap.add_argument("--base", choices=BASES, help=argparse.SUPPRESS)  # one subprocess's base
    args = ap.parse_args()
    if args.base:
        print(json.dumps(one_base(args)))
        return
    results = []
    for base in BASES:
        cmd = [sys.executable, __file__, "--model", args.model, "--circuit", args.circuit,
               "--steps", str(args.steps), "--threads", str(args.threads), "--base", base]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        result = json.loads(done.stdout.strip().splitlines()[-1])
        results.append(result)
        print(f"{base:>5}: weights {result['weights_mib']:.0f} MiB, peak in heal "
              f"{result['peak_heal_mib']:.0f} MiB (anonymous {result['anon_peak_heal_mib']:.0f}), "
              f"heal step {result['heal_step_s']:.2f} s, "
              f"graph vs model {result['full_graph_vs_model']:.1e}, accuracy "
              f"{result['accuracy']:.3f}", flush=True)
    fp = results[0]
    for r in results:
        r["heal_step_vs_fp32"] = r["heal_step_s"] / fp["heal_step_s"]
        r["peak_heal_vs_fp32"] = r["peak_heal_mib"] / fp["peak_heal_mib"]
        r["heal_needs_mib"] = heal_needs(r)
    for r in results:
        r["heal_needs_vs_fp32"] = r["heal_needs_mib"] / fp["heal_needs_mib"]
        r["weights_vs_fp32"] = r["weights_mib"] / fp["weights_mib"]
    from condense.artifacts import command_line
    report = dict(command=command_line("benchmarks/quantized_heal.py", env="HF_HUB_OFFLINE=1"),
                  model=args.model, circuit=args.circuit, steps=args.steps, threads=args.threads,
                  results=results)
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(report, f, indent=1)
    print(f"-> {args.json}")


if __name__ == "__main__":
    main()
