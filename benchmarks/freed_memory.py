"""EAP and EAP-IG with condense's allocator setting (freed blocks of up to 32 MiB kept) against
glibc's default, each in fresh processes.

    HF_HUB_OFFLINE=1 python benchmarks/freed_memory.py [--model smollm2-135m] [--task ioi]
        [--batch 16] [--calls 3] [--repeats 2] [--threads 1] [--json PATH]

condense sets the allocator when it is imported (condense/runtime.py, `keep_freed_memory`);
`CONDENSE_KEEP_FREED_MEMORY=0` leaves glibc's default. Each repeat starts one process per
setting, alternating, so that load from other processes falls on both alike. A process loads the
model, takes one batch of the task's train rows, and calls condense.attribute with `eap` and
then `eap_ig_inputs` (5 steps) on it `--calls` times; the first call of each is a warm-up.
Reported per setting (medians over the later calls of every process): wall and CPU seconds of
each method, its minor page faults, EAP-IG / EAP, and the peak resident memory a call adds above
the loaded model.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

SETTINGS = {"kept (condense's default)": "1", "glibc default": "0"}
METHODS = ("eap", "eap_ig_inputs")


def child(args):
    import torch
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from process_memory import peak_mib, reset_peak, rss_mib
    from condense import runtime
    from condense.attribute import attribute
    from condense.graph import Graph
    from real_model_speed import setup

    torch.set_num_threads(args.threads)
    model, rows, *_ = setup(args.model, args.task, args.batch)
    graph = Graph.from_model(model)
    before = rss_mib()
    reset_peak()
    calls = {m: [] for m in METHODS}
    for _ in range(args.calls):
        for m in METHODS:
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            cpu, wall = time.process_time(), time.perf_counter()
            attribute(model, graph.copy(), rows, m, batch_size=args.batch, progress=False)
            calls[m].append(dict(wall=time.perf_counter() - wall, cpu=time.process_time() - cpu,
                                 faults=resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults))
    print(json.dumps(dict(calls=calls, peak_mib=peak_mib() - before, malloc=runtime._malloc_settings)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="model name or folder")
    ap.add_argument("--task", default="ioi", help="task whose train rows make the batch")
    ap.add_argument("--batch", type=int, default=16, help="rows in the one batch")
    ap.add_argument("--calls", type=int, default=3, help="calls of each method per process (the first warms up)")
    ap.add_argument("--repeats", type=int, default=2, help="processes per setting")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.calls < 2:
        ap.error("--calls must be at least 2: the first call of each method is a warm-up")
    if args.child:
        return child(args)
    start = time.time()
    env = {k: v for k, v in os.environ.items()
           if k not in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")}
    runs = {name: [] for name in SETTINGS}
    for r in range(args.repeats):
        for name, flag in SETTINGS.items():
            cmd = [sys.executable, os.path.abspath(__file__), "--child", "--model", args.model,
                   "--task", args.task, "--batch", str(args.batch), "--calls", str(args.calls),
                   "--threads", str(args.threads)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True,
                                 env=dict(env, CONDENSE_KEEP_FREED_MEMORY=flag))
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"repeat {r + 1}/{args.repeats}, {name}: done", file=sys.stderr, flush=True)
    summary = {}
    for name, procs in runs.items():
        later = {m: [c for p in procs for c in p["calls"][m][1:]] for m in METHODS}
        med = {m: {k: statistics.median(c[k] for c in later[m]) for k in ("wall", "cpu", "faults")}
               for m in METHODS}
        summary[name] = dict(
            seconds={m: med[m]["wall"] for m in METHODS}, cpu_seconds={m: med[m]["cpu"] for m in METHODS},
            page_faults={m: med[m]["faults"] for m in METHODS},
            eap_ig_over_eap_wall=med["eap_ig_inputs"]["wall"] / med["eap"]["wall"],
            eap_ig_over_eap_cpu=med["eap_ig_inputs"]["cpu"] / med["eap"]["cpu"],
            peak_mib=statistics.median(p["peak_mib"] for p in procs), malloc=procs[0]["malloc"])
    kept, default = (summary[n] for n in SETTINGS)
    from condense.artifacts import command_line
    out = dict(model=args.model, task=args.task, batch=args.batch, calls=args.calls,
               repeats=args.repeats, threads=args.threads, summary=summary,
               eap_ig_cpu_default_over_kept=default["cpu_seconds"]["eap_ig_inputs"]
               / kept["cpu_seconds"]["eap_ig_inputs"],
               runs=runs, wall_seconds=time.time() - start,
               command=command_line("benchmarks/freed_memory.py", argv))
    print(json.dumps({k: v for k, v in out.items() if k != "runs"}, indent=1))
    if args.json:
        from condense.artifacts import write_json
        write_json(args.json, out)


if __name__ == "__main__":
    main()
