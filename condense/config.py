"""Recipes: YAML files parsed into dataclasses, checked before any model loads.

An unknown key or a value of the wrong type fails at once, naming the key and the keys
that are allowed (DESIGN.md §8). `key=value` overrides from the command line are parsed
as YAML scalars, so `heal=false`, `lr=3e-3` and `output_dir=runs/x` all do what they say.
"""
import dataclasses
import types
import typing

import yaml


class RecipeError(ValueError):
    pass


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
        raise RecipeError(f"recipe key {name!r}: {value!r} is not of type {tp}")
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


def from_dict(cls, data, where="recipe"):
    """Build dataclass `cls` from `data`, refusing unknown keys and wrong types."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    unknown = [k for k in data if k not in fields]
    if unknown:
        raise RecipeError(f"{where}: unknown key {unknown[0]!r}; allowed keys: "
                          f"{', '.join(sorted(fields))}")
    return cls(**{k: _check_type(k, v, hints[k]) for k, v in data.items()})


def parse_overrides(items):
    """['a=1', 'b=x'] -> {'a': 1, 'b': 'x'}, each value read as a YAML scalar."""
    out = {}
    for item in items:
        if "=" not in item:
            raise RecipeError(f"override {item!r} is not of the form key=value")
        key, value = item.split("=", 1)
        out[key.strip()] = yaml.safe_load(value) if value else None
    return out


def load_recipe(path, cls, overrides=()):
    """Read YAML recipe `path` into dataclass `cls`, then apply `key=value` overrides."""
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe is a mapping of keys to values")
    data.update(parse_overrides(overrides))
    return from_dict(cls, data, where=str(path))


def to_yaml(cfg):
    return yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False)
