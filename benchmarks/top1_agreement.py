"""Where a condensed circuit's next token disagrees with the original model's, by how sure the
original was.

    HF_HUB_OFFLINE=1 python benchmarks/top1_agreement.py RUN [RUN ...] [--n 200] [--split test]
        [--threads 1] [--quantized 4bit|8bit] [--top-n N,N,...] [--counterfactuals K]
        [--json PATH]

For each run folder (a condensation run: circuit.json, adapter; or a frozen scoring run's
circuit, compared with the model itself): on the run's task rows, the
original model's last-position distribution (the base with the adapter off, every edge on) and
the circuit's (adapter on, pruned edges ablated as the run ablated them). Reports top-1
agreement overall and split by the original's top-1 probability (>= 0.3, >= 0.5 and below),
by template (seen in training or held out, where the task has both), what the disagreeing
top-1 tokens are (the answer, the distractor, another token) for each side, how often the
circuit makes the original's choice between the answer and the distractor (`choice_agreement`:
the task's decision, whatever token is on top), and on the disagreeing rows the original's
top-1 probability and the circuit's probability of that token. The same top-1 agreement as
metrics.json's on the same rows.
`--quantized 4bit|8bit`: also the top-1 agreement of the original model quantized that way with
the full-precision original, on each run's rows: how far the next token moves under a change
of the weights that nobody would call a different model.
`--top-n`: for a frozen scoring run, its ranking cut to each of these sizes (pruned as its
search prunes) instead of its smallest faithful circuit: how large a frozen circuit has to be
before it picks the original's next token as often as a bar asks.
`--counterfactuals K` (IOI): each circuit again under K sets of corrupted prompts, the first the
rows' own, the others with the third name drawn again: how much of the disagreement moves with
which name the pruned edges carry (the original, every edge on, does not depend on it).
"""
import argparse
import collections
import contextlib
import os
from collections.abc import Iterator

import torch


def _categories(top, answer, distractor):
    return ["answer" if t == a else "distractor" if t == d else "other"
            for t, a, d in zip(top.tolist(), answer.tolist(), distractor.tolist())]


def breakdown(run_dir: str, n: int = 200, split: str = "test", threads: int = 1,
              batch_size: int = 16, top_n: list | None = None,
              counterfactuals: int = 0) -> Iterator[dict]:
    """One result per circuit, each as soon as it is measured: the run's own circuit, or with
    `top_n` (a frozen scoring run only) the pruned top-n circuit of the run's scores for each
    n; all against one run of the original. `counterfactuals` > 1 (IOI): also each circuit's
    agreement with the third name of every corrupted prompt drawn again that many times
    (`counterfactual_spread`)."""
    from condense import tasks
    from condense.curves import pruned_topn
    from condense.evaluate import reference_outputs
    from condense.runs import read_run

    run = read_run(run_dir, "analyse")
    cfg = run.config
    if counterfactuals > 1 and cfg.intervention != "patching":
        raise SystemExit(f"{run_dir}: --counterfactuals draws the corrupted prompts again, but this "
                         f"run ablates by {cfg.intervention!r}: its pruned edges never carry them")
    net, tokenizer, device = run.load_model(threads=threads)
    rows = tasks.load_task(cfg.task, tokenizer, split, n=n, seed=cfg.seed)
    draws = redrawn_counterfactuals(rows, tokenizer, counterfactuals) if counterfactuals > 1 else None
    graph = run.circuit(net)
    if top_n and run.adapter:
        raise SystemExit(f"{run_dir}: --top-n re-ranks a frozen scoring run's scores; this run "
                         "has an adapter, and its circuit is what condensation kept")
    # under mean ablation a pruned edge carries the run's own sender means (the original's)
    means = run.means(net, graph, tokenizer)
    # a frozen circuit (a scoring run: no adapter) is compared with the model itself
    with net.disable_adapter() if run.adapter else contextlib.nullcontext():
        original = reference_outputs(net, graph, rows, cfg.intervention, batch_size,
                                     means=means).full_logits
    total = int(graph.valid.sum())
    if top_n and max(top_n) > total:
        raise SystemExit(f"--top-n {max(top_n)}: the graph has {total} edges (sizes 0 to {total})")
    for k in top_n or [None]:
        if k is not None:  # the same ranking at another size, pruned as the search prunes
            pruned_topn(graph, k, cfg.absolute_scores)
        result = dict(n_requested=k, **_compare(net, graph, cfg, tokenizer, rows, original, device,
                                                batch_size, means),
                      run_dir=run_dir, split=split)
        if draws:
            result["counterfactual_draws"] = counterfactual_spread(
                net, graph, cfg, rows, original, draws, device, batch_size)
        yield result


