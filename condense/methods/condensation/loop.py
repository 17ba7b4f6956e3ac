"""The condensation loop: rank -> prune -> heal -> gate, round by round (see the package
docstring), then the final metrics and files."""
import dataclasses
import math
import os
import time

import torch

from condense import fidelity, tasks
from condense.artifacts import atomic_write, write_json
from condense.attribute import attribute
from condense.curves import smallest_faithful
from condense.evaluate import reference_outputs
from condense.graph import Graph
from condense.metrics import perplexity
from condense.optimize import all_reduce_, shard, world
from condense.runs import RunContext, log

from .gate import Gate, circuit_metrics, template_split_metrics
from .healing import (
    HealDiverged,
    _round_seed,
    adapter_state,
    add_adapter,
    edge_key,
    heal,
    last_logprobs,
    load_adapter_state,
)
from .state import (
    _fingerprint,
    _load_state,
    _save_state,
    _write_rounds,
    barrier,
    is_main,
    save_adapter,
)


def rank_method(graph, cfg):
    """EAP-IG, or `early_rank_method` while the circuit has more than `early_rank_edges` edges."""
    if cfg.early_rank_method and graph.count_edges(on_path=True) > cfg.early_rank_edges:
        return cfg.early_rank_method
    return "eap_ig_inputs"


def rank(model, graph, rows, cfg, progress=True, means=None):
    """Scores (EAP-IG, see rank_method) into graph.scores; pruned (not in_graph) edges' scores
    set to 0. With several processes each scores its share of the rows and the sums are
    all-reduced. `rank_rows` limits the rows. `means`: what removed edges carry under mean
    ablation."""
    if cfg.rank_rows is not None and cfg.rank_rows < len(rows):
        rows = rows.select(range(cfg.rank_rows))
    n = len(rows)
    mine = shard(list(range(n)))
    local = rows.select(mine) if len(mine) < n else rows
    scores = attribute(model, graph, local, rank_method(graph, cfg), ig_steps=cfg.ig_steps,
                       intervention=cfg.intervention, metric=cfg.metric,
                       batch_size=cfg.batch_size, seed=cfg.seed, progress=progress and is_main(),
                       at_circuit=cfg.rank_at_circuit, means=means)
    if world()[1] > 1:  # attribute returns a mean over its rows: back to sums, then the mean
        device = next(model.parameters()).device
        total = all_reduce_(scores.to(device, torch.float64) * len(mine))
        scores = (total / n).float().cpu()
    graph.scores = scores.masked_fill(~(graph.in_graph & graph.valid), 0.0)
    return graph


def cut_edges(graph, fraction):
    """A copy of `graph` without the lowest `fraction` of its surviving edges by |score|."""
    g = graph.copy()
    alive = g.in_graph & g.valid
    n_alive = int(alive.sum())
    n_drop = min(n_alive, max(1, int(round(fraction * n_alive))))
    ranked = g.scores.abs().masked_fill(~alive, float("inf")).flatten()
    # stable order: ties broken by edge position, so runs are reproducible
    order = torch.sort(ranked, stable=True).indices[:n_drop]
    flat = g.in_graph.flatten().clone()
    flat[order] = False
    g.in_graph = flat.view_as(g.in_graph) & g.valid
    g.prune()
    return g


# ------------------------------------------------------------------ pictures
def plot_rounds(rounds, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    r = [x["round"] for x in rounds]
    ax.plot(r, [x["edges"] for x in rounds], "o-", color="tab:blue", label="edges")
    for x in rounds:
        if not x["accepted"]:
            ax.plot(x["round"], x["edges"], "x", color="red", ms=9)
    ax.set_yscale("log")
    ax.set_xlabel("round (x = rejected)")
    ax.set_ylabel("edges", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(r, [x["accuracy"] for x in rounds], "s--", color="tab:green", label="val accuracy")
    if any("top1_agreement" in x for x in rounds):  # runs before it was recorded lack it
        ax2.plot(r, [x.get("top1_agreement", float("nan")) for x in rounds], "^:",
                 color="tab:purple", label="val top-1 agreement")
        ax2.legend(loc="lower left", fontsize=8)
    ax2.set_ylabel("val accuracy" + (" / top-1 agreement" if any("top1_agreement" in x for x in rounds)
                                     else ""), color="tab:green")
    ax2.set_ylim(0, 1.05)
    ax.set_title(title)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100), mode="wb")
    plt.close(fig)


