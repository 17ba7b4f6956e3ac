"""Does a circuit describe the original model? The fidelity card (docs/fidelity.md).

A condensed circuit is found on a healed model (the base plus a LoRA adapter). It is small
enough to verify; whether it still describes the *original* model is a second question, and
this module answers it for one circuit, in sections, every rate with its 95 % interval
(condense.intervals):

- `distribution`: the circuit (adapter on) against the original full model on the task's
  test rows: accuracy, KL, top-1 and choice agreement, faithfulness, and on the rows where the
  original errs, how many of its errors the circuit repeats (rows are added, up to
  `max_rows`, until the original errs on `error_rows`; fewer is stated);
- `generalisation`: held-out templates (where the task has them) and a paraphrase set written
  for this card (condense.tasks.paraphrases), never used to rank, heal or gate;
- `adapter_off`: the same circuit on the original weights (f, accuracy, KL), and its frozen
  completion: the fewest edges of the original's own EAP-IG ranking that, added to the
  circuit, make it faithful on the original ("C1 is the core of an N-edge frozen circuit");
- `nodes`: each circuit head's and MLP's rank in the original by ablation effect and by
  attribution, and the share of the circuit's heads among the original's top heads
  (literature roles where the model has them: GPT-2 small);
- `adapter`: ‖ΔW‖/‖W‖ per adapted module, per head (output-projection slices) and per MLP,
  and how much of the change sits on the circuit's nodes;
- `full_model`: the healed full model (adapter on, nothing ablated) against the original on
  every built-in task, and perplexity on text from a second source no heal trains on,
  beside the gate's own ratio.

`measure` takes a loaded model (a PeftModel whose adapter is the heal's, or a plain model:
then the circuit's model is the original and the adapter sections are empty) and returns the
card as JSON-ready data; `condense fidelity RUN` (condense.fidelity_command) runs it on a run
folder and condensation runs write it at the end (recipe key `fidelity`).
"""
import math
import re
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from . import tasks
from .attribute import attribute
from .curves import Rule, smallest_passing
from .evaluate import EvalReference, empty_logit_diffs, evaluate, reference_outputs
from .full_model import OriginalOutputs, load_rows, logit_diffs, original
from .graph import Graph
from .intervals import bootstrap, proportion
from .metrics import last_logits
from .node_ablation import node_ablation_effects

SECTIONS = ("distribution", "generalisation", "adapter_off", "nodes", "adapter", "full_model")


@dataclass
class FidelityConfig:
    """What the fidelity card measures, and on how many rows (`condense fidelity --help`)."""
    rows: int = field(default=200, metadata={
        "help": "test rows of the run's task for the distribution and adapter-off sections"})
    error_rows: int = field(default=30, metadata={
        "help": "grow the test rows (up to max_rows) until the original errs on this many"})
    max_rows: int = field(default=1000, metadata={"help": "most test rows the card reads"})
    paraphrase_rows: int = field(default=200, metadata={"help": "rows of the paraphrase set"})
    task_rows: int = field(default=100, metadata={
        "help": "test rows per task for the healed full model against the original"})
    node_rows: int = field(default=32, metadata={
        "help": "test rows on which every head and MLP of the original is ablated alone"})
    top_heads: int = field(default=10, metadata={
        "help": "the original's top heads by ablation that the circuit's heads are counted in"})
    text_blocks: int = field(default=128, metadata={
        "help": "blocks of second-source text for the full model's perplexity"})
    text_block_size: int = field(default=128, metadata={"help": "tokens per text block"})
    text_path: str = field(default=tasks.SECOND_SOURCE, metadata={
        "help": "folder (or file) of plain-text documents no heal trains on"})
    completion_threshold: float = field(default=0.9, metadata={
        "help": "faithfulness on the original that the frozen completion must reach"})
    completion_resolution: float = field(default=0.01, metadata={
        "help": "the completion search stops once its bracket is this fraction of its size"})
    ranking: Optional[str] = field(default=None, metadata={
        "help": "circuit.json(.gz) whose scores rank the original's edges (default: EAP-IG "
                "on the original over ranking_rows train rows)"})
    ranking_rows: int = field(default=32, metadata={"help": "train rows of the default ranking"})
    accuracy_tol: Optional[float] = field(default=None, metadata={
        "help": "accuracy drop that flags a task (default: the run's gate_accuracy_tol, else 0.05)"})
    sections: str = field(default="all", metadata={
        "help": f"comma-separated sections to measure: all, or of {', '.join(SECTIONS)}"})
    batch_size: Optional[int] = field(default=None, metadata={"help": "prompts per pass (the run's)"})

    def check(self) -> None:
        wanted = self.wanted()
        bad = sorted(wanted - set(SECTIONS))
        if bad:
            raise ValueError(f"fidelity sections {', '.join(bad)}: choose from all, {', '.join(SECTIONS)}")
        for key in ("rows", "max_rows", "paraphrase_rows", "task_rows", "node_rows", "text_blocks",
                    "text_block_size", "ranking_rows", "top_heads"):
            if getattr(self, key) < 1:
                raise ValueError(f"fidelity {key}={getattr(self, key)}: must be at least 1")
        if self.max_rows < self.rows:
            raise ValueError(f"fidelity max_rows={self.max_rows} is below rows={self.rows}")

    def wanted(self) -> set:
        return set(SECTIONS) if self.sections == "all" else {s.strip() for s in self.sections.split(",") if s.strip()}


