"""Heal steps in float32 against heal_dtype=bfloat16: time per step and how far the losses move.

    HF_HUB_OFFLINE=1 python benchmarks/heal_dtype.py [--model smollm2-135m] [--tasks ioi,docstring]
        [--circuits eap_ig,c1] [--steps 6] [--repeats 2] [--threads 2] [--json PATH]

Each setting is condense.methods.condensation.healing.heal itself (the recipe's settings:
recipes/condense/smollm2_<task>.yaml, LoRA r16 on o_proj/down_proj, 16 train rows and one
general-text block per step) run for `--steps` steps from the same fresh adapter and the same
batches, once in float32 and once with the base cast to bfloat16 for the heal, alternating
`--repeats` times so that load from other processes falls on both alike. Reported per task
and circuit: the median seconds per step of each, their ratio, and the heal losses of every
step of both (their largest relative difference says how far bf16 moves the optimisation).
Circuits: `eap_ig`, the task's frozen EAP-IG circuit in checkpoints/ (thousands of edges, as
in the loop's first heals); `c1`, the shipped condensed circuit (checkpoints/condense_smollm2_<task>,
where it exists: the loop's last heals).
"""
import argparse
import json
import os
import statistics
import time

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def circuit_file(kind, task):
    from condense.report import circuit_path
    return circuit_path(os.path.join(ROOT, "checkpoints",
                                     f"{'eap_ig' if kind == 'eap_ig' else 'condense'}_smollm2_{task}"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="model name or folder")
    ap.add_argument("--tasks", default="ioi,docstring",
                    help="comma-separated tasks, each with recipes/condense/smollm2_<task>.yaml")
    ap.add_argument("--circuits", default="eap_ig,c1",
                    help="comma-separated: eap_ig (the frozen EAP-IG circuit), c1 (the shipped condensed "
                         "one)")
    ap.add_argument("--steps", type=int, default=6, help="heal steps per run")
    ap.add_argument("--repeats", type=int, default=2,
                    help="runs of each dtype, alternating (seconds per step: their median)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument("--json", default=None, help="also write the results here as JSON")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from condense import tasks
    from condense.artifacts import command_line
    from condense.graph import Graph
    from condense.methods.condensation import healing
    from condense.models import load_model, load_tokenizer
    from condense.runs import load_config

    tok = load_tokenizer(args.model)
    model = load_model(args.model)
    blocks = list(tasks.general_text(tok, "train")["input_ids"])
    results = dict(command=command_line("benchmarks/heal_dtype.py", argv),
                   model=args.model, threads=args.threads, steps=args.steps, repeats=args.repeats,
                   cases=[])
    for task in args.tasks.split(","):
        cfg = load_config(os.path.join(ROOT, "recipes", "condense", f"smollm2_{task}.yaml"),
                          [f"heal_steps={args.steps}", "heal_stop_loss=0"])
        rows = tasks.load_task(task, tok, "train", n=cfg.n_train, seed=cfg.seed)
        target = healing.last_logprobs(model, rows, cfg.batch_size)
        for kind in args.circuits.split(","):
            path = circuit_file(kind, task)
            if path is None:
                print(f"{task} {kind}: no circuit in checkpoints/, skipped", flush=True)
                continue
            circuit = Graph.from_json(path, model)
            case = dict(task=task, circuit=kind, circuit_file=os.path.relpath(path, ROOT),
                        edges=circuit.count_edges(on_path=True), seconds={}, losses={})
            for rep in range(args.repeats):
                for heal_dtype in (None, "bfloat16"):
                    cfg.heal_dtype = heal_dtype
                    peft_model = healing.add_adapter(model, cfg)  # same seed: the same fresh adapter
                    t0 = time.perf_counter()
                    losses = healing.heal(peft_model, circuit, rows, target, cfg, 1, progress=False,
                                          general_blocks=blocks)
                    step = (time.perf_counter() - t0) / args.steps
                    model = peft_model.unload()
                    key = heal_dtype or "float32"
                    case["seconds"].setdefault(key, []).append(step)
                    case["losses"][key] = losses
                    print(f"{task} {kind} ({case['edges']} edges) {key}: {step:.2f} s/step, "
                          f"losses {' '.join(f'{x:.4f}' for x in losses)}", flush=True)
            f32, b16 = (statistics.median(case["seconds"][k]) for k in ("float32", "bfloat16"))
            a, b = case["losses"]["float32"], case["losses"]["bfloat16"]
            case.update(step_s_float32=f32, step_s_bfloat16=b16, speedup=f32 / b16,
                        max_rel_loss_diff=max(abs(x - y) / abs(x) for x, y in zip(a, b)))
            print(f"  -> {f32 / b16:.2f}x faster in bf16; losses differ by at most "
                  f"{case['max_rel_loss_diff']:.1%}", flush=True)
            results["cases"].append(case)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
