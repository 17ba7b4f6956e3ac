"""The organism's model card: measured behaviour on the test splits, held-out perplexity,
and where IOI lives (logit-difference drop when each head is mean-ablated).

    python -m condense.organism_card checkpoints/organism [--n 500] [--out DIR]

Prints the report and writes `README.md`, `card.json` and `ioi_head_ablation.png` into
`--out` (default: the checkpoint folder itself, which is how the shipped card was made). Runs plain `transformers` inference only, no condense graph.
"""
import argparse
import json
import os
import time
from contextlib import contextmanager

import torch

from . import tasks
from .metrics import last_logits, logit_diff_stats, perplexity, task_scores
from .models import load_model, load_tokenizer

# Pass bars of the foundation issue: clean accuracy, and corrupted LD at most half of clean.
ACCURACY_BAR = dict(ioi=0.9, induction=0.9, agreement=0.9, docstring=0.8, acronym=0.8,
                    greater_than=0.8)


def _blocks(model):
    return model.transformer.h if hasattr(model, "transformer") else model.model.layers


def _out_proj(block):
    return block.attn.c_proj if hasattr(block, "attn") else block.self_attn.o_proj


@contextmanager
def head_means_ablated(model, head_means, heads):
    """Replace the per-head input of the output projection (the head's z) by its mean,
    for each (layer, head) in `heads`: a mean ablation of those heads."""
    n_head = model.config.num_attention_heads
    hooks = []
    for layer, block in enumerate(_blocks(model)):
        hs = [h for (l, h) in heads if l == layer]
        if not hs:
            continue

        def pre(mod, args, hs=hs, layer=layer):
            z = args[0].clone()
            d = z.shape[-1] // n_head
            for h in hs:
                z[..., h * d:(h + 1) * d] = head_means[layer, h]
            return (z,) + args[1:]
        hooks.append(_out_proj(block).register_forward_pre_hook(pre))
    try:
        yield
    finally:
        for hk in hooks:
            hk.remove()


