"""Golden runs: one short recipe per method on the organism must give the circuit pinned in
tests/golden/<method>.json (written by the code before the structure change). Regenerate a
pin, deliberately, with `CONDENSE_WRITE_GOLDEN=1 python -m pytest tests/test_golden.py`."""
import json
import os

import pytest

from condense import train

from .conftest import ORGANISM

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")
COMMON = dict(model=ORGANISM, task="ioi", n_train=16, n_val=16, n_test=16, batch_size=16,
              threads=1, seed=0)
SHORT = {
    "eap_ig": dict(ig_steps=2),
    "condense": dict(n_train=32, heal_steps=15, heal_lr=1e-3, max_rounds=3, n_general=4,
                     heal_batch_size=8, heal_general_batch=2, ig_steps=2),
    "edge_pruning": dict(ep_steps=60, ep_batch_size=8, ep_lr=1.0, ep_target_sparsity=0.9),
    "hap": dict(ep_steps=60, ep_batch_size=8, ep_lr=1.0, ep_target_sparsity=0.9, hap_steps=40),
    "s3martcirc": dict(s3_epochs=4, s3_warmup_epochs=1, s3_k=2, s3_sparsity=30.0, s3_lr=0.1),
}


def _edges(run_dir):
    with open(os.path.join(run_dir, "circuit.json")) as f:
        d = json.load(f)
    edges = sorted(name for name, e in d["edges"].items() if e["in_graph"])
    nodes = sorted(f"{name}:{e.get('role', '')}" for name, e in d["nodes"].items() if e["in_graph"])
    neurons = sorted(f"{name}:{e.get('role', '')}" for name, e in d.get("neurons", {}).items())
    return dict(edges=edges, nodes=nodes, neurons=neurons)


@pytest.mark.parametrize("method", list(SHORT))
def test_short_recipe_gives_the_pinned_circuit(method, tmp_path):
    keys = dict(COMMON, method=method, **SHORT[method])
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps(keys))  # JSON is YAML
    out = tmp_path / "run"
    train.main(["--recipe", str(recipe), f"output_dir={out}"])
    got = _edges(out)
    path = os.path.join(GOLDEN, f"{method}.json")
    if os.environ.get("CONDENSE_WRITE_GOLDEN"):
        with open(path, "w") as f:
            json.dump(dict(recipe=keys | {"model": "checkpoints/organism"}, **got), f, indent=1)
    with open(path) as f:
        pinned = json.load(f)
    assert got["edges"] == pinned["edges"] and got["nodes"] == pinned["nodes"]
    assert got["neurons"] == pinned["neurons"]
