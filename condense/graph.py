"""The computational graph of docs/design.md §1 (MIB / EAP-IG compatible), backed by dense tensors.

Senders (nodes that write to the residual stream), in order: `input`, then per layer l the
heads `a{l}.h{h}` and the MLP `m{l}`. Receivers, in order: per layer l the head inputs
`a{l}.h{h}<q>` (all h), `<k>` (all h), `<v>` (all h), then `m{l}`; finally `logits`.
Edge (s, r) exists when s is written before r reads (`valid[s, r]`); `scores` and `in_graph`
are [n_senders, n_receivers] tensors, and `edges` / `nodes` are lazy name -> view mappings
(condense/graph_views.py), so a graph of a large model costs a few tensors, not millions of
Python objects.

Node masks (for node-level methods): `head_mask` [L, H] and `neuron_mask` [L, d_mlp], all
ones by default; condense.patching mixes clean and ablated values with them.
"""
import gzip
import heapq
import json
import math
import shutil
from typing import Optional

import torch

from condense.artifacts import atomic_write, count_nonfinite, damaged, read_json
from condense.graph_views import EdgeMap, NodeMap
from condense.model_parts import model_shape

QKV = "qkv"


class Graph:
    def __init__(self, shape):
        self.shape = shape
        L, H = shape.n_layers, shape.n_heads
        self.n_layers, self.n_heads = L, H
        self.cfg = dict(n_layers=L, n_heads=H, d_model=shape.d_model, parallel_attn_mlp=False,
                        model_type=shape.model_type, n_key_value_heads=shape.n_kv_heads,
                        d_mlp=shape.d_mlp)
        self.sender_names = ["input"]
        for l in range(L):
            self.sender_names += [f"a{l}.h{h}" for h in range(H)] + [f"m{l}"]
        self.node_names = self.sender_names + ["logits"]
        self.receiver_names, receiver_node, n_before = [], [], []
        for l in range(L):
            for c in QKV:
                self.receiver_names += [f"a{l}.h{h}<{c}>" for h in range(H)]
                receiver_node += [self.head_sender(l, h) for h in range(H)]
                n_before += [self.head_sender(l, 0)] * H
            self.receiver_names.append(f"m{l}")
            receiver_node.append(self.mlp_sender(l))
            n_before.append(self.mlp_sender(l))
        self.receiver_names.append("logits")
        receiver_node.append(len(self.sender_names))
        n_before.append(len(self.sender_names))
        self.n_senders, self.n_receivers = len(self.sender_names), len(self.receiver_names)
        self.sender_index = {n: i for i, n in enumerate(self.sender_names)}
        self.receiver_index = {n: i for i, n in enumerate(self.receiver_names)}
        self.node_index = {n: i for i, n in enumerate(self.node_names)}
        # node index (into node_names) that owns each receiver; logits is the last node
        self.receiver_node = torch.tensor(receiver_node)
        self.valid = torch.arange(self.n_senders)[:, None] < torch.tensor(n_before)[None, :]
        self.scores = torch.zeros(self.n_senders, self.n_receivers)
        self.in_graph = self.valid.clone()
        self.head_mask = torch.ones(L, H)
        self.neuron_mask = torch.ones(L, shape.d_mlp)
        # optional node roles (S3martCirc): name -> role, for heads/MLPs and neurons m{l}.n{i}
        self.roles = {}
        self.edges = EdgeMap(self)
        self.nodes = NodeMap(self)

    @classmethod
    def from_model(cls, model) -> "Graph":
        """Graph of a supported HF model (or peft model / config); reads only the config."""
        return cls(model_shape(model))

    # ------------------------------------------------------------ layout (used by patching)
    def head_sender(self, layer, head):
        return 1 + layer * (self.n_heads + 1) + head

    def mlp_sender(self, layer):
        return 1 + layer * (self.n_heads + 1) + self.n_heads

    def attn_senders(self, layer):
        return slice(self.head_sender(layer, 0), self.mlp_sender(layer))

    def attn_receivers(self, layer):
        """The 3H receivers of layer `layer`'s heads: q (all heads), k (all heads), v (all heads)."""
        start = layer * (3 * self.n_heads + 1)
        return slice(start, start + 3 * self.n_heads)

    def mlp_receiver(self, layer):
        return layer * (3 * self.n_heads + 1) + 3 * self.n_heads

    @property
    def logits_receiver(self):
        return self.n_receivers - 1

    # ------------------------------------------------------------ counting and node state
    @property
    def n_edges(self):
        return int((self.in_graph & self.valid).sum())

    def count_edges(self, on_path: bool = False) -> int:
        """In-graph edges; with on_path=True only those on an input -> logits path (circuit size)."""
        return int(self._on_path().sum()) if on_path else self.n_edges

    def nodes_in_graph(self):
        """Bool [n_nodes]: a node is in the graph when an in-graph edge enters or leaves it."""
        edges = self.in_graph & self.valid
        touched = torch.zeros(len(self.node_names), dtype=torch.long)
        touched[: self.n_senders] = edges.any(1).long()
        touched.index_add_(0, self.receiver_node, edges.any(0).long())
        return touched > 0

    def copy(self) -> "Graph":
        """An independent graph with the same edges, scores and node masks."""
        g = Graph(self.shape)
        g.scores, g.in_graph = self.scores.clone(), self.in_graph.clone()
        g.head_mask, g.neuron_mask = self.head_mask.clone(), self.neuron_mask.clone()
        g.roles = dict(self.roles)
        return g

    def reset(self, in_graph=True):
        self.in_graph = self.valid.clone() if in_graph else torch.zeros_like(self.valid)

    # ------------------------------------------------------------ selecting edges
    def _ranked(self, absolute):
        s = self.scores.abs() if absolute else self.scores.clone()
        return s.masked_fill(~self.valid, float("-inf"))

    def apply_threshold(self, threshold: float, absolute: bool = True) -> None:
        """Keep edges whose (absolute) score is >= threshold."""
        self.in_graph = self.valid & (self._ranked(absolute) >= threshold)

    def apply_topn(self, n: int, absolute: bool = True) -> None:
        """Keep the n highest-scoring edges (by |score| unless absolute=False); n=0 empties."""
        total = int(self.valid.sum())
        if not 0 <= n <= total:
            raise ValueError(f"apply_topn: n={n} outside [0, {total}] (edges in the graph)")
        flat = self._ranked(absolute).flatten()
        self.in_graph = torch.zeros(flat.numel(), dtype=torch.bool)
        self.in_graph[flat.topk(n).indices] = True
        self.in_graph = self.in_graph.view(self.valid.shape) & self.valid

    def apply_greedy(self, n: int, absolute: bool = True) -> None:
        """Grow a graph of n edges from `logits` backwards (EAP-IG's greedy search): repeatedly
        add the best edge into a node already in the graph; its sender joins the graph and
        the sender's own incoming edges become candidates."""
        total = int(self.valid.sum())
        if not 0 <= n <= total:
            raise ValueError(f"apply_greedy: n={n} outside [0, {total}] (edges in the graph)")
        rank = self._ranked(absolute)
        recv_of_node = [[] for _ in self.node_names]
        for r, node in enumerate(self.receiver_node.tolist()):
            recv_of_node[node].append(r)
        heap, joined = [], set()

        def add_candidates(node):
            for r in recv_of_node[node]:
                col = rank[:, r]
                for s in torch.nonzero(self.valid[:, r]).flatten().tolist():
                    heapq.heappush(heap, (-float(col[s]), s, r))

        self.in_graph = torch.zeros_like(self.valid)
        add_candidates(len(self.node_names) - 1)
        for _ in range(n):
            _, s, r = heapq.heappop(heap)
            self.in_graph[s, r] = True
            if s not in joined:
                joined.add(s)
                add_candidates(s)

    # ------------------------------------------------------------ pruning
    def _on_path(self):
        """Bool [S, R]: in-graph edges on some input -> logits path."""
        edges = self.in_graph & self.valid
        n_nodes = len(self.node_names)
        node_of = self.receiver_node
        # forward: nodes reachable from input (senders are topologically ordered)
        fwd = torch.zeros(n_nodes, dtype=torch.bool)
        fwd[0] = True
        for node in range(1, n_nodes):
            recv = node_of == node
            fwd[node] = bool((edges[:, recv] & fwd[: self.n_senders, None]).any())
        # backward: nodes that reach logits
        bwd = torch.zeros(n_nodes, dtype=torch.bool)
        bwd[-1] = True
        for node in range(self.n_senders - 1, -1, -1):
            bwd[node] = bool((edges[node] & bwd[node_of]).any())
        return edges & fwd[: self.n_senders, None] & bwd[node_of][None, :]

    def prune(self) -> "Graph":
        """Drop in-graph edges not on an input -> logits path, repeated to a fixed point."""
        while True:
            kept = self._on_path()
            if torch.equal(kept, self.in_graph & self.valid):
                self.in_graph = kept
                return self
            self.in_graph = kept

    # ------------------------------------------------------------ MIB JSON
    def to_json(self, path) -> None:
        """MIB format: cfg, nodes {name: {in_graph}}, edges {name: {score, in_graph}}; atomic
        write, gzipped when the path ends in .gz."""
        nodes_on = self.nodes_in_graph().tolist()
        d = dict(cfg=self.cfg,
                 nodes={n: {"in_graph": bool(on)} for n, on in zip(self.node_names, nodes_on)},
                 edges={})
        s_idx, r_idx = torch.nonzero(self.valid, as_tuple=True)
        scores = self.scores[s_idx, r_idx].tolist()
        flags = self.in_graph[s_idx, r_idx].tolist()
        for s, r, sc, f in zip(s_idx.tolist(), r_idx.tolist(), scores, flags):
            d["edges"][f"{self.sender_names[s]}->{self.receiver_names[r]}"] = {"score": sc, "in_graph": f}
        if not (bool((self.head_mask == 1).all()) and bool((self.neuron_mask == 1).all())):
            d["node_masks"] = {"heads": self.head_mask.tolist(), "neurons": self.neuron_mask.tolist()}
        for name, role in self.roles.items():  # roles: on node entries; neurons under "neurons"
            if name in d["nodes"]:
                d["nodes"][name]["role"] = role
            else:
                d.setdefault("neurons", {})[name] = {"in_graph": True, "role": role}
        if str(path).endswith(".gz"):  # large graphs: a gzipped file, a fifth of the size
            atomic_write(path, gzip.compress(json.dumps(d).encode(), mtime=0))
        else:
            atomic_write(path, lambda f: json.dump(d, f))

    @classmethod
    def from_json(cls, path, model, data: Optional[dict] = None) -> "Graph":
        """Load a MIB-format graph for `model` (edges absent from the file are out of the
        graph); a path ending in .gz is read as gzipped JSON. `data`: the file's JSON when the
        caller has read it already. A file that is not a circuit of this model's graph raises
        condense.artifacts.DamagedFile naming it."""
        d = read_json(path) if data is None else data
        g = cls.from_model(model)
        g.check_json(d, path)
        g.in_graph = torch.zeros_like(g.valid)
        for name, e in d["edges"].items():
            try:
                s, r = g._parse_edge(name)
            except KeyError as err:
                raise damaged(path, f"{err.args[0]}: a circuit of another graph") from None
            g.scores[s, r] = float(e.get("score", 0.0) if e.get("score") is not None else 0.0)
            g.in_graph[s, r] = e["in_graph"]
        if "node_masks" in d:
            g.head_mask = torch.tensor(d["node_masks"]["heads"], dtype=torch.float)
            g.neuron_mask = torch.tensor(d["node_masks"]["neurons"], dtype=torch.float)
            if g.head_mask.shape != (g.n_layers, g.n_heads) or \
                    g.neuron_mask.shape != (g.n_layers, g.shape.d_mlp):
                raise damaged(path, "its node masks do not fit this model's heads and neurons")
        for entries in (d.get("nodes", {}), d.get("neurons", {})):
            g.roles.update({name: e["role"] for name, e in entries.items()
                            if isinstance(e, dict) and e.get("role") is not None})
        return g

    def check_json(self, d, path="circuit.json"):
        """Refuse a circuit file that is not for this model (check_circuit_json, and its `cfg`:
        model type, layers, heads, widths, must match)."""
        check_circuit_json(d, path)
        cfg = d["cfg"]
        for key, value in self.cfg.items():
            if key in cfg and cfg[key] != value:
                raise damaged(path, f"a circuit for another model ({key}={cfg[key]!r}, this "
                                    f"model has {value!r})",
                              "give the model it was found for (--model), or another circuit")

    def _parse_edge(self, name):
        src, _, dst = name.partition("->")
        if src not in self.sender_index or dst not in self.receiver_index:
            raise KeyError(f"no edge {name!r} in this graph")
        s, r = self.sender_index[src], self.receiver_index[dst]
        if not self.valid[s, r]:
            raise KeyError(f"no edge {name!r}: {src} is written after {dst} reads")
        return s, r

    def to_image(self, path, max_drawn_edges: Optional[int] = None) -> None:
        """Draw the in-graph edges to a PNG: graphviz (python package and `dot`) when both are
        present, else matplotlib. Nodes sit in rows by layer; line width follows |score|. Above
        `max_drawn_edges` (default `graph_image.MAX_DRAWN_EDGES`) edges, a summary instead:
        which heads and MLPs the circuit touches, and its edges counted from layer to layer."""
        try:
            import graphviz
        except ImportError:
            graphviz = None
        from condense.graph_image import MAX_DRAWN_EDGES, draw_graphviz, draw_matplotlib, draw_summary
        limit = MAX_DRAWN_EDGES if max_drawn_edges is None else max_drawn_edges
        if self.count_edges() > limit:
            draw_summary(self, path)
        elif graphviz is not None and shutil.which("dot"):
            draw_graphviz(self, path, graphviz)
        else:
            draw_matplotlib(self, path)

    def __repr__(self):
        return (f"Graph({self.cfg['model_type']}, {self.n_layers} layers x {self.n_heads} heads, "
                f"{self.n_edges}/{int(self.valid.sum())} edges in graph)")


