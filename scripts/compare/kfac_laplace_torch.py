"""KFAC Laplace of laplace-torch beside fspace's, on one shared network and λ.

Trains a 1-50-50-1 tanh MLP on the sine toy (FSP-Laplace App. B.1's generator, re-drawn here
with numpy) in float64, fits laplace-torch's `Laplace(..., 'regression', 'all', 'kron')` with a
fixed σ and prior precision λ, and writes the network, the data and laplace-torch's GLM
predictive std to JSON for `cargo run --release -p fspace-laplace --example compare_laplace_torch`.

Run in a throw-away venv outside the repository (`pip install torch laplace-torch`):
    python scripts/compare/kfac_laplace_torch.py /tmp/kfac_compare.json
"""
import json
import sys

import numpy as np
import torch
from laplace import Laplace

torch.set_default_dtype(torch.float64)
torch.manual_seed(0)
rng = np.random.default_rng(0)

n, sigma, lam = 100, 0.1, 1.0
u = rng.uniform(0.5, 1.0, n)
x = np.where(rng.uniform(size=n) < 0.5, u, -u)
y = np.sin(2 * np.pi * x) + sigma * rng.standard_normal(n)
X = torch.tensor(x).reshape(-1, 1)
Y = torch.tensor(y).reshape(-1, 1)

model = torch.nn.Sequential(
    torch.nn.Linear(1, 50), torch.nn.Tanh(), torch.nn.Linear(50, 50), torch.nn.Tanh(), torch.nn.Linear(50, 1)
)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for _ in range(2000):
    opt.zero_grad()
    loss = ((model(X) - Y) ** 2).sum() / (2 * sigma**2) + 0.5 * lam * sum((p**2).sum() for p in model.parameters())
    loss.backward()
    opt.step()

loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=n)
x_test = torch.linspace(-2, 2, 41).reshape(-1, 1)
out = {
    "sigma": sigma,
    "prior_precision": lam,
    "x": x.tolist(),
    "y": y.tolist(),
    "x_test": x_test.flatten().tolist(),
    "layers": [
        {"weight": m.weight.detach().tolist(), "bias": m.bias.detach().tolist()}
        for m in model
        if isinstance(m, torch.nn.Linear)
    ],
    "laplace_torch": {"version": __import__("laplace").__version__ if hasattr(__import__("laplace"), "__version__") else "0.3"},
}
for structure in ["kron", "full", "diag"]:
    la = Laplace(
        model,
        "regression",
        subset_of_weights="all",
        hessian_structure=structure,
        sigma_noise=sigma,
        prior_precision=lam,
    )
    la.fit(loader)
    f_mu, f_var = la(x_test, pred_type="glm", link_approx="probit")
    out["laplace_torch"][structure] = {
        "backend": type(la.backend).__name__,
        "f_mean": f_mu.flatten().tolist(),
        "f_std": f_var.flatten().sqrt().tolist(),
    }
json.dump(out, open(sys.argv[1] if len(sys.argv) > 1 else "kfac_compare.json", "w"))
print("wrote", sys.argv[1] if len(sys.argv) > 1 else "kfac_compare.json", {k: v["backend"] for k, v in out["laplace_torch"].items() if isinstance(v, dict) and "backend" in v})
