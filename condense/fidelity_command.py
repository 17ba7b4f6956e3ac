"""`condense fidelity RUN`: the fidelity card of a run folder's circuit (docs/fidelity.md).

    condense fidelity checkpoints/condense_smollm2_ioi [--out DIR] [--rows 200] [--sections all]

Loads the run's model with its adapter (the heal) and measures, on the original model (the
adapter off) and on the healed one, how much of the circuit the original carries
(condense.fidelity). Writes `fidelity.json` into the run folder (or `--out`), puts its summary
and flags into the run's `metrics.json` under "fidelity" and refreshes `report.html`. The
options are FidelityConfig's fields; the run's own task, seed, rows and intervention come from
its recipe.
"""
import math
import os
import sys
import time

from transformers import HfArgumentParser

from .artifacts import read_json, write_json
from .fidelity import FidelityConfig, measure, to_json


def _log(msg: str) -> None:
    print(f"[fidelity] {msg}", file=sys.stderr, flush=True)


def parser() -> HfArgumentParser:
    ap = HfArgumentParser(FidelityConfig, prog="condense fidelity",
                          description="How much of a run's circuit the original model carries.")
    ap.add_argument("run_dir", help="a run folder (circuit.json, recipe.yaml, the adapter)")
    ap.add_argument("--out", default=None, help="write fidelity.json here instead of the run folder")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (condense.runtime's policy)")
    return ap


def write_card(run_dir: str, card: dict, out: str | None = None) -> str:
    """fidelity.json into `out` (default the run folder); the summary and flags into the run's
    metrics.json when the card is written beside it. Returns fidelity.json's path."""
    out = out or run_dir
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "fidelity.json")
    write_json(path, to_json(card))
    metrics_path = os.path.join(out, "metrics.json")
    if os.path.abspath(out) == os.path.abspath(run_dir) and os.path.exists(metrics_path):
        metrics = read_json(metrics_path)
        metrics["fidelity"] = to_json(dict(summary=card["summary"], flags=card["flags"]))
        write_json(metrics_path, metrics)
    return path


def main(argv=None) -> int:
    from .report import refresh_report
    from .runs import open_output, read_run
    fcfg, args = parser().parse_args_into_dataclasses(argv)
    try:
        fcfg.check()
    except ValueError as e:
        print(f"condense fidelity: {e}", file=sys.stderr)
        return 2
    run = read_run(args.run_dir, "measure the fidelity of")
    out = args.out or args.run_dir
    os.makedirs(out, exist_ok=True)
    lock = open_output(out, reads=args.run_dir)  # refuses an unwritable folder before any model loads
    try:
        start = time.perf_counter()
        net, tokenizer, _ = run.load_model(threads=args.threads)
        circuit = run.circuit(net)
        metrics_path = os.path.join(args.run_dir, "metrics.json")
        metrics = read_json(metrics_path) if os.path.exists(metrics_path) else {}
        card = measure(net, tokenizer, circuit, run.config, fcfg,
                       means=run.means(net, circuit, tokenizer), gate_ppl_ratio=metrics.get("ppl_ratio"),
                       log=_log)
        card["seconds"] = time.perf_counter() - start
        path = write_card(args.run_dir, card, args.out)
    finally:
        lock.release()
    for flag in card["flags"]:
        _log(f"flag: {flag}")
    s = card["summary"]
    if "adapter_off_faithfulness" in s:
        f = s["adapter_off_faithfulness"]["value"]
        _log(f"adapter off: f {f:.3f}; frozen completion "
             f"{s['completion_edges'] if s['completion_edges'] is not None else 'none'} edges"
             + (f" ({card['seconds']:.0f} s)" if not math.isnan(card["seconds"]) else ""))
    if args.out is None:
        refresh_report(args.run_dir)
    print(path)
    return 0


if __name__ == "__main__":  # python -m condense.fidelity_command is `condense fidelity`
    from condense.cli import module_entry
    module_entry("fidelity")
