"""`enable_backprop=True` timed through laplace-torch and through `fspace.Laplace`: the query a
BayesOpt loop makes at every optimiser step (laplace-torch's examples/bayesopt_example.py).

A 2-H-H-1 ReLU regressor (H = 50 in the example; `--hidden`) (float64, seeded, untrained: the costs do not depend on the weights)
fitted with `Laplace(model, "regression", "all", structure, enable_backprop=True)` on 20 points,
then, for `--candidates` inputs at a time: the joint predictive `la(x, joint=True)`, BoTorch's
analytic expected improvement written out, and its gradient in `x` (`backward`). Each library in
its own subprocess; the median wall time of `--repeats` queries after one warm-up, and the
largest difference between the two gradients.

    python scripts/compare/enable_backprop_laplace_torch.py [--candidates 10] [--repeats 20] [--hidden 50]

Opt-in (not part of the test suite): needs torch and laplace-torch beside the `fspace` package.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time


def child(lib, structure, candidates, repeats, hidden):
    import warnings

    import torch

    warnings.simplefilter("ignore")
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(2)
    if lib == "fspace":
        from fspace import Laplace
    else:
        from laplace import Laplace
    torch.manual_seed(1)
    train_x = torch.rand(20, 2) * 15 - torch.tensor([5.0, 0.0])
    train_y = (train_x[:, 1:] - 0.13 * train_x[:, :1] ** 2 + 1.6 * train_x[:, :1] - 6) ** 2 / 100
    net = torch.nn.Sequential(torch.nn.Linear(2, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                              torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
    x0 = torch.rand(candidates, 2) * 15  # drawn before the fit, which may draw from torch's generator
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(train_x, train_y), batch_size=1024)
    la = Laplace(net, "regression", "all", structure, enable_backprop=True)
    la.fit(loader)
    normal = torch.distributions.Normal(0.0, 1.0)
    best_f = float(train_y.min())

    def query():
        x = x0.clone().requires_grad_(True)
        mean, cov = la(x, joint=True)
        sigma = (cov + 1e-4 * torch.eye(candidates)).diagonal().sqrt()
        u = (best_f - mean) / sigma
        ei = sigma * (normal.log_prob(u).exp() + u * normal.cdf(u))
        ei.sum().backward()
        return x.grad

    query()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        grad = query()
        times.append(time.perf_counter() - start)
    print(json.dumps({"lib": lib, "structure": structure, "candidates": candidates, "hidden": hidden,
                      "median_ms": 1e3 * statistics.median(times), "grad": grad.tolist()}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--candidates", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--structures", default="kron,full,diag")
    ap.add_argument("--hidden", type=int, default=50, help="the two hidden layers' width (the example's 50)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.candidates, args.repeats, args.hidden)
        return
    import numpy as np

    for structure in args.structures.split(","):
        rows = {}
        for lib in ("laplace-torch", "fspace"):
            run = subprocess.run([sys.executable, __file__, "--candidates", str(args.candidates), "--repeats",
                                  str(args.repeats), "--hidden", str(args.hidden), "--child", lib, structure],
                                 capture_output=True, text=True, check=True)
            rows[lib] = json.loads(run.stdout.strip().splitlines()[-1])
        diff = float(np.abs(np.array(rows["fspace"]["grad"]) - np.array(rows["laplace-torch"]["grad"])).max())
        for lib, row in rows.items():
            print(json.dumps({k: v for k, v in row.items() if k != "grad"}))
        print(json.dumps({"structure": structure, "max_abs_gradient_difference": diff}), flush=True)


if __name__ == "__main__":
    main()
