"""Pictures of a circuit (`Graph.to_image`): the in-graph edges as a PNG, drawn by graphviz
when its package and `dot` are installed, else by matplotlib; above `MAX_DRAWN_EDGES` edges a
summary instead (which nodes the circuit touches, and how many of its edges run from each layer
to each later one), because thousands of lines drawn one by one make an image of several MB
that nobody can read. Kept apart from the graph's tensors so that reading `condense/graph.py`
needs no plotting code."""
import torch

from condense.artifacts import atomic_write
from condense.graph_views import Edge, Node

_QKV_COLORS = {"q": "#1f77b4", "k": "#2ca02c", "v": "#9467bd", None: "#444444"}
_ROLE_COLORS = {"functional": "#e4572e", "passthrough": "#76b041", "unimportant": "#dddddd"}
MAX_DRAWN_EDGES = 300  # above this many edges `Graph.to_image` draws `draw_summary`


def _node_color(graph, index):
    """Fill colour: input/logits gold, else the node's role colour (graph.roles), else grey."""
    name = graph.node_names[index]
    if name in ("input", "logits"):
        return "#ffcc66"
    return _ROLE_COLORS.get(graph.roles.get(name), "#dddddd")


def _drawn_edges(graph):
    """(edges in graph, their |score| scaled to line widths 0.4..4)."""
    edges = [Edge(graph, s, r) for s, r in torch.nonzero(graph.in_graph & graph.valid).tolist()]
    mags = torch.tensor([abs(e.score) for e in edges]) if edges else torch.zeros(0)
    top = float(mags.max()) if len(edges) and float(mags.max()) > 0 else 1.0
    return edges, (0.4 + 3.6 * mags / top).tolist()


def _node_xy(graph, index):
    """Row = layer position (input 0, heads of layer l at 2l+1, m{l} at 2l+2, logits last)."""
    node = Node(graph, index)
    H = graph.n_heads
    if node.kind == "input":
        return (H - 1) / 2, 0.0
    if node.kind == "logits":
        return (H - 1) / 2, 2.0 * graph.n_layers + 1
    if node.kind == "attention":
        return float(node.head), 2.0 * node.layer + 1
    return (H - 1) / 2, 2.0 * node.layer + 2


def draw_matplotlib(graph, path) -> None:
    """The circuit with matplotlib: nodes in rows by layer (heads side by side), lines coloured by
    the receiver's q/k/v input."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection

    edges, widths = _drawn_edges(graph)
    shown = sorted({e.s for e in edges} | {int(graph.receiver_node[e.r]) for e in edges})
    xy = {i: _node_xy(graph, i) for i in shown}
    fig, ax = plt.subplots(figsize=(max(6, graph.n_heads * 0.9), max(4, graph.n_layers * 1.2)))
    segments = [(xy[e.s], xy[int(graph.receiver_node[e.r])]) for e in edges]
    colors = [_QKV_COLORS[e.qkv] for e in edges]
    ax.add_collection(LineCollection(segments, linewidths=widths, colors=colors, alpha=0.6, zorder=1))
    for i in shown:
        x, y = xy[i]
        kind = Node(graph, i).kind
        ax.scatter([x], [y], s=500, zorder=2, marker="s" if kind == "mlp" else "o",
                   c=_node_color(graph, i), edgecolors="black")
        ax.annotate(graph.node_names[i], (x, y), ha="center", va="center", fontsize=6, zorder=3)
    for c in "qkv":
        ax.plot([], [], color=_QKV_COLORS[c], label=f"into <{c}>")
    ax.plot([], [], color=_QKV_COLORS[None], label="into MLP / logits")
    for role in sorted(set(graph.roles.values()) & set(_ROLE_COLORS)):
        ax.scatter([], [], s=60, c=_ROLE_COLORS[role], edgecolors="black", label=role)
    ax.legend(loc="upper left", fontsize=7)
    ax.set_xlim(-1, graph.n_heads)
    ax.set_ylim(-1, 2 * graph.n_layers + 2)
    ax.set_axis_off()
    ax.set_title(f"{graph.count_edges()} edges")
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=120), "wb")
    plt.close(fig)


def draw_graphviz(graph, path, graphviz) -> None:
    """The circuit laid out by graphviz's `dot`, one rank per layer row."""
    edges, widths = _drawn_edges(graph)
    dot = graphviz.Digraph(graph_attr={"rankdir": "BT", "splines": "true"})
    shown = sorted({e.s for e in edges} | {int(graph.receiver_node[e.r]) for e in edges})
    rows = {}
    for i in shown:
        rows.setdefault(_node_xy(graph, i)[1], []).append(i)
    for row in rows.values():
        with dot.subgraph() as sub:
            sub.attr(rank="same")
            for i in row:
                fill = dict(style="filled", fillcolor=_node_color(graph, i)) if graph.roles else {}
                sub.node(graph.node_names[i], shape="box" if Node(graph, i).kind == "mlp" else "ellipse",
                         **fill)
    for e, w in zip(edges, widths):
        dot.edge(graph.node_names[e.s], graph.node_names[int(graph.receiver_node[e.r])],
                 penwidth=f"{w:.2f}", color=_QKV_COLORS[e.qkv])
    data = dot.pipe(format="png")
    atomic_write(path, data)



