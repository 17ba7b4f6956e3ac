"""Does a sharper (or softer) distillation target, heal rows from more templates, or a larger
adapter buy top-1 agreement? The final heal of a condensed circuit redone from a fresh adapter
at several `heal_temperature`s, on several sets of heal rows and with several adapters.

    HF_HUB_OFFLINE=1 python benchmarks/heal_objective.py [--task ioi] [--circuit PATH]
        [--temperatures 1,0.5,0.25] [--heal-rows task,novel,reserved] [--extra-fraction 0.5]
        [--adapters recipe,64:recipe,16:all] [--heal-seeds 0,1,2] [--steps N] [--rows N]
        [--threads 1] [--json PATH]

The recipe is recipes/condense/smollm2_<task>.yaml and the circuit the shipped C1
(checkpoints/condense_smollm2_<task>/circuit.json) unless `--circuit` names another. For each
set of heal rows, adapter, temperature and heal seed: a fresh adapter (the same seed gives the
same start every time), then condense.methods.condensation.healing.heal itself for the recipe's
final heal (its `final_heal_steps` on `final_heal_rows` train rows, no early stop; the
general-text and corrupted-prompt terms as the recipe sets them, the same batches for the same
seed),
then the loop's own test metrics against the original (accuracy, KL, top-1 agreement, by
template where the task has both) and the general-text perplexity ratio. Temperature 1 is the
recipe's loss; below 1 both distributions are sharpened before the KL, which weights which
token is on top over the rest of the vocabulary, the thing top-1 agreement counts; above 1
they are softened, which weights the rest.

Adapters (`--adapters`): `recipe` is the recipe's LoRA (rank 16, alpha 32, on the modules that
write to the residual stream); `R:recipe` the same modules at rank R, `R:all` every linear
module of each block (the recipe key `lora_targets: all-linear`: attention's q, k, v, o and
the MLP's gate, up, down on Llama-style models), alpha always 2R so that the update's scale
is the recipe's. More capacity asks whether the adapter, not the data or the objective, is
what limits agreement.

Heal seeds (`--heal-seeds`): the seed of the fresh adapter's initialisation and of the heal's
batch order, the recipe's seed by default. The rows, the circuit and the test stay the
recipe's, so the spread over heal seeds is the noise every comparison above has to beat.

Heal rows (IOI only beyond `task`), all from the train split, so no prompt is a test prompt:
- `task`: the recipe's, the task's first `final_heal_rows` train rows (15 IOI templates);
- `novel`: the same number of rows, a fraction `--extra-fraction` of them drawn instead from
  NOVEL_IOI_TEMPLATES below, written for this benchmark and used nowhere else (more template
  variety than training saw, none of it the test's);
- `reserved`: the same, the extra rows drawn from the four templates IOI reserves for its test
  split. An oracle, not a recipe: it says how much agreement on those templates heal data that
  has seen them could buy, the ceiling for any template variety.
"""
import argparse
import dataclasses
import itertools
import os
import time

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
HEAL_ROWS = ("task", "novel", "reserved")
ADAPTER_MODULES = ("recipe", "all")
# IOI templates that appear in no split of the task: each names two people ({A}, {B}), then
# the subject again ({S}) giving or doing something to the other, whose name comes next
NOVEL_IOI_TEMPLATES = [
    "{A} and {B} were sitting in the {PLACE}. {S} lent a {OBJECT} to",
    "During the party at the {PLACE}, {A} and {B} talked, and {S} gave a {OBJECT} to",
    "Before {A} and {B} left the {PLACE}, {S} returned the {OBJECT} to",
    "In the morning, {A} and {B} drove to the {PLACE}. {S} sold a {OBJECT} to",
    "{A} and {B} spent the day at the {PLACE}. In the end, {S} gave the {OBJECT} to",
    "It was late when {A} and {B} came back from the {PLACE}, and {S} gave a {OBJECT} to",
    "At noon {A} and {B} ate at the {PLACE}. Afterwards {S} brought the {OBJECT} to",
    "{A} and {B} argued at the {PLACE} until {S} gave a {OBJECT} to",
    "As {A} and {B} waited outside the {PLACE}, {S} lent the {OBJECT} to",
    "Both {A} and {B} liked the {PLACE}, but only {S} gave a {OBJECT} to",
    "{A} and {B} had a quiet dinner, and then {S} wrote a letter to",
    "After a long walk, {A} and {B} rested, and {S} smiled at",
]


def _temperatures(value: str) -> list:
    ts = [float(x) for x in value.split(",")]
    if any(t <= 0 for t in ts):
        raise argparse.ArgumentTypeError(f"temperatures must be above 0: {value}")
    return ts


