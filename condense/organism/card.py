"""The organism's model card: measured behaviour on the test splits, held-out perplexity,
and where IOI lives (logit-difference drop when each head is mean-ablated).

    python -m condense.organism.card checkpoints/organism [--n 500] [--out DIR]

Prints the report and writes `README.md`, `card.json` and `ioi_head_ablation.png` into
`--out` (default: the checkpoint folder itself, which is how the shipped card was made). Runs plain `transformers` inference only, no condense graph.

The measurements are `condense.card`'s (the card of any model); this module adds the
organism's own text and its training information from `training.json`.
"""
import argparse
import os
import time

from ..artifacts import read_json
from ..card import (ACCURACY_BAR, save_card, head_means, head_means_ablated,  # noqa: F401
                   ioi_head_ablation, resume_file)
from ..card import measure as _measure
from ..models import load_model, load_tokenizer


def measure(path, out_dir, n=500, seed=0):
    """The organism card's numbers (every IOI test row in the head ablation). Saved as they
    are measured into the card folder, so that an interrupted card goes on (condense.card)."""
    model = load_model(path)
    _, memo, save = resume_file(out_dir, path, model, n=n, seed=seed, card="organism")
    return _measure(model, load_tokenizer(path), out_dir, n=n, seed=seed, memo=memo, on_update=save)


def render(card, info):
    L = ["# condense organism\n",
         "A small GPT-2 trained from scratch by `condense organism --recipe "
         "recipes/organism.yaml` so that condense can be developed and tested without "
         "downloading weights. Every number below was measured by "
         f"`python -m condense.organism.card {info.get('path', 'checkpoints/organism')}` on "
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
        t = read_json(tj)
        info.update(steps=sum(ph.get("steps", 0) for ph in t["recipe"]["phases"]), threads=t["recipe"]["threads"],
                    train_seconds=t["train_seconds"])
    card["training"] = {k: v for k, v in info.items() if k != "path"}
    return save_card(out, card, render(card, info), t0)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Measure the organism and write its model card.")
    ap.add_argument("path", nargs="?", default="checkpoints/organism",
                    help="the organism's checkpoint folder (default: checkpoints/organism)")
    ap.add_argument("--n", type=int, default=500, help="test prompts per task")
    ap.add_argument("--seed", type=int, default=0, help="seed of the task rows")
    ap.add_argument("--out", default=None, help="report folder (default: the checkpoint)")
    args = ap.parse_args(argv)
    write_card(args.path, n=args.n, seed=args.seed, out=args.out)


if __name__ == "__main__":
    main()
