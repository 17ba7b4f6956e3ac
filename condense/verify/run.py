"""Verifiers for small circuits: exhaustive subsets and pairwise ablation.

    python -m condense.verify checkpoints/<run> [--max-edges 20] [--tau 0.05] [--split test]
                              [--n 200] [--threshold F] [--model M] [--task T] ...

Reads the run's `circuit.json` and `recipe.yaml` (model, task, intervention, its acceptance
rule, seed; flags override them), loads the model with the run's adapter when the folder has
one, and on `--n` rows of `--split`:
- exhaustive subsets: every subset of the circuit's n in-graph edges (2^n, so n is limited to
  --max-edges, checked before anything loads) is judged by the rule the run accepted its
  circuit with (`--criterion run`): for one-shot scoring, faithfulness
  f(S) = (LD(S) - LD(∅)) / (LD(full) - LD(∅)) >= threshold on the mean logit difference; for
  condensation, its gate: accuracy within gate_accuracy_tol of the original model's (the
  base with the adapter off; f >= gate_faithfulness too when the run gated on it, f taken
  against the original's logit difference as the gate takes it), so that the circuit the gate
  accepted is judged by the same rule and "irreducible" is a finding, not a consequence of a
  stricter rule. A run that gated on top-1 agreement too (gate_top1_agreement) has the
  circuit and its minimal subsets checked against that floor (check_top1: not every subset,
  which would need the whole vocabulary; the floor can only remove passing subsets, so
  "irreducible" holds under the whole rule). `--criterion faithfulness|accuracy|both` chooses another. "Faithful" in verify.json
  means "passes the criterion" (`criterion`, `threshold`, `accuracy_floor` say which).
  Reported: the minimal faithful subsets (faithful, no proper subset faithful), whether the
  circuit is irreducible (no proper subset faithful), faithful subsets per size;
- pairwise ablation: with m the mean logit difference, Δi = m(C∖{i}) - m(C) and
  Δij = m(C∖{i,j}) - m(C); the pair interacts when |Δij - Δi - Δj| > τ·|m(C) - m(∅)|;
  reported: every pair, interaction partners per edge and their median.
`--local` verifies circuits beyond --max-edges (no enumeration): the circuit, every circuit
without one edge and every circuit without two (1 + n + n(n-1)/2 subsets). It reports whether
the circuit passes its criterion, the edges whose removal still passes (none: "1-minimal";
any: reducible, a smaller passing subset found) and the same pairwise ablation; irreducibility
itself needs every subset and stays unchecked (`irreducible` is null unless a removal passes).
`--local --singles` evaluates the circuit and its one-edge removals only (1 + n subsets: whether
it is reducible by one edge or 1-minimal, and how much each edge matters; no pairs), for
circuits whose pairs are out of reach; `--max-removals K` only the first K of them (a passing
one proves the circuit reducible; none passing proves nothing). A reducible circuit is then
reduced greedily (drop the edge whose removal keeps the highest f while some removal passes)
to a passing subset that no single edge can leave: `greedy_subset` (`--no-reduce` skips it).
When it has at most --max-edges edges every subset of it is evaluated too: `minimal_subset`,
a smallest passing one, is a minimal passing subset of the circuit, and `greedy_subset_minimal`
says whether the greedy subset itself is one.
Writes `verify.json`, `verify_subsets.png` (faithfulness against subset size),
`verify_pairs.png` (interaction heatmap; `verify_removals.png` with --singles: f and accuracy
without each edge) and `verify_faithfulness.npy` (f of every subset, indexed by subset id:
bit i = edge i of verify.json's `edges`), all atomically.
Subsets are evaluated many per pass by condense.verify.subsets.SubsetEvaluator.
"""
import argparse
import io
import math
import os
import sys
import time
from typing import Optional

import torch

from condense.artifacts import read_json
from condense.metrics import ACCURACY_EPS
from condense.verify.analysis import analyse
from condense.verify.local import analyse_local, local_masks, reduce_circuit
from condense.verify.resume import (GREEDY_FILE, STATE_FILE, EvaluationMemo, SubsetSums,
                                    run_state_key)
