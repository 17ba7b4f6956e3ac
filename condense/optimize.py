"""The one optimisation loop of condense: heal (LoRA), Edge Pruning / HAP (edge masks) and
S3martCirc (node coefficients) all train through `fit`, so progress bars, NaN handling and
data parallelism behave the same everywhere.

Data parallelism (`accelerate launch --multi_gpu --num_processes N`, or ACCELERATE_USE_CPU=1
on CPU): every process draws the *same* batch indices from the same seeded generator, takes
its share with `shard`, and `fit` averages the gradients over processes before each step. With
equal shares the averaged gradient is the gradient of the whole batch's mean loss, so N
processes take the same steps as one (up to float summation order). Parameters are never
wrapped in DDP: our forwards are run_graph calls, not model.__call__.
"""
import copy
import sys
import time
from typing import Callable, Optional

import torch
from tqdm.auto import tqdm


class Diverged(RuntimeError):
    """The loss, a gradient or a trained parameter became NaN/inf: training stopped at once,
    its parameters left at the last finite step (and saved there when it has a FitState)."""


def world():
    """(rank, number of processes) of torch.distributed, (0, 1) when not initialised."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def shard(items):
    """This process's share of `items` (a list of indices): items[rank::world]. Use batch sizes
    divisible by the number of processes, or the shares (and so the mean) are unequal."""
    rank, size = world()
    return items[rank::size] if size > 1 else items


def all_reduce_(tensor, op="sum"):
    """In-place sum (or mean) over processes; a no-op on one process. Returns `tensor`."""
    size = world()[1]
    if size > 1:
        import torch.distributed as dist
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        if op == "mean":
            tensor /= size
    return tensor


SAVE_EVERY = 60.0  # seconds between a FitState's saves


class FitState:
    """Where `fit` keeps what it needs to go on after an interruption: the trained parameters,
    AdamW's moments, the losses so far, and what the caller's loss_fn and after_step draw from
    or add to (`generators`: torch.Generators by name; `logs`: lists or dicts by name;
    `tensors`: accumulators by name; the last two restored in place). Saved atomically (main
    process) at most every `every` seconds (SAVE_EVERY) and when training ends; a rerun whose
    fit gets the same path starts after the last saved step and takes the steps an
    uninterrupted run would (the global torch generators, which dropout draws from, are saved
    too). The file names its training (`what`, the caller's words for it, its length and the
    shapes of its parameters); a file of another training, or one that does not load, is
    ignored. It also keeps the wall and CPU seconds the training's steps have taken so far, so
    that a resumed run reports the time of the whole training (`earlier_seconds`,
    `earlier_cpu_seconds`: what earlier processes spent on the saved steps; 0 on a fresh start)
    rather than only its own process's share."""

    def __init__(self, path: str, every: Optional[float] = None, generators: Optional[dict] = None,
                 logs: Optional[dict] = None, tensors: Optional[dict] = None, what: str = "",
                 clock=time.monotonic):
        from condense.artifacts import TimedResumeFile
        self.path, self.what = path, what
        self.file = TimedResumeFile(path, None, SAVE_EVERY if every is None else every, clock=clock)
        self.generators, self.logs, self.tensors = generators or {}, logs or {}, tensors or {}
        self.resumed_at = 0

    @property
    def earlier_seconds(self) -> float:
        return self.file.before

    @property
    def earlier_cpu_seconds(self) -> float:
        return self.file.before_cpu

    def load(self, params, opt, steps: int) -> tuple[int, list[float]]:
        """(the step to start at, the losses of the steps before it); (0, []) without a file
        of this training."""
        self.file.key = repr((self.what, steps, [tuple(p.shape) for p in params]))
        self.file.begin, self.file.begin_cpu = time.perf_counter(), time.process_time()  # ours starts
        state = self.file.load()
        if not state:
            return 0, []
        with torch.no_grad():
            for p, saved in zip(params, state["params"]):
                p.copy_(saved)
        opt.load_state_dict(state["optimizer"])
        for name, gen in self.generators.items():
            gen.set_state(state["generators"][name])
        torch.set_rng_state(state["torch_rng"])  # dropout in train mode draws from it
        if state.get("cuda_rng") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        for name, log in self.logs.items():
            if isinstance(log, dict):
                log.clear()
                log.update(state["logs"][name])
            else:
                log[:] = state["logs"][name]
        with torch.no_grad():
            for name, tensor in self.tensors.items():
                tensor.copy_(state["tensors"][name])
        self.resumed_at = int(state["step"])
        if world()[0] == 0:
            print(f"going on from {self.path}: step {self.resumed_at} of {steps}",
                  file=sys.stderr, flush=True)
        return self.resumed_at, list(state["losses"])

    def save(self, step: int, params, opt, losses, final: bool = False) -> None:
        """After `step` steps (the main process writes; every `every` seconds, or final)."""
        if world()[0] != 0 or not self.file.due(final):
            return  # checked before the copies below are made, so the save itself is forced
        self.file.save(final=True, state=dict(
            step=step, losses=list(losses),
            params=[p.detach().cpu().clone() for p in params], optimizer=opt.state_dict(),
            generators={n: g.get_state() for n, g in self.generators.items()},
            torch_rng=torch.get_rng_state(),
            cuda_rng=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            logs={n: copy.deepcopy(log) for n, log in self.logs.items()},
            tensors={n: x.detach().cpu().clone() for n, x in self.tensors.items()}))


