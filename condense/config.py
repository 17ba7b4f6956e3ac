"""Recipes: YAML files parsed into dataclasses, checked before any model loads.

An unknown key or a value of the wrong type fails at once, naming the key and the keys
that are allowed. `key=value` overrides from the command line are parsed as YAML scalars, so
`heal=false`, `lr=3e-3` and `output_dir=runs/x` all do what they say. `RunConfig` holds the
keys every run shares; each method's own config extends it (condense.methods).
"""
import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Optional

import yaml

from condense.artifacts import DamagedFile, read_text


class RecipeError(ValueError):
    pass


def _type_name(tp) -> str:
    """A recipe type as YAML users read it: `null`, `list`, `float` (not typing's repr)."""
    if tp is type(None):
        return "null"
    tp = typing.get_origin(tp) or tp
    return getattr(tp, "__name__", str(tp))


def _check_type(name, value, tp):
    origin = typing.get_origin(tp)
    if tp is typing.Any:
        return value
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return _check_type(name, value, arg)
            except RecipeError:
                pass
        allowed = [_type_name(arg) for arg in typing.get_args(tp)]
        raise RecipeError(f"recipe key {name!r}: expected {', '.join(allowed[:-1])} or "
                          f"{allowed[-1]}, got {type(value).__name__} {value!r}")
    if tp is type(None):
        if value is None:
            return None
        raise RecipeError(f"recipe key {name!r}: expected null, got {value!r}")
    if origin in (dict, list, tuple):
        if not isinstance(value, origin if origin is not tuple else (list, tuple)):
            raise RecipeError(f"recipe key {name!r}: expected a {origin.__name__}, got {value!r}")
        return origin(value) if origin is tuple else value
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):  # PyYAML reads 1e-4 (no dot) as a string
        try:
            return float(value)
        except ValueError:
            pass
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise RecipeError(f"recipe key {name!r}: expected {tp.__name__}, got "
                          f"{type(value).__name__} {value!r}")
    return value


