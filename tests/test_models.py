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


def test_shipped_folders_load_from_any_working_directory(tmp_path, monkeypatch):
    """The shipped recipes name checkpoints/organism: a run started outside the repository
    finds it there; a path that exists where the run starts, and a hub name, are left alone."""
    from condense.models import REPO_ROOT, model_folder
    monkeypatch.chdir(tmp_path)
    assert model_folder("checkpoints/organism") == f"{REPO_ROOT}/checkpoints/organism"
    assert load_model("checkpoints/organism").config.model_type == "gpt2"
    (tmp_path / "checkpoints" / "organism").mkdir(parents=True)
    assert model_folder("checkpoints/organism") == "checkpoints/organism"
    assert model_folder("gpt2") == "gpt2" and model_folder("meta-llama/Llama-3.2-1B") == "meta-llama/Llama-3.2-1B"
