"""laplace-torch 0.3's VaLLA (`hessian_structure="gp"`, `functional_approximation="variational"`)
timed through laplace-torch and through `fspace.Laplace`.

The 784-200-200-10 tanh MNIST MLP (float64, seeded, untrained: the costs do not depend on the
weights), the first N training images from a `DataLoader` (batch 128), classification:
`Laplace(model, "classification", "all", "gp", functional_approximation="variational",
inducing_locations="random", num_inducing=M)` → `fit(loader)` at laplace-torch's defaults (100
Adam steps at 1e-3; the inducing images move) → `la(x_test)` (probit) on 200 test images. Each
library in its own subprocess; each step's wall time, the process's peak memory (`VmHWM`), the
learned λ and the predictive's largest difference between the two.

    python scripts/compare/valla_laplace_torch.py [--n 10000] [--m 100] [--iterations 100]

Opt-in (not part of the test suite): needs torch and laplace-torch beside the `fspace` package.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from python_vs_laplace_torch import mnist_train_set, peak_mb  # noqa: E402  (MNIST and VmHWM)


def child(lib, n, m, iterations):
    import warnings

    import torch

    warnings.simplefilter("ignore")
    from _models import mnist_mlp

    if lib == "fspace":
        from fspace import Laplace
    else:
        from laplace import Laplace
    images, labels = mnist_train_set()

    def rows(a, b):
        return torch.from_numpy(images[a:b].reshape(b - a, -1) / 255.0), torch.from_numpy(labels[a:b].astype("int64"))

    x, y = rows(0, n)
    xt, _ = rows(n, n + 200)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=128)
    model = mnist_mlp(seed=0)
    t = {}
    start = time.perf_counter()
    la = Laplace(model, "classification", "all", "gp", functional_approximation="variational",
                 inducing_locations="random", num_inducing=m)
    la.fit(loader, iterations=iterations)
    t["fit"] = time.perf_counter() - start
    start = time.perf_counter()
    probs = la(xt)
    t["predict"] = time.perf_counter() - start
    print(json.dumps({"lib": lib, "n": n, "m": m, "iterations": iterations, "seconds": t,
                      "prior_precision": float(la.prior_precision.reshape(-1)[0]),
                      "last_objective": la.fit_history_["objective"][-1],
                      "probs": probs.tolist(), "peak_mib": peak_mb()}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--m", type=int, default=100)
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--libs", default="laplace-torch,fspace")
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.n, args.m, args.iterations)
        return
    out = {}
    for lib in args.libs.split(","):
        run = subprocess.run([sys.executable, __file__, "--n", str(args.n), "--m", str(args.m), "--iterations",
                              str(args.iterations), "--child", lib], capture_output=True, text=True,
                             timeout=args.timeout, check=True)
        out[lib] = json.loads(run.stdout.strip().splitlines()[-1])
        row = {key: value for key, value in out[lib].items() if key != "probs"}
        print(json.dumps(row), flush=True)
    if len(out) == 2:
        import numpy as np

        diff = np.abs(np.array(out["fspace"]["probs"]) - np.array(out["laplace-torch"]["probs"])).max()
        print(json.dumps({"max_abs_probability_difference": float(diff)}))


if __name__ == "__main__":
    main()
