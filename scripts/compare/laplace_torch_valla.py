"""Time laplace-torch's VaLLA iteration and ELLA fit on the sine toy of `valla-toy`.

Side-by-side reference for `cargo bench -p fspace-valla --bench valla`. Run it in a
throw-away venv outside the repository:

    python -m venv /tmp/ltvenv && /tmp/ltvenv/bin/pip install laplace-torch
    OMP_NUM_THREADS=2 /tmp/ltvenv/bin/python scripts/compare/laplace_torch_valla.py

Setting: 2x50 tanh MLP (1-50-50-1), n = 100 points of a sine with a gap, VaLLA with 20
inducing points (k-means), minibatch 100, Adam 1e-3; ELLA with M = K = 20. The network gets
2 000 full-batch Adam steps first (an untrained tanh net's NTK on 20 points is numerically
rank-deficient and laplace-torch's ELLA refuses it). Reports the median of 5 repeats.
"""
import statistics
import time

import torch
from torch.utils.data import DataLoader, TensorDataset
from laplace.baselaplace import ELLA, VaLLA

torch.manual_seed(0)
torch.set_default_dtype(torch.float64)
torch.set_num_threads(2)

n = 100
x = torch.cat([torch.linspace(-2.0, -0.5, n // 2), torch.linspace(0.5, 2.0, n // 2)]).unsqueeze(1)
y = torch.sin(2.0 * x) + 0.1 * torch.randn_like(x)
loader = DataLoader(TensorDataset(x, y), batch_size=100, shuffle=True)
net = torch.nn.Sequential(
    torch.nn.Linear(1, 50), torch.nn.Tanh(), torch.nn.Linear(50, 50), torch.nn.Tanh(), torch.nn.Linear(50, 1)
)

opt = torch.optim.Adam(net.parameters(), lr=1e-2)
for _ in range(2000):
    opt.zero_grad()
    loss = ((net(x) - y) ** 2).mean()
    loss.backward()
    opt.step()


def time_valla(iters):
    la = VaLLA(net, "regression", inducing_locations="kmeans", num_inducing=20, sigma_noise=0.1)
    t0 = time.perf_counter()
    la.fit(loader, iterations=iters, lr=1e-3)
    return time.perf_counter() - t0


def time_ella():
    la = ELLA(net, "regression", subsample_size=20, n_eigenvalues=20, sigma_noise=0.1)
    t0 = time.perf_counter()
    la.fit(loader)
    return time.perf_counter() - t0


time_valla(10)  # warm-up
per_iter = []
for _ in range(5):
    # The difference of a 210- and a 10-step fit removes the set-up (k-means, state) cost.
    per_iter.append((time_valla(210) - time_valla(10)) / 200.0)
time_ella()
ella = [time_ella() for _ in range(5)]
print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
print(f"VaLLA iteration (M=20, batch 100): {1e3 * statistics.median(per_iter):.2f} ms")
print(f"ELLA fit (M=K=20, n=100):          {1e3 * statistics.median(ella):.2f} ms")