def _wandb_log(accelerator, cfg, record):
    if cfg.report_to == "wandb":
        accelerator.log({f"round/{k}": v for k, v in record.items()
                         if isinstance(v, (int, float)) and not isinstance(v, bool)},
                        step=record["round"])


# ------------------------------------------------------------------ the runner
class _Loop:
    """One condensation run, in phases: start (or resume), rounds, final metrics and files."""

    def __init__(self, ctx: RunContext):
        cfg = self.cfg = ctx.cfg
        self.ctx, self.out, self.rows = ctx, ctx.out, ctx.rows
        self.start_time = time.perf_counter()
        model = ctx.model
        self.blocks = list(tasks.general_text(ctx.tokenizer, "val")["input_ids"])[:cfg.n_general]
        self.train_blocks = (list(tasks.general_text(ctx.tokenizer, "train")["input_ids"])
                             if cfg.heal and cfg.heal_general_weight > 0 else None)
        log(f"condense {cfg.task}: {len(self.blocks)} general-text blocks; heal={cfg.heal} "
            f"prune={cfg.prune}")
        self.full = ctx.graph
        # under mean ablation a removed edge carries the ORIGINAL model's sender means over the
        # train prompts (open_run computed them before any adapter existed): fixed for the whole
        # run, so a heal cannot move what pruned edges carry, and verify can compute them again
        self.means = ctx.means
        # the original model's outputs, before any adapter exists
        self.target_logp = last_logprobs(model, self.rows["train"], cfg.batch_size) if cfg.heal else None
        self.corrupted_logp = (last_logprobs(model, self.rows["train"], cfg.batch_size, "corrupted_ids")
                               if cfg.heal and cfg.heal_corrupted_weight > 0 else None)
        self.gate = Gate(model, self.full, self.rows["val"], self.blocks, cfg, self.means,
                         tokenizer=ctx.tokenizer)
        self.test_ref = reference_outputs(model, self.full, self.rows["test"], cfg.intervention,
                                          cfg.batch_size, self.means)
        log(f"original model: val accuracy {self.gate.accuracy_original:.3f}, general-text ppl "
            f"{self.gate.ppl_original:.2f}")
        self.model = add_adapter(model, cfg)
        # the final heal's rows, drawn now so that a split too small fails before any round
        self.final_rows = (tasks.load_task(cfg.task, ctx.tokenizer, "train", n=cfg.final_heal_rows,
                                           seed=cfg.seed)
                           if cfg.final_heal_steps and cfg.final_heal_rows else None)

    def start(self):
        """(state, circuit): the committed state of an earlier run of the same recipe, or round 0."""
        cfg = self.cfg
        state, circuit = _load_state(self.out, self.ctx.model, self.model, cfg)
        # the wall time of earlier processes on this run, up to each one's last commit
        self.earlier_seconds = float(state.get("seconds", 0.0)) if state is not None else 0.0
        barrier()  # every process has read the state before the main one may write a first one
        if state is None:
            circuit = initial_circuit(self.full, cfg, self.ctx.model)
            state = dict(round=0, accepted_round=0, cut=cfg.prune_fraction, done=False, rounds=[],
                         fingerprint=_fingerprint(cfg),
                         seeds="round r draws from torch.Generator().manual_seed(seed*100003 + r)")
            state = self._commit(circuit, state)
        else:
            log(f"resuming after round {state['round']} (accepted round {state['accepted_round']}, "
                f"{circuit.count_edges(on_path=True)} edges, cut {state['cut']:.3f})")
            if is_main():
                self._drop_spent_heals(state["round"])
                if state.get("final_heal") and os.path.exists(self._heal_file("final")):
                    os.remove(self._heal_file("final"))  # committed before a kill removed it
        return state, circuit

    def _commit(self, circuit, state):
        """Save the state (condensation.state._save_state) with the run's wall time so far."""
        state["seconds"] = self.earlier_seconds + time.perf_counter() - self.start_time
        return _save_state(self.out, self.model, circuit, state)

    def round(self, state, circuit):
        """Rank, cut, heal and gate one round; commit it; returns the new (state, circuit)."""
        cfg, model = self.cfg, self.model
        rnd = state["round"] + 1
        t0 = time.perf_counter()
        torch.manual_seed(_round_seed(cfg, rnd))
        cut = state["cut"] if cfg.prune else 0.0
        if cfg.prune:
            rank(model, circuit, self.rows["train"], cfg, means=self.means)
            candidate = cut_edges(circuit, cut)
        else:
            candidate = circuit.copy()
        accepted_adapter = adapter_state(model)
        note, losses, resumed = "", [], {}
        key = edge_key(candidate)
        try:
            if cfg.prune and candidate.count_edges(on_path=True) == 0:
                raise _Skip("no input -> logits path left")
            if cfg.prune and key in state.get("rejected_since_accept", []):
                raise _Skip("the same edges as a cut already rejected since the last accepted "
                            "round (a smaller cut removes the same edges)")
            ok, g = (self.gate(model, candidate) if cfg.heal_if_needed or not cfg.heal
                     else (False, None))
            if cfg.heal and not ok:
                if cfg.heal_if_needed:
                    note = "healed: the gate rejected the unhealed candidate"
                losses = heal(model, candidate, self.rows["train"], self.target_logp, cfg, rnd,
                              general_blocks=self.train_blocks, corrupted_logp=self.corrupted_logp,
                              state_path=self._heal_file(rnd), resumed=resumed, means=self.means,
                              # heal-only (prune=false) heals in full: its heal is the control
                              # early stops skip the guards (the full model's costly checks):
                              # the gate after the heal asks them
                              accepts=(lambda: self.gate(model, candidate, guards=False)[0])
                              if cfg.prune else None)
                ok, g = self.gate(model, candidate)
            elif cfg.heal:
                note = "accepted before healing"
        except (HealDiverged, _Skip) as e:  # _Skip: decided without heal or gate (resume-safe)
            note = f"heal diverged: {e}" if isinstance(e, HealDiverged) else f"skipped: {e}"
            ok, g = False, _NOT_GATED
        ok = self._agreed(ok)
        record = dict(round=rnd, cut=cut, accepted=bool(ok), edges=candidate.count_edges(on_path=True),
                      **_gate_fields(g), heal_loss=losses[-1] if losses else None,
                      heal_steps=len(losses), note=note,
                      # a heal that went on from a save counts its earlier processes' steps
                      time=resumed.get("seconds", 0.0) + time.perf_counter() - t0)
        log(f"round {rnd}: cut {cut:.3f} -> {record['edges']} edges, val accuracy "
            f"{record['accuracy']:.3f} (original {self.gate.accuracy_original:.3f}), ppl ratio "
            f"{record['ppl_ratio']:.4f}, f {record['faithfulness']:.3f}, top-1 agreement "
            f"{record['top1_agreement']:.3f}: {'accepted' if ok else 'rejected'}"
            + (f" ({note})" if note else "")
            + ("" if g["gate_empty"] else f"; the empty circuit passes too "
               f"(accuracy {record['accuracy_empty']:.3f})") + _guard_note(g))
        if is_main():
            _wandb_log(self.ctx.accelerator, cfg, record)
        state["rounds"].append(record)
        state["round"] = rnd
        if ok:
            circuit = candidate
            state["accepted_round"] = rnd
            state["rejected_since_accept"] = []
            state["done"] = circuit.count_edges(on_path=True) <= 1
        else:
            state.setdefault("rejected_since_accept", []).append(key)
            load_adapter_state(model, accepted_adapter)
            if not cfg.prune or cut <= cfg.min_prune_fraction + 1e-12:
                state["done"] = True
            else:
                state["cut"] = max(cut / 2, cfg.min_prune_fraction)
        state = self._commit(circuit, state)
        if is_main():
            _write_rounds(self.out, state["rounds"])
            self._drop_spent_heals(rnd)  # committed: the heal's own save is spent
        return state, circuit

    def _heal_file(self, rnd) -> str:
        """Where round `rnd`'s heal (or, as "final", the final heal) saves itself as it goes, so
        that a run killed mid-heal goes on from there instead of healing from the start."""
        name = "heal_final.pt" if rnd == "final" else f"heal_r{rnd:04d}.pt"
        return os.path.join(self.out, "state", name)

    def _drop_spent_heals(self, committed_round):
        """Remove the heal saves of rounds up to `committed_round` (a kill between a round's
        commit and this leaves one, which the next start removes)."""
        sdir = os.path.join(self.out, "state")
        for name in os.listdir(sdir) if os.path.isdir(sdir) else []:
            if name.startswith("heal_r") and name.endswith(".pt") \
                    and int(name[len("heal_r"):-len(".pt")]) <= committed_round:
                os.remove(os.path.join(sdir, name))

    def _agreed(self, ok):
        """The same accept/reject decision in every process, even if floats ever differed."""
        if world()[1] > 1:
            votes = all_reduce_(torch.tensor([float(bool(ok))], device=self.ctx.device))
            ok = votes.item() == world()[1]
        return bool(ok)

    def final_heal(self, state, circuit):
        """`final_heal_steps` more heal steps on the final circuit (no early stop), on the first
        `final_heal_rows` train rows (null: the run's), kept only if the gate still accepts;
        recorded in state["final_heal"] (with the adapter it started from, kept in state/) and
        in metrics.json."""
        cfg, model = self.cfg, self.model
        t0 = time.perf_counter()
        before = adapter_state(model)
        rows, target, corrupted = self.rows["train"], self.target_logp, self.corrupted_logp
        if self.final_rows is not None and len(self.final_rows) != len(rows):
            rows = self.final_rows
            with model.disable_adapter():  # the original model's outputs on the new rows
                target = last_logprobs(model, rows, cfg.batch_size)
                if corrupted is not None:
                    corrupted = last_logprobs(model, rows, cfg.batch_size, "corrupted_ids")
        steps_cfg = dataclasses.replace(cfg, heal_steps=cfg.final_heal_steps, heal_stop_loss=0.0)
        rnd = state["round"] + 1  # the seed of the round that would come next
        resumed = {}
        try:
            losses = heal(model, circuit, rows, target, steps_cfg, rnd,
                          general_blocks=self.train_blocks, desc="final heal",
                          corrupted_logp=corrupted, state_path=self._heal_file("final"),
                          resumed=resumed, means=self.means)
            ok, g = self.gate(model, circuit)
        except HealDiverged as e:
            losses, ok, g = [], False, _NOT_GATED
            log(f"final heal diverged: {e}")
        ok = self._agreed(ok)
        if not ok:
            load_adapter_state(model, before)
        record = dict(steps=cfg.final_heal_steps, rows=len(rows), accepted=bool(ok),
                      edges=circuit.count_edges(on_path=True), **_gate_fields(g),
                      heal_loss=losses[-1] if losses else None,
                      time=resumed.get("seconds", 0.0) + time.perf_counter() - t0,
                      from_adapter=state["adapter_file"])
        log(f"final heal ({cfg.final_heal_steps} steps, {len(rows)} rows): val accuracy "
            f"{record['accuracy']:.3f}, KL {record['kl']:.4f}, top-1 agreement "
            f"{record['top1_agreement']:.3f}, ppl ratio {record['ppl_ratio']:.4f}, "
            f"f {record['faithfulness']:.3f}: "
            f"{'kept' if ok else 'rejected, the last accepted adapter kept'}")
        state["final_heal"] = record
        state = self._commit(circuit, state)
        if is_main() and os.path.exists(self._heal_file("final")):
            os.remove(self._heal_file("final"))
        return state

    def undo_final_heal(self, state, circuit):
        """Back to the adapter the final heal started from (before more rounds, or before a
        final heal of other settings), so that a final heal never changes what rounds do."""
        from condense.artifacts import read_tensors
        record = state.pop("final_heal")
        load_adapter_state(self.model, read_tensors(os.path.join(self.out, "state", record["from_adapter"])))
        log("final heal undone: its settings changed or more rounds follow")
        return self._commit(circuit, state)

    def finish(self):
        """Final metrics on test from the committed state (a resumed run ends identically)."""
        cfg, model, rows = self.cfg, self.model, self.rows
        state, circuit = _load_state(self.out, self.ctx.model, model, cfg)
        extra = {}
        if not cfg.prune:  # heal-only control: rank the healed model, smallest faithful circuit
            rank(model, circuit, rows["train"], cfg, means=self.means)
            found = smallest_faithful(model, circuit, rows["val"], cfg.faithfulness_threshold,
                                      absolute=cfg.absolute_scores, intervention=cfg.intervention,
                                      batch_size=cfg.batch_size, resolution=cfg.search_resolution,
                                      means=self.means)
            if found.graph is not None:
                circuit = found.graph
            extra = dict(faithful_on_val=found.graph is not None, faithfulness_val=found.faithfulness)
        test = circuit_metrics(model, circuit, rows["test"], self.test_ref, cfg, means=self.means)
        extra.update(template_split_metrics(model, circuit, rows["test"], self.test_ref, cfg, self.means))
        ppl = perplexity(model, self.blocks, cfg.batch_size) if self.blocks else math.nan
        metrics = dict(
            method=cfg.method, task=cfg.task, model=cfg.model, heal=cfg.heal, prune=cfg.prune,
            edges=circuit.count_edges(on_path=True), total_edges=int(self.full.valid.sum()),
            accuracy=test["accuracy"], accuracy_original=test["accuracy_full"],
            accuracy_empty=test["accuracy_empty"], top1=test["top1"],
            top1_agreement=test["top1_agreement"], choice_agreement=test["choice_agreement"],
            logit_diff=test["logit_diff"],
            logit_diff_original=test["logit_diff_full"], faithfulness=test["faithfulness"],
            kl=test["kl"], ppl_ratio=ppl / self.gate.ppl_original if self.blocks else math.nan,
            ppl=ppl, ppl_original=self.gate.ppl_original,
            accuracy_original_val=self.gate.accuracy_original, rounds=state["round"],
            accepted_rounds=sum(r["accepted"] for r in state["rounds"]),
            wall_seconds=time.perf_counter() - self.start_time,  # this process
            # and every earlier process on this run up to its last commit (a resumed run)
            wall_seconds_total=self.earlier_seconds + time.perf_counter() - self.start_time,
            rounds_seconds=sum(r.get("time", 0.0) for r in state["rounds"]),
            n_train=len(rows["train"]), n_val=len(rows["val"]), n_test=len(rows["test"]),
            n_general=len(self.blocks), **extra)
        if state.get("final_heal"):
            metrics["final_heal"] = state["final_heal"]
        card = None
        if cfg.fidelity and is_main():  # measured on the main process only: it writes the files
            log("fidelity card: how much of the circuit the original model carries")
            card = fidelity.measure(model, self.ctx.tokenizer, circuit, cfg, means=self.means,
                                    gate_ppl_ratio=metrics["ppl_ratio"], log=lambda m: log(f"fidelity: {m}"))
            metrics["fidelity"] = fidelity.to_json(dict(summary=card["summary"], flags=card["flags"]))
            for flag in card["flags"]:
                log(f"fidelity flag: {flag}")
        name = "heal-only" if not cfg.prune else ("C1" if cfg.heal else "C0")
        log(f"{name}: {metrics['edges']} edges, test accuracy "
            f"{metrics['accuracy']:.3f} (original {metrics['accuracy_original']:.3f}), KL "
            f"{metrics['kl']:.4f}, ppl ratio {metrics['ppl_ratio']:.4f}")
        if is_main():
            self.write(circuit, state, metrics, card)
        return metrics

    def write(self, circuit, state, metrics, card=None):
        out = self.out
        if card is not None:
            write_json(os.path.join(out, "fidelity.json"), fidelity.to_json(card))
        save_adapter(self.model, out, self.cfg.model)
        circuit.to_json(os.path.join(out, "circuit.json"))
        circuit.to_image(os.path.join(out, "circuit.png"))
        _write_rounds(out, state["rounds"])
        if state["rounds"]:
            plot_rounds(state["rounds"], os.path.join(out, "rounds.png"),
                        f"condense {self.cfg.task}: edges and val accuracy per round")
        write_json(os.path.join(out, "metrics.json"), metrics)


