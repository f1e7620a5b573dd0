"""Writes the small PyTorch / numpy files that fspace-interop's tests read.

Run from the repository root with a Python that has torch, numpy and safetensors:

    python scripts/interop/make_fixtures.py

Every network is initialised by PyTorch from a fixed seed; `*_io.npz` holds fixed inputs `x`
and the logits PyTorch computed for them in the network's own dtype. Output:
crates/fspace-interop/tests/fixtures/.
"""

import os

import numpy as np
import torch
from torch import nn
from safetensors.torch import save_file

OUT = os.path.join("crates", "fspace-interop", "tests", "fixtures")


def mlp(act):
    # nn.Sequential names: 0.weight, 0.bias, 2.weight, ...
    return nn.Sequential(nn.Linear(3, 5), act(), nn.Linear(5, 4), act(), nn.Linear(4, 2))


class SmallCnn(nn.Module):
    """2×8×8 images: conv 3@3×3 same + tanh + 2×2 max-pool, conv 4@3×3 valid + tanh,
    flatten (channel-major), dense 6 + tanh, dense 3. Named so that plain alphabetical order
    would put the dense layers ("classifier") before the convolutions ("features")."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(2, 3, 3, padding=1), nn.Tanh(), nn.MaxPool2d(2), nn.Conv2d(3, 4, 3), nn.Tanh()
        )
        self.classifier = nn.Sequential(nn.Linear(16, 6), nn.Tanh(), nn.Linear(6, 3))

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x.reshape(-1, 2, 8, 8)), 1))


def state(model):
    return {k: v.detach().contiguous() for k, v in model.state_dict().items()}


def io(model, x, path):
    with torch.no_grad():
        logits = model(x)
    np.savez(path, x=x.double().numpy().reshape(x.shape[0], -1), logits=logits.double().numpy())


def main():
    os.makedirs(OUT, exist_ok=True)
    p = lambda name: os.path.join(OUT, name)

    torch.manual_seed(0)
    x_mlp = torch.randn(7, 3, dtype=torch.float64)
    for dtype, tag in [(torch.float64, "f64"), (torch.float32, "f32")]:
        net = mlp(nn.Tanh).to(dtype)
        save_file(state(net), p(f"mlp_{tag}.safetensors"))
        io(net, x_mlp.to(dtype), p(f"mlp_{tag}_io.npz"))
    # The same f64 network's weights as numpy .npz (stored) and f32 compressed .npz.
    net = mlp(nn.Tanh).double()
    np.savez(p("mlp_f64.npz"), **{k: v.numpy() for k, v in state(net).items()})
    io(net, x_mlp, p("mlp_f64_npz_io.npz"))
    net32 = mlp(nn.Tanh).float()
    np.savez_compressed(p("mlp_f32_compressed.npz"), **{k: v.numpy() for k, v in state(net32).items()})
    io(net32, x_mlp.float(), p("mlp_f32_compressed_io.npz"))
    # GELU, tanh form (fspace's Activation::Gelu).
    net = mlp(lambda: nn.GELU(approximate="tanh")).double()
    save_file(state(net), p("mlp_gelu_f64.safetensors"))
    io(net, x_mlp, p("mlp_gelu_f64_io.npz"))

    x_cnn = torch.randn(5, 2 * 8 * 8, dtype=torch.float64)
    for dtype, tag in [(torch.float64, "f64"), (torch.float32, "f32")]:
        net = SmallCnn().to(dtype)
        save_file(state(net), p(f"cnn_{tag}.safetensors"))
        io(net, x_cnn.to(dtype), p(f"cnn_{tag}_io.npz"))

    # Malformed: a half-precision network, and integer weights in an .npz.
    save_file(state(mlp(nn.Tanh).half()), p("mlp_f16.safetensors"))
    np.savez(p("mlp_int.npz"), **{k: (v.numpy() * 100).astype(np.int64) for k, v in state(mlp(nn.Tanh)).items()})


if __name__ == "__main__":
    main()
