"""95 % intervals for the numbers condense reports on a few hundred rows.

An accuracy or an agreement on 200 rows carries sampling noise of several points, so every
such number the fidelity card (condense.fidelity) and the benchmarks report comes with its
interval:

- `wilson(k, n)`: the Wilson score interval of a proportion k / n (it stays inside [0, 1] and
  behaves at 0 and n, where the normal approximation does not);
- `bootstrap(values, statistic)`: the percentile bootstrap of any statistic of per-row values
  (a mean KL; faithfulness, a ratio of means over the same rows), resampling rows with a
  seeded generator, so that a rerun gives the same interval.
"""
import math
from typing import Callable, Optional, Sequence

import torch

Z95 = 1.959963984540054  # the two-sided 95 % normal quantile


def wilson(k: int, n: int, z: float = Z95) -> list:
    """[low, high] of the Wilson score interval of the proportion k / n (95 % by default);
    [nan, nan] for n = 0."""
    if n <= 0:
        return [math.nan, math.nan]
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [max(0.0, centre - half), min(1.0, centre + half)]


def proportion(flags: Sequence[bool] | torch.Tensor) -> dict:
    """{"value", "k", "n", "interval"} of a per-row boolean: its mean and Wilson interval."""
    flags = torch.as_tensor(flags, dtype=torch.bool).flatten()
    k, n = int(flags.sum()), int(flags.numel())
    return dict(value=k / n if n else math.nan, k=k, n=n, interval=wilson(k, n))


def bootstrap(values: Sequence[torch.Tensor] | torch.Tensor,
              statistic: Optional[Callable] = None, resamples: int = 2000, seed: int = 0,
              level: float = 0.95) -> dict:
    """{"value", "n", "interval"}: `statistic` of per-row `values` (one tensor [N], or several
    [N] tensors over the same rows, passed to `statistic` together) and its percentile
    bootstrap interval over rows. `statistic` defaults to the mean of one tensor; it is called
    on each resample's rows (as index-selected tensors) and must return a float."""
    parts = [values] if isinstance(values, torch.Tensor) else list(values)
    parts = [torch.as_tensor(p, dtype=torch.float64).flatten() for p in parts]
    n = int(parts[0].numel())
    if any(int(p.numel()) != n for p in parts):
        raise ValueError("bootstrap: the per-row tensors differ in length")
    stat = statistic or (lambda x: float(x.mean()))
    if n == 0:
        return dict(value=math.nan, n=0, interval=[math.nan, math.nan])
    value = float(stat(*parts))
    gen = torch.Generator().manual_seed(seed)
    draws = torch.randint(0, n, (resamples, n), generator=gen)
    stats = torch.tensor([float(stat(*(p[idx] for p in parts))) for idx in draws],
                         dtype=torch.float64)
    stats = stats[~torch.isnan(stats)]
    if stats.numel() == 0:
        return dict(value=value, n=n, interval=[math.nan, math.nan])
    tail = (1 - level) / 2
    low, high = torch.quantile(stats, torch.tensor([tail, 1 - tail], dtype=torch.float64)).tolist()
    return dict(value=value, n=n, interval=[low, high])


def faithfulness_ratio(ld: torch.Tensor, ld_full: torch.Tensor, ld_empty: torch.Tensor) -> float:
    """f = (mean LD(C) - mean LD(∅)) / (mean LD(full) - mean LD(∅)) over the same rows
    (docs/design.md §4); nan when the denominator vanishes."""
    denom = float(ld_full.mean() - ld_empty.mean())
    return float(ld.mean() - ld_empty.mean()) / denom if abs(denom) > 1e-12 else math.nan


def fmt(entry: dict, digits: int = 3) -> str:
    """'0.905 [0.857, 0.938]': a value with its interval, as tables print it."""
    low, high = entry["interval"]
    return f"{entry['value']:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"
