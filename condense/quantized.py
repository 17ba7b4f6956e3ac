"""Quantized bases (bitsandbytes 4-bit NF4 and 8-bit) as condense computes them.

condense treats a quantized base as *weight-only* quantization: each quantized linear layer
computes `x @ dequantize(W).T + b` in the model's dtype. That is the only reading under which
a layer stays linear in its input, which the edge graph needs (a head's output is o_proj
applied to that head alone; the heads' outputs must sum to o_proj of all of them).

bitsandbytes itself computes two other functions in some modes, and both break that:
- 8-bit layers in eval mode use LLM.int8: the *input* is quantized to int8 row by row (its
  scale depends on the whole row), so o_proj(head 1) + o_proj(head 2) != o_proj(heads 1+2).
  In training mode on CPU they already dequantize and multiply in floating point.
- 4-bit layers on CPUs with AVX512-BF16 repack their weight at the first eval forward and
  then multiply in bfloat16 with bfloat16 block scales, while training forwards dequantize
  and multiply in the compute dtype: the same model would give two different functions.

`pin_dequantized_compute` makes the model's own forward the weight-only computation in every
mode, so that the graph with every edge on equals the quantized model's forward, and heal
(training mode) and evaluation (eval mode) see one model. Memory stays quantized: weights are
dequantized one layer at a time, as bitsandbytes does for training.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn


def _bnb_classes():
    try:
        from bitsandbytes.nn import Linear4bit, Linear8bitLt
        return Linear4bit, Linear8bitLt
    except Exception:  # bitsandbytes missing or broken: nothing can be quantized
        return None, None


LINEAR_4BIT, LINEAR_8BIT = _bnb_classes()


def is_quantized_linear(module: nn.Module) -> bool:
    return LINEAR_4BIT is not None and isinstance(module, (LINEAR_4BIT, LINEAR_8BIT))


def dequantized_weight(module: nn.Module) -> Optional[torch.Tensor]:
    """The weight [out, in] a bitsandbytes layer multiplies by, in its compute dtype; None for
    any other module. Reads the quantized storage without changing it."""
    if LINEAR_4BIT is not None and isinstance(module, LINEAR_4BIT):
        import bitsandbytes.functional as F
        state = module.weight.quant_state
        if getattr(state, "packing_format_for_cpu", False):
            raise RuntimeError("a 4-bit layer repacked for bitsandbytes' bfloat16 CPU kernel: load "
                               "quantized models with condense.models.load_model (it pins them), "
                               "or call condense.quantized.pin_dequantized_compute first")
        dtype = module.compute_dtype or torch.float32
        return F.dequantize_4bit(module.weight.data, state).to(dtype)
    if LINEAR_8BIT is not None and isinstance(module, LINEAR_8BIT):
        cb = module.state.CB if module.state.CB is not None else module.weight.data
        scb = module.state.SCB if module.state.SCB is not None else module.weight.SCB
        if cb.dtype != torch.int8:  # not quantized yet (fp16 weights kept): use them as they are
            return cb.to(_compute_dtype(module))
        # exactly what bitsandbytes' own dequantizing matmul does (int8 row * row scale / 127)
        return cb.to(_compute_dtype(module)).mul_(scb.unsqueeze(1).mul(1.0 / 127.0))
    return None


def _compute_dtype(module: nn.Module) -> torch.dtype:
    return getattr(module, "condense_compute_dtype", None) or torch.float32


def _dequantized_linear(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    bias = None if module.bias is None else module.bias.to(x.dtype)
    return nn.functional.linear(x, dequantized_weight(module).to(x.dtype), bias)


def _linear8bit_forward(self, x: torch.Tensor) -> torch.Tensor:
    """Linear8bitLt's forward pinned to weight-only quantization (see the module docstring).
    With gradients, the dequantized weight is recomputed in backward rather than kept, as
    bitsandbytes' own 4-bit matmul does: a kept copy would cost the memory 8 bits save."""
    if torch.is_grad_enabled() and x.requires_grad:
        from torch.utils.checkpoint import checkpoint
        return checkpoint(_dequantized_linear, self, x, use_reentrant=False)
    return _dequantized_linear(self, x)


def pin_dequantized_compute(model: nn.Module, dtype: torch.dtype) -> int:
    """Make every bitsandbytes layer of `model` compute `x @ dequantize(W).T + b` in `dtype`,
    in training and eval mode alike. Returns how many layers it pinned."""
    if LINEAR_4BIT is None:
        return 0
    n = 0
    for module in model.modules():
        if isinstance(module, LINEAR_4BIT):
            weight = module.weight
            if getattr(weight.quant_state, "packing_format_for_cpu", False):  # repacked already
                import bitsandbytes.functional as F
                weight.data, weight.quant_state = F._convert_weight_packed_for_cpu_inverse(
                    weight.data, weight.quant_state)
            module.support_avx512bf16_for_cpu = False  # never repack: see the module docstring
            module.compute_dtype, module.compute_type_is_set = dtype, True
            n += 1
        elif isinstance(module, LINEAR_8BIT):
            module.condense_compute_dtype = dtype
            # an instance attribute: this layer only, the class stays as bitsandbytes ships it
            module.forward = _linear8bit_forward.__get__(module)
            n += 1
    return n
