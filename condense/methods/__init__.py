"""Methods and their registry.

A method is a config dataclass (extending condense.config.RunConfig, next to its code), a run
function `run(ctx: condense.runs.RunContext) -> metrics` and whether it runs data parallel
(on every process, sharing work through condense.optimize; otherwise the main process runs it
while the others wait). A module in this package registers its methods with `register`; the
registry imports every module here the first time it is asked, so adding a method is adding
a module: no central file changes.
"""
import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable, Optional

from condense.config import RecipeError, RunConfig, from_dict


@dataclass(frozen=True)
class Method:
    name: str
    config: type          # a RunConfig subclass
    run: Callable         # run(ctx) -> metrics dict
    data_parallel: bool = False
    help: str = ""
    prepare: Optional[Callable] = None  # prepare(cfg): checks against the output folder, before any write


_REGISTRY: dict[str, Method] = {}
_DISCOVERED = False


def register(name: str, config: type, run: Callable, *, data_parallel: bool = False,
             help: str = "", prepare: Optional[Callable] = None) -> Method:
    """Add method `name` (its config class, run function, data parallel or not, and an
    optional prepare(cfg) that checks the output folder before anything is written)."""
    if not (isinstance(config, type) and issubclass(config, RunConfig)):
        raise TypeError(f"method {name!r}: its config must extend condense.config.RunConfig")
    _REGISTRY[name] = Method(name, config, run, data_parallel, help, prepare)
    return _REGISTRY[name]


def _discover():
    global _DISCOVERED
    if _DISCOVERED:
        return
    for info in pkgutil.iter_modules(__path__, __name__ + "."):
        importlib.import_module(info.name)
    _DISCOVERED = True


def methods() -> dict[str, Method]:
    """Every registered method, by name."""
    _discover()
    return dict(_REGISTRY)


def get(name: str) -> Method:
    """The method called `name`, or a RecipeError naming every registered one."""
    registry = methods()
    if name not in registry:
        raise RecipeError(f"recipe key 'method': unknown value {name!r}; valid: "
                          f"{', '.join(registry)}")
    return registry[name]


def key_owners() -> dict[str, set]:
    """recipe key -> the methods whose config has it (for 'belongs to' messages)."""
    owners: dict[str, set] = {}
    for m in methods().values():
        for f in m.config.__dataclass_fields__:
            owners.setdefault(f, set()).add(m.name)
    return owners


def config_from(data: dict, where: str = "recipe", lenient: bool = False) -> RunConfig:
    """The checked config of the method named in `data` (default eap_ig). `lenient` skips keys
    of other methods' configs (run folders written when one config held every key)."""
    method = get(data.get("method", RunConfig.method))
    owners = key_owners()
    ignore = set(owners) if lenient else ()
    if lenient:  # a run folder's recipe.yaml holds every key the run had; one it lacks came later
        data = dict(getattr(method.config, "added_later", {}), **data)
    cfg = from_dict(method.config, data, where=where, owners=owners, ignore=ignore)
    cfg.check()
    return cfg


__all__ = ["Method", "RecipeError", "config_from", "get", "key_owners", "methods", "register"]
