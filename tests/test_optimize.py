"""condense.optimize.fit, the one training loop (heal, Edge Pruning, S3martCirc)."""
import pytest
import torch

from condense.optimize import Diverged, fit, shard, world


def test_fit_minimises_and_stops_early():
    x = torch.tensor([3.0, -2.0], requires_grad=True)
    losses = fit([x], lambda step: (x ** 2).sum(), 500, lr=0.1, progress=False)
    assert len(losses) == 500 and losses[-1] < 1e-3 < losses[0]
    y = torch.tensor([3.0, -2.0], requires_grad=True)
    early = fit([y], lambda step: (y ** 2).sum(), 500, lr=0.1, progress=False, stop_below=0.5)
    assert len(early) < 500
    assert sum(early[-10:]) / 10 < 0.5 <= sum(early[-11:-1]) / 10


def test_fit_maximises_a_group_and_raises_on_nan():
    x = torch.tensor([1.0], requires_grad=True)
    lam = torch.tensor([0.0], requires_grad=True)
    fit([{"params": [x]}, {"params": [lam], "maximize": True}],
        lambda step: (x ** 2).sum() + lam.sum() * (x - 2).sum(), 5, lr=0.1, progress=False)
    assert lam.item() < 0  # d/d lam = x - 2 < 0: maximising moves lam down
    z = torch.tensor([1.0], requires_grad=True)
    with pytest.raises(Diverged):
        fit([z], lambda step: z.sum() * float("nan"), 3, lr=0.1, progress=False)


def test_one_process_shard_is_everything():
    assert world() == (0, 1)
    assert shard([5, 1, 4]) == [5, 1, 4]


def test_fit_stops_when_stop_if_says_so():
    w = torch.zeros(2, requires_grad=True)
    asked = []
    losses = fit([w], lambda step: ((w - 1) ** 2).sum(), 10, lr=0.1, progress=False,
                 stop_if=lambda step: asked.append(step) or step == 2)
    assert len(losses) == 3 and asked == [0, 1, 2]