# ---------------------------------------------------------------- helpers
def _has_adapter(model) -> bool:
    return bool(getattr(model, "peft_config", None))


def _f(ld, ld_full, ld_empty) -> float:
    denom = float(ld_full.mean() - ld_empty.mean())
    return float(ld.mean() - ld_empty.mean()) / denom if abs(denom) > 1e-12 else math.nan


def _rates(m: dict) -> dict:
    """The per-row rates of an evaluate(per_row=True) output, each with its interval."""
    r = m["per_row"]
    ld, ld_full, ld_empty = r["logit_diff"], r["logit_diff_full"], r["logit_diff_empty"]
    return dict(
        n=m["n"], accuracy=proportion(ld > 0), accuracy_original=proportion(ld_full > 0),
        accuracy_empty=m["accuracy_empty"],
        choice_agreement=proportion((ld > 0) == (ld_full > 0)),
        top1_agreement=proportion(r["top1_agreement"]),
        kl=bootstrap(r["kl"]),
        faithfulness=bootstrap([ld, ld_full, ld_empty], _f),
        logit_diff=m["logit_diff"], logit_diff_original=m["logit_diff_full"])


@dataclass
class _Run:
    """What of the run the card needs: its task, rows, seed and how it ablates."""
    task: str
    seed: int = 0
    n_val: int = 100
    intervention: str = "patching"
    metric: str = "logit_diff"
    ig_steps: int = 5
    batch_size: int = 16
    accuracy_tol: float = 0.05
    ppl_ratio_max: float = 1.05

    @classmethod
    def of(cls, cfg) -> "_Run":
        return cls(task=cfg.task, seed=cfg.seed, n_val=cfg.n_val, intervention=cfg.intervention,
                   metric=getattr(cfg, "metric", "logit_diff"), ig_steps=getattr(cfg, "ig_steps", 5),
                   batch_size=cfg.batch_size, accuracy_tol=getattr(cfg, "gate_accuracy_tol", 0.05),
                   ppl_ratio_max=getattr(cfg, "gate_ppl_ratio", 1.05))