from condense.verify.pictures import plot_pairs, plot_removals, plot_subsets
from condense.verify.progress import Progress
from condense.verify.verdict import irreducibility_words, local_words

DEFAULT_MAX_EDGES = 20
# Each local subset removes its own edges, so it has its own version of every node downstream
# of them, kept for the whole pass: on SmolLM2's 2,926-edge induction C1, one thread, 256
# one-edge removals took 68 s in one pass, while 1,024 in passes of 910 had not finished after
# 25 minutes (benchmarks/local_pass_cost.py; docs/verify.md).
LOCAL_SUBSETS_PER_PASS = 256


class CircuitTooLarge(ValueError):
    """A circuit with more edges than exhaustive verification is allowed to enumerate."""


# Beyond this many edges 2^n subsets (a billion at 30) are out of reach on any machine the
# verifier runs on, so the error stops suggesting a higher --max-edges.
ENUMERABLE_EDGES = 30


def check_size(n_edges, max_edges=DEFAULT_MAX_EDGES):
    if n_edges <= max_edges:
        return
    local = f"check it locally with --local (every one- and two-edge removal: " \
            f"{1 + n_edges + math.comb(n_edges, 2):,} subsets; with --singles every one-edge " \
            f"removal: {1 + n_edges:,})"
    if n_edges <= ENUMERABLE_EDGES:
        way_out = (f"Raise the limit with --max-edges {n_edges} (each edge doubles the work: "
                   f"2^{n_edges} = {2 ** n_edges:,} subsets), verify a smaller circuit, or {local}.")
    else:
        way_out = (f"2^{n_edges} is about 10^{int(n_edges * math.log10(2))} subsets, out of reach: "
                   f"verify a smaller circuit, or {local}.")
    raise CircuitTooLarge(
        f"the circuit has {n_edges} in-graph edges; exhaustive verification evaluates all "
        f"2^n subsets and is limited to {max_edges} edges (--max-edges {max_edges}). {way_out}")


def count_circuit_edges(path):
    """In-graph edges of a MIB circuit.json (gzipped when the path ends in .gz), read without a
    model."""
    return sum(1 for e in read_json(path)["edges"].values() if e.get("in_graph"))


CRITERIA = ("run", "faithfulness", "accuracy", "both")


def _accuracy(logits, answer, distractor) -> float:
    """The fraction of rows whose answer logit beats the distractor's."""
    return float(((logits.gather(1, answer[:, None]) - logits.gather(1, distractor[:, None])) > 0)
                 .double().mean())


