"""verify's pictures: faithfulness against subset size, and the pairwise interaction heatmap."""
import io
import math

import torch

from condense.verify.analysis import subset_sizes

def _save(fig, path):
    from condense.artifacts import atomic_write
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    atomic_write(path, buf.getvalue())


def plot_subsets(path, f, minimal, n, threshold, title=""):
    """Faithfulness against subset size: a box per size, a sample of subsets as dots, the
    minimal faithful subsets as red stars, the threshold as a dashed line."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    sizes = subset_sizes(n)
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * (n + 1) + 2), 4.5))
    groups = [f[sizes == k] for k in range(n + 1)]
    groups = [g[~torch.isnan(g)].numpy() for g in groups]
    ax.boxplot(groups, positions=list(range(n + 1)), widths=0.6, showfliers=False)
    gen = torch.Generator().manual_seed(0)
    sample = torch.randperm(len(f), generator=gen)[:20000]
    jitter = (torch.rand(len(sample), generator=gen) - 0.5) * 0.5
    ax.scatter((sizes[sample] + jitter).numpy(), f[sample].numpy(), s=3, alpha=0.25, color="tab:blue",
               label="subsets" + (" (sample of 20,000)" if len(f) > 20000 else ""))
    idx = torch.nonzero(minimal).flatten()
    if len(idx):
        ax.scatter(sizes[idx].numpy(), f[idx].numpy(), marker="*", s=60, color="tab:red", zorder=3,
                   label=f"minimal faithful ({len(idx)})")
    ax.axhline(threshold, color="grey", ls="--", lw=0.8, label=f"threshold {threshold:g}")
    ax.set_xlabel("edges in the subset")
    ax.set_ylabel("faithfulness f(S)")
    ax.set_title(title or f"all {2 ** n:,} subsets of a {n}-edge circuit", fontsize=9)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


# The heatmap labels and boxes each edge up to this many edges (a figure of about 22 inches);
# a larger circuit (--local on hundreds of edges) gets the same size without them, not a
# figure that grows with n (0.32 inch an edge: 150 inches at 470 edges).
MAX_LABELLED_EDGES = 60


def plot_pairs(path, report):
    """Heatmap of (Δij - Δi - Δj) / |m(C) - m(∅)|; interacting pairs are boxed."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    n, names, scale = report["n_edges"], report["edges"], report["pair_scale"] or 1.0
    if n < 2:
        fig, ax = plt.subplots(figsize=(4, 2))
        ax.text(0.5, 0.5, f"{n} edge(s): no pairs", ha="center", va="center")
        ax.set_axis_off()
        _save(fig, path)
        plt.close(fig)
        return
    grid = torch.full((n, n), math.nan)
    for p in report["pairs"]:
        grid[p["i"], p["j"]] = grid[p["j"], p["i"]] = p["interaction"] / scale
    top = max(float(grid[~torch.isnan(grid)].abs().max()), report["tau"])
    labelled = n <= MAX_LABELLED_EDGES
    side = max(5, 0.32 * n + 3) if labelled else 0.32 * MAX_LABELLED_EDGES + 3
    fig, ax = plt.subplots(figsize=(side + 1.5, side))
    im = ax.imshow(grid.numpy(), cmap="RdBu_r", vmin=-top, vmax=top)
    if labelled:  # beyond, a box and a label per edge would be smaller than a pixel
        for p in report["pairs"]:
            if p["interacts"]:
                for a, b in ((p["i"], p["j"]), (p["j"], p["i"])):
                    ax.add_patch(Rectangle((b - 0.5, a - 0.5), 1, 1, fill=False, lw=1.2, ec="black"))
        labels = [f"{nm} ({report['partners'][nm]})" for nm in names]
        ax.set_xticks(range(n), labels, rotation=90, fontsize=6)
        ax.set_yticks(range(n), labels, fontsize=6)
    else:
        ax.set_xlabel("edge (verify.json's order)")
        ax.set_ylabel("edge")
    fig.colorbar(im, ax=ax, shrink=0.8, label="(Δij − Δi − Δj) / |m(C) − m(∅)|")
    ax.set_title(f"pairwise ablation: {report['n_interacting_pairs']} of {len(report['pairs'])} pairs "
                 f"interact ({'boxed, ' if labelled else ''}τ = {report['tau']:g})\n"
                 + ("labels: edge (interaction partners); " if labelled else "")
                 + f"median partners {report['partners_median']}", fontsize=8)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def plot_removals(path, report):
    """`--local --singles`: the circuit's faithfulness and accuracy without each of its edges,
    the edges sorted from the removal that costs most; removals that pass are orange, the
    circuit itself and the criterion's bounds are lines. A picture that scales to thousands of
    edges, where the pairs' heatmap cannot."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    names, passing = report["edges"], set(report["removable_edges"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, circuit, bound, label in (
            (axes[0], "faithfulness_without_edge", report["faithfulness_circuit"],
             report["threshold"], "faithfulness f(C without the edge)"),
            (axes[1], "accuracy_without_edge", report["accuracy_circuit"],
             report["accuracy_floor"], "accuracy of C without the edge")):
        values = report[key]  # (with --max-removals, only the edges checked)
        order = sorted(values, key=lambda e: values[e])
        ax.scatter(range(len(order)), [values[e] for e in order], s=6,
                   c=["tab:orange" if e in passing else "tab:blue" for e in order])
        ax.axhline(circuit, color="black", lw=0.8, label=f"the circuit ({circuit:.3f})")
        if bound is not None:
            ax.axhline(bound, color="grey", ls="--", lw=0.8, label=f"criterion's bound {bound:.3f}")
        ax.set_xlabel("edges, from the removal that costs most")
        ax.set_ylabel(label)
        ax.legend(fontsize=7, loc="lower right")
    checked = len(report["faithfulness_without_edge"])
    of = f"{checked:,}" if checked == len(names) else f"the first {checked:,} (of {len(names):,})"
    fig.suptitle(f"{len(passing)} of {of} one-edge removals pass (orange); "
                 f"{report['criterion']} criterion", fontsize=9)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
