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