def verify_circuit(model: torch.nn.Module, graph, dataset, *, intervention: str = "patching",
                   means=None, threshold: float = 0.9, tau: float = 0.05, batch_size: int = 32,
                   method: str = "auto", max_edges: int = DEFAULT_MAX_EDGES, progress=None,
                   criterion: str = "faithfulness", accuracy_tol: float = 0.05,
                   local: bool = False, reference_logits: Optional[torch.Tensor] = None,
                   reference_name: str = "full model",
                   top1_floor: Optional[float] = None,
                   reduce: bool = True, pairs: bool = True,
                   max_removals: Optional[int] = None,
                   sums=None, memo=None) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Exhaustive-subset and pairwise verification of `graph`'s in-graph edges on `dataset`.
    A subset passes by `criterion`: "faithfulness" (f >= threshold), "accuracy" (accuracy
    within `accuracy_tol` of the reference's, condensation's gate) or "both". The reference is
    `model`'s full graph, or `reference_logits` [rows, vocab] when given (named `reference_name`:
    for a condensation run the original model's, adapter off, as its gate judges).
    `top1_floor` (a run gated on top-1 agreement): the circuit's top-1 agreement with the
    reference, and each listed minimal subset's, are measured too and held to it (not every
    subset's: each needs the whole vocabulary; see check_top1).
    Returns (report dict, faithfulness of every subset id [2^n], minimal-subset flags [2^n]);
    `local`: the one- and two-edge removals only (see analyse_local; without `pairs` the
    one-edge removals only, and with `max_removals` K only the first K of them), any size, and
    (report, None, None); with `reduce`, a reducible circuit's greedy reduction too
    (greedy_reduction). `sums` (condense.verify.resume.SubsetSums): the subset evaluation keeps
    its running sums there and goes on from them after an interruption; `memo`
    (condense.verify.resume.EvaluationMemo) does the same for the greedy reduction's steps."""
    if criterion not in CRITERIA[1:]:
        raise ValueError(f"criterion {criterion!r}; choose one of {', '.join(CRITERIA[1:])}")
    if max_removals is not None and (not local or pairs or max_removals < 1):
        raise ValueError("max_removals K (>= 1) goes with local=True, pairs=False")
    from condense.evaluate import reference_outputs
    from condense.verify.subsets import SubsetEvaluator

    if not local:
        check_size(graph.n_edges, max_edges)
    evaluator = SubsetEvaluator(model, graph, dataset, intervention, means=means,
                                batch_size=batch_size, method=method,
                                **(dict(max_subsets_per_pass=LOCAL_SUBSETS_PER_PASS) if local else {}))
    start = time.perf_counter()
    reference = reference_outputs(model, graph, dataset, intervention, batch_size, means)
    cols_answer = torch.tensor([int(a) for a in dataset["answer_id"]])
    cols_distractor = torch.tensor([int(d) for d in dataset["distractor_id"]])
    accuracy_model = _accuracy(reference.full_logits, cols_answer, cols_distractor)
    full = reference.full_logits if reference_logits is None else reference_logits.float().cpu()
    ld_full = float((full.gather(1, cols_answer[:, None]) - full.gather(1, cols_distractor[:, None])).mean())
    ld_empty = float(reference.empty_logit_diff.mean())
    accuracy_full = _accuracy(full, cols_answer, cols_distractor)
    reference_s = time.perf_counter() - start

    n = evaluator.n_edges
    floor = accuracy_full - accuracy_tol - ACCURACY_EPS if criterion in ("accuracy", "both") else None
    rule = threshold if criterion in ("faithfulness", "both") else None
    start = time.perf_counter()
    if local:
        masks = local_masks(n, pairs, None if pairs else max_removals)
        ld, accuracy = evaluator.mean_logit_diffs(masks, progress=progress, with_accuracy=True,
                                                  sums=sums)
        subsets_s = time.perf_counter() - start
        report = analyse_local(ld, accuracy, evaluator.edge_names, ld_full, ld_empty, rule, tau,
                               floor, pairs)
        report.update(
            criterion=criterion, reference=reference_name, accuracy_reference=accuracy_full,
            accuracy_full_model=accuracy_model, intervention=intervention,
            method=evaluator.method, n_rows=evaluator.n_rows,
            n_edges_on_path=graph.count_edges(on_path=True), subsets_evaluated=len(masks),
            resumed_subset_prompts=evaluator.resumed,
            timing=dict(reference_s=reference_s, subsets_s=subsets_s,
                        **_throughput(evaluator, len(masks), subsets_s)))
        if reduce and report["circuit_faithful"] and report["removable_edges"]:
            start = time.perf_counter()
            report.update(reduce_circuit(evaluator, ld, accuracy, ld_full, ld_empty, rule, floor,
                                         show=progress is not None, max_edges=max_edges,
                                         progress=progress, memo=memo))
            report["timing"]["greedy_s"] = time.perf_counter() - start
        if top1_floor is not None:
            report.update(check_top1(evaluator, reference, full, [], top1_floor))
        return report, None, None
    ld, accuracy = evaluator.mean_logit_diffs(torch.arange(2 ** n), progress=progress,
                                              with_accuracy=True, sums=sums)
    subsets_s = time.perf_counter() - start
    start = time.perf_counter()
    report, f, minimal = analyse(ld, evaluator.edge_names, ld_full, ld_empty, rule, tau, accuracy,
                                 floor)
    report.update(
        mode="exhaustive", criterion=criterion, reference=reference_name,
        accuracy_reference=accuracy_full, accuracy_full_model=accuracy_model,
        intervention=intervention, method=evaluator.method, n_rows=evaluator.n_rows,
        n_edges_on_path=graph.count_edges(on_path=True), subsets_evaluated=2 ** n,
        resumed_subset_prompts=evaluator.resumed,
        bit_order="subset id bit i = edges[i]; edges run from the logits backwards")
    report["timing"] = dict(reference_s=reference_s, subsets_s=subsets_s,
                            analysis_s=time.perf_counter() - start,
                            **_throughput(evaluator, 2 ** n, subsets_s))
    if top1_floor is not None:
        report.update(check_top1(evaluator, reference, full, report["minimal_faithful_subsets"],
                                 top1_floor))
    return report, f, minimal