# ---------------------------------------------------------------- the card
def measure(model, tokenizer, circuit: Graph, run_cfg, fcfg: Optional[FidelityConfig] = None,
            means=None, gate_ppl_ratio: Optional[float] = None, cache: Optional[dict] = None,
            log: Callable[[str], None] = lambda msg: None) -> dict:
    """The fidelity card of `circuit` (a Graph of `model`) as JSON-ready data: the sections of
    the module docstring that `fcfg.sections` names, a `summary` and `flags` (one line per
    finding a reader must not miss). `run_cfg`: the run's config (task, seed, n_val,
    intervention, metric, batch_size, gate_accuracy_tol). `means`: the original's sender means
    when the run ablates with means. `gate_ppl_ratio`: the gate's own perplexity ratio, shown
    beside the second-source one. `cache`: a dict shared by cards of one base model, which
    keeps the original model's quantities (a benchmark over several runs measures them once)."""
    fcfg = fcfg or FidelityConfig()
    fcfg.check()
    run = _Run.of(run_cfg)
    if fcfg.batch_size:
        run.batch_size = fcfg.batch_size
    if fcfg.accuracy_tol is not None:
        run.accuracy_tol = fcfg.accuracy_tol
    cache = {} if cache is None else cache
    wanted = fcfg.wanted()
    healed = _has_adapter(model)
    card = dict(task=run.task, edges=circuit.count_edges(on_path=True), healed=healed,
                intervention=run.intervention, config=dict(vars(fcfg)))
    state = {}
    if wanted & {"distribution", "adapter_off", "generalisation"}:
        log("distribution: the circuit against the original on test rows")
        card["distribution"], state = _distribution(model, tokenizer, circuit, run, fcfg, means, cache)
    if "generalisation" in wanted:
        log("generalisation: held-out templates and the paraphrase set")
        card["generalisation"] = _generalisation(model, tokenizer, circuit, run, fcfg, means, state)
    if "adapter_off" in wanted:
        log("adapter off: the circuit on the original weights, and its frozen completion")
        card["adapter_off"] = _adapter_off(model, tokenizer, circuit, run, fcfg, means, state, cache, log)
    if "nodes" in wanted:
        log("nodes: every head and MLP of the original ablated alone")
        card["nodes"] = _nodes(model, tokenizer, circuit, run, fcfg, state, cache)
    if "adapter" in wanted:
        card["adapter"] = _adapter(model, circuit) if healed else None
    if "full_model" in wanted:
        log("full model: the healed model against the original on every task and on new text")
        card["full_model"] = (_full_model(model, tokenizer, run, fcfg, gate_ppl_ratio, cache)
                              if healed else None)
    card["summary"], card["flags"] = _summary(card, run, fcfg)
    return card


def _distribution(model, tokenizer, circuit, run, fcfg, means, cache):
    key = ("test", run.task, run.seed, fcfg.rows, fcfg.max_rows, fcfg.error_rows, run.intervention)
    if key not in cache:
        rows = load_rows(run.task, tokenizer, "test", fcfg.rows, run.seed)
        with original(model):
            full = last_logits(model, rows["clean_ids"], run.batch_size)
        errors = int((logit_diffs(full, rows) <= 0).sum())
        if errors < fcfg.error_rows and len(rows) < fcfg.max_rows and len(rows) == fcfg.rows:
            # enough rows that the original errs on error_rows, from its error rate so far
            want = min(fcfg.max_rows, math.ceil(1.2 * fcfg.error_rows * len(rows) / max(errors, 1)))
            rows = load_rows(run.task, tokenizer, "test", want, run.seed)
        with original(model):
            ref = reference_outputs(model, circuit, rows, run.intervention, run.batch_size, means)
        cache[key] = (rows, ref)
    rows, ref = cache[key]
    with_adapter = ref
    if _has_adapter(model):  # the empty circuit is the healed model's, as the gate takes it
        with_adapter = EvalReference(ref.full_logits, empty_logit_diffs(
            model, circuit, rows, run.intervention, run.batch_size, means), run.intervention)
    m = evaluate(model, circuit, rows, run.intervention, run.batch_size, reference=with_adapter,
                 means=means, per_row=True)
    out = _rates(m)
    ld, ld_full = m["per_row"]["logit_diff"], m["per_row"]["logit_diff_full"]
    errs = ld_full <= 0
    out["original_errors"] = dict(
        rows=int(errs.sum()), wanted=fcfg.error_rows, enough=bool(int(errs.sum()) >= fcfg.error_rows),
        repeated=proportion((ld <= 0)[errs]) if errs.any() else None)
    return out, dict(rows=rows, ref=ref, eval=m)


def _generalisation(model, tokenizer, circuit, run, fcfg, means, state):
    out = {}
    if state:
        r = state["eval"]["per_row"]
        parts = tasks.template_parts(state["rows"])
        out["templates"] = {
            name: dict(n=len(idx), accuracy=proportion(r["logit_diff"][idx] > 0),
                       accuracy_original=proportion(r["logit_diff_full"][idx] > 0),
                       choice_agreement=proportion((r["logit_diff"][idx] > 0) == (r["logit_diff_full"][idx] > 0)))
            for name, idx in parts.items()} or None
    if run.task not in tasks.PARAPHRASES:
        out["paraphrase"] = None
        return out
    rows = tasks.load_paraphrases(run.task, tokenizer, n=fcfg.paraphrase_rows, seed=run.seed)
    with original(model):
        ref = reference_outputs(model, circuit, rows, run.intervention, run.batch_size, means)
    if _has_adapter(model):
        ref = EvalReference(ref.full_logits, empty_logit_diffs(
            model, circuit, rows, run.intervention, run.batch_size, means), run.intervention)
    m = evaluate(model, circuit, rows, run.intervention, run.batch_size, reference=ref, means=means,
                 per_row=True)
    out["paraphrase"] = _rates(m)
    return out


