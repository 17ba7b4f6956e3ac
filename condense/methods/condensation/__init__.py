"""Condensation, method `condense`: rank -> prune -> heal -> gate.

Each round:
1. rank: EAP-IG (inputs, `ig_steps`) with the current adapter on the train rows, linearised at
   the current circuit (pruned edges ablated in every pass; `rank_at_circuit=false`: at the
   full model); only the surviving edges' scores count;
2. prune: drop the lowest `cut` fraction of the surviving edges by |score|, then
   Graph.prune() drops edges left off every input -> logits path;
3. heal (`heal=true`): `heal_steps` AdamW steps on the LoRA parameters only (base frozen),
   loss = KL(original model on clean || circuit model with adapter) at the **last position**
   of each prompt (where the task metric is read), pruned edges ablated by patching with
   the same model+adapter in the same step (the gradient flows through that run too;
   `heal_ablated_grad=false` detaches it), plus
   `heal_general_weight` x KL(original || model+adapter) on general text (train split, full
   graph). The design's loss is the task term alone (heal_general_weight=0); measured on the
   organism, the task term alone moves general text until the perplexity gate rejects every
   later round (docs/condensation.md), so the default keeps general text distilled too;
   With `heal_if_needed` the candidate is gated first and healed only when that gate rejects
   it (the accepted-unhealed rounds are logged);
4. gate on held-out data: circuit accuracy on the val rows >= the original full model's
   val accuracy - `gate_accuracy_tol`, and perplexity (model+adapter, plain full forward)
   / perplexity (original) <= `gate_ppl_ratio` on `n_general` blocks of general text
   (split `val`); the empty circuit (model+adapter, every edge ablated) must stay below that
   accuracy floor (`gate_empty_fails`; else the adapter answers from the corrupted run and
   the circuit's edges carry nothing); with `gate_faithfulness` > 0 also val faithfulness
   f(C) >= it (f against the original model's full logit difference, the empty circuit of
   model+adapter); with `gate_top1_agreement` > 0 also the fraction of val rows whose top-1
   token (whole vocabulary) is the original model's >= it.
   A round whose heal loss turns NaN/inf is rejected (logged).
On rejection the last accepted adapter and circuit are restored and the cut halves (at
least `min_prune_fraction`); a rejected cut at that floor, or `max_rounds`, ends the run.
Two candidates are rejected without a heal (logged in rounds.jsonl as `skipped`): one with
no input -> logits path left, and one whose edges equal a candidate already rejected since
the last accepted round (on small circuits every halved cut still removes one edge, the
same one: its heal would only be re-seeded).
C1 = the last accepted circuit. `heal=false` gives C0; `prune=false` heals the full graph
once, then ranks with EAP-IG and reports the smallest faithful circuit (curves.smallest_faithful).

Determinism and resume: every random draw of a round comes from a generator seeded with
(seed, round), data order is fixed, so no RNG state has to be carried between rounds. After
every round `state/` gets the accepted adapter and circuit (files named by round), then
`state/state.json` (round counter, current cut, accepted files, per-round log, seeds) is
renamed into place last: a kill at any moment leaves a consistent state, and rerunning the
same command continues from it and ends with the same circuit as an uninterrupted run.

Data parallel (`ACCELERATE_USE_CPU=1 accelerate launch --multi_gpu --num_processes N` on CPU,
`--multi_gpu` on GPUs): every process runs this loop. Ranking splits the train rows over the
processes and sums the per-row scores (all-reduce); heal draws the same batch everywhere, each
process takes its share (condense.optimize.shard) and fit() averages the gradients, so every
process applies the same update; the gate and the final metrics are computed by every process
on the same data and weights (identical decisions without communication); only the main process
writes. Up to float summation order this is the one-process run, so it ends with the same
circuit (tests/test_condense.py checks it). Use heal_batch_size divisible by N.
"""

from condense.methods import register

from .config import CondenseConfig, check_init_circuit_model, read_circuit_file
from .gate import Gate, circuit_metrics, template_split_metrics
from .healing import (
                      HealDiverged,
                      adapter_state,
                      add_adapter,
                      general_loss,
                      heal,
                      heal_loss,
                      last_logprobs,
                      load_adapter_state,
                      lora_targets,
)
from .loop import cut_edges, initial_circuit, rank, rank_method, run_condense
from .state import check_state, save_adapter

register("condense", CondenseConfig, run_condense, data_parallel=True, prepare=check_state,
         help="condensation: rank -> prune -> heal (LoRA) -> gate")

__all__ = ["CondenseConfig", "Gate", "HealDiverged", "add_adapter", "adapter_state",
           "check_init_circuit_model", "check_state", "circuit_metrics", "cut_edges",
           "general_loss", "heal", "heal_loss", "initial_circuit", "last_logprobs",
           "load_adapter_state", "lora_targets", "rank", "rank_method", "read_circuit_file",
           "run_condense", "save_adapter", "template_split_metrics"]
