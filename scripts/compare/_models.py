"""The benchmark scripts' models: the paper's 1-50-50-1 sine net and the 784-200-200-10 MNIST
MLP (tanh, float64, seeded)."""

import torch


def tanh_mlp(*sizes, seed=None):
    """A float64 tanh MLP with layer widths ``sizes``, its weights drawn from torch's global
    generator after ``torch.manual_seed(seed)`` (``None``: from its current state)."""
    if seed is not None:
        torch.manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        if i:
            layers.append(torch.nn.Tanh())
        layers.append(torch.nn.Linear(a, b))
    return torch.nn.Sequential(*layers).double()


def sine_net(seed=None):
    return tanh_mlp(1, 50, 50, 1, seed=seed)


def mnist_mlp(seed=None):
    return tanh_mlp(784, 200, 200, 10, seed=seed)
