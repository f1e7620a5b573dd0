"""The function-space priors in a user's own torch loop (``fspace.torch``) beside fspace's own
training loops, on the same network, data and step count: wall time per step.

Rows (sine toy: 60 points on [-1, 1], σ = 0.1, full batch, Adam, RBF(1, 0.3) prior on
[-3, 3], float64, one torch thread):
- ``FSPRegularizer`` in a torch loop (``loss = Σ NLL + R``, 100 fresh context points per step)
  against ``fspace.FSPLaplace`` training (Alg. 1 with ``n_context=100``; its time includes
  Alg. 2's Laplace step at the end, which is a few ms here);
- ``GFSVIRegularizer`` + ``MeanField`` in a torch loop (the closed-form data term and
  ``D̂_KL^γ`` at ``M`` fresh measurement points per step) against ``fspace.GFSVI``
  (``measurement_points=M``, σ fixed).

The torch loop's extra cost over the native one is torch's: a GFSVI step forms the Jacobian at
the measurement and batch points by ``jacrev`` and differentiates through it a second time.

    python scripts/compare/torch_loop_vs_native.py [--steps 300] [--width 50] [--m 50]
"""

import argparse
import time

import numpy as np
import torch

import fspace
from fspace.torch import FSPRegularizer, GFSVIRegularizer, MeanField, expected_log_likelihood


def net(width, seed=0):
    torch.manual_seed(seed)
    nn = torch.nn
    return nn.Sequential(nn.Linear(1, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 1)).double()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--width", type=int, default=50)
    ap.add_argument("--m", type=int, default=50, help="GFSVI measurement points")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.rand(60, 1, dtype=torch.float64) * 2 - 1
    y = torch.sin(3 * x) + 0.05 * torch.randn_like(x)
    sigma, lr, steps = 0.1, 1e-2, args.steps
    kernel = fspace.kernels.RBF(1.0, 0.3)
    rows = []

    model = net(args.width)
    reg = FSPRegularizer(kernel, context=([-3.0], [3.0]), n_context=100)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    start = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).sum() / (2 * sigma**2) + reg(model)
        loss.backward()
        opt.step()
    torch_s = time.perf_counter() - start
    model = net(args.width)
    start = time.perf_counter()
    fspace.FSPLaplace(model, "regression", kernel, sigma_noise=sigma, steps=steps, batch_size=60, n_context=100,
                      learning_rate=lr, context_box={"lower": [-3.0], "upper": [3.0]}).fit(x, y)
    rows.append(("FSP-Laplace (Alg. 1), 100 context points", torch_s, time.perf_counter() - start))

    model = net(args.width)
    q = MeanField(model)
    kl = GFSVIRegularizer(kernel, context=([-3.0], [3.0]), n_context=args.m)
    opt = torch.optim.Adam([*model.parameters(), *q.parameters()], lr=lr)
    start = time.perf_counter()
    for _ in range(steps):
        opt.zero_grad()
        f, var = q.linearized(model, x, diagonal=True)
        loss = -expected_log_likelihood(f, var, y, sigma) + kl(model, q)
        loss.backward()
        opt.step()
    torch_s = time.perf_counter() - start
    model = net(args.width)
    start = time.perf_counter()
    fspace.GFSVI(model, "regression", kernel, sigma_noise=sigma, learn_sigma=False, steps=steps,
                 measurement_points=args.m, measurement_box={"lower": [-3.0], "upper": [3.0]},
                 optim={"learning_rate": lr, "batch_size": 60}).fit(x, y)
    rows.append((f"GFSVI, M = {args.m}", torch_s, time.perf_counter() - start))

    p = sum(t.numel() for t in net(args.width).parameters())
    print(f"1-{args.width}-{args.width}-1 ({p} parameters), {steps} steps, ms per step:")
    print("| row | torch loop | fspace's loop | ratio |")
    print("|---|---|---|---|")
    for name, a, b in rows:
        print(f"| {name} | {1e3 * a / steps:.2f} | {1e3 * b / steps:.2f} | {a / b:.1f}× |")


if __name__ == "__main__":
    main()
