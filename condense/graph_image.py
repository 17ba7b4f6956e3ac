"""Pictures of a circuit (`Graph.to_image`): the in-graph edges as a PNG, drawn by graphviz
when its package and `dot` are installed, else by matplotlib. Kept apart from the graph's
tensors so that reading `condense/graph.py` needs no plotting code."""
import torch

from condense.artifacts import atomic_write
from condense.graph_views import Edge, Node

_QKV_COLORS = {"q": "#1f77b4", "k": "#2ca02c", "v": "#9467bd", None: "#444444"}
_ROLE_COLORS = {"functional": "#e4572e", "passthrough": "#76b041", "unimportant": "#dddddd"}


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

