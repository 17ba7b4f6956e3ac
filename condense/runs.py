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
from condense.artifacts import (atomic_write, check_writable, count_nonfinite, damaged, read_json,
                                read_tensors, writing, write_json)
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
    """checkpoints/<method>_<model>[_<quantization>]_<task>: a quantized base gets its own run."""
    tag = model_tag(cfg.model) + (f"_{cfg.quantization}" if cfg.quantization else "")
    return os.path.join("checkpoints", f"{cfg.method}_{tag}_{cfg.task}")


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
    runtime: dict = dataclasses.field(default_factory=dict)  # threads and device (runtime.json)

    @property
    def is_main(self) -> bool:
        return self.accelerator is None or self.accelerator.is_main_process

    def path(self, name: str) -> str:
        return os.path.join(self.out, name)


def open_run(cfg: RunConfig, accelerator=None, out: Optional[str] = None) -> RunContext:
    """Load everything a run of `cfg` needs (see RunContext); the model's weights are frozen."""
    from condense.means import compute_means
    device = torch.device(cfg.device) if cfg.device else (
        accelerator.device if accelerator is not None else torch.device("cpu"))
    model = load_model(cfg.model, dtype=cfg.dtype, device=device, quantization=cfg.quantization)
    for p in model.parameters():
        p.requires_grad_(False)
    runtime = dict(apply_thread_policy(cfg.threads, model, processes=world()[1]), device=str(device))
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
                      graph, means, runtime)


# where a method's training saves itself as it goes (condense.optimize.FitState), where
# S3martCirc keeps each node baseline it has finished, and where a scoring run keeps its scores
# and evaluations, until the run is written
TRAINING_STATE = os.path.join("state", "training.pt")
BASELINES_STATE = os.path.join("state", "baselines.pt")
SCORING_STATE = os.path.join("state", "scoring.pt")


def save_run(ctx: RunContext, metrics: dict, circuit: Optional[Graph] = None) -> dict:
    """circuit.json and circuit.png (when given), then metrics.json; main process only. Then the
    resume files go: the run is written, nothing is left to go on from."""
    if not ctx.is_main:
        return metrics
    if circuit is not None:
        circuit.to_json(ctx.path("circuit.json"))
        circuit.to_image(ctx.path("circuit.png"))
    write_json(ctx.path("metrics.json"), metrics)
    for resume_file in (TRAINING_STATE, BASELINES_STATE, SCORING_STATE):
        if os.path.exists(ctx.path(resume_file)):
            os.remove(ctx.path(resume_file))
    if os.path.isdir(ctx.path("state")) and not os.listdir(ctx.path("state")):
        os.rmdir(ctx.path("state"))  # it held only resume files
    return metrics


