"""Lightweight views on a `condense.graph.Graph`: `Node` and `Edge` hold only the graph and
their indices and read names, scores and membership from its tensors, so that
`graph.edges[name]` and `graph.nodes[name]` (the `EdgeMap` and `NodeMap` here) cost nothing
until used, even on a model with millions of edges."""
from collections.abc import Mapping

import torch


class Node:
    __slots__ = ("graph", "index")

    def __init__(self, graph, index):
        self.graph, self.index = graph, index

    @property
    def name(self):
        return self.graph.node_names[self.index]

    @property
    def kind(self):
        n = self.name
        if n in ("input", "logits"):
            return n
        return "attention" if n[0] == "a" else "mlp"

    @property
    def layer(self):
        """-1 for input, n_layers for logits."""
        n = self.name
        if n in ("input", "logits"):
            return -1 if n == "input" else self.graph.n_layers
        return int(n[1:].split(".")[0])

    @property
    def head(self):
        return int(self.name.split(".h")[1]) if self.kind == "attention" else None

    @property
    def in_graph(self):
        return bool(self.graph.nodes_in_graph()[self.index])

    @property
    def parent_edges(self):
        g = self.graph
        recv = torch.nonzero(g.receiver_node == self.index).flatten().tolist()
        return [Edge(g, s, r) for r in recv for s in torch.nonzero(g.valid[:, r]).flatten().tolist()]

    @property
    def child_edges(self):
        g = self.graph
        if self.index >= g.n_senders:
            return []
        return [Edge(g, self.index, r) for r in torch.nonzero(g.valid[self.index]).flatten().tolist()]

    @property
    def mask(self):
        """Head: its scalar mask (0-d view); MLP: its neuron mask row; else None."""
        if self.kind == "attention":
            return self.graph.head_mask[self.layer, self.head]
        if self.kind == "mlp":
            return self.graph.neuron_mask[self.layer]
        return None

    def __eq__(self, other):
        return isinstance(other, Node) and other.graph is self.graph and other.index == self.index

    def __hash__(self):
        return hash((id(self.graph), self.index))

    def __repr__(self):
        return f"Node({self.name})"


class Edge:
    __slots__ = ("graph", "s", "r")

    def __init__(self, graph, s, r):
        self.graph, self.s, self.r = graph, s, r

    @property
    def name(self):
        return f"{self.graph.sender_names[self.s]}->{self.graph.receiver_names[self.r]}"

    @property
    def parent(self):
        return Node(self.graph, self.s)

    @property
    def child(self):
        return Node(self.graph, int(self.graph.receiver_node[self.r]))

    @property
    def qkv(self):
        dst = self.graph.receiver_names[self.r]
        return dst[-2] if dst.endswith(">") else None

    @property
    def score(self):
        return float(self.graph.scores[self.s, self.r])

    @score.setter
    def score(self, value):
        self.graph.scores[self.s, self.r] = value

    @property
    def in_graph(self):
        return bool(self.graph.in_graph[self.s, self.r])

    @in_graph.setter
    def in_graph(self, value):
        self.graph.in_graph[self.s, self.r] = bool(value)

    def __repr__(self):
        return f"Edge({self.name}, score={self.score:.4g}, in_graph={self.in_graph})"


class EdgeMap(Mapping):
    """name -> Edge over every edge of the graph (in or out of the circuit)."""

    def __init__(self, graph):
        self.graph = graph

    def __getitem__(self, name):
        return Edge(self.graph, *self.graph._parse_edge(name))

    def __contains__(self, name):
        try:
            self.graph._parse_edge(name)
            return True
        except (KeyError, AttributeError):
            return False

    def _pairs(self):
        s_idx, r_idx = torch.nonzero(self.graph.valid, as_tuple=True)
        return zip(s_idx.tolist(), r_idx.tolist())

    def __iter__(self):
        g = self.graph
        return (f"{g.sender_names[s]}->{g.receiver_names[r]}" for s, r in self._pairs())

    def __len__(self):
        return int(self.graph.valid.sum())

    def values(self):
        return [Edge(self.graph, s, r) for s, r in self._pairs()]

    def items(self):
        return [(e.name, e) for e in self.values()]


class NodeMap(Mapping):
    def __init__(self, graph):
        self.graph = graph

    def __getitem__(self, name):
        return Node(self.graph, self.graph.node_index[name])

    def __iter__(self):
        return iter(self.graph.node_names)

    def __len__(self):
        return len(self.graph.node_names)