def from_dict(cls, data, where="recipe", owners=None, ignore=()):
    """Build dataclass `cls` from `data`, refusing unknown keys and wrong types. `owners`
    (key -> the methods whose config has it) turns "unknown" into "belongs to"; keys in
    `ignore` are skipped (other methods' keys in a run folder written before configs split)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    unknown = [k for k in data if k not in fields and k not in ignore]
    if unknown:
        key = unknown[0]
        if owners and key in owners:
            raise RecipeError(f"{where}: key {key!r} belongs to method(s) "
                              f"{', '.join(sorted(owners[key]))}, not {data.get('method', cls.__name__)!r}; "
                              f"this method's keys: {', '.join(sorted(fields))}")
        raise RecipeError(f"{where}: unknown key {key!r}; allowed keys: {', '.join(sorted(fields))}")
    return cls(**{k: _check_type(k, v, hints[k]) for k, v in data.items() if k in fields})


def parse_overrides(items):
    """['a=1', 'b=x'] -> {'a': 1, 'b': 'x'}, each value read as a YAML scalar."""
    out = {}
    for item in items:
        if "=" not in item:
            raise RecipeError(f"override {item!r} is not of the form key=value")
        key, value = item.split("=", 1)
        out[key.strip()] = yaml.safe_load(value) if value else None
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that refuses a mapping with the same key twice (YAML would keep the last)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise RecipeError(f"line {key_node.start_mark.line + 1}: key {key!r} appears twice")
            seen.add(key)
        return super().construct_mapping(node, deep)


def read_recipe(path, overrides=(), allow_empty=False):
    """The YAML mapping of recipe `path` with `key=value` overrides applied. A missing or
    unreadable file, a YAML error, an empty recipe or a key given twice fail in one line."""
    if os.path.isdir(path):
        raise RecipeError(f"{path}: a folder, not a recipe file")
    try:
        data = yaml.load(read_text(path, "a recipe is a YAML text file"), Loader=_UniqueKeyLoader)
    except FileNotFoundError:
        raise RecipeError(f"{path}: no such recipe file") from None
    except DamagedFile as e:
        raise RecipeError(str(e)) from None
    except RecipeError as e:
        raise RecipeError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise RecipeError(f"{path}: not valid YAML{where}: {getattr(e, 'problem', None) or e}") from None
    if data is None and not allow_empty:
        raise RecipeError(f"{path}: the recipe is empty (at least `method:` and `model:`)")
    data = data or {}
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe is a mapping of keys to values")
    data.update(parse_overrides(overrides))
    return data


def load_recipe(path, cls, overrides=()):
    """Read YAML recipe `path` into dataclass `cls`, then apply `key=value` overrides."""
    return from_dict(cls, read_recipe(path, overrides), where=str(path))


def to_yaml(cfg):
    return yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False)


def help_text(cls):
    """Every key of config class `cls` with its default and help text."""
    return "\n".join(f"  {f.name} (default {f.default!r}): {f.metadata.get('help', '')}"
                     for f in dataclasses.fields(cls))


def one_of(cfg, key, allowed):
    value = getattr(cfg, key)
    if value not in allowed:
        raise RecipeError(f"recipe key {key!r}: unknown value {value!r}; valid: "
                          f"{', '.join(str(a) for a in allowed)}")


def refuse(cfg, key, why, value=None):
    """Raise the RecipeError every config check raises: the key, why, and the value given
    (`value` when the offending part is not the whole field, e.g. one entry of a list)."""
    shown = getattr(cfg, key) if value is None else value
    raise RecipeError(f"recipe key {key!r}: {why}, got {shown!r}")


def at_least(cfg, key, low, strict=False):
    value = getattr(cfg, key)
    if value < low or (strict and value == low):
        refuse(cfg, key, f"must be {'>' if strict else '>='} {low}")


@dataclass
class RunConfig:
    """The keys every method shares. Each method extends it with its own dataclass (next to
    its code) and registers it (condense.methods); `check()` refuses values no run could use,
    before anything loads."""
    method: str = field(default="eap_ig", metadata={
        "help": "what to run: a registered method (condense --help lists them)"})
    model: str = field(default="checkpoints/organism", metadata={
        "help": "model folder or hub name (relative paths are from the working directory)"})
    tokenizer: Optional[str] = field(default=None, metadata={
        "help": "tokenizer folder or hub name (null: the model's)"})
    task: str = field(default="ioi", metadata={
        "help": "task: ioi, induction, agreement, docstring, acronym or greater_than"})
    n_train: int = field(default=200, metadata={"help": "train rows (rank edges on these)"})
    n_val: int = field(default=100, metadata={
        "help": "val rows (MIB curves and the smallest-faithful-circuit search)"})
    n_test: int = field(default=200, metadata={"help": "test rows (the reported numbers)"})
    seed: int = field(default=0, metadata={"help": "seed for task rows and random scores"})
    ig_steps: int = field(default=5, metadata={
        "help": "points per path for eap_ig_inputs, eap_ig_activations and eap_gp"})
    gp_step: Optional[float] = field(default=None, metadata={
        "help": "eap_gp step length (null: |clean - ablated input| / ig_steps per row)"})
    intervention: str = field(default="patching", metadata={
        "help": "what a removed edge carries: patching (corrupted prompt), mean (over the "
                "train prompts) or zero"})
    metric: str = field(default="logit_diff", metadata={
        "help": "attribution metric: logit_diff or kl"})
    batch_size: int = field(default=16, metadata={"help": "rows per forward pass"})
    faithfulness_threshold: float = field(default=0.9, metadata={
        "help": "a circuit is faithful when f(C) >= this (docs/design.md §4)"})
    search_resolution: float = field(default=0.0, metadata={
        "help": "end the smallest-faithful bisection once the bracket is narrower than this "
                "fraction of the circuit size (0: to the exact boundary; 0.01 saves about seven "
                "evaluations on a 100k-edge graph)"})
    absolute_scores: bool = field(default=True, metadata={
        "help": "search the smallest faithful circuit over edges ranked by |score| (false: "
                "by signed score)"})
    output_dir: Optional[str] = field(default=None, metadata={
        "help": "where artifacts go (null: checkpoints/<method>_<model>_<task>)"})
    report_to: str = field(default="none", metadata={
        "help": "none or wandb (offline unless WANDB_MODE says otherwise)"})
    wandb_project: str = field(default="condense", metadata={"help": "wandb project name"})
    dtype: Optional[str] = field(default=None, metadata={
        "help": "model dtype: float32, bfloat16, float16 (null: as saved)"})
    quantization: Optional[str] = field(default=None, metadata={
        "help": "null, 4bit (NF4) or 8bit: a frozen bitsandbytes base that computes with its "
                "exact dequantized weights (LoRA heals over it); null: full precision"})
    device: Optional[str] = field(default=None, metadata={
        "help": "cpu, cuda, cuda:1, ... (null: accelerate's choice)"})
    threads: Optional[int] = field(default=None, metadata={
        "help": "torch CPU threads (null: torch's default)"})

    def check(self):
        """Refuse shared values no run could use (a method's config extends this)."""
        from condense.attribute import METRICS
        from condense.models import DTYPES, QUANTIZATIONS
        from condense.patching import INTERVENTIONS
        from condense.tasks import TASKS

        one_of(self, "task", TASKS)
        one_of(self, "intervention", INTERVENTIONS)
        one_of(self, "metric", METRICS)
        one_of(self, "report_to", REPORT_TO)
        if self.dtype is not None:
            one_of(self, "dtype", DTYPES)
        if self.quantization not in QUANTIZATIONS:
            raise RecipeError(f"recipe key 'quantization': unknown value {self.quantization!r}; "
                              f"valid: 4bit, 8bit, or null (full precision)")
        for key in ("n_train", "n_val", "n_test", "ig_steps", "batch_size"):
            at_least(self, key, 1)
        if self.threads is not None:
            at_least(self, "threads", 1)
        if not 0 <= self.search_resolution < 1:
            refuse(self, "search_resolution", "must lie in [0, 1)")
        if not 0 < self.faithfulness_threshold <= 1:
            refuse(self, "faithfulness_threshold", "must lie in (0, 1]")
        if (os.path.isdir(self.model) and os.path.exists(os.path.join(self.model, "adapter_config.json"))
                and not os.path.exists(os.path.join(self.model, "config.json"))):
            raise RecipeError(f"recipe key 'model': {self.model} is a PEFT adapter folder (a "
                              f"condensation run?), not a model: give its base model (its "
                              f"recipe.yaml names it); condense does not treat a healed model as "
                              f"the original")
        if self.output_dir is not None and os.path.isfile(self.output_dir):
            raise RecipeError(f"recipe key 'output_dir': {self.output_dir} is a file, not a folder")


REPORT_TO = ("none", "wandb")