def _kinds(value: str) -> list:
    kinds = value.split(",")
    bad = [k for k in kinds if k not in HEAL_ROWS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown heal rows {bad}; allowed: {', '.join(HEAL_ROWS)}")
    return kinds


def _fraction(value: str) -> float:
    f = float(value)
    if not 0 < f < 1:
        raise argparse.ArgumentTypeError(f"--extra-fraction must lie strictly between 0 and 1: {value}")
    return f


def _adapters(value: str) -> list:
    """`recipe` or RANK:MODULES items -> (rank or None, modules); None is the recipe's rank."""
    specs = []
    for item in value.split(","):
        if item == "recipe":
            specs.append((None, "recipe"))
            continue
        rank, _, modules = item.partition(":")
        if not rank.isdigit() or int(rank) < 1 or modules not in ADAPTER_MODULES:
            raise argparse.ArgumentTypeError(
                f"bad adapter {item!r}: give recipe or RANK:MODULES, RANK a positive integer and "
                f"MODULES one of {', '.join(ADAPTER_MODULES)}")
        specs.append((int(rank), modules))
    return specs


def _seeds(value: str) -> list:
    try:
        seeds = [int(x) for x in value.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"heal seeds must be integers: {value}") from None
    if any(s < 0 for s in seeds):
        raise argparse.ArgumentTypeError(f"heal seeds must not be negative: {value}")
    return seeds


def adapter_config(cfg, rank, modules: str):
    """The recipe's config with the adapter `rank` (None: the recipe's) on `modules`."""
    if rank is None and modules == "recipe":
        return cfg
    from condense.methods.condensation.config import ALL_LINEAR
    rank = rank or cfg.lora_rank
    targets = ALL_LINEAR if modules == "all" else cfg.lora_targets  # PEFT resolves it per family
    return dataclasses.replace(cfg, lora_rank=rank, lora_alpha=2 * rank, lora_targets=targets)


def heal_rows(kind: str, task: str, tok, n: int, seed: int, fraction: float):
    """The `n` train rows a heal trains on: the task's own, or (`novel`, `reserved`) those with
    a `fraction` of them drawn from other IOI templates (the module docstring; load_task
    refuses templates for any task but IOI, and main() refuses it before the model loads)."""
    from datasets import concatenate_datasets

    from condense import tasks
    if kind == "task":
        return tasks.load_task(task, tok, "train", n=n, seed=seed)
    extra = round(n * fraction)
    templates = (NOVEL_IOI_TEMPLATES if kind == "novel"
                 else tasks.IOI_TEMPLATES[-tasks.IOI_HELDOUT:])
    own = tasks.load_task(task, tok, "train", n=n - extra, seed=seed)
    other = tasks.load_task(task, tok, "train", n=extra, seed=seed, templates=templates)
    return concatenate_datasets([own, other])


def main(argv=None):
    recipes = sorted(f[len("smollm2_"):-len(".yaml")]
                     for f in os.listdir(os.path.join(ROOT, "recipes", "condense"))
                     if f.startswith("smollm2_") and f.endswith(".yaml"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--task", default="ioi", choices=recipes,
                    help="a task with a recipes/condense/smollm2_<task>.yaml")
    ap.add_argument("--circuit", default=None,
                    help="circuit.json to heal (default: the shipped C1 of the task)")
    ap.add_argument("--temperatures", type=_temperatures, default=[1.0, 0.5, 0.25],
                    help="comma-separated heal_temperature values, each above 0")
    ap.add_argument("--heal-rows", type=_kinds, default=["task"],
                    help=f"comma-separated sets of heal rows, of {', '.join(HEAL_ROWS)} (docstring)")
    ap.add_argument("--extra-fraction", type=_fraction, default=0.5,
                    help="the share of novel or reserved-template rows in those sets")
    ap.add_argument("--adapters", type=_adapters, default=[(None, "recipe")],
                    help="comma-separated adapters: recipe, or RANK:recipe / RANK:all (docstring)")
    ap.add_argument("--heal-seeds", type=_seeds, default=None,
                    help="comma-separated seeds of the adapter's init and batch order "
                         "(default: the recipe's seed)")
    ap.add_argument("--steps", type=int, default=None, help="default: the recipe's final_heal_steps")
    ap.add_argument("--rows", type=int, default=None, help="default: the recipe's final_heal_rows")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--json", default=None, help="also write the results here as JSON (after every heal)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from condense import tasks
    from condense.artifacts import command_line, write_json
    from condense.evaluate import reference_outputs
    from condense.graph import Graph
    from condense.methods.condensation import healing
    from condense.methods.condensation.gate import circuit_metrics, template_split_metrics
    from condense.metrics import perplexity
    from condense.models import load_model, load_tokenizer
    from condense.runs import load_config

    cfg = load_config(os.path.join(ROOT, "recipes", "condense", f"smollm2_{args.task}.yaml"), [])
    steps = args.steps if args.steps is not None else cfg.final_heal_steps
    n_rows = args.rows or cfg.final_heal_rows or cfg.n_train
    cfg = dataclasses.replace(cfg, heal_steps=steps, heal_stop_loss=0.0)
    circuit_file = args.circuit or os.path.join(ROOT, "checkpoints", f"condense_smollm2_{args.task}",
                                                "circuit.json")
    if not os.path.exists(circuit_file):
        raise SystemExit(f"no circuit {circuit_file}: name one with --circuit")
    if args.heal_rows != ["task"] and cfg.task != "ioi":
        raise SystemExit("--heal-rows novel and reserved are for --task ioi only")
    tok = load_tokenizer(cfg.model)
    model = load_model(cfg.model)
    circuit = Graph.from_json(circuit_file, model)
    full = Graph.from_model(model)
    test = tasks.load_task(cfg.task, tok, "test", n=cfg.n_test, seed=cfg.seed)
    blocks = list(tasks.general_text(tok, "train")["input_ids"])
    val_blocks = list(tasks.general_text(tok, "val")["input_ids"])[:cfg.n_general]
    test_ref = reference_outputs(model, full, test, cfg.intervention, cfg.batch_size)
    ppl_original = perplexity(model, val_blocks, cfg.batch_size)
    results = dict(command=command_line("benchmarks/heal_objective.py", argv, env="HF_HUB_OFFLINE=1"),
                   task=cfg.task, circuit=os.path.relpath(circuit_file, ROOT),
                   edges=circuit.count_edges(on_path=True), steps=steps, rows=n_rows,
                   extra_fraction=args.extra_fraction, threads=args.threads, heals=[])
    if "novel" in args.heal_rows:
        results["novel_templates"] = NOVEL_IOI_TEMPLATES
    print(f"{cfg.task}: {results['edges']}-edge circuit, {steps} heal steps on {n_rows} rows, "
          f"from a fresh adapter each time", flush=True)
    for kind in args.heal_rows:
        rows = heal_rows(kind, cfg.task, tok, n_rows, cfg.seed, args.extra_fraction)
        target = healing.last_logprobs(model, rows, cfg.batch_size)
        corrupted = (healing.last_logprobs(model, rows, cfg.batch_size, "corrupted_ids")
                     if cfg.heal_corrupted_weight > 0 else None)
        for (rank, modules), t, seed in itertools.product(args.adapters, args.temperatures,
                                                          args.heal_seeds or [cfg.seed]):
            run_cfg = dataclasses.replace(adapter_config(cfg, rank, modules), heal_temperature=t,
                                          seed=seed)
            peft_model = healing.add_adapter(model, run_cfg)  # same seed: the same fresh adapter
            adapter = dict(lora_rank=run_cfg.lora_rank, lora_alpha=run_cfg.lora_alpha,
                           lora_targets=healing.adapted_modules(peft_model),
                           adapter_parameters=sum(
                               v.numel() for v in healing.adapter_state(peft_model).values()))
            t0 = time.perf_counter()
            losses = healing.heal(peft_model, circuit, rows, target, run_cfg, 1,
                                  general_blocks=blocks, corrupted_logp=corrupted,
                                  desc=f"heal on {kind} rows at temperature {t}, "
                                       f"rank {run_cfg.lora_rank} on {modules}, seed {seed}")
            seconds = time.perf_counter() - t0
            m = circuit_metrics(peft_model, circuit, test, test_ref, run_cfg)
            m.update(template_split_metrics(peft_model, circuit, test, test_ref, run_cfg))
            ppl = perplexity(peft_model, val_blocks, cfg.batch_size)
            record = dict(heal_rows=kind, temperature=t, heal_seed=seed, adapter=modules, **adapter,
                          heal_seconds=seconds, last_loss=losses[-1],
                          accuracy=m["accuracy"], accuracy_original=m["accuracy_full"], kl=m["kl"],
                          top1_agreement=m["top1_agreement"], faithfulness=m["faithfulness"],
                          ppl_ratio=ppl / ppl_original,
                          **{k: v for k, v in m.items() if k.endswith("_templates")})
            results["heals"].append(record)
            print(f"{kind} rows, temperature {t}, rank {run_cfg.lora_rank} on {modules}, "
                  f"seed {seed}: test accuracy {record['accuracy']:.3f} (original "
                  f"{record['accuracy_original']:.3f}), KL {record['kl']:.4f}, top-1 agreement "
                  f"{record['top1_agreement']:.3f}"
                  + "".join(f", {k.replace('top1_agreement_', '').replace('_', ' ')} {v:.3f}"
                            for k, v in record.items() if k.startswith("top1_agreement_"))
                  + f", ppl ratio {record['ppl_ratio']:.4f}, f {record['faithfulness']:.3f}; "
                  f"heal {seconds:.0f} s", flush=True)
            model = peft_model.unload()
            if args.json:  # after every heal, so that a stopped run keeps what it measured
                write_json(args.json, results)
    return results


if __name__ == "__main__":
    main()
