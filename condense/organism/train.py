"""Train the model organism: a small GPT-2 that shows the six task behaviours.

    python -m condense.organism --recipe recipes/organism.yaml [key=value ...]

One script, nanoGPT style: build a byte-level BPE tokenizer in which every task word is
one token, then train from scratch on the task train splits plus general text, one example
per row (packing examples together stopped in-context copying from forming), and write a
Hugging Face checkpoint with its model card (`condense.organism.card`). Interrupted, the
same command goes on from its last save (`state/organism.pt`, at most a minute old).
"""
import argparse
import dataclasses
import json
import math
import os
import random
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from .. import tasks
from ..artifacts import atomic_write
from ..config import RecipeError, from_dict, load_recipe, to_yaml
from ..metrics import pad_batch, task_scores
from ..optimize import FitState
from ..tasks import words as W

# GPT-2's split rule with two changes: a capital followed by a capital stands alone (an
# acronym "(CPU" is one letter a token) and digits come in pairs ("1732" -> "17" "32").
PRETOKENIZE = (r"""'(?:[sdmt]|ll|ve|re)| ?\p{Lu}(?=\p{Lu})| ?\p{L}+| ?\p{N}{1,2}"""
               r"""| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
EOS = "<|endoftext|>"


@dataclass
class OrganismConfig:
    output_dir: str = field(default="checkpoints/organism", metadata={"help": "where the model goes"})
    seed: int = field(default=0, metadata={"help": "seed for weights and data"})
    threads: int = field(default=2, metadata={"help": "torch CPU threads"})
    vocab_size: int = field(default=4096, metadata={"help": "BPE vocabulary size"})
    n_layer: int = field(default=4, metadata={"help": "transformer blocks"})
    n_head: int = field(default=4, metadata={"help": "attention heads per block"})
    n_embd: int = field(default=128, metadata={"help": "residual stream width"})
    n_positions: int = field(default=128, metadata={"help": "context length"})
    phases: list = field(default_factory=lambda: [dict(steps=3000)], metadata={
        "help": "training phases, run in order; each a mapping of Phase fields"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    eval_every: int = field(default=250, metadata={"help": "steps between validation reports"})
    eval_rows: int = field(default=200, metadata={"help": "validation rows per task"})
    card_rows: int = field(default=500, metadata={"help": "test rows per task for the card"})


@dataclass
class Phase:
    """One stretch of training: its own data mix and learning-rate schedule. Copying
    behaviours pull the learning rate apart (in the organism's training trials induction formed
    at 1e-3 and IOI needed 3e-3), so the organism recipe trains in phases."""
    steps: int = field(default=1000, metadata={"help": "optimizer steps in this phase"})
    lr: float = field(default=3e-3, metadata={"help": "peak learning rate (AdamW)"})
    warmup: int = field(default=100, metadata={"help": "linear warmup steps"})
    min_lr_ratio: float = field(default=0.1, metadata={"help": "cosine decays to lr * this"})
    rows: dict = field(default_factory=lambda: dict(
        ioi=32, induction=16, agreement=8, docstring=16, acronym=12, greater_than=12),
        metadata={"help": "task rows per step (one example per row)"})
    general_rows: int = field(default=8, metadata={"help": "general-text rows per step"})
    general_weight: float = field(default=1.0, metadata={"help": "loss weight of general text"})


def build_tokenizer(cfg, samples_per_task=3000):
    """Byte-level BPE trained on general text plus task text, so that names, places,
    argument words, nouns and two-digit numbers all end up single tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    corpus = [t for title, t in tasks.general_documents()
              if tasks.general_split_of(title) == "train"]
    for name in tasks.TASKS:
        stream = tasks.iter_samples(name, None, "train", seed=cfg.seed)
        corpus += [next(stream).train_text for _ in range(samples_per_task)]
    task_words = (W.NAMES + W.PLACES + W.OBJECTS + [w for p in W.NOUN_PAIRS for w in p]
                  + [w for p in W.VERB_PAIRS for w in p] + W.ARG_WORDS + W.ACRONYM_WORDS
                  + W.COMMON_WORDS + W.GT_NOUNS + W.FUNCTION_NAMES)
    corpus += ["".join(" " + w for w in task_words)] * 100
    corpus += ["".join(f" {c}{i:02d}" for i in range(100)) for c in range(10, 21)] * 20
    trainer = trainers.BpeTrainer(vocab_size=cfg.vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS,
                                   unk_token=EOS, pad_token=EOS)
    missing = [w for w in task_words if len(fast.encode(" " + w)) != 1]
    missing += [f"{i:02d}" for i in range(100) if len(fast.encode(f"{i:02d}")) != 1]
    if missing:
        raise RuntimeError(f"tokenizer splits task words {missing[:20]}: raise vocab_size")
    return fast


def encode_sample(tokenizer, sample):
    """Token ids of `sample.train_text` and (position, weight) pairs of tokens that carry
    loss: those lying inside one of the sample's target character spans."""
    enc = tokenizer(sample.train_text, return_offsets_mapping=True, add_special_tokens=False)
    targets = []
    for i, (a, b) in enumerate(enc["offset_mapping"]):
        for s, e, w in sample.targets:
            if i > 0 and s <= a and b <= e and b > a:
                targets.append((i, w))
    return enc["input_ids"], targets


def task_loss(model, batch):
    """Weighted cross-entropy at the target tokens of a batch of (ids, targets)."""
    ids, _, _ = pad_batch([b[0] for b in batch])
    rows, pos, weights = [], [], []
    for r, (_, targets) in enumerate(batch):
        for p, w in targets:
            rows.append(r), pos.append(p), weights.append(w)
    rows, pos = torch.tensor(rows), torch.tensor(pos)
    hidden = model.transformer(input_ids=ids).last_hidden_state
    logits = model.lm_head(hidden[rows, pos - 1])  # only where there is a loss
    loss = F.cross_entropy(logits, ids[rows, pos], reduction="none")
    weights = torch.tensor(weights)
    return (loss * weights).sum() / weights.sum()


def general_batch(ids, rows, length, rng):
    starts = [rng.randrange(len(ids) - length) for _ in range(rows)]
    return torch.tensor([ids[s:s + length] for s in starts])


def lr_at(step, ph):
    """Linear warmup, then cosine decay to lr * min_lr_ratio, within one phase."""
    if step < ph.warmup:
        return ph.lr * (step + 1) / ph.warmup
    t = (step - ph.warmup) / max(1, ph.steps - ph.warmup)
    return ph.lr * (ph.min_lr_ratio + (1 - ph.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def phases_of(cfg):
    phases = [from_dict(Phase, p, where=f"phases[{i}]") for i, p in enumerate(cfg.phases)]
    for ph in phases:
        bad = [k for k in ph.rows if k not in tasks.TASKS]
        if bad:
            raise RecipeError(f"phases: unknown task {bad[0]!r}; tasks: {', '.join(tasks.TASKS)}")
    return phases


def validate(model, val_sets):
    model.eval()
    out = {name: round(task_scores(model, rows)["clean"]["accuracy"], 3)
           for name, rows in val_sets.items()}
    model.train()
    return out


STATE_FILE = os.path.join("state", "organism.pt")  # in output_dir until model and card are written
SAVE_EVERY = 60.0  # seconds between saves of the training (weights, AdamW, draws, log)


def _training_state(cfg, drawn: dict, log: list, python_rng: list):
    """The shared loop's FitState for the organism's own loop: weights, AdamW's moments, the
    step reached and torch's generator, plus, in place as its logs, how many samples each task
    stream has given, the validation log and the state of the Python generator that draws the
    general-text batches. The task streams are endless and seeded, so a rerun draws and drops as
    many samples again and takes the steps an uninterrupted run takes. Named by the recipe (all
    but the output folder, threads and card rows)."""
    recipe = {k: v for k, v in dataclasses.asdict(cfg).items()
              if k not in ("output_dir", "threads", "card_rows")}
    return FitState(os.path.join(cfg.output_dir, STATE_FILE), every=SAVE_EVERY,
                    logs=dict(drawn=drawn, log=log, python_rng=python_rng),
                    what=f"organism {sorted(recipe.items())!r}")


def train(cfg):
    phases = phases_of(cfg)  # fail on a bad phase before any work
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    t0 = time.time()
    tokenizer = build_tokenizer(cfg)
    print(f"tokenizer: {len(tokenizer)} tokens in {time.time() - t0:.0f}s", flush=True)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=cfg.n_positions,
                        n_embd=cfg.n_embd, n_layer=cfg.n_layer, n_head=cfg.n_head,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id)
    model = GPT2LMHeadModel(config)
    opt = torch.optim.AdamW(model.parameters(), weight_decay=cfg.weight_decay,
                            betas=(0.9, 0.98))
    streams = {name: tasks.iter_samples(name, tokenizer, "train", seed=cfg.seed)
               for name in tasks.TASKS}
    general_ids = sum(tasks.general_text(tokenizer, "train", cfg.n_positions)["input_ids"], [])
    val_sets = {name: tasks.load_task(name, tokenizer, "val", n=cfg.eval_rows, seed=cfg.seed)
                for name in tasks.TASKS}
    drawn, log, python_rng = {name: 0 for name in tasks.TASKS}, [], []
    state = _training_state(cfg, drawn, log, python_rng)
    params, total = list(model.parameters()), sum(ph.steps for ph in phases)
    step, _ = state.load(params, opt, total)
    if step:
        version, internal, gauss = python_rng
        rng.setstate((version, tuple(internal), gauss))
        for name, n in drawn.items():
            for _ in range(n):
                next(streams[name])
        # FitState.load has said where it goes on from (stderr), once for every training
    model.train()
    offset = 0  # steps of the phases before this one
    for p, ph in enumerate(phases):
        for i in range(max(0, step - offset), ph.steps):
            for group in opt.param_groups:
                group["lr"] = lr_at(i, ph)
            losses = {}
            for name, n in ph.rows.items():
                batch = [encode_sample(tokenizer, next(streams[name])) for _ in range(n)]
                drawn[name] += n
                loss = task_loss(model, batch)
                loss.backward()
                losses[name] = loss.item()
            if ph.general_rows:
                ids = general_batch(general_ids, ph.general_rows, cfg.n_positions, rng)
                loss = model(input_ids=ids, labels=ids).loss
                (ph.general_weight * loss).backward()
                losses["general"] = loss.item()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if step % cfg.eval_every == 0 or i + 1 == ph.steps:
                entry = dict(step=step, phase=p, time=round(time.time() - t0 + state.earlier_seconds, 1),
                             loss={k: round(v, 3) for k, v in losses.items()},
                             val_accuracy=validate(model, val_sets))
                log.append(entry)
                print(json.dumps(entry), flush=True)
            version, internal, gauss = rng.getstate()
            python_rng[:] = [version, list(internal), gauss]
            state.save(step, params, opt, [], final=step == total)
        offset += ph.steps
    model.eval()
    return model, tokenizer, dict(train_seconds=time.time() - t0 + state.earlier_seconds, log=log)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="condense organism",
                                 description=__doc__.split("\n\n")[0] + " Interrupted, the same "
                                             "command goes on where it stopped.")
    ap.add_argument("--recipe", default="recipes/organism.yaml", help="the organism's training recipe")
    ap.add_argument("--no-card", action="store_true", help="skip the model card evaluation")
    ap.add_argument("overrides", nargs="*", help="key=value recipe overrides")
    args = ap.parse_args(argv)
    cfg = load_recipe(args.recipe, OrganismConfig, args.overrides)
    phases_of(cfg)
    model, tokenizer, info = train(cfg)
    os.makedirs(cfg.output_dir, exist_ok=True)
    model.save_pretrained(cfg.output_dir)
    tokenizer.save_pretrained(cfg.output_dir)
    atomic_write(os.path.join(cfg.output_dir, "training.json"),
                 json.dumps(dict(recipe=dataclasses.asdict(cfg), **info), indent=1))
    atomic_write(os.path.join(cfg.output_dir, "recipe.yaml"), to_yaml(cfg))
    print(f"saved {cfg.output_dir} after {info['train_seconds']:.0f}s", flush=True)
    if not args.no_card:
        from .card import write_card
        write_card(cfg.output_dir, n=cfg.card_rows, seed=cfg.seed)
    # Only now is nothing left to go on from: a card interrupted before this point reruns
    # from the finished training's last save, with no step left to train.
    state = os.path.join(cfg.output_dir, STATE_FILE)
    if os.path.exists(state):
        os.remove(state)
        if not os.listdir(os.path.dirname(state)):
            os.rmdir(os.path.dirname(state))


if __name__ == "__main__":  # python -m condense.organism.train is `condense organism`
    from condense.cli import module_entry
    module_entry("organism")
