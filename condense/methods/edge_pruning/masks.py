"""Hard-concrete gates (Louizos et al. 2018) on a graph's edges: sampling, the L0 expectation,
the deterministic mask and `EdgeMasks`, which holds one learned log-alpha per gated edge and
turns them into circuits (the package docstring derives them)."""
import math

import torch

LIMIT_LEFT, LIMIT_RIGHT = -0.1, 1.1
TEMPERATURE = 2 / 3
EPS = 1e-6
INIT_STD = 0.01


# ------------------------------------------------------------------ hard-concrete gates
def sample_uniform(n, generator=None, dtype=torch.float32):
    """u ~ U(EPS, 1 - EPS), n values (kept off 0 and 1 so that log u and log(1 - u) are finite)."""
    return torch.rand(n, generator=generator, dtype=dtype) * (1 - 2 * EPS) + EPS


def hard_concrete(log_alpha, u):
    """The sampled mask z = clamp(sigmoid((log u - log(1-u) + log_alpha) / beta) * (r-l) + l, 0, 1)."""
    s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + log_alpha) / TEMPERATURE)
    return (s * (LIMIT_RIGHT - LIMIT_LEFT) + LIMIT_LEFT).clamp(0.0, 1.0)


def keep_probability(log_alpha):
    """P(z != 0) = sigmoid(log_alpha - beta * log(-l / r)), the gate's L0 expectation."""
    return torch.sigmoid(log_alpha - TEMPERATURE * math.log(-LIMIT_LEFT / LIMIT_RIGHT))


def deterministic_mask(log_alpha):
    """The gate without noise: clamp(sigmoid(log_alpha) * (r - l) + l, 0, 1)."""
    return (torch.sigmoid(log_alpha) * (LIMIT_RIGHT - LIMIT_LEFT) + LIMIT_LEFT).clamp(0.0, 1.0)


def lagrangian(sparsity, target, lambda1, lambda2):
    """lambda1 (s - t) + lambda2 (s - t)^2; the lambdas are maximised, the gates minimise it."""
    gap = sparsity - target
    return lambda1 * gap + lambda2 * gap * gap


class EdgeMasks:
    """Hard-concrete gates on the `trainable` edges of `graph` (default: every valid edge);
    every other entry of the [n_senders, n_receivers] mask is fixed at 0. The gates live on
    `device` (the model's, so that data-parallel all-reduces work on GPUs); the init noise is
    drawn on the CPU from `generator`. Masks for the Graph come back on the CPU."""

    def __init__(self, graph, trainable=None, init=10.0, generator=None, device="cpu"):
        self.shape = (graph.n_senders, graph.n_receivers)
        trainable = graph.valid if trainable is None else (trainable & graph.valid)
        self.index = torch.nonzero(trainable.flatten()).flatten().to(device)
        self.n_edges = int(graph.valid.sum())
        noise = torch.randn(len(self.index), generator=generator) * INIT_STD
        self.log_alpha = (init + noise).to(device).requires_grad_(True)

    @property
    def n_trainable(self):
        return len(self.index)

    def _scatter(self, values, fill=0.0):
        full = values.new_full((self.shape[0] * self.shape[1],), fill)
        return full.scatter(0, self.index, values).view(self.shape)

    def sample(self, u):
        """A sampled [S, R] mask (differentiable in log_alpha); u: n_trainable uniforms."""
        return self._scatter(hard_concrete(self.log_alpha, u))

    def deterministic(self):
        return self._scatter(deterministic_mask(self.log_alpha.detach())).cpu()

    def expected_kept(self):
        """Expected number of edges in the circuit (differentiable)."""
        return keep_probability(self.log_alpha).sum()

    def sparsity(self):
        """Expected fraction of the graph's edges removed, over ALL valid edges."""
        return 1.0 - self.expected_kept() / self.n_edges

    def learned_sparsity(self):
        """sparsity() as a float (no graph)."""
        with torch.no_grad():
            return float(self.sparsity())

    def n_kept(self):
        """K = round(expected kept edges): the size the learned sparsity asks for."""
        return min(round(float(self.expected_kept().detach())), self.n_trainable)

    def binary(self, k=None):
        """Bool [S, R]: the K gated edges with the largest log_alpha (ties: lower index);
        K = n_kept() (the learned sparsity) unless `k` is given."""
        k = self.n_kept() if k is None else min(int(k), self.n_trainable)
        order = torch.sort(self.log_alpha.detach(), descending=True, stable=True).indices[:k]
        flat = torch.zeros(self.shape[0] * self.shape[1], dtype=torch.bool)
        flat[self.index[order].cpu()] = True
        return flat.view(self.shape)

    def keep_scores(self):
        """P(z != 0) per edge as an [S, R] tensor (0 where there is no gate)."""
        return self._scatter(keep_probability(self.log_alpha.detach())).cpu()

    def full_log_alpha(self):
        return self._scatter(self.log_alpha.detach(), fill=float("-inf")).cpu()

    def circuit(self, graph, k=None):
        """A copy of `graph` with in_graph = the thresholded circuit (not yet pruned; `k`: see
        binary) and scores = P(z != 0)."""
        g = graph.copy()
        g.scores = self.keep_scores().float()
        g.in_graph = self.binary(k) & g.valid
        return g
