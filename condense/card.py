"""A model card for any causal LM: measured behaviour on the six tasks' test splits,
held-out IOI templates, general-text perplexity, and where IOI lives (logit-difference
drop when each head alone is mean-ablated).

    python -m condense.card MODEL [--n 500] [--out DIR] [--ablation-rows N] [--threads N]

MODEL is anything `condense.models.load_model` takes: a local folder, a named offline model
("smollm2-135m") or a .gguf file. Writes `README.md`, `card.json` and
`ioi_head_ablation.png` into `--out` (default: MODEL itself when it is a local folder;
required otherwise). Plain `transformers` inference only, no condense graph.

The head ablation costs one forward per head. Each ablated forward starts at the ablated
head's layer from that layer's cached input (the layers below are unchanged by the
ablation), which halves the work on average and gives the same numbers as a full forward;
`--ablation-rows` measures it on the first N IOI test rows only.
"""
import argparse
import os
import shlex
import sys
import time

import torch
from tqdm.auto import tqdm

from . import tasks
from .artifacts import atomic_write, write_json
from .runtime import apply_thread_policy
from .metrics import last_logits, pad_batch, perplexity, task_scores
from .node_ablation import LayerCache, head_means, head_means_ablated, resumes_exactly  # noqa: F401
from .models import NAMED_MODELS, load_model, load_tokenizer
from .tasks import words as W

# Pass bars: clean accuracy, and corrupted LD at most half of clean.
ACCURACY_BAR = dict(ioi=0.9, induction=0.9, agreement=0.9, docstring=0.8, acronym=0.8,
                    greater_than=0.8)


