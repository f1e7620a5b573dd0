"""Helpers of the torch-loop tests (``fspace.torch``): small float64 models and a variational
family with unequal standard deviations."""

import torch


def tanh_mlp(d_in, width, d_out, seed):
    """A seeded float64 ``d_in``-``width``-``d_out`` tanh MLP."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(d_in, width), torch.nn.Tanh(), torch.nn.Linear(width, d_out)).double()


def spread(q, seed):
    """Perturbs a ``MeanField``'s log-stds, so that a wrong weighting of ``S`` would show."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for r in q.log_std:
            r.add_(0.5 * torch.randn(r.shape, generator=g, dtype=r.dtype))