def run_condense(ctx: RunContext) -> dict:
    """The condensation run (see the module docstring); returns metrics.json's contents."""
    loop = _Loop(ctx)
    state, circuit = loop.start()
    cfg = ctx.cfg
    max_rounds = cfg.max_rounds if cfg.prune else 1
    wanted = (dict(steps=cfg.final_heal_steps, rows=cfg.final_heal_rows or cfg.n_train)
              if cfg.final_heal_steps and cfg.heal and cfg.prune else None)
    done = state.get("final_heal")
    more_rounds = not state["done"] and state["round"] < max_rounds
    if done and (more_rounds or wanted != dict(steps=done["steps"], rows=done["rows"])):
        state = loop.undo_final_heal(state, circuit)
    while not state["done"] and state["round"] < max_rounds:
        state, circuit = loop.round(state, circuit)
    if wanted and not state.get("final_heal"):
        state = loop.final_heal(state, circuit)
    return loop.finish()


# what a round's (and the final heal's) record keeps of the gate's verdict
GATE_FIELDS = ("accuracy", "accuracy_empty", "ppl_ratio", "kl", "top1_agreement", "faithfulness",
               "accuracy_margin_low", "adapter_off_faithfulness", "task_drop_max", "task_kl_max", "text_ppl_ratio", "broken_tasks")