def _throughput(evaluator, n_subsets: int, seconds: float) -> dict:
    """Subsets and subset × prompt evaluations per second of this process's work: a resumed
    run's passes done before (evaluator.resumed subset × prompt) took none of `seconds`."""
    new_work = n_subsets * evaluator.n_rows - evaluator.resumed
    return dict(subsets_per_s=new_work / evaluator.n_rows / seconds,
                subset_prompts_per_s=new_work / seconds)


MAX_TOP1_CHECKED = 100  # minimal subsets whose top-1 agreement verify measures


def check_top1(evaluator, reference, reference_logits, minimal_subsets, floor) -> dict:
    """Top-1 agreement (the subset's top token over the whole vocabulary is the reference's)
    of the circuit and of the first MAX_TOP1_CHECKED listed minimal subsets, against `floor`.

    Subsets are judged by accuracy (and f) alone: a top-1 check needs every subset's whole
    logit vector (2^n x rows x vocabulary), not just the answer and distractor logits. A floor
    on top-1 agreement can only remove subsets from those that pass, so a circuit that passes
    it and that the accuracy rule finds irreducible is irreducible under the gate's whole rule;
    a minimal subset below the floor does not pass that whole rule (a superset of it may)."""
    from condense.evaluate import EvalReference, evaluate

    ref = EvalReference(reference_logits, reference.empty_logit_diff, evaluator.intervention)
    graph = evaluator.graph
    index = {name: i for i, name in enumerate(evaluator.edge_names)}

    def top1(names):
        mask = torch.zeros(graph.n_senders, graph.n_receivers)
        for name in names:
            s, r = evaluator.edges[index[name]]
            mask[s, r] = 1.0
        return evaluate(evaluator.model, graph, evaluator.cols, evaluator.intervention,
                        evaluator.batch_size, means=evaluator.means, edge_mask=mask,
                        reference=ref)["top1_agreement"]

    circuit = top1(evaluator.edge_names)
    subsets = [top1(names) for names in minimal_subsets[:MAX_TOP1_CHECKED]]
    return dict(top1_floor=floor, top1_agreement_circuit=circuit,
                circuit_passes_top1=bool(circuit >= floor - ACCURACY_EPS),
                minimal_faithful_top1_agreement=subsets,
                minimal_faithful_passing_top1=sum(a >= floor - ACCURACY_EPS for a in subsets))


# ---------------------------------------------------------------- a run folder

def run_criterion(cfg) -> dict:
    """How the run accepted its circuit, so that verification judges subsets the same way: a
    condensation run's gate (val accuracy within gate_accuracy_tol of the original's, and
    f >= gate_faithfulness when that is set; its perplexity guard does not depend on the
    subset; a top-1 agreement floor, gate_top1_agreement, is checked on the circuit and its
    minimal subsets: check_top1), otherwise faithfulness f >= faithfulness_threshold (the
    smallest-faithful search)."""
    if cfg.method == "condense":
        both = cfg.gate_faithfulness > 0
        return dict(criterion="both" if both else "accuracy", accuracy_tol=cfg.gate_accuracy_tol,
                    threshold=cfg.gate_faithfulness if both else cfg.faithfulness_threshold,
                    top1_floor=cfg.gate_top1_agreement or None)
    return dict(criterion="faithfulness", accuracy_tol=0.05, threshold=cfg.faithfulness_threshold,
                top1_floor=None)


