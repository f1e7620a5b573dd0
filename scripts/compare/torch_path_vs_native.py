"""fspace's two ways into a PyTorch model, on the same convertible ``nn.Sequential``: the native
path (the model converted to fspace's MLP, every product a Rust GEMM rule) and the torch path
(``backend="torch"``: ``f``, ``J·U`` and ``Jᵀ·L`` as callbacks into ``torch.func``). Both give
the same posterior (pytest ``test_torch_path.py`` asserts 1e-10); this script measures what the
native rules save.

Rows: the 1-50-50-1 tanh sine regression net on ``--n`` points (Laplace full / diag / lowrank:
fit, then the GLM predictive on 1 000 test points; post-hoc FSP-Laplace with 100 context
points) and a 784-200-200-10 tanh MNIST-sized MLP on 1 000 generated inputs (diag and
lowrank). Wall time: the best of ``--repeats`` runs, float64, the torch path on CPU.

Opt-in (not part of the test suite): needs torch beside the ``fspace`` package.

    python scripts/compare/torch_path_vs_native.py [--n 500] [--repeats 3] [--json out.json]
"""

import argparse
import json
import time

import numpy as np
import torch

import fspace
from _models import mnist_mlp, sine_net


def best_of(repeats, fn):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def laplace_run(model, x, y, xs, structure, backend):
    def run():
        la = fspace.Laplace(model, "regression", subset_of_weights="all", hessian_structure=structure, sigma_noise=0.1,
                            backend=backend)
        la.fit(x, y)
        la(xs)
    return run


def fsp_run(model, x, y, xs, backend):
    prior = fspace.GPPrior(fspace.kernels.RBF(1.0, 0.5))

    def run():
        m = fspace.FSPLaplace(model, "regression", prior, train=False, sigma_noise=0.1,
                              n_laplace_context=100, backend=backend)
        m.fit(x, y)
        m(xs)
    return run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    sine = sine_net(seed=0)
    x = torch.rand(args.n, 1, dtype=torch.float64) * 2 - 1
    y = torch.sin(3 * x) + 0.1 * torch.randn_like(x)
    xs = torch.linspace(-2, 2, 1000, dtype=torch.float64).reshape(-1, 1)
    mnist = mnist_mlp()  # drawn after the sine data, as before
    xm = torch.rand(1000, 784, dtype=torch.float64)
    with torch.no_grad():
        ym = mnist(xm) + 0.1 * torch.randn(1000, 10, dtype=torch.float64)
    rows = []
    cases = [(f"sine {args.n} pts, Laplace {s}", lambda b, s=s: laplace_run(sine, x, y, xs, s, b)) for s in ["full", "diag", "lowrank"]]
    cases.append(("sine, post-hoc FSP-Laplace (100 context points)", lambda b: fsp_run(sine, x, y, xs, b)))
    cases += [(f"784-200-200-10, 1000 pts, Laplace {s}", lambda b, s=s: laplace_run(mnist, xm, ym, xm, s, b)) for s in ["diag", "lowrank"]]
    for label, make in cases:
        native = best_of(args.repeats, make("native"))
        via_torch = best_of(args.repeats, make("torch"))
        rows.append({"row": label, "native_s": native, "torch_s": via_torch, "ratio": via_torch / native})
        print(f"| {label} | {native:.3f} | {via_torch:.3f} | {via_torch / native:.1f}× |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "threads": torch.get_num_threads(), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
