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
