"""condense.optimize.fit, the one training loop (heal, Edge Pruning, S3martCirc)."""
import time
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


class Stop(Exception):
    pass


def noisy_training(path=None, stop_at=None, sleep=0.0):
    """A fit whose steps draw from a generator and log as they go (each taking `sleep` seconds
    more): (parameter, losses, log, state)."""
    from condense.optimize import FitState
    x = torch.tensor([3.0, -2.0, 1.0], requires_grad=True)
    gen, log = torch.Generator().manual_seed(0), []

    def loss_fn(step):
        if step == stop_at:
            raise Stop
        noise = torch.randn(3, generator=gen)
        log.append(step)
        time.sleep(sleep)
        return ((x - noise) ** 2).sum()
    state = FitState(str(path), every=0, generators={"noise": gen}, logs={"log": log}) if path else None
    losses = fit([x], loss_fn, 30, lr=0.05, progress=False, state=state)
    return x.detach(), losses, log, state


def test_an_interrupted_fit_resumes_with_the_uninterrupted_steps(tmp_path):
    x, losses, log, _ = noisy_training()
    path = tmp_path / "state" / "fit.pt"
    with pytest.raises(Stop):
        noisy_training(path, stop_at=11)
    assert torch.load(path, weights_only=True)["step"] == 11
    x2, losses2, log2, state = noisy_training(path)
    assert state.resumed_at == 11
    assert torch.equal(x2, x) and losses2 == losses and log2 == log == list(range(30))
    # finished: a third run trains no more and returns the same
    x3, losses3, _, state = noisy_training(path, stop_at=0)
    assert state.resumed_at == 30 and torch.equal(x3, x) and losses3 == losses


def test_a_resumed_fit_counts_the_seconds_of_the_steps_before_it(tmp_path):
    """The save keeps the steps' wall and CPU seconds; a resumed training starts from them, so
    its final save holds the whole training's time, not only the last process's."""
    path = tmp_path / "fit.pt"
    with pytest.raises(Stop):
        noisy_training(path, stop_at=10, sleep=0.02)
    saved = torch.load(path, weights_only=True)
    assert saved["seconds"] >= 10 * 0.02 and saved["cpu_seconds"] >= 0
    _, _, _, state = noisy_training(path, sleep=0.02)
    assert state.earlier_seconds == saved["seconds"]
    assert state.earlier_cpu_seconds == saved["cpu_seconds"]
    assert torch.load(path, weights_only=True)["seconds"] >= saved["seconds"] + 20 * 0.02
    _, _, _, fresh = noisy_training(tmp_path / "other.pt")
    assert fresh.earlier_seconds == 0.0 and fresh.resumed_at == 0


def test_a_fit_state_of_another_training_is_not_used(tmp_path):
    from condense.optimize import FitState
    path = tmp_path / "fit.pt"
    with pytest.raises(Stop):
        noisy_training(path, stop_at=5)
    y = torch.zeros(2, requires_grad=True)  # other shapes: starts from step 0
    state = FitState(str(path), every=0)
    losses = fit([y], lambda step: ((y - 1) ** 2).sum(), 4, lr=0.1, progress=False, state=state)
    assert state.resumed_at == 0 and len(losses) == 4


def test_a_fit_state_that_does_not_load_is_ignored(tmp_path, capsys):
    from condense.optimize import FitState
    path = tmp_path / "fit.pt"
    path.write_bytes(b"not a save")
    y = torch.zeros(2, requires_grad=True)
    state = FitState(str(path), every=0)
    assert len(fit([y], lambda step: ((y - 1) ** 2).sum(), 3, lr=0.1, progress=False, state=state)) == 3
    assert state.resumed_at == 0 and "ignoring" in capsys.readouterr().err
    assert torch.load(path, weights_only=True)["step"] == 3  # replaced by this training's save
