"""Reads what `cargo run --release --example from_pytorch` wrote and recomputes accuracy and
NLL of each method's class probabilities in numpy — the way back from fspace to Python.

    python scripts/interop/read_predictions.py [target/interop/mnist_predictions.npz]
"""

import sys

import numpy as np


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "target/interop/mnist_predictions.npz"
    npz = np.load(path)
    y = npz["y_test"].astype(np.int64) if "y_test" in npz.files else None
    for key in sorted(npz.files):
        arr = npz[key]
        if arr.dtype.kind == "U":
            print(f"{key}: {str(arr)!r}")
        elif key.startswith("summary."):
            print(f"{key} = {float(arr):.6g}")
        elif y is None:
            print(f"{key}: shape {arr.shape}")
        elif key.startswith("probs.") and y is not None:
            p = arr[np.arange(len(y)), y]
            print(f"{key}: shape {arr.shape}, accuracy {100 * (arr.argmax(1) == y).mean():.2f} %, NLL {-np.log(p).mean():.4f}")


if __name__ == "__main__":
    main()