def redrawn_counterfactuals(rows, tokenizer, draws: int, seed: int = 0) -> list:
    """`draws` sets of corrupted prompts for IOI `rows` (token ids, one list per row): the
    first the rows' own, each further one with the third name (the one token where a corrupted
    prompt differs from its clean prompt) drawn again from the task's single-token names,
    never a name of the clean prompt or the row's own third name. Under patching a pruned
    edge carries that name's activations, so the circuit's output, unlike the original's,
    can depend on which third name was drawn."""
    import random

    from condense.tasks.words import NAMES, single_tokens

    names = {tokenizer.encode(" " + w, add_special_tokens=False)[0]
             for w in single_tokens(tokenizer, NAMES)}
    own = [list(ids) for ids in rows["corrupted_ids"]]
    sites = []
    for clean, corrupted in zip(rows["clean_ids"], own):
        at = [p for p, (a, b) in enumerate(zip(clean, corrupted)) if a != b]
        if len(at) != 1 or corrupted[at[0]] not in names:
            raise SystemExit("--counterfactuals draws IOI's third name again; these rows' "
                             "corrupted prompts do not differ from the clean ones in one name "
                             "(supported task: ioi)")
        sites.append(at[0])
    rng = random.Random(seed)
    out = [own]
    for _ in range(draws - 1):
        drawn = []
        for clean, corrupted, at in zip(rows["clean_ids"], own, sites):
            pool = sorted(names - set(clean) - {corrupted[at]})
            drawn.append(corrupted[:at] + [rng.choice(pool)] + corrupted[at + 1:])
        out.append(drawn)
    return out


def counterfactual_spread(net, graph, cfg, rows, original, draws, device, batch_size) -> dict:
    """The circuit against the original under each set of corrupted prompts in `draws` (the
    first the rows' own): top-1 agreement and KL per draw, the rows whose circuit top-1 token
    changes with the draw, the rows agreeing under every draw and under at least one, and the
    agreement and KL of the circuit's next-token distribution averaged over the draws."""
    from condense.evaluate import dataset_columns
    from condense.metrics import kl_rows

    cols, _ = dataset_columns(rows)
    logp = torch.stack([_circuit_logits(net, graph, cfg, cols, d, device, batch_size).log_softmax(-1)
                        for d in draws])
    target = original.log_softmax(-1)
    top = logp.argmax(-1)
    agree = top == target.argmax(-1)
    changes = (top != top[0]).any(0)
    averaged = torch.logsumexp(logp, 0) - torch.log(torch.tensor(float(len(draws))))
    sure = target.exp().max(-1).values
    return dict(
        draws=len(draws),
        top1_agreement=[float(a.float().mean()) for a in agree],
        kl=[float(kl_rows(target, x).mean()) for x in logp],
        rows_changing=int(changes.sum()),
        original_top1_prob_median_where_changing=float(sure[changes].median()) if changes.any() else None,
        agree_every_draw=float(agree.all(0).float().mean()),
        agree_some_draw=float(agree.any(0).float().mean()),
        averaged_top1_agreement=float((averaged.argmax(-1) == target.argmax(-1)).float().mean()),
        averaged_kl=float(kl_rows(target, averaged).mean()))


def _circuit_logits(net, graph, cfg, cols, corrupted_ids, device, batch_size,
                    means=None) -> torch.Tensor:
    """The circuit's last-position logits on the clean prompts of `cols`, pruned edges ablated
    as the run ablated them, with `corrupted_ids` (one list per row) as the counterfactuals."""
    from condense.metrics import pad_batch
    from condense.patching import run_graph

    n = len(corrupted_ids)
    out = None
    with torch.no_grad():
        for start in range(0, n, batch_size):
            idx = list(range(start, min(n, start + batch_size)))
            clean, mask, lengths = pad_batch([list(cols["clean_ids"][i]) for i in idx])
            corrupted, _, _ = pad_batch([list(corrupted_ids[i]) for i in idx])
            logits = run_graph(net, graph, clean.to(device), corrupted.to(device),
                               mask.to(device), intervention=cfg.intervention,
                               logit_positions=(lengths - 1).to(device), means=means).float().cpu()
            if out is None:
                out = torch.zeros(n, logits.shape[-1])
            out[idx] = logits
    return out


