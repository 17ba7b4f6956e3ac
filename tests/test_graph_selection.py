"""Graph verbs on a scored graph (no model run): top-n, threshold and greedy selection,
pruning to input -> logits paths, the JSON round trip (plain and gzipped) and the picture."""
import gzip
import json

import pytest
import torch

from condense.graph import Graph

from .tiny import CONFIGS


def _scored_graph(seed=0):
    g = Graph.from_model(CONFIGS["llama"]())
    g.scores = torch.randn(g.scores.shape, generator=torch.Generator().manual_seed(seed))
    return g


def test_topn_threshold_greedy():
    g = _scored_graph()
    g.apply_topn(0)
    assert g.n_edges == 0
    g.apply_topn(17)
    assert g.n_edges == 17
    kept = g.scores.abs()[g.in_graph]
    assert kept.min() >= g.scores.abs()[g.valid & ~g.in_graph].max()
    g.apply_topn(5, absolute=False)
    assert (g.scores[g.in_graph] >= g.scores[g.valid & ~g.in_graph].max()).all()
    g.apply_threshold(1.5)
    assert g.n_edges == int((g.scores.abs()[g.valid] >= 1.5).sum())
    g.apply_greedy(25)
    assert g.n_edges == 25
    on = g.nodes_in_graph()
    for e in (e for e in g.edges.values() if e.in_graph):  # grown from logits backwards
        assert on[int(g.receiver_node[e.r])] and (e.child.name == "logits" or any(
            c.in_graph for c in e.child.child_edges))
    with pytest.raises(ValueError):
        g.apply_topn(len(g.edges) + 1)


def test_prune_json_round_trip_and_image(tmp_path):
    g = _scored_graph(1)
    g.apply_topn(30)
    before = g.n_edges
    g.prune()
    assert g.count_edges() <= before and g.count_edges() == g.count_edges(on_path=True)
    for node in g.nodes.values():
        if node.in_graph and node.name not in ("input", "logits"):
            assert any(e.in_graph for e in node.parent_edges), node
            assert any(e.in_graph for e in node.child_edges), node
    g.head_mask[1, 2] = 0.5
    path = tmp_path / "circuit.json"
    g.to_json(path)
    d = json.loads(path.read_text())
    assert set(d) >= {"cfg", "nodes", "edges"} and d["cfg"]["n_layers"] == 2
    assert d["edges"]["input->a0.h1<q>"].keys() == {"score", "in_graph"}
    assert all(set(v) == {"in_graph"} for v in d["nodes"].values())
    h = Graph.from_json(path, CONFIGS["llama"]())
    assert torch.equal(h.in_graph, g.in_graph) and torch.equal(h.scores[g.valid], g.scores[g.valid])
    assert torch.equal(h.head_mask, g.head_mask)
    g.to_json(tmp_path / "circuit.json.gz")  # gzipped, for large graphs
    assert json.loads(gzip.decompress((tmp_path / "circuit.json.gz").read_bytes())) == d
    z = Graph.from_json(tmp_path / "circuit.json.gz", CONFIGS["llama"]())
    assert torch.equal(z.in_graph, g.in_graph) and torch.equal(z.scores, h.scores)
    image = tmp_path / "circuit.png"
    g.to_image(image)
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_large_circuit_picture_counts_nodes_and_layer_pairs(tmp_path, monkeypatch):
    """Above max_drawn_edges the picture is the summary, and its two tables match a count over
    the edges' own names."""
    from condense import graph_image
    g = _scored_graph(1)
    g.apply_topn(60)
    degrees, counts = graph_image.node_degrees(g), graph_image.layer_edge_counts(g)
    want_deg = torch.zeros_like(degrees)
    want_counts = torch.zeros_like(counts)
    layer_of = lambda n: -1 if n == "input" else g.n_layers if n == "logits" else int(n[1:].split(".")[0])
    for name, edge in g.edges.items():
        if not edge.in_graph:
            continue
        src, dst = name.split("->")
        dst = dst.split("<")[0]
        for node in (src, dst):
            if node not in ("input", "logits"):
                col = int(node.split(".h")[1]) if node[0] == "a" else g.n_heads
                want_deg[layer_of(node), col] += 1
        want_counts[layer_of(src) + 1, layer_of(dst)] += 1
    assert torch.equal(degrees, want_deg) and torch.equal(counts, want_counts)
    assert int(counts.sum()) == 60 and int(degrees.sum()) > 0

    drawn = []
    monkeypatch.setattr(graph_image, "draw_summary",
                        lambda graph, path: drawn.append("summary") or graph_image.draw_matplotlib(graph, path))
    g.to_image(tmp_path / "small.png", max_drawn_edges=60)
    assert drawn == []
    g.to_image(tmp_path / "large.png", max_drawn_edges=59)
    assert drawn == ["summary"]
    monkeypatch.undo()
    g.to_image(tmp_path / "summary.png", max_drawn_edges=0)
    assert (tmp_path / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
