import pytest
import torch

from condense.models import load_model


def test_loads_organism_eager(organism):
    assert organism.config._attn_implementation == "eager"
    assert not organism.training


def test_missing_model_names_the_path(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(OSError, match="no-such-org/no-such-model"):
        load_model("no-such-org/no-such-model")


def test_a_misspelt_name_lists_the_named_models(monkeypatch):
    """load_model and model_config (which the grid checks a model with) fail alike."""
    from condense.models import model_config
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for load in (load_model, model_config):
        with pytest.raises(OSError, match="'gemma3-27m': no such local folder.*named offline "
                                          "models: smollm2-135m, gemma3-270m"):
            load("gemma3-27m")


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="4bit"):
        load_model("checkpoints/organism", quantization="3bit")
    with pytest.raises(ValueError, match="bfloat16"):
        load_model("checkpoints/organism", dtype="float8")


def test_dtype(organism):
    m = load_model("checkpoints/organism", dtype="bfloat16")
    assert next(m.parameters()).dtype == torch.bfloat16
