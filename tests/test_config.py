from dataclasses import dataclass, field

import pytest

from condense.config import RecipeError, from_dict, load_recipe, parse_overrides
from condense.organism.train import OrganismConfig, phases_of


@dataclass
class Demo:
    lr: float = 1e-4
    steps: int = 10
    heal: bool = True
    name: str = "x"
    rows: dict = field(default_factory=dict)
    target: int | None = None


def test_unknown_key_names_key_and_allowed():
    with pytest.raises(RecipeError) as e:
        from_dict(Demo, {"stpes": 3})
    assert "'stpes'" in str(e.value) and "steps" in str(e.value) and "heal" in str(e.value)


@pytest.mark.parametrize("key,value", [("steps", "ten"), ("steps", 2.5), ("heal", "yes"),
                                       ("lr", "fast"), ("rows", [1])])
def test_wrong_type_fails(key, value):
    with pytest.raises(RecipeError, match=key):
        from_dict(Demo, {key: value})


def test_overrides_are_yaml_scalars():
    assert parse_overrides(["heal=false", "lr=3e-3", "steps=5", "name=runs/a", "target=null"]) == \
        dict(heal=False, lr="3e-3", steps=5, name="runs/a", target=None)
    cfg = from_dict(Demo, parse_overrides(["heal=false", "lr=3e-3", "target=7"]))
    assert cfg.heal is False and cfg.lr == 3e-3 and cfg.target == 7
    with pytest.raises(RecipeError, match="key=value"):
        parse_overrides(["heal"])


def test_organism_recipe_parses(tmp_path):
    cfg = load_recipe("recipes/organism.yaml", OrganismConfig, ["n_layer=7"])
    assert cfg.n_layer == 7 and len(phases_of(cfg)) >= 1
    first = open("recipes/organism.yaml").readline()
    assert first.startswith("# condense organism --recipe recipes/organism.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("n_layers: 3\n")
    with pytest.raises(RecipeError, match="n_layer"):
        load_recipe(bad, OrganismConfig)
    for phase, word in [({"stpes": 3}, "steps"), ({"rows": {"ioi_task": 3}}, "greater_than")]:
        cfg = load_recipe("recipes/organism.yaml", OrganismConfig, [f"phases=[{phase}]"])
        with pytest.raises(RecipeError, match=word):
            phases_of(cfg)