def _compare(net, graph, cfg, tokenizer, rows, original, device, batch_size, means=None) -> dict:
    """The circuit's last-position logits on `rows` against the original's (`original`)."""
    from condense import tasks
    from condense.evaluate import dataset_columns
    from condense.metrics import kl_rows, logit_diff_stats

    cols, n = dataset_columns(rows)
    circuit = _circuit_logits(net, graph, cfg, cols, cols["corrupted_ids"], device, batch_size, means)
    answer = torch.tensor([int(a) for a in cols["answer_id"]])
    distractor = torch.tensor([int(d) for d in cols["distractor_id"]])
    p_orig, p_circ = original.softmax(-1), circuit.softmax(-1)
    top_orig, top_circ = original.argmax(-1), circuit.argmax(-1)
    agree = top_orig == top_circ
    # the task's own decision: is the answer above the distractor, in both or in neither
    ld_orig, ld_circ = (logit_diff_stats(x, cols)["per_row"] for x in (original, circuit))
    same_choice = (ld_orig > 0) == (ld_circ > 0)
    sure = p_orig.max(-1).values
    cat_orig = _categories(top_orig, answer, distractor)
    cat_circ = _categories(top_circ, answer, distractor)
    off = (~agree).nonzero().flatten().tolist()
    by_confidence = {}
    for th in (0.3, 0.5):
        hi = sure >= th
        by_confidence[f">={th}"] = dict(rows=int(hi.sum()), agreement=float(agree[hi].float().mean()))
        by_confidence[f"<{th}"] = dict(rows=int((~hi).sum()),
                                       agreement=float(agree[~hi].float().mean()))
    # IOI's test rows include templates the gate's val rows never had
    by_template = {part: dict(rows=len(idx), agreement=float(agree[idx].float().mean()))
                   for part, idx in tasks.template_parts(rows).items()}
    kl = kl_rows(original.log_softmax(-1), circuit.log_softmax(-1))
    return dict(
        task=cfg.task, n_rows=n, edges=graph.count_edges(),
        top1_agreement=float(agree.float().mean()), kl=float(kl.mean()),
        choice_agreement=float(same_choice.float().mean()),
        accuracy=float((ld_circ > 0).float().mean()),
        by_original_confidence=by_confidence,
        by_template=by_template,
        original_top1=dict(collections.Counter(cat_orig)),
        circuit_top1=dict(collections.Counter(cat_circ)),
        disagreements={f"{a} -> {b}": c for (a, b), c in collections.Counter(
            (cat_orig[i], cat_circ[i]) for i in off).items()},
        original_top1_prob_median=float(sure.median()),
        disagreeing=dict(
            rows=len(off),
            original_top1_prob_median=float(sure[off].median()) if off else None,
            circuit_prob_of_original_top1_median=(
                float(p_circ[off, top_orig[off]].median()) if off else None),
            circuit_top1_prob_median=float(p_circ.max(-1).values[off].median()) if off else None,
            examples=[dict(original=tokenizer.decode(int(top_orig[i])),
                           circuit=tokenizer.decode(int(top_circ[i])),
                           original_prob=float(sure[i]),
                           original_prob_of_circuit_top1=float(p_orig[i, top_circ[i]]))
                      for i in off[:10]]))


def quantized_agreement(run_dir: str, quantization: str, n: int = 200, split: str = "test",
                        threads: int = 1, batch_size: int = 16) -> dict:
    """Top-1 agreement (and KL) of the `quantization`-quantized original with the
    full-precision original on the rows of `run_dir`'s task (no circuit, no adapter)."""
    from condense import tasks
    from condense.evaluate import dataset_columns
    from condense.methods.condensation.healing import last_logprobs
    from condense.metrics import kl_rows, logit_diff_stats
    from condense.models import load_model, load_tokenizer
    from condense.runtime import apply_thread_policy
    from condense.runs import read_run

    cfg = read_run(run_dir, "analyse").config
    tokenizer = load_tokenizer(cfg.tokenizer or cfg.model)
    rows = tasks.load_task(cfg.task, tokenizer, split, n=n, seed=cfg.seed)
    cols, n = dataset_columns(rows)
    logp = {}
    for q in (None, quantization):
        net = load_model(cfg.model, device="cpu", quantization=q)
        apply_thread_policy(threads, net)
        with torch.no_grad():
            logp[q] = last_logprobs(net, rows, batch_size)
        del net
    full, quant = logp[None], logp[quantization]
    kl = kl_rows(full, quant)
    return dict(task=cfg.task, model=cfg.model, quantization=quantization, n_rows=n,
                top1_agreement=float((full.argmax(-1) == quant.argmax(-1)).float().mean()),
                kl=float(kl.mean()), accuracy_full_precision=logit_diff_stats(full, cols)["accuracy"],
                accuracy_quantized=logit_diff_stats(quant, cols)["accuracy"])


