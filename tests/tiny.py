"""Tiny random models for tests: one small config per supported family (`CONFIGS`,
`make_model`), random prompts and task rows. Hugging Face's initialisation leaves most edges
near zero, so weights are redrawn large enough that every component matters."""
import torch
from transformers import (AutoModelForCausalLM, Gemma2Config, Gemma3TextConfig, GemmaConfig,
                          GPT2Config, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config)


def randomize_weights(model, seed=0, scale=1.0):
    """Matrices ~ scale * N(0, 1/fan_in), biases ~ N(0, 0.2^2), norm gains 1 + N(0, 0.2^2)
    (Gemma stores its gains as w in 1 + w, hence the add). Returns the model in eval mode.
    Scale 1 is nearly linear around a prompt; scale >= 3 saturates softmaxes and norms."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if p.dim() >= 2:
                p.copy_(scale * noise / p.shape[-1] ** 0.5)
            elif name.endswith("bias"):
                p.copy_(0.2 * noise)
            else:
                p.add_(0.2 * noise)
    return model.eval()


def moved_token_rows(model, n, seed, lengths=(4, 7), vocab=None):
    """Random clean/corrupted prompts of `lengths` (so batches are right-padded); answer and
    distractor = the tokens the corruption moves up and down most, so that the full and the
    empty circuit differ. A dict of lists (as condense takes rows)."""
    vocab = vocab or model.config.vocab_size
    gen = torch.Generator().manual_seed(seed)
    rows = dict(clean_ids=[], corrupted_ids=[], answer_id=[], distractor_id=[])
    for i in range(n):
        T = lengths[0] + i % (lengths[1] - lengths[0] + 1)
        clean = torch.randint(0, vocab, (1, T), generator=gen)
        corrupted = torch.randint(0, vocab, (1, T), generator=gen)
        with torch.no_grad():
            shift = model(input_ids=clean).logits[0, -1] - model(input_ids=corrupted).logits[0, -1]
        rows["clean_ids"].append(clean[0].tolist())
        rows["corrupted_ids"].append(corrupted[0].tolist())
        rows["answer_id"].append(int(shift.argmax()))
        rows["distractor_id"].append(int(shift.argmin()))
    return rows


TOL = 1e-4
SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             vocab_size=100, max_position_embeddings=64)
CONFIGS = {
    "gpt2": lambda: GPT2Config(n_layer=2, n_head=4, n_embd=32, vocab_size=100, n_positions=64),
    # GQA everywhere else; Llama with attention/MLP biases to exercise the o_proj bias constant
    "llama": lambda: LlamaConfig(**SMALL, num_key_value_heads=2, attention_bias=True, mlp_bias=True),
    "qwen2": lambda: Qwen2Config(**SMALL, num_key_value_heads=2),
    "qwen3": lambda: Qwen3Config(**SMALL, num_key_value_heads=1, head_dim=16),
    # windows of 3 < sequence length 7: sliding-window attention is active
    "mistral": lambda: MistralConfig(**SMALL, num_key_value_heads=2, sliding_window=3),
    "gemma": lambda: GemmaConfig(**SMALL, num_key_value_heads=2, head_dim=8),
    "gemma2": lambda: Gemma2Config(**SMALL, num_key_value_heads=2, head_dim=8, sliding_window=3,
                                   attn_logit_softcapping=5.0, final_logit_softcapping=3.0,
                                   query_pre_attn_scalar=8),
    # sliding (window 3) and full layers, each type with its own rotary embedding (full: another
    # base and linear scaling, as the 4B+ checkpoints); attn_logit_softcapping is set because
    # transformers' Gemma3 attention ignores it (it is not passed on): the graph must too
    "gemma3": lambda: Gemma3TextConfig(
        **{**SMALL, "num_hidden_layers": 3}, num_key_value_heads=2, head_dim=8, sliding_window=3,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={t: dict(p) for t, p in GEMMA3_ROPE.items()}, query_pre_attn_scalar=8,
        final_logit_softcapping=3.0, attn_logit_softcapping=5.0),
}
GEMMA3_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
               "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0}}
LLAMA_LIKE_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"]
LORA_TARGETS = {"gpt2": ["c_attn", "c_proj", "c_fc"], "gemma3": LLAMA_LIKE_TARGETS + ["gate_proj"]}


def make_model(family, dtype=torch.float32, seed=0, lora=False, **overrides):
    """A tiny random model whose weights are large enough that every component matters."""
    cfg = CONFIGS[family]()
    for k, v in overrides.items():
        setattr(cfg, k, v)
    torch.manual_seed(seed)
    model = randomize_weights(AutoModelForCausalLM.from_config(cfg, attn_implementation="eager"), seed)
    model = model.to(dtype).eval()
    if lora:
        from peft import LoraConfig, get_peft_model
        cfg = LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, fan_in_fan_out=family == "gpt2",
                         target_modules=LORA_TARGETS.get(family, LLAMA_LIKE_TARGETS))
        model = get_peft_model(model, cfg).eval()
    return model


def prompts(B=3, T=7, seed=1):
    gen = torch.Generator().manual_seed(seed)
    clean = torch.randint(0, 100, (B, T), generator=gen)
    corrupted = torch.randint(0, 100, (B, T), generator=gen)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 5:] = 0  # a right-padded row
    return clean, corrupted, mask
