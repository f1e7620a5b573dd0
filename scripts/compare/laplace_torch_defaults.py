"""The same laplace-torch script timed through laplace-torch 0.3 and through `fspace.Laplace`.

The 784-200-200-10 tanh MNIST MLP (float64, seeded, untrained: the costs do not depend on the
weights), the first N training images from a `DataLoader` (batch 128), classification:
`Laplace(model, "classification", subset, structure)` → `fit(loader)` →
`optimize_prior_precision()` (laplace-torch's defaults: marglik, 100 Adam steps) → `la(x_test)`
(probit) on 200 test images. Each library, each row, in its own subprocess; each step's wall
time and the process's peak memory (`VmHWM`). Rows: laplace-torch's default
(`last_layer`, `kron`), the last layer's `diag` and `full`, and `kron` over all weights.

    python scripts/compare/laplace_torch_defaults.py [--n 10000]

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

ROWS = [("last_layer", "kron"), ("last_layer", "diag"), ("last_layer", "full"), ("all", "kron")]


def child(lib, subset, structure, n):
    import warnings

    import torch

    warnings.simplefilter("ignore")
    from _models import mnist_mlp

    if lib == "fspace":
        from fspace import Laplace
    else:
        from laplace import Laplace
    images, labels = mnist_train_set()
    x = torch.from_numpy(images[:n].reshape(n, -1) / 255.0)
    y = torch.from_numpy(labels[:n].astype("int64"))
    xt = torch.from_numpy(images[n:n + 200].reshape(200, -1) / 255.0)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=128)
    model = mnist_mlp(seed=0)
    t = {}
    start = time.perf_counter()
    la = Laplace(model, "classification", subset, structure)
    la.fit(loader)
    t["fit"] = time.perf_counter() - start
    start = time.perf_counter()
    la.optimize_prior_precision()
    t["marglik"] = time.perf_counter() - start
    start = time.perf_counter()
    probs = la(xt)
    t["predict"] = time.perf_counter() - start
    print(json.dumps({"lib": lib, "subset": subset, "structure": structure, "n": n, "seconds": t,
                      "prior_precision": float(la.prior_precision.reshape(-1)[0]),
                      "probs_head": probs[:2].tolist(), "peak_mib": peak_mb()}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child, args.n)
        return
    for subset, structure in ROWS:
        for lib in ("laplace-torch", "fspace"):
            try:
                out = subprocess.run([sys.executable, __file__, "--n", str(args.n), "--child", lib, subset, structure],
                                     capture_output=True, text=True, timeout=args.timeout, check=True)
                print(out.stdout.strip().splitlines()[-1], flush=True)
            except subprocess.TimeoutExpired:
                print(json.dumps({"lib": lib, "subset": subset, "structure": structure, "timeout": args.timeout}),
                      flush=True)


if __name__ == "__main__":
    main()
