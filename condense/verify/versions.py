"""Tensor helpers of the sparse subset evaluator (condense/verify/subsets.py): a circuit node is
computed once per *version*, a distinct setting of the circuit edges upstream of it, and
these functions find the versions, multiply against a few of them without copying per row,
and read a row's last real position."""
import torch

from condense.patching import block_slices


def sender_output(values, graph, s, B, T):
    """Sender s's output [B, T, D] from SenderValues (broadcast dims expanded)."""
    for k, sl in enumerate(block_slices(graph)):
        if sl.start <= s < sl.stop:
            return values.blocks[k][s - sl.start].expand(B, T, -1)
    raise IndexError(s)


def matmul_versions(a, b, version):
    """a [B, U|1, Tq, K] @ b[:, version] -> [B, U, Tq, N], b holding a few versions [B, V, K, N]
    (version [U]; None: b is [B, 1, K, N], shared). With few versions and few query positions,
    a is multiplied with every version and the row's own result kept: b is never copied per
    row, which costs more than the extra products."""
    if version is None:
        return a @ b
    B, V, K, N = b.shape
    U, Tq = version.shape[0], a.shape[2]
    if V * Tq > 8:
        return a @ b[:, version]
    every = (a @ b.transpose(1, 2).reshape(B, 1, K, V * N)).view(B, a.shape[1], Tq, V, N)
    index = version[None, :, None, None, None].expand(B, U, Tq, 1, N)
    return every.expand(B, U, Tq, V, N).gather(3, index)[:, :, :, 0]


def at_last(x, last):
    """x [B, U, T, ...] -> [B, U, 1, ...] at each row's last real position."""
    return x[torch.arange(x.shape[0], device=x.device), :, last][:, :, None]


def versions_of(masks, cone):
    """Subsets that agree on the edges `cone` share a version: (version of each row of
    `masks` [M, n] -> [M], one representative row per version [U])."""
    columns = masks[:, torch.tensor(cone, device=masks.device)]
    if len(cone) <= 62:  # one int64 code per row (more bits would overflow and merge versions)
        bits = torch.arange(len(cone), device=masks.device)
        _, version = torch.unique((columns.long() << bits).sum(1), return_inverse=True)
    else:
        _, version = torch.unique(columns, dim=0, return_inverse=True)
    rep = torch.empty(int(version.max()) + 1, dtype=torch.long, device=masks.device)
    return version, rep.scatter_(0, version, torch.arange(len(masks), device=masks.device))


def project_rows(weights, x):
    """One head's q, k or v rows applied to x [..., D] -> [..., head_dim]."""
    wb, rows, module = weights
    if wb is None:
        return module(x)[..., rows.to(x.device)]
    W, b = wb
    y = x @ W.T
    return y if b is None else y + b