# ---------------------------------------------------------------- running a config
def _scalars(metrics):
    return {k: v for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


def recipe_text(cfg: RunConfig) -> str:
    """The resolved recipe, first line the command that reruns (and resumes) it."""
    path = os.path.join(cfg.output_dir, "recipe.yaml")
    return f"# condense run --recipe {path}\n" + to_yaml(cfg)


class FolderInUse(RuntimeError):
    """Another live run writes the output folder."""


_HELD: dict = {}  # lock file -> how many times this process holds it (a lock is re-entrant)


class FolderLock:
    """One writer per folder: `.lock` holds the writer's pid; a lock whose process is gone
    (killed) is taken over. Runs take it on their output folder, and so do verify, explain,
    report and card on the folder they write. Re-entrant within a process (a run refreshing its
    report, verify refreshing the run's), released when the outermost holder releases it.
    Taking it removes the temporary files a killed writer left there (atomic writes rename
    theirs away), since no other writer can be at work. `way_out`: what the refusal suggests."""

    def __init__(self, folder: str, way_out: str = "give this run another output_dir"):
        self.folder, self.way_out = folder, way_out
        self.path = os.path.join(folder, ".lock")
        self.held = False  # by this object (a with block on a held lock takes it no further)

    def acquire(self):
        key = os.path.abspath(self.path)
        if _HELD.get(key):
            _HELD[key] += 1
            self.held = True
            return self
        with writing(self.path):
            self._take()
        _HELD[key] = 1
        self.held = True
        _clean_strays(self.folder)
        return self

    def _take(self):
        os.makedirs(self.folder, exist_ok=True)
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self.refuse_if_held()
                try:  # its writer is gone: take it over
                    os.unlink(self.path)
                except FileNotFoundError:
                    pass
                continue
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
            return
        raise FolderInUse(f"could not lock {self.folder}")

    def refuse_if_held(self) -> None:
        """FolderInUse, naming the holder, when another live process holds the lock."""
        pid = self._holder()
        if pid is not None and pid != os.getpid() and _alive(pid):
            raise FolderInUse(f"{self.folder} is being written by another run (pid {pid}); wait "
                              f"for it, or {self.way_out}")

    def _holder(self):
        try:
            with open(self.path) as f:
                return int(f.read().strip() or 0) or None
        except (OSError, ValueError):
            return None

    def release(self):
        if not self.held:
            return
        self.held = False
        key = os.path.abspath(self.path)
        if _HELD.get(key, 0) > 1:
            _HELD[key] -= 1
            return
        _HELD.pop(key, None)
        if self._holder() == os.getpid():
            os.unlink(self.path)

    def __enter__(self):
        return self if self.held else self.acquire()

    def __exit__(self, *exc):
        self.release()


def open_output(out: str, reads: Optional[str] = None, flag: str = "--out") -> FolderLock:
    """What a command that writes into folder `out` (verify, explain, report, card) does before
    any model loads: refuse a folder it cannot write (CannotWrite, naming `flag`), refuse to
    read run folder `reads` while another process writes it, and take `out`'s lock. Returns
    the lock, held: release it, or use it in a with block."""
    check_writable(out, f"give {flag} DIR to write elsewhere")
    if reads is not None and os.path.abspath(reads) != os.path.abspath(out):
        FolderLock(reads, f"give {flag} another folder").refuse_if_held()
    return FolderLock(out, f"give {flag} another folder").acquire()


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# keys that may differ between runs of one recipe in one folder (where and how, not what); a
# method config adds its own in a `rerun_free` class attribute
RERUN_FREE = ("output_dir", "threads", "device", "report_to", "wandb_project")


def check_folder(cfg: RunConfig) -> None:
    """Before anything is written: the output folder is not a file and, if it holds a run, the
    run is of this recipe (up to RERUN_FREE keys), so that rerunning resumes it instead of
    mixing two runs' files."""
    from condense.config import RecipeError
    from condense.methods import config_from
    out = cfg.output_dir
    if os.path.isfile(out):
        raise RecipeError(f"recipe key 'output_dir': {out} is a file, not a folder")
    path = os.path.join(out, "recipe.yaml")
    if not os.path.exists(path):
        return
    try:
        old = config_from(read_recipe(path, allow_empty=True), where=path, lenient=True)
    except RecipeError:
        old = None
    changed = ["(unreadable recipe.yaml)"] if old is None else [
        f.name for f in dataclasses.fields(cfg)
        if f.name not in RERUN_FREE + tuple(getattr(type(cfg), "rerun_free", ()))
        and getattr(old, f.name, None) != getattr(cfg, f.name)]
    if changed:
        raise RecipeError(f"{out} holds a run of another recipe (differs in {', '.join(changed[:6])}); "
                          f"rerunning the same recipe resumes it; for this one choose another "
                          f"output_dir or remove {out}")


def _clean_strays(out):
    """Temporary files an interrupted write left behind (atomic writes rename them away); only
    the lock's holder calls it, so no other writer is at work."""
    import shutil
    for folder in (out, os.path.join(out, "state")):
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            if name.startswith(".") and name.endswith(".tmp"):
                os.unlink(path)
            elif name.startswith(".adapter-") and os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)


