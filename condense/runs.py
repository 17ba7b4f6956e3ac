"""Runs: one place that sets a run up, writes it, and reads a run folder back.

- `load_config(recipe, overrides)`: the checked config of the recipe's method, output folder
  resolved (`checkpoints/<method>_<model>_<task>` unless the recipe names one);
- `run(cfg)`: the accelerate wrapper every method runs in: threads, seed, wandb, the resolved
  `recipe.yaml` (first line: the command), the method on the main process or, for data
  parallel methods, on every process;
- `open_run(cfg, ...)`: the RunContext a method works from: device, model (frozen), tokenizer,
  task rows of every split, the graph and, for mean ablation, the sender means;
- `save_run(ctx, metrics, circuit)`: circuit.json, circuit.png, then metrics.json last (its
  presence means the run finished); main process only;
- `read_run(folder)`: a finished run's config, circuit and adapter, shared by verify and
  explain; `log(msg)`: the one logger (main process only).
CPU threads follow condense.runtime's policy unless the recipe sets `threads`; the run writes
what it used to `runtime.json`.
"""
import dataclasses
import os
from dataclasses import dataclass
from typing import Any, Optional

import torch

from condense import tasks
from condense.artifacts import atomic_write, write_json
from condense.config import RunConfig, read_recipe, to_yaml
from condense.graph import Graph
from condense.models import load_model, load_tokenizer, model_tag
from condense.optimize import world
from condense.runtime import apply_thread_policy

SPLITS = ("train", "val", "test")


def log(msg: str) -> None:
    """Print `msg` once (on the main process), prefixed with [condense]."""
    if world()[0] == 0:
        print(f"[condense] {msg}", flush=True)


def default_output_dir(cfg: RunConfig) -> str:
    return os.path.join("checkpoints", f"{cfg.method}_{model_tag(cfg.model)}_{cfg.task}")


def load_config(recipe: str, overrides=()) -> RunConfig:
    """The checked config of `recipe` with `key=value` overrides, output_dir resolved."""
    from condense.methods import config_from
    cfg = config_from(read_recipe(recipe, overrides), where=str(recipe))
    if cfg.output_dir is None:
        cfg.output_dir = default_output_dir(cfg)
    return cfg


# ---------------------------------------------------------------- the context of a run
@dataclass
class RunContext:
    """What a method runs on: its config, the accelerator, the output folder, the frozen
    model on its device with the tokenizer, the task rows of every split, the graph of the
    model and, under mean ablation, the sender means over the train prompts."""
    cfg: RunConfig
    accelerator: Any
    out: str
    device: torch.device
    model: Any
    tokenizer: Any
    rows: dict
    graph: Graph
    means: Any = None

    @property
    def is_main(self) -> bool:
        return self.accelerator is None or self.accelerator.is_main_process

    def path(self, name: str) -> str:
        return os.path.join(self.out, name)


def open_run(cfg: RunConfig, accelerator=None, out: Optional[str] = None) -> RunContext:
    """Load everything a run of `cfg` needs (see RunContext); the model's weights are frozen."""
    from condense.patching import compute_means
    device = torch.device(cfg.device) if cfg.device else (
        accelerator.device if accelerator is not None else torch.device("cpu"))
    model = load_model(cfg.model, dtype=cfg.dtype, device=device)
    for p in model.parameters():
        p.requires_grad_(False)
    runtime = apply_thread_policy(cfg.threads, model, processes=world()[1])
    if accelerator is None or accelerator.is_main_process:
        os.makedirs(out or cfg.output_dir, exist_ok=True)
        write_json(os.path.join(out or cfg.output_dir, "runtime.json"), dict(runtime, device=str(device)))
    tokenizer = load_tokenizer(cfg.tokenizer or cfg.model)
    sizes = dict(train=cfg.n_train, val=cfg.n_val, test=cfg.n_test)
    rows = {split: tasks.load_task(cfg.task, tokenizer, split, n=sizes[split], seed=cfg.seed)
            for split in SPLITS}
    graph = Graph.from_model(model)
    means = None
    if cfg.intervention == "mean":  # what a removed edge carries: means over the ranking data
        means = compute_means(model, graph, rows["train"]["clean_ids"], batch_size=cfg.batch_size)
    log(f"{cfg.method} on {cfg.task}: {', '.join(f'{len(rows[s])} {s}' for s in SPLITS)} rows; "
        f"{cfg.model} on {device}, {graph.n_edges:,} edges; {runtime['threads']} thread(s) "
        f"({runtime['why']})")
    return RunContext(cfg, accelerator, out or cfg.output_dir, device, model, tokenizer, rows,
                      graph, means)


