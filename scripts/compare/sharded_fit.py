"""The sharded Laplace fit on one machine: 2 processes × 1 thread (gloo over loopback) against
1 process × 2 threads, on the 784-200-200-10 tanh MNIST MLP (float64, seeded, untrained: the
costs do not depend on the weights), the first N training images from a `DataLoader` (batch
128): `fspace.Laplace(model, "classification", subset, structure).fit(loader)`. Reported per row:
the fit's wall time (the slowest process), each process's peak memory (`VmHWM`), the bytes each
process sends into the all-reduces (the flat partial sums and the 3-number agreement round) and
the largest difference between the two setups' predictive probabilities on 200 test images.
``--fsp`` runs post-hoc FSP-Laplace instead (`FSPLaplace(model, "classification", prior,
train=False)`, an RBF prior per class, Alg. 2 with `--max-rank` Lanczos vectors at 100 Halton
context points): its one all-reduce is the `k × k` data sum, `k` ≤ the rank. ``--ella`` runs
ELLA (`Laplace(model, "classification", "all", "gp", functional_approximation="nystrom")`,
`--subsample` Nyström points, `--eigen` directions; one `K × K` all-reduce after the pass) and
``--gfsvi`` GFSVI (an RBF prior per class, `--steps` Adam steps on batches of 128 with 20
measurement points; each process passes its contiguous rows, and every step all-reduces the data
term and its gradient, `2p + 3` numbers). ``--multipass`` runs the Laplace structures that pass over
the data more than once, `ekfac` and `lowrank` (`--rank` eigenpairs), which all-reduce every sum
over the data as it is formed (the factor sums, then EKFAC's eigenvalues; a `p`-vector per Lanczos
product); their bytes are counted at the all-reduce itself. ``--valla`` runs VaLLA (`--inducing`
inducing points, `--steps` Adam steps on batches of 128, no validation; each process passes its
contiguous rows, the k-means start and every step's data term are all-reduced), bytes counted at
the all-reduce. ``--fsp-train`` runs FSP-Laplace with its training (Alg. 1: `--steps` Adam steps
on batches of 128 with 100 context points a step, an RBF prior per class; then Alg. 2 with
`--max-rank` Lanczos vectors at 100 Halton context points), each process passing its contiguous
rows; bytes counted at the all-reduce.

    python scripts/compare/sharded_fit.py [--n 59800]
    python scripts/compare/sharded_fit.py --fsp [--n 10000] [--max-rank 100]
    python scripts/compare/sharded_fit.py --ella [--n 59800] [--subsample 1000] [--eigen 100]
    python scripts/compare/sharded_fit.py --gfsvi [--n 59800] [--steps 100]
    python scripts/compare/sharded_fit.py --multipass [--n 10000] [--rank 20]
    python scripts/compare/sharded_fit.py --valla [--n 59800] [--steps 100] [--inducing 100]
    python scripts/compare/sharded_fit.py --fsp-train [--n 59800] [--steps 100] [--max-rank 100]

Opt-in (not part of the test suite): needs torch beside the `fspace` package.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from python_vs_laplace_torch import mnist_train_set, peak_mb  # noqa: E402  (MNIST and VmHWM)

ROWS = [("all", "diag"), ("all", "kron"), ("last_layer", "kron"), ("last_layer", "full")]
MULTIPASS_ROWS = [("all", "ekfac"), ("all", "lowrank")]


def child(subset, structure, n, world, rank, port, max_rank=100, extra=(1000, 100, 100, 20, 100)):
    import warnings

    import numpy as np
    import torch

    warnings.simplefilter("ignore")
    from _models import mnist_mlp

    import fspace

    torch.set_num_threads(1 if world > 1 else 2)
    if world > 1:
        torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=world, rank=rank)
    images, labels = mnist_train_set()
    x = torch.from_numpy(images[:n].reshape(n, -1) / 255.0)
    y = torch.from_numpy(labels[:n].astype("int64"))
    xt = torch.from_numpy(images[-200:].reshape(200, -1) / 255.0)  # never among the first 59 800
    dataset = torch.utils.data.TensorDataset(x, y)
    loader = torch.utils.data.DataLoader(dataset, batch_size=128, sampler=list(range(rank, n, world)))
    subsample, eigen, steps, low_rank, inducing = extra
    if subset == "fsp":
        prior = fspace.kernels.Independent(fspace.kernels.RBF(1.0, 10.0), 10)
        la = fspace.FSPLaplace(mnist_mlp(seed=0), "classification", prior, train=False, laplace={"max_rank": max_rank})
    elif subset == "ella":
        la = fspace.Laplace(mnist_mlp(seed=0), "classification", "all", "gp", functional_approximation="nystrom",
                            subsample_size=subsample, n_eigenvalues=eigen)
    elif subset == "gfsvi":
        prior = fspace.kernels.Independent(fspace.kernels.RBF(1.0, 10.0), 10)
        la = fspace.GFSVI(mnist_mlp(seed=0), "classification", prior, steps=steps, measurement_points=20,
                          class_samples=2, optim={"batch_size": 128, "learning_rate": 1e-3, "seed": 0})
    elif subset == "fsp-train":
        prior = fspace.kernels.Independent(fspace.kernels.RBF(1.0, 10.0), 10)
        la = fspace.FSPLaplace(mnist_mlp(seed=0), "classification", prior, steps=steps, batch_size=128,
                               learning_rate=1e-3, n_context=100, laplace={"max_rank": max_rank})
    elif subset == "valla":
        la = fspace.VaLLA(mnist_mlp(seed=0), "classification", steps=steps, num_inducing=inducing, batch_size=128,
                          learning_rate=1e-3, seed=0)
    elif structure == "lowrank":
        la = fspace.Laplace(mnist_mlp(seed=0), "classification", subset, structure, rank=low_rank)
    else:
        la = fspace.Laplace(mnist_mlp(seed=0), "classification", subset, structure)
    counted = [0]
    if (structure in ("ekfac", "lowrank") or subset in ("valla", "fsp-train")) and world > 1:
        # Every all-reduce of the fit, counted where it is sent.
        from fspace import _distributed

        send = _distributed._TorchGroup.all_reduce

        def counting(self, values, op):
            counted[0] += 8 * np.asarray(values).size
            return send(self, values, op)

        _distributed._TorchGroup.all_reduce = counting
    if world > 1:
        torch.distributed.barrier()
    start = time.perf_counter()
    if subset == "fsp":
        la.fit(x[rank::world], y[rank::world])
        seconds = time.perf_counter() - start
        k = la.report["range_rank"]
        # The box (2 × 784 maxima), the status and fingerprint (7), the k × k sum.
        sent = 0 if world == 1 else 8 * (2 * x.shape[1] + 7 + k * k)
    elif subset == "ella":
        la.fit(loader)
        seconds = time.perf_counter() - start
        # The fingerprint's width (2) and values (2 × 8), three status rounds (1 each), the
        # dataset's length (2), the index counts (n), the K × K sum with the point count.
        sent = 0 if world == 1 else 8 * (2 + 16 + 3 + 2 + n + eigen * eigen + 1)
    elif subset == "gfsvi":
        lo, hi = rank * n // world, (rank + 1) * n // world
        la.fit(x[lo:hi], y[lo:hi])
        seconds = time.perf_counter() - start
        p = sum(v.numel() for v in mnist_mlp(seed=0).parameters())
        # The settings' agreement (2 + 2 × 8), the prep status (1), the counts (2), the box
        # (2 × 784), then each step's data term with its failure flag (2p + 3).
        sent = 0 if world == 1 else 8 * (2 + 16 + 1 + 2 + 2 * x.shape[1] + steps * (2 * p + 3))
    elif subset in ("valla", "fsp-train"):
        lo, hi = rank * n // world, (rank + 1) * n // world
        la.fit(x[lo:hi], y[lo:hi])
        seconds = time.perf_counter() - start
        sent = counted[0]
    elif structure in ("ekfac", "lowrank"):
        la.fit(loader)
        seconds = time.perf_counter() - start
        sent = counted[0]
    else:
        la.fit(loader)
        seconds = time.perf_counter() - start
        sent = 0 if world == 1 else 8 * (np.array(la._la.sums_flat()).size + 3)
    probs = la(xt)
    report = la.report if subset not in ("fsp", "ella", "gfsvi", "valla", "fsp-train") else {}
    print(json.dumps({"rank": rank, "seconds": seconds, "peak_mib": peak_mb(), "bytes_sent": sent,
                      "lanczos_products": report.get("lanczos_iterations"), "probs": probs.tolist()}))
    if world > 1:
        torch.distributed.destroy_process_group()


def run(subset, structure, n, world, max_rank=100, extra=(1000, 100, 100, 20, 100)):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    threads = "1" if world > 1 else "2"
    env = dict(os.environ, RAYON_NUM_THREADS=threads, OMP_NUM_THREADS=threads)
    subsample, eigen, steps, low_rank, inducing = extra
    procs = [subprocess.Popen([sys.executable, __file__, "--n", str(n), "--max-rank", str(max_rank),
                               "--subsample", str(subsample), "--eigen", str(eigen), "--steps", str(steps),
                               "--rank", str(low_rank), "--inducing", str(inducing),
                               "--child", subset, structure, str(world), str(r), str(port)], env=env,
                              stdout=subprocess.PIPE, text=True)
             for r in range(world)]
    return [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=None, help="training images (59 800; --fsp: 10 000)")
    ap.add_argument("--fsp", action="store_true", help="post-hoc FSP-Laplace instead of the Laplace rows")
    ap.add_argument("--max-rank", type=int, default=100, help="--fsp: Alg. 2's Lanczos vectors")
    ap.add_argument("--ella", action="store_true", help="ELLA instead of the Laplace rows")
    ap.add_argument("--subsample", type=int, default=1000, help="--ella: Nyström points")
    ap.add_argument("--eigen", type=int, default=100, help="--ella: kernel directions kept")
    ap.add_argument("--gfsvi", action="store_true", help="GFSVI instead of the Laplace rows")
    ap.add_argument("--steps", type=int, default=100, help="--gfsvi: Adam steps")
    ap.add_argument("--multipass", action="store_true", help="Laplace ekfac and lowrank instead of the one-pass rows")
    ap.add_argument("--rank", type=int, default=20, help="--multipass: lowrank's eigenpairs")
    ap.add_argument("--valla", action="store_true", help="VaLLA instead of the Laplace rows")
    ap.add_argument("--fsp-train", action="store_true", help="FSP-Laplace with its training instead")
    ap.add_argument("--inducing", type=int, default=100, help="--valla: inducing points")
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    n = args.n if args.n is not None else (10000 if args.fsp or args.multipass else 59800)
    extra = (args.subsample, args.eigen, args.steps, args.rank, args.inducing)
    if args.child:
        subset, structure, world, rank, port = args.child
        child(subset, structure, n, int(world), int(rank), port, args.max_rank, extra)
        return
    import numpy as np

    rows = [("fsp", "posthoc")] if args.fsp else [("ella", "nystrom")] if args.ella else \
        [("gfsvi", "meanfield")] if args.gfsvi else [("valla", "probit")] if args.valla else \
        [("fsp-train", "alg1+2")] if args.fsp_train else \
        MULTIPASS_ROWS if args.multipass else ROWS
    for subset, structure in rows:
        one = run(subset, structure, n, 1, args.max_rank, extra)[0]
        two = run(subset, structure, n, 2, args.max_rank, extra)
        diff = max(float(np.abs(np.array(r["probs"]) - np.array(one["probs"])).max()) for r in two)
        print(json.dumps({"subset": subset, "structure": structure, "n": n,
                          "one_process_two_threads": {"seconds": one["seconds"], "peak_mib": one["peak_mib"]},
                          "two_processes_one_thread": {"seconds": max(r["seconds"] for r in two),
                                                       "peak_mib": [r["peak_mib"] for r in two],
                                                       "bytes_sent_per_process": two[0]["bytes_sent"]},
                          "lanczos_iterations": [one["lanczos_products"], two[0]["lanczos_products"]],
                          "max_probability_difference": diff}), flush=True)


if __name__ == "__main__":
    main()
