"""fspace's torch path on a ResNet-18-sized network beside laplace-torch, on CPU.

The model is ResNet-18 in its CIFAR layout (3 × 3 stem, no max-pool; BasicBlocks of 64, 128,
256 and 512 channels, 2 each; a 512 → 10 head): 11 169 162 trainable parameters, float32 as
torch trains it. Its BatchNorm layers are frozen (eval mode, ``requires_grad_(False)``, running
variances drawn from U(0.5, 2)), because Kronecker factors need every trainable parameter in a
Linear / Conv2d layer (README, Python). Its convolutions carry biases, the layout the table in
docs/PERFORMANCE.md was measured on; ``--bias-free`` builds torchvision's bias-free
convolutions instead (11 164 362 parameters).
Inputs are generated CIFAR-shaped images (N(0, 1), 3 × 32 × 32) labelled by the model's own
argmax: timing needs shapes, not a trained network.

Rows, each library in its own subprocess (its own peak RSS, from VmHWM):
- ``kron``: fspace ``Laplace(hessian_structure="kron", kron_bias="separate")`` on the torch path
  (module hooks) and laplace-torch's ``KronLaplace`` (its default curvlinops GGN back-end), fit on
  ``--n`` points and the GLM predictive (probit) on ``--n-test`` points, both at λ = 1, over all
  weights (``--subset last_layer``: the last layer, laplace-torch's default);
- ``lowrank``: fspace ``Laplace(hessian_structure="lowrank", rank=--lowrank-rank,
  max_basis=--lowrank-max-basis, chunk_points=--lowrank-chunk)``: the GGN's
  top eigenpairs by Lanczos on matrix-free GGN products (one forward-mode and one reverse pass
  over the fit points per step, streamed: the layer statistics exceed the 1 GiB cache), and its
  GLM predictive; laplace-torch's ``LowRankLaplace`` needs the old ``asdfghjkl`` back-end, which
  is installed from git, not from PyPI, so it has no row here;
- ``fsp``: fspace's post-hoc FSP-Laplace (Alg. 2) with an RBF prior at ``--context`` Halton
  context points, ``max_rank`` ``--fsp-rank``, on the same fit points, and its predictive.

Both libraries pay the same torch passes per point (one forward and one reverse pass per class
for the exact GGN), so the fit and the predictive grow linearly in the number of points (past the fixed costs,
which dominate at a few dozen points). docs/PERFORMANCE.md has the rows at the defaults and at
``--n 1000`` (fspace's with ``--n-test 1000``; laplace-torch's predictive, ≈ 7.4 s a point, with
``--n-test 20``).

Opt-in (not part of the test suite): the fspace rows need torch beside the ``fspace`` package;
the laplace-torch row needs ``pip install laplace-torch`` in the interpreter given by
``--laplace-torch-python`` (default: this one).

    python scripts/compare/resnet_scale.py --out target/resnet-scale
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def resnet18(seed=0, bias=True):
    import torch

    nn = torch.nn

    class BasicBlock(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=bias)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=bias)
            self.bn2 = nn.BatchNorm2d(cout)
            self.shortcut = nn.Sequential()
            if stride != 1 or cin != cout:
                self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=bias), nn.BatchNorm2d(cout))

        def forward(self, x):
            h = torch.relu(self.bn1(self.conv1(x)))
            return torch.relu(self.bn2(self.conv2(h)) + self.shortcut(x))

    class ResNet18(nn.Module):
        def __init__(self, classes=10):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=bias)
            self.bn1 = nn.BatchNorm2d(64)
            blocks, cin = [], 64
            for cout, stride in [(64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1)]:
                blocks.append(BasicBlock(cin, cout, stride))
                cin = cout
            self.layers = nn.Sequential(*blocks)
            self.fc = nn.Linear(512, classes)

        def forward(self, x):
            h = self.layers(torch.relu(self.bn1(self.conv1(x))))
            return self.fc(torch.nn.functional.adaptive_avg_pool2d(h, 1).flatten(1))

    torch.manual_seed(seed)
    model = ResNet18()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.weight.requires_grad_(False)
            m.bias.requires_grad_(False)
            with torch.no_grad():
                m.running_var.uniform_(0.5, 2.0)
    return model.eval()


def data(n, n_test, seed=1):
    import torch

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, 32, 32, generator=g)
    xt = torch.randn(n_test, 3, 32, 32, generator=g)
    return x, xt


def status_mb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def peak_mb():
    return status_mb("VmHWM")


def trace_callbacks(trace, live=None):
    """Wraps fspace's torch callbacks to record, per call, its name, seconds, and the resident
    memory before and after it with the peak so far (MB) — where a row's peak is reached. With
    ``live`` (a path), each record is also appended there as a JSON line when the call returns,
    so a long row can be followed (and read if it never finishes)."""
    from fspace._torch import TorchCalls

    origin = time.perf_counter()

    def wrap(name, fn):
        def traced(self, *a, **k):
            before, start = status_mb("VmRSS"), time.perf_counter()
            out = fn(self, *a, **k)
            trace.append({"call": name, "s": round(time.perf_counter() - start, 2), "rss_before": round(before),
                          "rss_after": round(status_mb("VmRSS")), "peak": round(peak_mb()),
                          "cols": int(a[2].shape[1]) if len(a) > 2 and hasattr(a[2], "shape") and a[2].ndim == 2 else None,
                          "at": round(time.perf_counter() - origin, 1)})
            if live is not None:
                with open(live, "a") as f:
                    f.write(json.dumps(trace[-1]) + "\n")
            return out
        return traced

    for name in ("forward", "jvp", "vjp", "per_point_vjp", "kfac_statistics", "kfac_factor_sums", "last_layer_features"):
        setattr(TorchCalls, name, wrap(name, getattr(TorchCalls, name)))


ROWS = ("fspace:kron", "laplace-torch", "fspace:fsp", "fspace:lowrank")


def run_fspace(row, args):
    import torch

    import fspace

    model = resnet18(bias=not args.bias_free)
    x, xt = data(args.n, args.n_test)
    with torch.no_grad():
        y = model(x).argmax(1)
    out = {"params": sum(p.numel() for p in model.parameters() if p.requires_grad)}
    if args.trace_rss:
        out["trace"] = []
        live = Path(args.out) / f"trace-{row}.jsonl"
        live.unlink(missing_ok=True)
        trace_callbacks(out["trace"], live)
    start = time.perf_counter()
    if row in ("kron", "lowrank"):
        extra = {"kron_bias": "separate"} if row == "kron" else {
            "rank": args.lowrank_rank, "max_basis": args.lowrank_max_basis, "chunk_points": args.lowrank_chunk}
        la = fspace.Laplace(model, "classification", subset_of_weights=args.subset if row == "kron" else "all",
                            hessian_structure=row, prior_precision=1.0, backend="torch", **extra)
        la.fit(x, y)
        out["fit_s"] = time.perf_counter() - start
        out["report"] = la.report
        start = time.perf_counter()
        probs = la(xt, pred_type="glm", link_approx="probit")
    else:
        prior = fspace.GPPrior(fspace.kernels.Independent(fspace.kernels.RBF(1.0, float(np.sqrt(3 * 32 * 32))), 10))
        fsp = fspace.FSPLaplace(model, "classification", prior, train=False, n_laplace_context=args.context,
                                laplace={"max_rank": args.fsp_rank}, backend="torch")
        fsp.fit(x, y)
        out["fit_s"] = time.perf_counter() - start
        start = time.perf_counter()
        probs = fsp(xt)
    out["predict_s"] = time.perf_counter() - start
    out["probs"] = np.asarray(probs).tolist()
    return out


def run_laplace_torch(args):
    import torch
    from laplace import Laplace

    torch.set_num_threads(os.cpu_count() or 1)
    model = resnet18(bias=not args.bias_free)
    x, xt = data(args.n, args.n_test)
    with torch.no_grad():
        y = model(x).argmax(1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    start = time.perf_counter()
    la = Laplace(model, "classification", subset_of_weights=args.subset, hessian_structure="kron", prior_precision=1.0)
    la.fit(loader)
    out = {"fit_s": time.perf_counter() - start, "backend": type(la.backend).__name__}
    # In batches of 4: laplace-torch forms each batch's n·c × p Jacobian (16 points: 7 GB in
    # float32, and more in its Kronecker products; 32 points ran out of 24 GB at 20.6 GB).
    start = time.perf_counter()
    probs = torch.cat([la(xt[b:b + 4], pred_type="glm", link_approx="probit") for b in range(0, len(xt), 4)])
    out["predict_s"] = time.perf_counter() - start
    out["probs"] = probs.detach().numpy().tolist()
    return out


def child(args):
    res = run_laplace_torch(args) if args.one == "laplace-torch" else run_fspace(args.one.split(":")[1], args)
    res["peak_rss_mb"] = peak_mb()
    print(json.dumps(res))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--n", type=int, default=32, help="fit points")
    ap.add_argument("--n-test", type=int, default=16, help="predictive points")
    ap.add_argument("--context", type=int, default=100, help="FSP-Laplace context points")
    ap.add_argument("--fsp-rank", type=int, default=20, help="FSP-Laplace's Lanczos rank (M = J(C)ᵀL is p × rank)")
    ap.add_argument("--lowrank-rank", type=int, default=20, help="GGN eigenpairs of the lowrank row (its memory: p × 1.5·rank doubles)")
    ap.add_argument("--lowrank-max-basis", type=int, default=None,
                    help="most Krylov vectors the lowrank row holds (thick restart; default: grow as needed)")
    ap.add_argument("--lowrank-chunk", type=int, default=None,
                    help="points per chunk of the lowrank row's torch calls (default 256)")
    ap.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {', '.join(ROWS)}")
    ap.add_argument("--laplace-torch-python", default=sys.executable)
    ap.add_argument("--bias-free", action="store_true", help="torchvision's bias-free convolutions")
    ap.add_argument("--subset", default="all", choices=["all", "last_layer"],
                    help="subset_of_weights of the kron rows (last_layer: laplace-torch's default)")
    ap.add_argument("--trace-rss", action="store_true",
                    help="record each torch callback's seconds and resident memory (results.json, per row; "
                         "OUT/trace-ROW.jsonl as the row runs)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        return child(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # Rows already measured with the same settings are kept (rerun a row by naming it).
    saved = out / "results.json"
    results = {}
    if saved.exists():
        before = json.loads(saved.read_text())
        skip = ("rows", "out", "laplace_torch_python", "trace_rss")
        same = {k: v for k, v in before["args"].items() if k not in skip}
        # A setting added after a file was written counts as its default there.
        now = {k: v for k, v in vars(args).items() if k not in skip and (k in same or v != ap.get_default(k))}
        if same == now:
            results = before["results"]
    rows = args.rows.split(",")
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        raise SystemExit(f"unknown row(s) {unknown}; the rows are {list(ROWS)}")
    for row in rows:
        python = args.laplace_torch_python if row == "laplace-torch" else sys.executable
        cmd = [python, __file__, "--out", str(out), "--n", str(args.n), "--n-test", str(args.n_test),
               "--context", str(args.context), "--fsp-rank", str(args.fsp_rank), "--lowrank-rank", str(args.lowrank_rank),
               "--one", row]
        for flag, value in (("--lowrank-max-basis", args.lowrank_max_basis), ("--lowrank-chunk", args.lowrank_chunk)):
            cmd += [flag, str(value)] if value is not None else []
        cmd += ["--bias-free"] if args.bias_free else []
        cmd += ["--trace-rss"] if args.trace_rss else []
        cmd += ["--subset", args.subset]
        start = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(f"{row} failed (exit {res.returncode}; -9 is the kernel's OOM killer):\n{res.stderr[-3000:]}")
        results[row] = json.loads(res.stdout.strip().splitlines()[-1])
        results[row]["wall_s"] = time.perf_counter() - start
        r = results[row]
        print(f"{row:14} fit {r['fit_s']:8.1f} s ({r['fit_s'] / args.n:6.2f} s/point)  predictive {r['predict_s']:8.1f} s "
              f"({r['predict_s'] / args.n_test:6.2f} s/point)  peak {r['peak_rss_mb'] / 1024:6.2f} GiB", flush=True)
        (out / "results.json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    if "fspace:kron" in results and "laplace-torch" in results:
        a, b = np.array(results["fspace:kron"]["probs"]), np.array(results["laplace-torch"]["probs"])
        print(f"kron predictive probabilities: max |fspace − laplace-torch| = {np.abs(a - b).max():.2e}, "
              f"max relative {np.max(np.abs(a - b) / b):.2e}")


if __name__ == "__main__":
    main()
