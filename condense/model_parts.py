"""Which Hugging Face causal LMs the edge-level graph supports, and a uniform view of their parts.

The patched forward (condense/patching.py) never re-implements a model: it calls the model's
own submodules (norms, projections, rotary, MLP, lm_head) so that anything wrapped around
them, a peft LoRA adapter in particular, takes effect. This module finds those submodules for
each supported family, refuses configurations the patched forward cannot reproduce exactly,
and splits the attention projections per head:

- `project_per_head`: head h's q/k/v from its *own* residual input (edge-level graphs give
  every head receiver a different input);
- `split_heads_output`: head h's share of the output projection, o_proj(z_h only).

Both take a fast path through the weights when the module is a plain `nn.Linear`/`Conv1D` or
a vanilla peft LoRA layer over one (W + scaling * B @ A), and otherwise call the module on an
expanded input (exact for any affine module, H times the work).
"""
import sys
from dataclasses import dataclass

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from condense.quantized import dequantized_weight, is_quantized_linear

SUPPORTED_FAMILIES = {"gpt2": "GPT-2", "llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3",
                      "mistral": "Mistral", "gemma": "Gemma", "gemma2": "Gemma2",
                      "gemma3_text": "Gemma3"}
SUPPORTED_TEXT = ", ".join(f"{v} ({k})" for k, v in SUPPORTED_FAMILIES.items())

# Set by tests to check that the generic (module-calling) path equals the weight fast path.
FORCE_GENERIC_PROJECTIONS = False


class UnsupportedModelError(ValueError):
    """A model or configuration the exact edge-level forward does not handle."""


def unwrap_model(model):
    """The Hugging Face model under peft / DDP / accelerate wrappers (adapter layers stay in it)."""
    while True:
        if hasattr(model, "get_base_model"):  # peft.PeftModel
            model = model.get_base_model()
        elif isinstance(model, nn.parallel.DistributedDataParallel) or (
                type(model).__name__ in ("DistributedDataParallel", "FullyShardedDataParallel")
                and hasattr(model, "module")):
            model = model.module
        else:
            return model


def _config(model_or_config):
    return getattr(unwrap_model(model_or_config), "config", model_or_config)


def check_supported(config):
    """Raise UnsupportedModelError, naming what is supported, unless the config is handled exactly."""
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED_FAMILIES:
        hint = ""
        if kind == "gemma3":  # what AutoModelForCausalLM loads for the 4B+ Gemma-3 checkpoints
            hint = (" (Gemma-3's multimodal Gemma3ForConditionalGeneration is not supported, only "
                    "the text-only Gemma3ForCausalLM, model_type 'gemma3_text')")
        raise UnsupportedModelError(
            f"condense's edge-level graph does not support model_type {kind!r} "
            f"({type(config).__name__}){hint}; supported families: {SUPPORTED_TEXT}.")
    refuse = []
    if kind == "gpt2" and getattr(config, "add_cross_attention", False):
        refuse.append("GPT-2 with cross-attention (add_cross_attention=True)")
    if getattr(config, "use_bidirectional_attention", False):
        refuse.append("bidirectional (non-causal) attention (use_bidirectional_attention=True)")
    if getattr(config, "parallel_attn", False) or getattr(config, "use_parallel_residual", False):
        refuse.append("parallel attention/MLP blocks")
    layer_types = getattr(config, "layer_types", None) or []
    odd = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
    if odd:
        refuse.append(f"attention layer types {odd}")
    if refuse:
        raise UnsupportedModelError(
            f"condense's edge-level graph cannot reproduce {', '.join(refuse)} exactly; it supports "
            f"causal sequential blocks (full or sliding-window attention) of: {SUPPORTED_TEXT}.")


@dataclass(frozen=True)
class ModelShape:
    model_type: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_model: int
    d_mlp: int


def model_shape(model_or_config):
    """Dimensions the graph needs; reads only the config (works on meta-device models)."""
    cfg = _config(model_or_config)
    check_supported(cfg)
    d_model, n_heads = cfg.hidden_size, cfg.num_attention_heads
    if cfg.model_type == "gpt2":
        n_kv, head_dim = n_heads, d_model // n_heads
        d_mlp = cfg.n_inner if cfg.n_inner is not None else 4 * d_model
    else:
        n_kv = getattr(cfg, "num_key_value_heads", None) or n_heads
        head_dim = getattr(cfg, "head_dim", None) or d_model // n_heads
        d_mlp = cfg.intermediate_size
    return ModelShape(cfg.model_type, cfg.num_hidden_layers, n_heads, n_kv, head_dim, d_model, d_mlp)


