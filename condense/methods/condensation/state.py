"""Resume state and written files: each round commits its adapter and circuit, then
state/state.json last, so a kill at any moment leaves a consistent state (docs/design.md §6)."""
import json
import os

from condense.artifacts import atomic_write, damaged, read_json, read_tensors, writing, write_json
from condense.config import RecipeError
from condense.graph import Graph
from condense.tasks import SECOND_SOURCE
from condense.optimize import world

from .config import CondenseConfig, check_init_circuit_model
from .healing import adapter_state, load_adapter_state

STATE_FILE = "state.json"


def is_main():
    return world()[0] == 0


def barrier():
    if world()[1] > 1:
        import torch.distributed as dist
        dist.barrier()


def _save_state(out, model, circuit, state):
    """Commit a round (main process writes; every process returns the same state)."""
    from safetensors.torch import save
    # the final heal's adapter gets its own files: a kill before its state.json leaves the
    # previous commit's files untouched
    tag = f"r{state['accepted_round']:04d}" + ("f" if state.get("final_heal") else "")
    adapter_file, circuit_file = f"adapter_{tag}.safetensors", f"circuit_{tag}.json"
    if not is_main():
        barrier()
        return dict(state, adapter_file=adapter_file, circuit_file=circuit_file)
    sdir = os.path.join(out, "state")
    with writing(sdir):
        os.makedirs(sdir, exist_ok=True)
    # both parts, each atomically, every time (a kill between them leaves the last committed
    # state.json pointing at files of the previous commit, which are still there)
    atomic_write(os.path.join(sdir, adapter_file),
                 save({k: v.contiguous().cpu() for k, v in adapter_state(model).items()}))
    circuit.to_json(os.path.join(sdir, circuit_file))
    state = dict(state, adapter_file=adapter_file, circuit_file=circuit_file)
    write_json(os.path.join(sdir, STATE_FILE), state)  # last: commits the round
    # older accepted states are no longer referenced (the final heal's starting adapter is)
    keep = {adapter_file, circuit_file, (state.get("final_heal") or {}).get("from_adapter")}
    for f in os.listdir(sdir):
        if f.startswith(("adapter_r", "circuit_r")) and f not in keep:
            os.unlink(os.path.join(sdir, f))
    barrier()
    return state


def _load_state(out, model, peft_model, cfg):
    path = os.path.join(out, "state", STATE_FILE)
    if not os.path.exists(path):
        return None, None
    state = _read_state(path)
    if state.get("fingerprint") != _fingerprint(cfg):
        raise RecipeError(f"{path} was written by a different recipe; remove {out}/state to "
                          f"start over")
    missing = [f for f in (state["adapter_file"], state["circuit_file"])
               if not os.path.exists(os.path.join(out, "state", f))]
    if missing:  # a committed state always has both: someone removed them
        raise RecipeError(f"{path} names {', '.join(missing)}, which is missing; remove "
                          f"{out}/state to start over")
    load_adapter_state(peft_model, read_tensors(os.path.join(out, "state", state["adapter_file"])))
    circuit = Graph.from_json(os.path.join(out, "state", state["circuit_file"]), model)
    return state, circuit


def _read_state(path):
    """state.json through the checked reader: a JSON object naming its round's two files."""
    state = read_json(path)
    if not isinstance(state, dict) or not all(isinstance(state.get(k), str)
                                              for k in ("adapter_file", "circuit_file")):
        raise damaged(path, "not a condensation state (no adapter_file and circuit_file)")
    return state


