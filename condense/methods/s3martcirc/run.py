"""The S3martCirc run of condense/train.py (`method: s3martcirc`): recipe checks, training
(condense.methods.s3martcirc.method, where the method is described), evaluation against the node baselines,
and the artifacts (circuit.json with roles, circuit.png, roles.json, training.png,
metrics.json). Only the main process writes.
"""
import math

import torch

from condense.artifacts import atomic_write, write_json
from condense.graph import Graph
from condense.methods.s3martcirc.node_baselines import (
    BASELINES,
    ablation_metrics,
    circuit_metrics,
    connected_nodes,
    node_circuit_graph,
    node_names,
    reference_for,
    score_nodes,
)
from condense.methods.s3martcirc.method import (
    ROLES,
    S3Result,
    S3Settings,
    coefficients,
    functional_importance,
    log,
    node_fi,
    roles_of,
    train_s3martcirc,
)

# ---------------------------------------------------------------- artifacts

def role_graph(graph, result, nodes):
    """The node circuit of `nodes` (node_baselines.node_circuit_graph) with roles: heads and
    circuit neurons their own, an MLP node the most common role among its circuit neurons."""
    g = node_circuit_graph(graph, nodes)
    r_h, r_n = result.roles()
    roles = {}
    for l in range(g.n_layers):
        for h in range(g.n_heads):
            roles[f"a{l}.h{h}"] = ROLES[int(r_h[l, h]) if nodes.heads[l, h] else 0]
        kept = torch.nonzero(nodes.neurons[l]).flatten().tolist()
        for i in kept:
            roles[f"m{l}.n{i}"] = ROLES[int(r_n[l, i])]
        if kept:
            counts = torch.bincount(r_n[l, kept], minlength=3)
            roles[f"m{l}"] = ROLES[int(counts[1:].argmax()) + 1]
        else:
            roles[f"m{l}"] = ROLES[0]
    g.roles = roles
    return g


def roles_table(graph, result, nodes):
    """{name: {role, c_u, c_p, c_f, fi}} for every head and every circuit neuron."""
    c_h, c_n = result.coefficients
    r_h, r_n = result.roles()
    out = {}
    for l in range(graph.n_layers):
        for h in range(graph.n_heads):
            out[f"a{l}.h{h}"] = _entry(ROLES[int(r_h[l, h]) if nodes.heads[l, h] else 0],
                                       c_h[l, h], result.fi.heads[l, h])
        for i in torch.nonzero(nodes.neurons[l]).flatten().tolist():
            out[f"m{l}.n{i}"] = _entry(ROLES[int(r_n[l, i])], c_n[l, i], result.fi.neurons[l, i])
    return out


def _entry(role, c, fi):
    return dict(role=role, c_u=float(c[0]), c_p=float(c[1]), c_f=float(c[2]), fi=float(fi))


def plot_history(history, path, title):
    import matplotlib
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.5))
    ep = [h["epoch"] for h in history]
    a1.plot(ep, [h.get("task", math.nan) for h in history], label="discovery (KL / NLL)")
    a1.plot(ep, [h.get("classification", math.nan) for h in history], label="classification")
    a1.set_xlabel("epoch")
    a1.legend(fontsize=7)
    a2.plot(ep, [h["heads"] + h["neurons"] for h in history], label="candidates")
    a2.plot(ep, [h["functional"] for h in history], label="functional")
    a2.plot(ep, [h["passthrough"] for h in history], label="passthrough")
    a2.set_xlabel("epoch")
    a2.set_yscale("symlog")
    a2.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110), "wb")
    plt.close(fig)


# ---------------------------------------------------------------- evaluation and comparison

def evaluate_nodes(model, graph, rows, nodes, reference, intervention, batch_size, means):
    kw = dict(intervention=intervention, batch_size=batch_size, means=means, reference=reference)
    out = ablation_metrics(model, graph, rows, nodes, **kw)
    alone = circuit_metrics(model, graph, rows, nodes, **kw)
    out.update({f"circuit_{k}": v for k, v in alone.items() if k not in ("accuracy_full", "logit_diff_full")})
    return out