# the gate's record of a candidate it never saw (heal diverged, or skipped)
_NOT_GATED = dict({k: math.nan for k in GATE_FIELDS}, gate_empty=True, gate_tasks=True, gate_text=True,
                  broken_tasks="")


def _gate_fields(g: dict) -> dict:
    return {k: g.get(k, math.nan) for k in GATE_FIELDS}


def _guard_note(g: dict) -> str:
    """Why the capability guards rejected a candidate ('' when they did not)."""
    parts = []
    if not g.get("gate_tasks", True):
        parts.append(f"the healed full model breaks {g['broken_tasks']} (largest accuracy drop "
                     f"{g['task_drop_max']:.3f}, largest KL {g['task_kl_max']:.3f})")
    if not g.get("gate_text", True):
        parts.append(f"second-source perplexity ratio {g['text_ppl_ratio']:.4f}")
    return "; guard: " + "; ".join(parts) if parts else ""


class _Skip(Exception):
    """A candidate rejected without healing it (empty, or already rejected)."""


def initial_circuit(full, cfg, model):
    """The circuit round 1 starts from: the full graph, or `init_circuit` (any run's
    circuit.json, e.g. from edge_pruning or hap) pruned to its input -> logits paths."""
    circuit = full.copy()
    circuit.reset(in_graph=True)
    if cfg.init_circuit:
        if not os.path.exists(cfg.init_circuit):
            raise FileNotFoundError(f"init_circuit {cfg.init_circuit!r} does not exist")
        start = Graph.from_json(cfg.init_circuit, model)
        circuit.in_graph = start.in_graph & circuit.valid
        circuit.prune()
        log(f"starting from {cfg.init_circuit}: {circuit.count_edges(on_path=True)} edges")
    return circuit
