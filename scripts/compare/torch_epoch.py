"""One epoch of MAP training in PyTorch 2 on the CPU, f64, for the three networks of the network-speed table.

Side-by-side reference for `cargo xtask reproduce nn-epoch-timer` (fspace's `train_map`).
Run it in a throw-away venv outside the repository, on the same machine:

    python -m venv /tmp/tv && /tmp/tv/bin/pip install torch numpy
    /tmp/tv/bin/python scripts/compare/torch_epoch.py [path/to/datasets/mnist] \
        [--images N] [--epochs K] [--warmup W] [--no-per-batch] [--only mlp,lenet,fsp] [--json]

`--images N` trains on the first N images of the split and scales the epoch time to 54 000;
`--warmup W` trains W untimed epochs first; `--no-per-batch` skips the per-batch operator
timings. `cargo xtask reproduce perf` runs `--images 5400 --warmup 1 --epochs 1 --no-per-batch
--only lenet --json` (and `--only fsp`) live, once per round between fspace's own epochs, and
reads the last line, `{"lenet_epoch_s": …}`.

Setting (as fspace's timer): the 60 000 MNIST training images standardised by one scalar mean
and std, a seeded 90/10 split (54 000 for training), batch 100, Adam lr 1e-3, cross-entropy
summed over the batch and scaled by N/B (the same objective fspace minimises), f64, 2 threads;
MLP 784-200-200-10 tanh, LeNet-5 tanh (conv 6@5x5 same + pool, conv 16@5x5 + pool, 120, 84,
10) and FSP-Laplace's MNIST CNN tanh (3x3 convs 16/32/64 same, pool after the first two, dense
128, 10). Prints the median of 3 epochs per network, and the per-batch times of a forward pass,
a J.u (torch.func.jvp) and a J^T.V (autograd) on 100 images.
"""
import argparse
import gzip
import json
import statistics
import struct
import time
from pathlib import Path

import torch
import torch.nn as nn

torch.set_default_dtype(torch.float64)
torch.set_num_threads(2)
torch.manual_seed(0)

ap = argparse.ArgumentParser()
ap.add_argument("root", nargs="?", default="datasets/mnist")
ap.add_argument("--images", type=int, default=None)
ap.add_argument("--epochs", type=int, default=3)
ap.add_argument("--warmup", type=int, default=0)
ap.add_argument("--no-per-batch", action="store_true")
ap.add_argument("--only", default="mlp,lenet,fsp")
ap.add_argument("--json", action="store_true")
args = ap.parse_args()
root = Path(args.root)


def idx_images(path):
    with gzip.open(path, "rb") if str(path).endswith(".gz") else open(path, "rb") as f:
        data = f.read()
    _, n, r, c = struct.unpack(">IIII", data[:16])
    return torch.frombuffer(bytearray(data[16:]), dtype=torch.uint8).reshape(n, r * c).double()


def idx_labels(path):
    with gzip.open(path, "rb") if str(path).endswith(".gz") else open(path, "rb") as f:
        data = f.read()
    return torch.frombuffer(bytearray(data[8:]), dtype=torch.uint8).long()


def find(stem):
    hits = sorted(root.glob(stem + "*"))
    if not hits:
        raise SystemExit(f"no {stem}* under {root}")
    return hits[0]


x = idx_images(find("train-images"))
y = idx_labels(find("train-labels"))
x = (x - x.mean()) / x.std(unbiased=False)
perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))
train = perm[x.shape[0] // 10 :]
x, y = x[train], y[train]
n_full = x.shape[0]
if args.images:
    x, y = x[: args.images], y[: args.images]
n = x.shape[0]
scale = n_full / n


def mlp():
    return nn.Sequential(nn.Linear(784, 200), nn.Tanh(), nn.Linear(200, 200), nn.Tanh(), nn.Linear(200, 10))


def lenet5():
    return nn.Sequential(
        nn.Unflatten(1, (1, 28, 28)),
        nn.Conv2d(1, 6, 5, padding=2), nn.Tanh(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.Tanh(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(400, 120), nn.Tanh(), nn.Linear(120, 84), nn.Tanh(), nn.Linear(84, 10),
    )


def fsp_cnn():
    return nn.Sequential(
        nn.Unflatten(1, (1, 28, 28)),
        nn.Conv2d(1, 16, 3, padding=1), nn.Tanh(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.Tanh(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.Tanh(),
        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.Tanh(), nn.Linear(128, 10),
    )


def epoch(net, opt, gen):
    order = torch.randperm(n, generator=gen)
    loss_fn = nn.CrossEntropyLoss(reduction="sum")
    t = time.perf_counter()
    for s in range(0, n, 100):
        idx = order[s : s + 100]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(net(x[idx]), y[idx]) * (n / len(idx))
        loss.backward()
        opt.step()
    return time.perf_counter() - t


def per_batch(net):
    from torch.func import functional_call, jvp, vjp

    xb = x[:100]
    params = {k: v.detach() for k, v in net.named_parameters()}
    tangent = {k: torch.randn_like(v) for k, v in params.items()}
    f = lambda p: functional_call(net, p, (xb,))
    v = torch.randn(100, 10)

    def med(fn, reps=15):
        fn()
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts) * 1e3

    with torch.no_grad():
        fwd = med(lambda: net(xb))
    jv = med(lambda: jvp(f, (params,), (tangent,)))
    vj = med(lambda: vjp(f, params)[1](v))
    return fwd, jv, vj


keys = {"mlp": "mlp_epoch_s", "lenet": "lenet_epoch_s", "fsp": "fsp_cnn_epoch_s"}
report = {}
for key, name, make in [("mlp", "MLP 784-200-200-10", mlp), ("lenet", "LeNet-5", lenet5), ("fsp", "FSP MNIST CNN", fsp_cnn)]:
    if key not in args.only.split(","):
        continue
    net = make()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(args.warmup):
        epoch(net, opt, gen)
    times = [epoch(net, opt, gen) * scale for _ in range(args.epochs)]
    report[keys[key]] = statistics.median(times)
    line = f"{name}: epoch median {statistics.median(times):.2f} s (all {', '.join(f'{t:.2f}' for t in times)})"
    if not args.no_per_batch:
        fwd, jv, vj = per_batch(net)
        line += f"; per batch of 100: f {fwd:.2f} ms, J.u {jv:.2f} ms, J^T.V {vj:.2f} ms"
    print(line, flush=True)
if args.json:
    print(json.dumps(report), flush=True)