def _sizes(value: str) -> list:
    sizes = [int(x) for x in value.split(",")]
    if any(k < 0 for k in sizes):
        raise argparse.ArgumentTypeError(f"sizes are edge counts, 0 or more: {value}")
    return sizes


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders (condensation, or a frozen scoring run)")
    ap.add_argument("--n", type=int, default=200, help="rows of the split")
    ap.add_argument("--split", default="test", choices=["train", "val", "test"],
                    help="which task rows (the gate checks val)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--quantized", choices=["4bit", "8bit"], default=None,
                    help="also: the quantized original against the full-precision one per task")
    ap.add_argument("--top-n", type=_sizes, default=None,
                    help="comma-separated sizes: a frozen scoring run's ranking cut to each "
                         "top-n (then pruned), instead of its smallest faithful circuit")
    ap.add_argument("--counterfactuals", type=int, default=0, metavar="K",
                    help="IOI: also measure each circuit under K draws of the corrupted prompts' "
                         "third name (the first draw the rows' own); at least 2")
    ap.add_argument("--json", help="write every run's numbers and breakdown here")
    args = ap.parse_args(argv)
    if args.counterfactuals == 1 or args.counterfactuals < 0:
        ap.error(f"--counterfactuals {args.counterfactuals}: at least 2 draws (0: none)")
    results = []
    for r in (r for run_dir in args.runs
              for r in breakdown(run_dir, args.n, args.split, args.threads, top_n=args.top_n,
                                 counterfactuals=args.counterfactuals)):
        results.append(r)
        conf = r["by_original_confidence"]
        d = r["disagreeing"]
        print(f"{os.path.basename(os.path.normpath(r['run_dir']))}: {r['edges']} edges"
              + (f" (top-{r['n_requested']})" if r["n_requested"] is not None else "")
              + f", accuracy {r['accuracy']:.3f}, KL {r['kl']:.3f}, top-1 agreement "
              f"{r['top1_agreement']:.3f}, answer-or-distractor agreement "
              f"{r['choice_agreement']:.3f}; original sure (p >= 0.5) on {conf['>=0.5']['rows']} rows: "
              f"{conf['>=0.5']['agreement']:.3f}, unsure on {conf['<0.5']['rows']}: "
              f"{conf['<0.5']['agreement']:.3f}; "
              + "".join(f"{part} templates ({t['rows']} rows) {t['agreement']:.3f}; "
                        for part, t in r["by_template"].items())
              + f"{d['rows']} disagreements {r['disagreements']}, "
              f"original's top-1 prob there (median) {d['original_top1_prob_median']}")
        if "counterfactual_draws" in r:
            c = r["counterfactual_draws"]
            print(f"  under {c['draws']} draws of the third name: top-1 agreement "
                  f"{min(c['top1_agreement']):.3f}-{max(c['top1_agreement']):.3f}, KL "
                  f"{min(c['kl']):.3f}-{max(c['kl']):.3f}; the circuit's top-1 token changes with "
                  f"the draw on {c['rows_changing']} of {r['n_rows']} rows; agreeing under every "
                  f"draw {c['agree_every_draw']:.3f}, under some draw {c['agree_some_draw']:.3f}; "
                  f"averaged over the draws: agreement {c['averaged_top1_agreement']:.3f}, KL "
                  f"{c['averaged_kl']:.3f}")
    quantized = []
    if args.quantized:
        from condense.runs import read_run
        seen = set()
        for run_dir in args.runs:
            cfg = read_run(run_dir, "analyse").config
            if (cfg.model, cfg.task) in seen:
                continue
            seen.add((cfg.model, cfg.task))
            r = quantized_agreement(run_dir, args.quantized, args.n, args.split, args.threads)
            quantized.append(r)
            print(f"{r['task']}: the {args.quantized} original against the full-precision one: top-1 "
                  f"agreement {r['top1_agreement']:.3f}, KL {r['kl']:.4f}, accuracy "
                  f"{r['accuracy_quantized']:.3f} vs {r['accuracy_full_precision']:.3f}")
    if args.json:
        from condense.artifacts import command_line, write_json
        write_json(args.json, dict(
            command=command_line("benchmarks/top1_agreement.py", argv, env="HF_HUB_OFFLINE=1"),
            results=results, quantized=quantized))

if __name__ == "__main__":
    main()
