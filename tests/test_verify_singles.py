"""`condense verify --local --singles`: the circuit and its one-edge removals only (1 + n
subsets), for circuits whose pairs are out of reach. Each removal's numbers must be those of the
full local check, and the report must say that pairs were not checked instead of claiming none
interact."""
import json

import pytest

from condense.verify.run import main, verify_circuit
from condense.verify.verdict import irreducibility_words, local_words, summary_items

from .test_verify import (MIXED_CIRCUIT, REDUNDANT, TOL, circuit, random_model, random_rows,
                          redundant_model, redundant_rows, saved_tiny_gpt2, write_run)


def test_singles_are_the_local_checks_one_edge_removals():
    model, rows = random_model("gpt2", lora=True), random_rows(n=5)
    g = circuit(model, MIXED_CIRCUIT)
    both, _, _ = verify_circuit(model, g, rows, batch_size=4, threshold=0.5, local=True)
    singles, f, _ = verify_circuit(model, g, rows, batch_size=4, threshold=0.5, local=True,
                                   pairs=False)
    n = both["n_edges"]
    assert f is None and singles["subsets_evaluated"] == 1 + n < both["subsets_evaluated"]
    assert both["pairs_checked"] and not singles["pairs_checked"]
    for name in both["edges"]:
        assert abs(singles["faithfulness_without_edge"][name] - both["faithfulness_without_edge"][name]) < TOL
        assert singles["accuracy_without_edge"][name] == both["accuracy_without_edge"][name]
    assert singles["removable_edges"] == both["removable_edges"]
    assert singles["one_minimal"] == both["one_minimal"]
    assert singles["pairs"] == [] and singles["n_interacting_pairs"] is None
    assert singles["removable_pairs"] is None and singles["partners_median"] is None


def test_singles_find_a_redundant_circuit_reducible():
    model, rows = redundant_model(), redundant_rows()
    report, _, _ = verify_circuit(model, circuit(model, REDUNDANT), rows, batch_size=3,
                                  local=True, pairs=False, reduce=False)
    assert report["circuit_faithful"] and report["irreducible"] is False
    assert report["removable_edges"] and "can go one at a time" in local_words(report)


def test_singles_words_say_pairs_were_not_checked():
    report = dict(mode="local", pairs_checked=False, irreducible=None, one_minimal=True,
                  removable_edges=[], n_edges=3, criterion="accuracy", pairs=[])
    assert "pairs not checked" in local_words(report)
    assert "pairs not checked" in irreducibility_words(None, local=True, pairs=False)
    items = dict(summary_items(report))
    assert items["interacting pairs"] == "not checked (--singles)" and "median partners" not in items
    assert items["1-minimal (no edge can go; pairs not checked)"] is True


def test_cli_singles_writes_the_removals_picture(tmp_path, organism_tokenizer, capsys):
    base, model_dir = saved_tiny_gpt2(tmp_path, organism_tokenizer)
    names = ["input->a0.h0<v>", "a0.h0->a1.h1<k>", "a1.h1->logits", "input->logits"]
    run = tmp_path / "run"
    write_run(run, model_dir, circuit(base, names))
    with pytest.raises(SystemExit) as e:
        main([str(run), "--singles"])
    assert e.value.code == 2 and "--singles goes with --local" in capsys.readouterr().err
    assert main([str(run), "--n", "8", "--local", "--singles", "--no-reduce"]) == 0
    assert "pairs not checked (--singles)" in capsys.readouterr().out
    assert (run / "verify_removals.png").stat().st_size > 0 and not (run / "verify_pairs.png").exists()
    report = json.loads((run / "verify.json").read_text())
    assert report["subsets_evaluated"] == 1 + len(names) and not report["pairs_checked"]


def test_the_first_k_removals_prove_reducibility_but_not_minimality():
    model, rows = random_model("gpt2", lora=True), random_rows(n=5)
    g = circuit(model, MIXED_CIRCUIT)
    every, _, _ = verify_circuit(model, g, rows, batch_size=4, threshold=0.5, local=True,
                                 pairs=False, reduce=False)
    names = every["edges"]
    k = 5
    first, _, _ = verify_circuit(model, g, rows, batch_size=4, threshold=0.5, local=True,
                                 pairs=False, reduce=False, max_removals=k)
    assert first["subsets_evaluated"] == 1 + k and first["removals_checked"] == k
    assert list(first["faithfulness_without_edge"]) == names[:k]
    for name in names[:k]:
        assert abs(first["faithfulness_without_edge"][name] - every["faithfulness_without_edge"][name]) < TOL
    assert first["removable_edges"] == [e for e in every["removable_edges"] if e in names[:k]]
    # a passing removal among the first k: reducible; none: no verdict at all (not 1-minimal)
    assert first["irreducible"] == (False if first["removable_edges"] else None)
    assert first["one_minimal"] == (False if first["removable_edges"] else None)
    words = local_words(dict(first, removable_edges=[], irreducible=None, one_minimal=None))
    assert f"none of the first {k} of {len(names)} one-edge removals passes" in words


def test_max_removals_needs_singles(tmp_path, capsys):
    for argv in (["--local", "--max-removals", "3"], ["--local", "--singles", "--max-removals", "0"]):
        with pytest.raises(SystemExit) as e:
            main([str(tmp_path), *argv])
        assert e.value.code == 2 and "--max-removals K goes with --local --singles" in capsys.readouterr().err


def test_cli_first_removals_picture(tmp_path, organism_tokenizer, capsys):
    base, model_dir = saved_tiny_gpt2(tmp_path, organism_tokenizer)
    names = ["input->a0.h0<v>", "a0.h0->a1.h1<k>", "a1.h1->logits", "input->logits"]
    run = tmp_path / "run"
    write_run(run, model_dir, circuit(base, names))
    assert main([str(run), "--n", "8", "--local", "--singles", "--max-removals", "2"]) == 0
    report = json.loads((run / "verify.json").read_text())
    assert report["removals_checked"] == 2 and len(report["accuracy_without_edge"]) == 2
    assert (run / "verify_removals.png").stat().st_size > 0


def test_max_removals_needs_singles_in_the_library_too():
    model, rows = random_model("gpt2", lora=True), random_rows(n=5)
    g = circuit(model, MIXED_CIRCUIT)
    for kwargs in (dict(local=True, max_removals=3), dict(local=False, pairs=False, max_removals=3),
                   dict(local=True, pairs=False, max_removals=0)):
        with pytest.raises(ValueError, match="max_removals K"):
            verify_circuit(model, g, rows, batch_size=4, **kwargs)