def _log(msg):
    print(f"[card] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- per-head ablation
def head_ablation_drops(model, rows, means, batch_size=64, resume=True, memo=None, on_update=None):
    """Per-row LD of `rows` with each head alone mean-ablated: returns the clean per-row
    LD [N] and the ablated one [layers, heads, N].

    `memo` (a dict) keeps what is done: "base", "ablated" and, per batch of rows, how many of
    its layers are ("layers_done"); what it holds is not measured again, and `on_update` is
    called after each layer of each batch (so that a caller can save it).

    With `resume`, each ablated forward runs only from the ablated layer on, from the
    cached input of that layer (exact: the blocks below do not see the ablation); this is
    checked against a full forward first and dropped for models where it does not match
    (e.g. extra logit processing the resumed forward would miss)."""
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    seqs = [list(s) for s in rows["clean_ids"]]
    answer = torch.as_tensor(rows["answer_id"])
    distractor = torch.as_tensor(rows["distractor_id"])

    def ld(logits, idx):
        return logits.gather(1, answer[idx, None])[:, 0] - logits.gather(1, distractor[idx, None])[:, 0]

    memo = {} if memo is None else memo
    if memo.get("base") is None:
        memo["base"] = ld(last_logits(model, seqs), torch.arange(len(seqs)))
    base = memo["base"]
    device = next(model.parameters()).device
    ablated = memo.setdefault("ablated", torch.zeros(L, H, len(seqs)))
    layers_done = memo.setdefault("layers_done", {})
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    starts = range(0, len(order), batch_size)
    bar = tqdm(total=L * len(starts), initial=sum(layers_done.get(s, 0) for s in starts),
               desc="head ablation", unit="layer")
    for start in starts:
        if layers_done.get(start, 0) == L:
            continue
        batch = order[start:start + batch_size]
        idx = torch.tensor(batch)
        ids, mask, lengths = pad_batch([seqs[i] for i in batch])
        ids, mask = ids.to(device), mask.to(device)
        if resume:
            cache = LayerCache(model, ids, mask, lengths.to(device))
            if not resumes_exactly(model, cache, [seqs[i] for i in batch],
                                   lambda: head_means_ablated(model, means, [(L - 1, 0)])):
                _log("resumed forwards do not match full ones for this model: "
                     "running full forwards")
                resume = False
        for layer in range(layers_done.get(start, 0), L):
            for h in range(H):
                with head_means_ablated(model, means, [(layer, h)]):
                    if resume:
                        logits = cache.resume(layer).cpu()
                    else:
                        logits = last_logits(model, [seqs[i] for i in batch], batch_size=len(batch))
                ablated[layer, h, idx] = ld(logits, idx)
            layers_done[start] = layer + 1
            bar.update(1)
            if on_update:
                on_update()
    bar.close()
    return base, ablated


def plot_head_drops(drop, base, path, title=None):
    """Heat map (layers x heads) of the LD drop of each ablated head, values written in."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    L, H = drop.shape
    big = L * H > 150  # e.g. 30 x 9: a compact layout
    fig, ax = plt.subplots(figsize=(0.9 * H + 3, 0.42 * L + 2) if big
                           else (1.2 * H + 2, 0.9 * L + 1.5))
    im = ax.imshow(drop.numpy(), cmap="RdBu_r", vmin=-drop.abs().max(), vmax=drop.abs().max(),
                   aspect="auto" if big else None)
    for (layer, h), v in zip([(a, b) for a in range(L) for b in range(H)], drop.flatten()):
        dark = abs(v) > 0.6 * drop.abs().max()
        ax.text(h, layer, f"{v:.2f}", ha="center", va="center", fontsize=7 if big else 9,
                color="white" if dark else "black")
    ax.set_xticks(range(H)), ax.set_yticks(range(L))
    ax.set_xlabel("head"), ax.set_ylabel("layer")
    ax.set_title(title or f"IOI logit-difference drop, one head mean-ablated\n(clean LD {base:.2f})")
    fig.colorbar(im, ax=ax, label="LD drop")
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=120), "wb")
    plt.close(fig)


def ioi_head_ablation(model, rows, path, means=None, title=None, memo=None, on_update=None):
    """LD drop on IOI `rows` when each head alone is mean-ablated (means over all positions
    of `rows` unless given); draws the heat map to `path` (`title` may name {base}, the
    clean LD, and {rows}). Returns (clean LD, drop [L, H]). `memo`, `on_update`: as
    head_ablation_drops takes them."""
    if means is None:
        means = head_means(model, rows["clean_ids"])
    base_rows, ablated = head_ablation_drops(model, rows, means, memo=memo, on_update=on_update)
    base = base_rows.mean().item()
    drop = base - ablated.mean(-1)
    plot_head_drops(drop, base, path, title and title.format(base=base, rows=len(rows)))
    return base, drop


# ---------------------------------------------------------------- the card
def measure(model, tokenizer, out_dir, n=500, seed=0, ablation_rows=None, title=None,
            memo=None, on_update=None):
    """The card's numbers (a dict); draws `ioi_head_ablation.png` into `out_dir`. Head
    means come from all `n` IOI test prompts, the ablation from the first `ablation_rows`
    of them (all when None). `memo` keeps what is measured ("tasks", "ppl", "means",
    "ablation"): what it holds is taken from it, and `on_update` is called after each part
    is added (so that a caller can save it and a rerun go on)."""
    memo = {} if memo is None else memo
    done = memo.setdefault("tasks", {})
    card = dict(parameters=sum(p.numel() for p in model.parameters()), tasks={})
    if done:
        _log(f"going on: {', '.join(done)} measured before")
    for name in tasks.TASKS:
        if name in done:
            card["tasks"][name] = done[name]
            continue
        t0 = time.time()
        rows = tasks.load_task(name, tokenizer, "test", n=n, seed=seed)
        s = task_scores(model, rows)
        entry = {f"{k}_{part}": round(s[part][k], 4) for part in ("clean", "corrupted")
                 for k in ("accuracy", "logit_diff", "top1")}
        if name == "ioi":
            held = rows.filter(lambda r: r["heldout_template"])
            entry["heldout_templates_accuracy"] = round(
                task_scores(model, held)["clean"]["accuracy"], 4)
            entry["heldout_templates_rows"] = len(held)
        entry["passes"] = bool(entry["accuracy_clean"] >= ACCURACY_BAR[name]
                               and entry["logit_diff_corrupted"] <= 0.5 * entry["logit_diff_clean"])
        card["tasks"][name] = done[name] = entry
        _log(f"{name}: accuracy {entry['accuracy_clean']:.3f} ({time.time() - t0:.0f}s)")
        if on_update:
            on_update()
    t0 = time.time()
    if memo.get("ppl") is None:
        memo["ppl"] = [round(perplexity(model, tasks.general_text(tokenizer, part)["input_ids"]), 2)
                       for part in ("test", "val")]
        _log(f"perplexity test {memo['ppl'][0]} val {memo['ppl'][1]} ({time.time() - t0:.0f}s)")
        if on_update:
            on_update()
    card["ppl_test"], card["ppl_val"] = memo["ppl"]
    t0 = time.time()
    ioi = tasks.load_task("ioi", tokenizer, "test", n=n, seed=seed)
    if memo.get("means") is None:
        memo["means"] = head_means(model, ioi["clean_ids"])
    if ablation_rows is not None and ablation_rows < len(ioi):
        ioi = ioi.select(range(ablation_rows))
    base, drop = ioi_head_ablation(model, ioi, os.path.join(out_dir, "ioi_head_ablation.png"),
                                   means=memo["means"], title=title,
                                   memo=memo.setdefault("ablation", {}), on_update=on_update)
    card["ioi_head_ablation"] = dict(clean_logit_diff=round(base, 4),
                                    drop=[[round(v, 3) for v in r] for r in drop.tolist()])
    _log(f"head ablation on {len(ioi)} rows ({time.time() - t0:.0f}s)")
    return card


def top_heads(card, k=5, sign=1):
    """The k heads whose ablation drops the IOI LD most (`sign=-1`: raises it most):
    [(layer, head, drop)]."""
    drop = card["ioi_head_ablation"]["drop"]
    cells = [(l, h, v) for l, r in enumerate(drop) for h, v in enumerate(r)]
    return [c for c in sorted(cells, key=lambda c: -sign * c[2])[:k] if sign * c[2] > 0]


def render(card):
    """The README of a model's card (any model; the organism has its own text)."""
    m = card["model"]
    desc = f"{m['description']}; " if m.get("description") else ""
    L = [f"# {m['name']}: condense model card\n",
         f"Behaviour of `{m['name']}` on condense's six tasks. Every number below was "
         f"measured by `{card['command']}` on {card['rows']} test prompts per task (plain "
         "`transformers` inference, metric at the last position).\n",
         f"- model: `{m['name']}`: {desc}{m['model_type']}, {m['layers']} layers x "
         f"{m['heads']} heads, width {m['width']}, vocabulary {m['vocab_size']:,}",
         f"- parameters: {card['parameters']:,}",
         f"- held-out general-text perplexity (pydoc topics, test part): {card['ppl_test']}"
         f" (val part: {card['ppl_val']})",
         f"- greater_than form for this tokenizer: {card['greater_than_form']} ("
         + ("numbers are split into digits: the next token is the end year's tens digit; "
            "the answer is a digit above the start year's tens digit, the distractor a "
            "non-zero digit below it" if card["greater_than_form"] == "digit" else
            "two-digit numbers are single tokens: the answer is a two-digit number above the "
            "start year's last two digits, the distractor one below")
         + ")",
         f"- measured in {card['seconds'] / 60:.1f} min on {card['threads']} CPU thread(s)\n",
         "| task | accuracy (clean) | LD clean | top-1 clean | accuracy (corrupted) | LD corrupted | passes |",
         "|---|---|---|---|---|---|---|"]
    for name, e in card["tasks"].items():
        L.append(f"| {name} | {e['accuracy_clean']:.3f} | {e['logit_diff_clean']:.2f} | "
                 f"{e['top1_clean']:.3f} | {e['accuracy_corrupted']:.3f} | "
                 f"{e['logit_diff_corrupted']:.2f} | {'yes' if e['passes'] else 'no'} |")
    ioi = card["tasks"]["ioi"]
    ab = card["ioi_head_ablation"]
    heads = ", ".join(f"L{l}H{h} ({v:.2f})" for l, h, v in top_heads(card)) or "none"
    rises = ", ".join(f"L{l}H{h} ({v:.2f})" for l, h, v in top_heads(card, 3, -1)) or "none"
    L += ["", f"IOI on the {ioi['heldout_templates_rows']} test prompts from the templates "
          f"reserved for the test split: accuracy {ioi['heldout_templates_accuracy']:.3f}.", "",
          "'passes': clean accuracy at least 0.9 (ioi, induction, agreement) or 0.8 "
          "(docstring, acronym, greater_than), and corrupted LD at most half of clean LD.", "",
          "## Where IOI lives", "",
          f"Drop of the IOI logit difference (clean LD {ab['clean_logit_diff']:.2f} on these "
          f"prompts) when one head's output is replaced by its mean over all positions of the "
          f"{card['rows']} IOI test prompts, measured on the first {card['ablation_rows']} of "
          f"them. Largest drops: {heads}. Largest rises (heads that work against the "
          f"answer): {rises}.", "", "![](ioi_head_ablation.png)", ""]
    return "\n".join(L)


def command_line(model_name, n, out, ablation_rows, seed=0, threads=None):
    """The exact `python -m condense.card` command for these settings."""
    cmd = ["python", "-m", "condense.card", model_name, "--n", str(n), "--out", out]
    if ablation_rows is not None:
        cmd += ["--ablation-rows", str(ablation_rows)]
    if seed:
        cmd += ["--seed", str(seed)]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    return " ".join(shlex.quote(c) for c in cmd)


def default_out(model_name):
    """The folder a card goes to without --out: the model's own folder, if it is one."""
    if os.path.isdir(model_name) and model_name not in NAMED_MODELS:
        return model_name
    raise ValueError(f"--out is required for {model_name!r} (not a local model folder)")


STATE_FILE = "card_state.pt"  # what is measured so far, in the card folder until card.json is written
SAVE_EVERY = 10.0  # seconds between saves: a save writes the ablation's [layers, heads, rows] so far
MODEL_FILES = ("config.json", ".safetensors", ".bin", ".gguf", "tokenizer.json")  # what names a model


def resume_file(out: str, model_name: str, model, begin=None, **settings):
    """(the card's resume file in `out`, what it holds of this very card or {}, the callback
    that saves it): a rerun of the same card command goes on from the last save. The key names
    the model (its files' sizes and times when it is a path), its dtype and `settings`; `begin`
    is the perf_counter() at which the command started."""
    from .artifacts import TimedResumeFile
    files = ([os.path.join(model_name, f) for f in sorted(os.listdir(model_name))
              if f.endswith(MODEL_FILES)]  # not the card's own files: a card may go into the folder
             if os.path.isdir(model_name) else [model_name])
    stamps = [(os.path.basename(f), os.path.getsize(f), os.stat(f).st_mtime_ns)
              for f in files if os.path.isfile(f)]
    key = repr((model_name, stamps, str(next(model.parameters()).dtype), sorted(settings.items())))
    state = TimedResumeFile(os.path.join(out, STATE_FILE), key, every=SAVE_EVERY, label="card: ",
                            begin=begin)
    memo = state.load().get("memo") or {}

    def save():
        state.save(dict(memo=memo))
    return state, memo, save


def write_card(model_name, n=500, seed=0, out=None, ablation_rows=None, threads=None):
    """Measure `model_name` and write README.md, card.json and ioi_head_ablation.png into
    `out`. Returns the card (a dict). An interrupted card goes on where it stopped."""
    from .runs import open_output
    out = out or default_out(model_name)
    # before the model loads: a folder it cannot write (--out), and one writer
    with open_output(out):
        return _write_card(model_name, n, seed, out, ablation_rows, threads)


def _write_card(model_name, n, seed, out, ablation_rows, threads):
    t0, begin = time.time(), time.perf_counter()
    model, tokenizer = load_model(model_name), load_tokenizer(model_name)
    apply_thread_policy(threads, model)
    cfg = model.config
    L, H = cfg.num_hidden_layers, cfg.num_attention_heads
    state, memo, save = resume_file(out, model_name, model, begin, n=n, seed=seed,
                                    ablation_rows=ablation_rows)
    card = dict(measure(model, tokenizer, out, n=n, seed=seed, ablation_rows=ablation_rows,
                        title=f"{os.path.basename(os.path.normpath(model_name))}: IOI "
                              "logit-difference drop, one head mean-ablated\n"
                              "(clean LD {base:.2f} on {rows} prompts)", memo=memo, on_update=save),
                rows=n)
    card["ablation_rows"] = min(n, ablation_rows) if ablation_rows else n
    named = NAMED_MODELS.get(model_name)
    card["model"] = dict(name=model_name, description=named.description if named else None,
                         model_type=cfg.model_type, layers=L, heads=H,
                         width=cfg.hidden_size, vocab_size=cfg.vocab_size)
    card["greater_than_form"] = W.gt_form(tokenizer)
    card["command"] = command_line(model_name, n, out, ablation_rows, seed, threads)
    card["threads"] = torch.get_num_threads()
    card["seconds"] = round(state.seconds(), 1)
    card["resumed_seconds"] = round(state.before, 1)
    return save_card(out, card, render(card), t0)


def save_card(out, card, text, t0):
    """card.json and README.md (`text`) into `out`; prints the card and its time."""
    write_json(os.path.join(out, "card.json"), card)
    atomic_write(os.path.join(out, "README.md"), text)
    if os.path.exists(os.path.join(out, STATE_FILE)):
        os.remove(os.path.join(out, STATE_FILE))  # card.json holds it all now
    print(text)
    print(f"(card measured in {time.time() - t0:.0f}s)")
    return card


def main(argv=None):
    ap = argparse.ArgumentParser(prog="condense card",
                                 description="Measure a causal LM on condense's tasks and write its "
                                             "model card. Interrupted, the same command goes on "
                                             "from what it has measured.")
    ap.add_argument("model", help="a local folder, a named model (e.g. smollm2-135m) or a .gguf")
    ap.add_argument("--n", type=int, default=500, help="test prompts per task")
    ap.add_argument("--seed", type=int, default=0, help="seed of the task rows")
    ap.add_argument("--out", default=None,
                    help="card folder (default: the model folder; required for other models)")
    ap.add_argument("--ablation-rows", type=int, default=None,
                    help="IOI rows for the per-head ablation (default: all --n)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = ap.parse_args(argv)
    try:
        out = args.out or default_out(args.model)
    except ValueError as e:
        ap.error(str(e))
    write_card(args.model, n=args.n, seed=args.seed, out=out,
               ablation_rows=args.ablation_rows, threads=args.threads)


if __name__ == "__main__":  # python -m condense.card is `condense card`
    from condense.cli import module_entry
    module_entry("card")
