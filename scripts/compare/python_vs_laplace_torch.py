"""fspace's Python `Laplace` beside laplace-torch's, on the same trained networks, in float64.

Rows: the 1-50-50-1 tanh sine regression net (`hessian_structure` full / kron / diag) and a
784-200-200-10 tanh MNIST MLP (kron / diag). Each row: `Laplace(...)` → `fit` →
`optimize_prior_precision(method="marglik")` → the GLM predictive on 1 000 test points (probit
link for MNIST), by each library in its own subprocess (so each peak RSS is its own; fspace's process reads
numpy copies of the networks; fspace.Laplace imports torch for its hyperparameters and results). Reported:
wall time of each step (fspace's: the best of three), peak memory, the λ each library's marginal-likelihood search chose, and
the largest relative difference of the predictive variance (regression) or probabilities
(classification) *at laplace-torch's λ* (fspace refitted with it; kron with laplace-torch's
separate bias block, `kron_bias="separate"`), plus the Python layer's share of fspace's time
(the wrapper calls against the compiled module's calls on already-converted arrays).

Opt-in (not part of the test suite): needs `pip install torch laplace-torch` beside the
`fspace` package (`pip install ./crates/fspace-py`). MNIST comes from `datasets/mnist/`.

    python scripts/compare/python_vs_laplace_torch.py --out /tmp/py_vs_lt [--mnist-train 10000]
"""

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
ROWS = [("sine", "full"), ("sine", "kron"), ("sine", "diag"), ("mnist", "kron"), ("mnist", "diag")]
SIGMA = 0.1
N_TEST = 1000


def idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def mnist_train_set():
    """MNIST's 60 000 training images (``uint8``, ``60000 × 28 × 28``) and labels from
    ``datasets/mnist/``."""
    return (idx(ROOT / "datasets" / "mnist" / "train-images-idx3-ubyte.gz"),
            idx(ROOT / "datasets" / "mnist" / "train-labels-idx1-ubyte.gz"))


def prepare(out, mnist_train):
    """Trains both networks in torch (float64, seeded) and saves them with their data."""
    import torch

    from _models import mnist_mlp, sine_net

    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    # Sine: FSP-Laplace App. B.1's generator.
    n = 100
    u = rng.uniform(0.5, 1.0, n)
    x = np.where(rng.uniform(size=n) < 0.5, u, -u).reshape(-1, 1)
    y = np.sin(2 * np.pi * x) + SIGMA * rng.standard_normal((n, 1))
    net = sine_net()
    X, Y = torch.tensor(x), torch.tensor(y)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(2000):
        opt.zero_grad()
        loss = ((net(X) - Y) ** 2).sum() / (2 * SIGMA**2) + 0.5 * sum((p**2).sum() for p in net.parameters())
        loss.backward()
        opt.step()
    x_test = np.linspace(-2, 2, N_TEST).reshape(-1, 1)
    torch.save({"state": net.state_dict(), "x": x, "y": y, "x_test": x_test}, out / "sine.pt")
    # MNIST: 784-200-200-10 tanh, two epochs of Adam on the first `mnist_train` images.
    images = idx(ROOT / "datasets/mnist/train-images-idx3-ubyte.gz")[:mnist_train].reshape(mnist_train, -1) / 255.0
    labels = idx(ROOT / "datasets/mnist/train-labels-idx1-ubyte.gz")[:mnist_train].astype(np.float64)
    test = idx(ROOT / "datasets/mnist/t10k-images-idx3-ubyte.gz")[:N_TEST].reshape(N_TEST, -1) / 255.0
    net = mnist_mlp()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    Xm, Ym = torch.tensor(images), torch.tensor(labels).long()
    for _ in range(2):
        perm = torch.randperm(mnist_train)
        for b in range(0, mnist_train, 128):
            i = perm[b:b + 128]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(Xm[i]), Ym[i]).backward()
            opt.step()
    acc = (net(torch.tensor(test)).argmax(1).numpy() == idx(ROOT / "datasets/mnist/t10k-labels-idx1-ubyte.gz")[:N_TEST]).mean()
    torch.save({"state": net.state_dict(), "x": images, "y": labels, "x_test": test, "test_accuracy": float(acc)},
               out / "mnist.pt")


def export_npz(out):
    """numpy copies of both saved problems: fspace's process reads the networks as
    ``(state_dict, activation)`` pairs (it imports torch for its tensors only)."""
    import torch

    for net in ("sine", "mnist"):
        if (out / f"{net}.npz").exists():
            continue
        data = torch.load(out / f"{net}.pt", weights_only=False)
        arrays = {f"state/{k}": v.detach().numpy() for k, v in data["state"].items()}
        np.savez(out / f"{net}.npz", x=data["x"], y=data["y"], x_test=data["x_test"], **arrays)


