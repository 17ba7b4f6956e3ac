"""Mean ablation's reference values: the plain model's mean sender outputs, head z and MLP
hidden units over a reference set, per position for each reference length and over all
positions. `run_graph(..., intervention="mean", means=compute_means(model, graph, rows))`
lets a removed edge carry these means instead of a corrupted run's values."""
from dataclasses import dataclass

import torch

from condense.metrics import pad_batch
from condense.patching import (SenderValues, at_least_fp32, block_slices, checked_parts,
                               decomposed_forward)


@dataclass
class SenderMeans:
    """Mean sender outputs / head z / MLP hidden over a reference set: per position for each
    reference length (`by_length[n]` = (senders [S, n, D], z [L, n, H, dh], hidden [L, n, d_mlp]))
    and over all real positions (`overall`, same without the position dim)."""
    by_length: dict
    overall: tuple

    def values(self, graph, lengths, T):
        """SenderValues for a batch whose rows have `lengths` (padded to T): a row uses the
        per-position mean of its own length when the reference has that length, else (and at
        padding) the mean over positions."""
        S_all, z_all, h_all = self.overall
        use = [int(n) in self.by_length for n in lengths.tolist()]
        if not any(use):
            tensors = (S_all[:, None, None], z_all[:, None, None], h_all[:, None, None])
        else:
            rows = []
            for n, has in zip(lengths.tolist(), use):
                row = [t[:, None].expand(t.shape[0], T, *t.shape[1:]).clone() for t in self.overall]
                if has:
                    for full, part in zip(row, self.by_length[int(n)]):
                        full[:, :n] = part
                rows.append(row)
            tensors = tuple(torch.stack(col, 1) for col in zip(*rows))  # [S|L, B, T, ...]
        senders, z, hidden = tensors
        blocks = [senders[sl] for sl in block_slices(graph)]
        return SenderValues(blocks, list(z), list(hidden))


@torch.no_grad()
def compute_means(model: torch.nn.Module, graph, sequences, batch_size: int = 32,
                  per_position: bool = True) -> SenderMeans:
    """Mean sender outputs of the plain model over `sequences` (lists of token ids)."""
    parts = checked_parts(model, graph)
    device = next(model.parameters()).device
    sums, counts, total, n_total = {}, {}, None, 0
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    for start in range(0, len(order), batch_size):
        ids, mask, lengths = pad_batch([list(sequences[i]) for i in order[start:start + batch_size]])
        _, vals, _ = decomposed_forward(parts, graph, ids.to(device), mask.to(device), keep_hidden=True,
                                        compute_logits=False)
        wide = at_least_fp32(vals.blocks[0].dtype)  # accumulate bf16 models' means in fp32
        senders = vals.stacked().to(wide)                                   # [S, B, T, D]
        z = torch.stack(vals.z).to(wide)                                    # [L, B, T, H, dh]
        hidden = torch.stack(vals.hidden).to(wide)                          # [L, B, T, d_mlp]
        real = mask.to(device).bool()
        flat = [t.movedim(0, 2)[real] for t in (senders, z, hidden)]        # [n_real, S|L, ...]
        sums_all = [f.sum(0) for f in flat]
        total = sums_all if total is None else [a + b for a, b in zip(total, sums_all)]
        n_total += int(real.sum())
        if per_position:
            for b, n in enumerate(lengths.tolist()):
                row = [t[:, b, :n] for t in (senders, z, hidden)]
                sums[n] = row if n not in sums else [a + r for a, r in zip(sums[n], row)]
                counts[n] = counts.get(n, 0) + 1
    dtype = next(model.parameters()).dtype
    overall = tuple((t / n_total).to(dtype) for t in total)
    by_length = {n: tuple((t / counts[n]).to(dtype) for t in s) for n, s in sums.items()}
    return SenderMeans(by_length, overall)