def node_degrees(graph) -> torch.Tensor:
    """[n_layers, n_heads + 1]: in-graph edges into or out of each head (columns 0..H-1) and
    each layer's MLP (last column); input and logits are left out (every circuit has them)."""
    edges = graph.in_graph & graph.valid
    per_node = torch.zeros(len(graph.node_names), dtype=torch.long)
    per_node[: graph.n_senders] = edges.sum(1)
    per_node.index_add_(0, graph.receiver_node, edges.sum(0))
    grid = torch.zeros(graph.n_layers, graph.n_heads + 1, dtype=torch.long)
    for layer in range(graph.n_layers):
        for head in range(graph.n_heads):
            grid[layer, head] = per_node[graph.head_sender(layer, head)]
        grid[layer, graph.n_heads] = per_node[graph.mlp_sender(layer)]
    return grid


def layer_edge_counts(graph) -> torch.Tensor:
    """[n_layers + 1, n_layers + 1]: in-graph edges by sender row (0 = input, 1 + l = layer l)
    and receiver column (l = layer l, n_layers = logits)."""
    L = graph.n_layers
    sender_row = torch.tensor([Node(graph, i).layer + 1 for i in range(graph.n_senders)])
    receiver_col = torch.tensor([Node(graph, int(n)).layer for n in graph.receiver_node])
    s, r = torch.nonzero(graph.in_graph & graph.valid, as_tuple=True)
    flat = sender_row[s] * (L + 1) + receiver_col[r]
    return torch.bincount(flat, minlength=(L + 1) ** 2).reshape(L + 1, L + 1)


def draw_summary(graph, path) -> None:
    """A circuit too large to draw edge by edge: left, each head and MLP coloured by how many of
    the circuit's edges touch it (blank: not in the circuit); right, the circuit's edges counted
    from each layer to each later one. Log colour scales, since counts span orders of magnitude."""
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    degrees, counts = node_degrees(graph).double(), layer_edge_counts(graph).double()
    L, H = graph.n_layers, graph.n_heads
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, max(4.5, L * 0.22 + 1.5)),
                                      gridspec_kw=dict(width_ratios=[H + 1 + 2, L + 1]))
    norm = LogNorm(vmin=1, vmax=max(2.0, float(degrees.max())))
    shown = left.imshow(degrees.masked_fill(degrees == 0, float("nan")).numpy(), origin="lower",
                        aspect="auto", cmap="viridis", norm=norm, interpolation="nearest")
    left.set_xticks(range(H + 1), [str(h) for h in range(H)] + ["MLP"], fontsize=7)
    left.set_xlabel("head")
    left.set_ylabel("layer")
    nodes = int((degrees > 0).sum())
    left.set_title(f"{nodes} of {L * (H + 1)} heads and MLPs touched", fontsize=9)
    fig.colorbar(shown, ax=left, label="edges into or out of the node", shrink=0.8)
    norm = LogNorm(vmin=1, vmax=max(2.0, float(counts.max())))
    shown = right.imshow(counts.masked_fill(counts == 0, float("nan")).numpy(), origin="lower",
                         aspect="auto", cmap="magma_r", norm=norm, interpolation="nearest")
    ticks = list(range(0, L + 1, max(1, (L + 1) // 8)))
    right.set_yticks(ticks, ["input" if t == 0 else str(t - 1) for t in ticks], fontsize=7)
    right.set_xticks(ticks, ["logits" if t == L else str(t) for t in ticks], fontsize=7)
    right.set_ylabel("sender layer")
    right.set_xlabel("receiver layer")
    right.set_title("edges from layer to layer", fontsize=9)
    fig.colorbar(shown, ax=right, label="edges", shrink=0.8)
    fig.suptitle(f"{graph.count_edges()} edges (too many to draw one by one)")
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110), "wb")
    plt.close(fig)