def verify_run(run_dir, *, max_edges=DEFAULT_MAX_EDGES, tau=0.05, split="test", n=200,
               batch_size=None, threshold=None, model=None, task=None, intervention=None,
               method="auto", device=None, dtype=None, out_dir=None, progress=True, threads=None,
               criterion="run", quantization="as run", local=False, reduce=True, pairs=True,
               max_removals=None):
    """Verify `run_dir`'s circuit.json (see the module docstring); returns the report.
    criterion "run": the criterion the run itself used to accept its circuit (see run_criterion).
    quantization "as run": the base quantized as the run's was; None, "4bit", "8bit" override."""
    from condense import tasks
    from condense.artifacts import atomic_write, write_json
    from condense.runs import open_output, read_run

    begin = time.perf_counter()
    run = read_run(run_dir, "verify")  # circuit.json, or circuit.json.gz for large circuits
    out = out_dir or run_dir
    # before any model loads: a folder it cannot write (read-only: --out), and one writer
    with open_output(out, reads=run_dir):
        return _verify_run(run, run_dir, out, begin, max_edges=max_edges, tau=tau, split=split,
                           n=n, batch_size=batch_size, threshold=threshold, model=model,
                           task=task, intervention=intervention, method=method, device=device,
                           dtype=dtype, progress=progress, threads=threads, criterion=criterion,
                           quantization=quantization, local=local, reduce=reduce, pairs=pairs,
                           max_removals=max_removals)


