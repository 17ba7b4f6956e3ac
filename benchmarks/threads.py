"""CPU threads on a quiet and on a busy machine: the default policy against fixed counts.

    HF_HUB_OFFLINE=1 python benchmarks/threads.py [--models organism,smollm2-135m]
        [--threads 1,2] [--busy 0,2] [--repeats 3] [--large-rows 16] [--json PATH]

For each model, two workloads: an EAP-IG ranking (organism: 64 IOI rows; SmolLM2: --large-rows)
and one heal step (a LoRA on o_proj/down_proj, or GPT-2's c_proj, over a 300-edge circuit:
KL at the last position through the clean and the corrupted run, backward, AdamW). Each is
timed in a fresh process (threads and OpenMP settings apply at process start) at every
thread count of --threads and with the default policy (condense.runtime), once on a quiet
machine and once beside `--busy` processes that each keep a core busy with float matrix
products. Reported: the median of --repeats calls after one warm-up, per setting, and the
ratios the thread-policy issue asks about: default / best fixed count (busy), busy / quiet.
"""
import argparse
import json
import os
import subprocess
import sys
import time

BUSY = "import torch\ntorch.set_num_threads(1)\na = torch.randn(384, 384)\nwhile True:\n    a = (a @ a).tanh_()\n"


def workload(model_name, kind, repeats, large_rows=16):
    """Runs in the child: median seconds of `kind` on `model_name`."""
    import torch

    from condense import tasks
    from condense.attribute import attribute
    from condense.graph import Graph
    from condense.models import load_model, load_tokenizer
    model = load_model(model_name)
    for p in model.parameters():
        p.requires_grad_(False)
    tok = load_tokenizer(model_name)
    small = model.config.hidden_size < 512 if hasattr(model.config, "hidden_size") else True
    graph = Graph.from_model(model)
    if kind == "rank":
        rows = tasks.load_task("ioi", tok, "train", n=64 if small else large_rows)
        attribute(model, graph, rows.select(range(4)), "eap_ig_inputs", progress=False)

        def call():
            attribute(model, graph, rows, "eap_ig_inputs", batch_size=16, progress=False)
    else:
        from condense.methods.condensation import CondenseConfig, add_adapter, heal_loss, last_logprobs
        from condense.evaluate import dataset_columns
        rows = tasks.load_task("ioi", tok, "train", n=16)
        cfg = CondenseConfig(model=model_name, heal_batch_size=16)
        attribute(model, graph, rows.select(range(4)), "eap", progress=False)
        graph.apply_topn(300)
        graph.prune()
        target = last_logprobs(model, rows, 16)
        peft = add_adapter(model, cfg)
        cols, n = dataset_columns(rows)
        params = [p for p in peft.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-4)

        def call():
            loss = heal_loss(peft, graph, cols, list(range(n)), target, cfg)
            opt.zero_grad()
            loss.backward()
            opt.step()
    call()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def child(args):
    from condense.runtime import apply_thread_policy
    from condense.models import load_model
    if args.setting == "default":
        info = apply_thread_policy(None, load_model(args.model))
    else:
        info = apply_thread_policy(int(args.setting))
    seconds = workload(args.model, args.kind, args.repeats, args.large_rows)
    print(json.dumps(dict(seconds=seconds, threads=info["threads"], why=info["why"])))


def measure(model, kind, setting, repeats, large_rows):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", model, kind, setting,
           "--repeats", str(repeats), "--large-rows", str(large_rows)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if out.returncode:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="checkpoints/organism,smollm2-135m",
                    help="comma-separated model names or folders")
    ap.add_argument("--kinds", default="rank,heal",
                    help="comma-separated workloads: rank (an EAP-IG ranking), heal (one heal step)")
    ap.add_argument("--threads", default="1,2", help="fixed thread counts to compare")
    ap.add_argument("--busy", default="0,2", help="busy processes beside the measurement")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per setting after a warm-up (median)")
    ap.add_argument("--large-rows", type=int, default=16,
                    help="IOI rows the ranking workload scores on models of width >= 512")
    ap.add_argument("--json", help="also write the results here as JSON")
    ap.add_argument("--child", nargs=3, metavar=("MODEL", "KIND", "SETTING"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        args.model, args.kind, args.setting = args.child
        return child(args)
    settings = [s for s in args.threads.split(",") if s] + ["default"]
    results, start = [], time.time()
    for n_busy in [int(b) for b in args.busy.split(",")]:
        busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(n_busy)]
        try:
            time.sleep(1.0 if n_busy else 0.0)
            for model in [m for m in args.models.split(",") if m]:
                for kind in [k for k in args.kinds.split(",") if k]:
                    for setting in settings:
                        r = measure(model, kind, setting, args.repeats, args.large_rows)
                        results.append(dict(model=model, kind=kind, busy=n_busy, setting=setting, **r))
                        print(f"busy {n_busy}  {model:22s} {kind:5s} threads {setting:8s} -> "
                              f"{r['threads']}: {r['seconds']:.3f}s", flush=True)
        finally:
            for p in busy:
                p.kill()
    summary = []
    keys = sorted({(r["model"], r["kind"]) for r in results})
    for model, kind in keys:
        mine = [r for r in results if (r["model"], r["kind"]) == (model, kind)]
        for n_busy in sorted({r["busy"] for r in mine}):
            here = {r["setting"]: r["seconds"] for r in mine if r["busy"] == n_busy}
            best = min(v for k, v in here.items() if k != "default")
            summary.append(dict(model=model, kind=kind, busy=n_busy, default_over_best=here["default"] / best,
                                seconds=here))
        quiet = {r["setting"]: r["seconds"] for r in mine if r["busy"] == 0}
        for n_busy in sorted({r["busy"] for r in mine} - {0}):
            loaded = {r["setting"]: r["seconds"] for r in mine if r["busy"] == n_busy}
            if quiet:
                summary.append(dict(model=model, kind=kind, busy=n_busy,
                                    busy_over_quiet={k: loaded[k] / quiet[k] for k in loaded if k in quiet}))
    for s in summary:
        print(json.dumps(s))
    if args.json:
        from condense.artifacts import command_line, write_json
        write_json(args.json, dict(command=command_line("benchmarks/threads.py", argv),
                                   cores=os.cpu_count(), omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"),
                                   wall_seconds=time.time() - start, results=results, summary=summary))


if __name__ == "__main__":
    main()
