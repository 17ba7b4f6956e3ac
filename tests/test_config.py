from dataclasses import dataclass, field

import pytest

from condense.config import RecipeError, from_dict, load_recipe, parse_overrides, read_recipe
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


def test_an_optional_key_names_its_types_as_yaml_reads_them():
    """Union types are named as a recipe writer reads them, not as typing prints them."""
    with pytest.raises(RecipeError, match=r"^recipe key 'target': expected int or null, got str 'x'$"):
        from_dict(Demo, {"target": "x"})


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


@pytest.mark.parametrize("recipe,override,key,shown", [
    ("recipes/condense/organism_ioi.yaml", "prune_fraction=0", "prune_fraction", "0.0"),
    ("recipes/hap/organism.yaml", "ep_target_sparsity=1", "ep_target_sparsity", "1.0"),
    ("recipes/hap/organism.yaml", "hap_candidate_fraction=2", "hap_candidate_fraction", "2.0"),
    ("recipes/s3martcirc/organism_ioi.yaml", "s3_alpha=2", "s3_alpha", "2.0"),
    ("recipes/s3martcirc/organism_ioi.yaml", "s3_budgets=[5,0]", "s3_budgets", "[0]"),
    ("recipes/condense/organism_ioi.yaml", "search_resolution=1", "search_resolution", "1.0"),
])
def test_out_of_range_refusals_share_one_form(recipe, override, key, shown):
    """Every method's range check names the key, the rule and the value given, in one form,
    before a model loads."""
    from condense.methods import config_from
    data = read_recipe(recipe, [override])
    with pytest.raises(RecipeError) as e:
        config_from(data).check()
    message = str(e.value)
    assert message.startswith(f"recipe key {key!r}: ") and message.endswith(f", got {shown}"), message
