"""Trains the VaLLA paper's MNIST MLP (784-200-200-10, tanh; App. F.1) in PyTorch and exports
it for `cargo run --release --example from_pytorch`.

    python scripts/interop/train_in_pytorch.py [--epochs 37] [--out target/interop]

Needs torch, numpy and safetensors (`pip install torch numpy safetensors`); reads the IDX files
bundled in datasets/mnist. Writes, under --out:

* mnist_mlp.safetensors — the state_dict of nn.Sequential(Linear, Tanh, Linear, Tanh, Linear)
  in float32, as a PyTorch user saves it (`safetensors.torch.save_file`);
* mnist_mlp_meta.npz — the pixel standardisation (`pixel_mean`, `pixel_sd`), the validation
  rows of the 60 000 training images (`val_index`, as float64), and the logits PyTorch computes
  on the 10 000 test images (`test_logits`), so that fspace can check its forward pass.

Protocol as in the xtask valla-mnist experiment: pixels in [0, 1] standardised by one scalar
mean / sd of the training pixels, a seeded 90/10 train/validation split, Adam lr 1e-3, batch
100, weight decay 1e-3 (PyTorch's convention, on the mean loss), 37 epochs ≈ 20 000 steps.
"""

import argparse
import gzip
import os
import time

import numpy as np
import torch
from torch import nn
from safetensors.torch import save_file


def idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load(split):
    prefix = "train" if split == "train" else "t10k"
    root = os.path.join("datasets", "mnist")
    x = idx(os.path.join(root, f"{prefix}-images-idx3-ubyte.gz")).reshape(-1, 784) / 255.0
    y = idx(os.path.join(root, f"{prefix}-labels-idx1-ubyte.gz")).astype(np.int64)
    return x, y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=37)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join("target", "interop"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)

    x, y = load("train")
    x_test, _ = load("test")
    mean, sd = x.mean(), x.std()
    x, x_test = (x - mean) / sd, (x_test - mean) / sd
    perm = rng.permutation(len(x))
    val_index, train_index = perm[: len(x) // 10], perm[len(x) // 10 :]
    xt = torch.tensor(x[train_index], dtype=torch.float32)
    yt = torch.tensor(y[train_index])

    net = nn.Sequential(nn.Linear(784, 200), nn.Tanh(), nn.Linear(200, 200), nn.Tanh(), nn.Linear(200, 10))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3, weight_decay=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    start = time.time()
    for epoch in range(args.epochs):
        order = torch.randperm(len(xt))
        for b in range(0, len(xt), 100):
            i = order[b : b + 100]
            opt.zero_grad()
            loss = loss_fn(net(xt[i]), yt[i])
            loss.backward()
            opt.step()
        print(f"epoch {epoch + 1}/{args.epochs}  last batch loss {loss.item():.4f}", flush=True)
    print(f"trained in {time.time() - start:.1f} s")

    with torch.no_grad():
        test_logits = net(torch.tensor(x_test, dtype=torch.float32)).double().numpy()
        val_acc = (net(torch.tensor(x[val_index], dtype=torch.float32)).argmax(1).numpy() == y[val_index]).mean()
    print(f"validation accuracy {val_acc:.4f}")
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, os.path.join(args.out, "mnist_mlp.safetensors"))
    np.savez(
        os.path.join(args.out, "mnist_mlp_meta.npz"),
        pixel_mean=np.float64(mean),
        pixel_sd=np.float64(sd),
        val_index=val_index.astype(np.float64),
        test_logits=test_logits,
    )
    print(f"wrote {args.out}/mnist_mlp.safetensors and mnist_mlp_meta.npz")


if __name__ == "__main__":
    main()