def _ranking(model, tokenizer, run, fcfg, means, cache) -> Graph:
    """The original's edge ranking: scores from fcfg.ranking, or EAP-IG on the original."""
    key = ("ranking", run.task, run.seed, fcfg.ranking, fcfg.ranking_rows, run.intervention)
    if key not in cache:
        if fcfg.ranking:
            graph = Graph.from_json(fcfg.ranking, model)
            graph.reset()
        else:
            graph = Graph.from_model(model)
            rows = load_rows(run.task, tokenizer, "train", fcfg.ranking_rows, run.seed)
            with original(model):
                attribute(model, graph, rows, "eap_ig_inputs", ig_steps=run.ig_steps,
                          intervention=run.intervention, metric=run.metric,
                          batch_size=run.batch_size, seed=run.seed, means=means, progress=False)
        cache[key] = graph
    return cache[key]


def _adapter_off(model, tokenizer, circuit, run, fcfg, means, state, cache, log):
    rows, ref = state["rows"], state["ref"]
    with original(model):
        m = evaluate(model, circuit, rows, run.intervention, run.batch_size, reference=ref,
                     means=means, per_row=True)
    out = _rates(m)
    ranking = _ranking(model, tokenizer, run, fcfg, means, cache)
    val = load_rows(run.task, tokenizer, "val", run.n_val, run.seed)
    rule = Rule("faithfulness", threshold=fcfg.completion_threshold)
    with original(model):
        found = smallest_passing(model, ranking, val, rule, intervention=run.intervention,
                                 batch_size=run.batch_size, means=means, base=circuit,
                                 resolution=fcfg.completion_resolution,
                                 progress=lambda msg: log(f"  completion {msg}"))
    ranked = ranking.copy()
    ranked.reset()
    out["completion"] = dict(
        rule=rule.to_json(), rows=len(val), split="val", ranking=fcfg.ranking or "eap_ig_inputs on the original",
        added=found.n, edges=found.edges if found.n is not None else None,
        faithfulness=found.metrics["faithfulness"], accuracy=found.metrics["accuracy"],
        circuit_edges=circuit.count_edges(on_path=True), total_edges=int(ranked.valid.sum()),
        searched=found.evaluated_json())
    return out


def _nodes(model, tokenizer, circuit, run, fcfg, state, cache):
    key = ("nodes", run.task, run.seed, fcfg.node_rows, run.intervention)
    if key not in cache:
        rows = load_rows(run.task, tokenizer, "test", fcfg.node_rows, run.seed)
        with original(model):
            cache[key] = node_ablation_effects(model, rows, run.intervention, run.batch_size)
    effects = cache[key]
    heads, mlps = effects["heads"], effects["mlps"]
    L, H = heads.shape
    ranking = cache.get(("ranking", run.task, run.seed, fcfg.ranking, fcfg.ranking_rows, run.intervention))
    attribution = None
    if ranking is not None:  # a node's attribution: |score| summed over its outgoing edges
        out_sum = (ranking.scores.abs() * ranking.valid).sum(1)
        attribution = dict(heads=torch.tensor([[float(out_sum[ranking.head_sender(l, h)]) for h in range(H)]
                                               for l in range(L)]),
                           mlps=torch.tensor([float(out_sum[ranking.mlp_sender(l)]) for l in range(L)]))

    def rank_of(values, flat_index):
        order = torch.argsort(values.flatten(), descending=True)
        return int((order == flat_index).nonzero()[0, 0]) + 1

    present = circuit.nodes_in_graph()
    names = [n for i, n in enumerate(circuit.node_names) if present[i] and n not in ("input", "logits")]
    from .known_circuits import default_reference, load_reference
    literature = default_reference(circuit.shape, run.task)
    roles = {}
    if literature is not None:
        for cls, members in load_reference(literature).items():
            for node in members:
                roles.setdefault(node, []).append(cls)
    table = []
    for name in names:
        head = re.fullmatch(r"a(\d+)\.h(\d+)", name)
        if head:
            l, h = int(head.group(1)), int(head.group(2))
            row = dict(node=name, kind="head", ablation_effect=float(heads[l, h]),
                       ablation_rank=rank_of(heads, l * H + h), of=L * H)
            if attribution is not None:
                row["attribution_rank"] = rank_of(attribution["heads"], l * H + h)
        else:
            l = int(name[1:])
            row = dict(node=name, kind="mlp", ablation_effect=float(mlps[l]),
                       ablation_rank=rank_of(mlps, l), of=L)
            if attribution is not None:
                row["attribution_rank"] = rank_of(attribution["mlps"], l)
        if literature is not None:
            row["roles"] = roles.get(name, [])
        table.append(row)
    k = min(fcfg.top_heads, L * H)
    top = torch.argsort(heads.flatten(), descending=True)[:k].tolist()
    top_names = [f"a{i // H}.h{i % H}" for i in top]
    circuit_heads = [r["node"] for r in table if r["kind"] == "head"]
    inside = [n for n in circuit_heads if n in top_names]
    return dict(rows=effects["rows"], logit_diff=effects["logit_diff"], nodes=table,
                top_heads=top_names, circuit_heads_in_top=dict(
                    k=k, heads=inside, share=len(inside) / len(circuit_heads) if circuit_heads else None),
                literature=literature)