@torch.no_grad()
def head_means(model, seqs):
    """Mean of each head's z over every position of `seqs`: [layers, heads, head_dim]."""
    n_head = model.config.num_attention_heads
    sums, count, hooks = {}, [0], []
    for layer, block in enumerate(_blocks(model)):
        def pre(mod, args, layer=layer):
            z = args[0]
            sums[layer] = sums.get(layer, 0) + z.reshape(-1, n_head, z.shape[-1] // n_head).sum(0)
            if layer == 0:
                count[0] += z.shape[0] * z.shape[1]
        hooks.append(_out_proj(block).register_forward_pre_hook(pre))
    for s in seqs:  # one at a time: no padding enters the mean
        model(input_ids=torch.tensor([s]))
    for hk in hooks:
        hk.remove()
    return torch.stack([sums[l] for l in range(len(sums))]) / count[0]


def ioi_head_ablation(model, rows, path):
    """LD drop on IOI when each head alone is mean-ablated; draws the heat map to `path`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    L, H = model.config.num_hidden_layers, model.config.num_attention_heads
    means = head_means(model, rows["clean_ids"])
    base = logit_diff_stats(last_logits(model, rows["clean_ids"]), rows)["logit_diff"]
    drop = torch.zeros(L, H)
    for layer in range(L):
        for h in range(H):
            with head_means_ablated(model, means, [(layer, h)]):
                ld = logit_diff_stats(last_logits(model, rows["clean_ids"]), rows)["logit_diff"]
            drop[layer, h] = base - ld
    fig, ax = plt.subplots(figsize=(1.2 * H + 2, 0.9 * L + 1.5))
    im = ax.imshow(drop.numpy(), cmap="RdBu_r", vmin=-drop.abs().max(), vmax=drop.abs().max())
    for (layer, h), v in zip([(a, b) for a in range(L) for b in range(H)], drop.flatten()):
        dark = abs(v) > 0.6 * drop.abs().max()
        ax.text(h, layer, f"{v:.2f}", ha="center", va="center", fontsize=9,
                color="white" if dark else "black")
    ax.set_xticks(range(H)), ax.set_yticks(range(L))
    ax.set_xlabel("head"), ax.set_ylabel("layer")
    ax.set_title(f"IOI logit-difference drop, one head mean-ablated\n(clean LD {base:.2f})")
    fig.colorbar(im, ax=ax, label="LD drop")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return base, drop


def measure(path, out_dir, n=500, seed=0):
    model, tokenizer = load_model(path), load_tokenizer(path)
    card = dict(parameters=sum(p.numel() for p in model.parameters()), tasks={})
    for name in tasks.TASKS:
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
        card["tasks"][name] = entry
    card["ppl_test"] = round(perplexity(model, tasks.general_text(tokenizer, "test")["input_ids"]), 2)
    card["ppl_val"] = round(perplexity(model, tasks.general_text(tokenizer, "val")["input_ids"]), 2)
    ioi = tasks.load_task("ioi", tokenizer, "test", n=n, seed=seed)
    base, drop = ioi_head_ablation(model, ioi, os.path.join(out_dir, "ioi_head_ablation.png"))
    card["ioi_head_ablation"] = dict(clean_logit_diff=round(base, 4),
                                    drop=[[round(v, 3) for v in r] for r in drop.tolist()])
    return card


def render(card, info):
    L = ["# condense organism\n",
         "A small GPT-2 trained from scratch by `python -m condense.organism --recipe "
         "recipes/organism.yaml` so that condense can be developed and tested without "
         "downloading weights. Every number below was measured by "
         f"`python -m condense.organism_card {info.get('path', 'checkpoints/organism')}` on "
         f"{card['rows']} test prompts per task (plain `transformers` inference, metric at the "
         "last position).\n",
         f"- parameters: {card['parameters']:,}",
         f"- training: {info.get('steps', '?')} steps, {info.get('train_seconds', 0) / 60:.1f} "
         f"min on {info.get('threads', '?')} CPU thread(s) (wall clock, `training.json`)",
         f"- held-out general-text perplexity (pydoc topics, test part): {card['ppl_test']}"
         f" (val part: {card['ppl_val']})\n",
         "| task | accuracy (clean) | LD clean | top-1 clean | accuracy (corrupted) | LD corrupted | passes |",
         "|---|---|---|---|---|---|---|"]
    for name, e in card["tasks"].items():
        L.append(f"| {name} | {e['accuracy_clean']:.3f} | {e['logit_diff_clean']:.2f} | "
                 f"{e['top1_clean']:.3f} | {e['accuracy_corrupted']:.3f} | "
                 f"{e['logit_diff_corrupted']:.2f} | {'yes' if e['passes'] else 'no'} |")
    ioi = card["tasks"]["ioi"]
    L += ["", f"IOI on the {ioi['heldout_templates_rows']} test prompts from templates never "
          f"seen in training: accuracy {ioi['heldout_templates_accuracy']:.3f}.", "",
          "'passes': clean accuracy at least 0.9 (ioi, induction, agreement) or 0.8 "
          "(docstring, acronym, greater_than), and corrupted LD at most half of clean LD.", "",
          "## Where IOI lives", "",
          "Drop of the IOI logit difference when one head's output is replaced by its mean "
          "over all positions of the test prompts:", "", "![](ioi_head_ablation.png)", ""]
    return "\n".join(L)


def write_card(path, n=500, seed=0, out=None):
    t0 = time.time()
    out = out or path
    os.makedirs(out, exist_ok=True)
    card = dict(measure(path, out, n=n, seed=seed), rows=n)
    info = dict(path=path)
    tj = os.path.join(path, "training.json")
    if os.path.exists(tj):
        with open(tj) as f:
            t = json.load(f)
        info.update(steps=sum(ph.get("steps", 0) for ph in t["recipe"]["phases"]), threads=t["recipe"]["threads"],
                    train_seconds=t["train_seconds"])
    card["training"] = {k: v for k, v in info.items() if k != "path"}
    with open(os.path.join(out, "card.json"), "w") as f:
        json.dump(card, f, indent=1)
    text = render(card, info)
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(text)
    print(text)
    print(f"(card measured in {time.time() - t0:.0f}s)")
    return card


def main(argv=None):
    ap = argparse.ArgumentParser(description="Measure the organism and write its model card.")
    ap.add_argument("path", nargs="?", default="checkpoints/organism")
    ap.add_argument("--n", type=int, default=500, help="test prompts per task")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="report folder (default: the checkpoint)")
    args = ap.parse_args(argv)
    write_card(args.path, n=args.n, seed=args.seed, out=args.out)


if __name__ == "__main__":
    main()