def _verify_run(run, run_dir, out, begin, *, max_edges, tau, split, n, batch_size, threshold,
                model, task, intervention, method, device, dtype, progress, threads, criterion,
                quantization, local, reduce, pairs, max_removals):
    from condense import tasks
    from condense.artifacts import atomic_write, write_json
    if not local:
        check_size(sum(1 for e in run.circuit_json["edges"].values() if e["in_graph"]),
                   max_edges)  # before anything loads
    cfg = run.config
    task = task or cfg.task
    intervention = intervention or cfg.intervention
    if criterion not in CRITERIA:
        raise ValueError(f"criterion {criterion!r}; choose one of {', '.join(CRITERIA)}")
    run_rule = run_criterion(cfg)
    criterion = run_rule["criterion"] if criterion == "run" else criterion
    if threshold is None:
        threshold = (run_rule["threshold"] if criterion == run_rule["criterion"]
                     else cfg.faithfulness_threshold)
    batch_size = batch_size or cfg.batch_size
    seed = cfg.seed
    net, tokenizer, device = run.load_model(model, device, dtype, threads, quantization)
    model_path, adapter = model or cfg.model, run.adapter
    quantization = cfg.quantization if quantization == "as run" else quantization
    rows = tasks.load_task(task, tokenizer, split, n=n, seed=seed)
    graph = run.circuit(net)
    means = run.means(net, graph, tokenizer, task, intervention)
    reference_logits, reference = None, "full model"
    if cfg.method == "condense" and adapter:
        # the gate judged the circuit against the original model (adapter off): so does verify
        from condense.evaluate import reference_outputs
        with net.disable_adapter():
            reference_logits = reference_outputs(net, graph, rows, intervention, batch_size,
                                                 means).full_logits
        reference = "original model (adapter off)"
    load_s = time.perf_counter() - begin

    show = Progress(f"verify {graph.n_edges} edges") if progress else None
    sums = SubsetSums(os.path.join(out, STATE_FILE), run_state_key(
        run, model=model_path, quantization=quantization, task=task, split=split, n=n, seed=seed,
        intervention=intervention, dtype=dtype, device=str(device)))
    memo = EvaluationMemo(os.path.join(out, GREEDY_FILE), repr((sums.key, batch_size, method)))
    report, f, minimal = verify_circuit(
        net, graph, rows, intervention=intervention, means=means, threshold=threshold, tau=tau,
        batch_size=batch_size, method=method, max_edges=max_edges, progress=show,
        criterion=criterion, accuracy_tol=run_rule["accuracy_tol"], local=local, reduce=reduce,
        pairs=pairs, max_removals=max_removals, sums=sums, memo=memo,
        reference_logits=reference_logits, reference_name=reference,
        top1_floor=run_rule["top1_floor"] if criterion == run_rule["criterion"] else None)
    report = dict(run_dir=run_dir, model=model_path, adapter=adapter, quantization=quantization,
                  task=task, split=split, seed=seed, device=str(device), **report)
    report["timing"].update(load_s=load_s, total_s=time.perf_counter() - begin)
    if f is not None:  # exhaustive: every subset's f and the size picture
        import numpy as np
        buf = io.BytesIO()
        np.save(buf, f.numpy().astype("float32"))
        atomic_write(os.path.join(out, "verify_faithfulness.npy"), buf.getvalue())
        plot_subsets(os.path.join(out, "verify_subsets.png"), f, minimal, report["n_edges"], threshold,
                     title=f"{os.path.basename(os.path.normpath(run_dir))}: {task} {split}, "
                           f"{report['n_rows']} rows, {intervention}")
    if report.get("pairs_checked", True):
        plot_pairs(os.path.join(out, "verify_pairs.png"), report)
    else:  # --singles: how much each edge's removal costs, instead of the pairs
        plot_removals(os.path.join(out, "verify_removals.png"), report)
    write_json(os.path.join(out, "verify.json"), report)
    sums.remove()  # verify.json holds the results now
    memo.remove()
    if os.path.abspath(out) == os.path.abspath(run_dir):
        from condense.report import refresh_report
        refresh_report(run_dir)
    return report


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="condense verify",
        description="Verify a run's circuit.json: every subset (is it irreducible?) and every pair "
                    "(interactions), or with --local every one- and two-edge removal; writes "
                    "verify.json and pictures into the run folder. Interrupted, the same command "
                    "goes on where it stopped (verify_state.pt).")
    ap.add_argument("run_dir", help="run folder with circuit.json (and recipe.yaml, an adapter)")
    ap.add_argument("--max-edges", type=int, default=DEFAULT_MAX_EDGES,
                    help="largest circuit to enumerate (2^n subsets); default %(default)s")
    ap.add_argument("--tau", type=float, default=0.05, help="pair interaction tolerance τ")
    ap.add_argument("--split", default="test", choices=("train", "val", "test"), help="split of the --n rows")
    ap.add_argument("--n", type=int, default=200, help="task rows")
    ap.add_argument("--batch-size", type=int, default=None, help="prompts per pass (recipe's)")
    ap.add_argument("--threshold", type=float, default=None,
                    help="faithfulness threshold (the run's: its gate_faithfulness or "
                         "faithfulness_threshold)")
    ap.add_argument("--criterion", default="run", choices=CRITERIA,
                    help="when a subset passes: the run's own rule (condensation: its gate's "
                         "accuracy, plus faithfulness if it gated on it; other runs: faithfulness), "
                         "or faithfulness / accuracy / both")
    ap.add_argument("--model", default=None, help="base model (recipe's model)")
    ap.add_argument("--task", default=None, help="task (recipe's task)")
    ap.add_argument("--intervention", default=None, choices=("patching", "mean", "zero"),
                    help="ablation (recipe's intervention, else patching)")
    ap.add_argument("--method", default="auto", choices=("auto", "sparse", "dense"),
                    help="subset evaluation (condense.verify.subsets): auto = sparse (every supported "
                         "model); dense = one exact forward per subset, its check")
    ap.add_argument("--device", default=None, help="cpu, cuda, ... (recipe's, else cuda if available)")
    ap.add_argument("--dtype", default=None, help="float32, bfloat16, float16 (recipe's, else as saved)")
    ap.add_argument("--quantization", default="as-run", choices=("as-run", "none", "4bit", "8bit"),
                    help="the base: quantized as the run's was (its recipe's quantization), full "
                         "precision, or 4/8-bit (an adapter healed over one base loads over any)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (default: condense.runtime's policy)")
    ap.add_argument("--local", action="store_true",
                    help="any size, no enumeration: the circuit, every one-edge and every two-edge "
                         "removal (1-minimality, reducibility when a removal passes, pairs)")
    ap.add_argument("--singles", action="store_true",
                    help="with --local: one-edge removals only (1 + n subsets, no pairs), for "
                         "circuits whose n(n-1)/2 pairs are out of reach")
    ap.add_argument("--max-removals", type=int, default=None, metavar="K",
                    help="with --singles: only the first K edges' removals, from the logits back "
                         "(the cheapest): a passing one proves reducibility, none passing proves nothing")
    ap.add_argument("--no-reduce", action="store_true",
                    help="with --local: skip the greedy reduction of a reducible circuit to a "
                         "passing subset that no edge can leave (about as many subsets again), "
                         "and the check of every subset of it (2^k, up to --max-edges edges)")
    ap.add_argument("--out", default=None, help="write here instead of the run folder")
    args = ap.parse_args(argv)
    if args.singles and not args.local:
        ap.error("--singles goes with --local (the one-edge removals of a local check)")
    if args.max_removals is not None and not (args.singles and args.max_removals > 0):
        ap.error("--max-removals K goes with --local --singles, K >= 1")
    quantization = {"as-run": "as run", "none": None}.get(args.quantization, args.quantization)
    try:
        report = verify_run(args.run_dir, max_edges=args.max_edges, tau=args.tau, split=args.split,
                            n=args.n, batch_size=args.batch_size, threshold=args.threshold,
                            model=args.model, task=args.task, intervention=args.intervention,
                            method=args.method, device=args.device, dtype=args.dtype,
                            out_dir=args.out, threads=args.threads, criterion=args.criterion,
                            quantization=quantization, local=args.local,
                            reduce=not args.no_reduce, pairs=not args.singles,
                            max_removals=args.max_removals)
    except CircuitTooLarge as e:
        print(f"condense.verify: {e}", file=sys.stderr)
        return 2
    local = report["mode"] == "local"
    # local: the reason follows (what removal passes, or that none does), so the brief words
    verdict = irreducibility_words(report["irreducible"], local=local, brief=local)
    if local:
        verdict += local_words(report)
    else:
        if report["irreducible"] is not None:
            verdict += f"; {report['n_minimal_faithful_subsets']} minimal faithful subsets"
        if report["empty_passes"]:
            verdict += (" (the empty circuit passes: the corrupted run alone answers, so no "
                        "edge is needed and the subsets say nothing)")
    print(f"{report['n_edges']} edges, f(C) = {report['faithfulness_circuit']:.3f}, accuracy "
          f"{report['accuracy_circuit']:.3f} (reference {report['accuracy_reference']:.3f}); passes "
          f"the {report['criterion']} criterion: {report['circuit_faithful']}; {verdict}; "
          + (f"top-1 agreement {report['top1_agreement_circuit']:.3f} (floor "
             f"{report['top1_floor']:g}; {report['minimal_faithful_passing_top1']} of "
             f"{len(report['minimal_faithful_top1_agreement'])} minimal subsets checked pass "
             f"it); " if report.get("top1_floor") is not None else "")
          + (f"{report['n_interacting_pairs']}/{len(report['pairs'])} pairs interact, median "
             f"partners {report['partners_median']}; " if report.get("pairs_checked", True) else
             "pairs not checked (--singles); ")
          + f"{report['timing']['subsets_s']:.1f}s for "
          f"{report['subsets_evaluated']:,} subsets -> {args.out or args.run_dir}/verify.json")
    return 0


if __name__ == "__main__":  # python -m condense.verify.run is `condense verify`
    from condense.cli import module_entry
    module_entry("verify")