def compare_baselines(model, graph, rows, scored, size, baselines, budgets, *, test_reference,
                      intervention="patching", batch_size=32, means=None, ig_steps=5, seed=0,
                      pruning=None, recovery_reference=None, progress=True):
    """Score nodes with each baseline on rows['train'] and evaluate on rows['test']: at the
    S3martCirc circuit size (ablation and circuit-alone metrics) and at every budget
    (ablation metrics), plus recovery of `recovery_reference` when given. `scored`: rankings
    already made ({name: NodeScores}, e.g. S3martCirc's), evaluated at the budgets only.
    Returns {method: {...}}."""
    from condense.methods.s3martcirc.recovery import recovery
    shape = graph.shape
    kw = dict(intervention=intervention, batch_size=batch_size, means=means)
    out = {}
    entries = list(scored.items()) + [(b, None) for b in baselines]
    for method, scores in entries:
        rec = {}
        if scores is None:
            log(f"baseline {method} ...")
            scores, seconds = score_nodes(method, model, graph, rows["train"], ig_steps=ig_steps,
                                          seed=seed, progress=progress, pruning=pruning, **kw)
            rec["seconds"] = seconds
            nodes = scores.top(size)
            rec["at_size"] = evaluate_nodes(model, graph, rows["test"], nodes, test_reference, **kw)
            log(f"{method}: {seconds:.1f}s; top {size} nodes ablated: accuracy drop "
                f"{rec['at_size']['accuracy_drop']:.1f} points, logit drop {rec['at_size']['logit_drop']:.3f}")
        rec["budgets"] = {str(b): ablation_metrics(model, graph, rows["test"], scores.top(min(b, scores.n_nodes)),
                                                   reference=test_reference, **kw) for b in budgets}
        if recovery_reference is not None:
            rec["recovery"] = {str(b): v for b, v in
                               recovery(scores.ranked_names(shape, max(budgets)), recovery_reference,
                                        budgets).items()}
        out[method] = rec
    return out


def done_when(s3, compared):
    """Per baseline: S3martCirc's accuracy drop >= the baseline's at the same circuit size (the
    size condition 'no more than 1.5x theirs' then holds with ratio 1), and S3martCirc's time
    (FI + training) < exact patching's time."""
    checks = {}
    for method, rec in compared.items():
        if "at_size" in rec:
            checks[f"drop_vs_{method}"] = s3["accuracy_drop"] >= rec["at_size"]["accuracy_drop"] - 1e-9
    if "exact_patching" in compared:
        checks["faster_than_exact_patching"] = s3["seconds"] < compared["exact_patching"]["seconds"]
    return checks


# ---------------------------------------------------------------- runner

def check_config(cfg):
    """Refuse values the run cannot use, naming the key, before any model loads."""
    from condense.config import RecipeError

    def bad(key, why):
        raise RecipeError(f"recipe key {key!r}: {why}, got {getattr(cfg, key)!r}")

    for b in cfg.s3_baselines or []:
        if b not in BASELINES:
            raise RecipeError(f"recipe key 's3_baselines': unknown {b!r}; valid: "
                              f"{', '.join(BASELINES)}")
    if cfg.s3_epochs < 1:
        bad("s3_epochs", "must be >= 1")
    if not 0 <= cfg.s3_warmup_epochs <= cfg.s3_epochs:
        bad("s3_warmup_epochs", f"must lie in [0, s3_epochs = {cfg.s3_epochs}]")
    if cfg.s3_k < 0:
        bad("s3_k", "must be >= 0")
    if not cfg.s3_lr > 0:
        bad("s3_lr", "must be > 0")
    if not 0 <= cfg.s3_alpha <= 1:
        bad("s3_alpha", "must lie in [0, 1]")
    if cfg.s3_sparsity < 0:
        bad("s3_sparsity", "must be >= 0")


