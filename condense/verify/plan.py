"""What the sparse subset evaluator (condense/verify/subsets.py) recomputes per subset: the
circuit nodes, the circuit edges each depends on (its cone), and whether it is needed at
every position or only at the last.

A circuit node is a head or MLP that a circuit edge enters and one leaves. Where a layer
normalises the sum of its heads (Gemma2/3's post-attention RMSNorm) one head's output depends
on every head of that layer, so the layer's heads are planned as one `HeadGroup`: its members
are the heads that circuit edges enter (their z varies with the subset), its outputs the
heads that circuit edges leave, and every output depends on the whole group's cone.
"""
from dataclasses import dataclass, field


@dataclass
class Node:
    """A head or MLP recomputed per setting of its cone."""
    sender: int
    layer: int
    head: int | None                 # None for an MLP
    receivers: list                  # graph receiver indices it reads: (q, k, v) or (mlp,)
    cone: list = field(default_factory=list)   # circuit-edge indices its output depends on
    receiver_cones: list = field(default_factory=list)  # the same per receiver (q, k, v differ)
    all_positions: bool = True       # False: its output is only ever read at the last position

    @property
    def senders(self):
        return [self.sender]

    @property
    def is_mlp(self):
        return self.head is None

    @property
    def members(self):
        return [self]


@dataclass
class HeadGroup:
    """The heads of one layer whose outputs share one normalisation of their sum."""
    layer: int
    members: list                    # Node per head that a circuit edge enters
    senders: list                    # the layer's head senders that a circuit edge leaves
    heads: dict                      # sender -> head index, for `senders`
    cone: list = field(default_factory=list)
    all_positions: bool = True
    is_mlp = False


def node_receivers(graph, s):
    """Sender s (a head or an MLP) -> (layer, head or None, the receivers it reads)."""
    node = graph.nodes[graph.sender_names[s]]  # sender s is node s
    layer, h = node.layer, node.head
    if h is None:
        return layer, None, [graph.mlp_receiver(layer)]
    start = graph.attn_receivers(layer).start
    return layer, h, [start + c * graph.n_heads + h for c in range(3)]


def plan(graph, edges, into, out_of, grouped_heads=False):
    """The units (Node or HeadGroup) to recompute, in topological order. `edges` lists the
    circuit edges (sender, receiver) in bit order, `into` / `out_of` map a receiver / sender to
    the indices of its circuit edges; `grouped_heads`: the model normalises each layer's heads
    together (then a layer's heads form one HeadGroup)."""
    enters = lambda receivers: any(r in into for r in receivers)  # noqa: E731
    units, owner = [], {}            # owner: sender -> the unit whose output it is
    unit_of_member = {}              # sender of any computed head or MLP -> its unit
    layer_heads = {}
    for s in range(1, graph.n_senders):
        layer, head, receivers = node_receivers(graph, s)
        if head is not None and grouped_heads:
            layer_heads.setdefault(layer, []).append((s, head, receivers))
            if head == graph.n_heads - 1:  # the layer's last head: plan the group
                members = [Node(t, layer, h, rs) for t, h, rs in layer_heads[layer] if enters(rs)]
                outputs = [(t, h) for t, h, _ in layer_heads[layer] if t in out_of]
                if members and outputs:
                    group = HeadGroup(layer, members, [t for t, _ in outputs], dict(outputs))
                    units.append(group)
                    owner.update({t: group for t, _ in outputs})
                    unit_of_member.update({m.sender: group for m in members})
            continue
        if s in out_of and enters(receivers):
            node = Node(s, layer, head, receivers)
            units.append(node)
            owner[s] = unit_of_member[s] = node
    for unit in units:  # senders come in topological order
        for node in unit.members:
            for r in node.receivers:
                cone = set()
                for i in into.get(r, []):
                    src = edges[i][0]
                    cone |= {i} | set(owner[src].cone if src in owner else ())
                node.receiver_cones.append(sorted(cone))
            node.cone = sorted(set().union(*node.receiver_cones))
        unit.cone = sorted(set().union(*(m.cone for m in unit.members)))
    for unit in reversed(units):  # readers come after their senders
        unit.all_positions = False
        for s in unit.senders:
            for i in out_of[s]:
                r = edges[i][1]
                reader_node = int(graph.receiver_node[r])
                reader = unit_of_member.get(reader_node)
                if reader is None:
                    continue  # the logits (last position) or a node whose output nobody reads
                q = next(m.receivers[0] for m in reader.members if m.sender == reader_node)
                kv = not reader.is_mlp and r != q  # keys and values: every position
                if kv or reader.all_positions:
                    unit.all_positions = True
        for m in unit.members:
            m.all_positions = unit.all_positions
    return units


def reads_last_only(node, r):
    """Whether receiver r of `node` (None: the logits) is only needed at the last position."""
    if node is None:
        return True  # the logits
    if node.head is not None and r != node.receivers[0]:
        return False  # keys and values are read at every position
    return not node.all_positions
