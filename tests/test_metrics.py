import math

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from condense.metrics import kl_rows, last_logits, logit_diff_stats, perplexity


def tiny():
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50,
                                      n_positions=32)).eval()


def test_last_logits_batched_equals_one_by_one():
    model = tiny()
    seqs = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11, 12, 13]]
    got = last_logits(model, seqs, batch_size=3)
    for s, g in zip(seqs, got):
        want = model(input_ids=torch.tensor([s])).logits[0, -1]
        assert torch.allclose(g, want, atol=1e-5)


def test_logit_diff_stats():
    logits = torch.tensor([[0.0, 2.0, 1.0], [0.0, 1.0, 3.0]])
    s = logit_diff_stats(logits, dict(answer_id=[1, 1], distractor_id=[2, 2]))
    assert math.isclose(s["logit_diff"], (1.0 - 2.0) / 2)
    assert s["accuracy"] == 0.5 and s["top1"] == 0.5


def test_perplexity_matches_loss():
    model = tiny()
    blocks = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]]
    loss = model(input_ids=torch.tensor(blocks), labels=torch.tensor(blocks)).loss
    assert math.isclose(perplexity(model, blocks, batch_size=1), math.exp(loss.item()), rel_tol=1e-5)


def test_perplexity_measures_in_eval_mode_and_restores_the_mode():
    """A model left in training mode (dropout on, as during a heal) is measured without
    dropout, the same value as in eval mode, and handed back in training mode."""
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50,
                                       n_positions=32, resid_pdrop=0.5, embd_pdrop=0.5))
    blocks = torch.randint(0, 50, (4, 12)).tolist()
    expected = perplexity(model.eval(), blocks, batch_size=2)
    model.train()
    assert perplexity(model, blocks, batch_size=2) == expected and model.training


def test_kl_rows_is_kl_of_the_target_to_the_model_per_row():
    # written out from the definition, sum_v p(v) log(p(v) / q(v)), with the target first:
    # swapping the arguments gives a different number on these rows
    gen = torch.Generator().manual_seed(0)
    target = torch.log_softmax(3 * torch.randn(4, 7, generator=gen), -1)
    logp = torch.log_softmax(torch.randn(4, 7, generator=gen), -1)
    p, q = target.exp(), logp.exp()
    expected = (p * (p / q).log()).sum(-1)
    assert torch.allclose(kl_rows(target, logp), expected, atol=1e-6)
    assert not torch.allclose(kl_rows(logp, target), expected, atol=1e-3)
    assert torch.allclose(kl_rows(target, target), torch.zeros(4), atol=1e-7)
