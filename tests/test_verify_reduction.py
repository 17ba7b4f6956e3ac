"""`condense verify --local` on a reducible circuit reduces it greedily to a passing subset that
no single edge can leave (condense.verify.local.greedy_reduction); checked against the
exhaustive subset table on tiny models."""
import pytest
import torch

from condense.verify.local import greedy_reduction, smallest_within
from condense.verify.run import verify_circuit

from .test_verify import (MIXED_CIRCUIT, REDUNDANT, circuit, one_thread,  # noqa: F401
                          random_model, random_rows, redundant_model, redundant_rows)


def test_greedy_reduction_takes_the_most_faithful_passing_removal():
    """Four edges, f = the sum of per-edge weights; a subset passes at f >= 0.5. From {0,1,2,3}
    the greedy path drops the edge that keeps f highest (3, then 2, then 1) and stops at {0}."""
    weight = torch.tensor([0.6, 0.2, 0.1, 0.05], dtype=torch.float64)
    calls = []

    def evaluate(masks):
        calls.append(len(masks))
        f = masks.double() @ weight
        return f, f  # (ld, accuracy): f itself stands for both here

    def passes(ld, accuracy):
        return ld, ld >= 0.5

    kept, removals, evaluated = greedy_reduction(evaluate, 4, passes)
    assert kept.tolist() == [True, False, False, False]
    assert [i for i, _, _ in removals] == [3, 2, 1]
    assert evaluated == sum(calls) == 4 + 3 + 2 + 1  # the last step finds no passing removal
    first = evaluate(torch.tensor([[False, True, True, True], [True, False, True, True],
                                   [True, True, False, True], [True, True, True, False]]))
    _, removals_reused, evaluated_reused = greedy_reduction(evaluate, 4, passes, first=first)
    assert removals_reused == removals and evaluated_reused == evaluated - 4


def test_every_subset_of_a_one_minimal_subset_can_hold_a_smaller_passing_one():
    """f is not monotone: {0, 1, 2} passes, no two-edge subset does, {0} does. Every subset of
    it finds {0}, a minimal passing subset, and says {0, 1, 2} is not minimal."""
    f_of = {(0, 1, 2): 1.0, (0,): 0.8}

    def evaluate(masks):
        f = torch.tensor([f_of.get(tuple(m.nonzero().flatten().tolist()), 0.1) for m in masks],
                         dtype=torch.float64)
        return f, f

    def passes(ld, accuracy):
        return ld, ld >= 0.5

    smallest, kept_minimal, checked = smallest_within(evaluate, torch.ones(3, dtype=torch.bool),
                                                      passes)
    assert smallest.tolist() == [True, False, False] and not kept_minimal and checked == 8
    smallest, kept_minimal, _ = smallest_within(evaluate, torch.tensor([True, False, False]),
                                                passes)
    assert smallest.tolist() == [True, False, False] and kept_minimal


def _subset_id(names, kept):
    return sum(1 << names.index(e) for e in kept)


def test_greedy_subset_passes_and_no_edge_can_leave_it():
    """On the redundant model (two paths, either alone faithful) and on MIXED_CIRCUIT (GPT-2
    with LoRA), the greedy subset passes in the exhaustive table, every one-edge removal of it
    fails there, and each step's f is the table's."""
    cases = [(redundant_model(), redundant_rows(), REDUNDANT, 0.9, 3),
             (random_model("gpt2", lora=True), random_rows(n=5), MIXED_CIRCUIT, 0.5, 4)]
    for model, rows, names_in, threshold, batch in cases:
        g = circuit(model, names_in)
        full, f, _ = verify_circuit(model, g, rows, batch_size=batch, threshold=threshold)
        local, _, _ = verify_circuit(model, g, rows, batch_size=batch, threshold=threshold,
                                     local=True)
        names = full["edges"]
        assert local["irreducible"] is False, "the case must be reducible"
        kept = local["greedy_subset"]
        assert local["greedy_subset_size"] == len(kept) < len(names)
        k = _subset_id(names, kept)
        assert f[k] >= threshold
        for e in kept:
            assert f[k ^ (1 << names.index(e))] < threshold, e
        current = 2 ** len(names) - 1
        for step in local["greedy_removals"]:
            current ^= 1 << names.index(step["edge"])
            assert abs(step["faithfulness"] - float(f[current])) < 1e-4
        assert current == k
        # kept is a superset of a minimal faithful subset (a subset that passes holds one), and
        # enumerating it finds one of the exhaustive table's minimal subsets
        minimal = [set(m) for m in full["minimal_faithful_subsets"]]
        assert any(m <= set(kept) for m in minimal)
        assert set(local["minimal_subset"]) in minimal
        assert local["minimal_subset_size"] == len(local["minimal_subset"]) <= len(kept)
        assert local["greedy_subset_minimal"] == (set(kept) in minimal)
        assert local["subsets_within_greedy"] == 2 ** len(kept)
        skipped, _, _ = verify_circuit(model, g, rows, batch_size=batch, threshold=threshold,
                                       local=True, reduce=False)
        assert "greedy_subset" not in skipped