RESUME_KEYS = ("model", "task", "n_train", "n_val", "seed", "ig_steps", "intervention", "metric",
               "heal", "prune", "prune_fraction", "min_prune_fraction", "heal_steps", "heal_lr",
               "heal_batch_size", "lora_rank", "lora_alpha", "lora_targets",
               "gate_accuracy_tol", "gate_ppl_ratio", "n_general", "init_circuit", "rank_at_circuit",
               "heal_general_weight", "heal_general_batch", "heal_ablated_grad",
               "heal_stop_loss", "gate_faithfulness", "rank_rows", "early_rank_method",
               "early_rank_edges", "heal_if_needed", "heal_dtype", "heal_gate_every",
               "gate_empty_fails", "heal_corrupted_weight", "gate_top1_agreement", "heal_temperature",
               "gate_tasks", "gate_task_rows", "gate_task_tol", "gate_task_kl", "gate_text_blocks",
               "gate_text_ppl_ratio", "gate_text_path", "gate_confidence", "heal_full_weight",
               "heal_adapter_penalty", "lora_on_circuit", "gate_adapter_off_faithfulness")
# a key at this value is left out of the fingerprint, so a state written before it existed resumes
OFF = dict(gate_faithfulness=0.0, rank_rows=None, early_rank_method=None, early_rank_edges=0,
           heal_if_needed=False, heal_dtype=None, heal_gate_every=0, gate_empty_fails=False,
           heal_corrupted_weight=0.0, gate_top1_agreement=0.0, heal_temperature=1.0,
           # the guards: off, and their settings at the defaults they have had since they exist
           gate_tasks="none", gate_text_blocks=0, gate_task_rows=50, gate_task_tol=None,
           gate_task_kl=0.5, gate_text_ppl_ratio=None, gate_text_path=SECOND_SOURCE,
           gate_confidence=0.0, heal_full_weight=0.0, heal_adapter_penalty=0.0, lora_on_circuit=False,
           gate_adapter_off_faithfulness=0.0)


def _fingerprint(cfg):
    return {k: getattr(cfg, k) for k in RESUME_KEYS if not (k in OFF and getattr(cfg, k) == OFF[k])}


def check_state(cfg: CondenseConfig) -> None:
    """Before anything is written: init_circuit fits the model, and a state in the output
    folder was written by this recipe (else rerunning would resume another run)."""
    check_init_circuit_model(cfg)
    path = os.path.join(cfg.output_dir, "state", STATE_FILE)
    if os.path.exists(path):
        state = _read_state(path)
        if state.get("fingerprint") != _fingerprint(cfg):
            old = state.get("fingerprint") or {}
            keys = sorted(k for k in set(old) | set(_fingerprint(cfg))
                          if old.get(k) != _fingerprint(cfg).get(k))
            raise RecipeError(f"{path} was written by a different recipe (differs in "
                              f"{', '.join(keys[:6])}); remove {cfg.output_dir}/state to start over")


def save_adapter(peft_model, out, base_model=None):
    """peft's save_pretrained into a scratch folder, then each file renamed into `out`.
    `base_model` (the recipe's model, e.g. "smollm2-135m") replaces the base path peft records,
    which for a named model is this machine's cache folder."""
    import shutil
    import tempfile
    with writing(out):  # a full disk or read-only folder: one line (peft's own writes inside)
        _save_adapter(peft_model, out, base_model, shutil, tempfile)


def _save_adapter(peft_model, out, base_model, shutil, tempfile):
    tmp = tempfile.mkdtemp(dir=out, prefix=".adapter-")
    try:
        peft_model.save_pretrained(tmp)
        config = os.path.join(tmp, "adapter_config.json")
        if base_model is not None and os.path.exists(config):
            with open(config) as f:
                data = json.load(f)
            data["base_model_name_or_path"] = base_model
            with open(config, "w") as f:
                json.dump(data, f, indent=2)
        for name in sorted(os.listdir(tmp)):
            if name == "README.md":  # peft's blank model-card template, naming the local base path
                continue
            os.replace(os.path.join(tmp, name), os.path.join(out, name))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_rounds(out, rounds):
    atomic_write(os.path.join(out, "rounds.jsonl"), "".join(json.dumps(r) + "\n" for r in rounds))