def run_s3martcirc(cfg, accelerator, output_dir):
    """The whole S3martCirc run (see the module docstring); returns metrics.json's contents."""
    from condense.methods.s3martcirc.recovery import PAPER_BUDGETS, default_reference
    from condense.methods.scoring import ablation_means, load_model_and_rows

    check_config(cfg)
    main = accelerator.is_main_process
    device = torch.device(cfg.device) if cfg.device else accelerator.device
    baselines = list(cfg.s3_baselines or [])
    model, _, rows = load_model_and_rows(cfg, device)
    graph = Graph.from_model(model)
    means = ablation_means(model, graph, rows, cfg)
    settings = S3Settings.from_config(cfg)
    log(f"{cfg.task}: {len(rows['train'])} train / {len(rows['test'])} test rows; model {cfg.model} "
        f"on {device}; {graph.n_layers * graph.n_heads} heads + {graph.n_layers * graph.shape.d_mlp} neurons")
    torch.manual_seed(settings.seed)
    result = train_s3martcirc(model, graph, rows["train"], settings, means=means, progress=main)
    candidates = result.candidates()
    nodes = connected_nodes(graph, candidates)
    size = len(nodes)
    r_h, r_n = result.roles()
    log(f"trained in {result.seconds:.1f}s (FI {result.fi_seconds:.1f}s): {size} nodes "
        f"({nodes.n_heads} heads, {nodes.n_neurons} neurons)")

    kw = dict(intervention=cfg.intervention, batch_size=cfg.batch_size, means=means)
    test_ref = reference_for(model, graph, rows["test"], **kw)
    s3 = evaluate_nodes(model, graph, rows["test"], nodes, test_ref, **kw)
    s3.update(seconds=result.seconds, fi_seconds=result.fi_seconds,
              candidates=len(candidates), size=size,
              functional=int(((r_h == 2) & nodes.heads).sum() + ((r_n == 2) & nodes.neurons).sum()),
              passthrough=int(((r_h == 1) & nodes.heads).sum() + ((r_n == 1) & nodes.neurons).sum()),
              functional_heads=int(((r_h == 2) & nodes.heads).sum()),
              passthrough_heads=int(((r_h == 1) & nodes.heads).sum()),
              fi_thresholds=result.thresholds)
    log(f"test: ablating the circuit drops accuracy {s3['accuracy_drop']:.1f} points "
        f"({s3['accuracy_full']:.3f} -> {s3['accuracy']:.3f}), logit diff by {s3['logit_drop']:.3f}; "
        f"circuit alone: faithfulness {s3['circuit_faithfulness']:.3f}")

    reference = cfg.s3_reference or default_reference(graph.shape, cfg.task)
    budgets = [int(b) for b in (cfg.s3_budgets or PAPER_BUDGETS)]
    rankings = {"s3martcirc": result.scores(), "s3martcirc_coefficients": result.coefficient_scores()}
    compared = compare_baselines(
        model, graph, rows, rankings, size, baselines, budgets,
        test_reference=test_ref, ig_steps=cfg.ig_steps, seed=cfg.seed,
        pruning=dict(steps=result.discovery_steps, lr=cfg.s3_np_lr, l0_weight=cfg.s3_np_l0,
                     alpha=settings.alpha, batch_size=settings.batch_size),
        recovery_reference=reference, progress=main, **kw)
    metrics = dict(
        method=cfg.method, task=cfg.task, model=cfg.model, intervention=cfg.intervention,
        nodes_total=graph.n_layers * (graph.n_heads + graph.shape.d_mlp),
        n_train=len(rows["train"]), n_test=len(rows["test"]), discovery_steps=result.discovery_steps,
        s3martcirc=s3, budgets=budgets, recovery_reference=reference,
        baselines={k: v for k, v in compared.items() if k not in rankings},
        s3martcirc_budgets=compared["s3martcirc"].get("budgets"),
        s3martcirc_recovery=compared["s3martcirc"].get("recovery"),
        s3martcirc_coefficient_budgets=compared["s3martcirc_coefficients"].get("budgets"),
        s3martcirc_coefficient_recovery=compared["s3martcirc_coefficients"].get("recovery"),
        done_when=done_when(s3, compared), history=result.history)
    # flat copies of the headline numbers (wandb logs scalars)
    metrics.update(size=size, accuracy_drop=s3["accuracy_drop"], logit_drop=s3["logit_drop"],
                   seconds=result.seconds)
    if not main:
        return metrics
    circuit = role_graph(graph, result, nodes)
    circuit.to_json(f"{output_dir}/circuit.json")
    circuit.to_image(f"{output_dir}/circuit.png")
    write_json(f"{output_dir}/roles.json", dict(
        fi_thresholds=result.thresholds, nodes=roles_table(graph, result, nodes)))
    plot_history(result.history, f"{output_dir}/training.png",
                 f"S3martCirc on {cfg.task}: {size} nodes")
    write_json(f"{output_dir}/metrics.json", metrics)
    return metrics


run_s3martcirc.data_parallel = True
__all__ = [
    "ROLES",
    "S3Result",
    "S3Settings",
    "coefficients",
    "functional_importance",
    "node_fi",
    "node_names",
    "roles_of",
    "run_s3martcirc",
    "train_s3martcirc",
]
