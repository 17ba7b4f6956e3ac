"""Roles meet circuits: S3martCirc's head roles beside the heads that edge circuits keep.

    HF_HUB_OFFLINE=1 python benchmarks/roles_vs_circuits.py
        [--roles runs/s3martcirc_bench_smollm2/ioi/roles.json]
        [--circuit EAP-IG=checkpoints/eap_ig_smollm2_ioi/circuit.json.gz]
        [--circuit C1=checkpoints/condense_smollm2_ioi/circuit.json] [--model smollm2-135m]
        (default circuits: EAP-IG, the shipped C1, the 11-edge C1 found before the grouped-query
        attention fix, the previous recipe's 45-edge C1 and the C1 over the 4-bit base, all
        SmolLM2 IOI)
        [--json PATH]

A head is *kept* by an edge circuit when one of its edges is on an input -> logits path (the
circuit pruned, then Graph.nodes_in_graph). S3martCirc gives every head a role: unimportant,
passthrough or functional (roles.json of an S3martCirc run). The table counts, per role, how
many heads each circuit keeps, with the count expected if the circuit chose its heads at random
(its head count times the role's share of all heads), and lists the heads two or more of them
share. Reads files only, plus the model's shape (no forward pass): seconds.
"""
import argparse
import json
import os
import shlex
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from condense.graph import Graph
from condense.models import load_model
from hap_vs_ep import heads  # the heads on an input -> logits path of a circuit

ROLES = ("functional", "passthrough", "unimportant")


def kept_heads(path, model):
    g = Graph.from_json(path, model)
    g.prune()
    return heads(g)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--roles", default=os.path.join("runs", "s3martcirc_bench_smollm2", "ioi",
                                                    "roles.json"),
                    help="roles.json of an S3martCirc run (default: runs/s3martcirc_bench_smollm2/ioi/"
                         "roles.json)")
    ap.add_argument("--circuit", action="append", metavar="NAME=PATH",
                    help="an edge circuit (MIB JSON, .gz read too); repeatable")
    ap.add_argument("--model", default="smollm2-135m", help="model name or folder the circuits belong to")
    ap.add_argument("--json", default=None, help="also write the results here as JSON")
    args = ap.parse_args(argv)
    circuits = args.circuit or [
        "EAP-IG=" + os.path.join(ROOT, "checkpoints", "eap_ig_smollm2_ioi", "circuit.json.gz"),
        "C1=" + os.path.join(ROOT, "checkpoints", "condense_smollm2_ioi", "circuit.json"),
        "C1 11-edge=" + os.path.join(ROOT, "checkpoints", "condense_smollm2_ioi_before_gqa_fix",
                                     "circuit.json"),
        "C1 45-edge=" + os.path.join(ROOT, "checkpoints", "condense_smollm2_ioi_fp32", "circuit.json"),
        "C1 4-bit=" + os.path.join(ROOT, "checkpoints", "condense_smollm2_4bit_ioi", "circuit.json")]
    bad = [spec for spec in circuits if "=" not in spec or not os.path.exists(spec.split("=", 1)[1])]
    if bad:
        ap.error(f"--circuit wants NAME=PATH to an existing circuit file; got {bad[0]!r}")
    if not os.path.exists(args.roles):
        ap.error(f"--roles {args.roles}: no such file (the roles.json of an S3martCirc run, e.g. "
                 "benchmarks/s3martcirc.py --model smollm2 --tasks ioi writes the default one)")
    with open(args.roles) as f:
        roles = {n: e["role"] for n, e in json.load(f)["nodes"].items() if n.startswith("a")}
    model = load_model(args.model)
    kept = {}
    for spec in circuits:
        name, path = spec.split("=", 1)
        kept[name] = kept_heads(path, model)
    missing = {h for heads in kept.values() for h in heads} - set(roles)
    if missing:
        sys.exit(f"{args.roles}: no role for heads {sorted(missing)[:5]}: roles of another model?")
    n_heads = len(roles)
    by_role = {r: {h for h, x in roles.items() if x == r} for r in ROLES}

    names = list(kept)
    print(f"{n_heads} heads; S3martCirc roles from {args.roles}")
    print("| S3martCirc role | heads | " + " | ".join(f"kept by {n} (random)" for n in names) + " |")
    print("|---|---|" + "---|" * len(names))
    table = []
    for r in ROLES:
        row = dict(role=r, heads=len(by_role[r]))
        cells = []
        for n in names:
            got = len(kept[n] & by_role[r])
            expected = len(kept[n]) * len(by_role[r]) / n_heads
            row[n] = dict(kept=got, expected_at_random=expected)
            cells.append(f"{got} ({expected:.1f})")
        table.append(row)
        print(f"| {r} | {len(by_role[r])} | " + " | ".join(cells) + " |")
    print(f"| all | {n_heads} | " + " | ".join(str(len(kept[n])) for n in names) + " |")

    in_s3 = by_role["functional"] | by_role["passthrough"]
    overlap = {}
    for n in names:
        both = kept[n] & in_s3
        overlap[n] = dict(heads=len(kept[n]), in_s3martcirc_circuit=len(both),
                          jaccard=len(both) / max(1, len(kept[n] | in_s3)))
        print(f"{n}: {len(kept[n])} heads, {len(both)} of them in S3martCirc's circuit "
              f"({len(in_s3)} heads); Jaccard {overlap[n]['jaccard']:.3f}")
    shared = {}
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            common = sorted(kept[a] & kept[b], key=lambda h: (int(h[1:].split(".")[0]), h))
            shared[f"{a}&{b}"] = {h: roles[h] for h in common}
            print(f"heads {a} and {b} both keep ({len(common)}): "
                  + ", ".join(f"{h} ({roles[h]})" for h in common))
    if args.json:
        with open(args.json, "w") as f:
            named = [n + "=" + os.path.relpath(path, ROOT)
                     for n, path in (spec.split("=", 1) for spec in circuits)]
            json.dump(dict(roles_file=args.roles, circuits=named, n_heads=n_heads, table=table,
                           overlap=overlap, shared=shared,
                           kept={n: sorted(v) for n, v in kept.items()},
                           command=shlex.join(["python", "benchmarks/roles_vs_circuits.py"] + sys.argv[1:])),
                      f, indent=1)


if __name__ == "__main__":
    main()
