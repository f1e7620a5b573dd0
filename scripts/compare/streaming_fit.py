"""`fspace.Laplace.fit(loader)` streamed batch by batch against `fit(X, y)` on the arrays in memory.

The 784-200-200-10 tanh MNIST MLP (float64, seeded, untrained: the curvature's cost does not
depend on the weights), the first N training images, batches of 128, for `kron` and `diag`
over all weights and `kron` over the last layer, and post-hoc FSP-Laplace (`FSPLaplace(...,
train=False)`: an RBF prior on each of the 10 logits, 100 Halton context points, Lanczos rank
at most 100; from a loader it takes a pass for the data's box and a pass that adds each batch
to Alg. 2's `k × k` sum), FSP-Laplace trained (`fsp:train`: Alg. 1 for 300 steps of 128
images with 100 context points each, then Alg. 2; from a loader a pass for the box, then Rust
reads each step's minibatch and Alg. 2's chunks by position through the data set), GFSVI
(`gfsvi:train`: 2 steps of 128 images, 20 measurement points each; a pass for the box, then
each step's minibatch read by position), and ELLA (`ELLA(..., num_points=2000, num_eigen=20,
early_stopping=None)`, λ given; from a loader a pass gathers the Nyström rows and a pass adds
each batch to `G`'s `K × K` sum). Each measurement runs in its own subprocess:

* time: `fit` from a `DataLoader` over a `TensorDataset` already in memory (the loader's own
  cost is then only slicing) against `fit(X, y)` on the same arrays — the best of three each;
* memory: `fit` from a `DataLoader` over a dataset that reads each image from the uncompressed
  IDX file when asked (so the process never holds the images), against `fit(X, y)` with the
  float64 images in memory. Reported: the resident set before the fit (interpreter, torch, the
  model), the peak during it (`VmHWM`), and the peak's growth.

    python scripts/compare/streaming_fit.py [--n 60000] [--cases fsp:posthoc] [--out DIR]

Opt-in (not part of the test suite): needs torch beside the `fspace` package.
"""

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASES = [("kron", "all"), ("diag", "all"), ("kron", "last_layer"), ("fsp", "posthoc"), ("fsp", "train"),
         ("gfsvi", "train"), ("ella", "nystrom")]
BATCH = 128


def status_kib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def unpack(raw_dir):
    """The training images and labels as raw IDX files (the gzip'd ones, unpacked once)."""
    out = {}
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"):
        path = Path(raw_dir) / name
        if not path.exists():
            with gzip.open(ROOT / "datasets" / "mnist" / f"{name}.gz", "rb") as f:
                path.write_bytes(f.read())
        out[name] = path
    return out


def child(args):
    import numpy as np
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from _models import mnist_mlp

    import fspace

    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    files = unpack(args.raw)
    n = args.n
    model = mnist_mlp(seed=0)
    labels = np.fromfile(files["train-labels-idx1-ubyte"], dtype=np.uint8, offset=8)[:n].astype(np.int64)

    class FromFile(torch.utils.data.Dataset):
        """Reads image i from the IDX file when asked: nothing of the data set is held."""

        def __init__(self):
            self.f = open(files["train-images-idx3-ubyte"], "rb")

        def __len__(self):
            return n

        def __getitem__(self, i):
            self.f.seek(16 + 784 * i)
            img = np.frombuffer(self.f.read(784), dtype=np.uint8).astype(np.float64) / 255.0
            return torch.from_numpy(img), int(labels[i])

    def images():
        return np.fromfile(files["train-images-idx3-ubyte"], dtype=np.uint8, offset=16)[: n * 784].reshape(n, 784) / 255.0

    structure, subset = args.case.split(":")
    if structure == "fsp":
        prior = fspace.kernels.Independent(fspace.kernels.RBF(1.0, 10.0), 10)
        # Trained: Alg. 1 for 300 steps of 128 images, 100 context points each, then Alg. 2.
        train = dict(steps=300, batch_size=BATCH, n_context=100) if subset == "train" else {}
        la = fspace.FSPLaplace(model, "classification", prior, train=subset == "train", n_laplace_context=100,
                               laplace={"max_rank": 100}, **train)
    elif structure == "gfsvi":
        prior = fspace.kernels.Independent(fspace.kernels.RBF(1.0, 10.0), 10)
        la = fspace.GFSVI(model, "classification", prior, steps=2, measurement_points=20,
                          optim={"batch_size": BATCH})
    elif structure == "ella":
        la = fspace.ELLA(model, "classification", num_points=2000, num_eigen=20, prior={"Fixed": 1.0},
                         early_stopping=None)
    else:
        la = fspace.Laplace(model, "classification", subset, structure)
    if args.measure == "time":
        x, y = torch.from_numpy(images()), torch.from_numpy(labels)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH)
        times = {}
        for mode in ("memory", "stream"):
            best = float("inf")
            for _ in range(3):
                t0 = time.perf_counter()
                if mode == "memory":
                    la.fit(x, y)
                else:
                    la.fit(loader)
                best = min(best, time.perf_counter() - t0)
            times[mode] = best
        print(json.dumps({"case": args.case, "n": n, "seconds": times}))
        return
    before = status_kib("VmRSS")
    if args.measure == "memory-stream":
        la.fit(torch.utils.data.DataLoader(FromFile(), batch_size=BATCH))
    else:
        x = images()
        la.fit(x, labels)
    peak = status_kib("VmHWM")
    print(json.dumps({"case": args.case, "n": n, "mode": args.measure, "rss_before_mib": before / 1024,
                      "peak_mib": peak / 1024, "growth_mib": (peak - before) / 1024,
                      "posterior_params": getattr(la, "n_params", None)}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=60000)
    parser.add_argument("--out", default=None)
    parser.add_argument("--raw", default=None, help="where the unpacked IDX files go (default: a temporary folder)")
    parser.add_argument("--cases", default=",".join(f"{a}:{b}" for a, b in CASES),
                        help="comma-separated, of " + ", ".join(f"{a}:{b}" for a, b in CASES))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--case", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    raw = args.raw or tempfile.mkdtemp(prefix="fspace-mnist-")
    Path(raw).mkdir(parents=True, exist_ok=True)
    unpack(raw)
    rows = []
    for case in args.cases.split(","):
        for measure in ("time", "memory-stream", "memory-array"):
            out = subprocess.run([sys.executable, __file__, "--child", "--case", case, "--measure", measure,
                                  "--n", str(args.n), "--raw", raw], check=True, capture_output=True, text=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "streaming_fit.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