def fit(param_groups, loss_fn: Callable[[int], torch.Tensor], steps: int, *, lr: float,
        weight_decay: float = 0.0, desc: str = "train", progress: bool = True,
        after_step: Optional[Callable] = None, check_finite: bool = True, postfix_every: int = 10,
        stop_below: Optional[float] = None, window: int = 10,
        stop_if: Optional[Callable[[int], bool]] = None,
        state: Optional[FitState] = None) -> list[float]:
    """`steps` AdamW steps; returns the per-step losses (averaged over processes).

    param_groups: a list of tensors, or of dicts as torch.optim takes them (per-group `lr`,
        `weight_decay`, `maximize`: e.g. Lagrange multipliers that are maximised).
    loss_fn(step) -> scalar loss of this process's share of the step's batch (see `shard`).
    after_step(step, loss) is called after each update (e.g. to clamp or log).
    stop_below: stop early once the mean of the last `window` losses is below this (the
        losses are all-reduced, so every process stops at the same step).
    stop_if(step) -> bool: called after each step's update (every process calls it); stop when
        it is true in every process.
    state: go on from (and save to) a FitState, so that an interrupted training resumes; a
        training that stopped early resumes as stopped.
    Raises Diverged if a loss or a parameter becomes NaN/inf; every process raises together,
    since the loss checked is the all-reduced one."""
    groups = list(param_groups)
    if groups and isinstance(groups[0], torch.Tensor):
        groups = [{"params": groups}]
    params = [p for g in groups for p in g["params"]]
    opt = torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay)
    first, losses = state.load(params, opt, steps) if state is not None else (0, [])
    bar = tqdm(range(first, steps), desc=desc, disable=not progress or world()[0] != 0,
               initial=first, total=steps)
    for step in bar:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(step)
        loss.backward()
        value = all_reduce_(loss.detach().float().reshape(1).clone(), "mean")
        if check_finite and not torch.isfinite(value).all():
            _stop(state, step, params, opt, losses, f"{desc}: loss {value.item()} at step {step}")
        _average_gradients(params)
        if check_finite:  # NaN gradients would make every parameter NaN: stop before the step
            bad = torch.stack([(~torch.isfinite(p.grad)).any().float() for p in params
                               if p.grad is not None] or [torch.zeros(())])
            if bad.sum() > 0:
                _stop(state, step, params, opt, losses,
                      f"{desc}: gradients not finite at step {step}")
            before = [p.detach().clone() for p in params]
        opt.step()
        if check_finite:
            bad = torch.stack([(~torch.isfinite(p)).any().float() for p in params])
            if all_reduce_(bad).sum() > 0:
                with torch.no_grad():  # back to the last good parameters
                    for p, b in zip(params, before):
                        p.copy_(b)
                raise Diverged(f"{desc}: parameters not finite after step {step}")
        losses.append(value.item())
        if after_step is not None:
            after_step(step, losses[-1])
        if step % postfix_every == 0:
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
        if state is not None:
            state.save(step + 1, params, opt, losses)
        if stop_below is not None and len(losses) >= window \
                and sum(losses[-window:]) / window < stop_below:
            break
        if stop_if is not None and _everywhere(bool(stop_if(step)), params[0].device):
            break
    if state is not None:  # saved as done, an early stop included: its rerun trains no more
        state.save(steps, params, opt, losses, final=True)
    bar.close()
    return losses


def _stop(state, step, params, opt, losses, why: str) -> None:
    """Diverged at `step`, before its update: the parameters are the last good ones, and with a
    FitState they are saved as they are (step `step`), so that nothing after them is lost."""
    if state is not None:
        state.file.saved_at = -float("inf")  # due now
        state.save(step, params, opt, losses)
        why += f"; the last good state (step {step}) is kept in {state.path}"
    raise Diverged(why)


def _everywhere(flag: bool, device) -> bool:
    """True when `flag` is true in every process (one all-reduce; the flag itself on one)."""
    if world()[1] == 1:
        return flag
    return all_reduce_(torch.tensor([float(flag)], device=device)).item() == world()[1]


def _average_gradients(params):
    """Mean of every gradient over processes, as one flat all-reduce."""
    if world()[1] == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = all_reduce_(torch.cat([g.reshape(-1) for g in grads]).float(), "mean")
    start = 0
    for p, g in zip(params, grads):
        n = g.numel()
        p.grad = flat[start:start + n].view_as(p).to(p.dtype)
        start += n