def _adapter(model, circuit):
    """‖ΔW‖/‖W‖ of every adapted module, per head of an attention output projection and per
    MLP, and the share of ‖ΔW‖² that sits on the circuit's nodes."""
    from peft.tuners.lora import LoraLayer
    H = circuit.n_heads
    present = set(n for i, n in enumerate(circuit.node_names) if circuit.nodes_in_graph()[i])
    modules, nodes = [], {}
    for name, module in model.named_modules():
        if not isinstance(module, LoraLayer) or not module.active_adapters:
            continue
        adapter = module.active_adapters[0]
        if adapter not in getattr(module, "lora_A", {}):
            continue
        with torch.no_grad():
            delta = module.get_delta_weight(adapter).float()
            weight = module.get_base_layer().weight
            if weight.dtype in (torch.uint8, torch.int8) or not weight.is_floating_point():
                modules.append(dict(module=name, ratio=None, note="quantized base: ‖W‖ not read"))
                continue
            weight = weight.float()
        layer = re.search(r"\.(\d+)\.", name)
        layer = int(layer.group(1)) if layer else None
        ratio = float(delta.norm() / weight.norm())
        modules.append(dict(module=name, layer=layer, ratio=ratio, delta_norm=float(delta.norm())))
        if layer is None:
            continue
        if re.search(r"(attn|attention)", name):
            # the output projection's input is the heads' outputs side by side: a head's slice
            cols = getattr(module, "fan_in_fan_out", False)
            d, w = (delta.T, weight.T) if cols else (delta, weight)
            if d.shape[1] % H == 0:
                hd = d.shape[1] // H
                for h in range(H):
                    dh, wh = d[:, h * hd:(h + 1) * hd], w[:, h * hd:(h + 1) * hd]
                    nodes[f"a{layer}.h{h}"] = dict(ratio=float(dh.norm() / wh.norm()),
                                                   sq=float(dh.norm() ** 2))
        elif "mlp" in name:
            prev = nodes.get(f"m{layer}", dict(sq=0.0, wsq=0.0))
            sq, wsq = prev["sq"] + float(delta.norm() ** 2), prev.get("wsq", 0.0) + float(weight.norm() ** 2)
            nodes[f"m{layer}"] = dict(ratio=math.sqrt(sq / wsq), sq=sq, wsq=wsq)
    total = sum(v["sq"] for v in nodes.values())
    on = sum(v["sq"] for n, v in nodes.items() if n in present)
    ranked = sorted(nodes.items(), key=lambda kv: -kv[1]["ratio"])
    n_circuit = sum(1 for n in nodes if n in present)
    share = on / total if total > 0 else None
    node_share = n_circuit / len(nodes) if nodes else None
    return dict(
        modules=sorted(modules, key=lambda m: -(m["ratio"] or 0)),
        top_nodes=[dict(node=n, ratio=v["ratio"], in_circuit=n in present) for n, v in ranked[:10]],
        circuit_nodes=[dict(node=n, ratio=v["ratio"], rank=i + 1) for i, (n, v) in enumerate(ranked) if n in present],
        circuit_share=share, circuit_node_share=node_share,
        concentration=(share / node_share) if share is not None and node_share else None)


