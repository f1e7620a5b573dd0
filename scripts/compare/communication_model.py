"""The sharded Laplace fit's communication, on paper: the bytes each process sends into the
all-reduce of the partial sums (`LaplaceSums::to_flat`, float64) for each structure, on a
ResNet-50 (torchvision's layer shapes, no weights downloaded) and on LoRA adapters (rank 8 on the
query and value projections) of a 7B-parameter transformer (32 layers, width 4 096), and the
projected wall time of one curvature pass over ImageNet (1 281 167 images) on G GPUs:

    time(G) = N · t / G  +  2 (G − 1) / G · bytes / bandwidth     (a ring all-reduce, once per fit)

with t the seconds one GPU spends per image in the curvature pass (an assumption, printed) and
the interconnect bandwidths below. Prints markdown tables (docs/PERFORMANCE.md, "Sharded fitting").

    python scripts/compare/communication_model.py [--t-image 0.002]
"""

import argparse

N_IMAGENET = 1_281_167
BANDWIDTHS = [("NVLink (≈ 300 GB/s)", 300e9), ("InfiniBand HDR (≈ 25 GB/s)", 25e9), ("100 GbE (≈ 12.5 GB/s)", 12.5e9)]


def resnet50_layers():
    """(fan_in, fan_out, has_bias) per weight layer: a conv's fan_in is C_in·k·k (KFAC's input
    factor covers the patches), batch norms' scale and shift are two per-channel 'layers'."""
    import torch
    import torchvision

    model = torchvision.models.resnet50(weights=None)
    layers = []
    for m in model.modules():
        if isinstance(m, torch.nn.Conv2d):
            layers.append((m.in_channels * m.kernel_size[0] * m.kernel_size[1] // m.groups, m.out_channels, m.bias is not None))
        elif isinstance(m, torch.nn.Linear):
            layers.append((m.in_features, m.out_features, True))
        elif isinstance(m, torch.nn.BatchNorm2d):
            layers.append((1, m.num_features, True))  # scale and shift: a 1-input layer with a bias
    return layers


def lora_layers(n_layers=32, width=4096, rank=8, modules=2):
    """Each adapted projection is A (width → rank) then B (rank → width), no biases."""
    return [(width, rank, False), (rank, width, False)] * modules * n_layers


def sizes(layers):
    p = sum(fi * fo + (fo if b else 0) for fi, fo, b in layers)
    # KFAC: per layer Σ ããᵀ ((fan_in+1)² with a bias, fan_in² without), Σ ã, Σ δδᵀ, rows.
    kron = sum((fi + b) ** 2 + (fi + b) + fo ** 2 + 1 for fi, fo, b in layers)
    return {"parameters": p, "diag": p + 2, "kron": kron + 2, "full": p * p + 2}


def gib(values):
    return values * 8 / 2**30


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--t-image", type=float, default=0.002,
                    help="seconds per image of one GPU's curvature pass (an assumption; default 2 ms)")
    args = ap.parse_args()
    models = [("ResNet-50", sizes(resnet50_layers())), ("7B transformer, LoRA r = 8 on q, v", sizes(lora_layers()))]
    print("| model | parameters covered | diag | kron | full |")
    print("|---|---|---|---|---|")
    for name, s in models:
        print(f"| {name} | {s['parameters']:,} | {gib(s['diag']):.3f} GiB | {gib(s['kron']):.3f} GiB | "
              f"{gib(s['full']):,.0f} GiB |")
    print()
    single = N_IMAGENET * args.t_image
    print(f"ResNet-50 over ImageNet, t = {args.t_image * 1e3:g} ms per image per GPU (1 GPU: {single / 60:.1f} min), "
          "kron's all-reduce:")
    print()
    s = models[0][1]
    print("| GPUs | compute | " + " | ".join(f"all-reduce, {b}" for b, _ in BANDWIDTHS) + " |")
    print("|---|---|" + "---|" * len(BANDWIDTHS))
    for g in (8, 64, 512):
        compute = single / g
        comm = [2 * (g - 1) / g * s["kron"] * 8 / bw for _, bw in BANDWIDTHS]
        print(f"| {g} | {compute:.1f} s | " + " | ".join(f"{c:.2f} s" for c in comm) + " |")


if __name__ == "__main__":
    main()
