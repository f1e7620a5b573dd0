"""The torch path's diagonal Laplace at MNIST scale, fit and GLM predictive timed apart: a
784-200-200-10 tanh MLP built as in ``torch_path_vs_native.py`` (its own seed, so other random
weights and inputs than that script's row) on 1 000 generated inputs,
``backend="torch"`` (every product a callback into ``torch.func``), float64, CPU. The fit's
``progress=`` stamps show each group of points as it is folded.

Opt-in (not part of the test suite): needs torch beside the ``fspace`` package.

    python scripts/compare/torch_path_mnist_diag.py
"""

import time

import torch

import fspace
from _models import mnist_mlp


def main():
    model = mnist_mlp(seed=0)
    x = torch.rand(1000, 784, dtype=torch.float64)
    with torch.no_grad():
        y = model(x) + 0.1 * torch.randn(1000, 10, dtype=torch.float64)
    stamps = []
    start = time.perf_counter()
    la = fspace.Laplace(model, "regression", subset_of_weights="all", hessian_structure="diag", sigma_noise=0.1,
                        backend="torch")
    la.fit(x, y, progress=lambda step, total, *_: stamps.append((round(time.perf_counter() - start, 1), step)))
    fit = time.perf_counter() - start
    start = time.perf_counter()
    la(x)
    predict = time.perf_counter() - start
    print(f"fit {fit:.1f} s (progress {stamps}), GLM predictive {predict:.1f} s, total {fit + predict:.1f} s")


if __name__ == "__main__":
    main()
