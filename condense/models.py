"""Loading causal LMs from the hub or a local folder, the way condense needs them."""
import os

import torch

QUANTIZATIONS = (None, "4bit", "8bit")
DTYPES = dict(float32=torch.float32, fp32=torch.float32, bfloat16=torch.bfloat16,
              bf16=torch.bfloat16, float16=torch.float16, fp16=torch.float16)


def _dtype(dtype):
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; allowed: {', '.join(DTYPES)}")
    return DTYPES[dtype]


def _offline():
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def load_model(name_or_path, dtype=None, device=None, quantization=None):
    """An `AutoModelForCausalLM` in eval mode with eager attention (condense reads and
    patches attention per head, which fused kernels do not expose).

    `name_or_path`: a hub name ("gpt2", "meta-llama/Llama-3.2-1B") or a local folder.
    `quantization`: None, "4bit" or "8bit" (bitsandbytes; needs the `quant` extra and,
    for most builds, a GPU).
    """
    from transformers import AutoModelForCausalLM

    if quantization not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {quantization!r}; allowed: None, '4bit', '8bit'")
    kwargs = dict(attn_implementation="eager")
    if dtype is not None:
        kwargs["dtype"] = _dtype(dtype)
    if quantization:
        try:
            import bitsandbytes  # noqa: F401
        except ImportError as e:
            raise ImportError("4/8-bit loading needs bitsandbytes: pip install 'condense[quant]'") from e
        from transformers import BitsAndBytesConfig
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=quantization == "4bit", load_in_8bit=quantization == "8bit",
            bnb_4bit_compute_dtype=kwargs.get("dtype", torch.bfloat16))
        kwargs["device_map"] = device or "auto"
    try:
        model = AutoModelForCausalLM.from_pretrained(name_or_path, **kwargs)
    except OSError as e:
        where = ("no such local folder, and the hub is offline (HF_HUB_OFFLINE=1)"
                 if _offline() and not os.path.isdir(name_or_path) else str(e).splitlines()[0])
        raise OSError(f"cannot load model {name_or_path!r}: {where}") from e
    if device is not None and not quantization:
        model = model.to(device)
    return model.eval()


def load_tokenizer(name_or_path):
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(name_or_path)
    except OSError as e:
        raise OSError(f"cannot load tokenizer {name_or_path!r}: {str(e).splitlines()[0]}") from e