def sliding_windows(config):
    """Per layer: the sliding window (keys with q - k < window are visible) or None, as HF does."""
    n = config.num_hidden_layers
    if config.model_type == "mistral":  # Mistral applies config.sliding_window to every layer
        return [config.sliding_window] * n
    layer_types = getattr(config, "layer_types", None)
    if not layer_types:
        return [None] * n
    return [config.sliding_window if t == "sliding_attention" else None for t in layer_types]


@dataclass
class Projection:
    """Rows `offset + module_head * head_dim + [0, head_dim)` of `module`'s output."""
    module: nn.Module
    offset: int
    head_of: torch.Tensor  # [n_query_heads]: which of the module's heads each query head reads (GQA)


@dataclass
class LayerParts:
    attn_norm: nn.Module
    q: Projection
    k: Projection
    v: Projection
    q_norm: nn.Module | None      # Qwen3, Gemma3: RMSNorm over head_dim on q and k
    k_norm: nn.Module | None
    scaling: float
    softcap: float | None         # Gemma2 attention logit soft-capping
    sliding_window: int | None
    o_proj: nn.Module
    post_attn_norm: nn.Module | None  # Gemma2, Gemma3: RMSNorm on the attention output
    mlp_norm: nn.Module
    mlp: nn.Module
    mlp_down: nn.Module           # its input is the MLP's hidden units (neuron masks act there)
    post_mlp_norm: nn.Module | None   # Gemma2, Gemma3
    rotary_type: str | None = None    # Gemma3: the rotary module's embedding for this layer type


@dataclass
class ModelParts:
    shape: ModelShape
    token_embed: nn.Module
    position_embed: nn.Module | None  # GPT-2 learned positions
    rotary: nn.Module | None
    apply_rotary: object              # the family's apply_rotary_pos_emb
    layers: list
    final_norm: nn.Module
    lm_head: nn.Module
    final_softcap: float | None       # Gemma2, Gemma3 final logit soft-capping

    def embed(self, ids):
        """The `input` node: token (+ learned position) embeddings, Gemma's sqrt(d) scale included."""
        x = self.token_embed(ids)
        if self.position_embed is not None:
            x = x + self.position_embed(torch.arange(ids.shape[1], device=ids.device))[None]
        return x

    def rotary_tables(self, like, T):
        """Per layer: (cos, sin) at positions 0..T-1 (None without rotary), as HF computes them
        for `like`'s dtype and device; each distinct one computed once (Gemma3's local and
        global layers use different rotary embeddings)."""
        if self.rotary is None:
            return [None] * len(self.layers)
        positions = torch.arange(T, device=like.device)[None]
        tables = {}
        for lp in self.layers:
            if lp.rotary_type not in tables:
                extra = () if lp.rotary_type is None else (lp.rotary_type,)
                tables[lp.rotary_type] = self.rotary(like, positions, *extra)
        return [tables[lp.rotary_type] for lp in self.layers]


