"""The numpy reference network the pytest suite checks fspace against: a tanh MLP as a
PyTorch-named state_dict and its forward pass, written independently of fspace."""

import numpy as np


def tanh_mlp(rng, sizes):
    """A state_dict (PyTorch names and layouts: weight out × in) of a tanh MLP."""
    state = {}
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        state[f"{2 * i}.weight"] = rng.normal(0, 1 / np.sqrt(a), size=(b, a))
        state[f"{2 * i}.bias"] = rng.normal(0, 0.1, size=b)
    return state


def forward(state, x):
    """The MLP's outputs at the rows of ``x`` (tanh between the Linear layers)."""
    n_layers = len(state) // 2
    h = x
    for i in range(n_layers):
        h = h @ state[f"{2 * i}.weight"].T + state[f"{2 * i}.bias"]
        if i < n_layers - 1:
            h = np.tanh(h)
    return h


def fitted(method, *args, **kwargs):
    """``method`` after ``method.fit(*args, **kwargs)`` (every fspace ``fit`` returns ``None``,
    as laplace-torch's)."""
    method.fit(*args, **kwargs)
    return method
