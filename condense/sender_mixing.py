"""How a receiver group of the patched forward reads its senders (condense.patching):

    x_r = base + sum_s m[s, r] * D_s,   D_s = clean_s - ablated_s,

with the differences D kept in one buffer written once per sender (SenderDiffs), receivers
that read the same mix computed once (unique_columns), all-on and all-off columns read without
a product (mix), and under autograd a backward that accumulates d/dD per sender instead of
saving a copy per group (MixSenders)."""
import torch


class SenderDiffs:
    """The differences D_s = clean_s - ablated_s of the senders recorded so far in a patched run,
    as rows of one preallocated [n_senders, B*T*D] tensor that is written once per sender and
    never changed (no re-concatenation per receiver group, no copy saved per group for
    backward). `senders` maps a row to its sender index: a sender skipped because it reads
    only the ablated stream has no row (its D is exactly 0). Under autograd, `grad` collects
    d loss / d D_s from every receiver group's backward (see MixSenders)."""

    def __init__(self, n_senders, width, like):
        self.data = like.new_empty(n_senders, width)
        self.grad = None      # [n_senders, N]: gradients of rows that groups read unevenly
        self.common = None    # [N]: gradient every row read so far received (uniform columns)
        self.last_group = None  # the group whose backward ran last (a new pass starts higher)
        self.groups = 0
        self.senders = []
        self.contiguous = True  # rows are senders 0..n-1 (nothing skipped)

    @property
    def n(self):
        return len(self.senders)

    def add(self, first_sender, diff):
        """Record the rows of a block of senders; diff [k, B*T*D]."""
        # a skipped block leaves a gap, also before the first recorded block (the input node
        # skipped when no edge out of it is on)
        if first_sender != (self.senders[-1] + 1 if self.senders else 0):
            self.contiguous = False
        with torch.no_grad():
            self.data[self.n: self.n + diff.shape[0]] = diff
        self.senders.extend(range(first_sender, first_sender + diff.shape[0]))

    def mask_rows(self, edge_mask, receivers):
        """The rows of edge_mask[:, receivers] that belong to recorded senders, in row order."""
        if self.contiguous:
            return edge_mask[: self.n, receivers]
        rows = torch.tensor(self.senders, device=edge_mask.device)
        return edge_mask.index_select(0, rows)[:, receivers]


def unique_columns(m):
    """(distinct columns [n, U], inverse [R]) of m, or None when every column differs. Receivers
    of a group often read the same mix (every edge on, or none), and one product serves them."""
    if m.shape[1] == 1:
        return None
    cols, inverse = torch.unique(m.detach(), dim=1, return_inverse=True)
    return None if cols.shape[1] == m.shape[1] else (cols, inverse)


def mix(diffs, base, full, cols):
    """x [U, N] = base + cols.T @ D. A column of zeros reads `base` (every sender ablated) and
    a column of ones `full` (= base + every row of D: the clean sum), without a product."""
    n = cols.shape[0]
    zeros = ~cols.detach().any(0)
    ones = (cols.detach() == 1).all(0) & ~zeros
    if not bool((zeros | ones).any()):
        return torch.addmm(base, cols.T, diffs.data[:n])
    if bool(zeros.all()):
        return base[None].expand(cols.shape[1], -1)
    if bool(ones.all()):
        return full[None].expand(cols.shape[1], -1)
    x = base.new_empty(cols.shape[1], base.shape[0])
    x[zeros] = base
    x[ones] = full
    rest = ~(zeros | ones)
    if bool(rest.any()):
        x[rest] = torch.addmm(base, cols[:, rest].T, diffs.data[:n])
    return x


class MixSenders(torch.autograd.Function):
    """x [R, N] = base + m.T @ D for one receiver group, under autograd.

    D is read from the shared SenderDiffs buffer, so nothing is concatenated or saved per
    group. Backward: d/dm = D @ grad.T. d/dD_s = sum over groups of m[s, g] grad_g: a group's
    uniform columns (every row the same weight: every edge on, or none) add the same vector to
    every row it reads, kept once in `common`; other columns are accumulated row by row in
    `grad`. The blocks first read by this group (`new_diffs`, recorded since the previous
    group, at rows `starts`) get their total here: every later group reads them too and has
    already run its backward, since this group's output feeds every later block."""

    @staticmethod
    def forward(ctx, base, m, diffs, full, starts, *new_diffs):
        unique = unique_columns(m)
        x = mix(diffs, base, full, m if unique is None else unique[0])
        if unique is not None:
            x = x.index_select(0, unique[1])
        elif x._base is not None:  # a view of base or full: the output must be a tensor of its own
            x = x.clone()
        ctx.save_for_backward(m)
        ctx.diffs, ctx.starts, ctx.unique, ctx.group = diffs, starts, unique, diffs.groups
        ctx.sizes = [d.shape[0] for d in new_diffs]
        diffs.groups += 1
        return x

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (m,) = ctx.saved_tensors
        diffs, n, need = ctx.diffs, m.shape[0], ctx.needs_input_grad
        grad_base = grad.sum(0) if need[0] else None
        grad_m = diffs.data[:n] @ grad.T if need[1] else None
        if diffs.last_group is None or ctx.group >= diffs.last_group:  # a new backward pass
            diffs.common = grad.new_zeros(grad.shape[1])
            if diffs.grad is not None:
                diffs.grad.zero_()
        diffs.last_group = ctx.group
        cols, inverse = ctx.unique if ctx.unique is not None else (m, None)
        per_col = grad if inverse is None else \
            grad.new_zeros(cols.shape[1], grad.shape[1]).index_add_(0, inverse, grad)
        cols = cols.detach()
        uniform = (cols == cols[:1]).all(0) if n > 0 else torch.ones(cols.shape[1], dtype=torch.bool)
        if bool(uniform.any()) and n > 0:
            diffs.common.add_(cols[0, uniform] @ per_col[uniform])
        if not bool(uniform.all()):
            if diffs.grad is None:
                diffs.grad = torch.zeros_like(diffs.data)
            diffs.grad[:n].addmm_(cols[:, ~uniform], per_col[~uniform])
        grad_new = [None] * len(ctx.sizes)
        for i, (start, k) in enumerate(zip(ctx.starts, ctx.sizes)):
            if need[5 + i]:
                total = diffs.common.expand(k, -1)
                if diffs.grad is not None:
                    rows = diffs.grad[start: start + k]
                    total = rows + total
                    rows.zero_()
                grad_new[i] = total.contiguous()
        return (grad_base, grad_m, None, None, None, *grad_new)