def check_circuit_json(d, path="circuit.json") -> None:
    """Refuse, before any model loads, JSON that is not a whole circuit file (MIB format:
    `cfg`, and `edges` whose in_graph is true or false), or whose edge scores or node masks hold
    NaN/Inf: condense.artifacts.DamagedFile naming the file, what is wrong and what to do."""
    if not isinstance(d, dict) or not isinstance(d.get("edges"), dict):
        raise damaged(path, "not a circuit file (no edges)")
    if not isinstance(d.get("cfg"), dict):
        raise damaged(path, "no cfg: cannot tell which model the circuit is for")
    edges = d["edges"]
    for name, e in edges.items():
        if not isinstance(e, dict) or not isinstance(e.get("in_graph"), bool):
            raise damaged(path, f"edge {name}: in_graph must be true or false, got "
                                f"{e.get('in_graph') if isinstance(e, dict) else e!r}")
    scores = [e.get("score") for e in edges.values()]
    bad = sum(1 for v in scores if v is not None and not (
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)))
    if bad:
        raise damaged(path, f"{bad:,} of its {len(edges):,} edge scores are NaN, Inf or not numbers")
    masks = d.get("node_masks")
    if masks is not None:
        if not isinstance(masks, dict) or not {"heads", "neurons"} <= set(masks):
            raise damaged(path, "node_masks without its heads and neurons")
        bad = count_nonfinite(masks)
        if bad:
            raise damaged(path, f"{bad:,} of its node mask values are NaN or Inf")