def run(cfg: RunConfig) -> Optional[dict]:
    """Run checked config `cfg` and return its metrics (None on non-main processes). Nothing in
    the output folder changes before the run has started: checks first, then the model, and
    only then the lock, recipe.yaml and runtime.json."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    from condense.methods import get

    method = get(cfg.method)
    check_folder(cfg)
    if method.prepare is not None:
        method.prepare(cfg)
    check_writable(cfg.output_dir, "give the run a folder it can write (output_dir=DIR)")
    wandb = cfg.report_to == "wandb"
    accelerator = Accelerator(cpu=cfg.device == "cpu", log_with="wandb" if wandb else None)
    set_seed(cfg.seed)
    out = cfg.output_dir
    runs_here = method.data_parallel or accelerator.is_main_process
    ctx = open_run(cfg, accelerator, out) if runs_here else None
    lock = FolderLock(out).acquire() if accelerator.is_main_process else None
    try:
        if accelerator.is_main_process:
            atomic_write(os.path.join(out, "recipe.yaml"), recipe_text(cfg))
            write_json(os.path.join(out, "runtime.json"), ctx.runtime)
        if wandb:  # offline by default: our machines have no network, and a run must not hang
            accelerator.init_trackers(cfg.wandb_project, config=dataclasses.asdict(cfg), init_kwargs={
                "wandb": dict(mode=os.environ.get("WANDB_MODE", "offline"), dir=out,
                              name=os.path.basename(os.path.normpath(out)))})
        accelerator.wait_for_everyone()
        metrics = method.run(ctx) if runs_here else None
        if accelerator.is_main_process:
            if wandb:
                accelerator.log(_scalars(metrics))
            from condense.report import refresh_report
            refresh_report(out)
            log(f"wrote {out}/ (open {os.path.join(out, 'report.html')})")
        else:
            metrics = None
        accelerator.wait_for_everyone()
        accelerator.end_training()
    finally:
        if lock is not None:
            lock.release()
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
    circuit_json: Optional[dict] = None  # circuit.json as read_run checked it (read once)

    def load_model(self, model: Optional[str] = None, device=None, dtype=None, threads=None,
                   quantization: Optional[str] = "as run"):
        """(the base model with the run's adapter when it has one, tokenizer, device); CPU
        threads by condense.runtime's policy unless `threads` is given. The base is quantized
        as the run's was unless `quantization` says otherwise (None: full precision)."""
        cfg = self.config
        model = model or cfg.model
        device = device or cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
        quantization = cfg.quantization if quantization == "as run" else quantization
        net = load_model(model, dtype=dtype or cfg.dtype, device=device, quantization=quantization)
        apply_thread_policy(threads, net)
        if self.adapter:
            from peft import PeftModel
            net = PeftModel.from_pretrained(net, self.path).eval()
        return net, load_tokenizer(cfg.tokenizer or model), device

    def circuit(self, model) -> Graph:
        return Graph.from_json(self.circuit_path, model, data=self.circuit_json)

    def means(self, net, graph: Graph, tokenizer, task: Optional[str] = None,
              intervention: Optional[str] = None):
        """What a removed edge carried in this run under mean ablation: the sender means over
        the task's train prompts (the run's rows, seed and batch size, whose summation order
        the means' last bits depend on), as open_run computes them, and for a condensation run
        with the adapter off (the loop's means are the original model's). None when the
        intervention (the run's unless given) is not mean ablation: nothing to carry."""
        from contextlib import nullcontext

        from condense import tasks
        from condense.means import compute_means
        cfg = self.config
        if (intervention or cfg.intervention) != "mean":
            return None
        train = tasks.load_task(task or cfg.task, tokenizer, "train", n=cfg.n_train, seed=cfg.seed)
        original = cfg.method == "condense" and self.adapter
        with net.disable_adapter() if original else nullcontext():
            means = compute_means(net, graph, train["clean_ids"], batch_size=cfg.batch_size)
        bad = count_nonfinite(means)
        if bad:  # a removed edge would carry NaN into every subset: refuse before the work
            raise damaged(self.path, f"the sender means of its model on the task's train rows "
                                     f"hold {bad:,} NaN/Inf values",
                          "check the model's and the adapter's weights (a run must be redone "
                          "on weights that give finite activations)")
        return means


def read_run(path: str, what: str = "read") -> RunFolder:
    """The run in folder `path`: recipe.yaml parsed into its method's config (keys of other
    methods, which runs wrote before configs were split, are ignored)."""
    from condense.methods import config_from
    circuit = os.path.join(path, "circuit.json")
    if not os.path.exists(circuit) and os.path.exists(circuit + ".gz"):
        circuit += ".gz"  # shipped scoring runs keep every edge's score gzipped
    if not os.path.exists(circuit):
        raise FileNotFoundError(f"{path}: no circuit.json to {what}")
    recipe = os.path.join(path, "recipe.yaml")
    data = read_recipe(recipe, allow_empty=True) if os.path.exists(recipe) else {}
    if not isinstance(data, dict):
        raise damaged(recipe, "not a recipe (a YAML mapping of keys)")
    data.pop("output_dir", None)
    cfg = config_from(data, where=recipe, lenient=True)
    cfg.output_dir = path
    # every file the command reads, checked before any model loads: a damaged one fails in one
    # line naming it, not in a traceback minutes later
    from condense.graph import check_circuit_json
    circuit_json = read_json(circuit)
    check_circuit_json(circuit_json, circuit)
    adapter = _adapter_present(path, cfg, what)
    if adapter:
        read_json(os.path.join(path, "adapter_config.json"))
        weights = next(os.path.join(path, f) for f in ADAPTER_WEIGHTS
                       if os.path.exists(os.path.join(path, f)))
        read_tensors(weights)
    return RunFolder(path, cfg, circuit, adapter, circuit_json)


ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")


def _adapter_present(path: str, cfg: RunConfig, what: str) -> bool:
    """Whether the run folder holds a whole PEFT adapter. Half an adapter (config without
    weights or weights without config), or none where the method always saves one
    (condensation), is refused: without it the circuit would be scored on the wrong model."""
    from condense.config import RecipeError
    has_config = os.path.exists(os.path.join(path, "adapter_config.json"))
    has_weights = any(os.path.exists(os.path.join(path, f)) for f in ADAPTER_WEIGHTS)
    if has_config != has_weights:
        present, gone = (("adapter_config.json", "adapter_model.safetensors") if has_config
                         else ("adapter_model.safetensors", "adapter_config.json"))
        raise RecipeError(f"{path}: the adapter is partly missing ({present} without {gone}); "
                          f"refusing to {what} the circuit on a model without its adapter")
    if not has_config and getattr(cfg, "method", None) == "condense":
        raise RecipeError(f"{path}: a condensation run without its adapter (adapter_config.json "
                          f"and adapter_model.safetensors are gone); refusing to {what} its circuit "
                          f"on the base model")
    return has_config