def save_run(ctx: RunContext, metrics: dict, circuit: Optional[Graph] = None) -> dict:
    """circuit.json and circuit.png (when given), then metrics.json; main process only."""
    if not ctx.is_main:
        return metrics
    if circuit is not None:
        circuit.to_json(ctx.path("circuit.json"))
        circuit.to_image(ctx.path("circuit.png"))
    write_json(ctx.path("metrics.json"), metrics)
    return metrics


# ---------------------------------------------------------------- running a config
def _scalars(metrics):
    return {k: v for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def recipe_text(cfg: RunConfig) -> str:
    """The resolved recipe, first line the command that reruns (and resumes) it."""
    path = os.path.join(cfg.output_dir, "recipe.yaml")
    return f"# condense run --recipe {path}\n" + to_yaml(cfg)


def run(cfg: RunConfig) -> Optional[dict]:
    """Run checked config `cfg` and return its metrics (None on non-main processes)."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    from condense.methods import get

    method = get(cfg.method)
    wandb = cfg.report_to == "wandb"
    accelerator = Accelerator(cpu=cfg.device == "cpu", log_with="wandb" if wandb else None)
    set_seed(cfg.seed)
    out = cfg.output_dir
    if wandb:  # offline by default: our machines have no network, and a run must not hang
        accelerator.init_trackers(cfg.wandb_project, config=dataclasses.asdict(cfg), init_kwargs={
            "wandb": dict(mode=os.environ.get("WANDB_MODE", "offline"), dir=out,
                          name=os.path.basename(os.path.normpath(out)))})
    if accelerator.is_main_process:
        os.makedirs(out, exist_ok=True)
        atomic_write(os.path.join(out, "recipe.yaml"), recipe_text(cfg))
    accelerator.wait_for_everyone()
    metrics = None
    if method.data_parallel or accelerator.is_main_process:
        metrics = method.run(open_run(cfg, accelerator, out))
    if accelerator.is_main_process:
        if wandb:
            accelerator.log(_scalars(metrics))
        log(f"wrote {out}/")
    else:
        metrics = None
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return metrics


# ---------------------------------------------------------------- reading a run folder
@dataclass
class RunFolder:
    """A finished run: its folder, config (its method's, from recipe.yaml), circuit.json and
    whether it holds a PEFT adapter."""
    path: str
    config: RunConfig
    circuit_path: str
    adapter: bool

    def load_model(self, model: Optional[str] = None, device=None, dtype=None, threads=None):
        """(the base model with the run's adapter when it has one, tokenizer, device); CPU
        threads by condense.runtime's policy unless `threads` is given."""
        cfg = self.config
        model = model or cfg.model
        device = device or cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
        net = load_model(model, dtype=dtype or cfg.dtype, device=device)
        apply_thread_policy(threads, net)
        if self.adapter:
            from peft import PeftModel
            net = PeftModel.from_pretrained(net, self.path).eval()
        return net, load_tokenizer(cfg.tokenizer or model), device

    def circuit(self, model) -> Graph:
        return Graph.from_json(self.circuit_path, model)


def read_run(path: str, what: str = "read") -> RunFolder:
    """The run in folder `path`: recipe.yaml parsed into its method's config (keys of other
    methods, which runs wrote before configs were split, are ignored)."""
    from condense.methods import config_from
    circuit = os.path.join(path, "circuit.json")
    if not os.path.exists(circuit):
        raise FileNotFoundError(f"{path}: no circuit.json to {what}")
    recipe = os.path.join(path, "recipe.yaml")
    data = read_recipe(recipe) if os.path.exists(recipe) else {}
    data.pop("output_dir", None)
    cfg = config_from(data, where=recipe, lenient=True)
    cfg.output_dir = path
    return RunFolder(path, cfg, circuit, os.path.exists(os.path.join(path, "adapter_config.json")))
