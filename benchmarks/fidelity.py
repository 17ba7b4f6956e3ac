"""The fidelity card (docs/fidelity.md) of every shipped condensation run, one model at a time.

    python benchmarks/fidelity.py --model smollm2-135m --out benchmarks/results/fidelity_smollm2.json
    python benchmarks/fidelity.py --model gemma3-270m --out benchmarks/results/fidelity_gemma3.json

For each run folder of `--runs` (default: every checkpoints/condense_<tag>_* of the model) it
measures the card with condense.fidelity's defaults, writes the folder's fidelity.json, puts
the summary into its metrics.json, refreshes its report page, and adds the card to `--out`
after each run (a rerun skips runs already there: an interrupted benchmark loses nothing). The
original model's quantities (its outputs on each task, node ablation, second-source text) are
measured once per model and shared by the cards. Progress goes to stderr.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from condense.artifacts import write_json  # noqa: E402
from condense.fidelity import FidelityConfig, measure, to_json  # noqa: E402
from condense.fidelity_command import write_card  # noqa: E402
from condense.models import model_tag  # noqa: E402
from condense.report import refresh_report  # noqa: E402
from condense.runs import read_run  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def shipped_runs(model: str) -> list:
    folder = os.path.join(ROOT, "checkpoints")
    prefix = f"condense_{model_tag(model)}_"
    return sorted(os.path.join("checkpoints", f) for f in os.listdir(folder) if f.startswith(prefix))


def log(msg: str) -> None:
    print(f"[fidelity bench] {msg}", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="base model whose shipped runs are measured")
    ap.add_argument("--runs", nargs="*", default=None, help="run folders (default: the model's shipped ones)")
    ap.add_argument("--out", required=True, help="JSON of every card, written after each run")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (condense.runtime's policy)")
    args = ap.parse_args(argv)
    runs = args.runs or shipped_runs(args.model)
    results = {}
    if os.path.exists(args.out):
        with open(args.out) as f:
            results = json.load(f).get("runs", {})
    cache, net, loaded = {}, None, None
    for path in runs:
        name = os.path.basename(os.path.normpath(path))
        if name in results:
            log(f"{name}: done already")
            continue
        run = read_run(os.path.join(ROOT, path) if not os.path.isabs(path) else path)
        base = (run.config.model, run.config.quantization, run.config.dtype)
        if loaded != base:
            cache = {}  # the original's quantities belong to one base model
        start = time.perf_counter()
        log(f"{name}: {run.config.task}")
        net, tokenizer, _ = run.load_model(threads=args.threads)
        loaded = base
        circuit = run.circuit(net)
        metrics = {}
        if os.path.exists(os.path.join(run.path, "metrics.json")):
            with open(os.path.join(run.path, "metrics.json")) as f:
                metrics = json.load(f)
        card = measure(net, tokenizer, circuit, run.config, FidelityConfig(),
                       means=run.means(net, circuit, tokenizer), gate_ppl_ratio=metrics.get("ppl_ratio"),
                       cache=cache, log=lambda m: log(f"{name}: {m}"))
        card["seconds"] = time.perf_counter() - start
        write_card(run.path, card)
        refresh_report(run.path)
        results[name] = to_json(dict(card, folder=path))
        write_json(args.out, dict(command=" ".join(["python", "benchmarks/fidelity.py", *sys.argv[1:]]),
                                  model=args.model, config=to_json(vars(FidelityConfig())), runs=results))
        log(f"{name}: {card['seconds']:.0f} s; flags: {card['flags']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