def model_parts(model):
    """Collect the submodules of a supported model (peft adapters stay inside them)."""
    hf = unwrap_model(model)
    shape = model_shape(hf)
    cfg = hf.config
    H = shape.n_heads
    heads = torch.arange(H)
    windows = sliding_windows(cfg)
    layers = []
    if shape.model_type == "gpt2":
        body = hf.transformer
        for block in body.h:
            at = block.attn
            layers.append(LayerParts(
                attn_norm=block.ln_1, q=Projection(at.c_attn, 0, heads),
                k=Projection(at.c_attn, shape.d_model, heads),
                v=Projection(at.c_attn, 2 * shape.d_model, heads),
                q_norm=None, k_norm=None, scaling=at.scaling, softcap=None, sliding_window=None,
                o_proj=at.c_proj, post_attn_norm=None, mlp_norm=block.ln_2, mlp=block.mlp,
                mlp_down=block.mlp.c_proj, post_mlp_norm=None))
        return ModelParts(shape, body.wte, body.wpe, None, None, layers, body.ln_f, hf.lm_head, None)

    body = hf.model
    kv_heads = heads // (H // shape.n_kv_heads)
    gemma2 = shape.model_type == "gemma2"
    gemma3 = shape.model_type == "gemma3_text"
    sandwich = gemma2 or gemma3  # norms after attention and MLP, pre-feedforward norm
    for i, layer in enumerate(body.layers):
        at = layer.self_attn
        norm_kind = type(layer.post_attention_layernorm).__name__
        if sandwich and norm_kind not in ("Gemma2RMSNorm", "Gemma3RMSNorm"):
            raise UnsupportedModelError(
                f"{SUPPORTED_FAMILIES[shape.model_type]} post-attention norm of an unknown kind "
                f"({norm_kind}); expected Gemma2RMSNorm or Gemma3RMSNorm")
        layers.append(LayerParts(
            attn_norm=layer.input_layernorm, q=Projection(at.q_proj, 0, heads),
            k=Projection(at.k_proj, 0, kv_heads), v=Projection(at.v_proj, 0, kv_heads),
            q_norm=getattr(at, "q_norm", None), k_norm=getattr(at, "k_norm", None),
            # Gemma3's attention does not pass attn_logit_softcapping on: HF never applies it
            scaling=at.scaling, softcap=getattr(at, "attn_logit_softcapping", None) if gemma2 else None,
            sliding_window=windows[i], o_proj=at.o_proj,
            post_attn_norm=layer.post_attention_layernorm if sandwich else None,
            mlp_norm=layer.pre_feedforward_layernorm if sandwich else layer.post_attention_layernorm,
            mlp=layer.mlp, mlp_down=layer.mlp.down_proj,
            post_mlp_norm=layer.post_feedforward_layernorm if sandwich else None,
            rotary_type=cfg.layer_types[i] if gemma3 else None))
    apply_rotary = sys.modules[type(body.layers[0].self_attn).__module__].apply_rotary_pos_emb
    softcap = getattr(cfg, "final_logit_softcapping", None) if sandwich else None
    return ModelParts(shape, body.embed_tokens, None, body.rotary_emb, apply_rotary, layers,
                      body.norm, hf.lm_head, softcap)


# ---------------------------------------------------------------- per-head projections

def _lora_linear_classes():
    """peft's LoRA wrappers of a linear layer: plain, and over a 4-bit or 8-bit base."""
    try:
        from peft.tuners.lora.layer import Linear
    except Exception:  # peft missing or reorganised: the generic path still works
        return None
    try:
        from peft.tuners.lora.bnb import Linear4bit, Linear8bitLt
        return (Linear, Linear4bit, Linear8bitLt)
    except Exception:  # peft without bitsandbytes
        return (Linear,)


_LORA_LINEAR = _lora_linear_classes()


def affine_weight(module):
    """(W [out, in], b [out] or None) with module(x) == x @ W.T + b, or None when unknown.

    A bitsandbytes layer gives its exact dequantized weight (condense.quantized). Unknown
    modules (other adapters, LoRA variants like DoRA, active LoRA dropout) return None and
    are called as modules instead."""
    if type(module) is nn.Linear:
        return module.weight, module.bias
    if is_quantized_linear(module):
        W = dequantized_weight(module)
        return W, None if module.bias is None else module.bias.to(W.dtype)
    if type(module) is Conv1D:
        return module.weight.T, module.bias
    if _LORA_LINEAR is not None and isinstance(module, _LORA_LINEAR):
        base = affine_weight(module.base_layer)
        if base is None or (module.disable_adapters and module.merged):
            return None
        if module.disable_adapters or module.merged:
            return base
        W, b = base
        for name in module.active_adapters:
            if name not in module.lora_A.keys():
                continue
            if name in getattr(module, "lora_variant", {}) or getattr(module, "use_dora", {}).get(name):
                return None
            drop = module.lora_dropout[name]
            if not isinstance(drop, nn.Identity) and drop.training and drop.p > 0:
                return None
            A, B, s = module.lora_A[name], module.lora_B[name], module.scaling[name]
            if type(A) is not nn.Linear or type(B) is not nn.Linear:
                return None
            # peft keeps adapters in fp32 over a bf16/fp16 base and casts the LoRA term back to
            # the base's dtype: do the same, or the einsums below would mix dtypes
            W = W + (s * (B.weight @ A.weight)).to(W.dtype)
            if B.bias is not None:
                lb = (s * B.bias).to(W.dtype)
                b = lb if b is None else b + lb
        return W, b
    return None


def _rows(proj, head_dim, device):
    head_of = proj.head_of.to(device)
    return proj.offset + head_of[:, None] * head_dim + torch.arange(head_dim, device=device)  # [H, dh]