def _full_model(model, tokenizer, run, fcfg, gate_ppl_ratio, cache):
    key = ("full_model", run.seed, fcfg.task_rows, fcfg.text_path, fcfg.text_blocks, fcfg.text_block_size)
    if key not in cache:
        cache[key] = OriginalOutputs(model, tokenizer, tasks.TASKS, "test", fcfg.task_rows, run.seed,
                                     run.batch_size, fcfg.text_blocks, fcfg.text_block_size, fcfg.text_path)
    out = cache[key].compare(model, run.accuracy_tol)
    out["text"].update(gate_ppl_ratio=gate_ppl_ratio, ppl_ratio_max=run.ppl_ratio_max)
    return out


def _value(entry):
    return None if entry is None else entry["value"]


def _summary(card, run, fcfg):
    s, flags = dict(task=run.task, edges=card["edges"]), []
    d = card.get("distribution")
    if d:
        s.update(accuracy=_value(d["accuracy"]), accuracy_original=_value(d["accuracy_original"]),
                 choice_agreement=d["choice_agreement"], top1_agreement=d["top1_agreement"],
                 kl=d["kl"], faithfulness=d["faithfulness"], rows=d["n"])
        e = d["original_errors"]
        s["errors_repeated"] = e["repeated"]
        if not e["enough"]:
            flags.append(f"the original errs on {e['rows']} of {d['n']} test rows (fewer than "
                         f"{e['wanted']}): how many errors the circuit repeats is not settled")
    g = card.get("generalisation")
    if g and g.get("paraphrase"):
        p = g["paraphrase"]
        s.update(paraphrase_accuracy=p["accuracy"], paraphrase_accuracy_original=p["accuracy_original"],
                 paraphrase_choice_agreement=p["choice_agreement"])
        gap = p["accuracy_original"]["value"] - p["accuracy"]["value"]
        if gap > run.accuracy_tol:
            flags.append(f"on paraphrases the circuit's accuracy is {p['accuracy']['value']:.3f} against "
                         f"the original's {p['accuracy_original']['value']:.3f} (beyond {run.accuracy_tol:g})")
    off = card.get("adapter_off")
    if off:
        c = off["completion"]
        s.update(adapter_off_faithfulness=off["faithfulness"], adapter_off_accuracy=off["accuracy"],
                 completion_edges=c["edges"], completion_added=c["added"])
        if card["healed"] and off["faithfulness"]["value"] < fcfg.completion_threshold:
            flags.append(f"on the original weights the circuit carries f {off['faithfulness']['value']:.3f}: "
                         f"it describes the healed model more than the original")
        if c["added"] is None:
            flags.append("no frozen completion: even every ranked edge with the circuit fails "
                         f"f >= {fcfg.completion_threshold:g} on the original")
    nodes = card.get("nodes")
    if nodes:
        s["circuit_heads_in_top"] = nodes["circuit_heads_in_top"]
    a = card.get("adapter")
    if a:
        s.update(adapter_circuit_share=a["circuit_share"], adapter_concentration=a["concentration"])
    fm = card.get("full_model")
    if fm:
        measured = {t: v for t, v in fm["tasks"].items() if "drop" in v}
        worst = max(measured, key=lambda t: measured[t]["drop"]) if measured else None
        s.update(full_model_worst_task=worst, full_model_max_drop=measured[worst]["drop"] if worst else None,
                 full_model_own_task=measured.get(run.task, {}).get("accuracy"),
                 full_model_own_task_original=measured.get(run.task, {}).get("accuracy_original"),
                 text_ppl_ratio=fm["text"]["ppl_ratio"], gate_ppl_ratio=fm["text"]["gate_ppl_ratio"])
        for t, v in measured.items():
            if v["broken"]:
                flags.append(f"the healed full model does {t} at {v['accuracy']['value']:.3f} against the "
                             f"original's {v['accuracy_original']['value']:.3f} (beyond {run.accuracy_tol:g})")
        r = fm["text"]["ppl_ratio"]
        if r["value"] > run.ppl_ratio_max:
            flags.append(f"perplexity on second-source text: ratio {r['value']:.3f} to the original "
                         f"(above {run.ppl_ratio_max:g})")
    return s, flags


def to_json(obj):
    """The card with tensors as lists, ready for json.dumps."""
    if isinstance(obj, torch.Tensor):
        return obj.tolist()
    if isinstance(obj, dict):
        return {str(k): to_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    return obj
