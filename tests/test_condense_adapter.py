"""The heal's adapter: where `lora_targets` puts it, and the values the recipe key refuses."""
import re

import pytest
import torch

from condense.config import RecipeError
from condense.methods.condensation import healing
from tests.test_condense import load_config_for


@pytest.mark.parametrize("family, expected", [
    ("gpt2", ["c_attn", "c_fc", "c_proj"]),
    ("llama", ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"])])
def test_all_linear_adapter_is_on_every_linear_layer_but_the_head_and_the_graph_stays_exact(
        family, expected, tmp_path):
    """lora_targets: all-linear puts the adapter on every linear layer of the family, GPT-2's
    Conv1D included and the output head excluded, and with every edge on the graph still gives
    the adapted model's logits."""
    from condense.graph import Graph
    from condense.patching import run_graph

    from .tiny import TOL, make_model, prompts
    cfg = load_config_for(tmp_path, "lora_targets=all-linear")
    model = healing.add_adapter(make_model(family), cfg)
    assert healing.adapted_modules(model) == expected
    clean, corrupted, mask = prompts()
    real = mask.bool()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:  # a fresh adapter adds nothing: give it something to add
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
        adapted = model(input_ids=clean, attention_mask=mask).logits
        with model.disable_adapter():
            base = model(input_ids=clean, attention_mask=mask).logits
        full = run_graph(model, Graph.from_model(model), clean, corrupted, mask)
    assert (adapted - base)[real].abs().max() > 0.1
    assert (full - adapted)[real].abs().max() <= TOL


@pytest.mark.parametrize("value, message", [
    ("all_linear", 'must be a list of module names, "all-linear" or null'),
    ("[]", "must name at least one module"),
    ("[o_proj, 3]", "every entry must be a module name, got 3"),
    ("5", "expected list, str or null, got int 5")])
def test_lora_targets_are_checked(tmp_path, value, message):
    with pytest.raises(RecipeError, match=re.escape(f"'lora_targets': {message}")):
        load_config_for(tmp_path, f"lora_targets={value}")