def _quantized_base(module) -> bool:
    """A bitsandbytes layer, or a LoRA wrapper over one."""
    return is_quantized_linear(getattr(module, "base_layer", module))


def _recompute_weights_in_backward(fn):
    """Over a quantized base, `fn`'s dequantized weight is recomputed in backward instead of
    kept (activation checkpointing): autograd would otherwise hold a full-precision copy of
    every quantized projection from forward to backward, the memory 4/8-bit loading saves."""
    def wrapped(module_or_proj, x, *args):
        module = getattr(module_or_proj, "module", module_or_proj)
        if torch.is_grad_enabled() and _quantized_base(module) and not FORCE_GENERIC_PROJECTIONS:
            from torch.utils.checkpoint import checkpoint
            return checkpoint(fn, module_or_proj, x, *args, use_reentrant=False)
        return fn(module_or_proj, x, *args)
    wrapped.__doc__, wrapped.__name__ = fn.__doc__, fn.__name__
    return wrapped


@_recompute_weights_in_backward
def project_per_head(proj, x, head_dim):
    """x [H, B, T, d_model] (each query head's own normalized input) -> [B, T, H, head_dim]."""
    rows = _rows(proj, head_dim, x.device)
    wb = None if FORCE_GENERIC_PROJECTIONS else affine_weight(proj.module)
    if wb is not None:
        W, b = wb
        head_of = proj.head_of.to(x.device)
        n_module_heads = int(head_of.max()) + 1
        W = W[proj.offset: proj.offset + n_module_heads * head_dim].view(n_module_heads, head_dim, -1)
        # each query head reads its own module head's rows (GQA: its KV head). Compare the map
        # itself, not the counts: a subset of query heads (e.g. two that share KV head 1) can
        # have as many heads as the rows it spans and still not read them in order
        if not torch.equal(head_of, torch.arange(n_module_heads, device=x.device)):
            W = W[head_of]
        y = torch.einsum("hbtd,hkd->bthk", x, W)
        return y if b is None else y + b[rows]
    y = proj.module(x.contiguous()).permute(1, 2, 0, 3)  # [B, T, H, out]: every input, whole module
    return y[:, :, torch.arange(rows.shape[0], device=x.device)[:, None], rows]


def project_shared(proj, x, head_dim):
    """x [B, T, d_model] read by every head alike -> [B, T, H, head_dim] (HF's own computation)."""
    y = proj.module(x)
    H = proj.head_of.shape[0]
    if torch.equal(proj.head_of, torch.arange(H)):  # one block of rows per head, in order
        return y[..., proj.offset: proj.offset + H * head_dim].unflatten(-1, (H, head_dim))
    return y[..., _rows(proj, head_dim, x.device)]


@_recompute_weights_in_backward
def split_heads_output(o_proj, z):
    """z [B, T, H, dh] -> (per-head outputs [B, T, H, d_model], constant [d_model] or None).

    Head h's output is o_proj applied to z with every other head zeroed, minus o_proj(0); the
    constant o_proj(0) (the bias, plus any adapter bias) is returned separately so that the
    head outputs sum with it to o_proj(z) exactly."""
    B, T, H, dh = z.shape
    wb = None if FORCE_GENERIC_PROJECTIONS else affine_weight(o_proj)
    if wb is not None:
        W, b = wb
        return torch.einsum("bthk,dhk->bthd", z, W.reshape(W.shape[0], H, dh)), b
    eye = torch.eye(H, dtype=z.dtype, device=z.device)
    z_alone = (z[:, :, None] * eye[:, :, None]).reshape(B, T, H, H * dh)  # head h keeps only z_h
    const = o_proj(z.new_zeros(1, H * dh))[0]
    return o_proj(z_alone) - const, const


@_recompute_weights_in_backward
def heads_output_sum(o_proj, z):
    """z [B, T, H, dh] -> (sum of the per-head outputs of split_heads_output [B, T, d_model],
    constant): o_proj(z) - o_proj(0), without forming each head's output."""
    B, T, H, dh = z.shape
    wb = None if FORCE_GENERIC_PROJECTIONS else affine_weight(o_proj)
    flat = z.reshape(B, T, H * dh)
    if wb is not None:
        W, b = wb
        return flat @ W.T, b
    const = o_proj(z.new_zeros(1, H * dh))[0]
    return o_proj(flat) - const, const