def network(data):
    from _models import mnist_mlp, sine_net  # imports torch: only the torch side calls this

    net = sine_net() if data["state"]["0.weight"].shape[1] == 1 else mnist_mlp()
    net.load_state_dict(data["state"])
    return net.double()


def peak_mb():
    """This process's peak resident memory: VmHWM, the high-water mark of its own address space
    (``ru_maxrss`` would keep the parent's size across fork + exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_laplace_torch(net, data, lik, structure):
    import torch
    from laplace import Laplace

    X, Y = torch.tensor(data["x"]), torch.tensor(data["y"])
    if lik == "classification":
        Y = Y.long()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=256)
    kwargs = {"sigma_noise": SIGMA} if lik == "regression" else {}
    t = {}
    start = time.perf_counter()
    la = Laplace(net, lik, subset_of_weights="all", hessian_structure=structure, prior_precision=1.0, **kwargs)
    la.fit(loader)
    t["fit"] = time.perf_counter() - start
    start = time.perf_counter()
    la.optimize_prior_precision(method="marglik")
    t["marglik"] = time.perf_counter() - start
    lam = float(la.prior_precision.detach().reshape(-1)[0])
    xt = torch.tensor(data["x_test"])
    start = time.perf_counter()
    outs = []
    for b in range(0, xt.shape[0], 50):  # laplace-torch forms n × c × p Jacobians: batches keep it in memory
        if lik == "regression":
            _, var = la(xt[b:b + 50], pred_type="glm")
            outs.append(var.detach().reshape(-1, 1).numpy())
        else:
            outs.append(la(xt[b:b + 50], pred_type="glm", link_approx="probit").detach().numpy())
    t["predict"] = time.perf_counter() - start
    return {"times": t, "lambda": lam, "output": np.concatenate(outs).tolist()}


def run_fspace(net, data, lik, structure, lam_torch):
    import fspace
    from fspace._convert import array2

    kwargs = {"sigma_noise": SIGMA} if lik == "regression" else {}
    t, inner = {}, {}
    x, y, xt = data["x"], data["y"], data["x_test"]
    la = None

    def wrapper():
        nonlocal la
        la = fspace.Laplace(net, lik, subset_of_weights="all", hessian_structure=structure, prior_precision=1.0,
                            kron_bias="separate", **kwargs)
        la.fit(x, y)

    # The wrapper calls (conversions included: the torch model → state_dict → Rust network, the
    # arrays) against the compiled module's own calls on already-converted arrays; each the best
    # of three, alternating, so both see warm caches.
    xa, ya, xta = array2(x, "X"), array2(y, "y"), array2(xt, "X")
    steps = {
        "fit": (wrapper, lambda: la._la.fit(xa, ya)),
        # laplace-torch's search (100 Adam steps on log λ against the differentiable evidence)
        # against the compiled module's own bracketing search.
        "marglik": (lambda: la.optimize_prior_precision(method="marglik"), lambda: la._la.optimize_prior_precision("marglik")),
        "predict": (lambda: la(xt), lambda: la._la.glm(xta)),
    }
    for name, (outer_call, inner_call) in steps.items():
        best_outer = best_inner = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            outer_call()
            best_outer = min(best_outer, time.perf_counter() - start)
            start = time.perf_counter()
            inner_call()
            best_inner = min(best_inner, time.perf_counter() - start)
        t[name], inner[name] = best_outer, best_inner
    lam = float(la.prior_precision[0])
    # At laplace-torch's λ, for the comparison of the numbers.
    same = fspace.Laplace(net, lik, subset_of_weights="all", hessian_structure=structure, prior_precision=lam_torch,
                          kron_bias="separate", **kwargs)
    same.fit(x, y)
    at_torch = same(xt)
    at_torch = at_torch[1].diagonal(dim1=1, dim2=2) if lik == "regression" else at_torch
    return {"times": t, "inner": inner, "lambda": lam, "output_at_torch_lambda": np.asarray(at_torch).tolist()}


def child(args):
    lik = "regression" if args.net == "sine" else "classification"
    if args.lib == "laplace-torch":
        import torch

        torch.set_default_dtype(torch.float64)
        torch.set_num_threads(os.cpu_count() or 1)
        data = torch.load(Path(args.out) / f"{args.net}.pt", weights_only=False)
        res = run_laplace_torch(network(data), data, lik, args.structure)
    else:
        z = np.load(Path(args.out) / f"{args.net}.npz")
        state = {k[len("state/"):]: z[k] for k in z.files if k.startswith("state/")}
        data = {"x": z["x"], "y": z["y"], "x_test": z["x_test"]}
        res = run_fspace((state, "tanh"), data, lik, args.structure, args.lam)
    res["peak_rss_mb"] = peak_mb()
    print(json.dumps(res))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--mnist-train", type=int, default=10000)
    ap.add_argument("--one", nargs=3, metavar=("LIB", "NET", "STRUCTURE"))
    ap.add_argument("--lam", type=float, default=1.0)
    ap.add_argument("--rows", help="NET:STRUCTURE,… (default: every row)")
    ap.add_argument("--laplace-torch-timeout", type=float, default=1800.0,
                    help="seconds before a laplace-torch row is stopped and reported as unfinished")
    ap.add_argument("--rerun-laplace-torch", action="store_true",
                    help="recompute laplace-torch's rows (kept in OUT/laplace_torch_*.json otherwise)")
    args = ap.parse_args()
    if args.one:
        args.lib, args.net, args.structure = args.one
        return child(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not (out / "mnist.pt").exists():
        prepare(out, args.mnist_train)
    export_npz(out)
    import importlib.metadata as md

    rows = []
    rows_wanted = [tuple(r.split(":")) for r in args.rows.split(",")] if args.rows else ROWS
    for net, structure in rows_wanted:
        def call(lib, lam=1.0):
            cmd = [sys.executable, __file__, "--out", str(out), "--one", lib, net, structure, "--lam", repr(lam)]
            try:
                res = subprocess.run(cmd, capture_output=True, text=True,
                                     timeout=args.laplace_torch_timeout if lib == "laplace-torch" else None)
            except subprocess.TimeoutExpired:
                return None
            if res.returncode != 0:
                raise SystemExit(f"{lib} {net} {structure} failed:\n{res.stderr[-3000:]}")
            return json.loads(res.stdout.strip().splitlines()[-1])

        cached = out / f"laplace_torch_{net}_{structure}.json"
        if cached.exists() and not args.rerun_laplace_torch:
            lt = json.loads(cached.read_text())
        else:
            lt = call("laplace-torch")
            if lt is not None:
                cached.write_text(json.dumps(lt))
        if lt is None:
            fs = call("fspace")
            row = {"net": net, "structure": structure, "fspace_s": fs["times"], "fspace_inner_s": fs["inner"],
                   "fspace_total_s": sum(fs["times"].values()), "fspace_peak_mb": fs["peak_rss_mb"],
                   "laplace_torch": f"stopped after {args.laplace_torch_timeout:.0f} s"}
            rows.append(row)
            print(f"{net:5} {structure:4}  laplace-torch stopped after {args.laplace_torch_timeout:.0f} s   "
                  f"fspace {row['fspace_total_s']:8.3f} s", flush=True)
            continue
        fs = call("fspace", lt["lambda"])
        a, b = np.asarray(fs["output_at_torch_lambda"]), np.asarray(lt["output"])
        rel = float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300)))
        total = lambda r: sum(r["times"].values())
        row = {
            "net": net, "structure": structure,
            "laplace_torch_s": lt["times"], "fspace_s": fs["times"], "fspace_inner_s": fs["inner"],
            "laplace_torch_total_s": total(lt), "fspace_total_s": total(fs),
            "speedup": total(lt) / total(fs),
            "python_overhead": total(fs) / sum(fs["inner"].values()) - 1.0,
            "laplace_torch_peak_mb": lt["peak_rss_mb"], "fspace_peak_mb": fs["peak_rss_mb"],
            "lambda_laplace_torch": lt["lambda"], "lambda_fspace": fs["lambda"],
            "max_rel_diff_at_same_lambda": rel,
        }
        rows.append(row)
        print(f"{net:5} {structure:4}  laplace-torch {total(lt):8.3f} s {lt['peak_rss_mb']:7.0f} MB   "
              f"fspace {total(fs):8.3f} s {fs['peak_rss_mb']:7.0f} MB   ×{row['speedup']:.1f}   "
              f"λ {lt['lambda']:.4g} / {fs['lambda']:.4g}   rel diff {rel:.2e}   py overhead {100 * row['python_overhead']:.1f} %",
              flush=True)
    meta = {"laplace-torch": md.version("laplace-torch"), "torch": md.version("torch"), "n_test": N_TEST,
            "mnist_train": args.mnist_train, "cpus": os.cpu_count()}
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
