"""Tiny random models for tests: Hugging Face's initialisation leaves most edges near zero,
so weights are redrawn large enough that every component matters."""
import torch


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