def test_progress_counts_each_pass_from_its_own_start():
    import io

    from condense.verify.progress import Progress
    times = iter([0.0, 100.0, 110.0, 111.0, 112.0])   # construction, then one per call
    out = io.StringIO()
    show = Progress("verify", every=0.0, stream=out, clock=lambda: next(times))
    show(50, 100)    # 50 in 100 s
    show(100, 100)   # pass 1 done at t = 110
    show(10, 200)    # pass 2: 10 in the 1 s since pass 1 ended, not since construction
    show(20, 200)
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("(50.0 %), 0/s, 100s left in this pass")
    assert lines[2].endswith("(5.0 %), 10/s, 19s left in this pass")
    assert lines[3].endswith("(10.0 %), 10/s, 18s left in this pass")


def test_report_summary_puts_the_reductions_after_the_verdict_and_before_the_pairs():
    from condense.verify.verdict import summary_items
    local = dict(mode="local", criterion="accuracy", irreducible=False, one_minimal=True,
                 n_edges=4, removable_edges=["a", "b"], greedy_subset=["c", "d"],
                 minimal_subset=["c"], n_interacting_pairs=1, pairs=[{}, {}])
    labels = [k for k, _ in summary_items(local)]
    assert labels.index("1-minimal (no edge or pair can go)") + 1 == labels.index(
        "edges that can go one at a time")
    assert labels.index("edges that can go one at a time") < labels.index(
        "a minimal passing subset (every subset of the greedy one checked)") < labels.index(
        "interacting pairs")
    assert dict(summary_items(local))["greedy reduction (passes, no edge can leave it)"] == "2 edges: c, d"
    full = [k for k, _ in summary_items(dict(criterion="f", n_minimal_faithful_subsets=2))]
    assert full[4:6] == ["minimal faithful subsets", "interacting pairs"]


def test_an_interrupted_reduction_replays_its_saved_steps(tmp_path, monkeypatch):
    """Each greedy step's answer is kept (EvaluationMemo): killed at its second step, the rerun
    evaluates only the steps after the first and ends with the uninterrupted reduction."""
    from condense.verify.resume import EvaluationMemo
    from condense.verify.subsets import SubsetEvaluator
    model, rows = redundant_model(), redundant_rows()
    g = circuit(model, REDUNDANT)
    whole, _, _ = verify_circuit(model, g, rows, batch_size=3, threshold=0.9, local=True)
    assert len(whole["greedy_removals"]) >= 2, "the case must take two steps or more"
    real, calls = SubsetEvaluator.mean_logit_diffs, {"n": 0, "kill_at": None}

    def counting(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == calls["kill_at"]:
            raise KeyboardInterrupt
        return real(self, *a, **k)
    monkeypatch.setattr(SubsetEvaluator, "mean_logit_diffs", counting)
    path, key = str(tmp_path / "greedy.pt"), "this run"
    calls.update(n=0, kill_at=3)  # 1: the local check, 2 and 3: greedy steps 2 and 3
    with pytest.raises(KeyboardInterrupt):
        verify_circuit(model, g, rows, batch_size=3, threshold=0.9, local=True,
                       memo=EvaluationMemo(path, key))
    calls.update(n=0, kill_at=None)
    memo = EvaluationMemo(path, key)
    resumed, _, _ = verify_circuit(model, g, rows, batch_size=3, threshold=0.9, local=True, memo=memo)
    # uninterrupted: the check, one call per removal after the first and one that finds none
    # passing, then the subsets within the greedy subset; the rerun replays one of them
    uninterrupted_calls = 1 + len(whole["greedy_removals"]) + 1
    assert memo.replayed > 0 and calls["n"] == uninterrupted_calls - 1
    for field in ("greedy_subset", "greedy_removals", "greedy_subset_minimal", "minimal_subset"):
        assert resumed[field] == whole[field], field
    other = EvaluationMemo(path, "another run")  # a file of another run is not replayed
    assert other.done == {}
