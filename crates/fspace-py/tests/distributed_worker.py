"""One process of the sharded-fit tests (``test_distributed.py``): joins a gloo group over
loopback, fits ``fspace.Laplace`` on its shard and writes what it got to ``OUT/rank{R}.json``.

    python distributed_worker.py CASE WORLD RANK PORT OUT
    mpiexec -n WORLD python distributed_worker.py mpi OUT
"""

from __future__ import annotations

import json
import sys
import traceback

import torch
import torch.distributed as dist

import fspace

N = 1001


def data(lik):
    g = torch.Generator().manual_seed(5)
    x = torch.rand(N, 2, generator=g, dtype=torch.float64) * 4 - 2
    if lik == "regression":
        y = torch.cat([torch.sin(2 * x[:, :1]), torch.cos(x[:, 1:])], dim=1) + 0.1 * torch.randn(N, 2, generator=g,
                                                                                                  dtype=torch.float64)
    else:
        y = ((x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()) % 3
    return torch.utils.data.TensorDataset(x, y)


def model(d_out):
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 6), torch.nn.Tanh(),
                               torch.nn.Linear(6, d_out)).double()


def as_lists(pred):
    """A predictive as JSON lists: regression's ``(mean, covariances)`` as two, else one."""
    return [p.tolist() for p in pred] if isinstance(pred, tuple) else pred.tolist()


def fits(world, rank, group=None):
    """Every structure and subset, both likelihoods: the evidence, the optimised λ and the
    predictive at test points (and low rank's Lanczos products)."""
    out = {}
    xt = torch.linspace(-2.5, 2.5, 14, dtype=torch.float64).reshape(7, 2)
    for lik in ("classification", "regression"):
        dataset = data(lik)
        shard = list(range(rank, N, world))
        loader = torch.utils.data.DataLoader(dataset, batch_size=64, sampler=shard)
        for subset in ("all", "last_layer"):
            # One pass (partial sums all-reduced once) and several (an all-reduce per sum:
            # EKFAC's factors and eigenvalues, every Lanczos product of low rank).
            for structure in ("diag", "kron", "full", "ekfac") + (("lowrank",) if subset == "all" else ()):
                sigma = 0.3 if lik == "regression" else 1.0
                extra = {"rank": 10} if structure == "lowrank" else {}
                la = fspace.Laplace(model(2 if lik == "regression" else 3), lik, subset, structure, sigma_noise=sigma,
                                    **extra)
                la.fit(loader, process_group=group)
                key = f"{lik}/{subset}/{structure}"
                row = {"n_data": la.n_data, "lanczos": [la.report.get(k) for k in ("lanczos_iterations", "rank")],
                       "evidence": float(la.log_marginal_likelihood(torch.tensor(1.3, dtype=torch.float64)))}
                la.optimize_prior_precision(n_steps=30)
                row["prior_precision"] = la.prior_precision.tolist()
                pred = la(xt)
                row["predictive"] = as_lists(pred)
                out[key] = row
    return out


def fsp_posthoc(world, rank, group=None):
    """Post-hoc FSP-Laplace, both likelihoods, on this process's points (rank::world, uneven):
    the predictive at test points (from the arrays, and from a loader of the shard) and the
    rank of the posterior."""
    out = {}
    xt = torch.linspace(-2.5, 2.5, 14, dtype=torch.float64).reshape(7, 2)
    for lik in ("regression", "classification"):
        x, y = data(lik).tensors
        shard = list(range(rank, N, world))
        outputs = 2 if lik == "regression" else 3
        prior = fspace.kernels.Independent(fspace.kernels.RBF(1.0, 1.0), outputs)
        fsp = fspace.FSPLaplace(model(outputs), lik, prior, train=False, n_laplace_context=64,
                                sigma_noise=0.3 if lik == "regression" else 1.0)
        fsp.fit(x[shard], y[shard], process_group=group)
        pred = fsp(xt)
        # The same from a loader over the shard: each batch added to Alg. 2's sum as it comes.
        loader = torch.utils.data.DataLoader(torch.utils.data.Subset(data(lik), shard), batch_size=64)
        streamed = fspace.FSPLaplace(model(outputs), lik, prior, train=False, n_laplace_context=64,
                                     sigma_noise=0.3 if lik == "regression" else 1.0)
        streamed.fit(loader, process_group=group)
        out[lik] = {"predictive": as_lists(pred), "loader_predictive": as_lists(streamed(xt)),
                    "rank": fsp.report["rank"]}
    return out


def ella(world, rank, group=None):
    """ELLA (laplace-torch's ``hessian_structure="gp"``, Nyström) on this process's points
    (rank::world, uneven), both likelihoods: the Nyström points drawn from all the shards,
    ``G`` all-reduced, a validation grid search over every process's validation points."""
    out = {}
    xt = torch.linspace(-2.5, 2.5, 14, dtype=torch.float64).reshape(7, 2)
    for lik in ("regression", "classification"):
        dataset = data(lik)
        x, y = dataset.tensors
        train = torch.utils.data.Subset(dataset, range(800))
        val = torch.utils.data.TensorDataset(x[800:], y[800:])
        loader = torch.utils.data.DataLoader(train, batch_size=64, sampler=list(range(rank, 800, world)))
        val_loader = torch.utils.data.DataLoader(val, batch_size=50, sampler=list(range(rank, N - 800, world)))
        la = fspace.Laplace(model(2 if lik == "regression" else 3), lik, "all", "gp",
                            functional_approximation="nystrom", subsample_size=60, n_eigenvalues=15,
                            sigma_noise=0.3 if lik == "regression" else 1.0)
        la.fit(loader, val_loader=val_loader, balanced=lik == "classification", process_group=group)
        row = {"n_data": la.n_data, "gram": la.feature_gram.reshape(-1).tolist(),
               "val_nll": la.fit_history_["val_nll"]}
        la.optimize_prior_precision(val_loader=val_loader, grid_size=12)
        row["prior_precision"] = float(la.prior_precision)
        pred = la(xt)
        row["predictive"] = as_lists(pred)
        out[lik] = row
    return out


def gfsvi(world, rank, group=None):
    """GFSVI on this process's contiguous rows (uneven shards of the 1 001 points), both
    likelihoods, at most 60 Adam steps on batches of 100, early-stopped (patience 1, scored
    every 5 steps) on validation points spread over the processes in rank order (the last of
    several holds none); classification also takes 4 measurement points from each batch: the
    predictive at test points and the steps."""
    out = {}
    xt = torch.linspace(-2.5, 2.5, 14, dtype=torch.float64).reshape(7, 2)
    bounds = [round(N * r / world) for r in range(world + 1)]
    for lik in ("regression", "classification"):
        x, y = data(lik).tensors
        rows = slice(bounds[rank], bounds[rank + 1])
        xv, yv = x[::7] + 0.05, y[::7]
        holders = max(world - 1, 1)
        vb = [round(len(xv) * r / holders) for r in range(holders + 1)]
        val = (xv[vb[rank]:vb[rank + 1]], yv[vb[rank]:vb[rank + 1]]) if rank < holders else None
        outputs = 2 if lik == "regression" else 3
        prior = fspace.kernels.Independent(fspace.kernels.RBF(1.0, 1.0), outputs)
        method = fspace.GFSVI(model(outputs), lik, prior, steps=60, evaluate_every=5, patience=1,
                              measurement_points=12, class_samples=3,
                              measurement_from_batch=4 if lik == "classification" else 0,
                              optim={"batch_size": 100, "learning_rate": 1e-1, "seed": 4},
                              sigma_noise=0.3 if lik == "regression" else 1.0)
        method.fit(x[rows], y[rows], val=val, process_group=group)
        pred = method(xt)
        out[lik] = {"predictive": as_lists(pred), "steps": method.report["steps"],
                    "best": method.report["best_step"]}
    return out


def valla(world, rank, group=None):
    """VaLLA on this process's contiguous rows (uneven shards of the 1 001 points), both
    likelihoods, at most 300 Adam steps on batches of 100, early-stopped (patience 1) on the
    NLL of validation points that only the first process holds, scored every 10 steps (both
    likelihoods stop early): the predictive at test points and the iterations."""
    out = {}
    xt = torch.linspace(-2.5, 2.5, 14, dtype=torch.float64).reshape(7, 2)
    bounds = [round(N * r / world) for r in range(world + 1)]
    for lik in ("regression", "classification"):
        x, y = data(lik).tensors
        if lik == "regression":
            y = y[:, :1]  # VaLLA's Gaussian likelihood has one output
        rows = slice(bounds[rank], bounds[rank + 1])
        outputs = 1 if lik == "regression" else 3
        method = fspace.VaLLA(model(outputs), lik, steps=300, evaluate_every=10, num_inducing=12, batch_size=100,
                              learning_rate=3e-2, seed=4, sigma_noise=0.3 if lik == "regression" else 1.0)
        val = (x[::7], y[::7]) if rank == 0 else None
        method.fit(x[rows], y[rows], val=val, process_group=group)
        pred = method(xt)
        out[lik] = {"predictive": as_lists(pred), "iterations": method.report["iterations"],
                    "best": method.report["best_iteration"]}
    return out


def fsp_training(world, rank, group=None):
    """FSP-Laplace with its training (Alg. 1, then Alg. 2) on this process's contiguous rows
    (uneven shards of the 1 001 points), regression with σ learned, at most 200 Adam steps on
    batches of 100, early stopping (patience 2) scored every 10 steps on validation points only
    the first process holds: the trained weights, σ, the steps and the predictive."""
    x, y = data("regression").tensors
    bounds = [round(N * r / world) for r in range(world + 1)]
    rows = slice(bounds[rank], bounds[rank + 1])
    prior = fspace.kernels.Independent(fspace.kernels.RBF(1.0, 1.0), 2)
    method = fspace.FSPLaplace(model(2), "regression", prior, steps=200, evaluate_every=10, patience=2,
                               batch_size=100, learning_rate=1e-2, n_context=16, n_laplace_context=49,
                               laplace={"prior_jitter": 1e-3}, sigma_noise=0.3, learn_sigma=True)
    val = (x[::7], y[::7]) if rank == 0 else None
    method.fit(x[rows], y[rows], val=val, process_group=group)
    weights = [v.reshape(-1).tolist() for v in method.model_state_dict().values()]
    xt = torch.linspace(-2.5, 2.5, 14, dtype=torch.float64).reshape(7, 2)
    return {"weights": weights, "sigma": method.report["likelihood"]["sigma"], "predictive": as_lists(method(xt)),
            "steps": method.report["train"]["steps"], "best": method.report["train"]["best_step"]}


def valla_failing(world, rank):
    """Process 1's labels are out of range: refused by Rust's checks before the first
    all-reduce."""
    x, y = data("classification").tensors
    if rank == 1:
        y = torch.full_like(y, 7)
    fspace.VaLLA(model(3), "classification", steps=5, num_inducing=6).fit(x[rank::world], y[rank::world])


def gfsvi_failing(world, rank, where):
    """Process 1's data are bad — refused in Python (``"python"``: a NaN input) or in Rust
    before its first step (``"rust"``: targets of the wrong width)."""
    x, y = data("regression").tensors
    rows = slice(rank * 500, (rank + 1) * 500)
    x, y = x[rows].clone(), y[rows].clone()
    if rank == 1 and where == "python":
        x[3, 0] = float("nan")
    if rank == 1 and where == "rust":
        y = torch.cat([y, y], dim=1)
    prior = fspace.kernels.Independent(fspace.kernels.RBF(1.0, 1.0), 2)
    fspace.GFSVI(model(2), "regression", prior, steps=5, measurement_points=5, sigma_noise=0.3).fit(x, y)


def ella_padded(world, rank):
    dataset = data("classification")
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False)
    la = fspace.Laplace(model(3), "classification", "all", "gp", functional_approximation="nystrom",
                        subsample_size=30, n_eigenvalues=10)
    la.fit(torch.utils.data.DataLoader(dataset, batch_size=64, sampler=sampler))


def ella_failing(world, rank):
    dataset = data("regression")
    x, y = dataset.tensors
    if rank == 1:
        y = y.clone()
        y[1] = float("nan")
    dataset = torch.utils.data.TensorDataset(x, y[:, :1] if rank == 1 else y)  # rank 1: a target of the wrong width
    la = fspace.Laplace(model(2), "regression", "all", "gp", functional_approximation="nystrom",
                        subsample_size=30, n_eigenvalues=10, sigma_noise=0.3)
    la.fit(torch.utils.data.DataLoader(dataset, batch_size=64, sampler=list(range(rank, N, world))))


def fsp_failing(world, rank):
    x, y = data("regression").tensors
    if rank == 1:
        y = y.clone()
        y[1, 0] = float("nan")  # a point of rank 1's shard
    prior = fspace.kernels.Independent(fspace.kernels.RBF(1.0, 1.0), 2)
    fspace.FSPLaplace(model(2), "regression", prior, train=False, sigma_noise=0.3).fit(x[rank::world], y[rank::world])


def padded(world, rank):
    dataset = data("classification")
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False)
    la = fspace.Laplace(model(3), "classification", "all", "diag")
    la.fit(torch.utils.data.DataLoader(dataset, batch_size=64, sampler=sampler))


def failing(world, rank):
    dataset = data("classification")
    batches = list(torch.utils.data.DataLoader(dataset, batch_size=64, sampler=list(range(rank, N, world))))
    if rank == 1:
        batches[2] = ("not a batch",)
    la = fspace.Laplace(model(3), "classification", "all", "kron")
    la.fit(batches)


def evaluation(world, rank, group=None):
    """``fspace.metrics`` on this process's points (rank::world of 1 001, uneven; OOD scores
    of 1 001 and 333 points): classification, regression and OOD detection."""
    import numpy as np

    import fspace.metrics

    rng = np.random.default_rng(9)
    logits = rng.normal(size=(N, 3)) * 2
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    labels = rng.integers(0, 3, size=N)
    mean, var, y = rng.normal(size=(N, 2)), rng.uniform(0.1, 2.0, size=(N, 2)), rng.normal(size=(N, 2))
    id_scores, ood_scores = rng.normal(size=N), rng.normal(0.7, 1.0, size=333)
    mine = slice(rank, None, world)
    return {
        "classification": fspace.metrics.classification_metrics(probs[mine], labels[mine], process_group=group),
        "regression": fspace.metrics.regression_metrics(mean[mine], var[mine], y[mine], process_group=group),
        "ood": fspace.metrics.ood_metrics(id_scores[mine], ood_scores[mine], process_group=group),
    }


def evaluation_failing(world, rank):
    """Process 1's labels are out of range: its ValueError there, a RuntimeError elsewhere."""
    import numpy as np

    import fspace.metrics

    probs = np.full((10, 2), 0.5)
    fspace.metrics.classification_metrics(probs, np.full(10, 5 if rank == 1 else 0))


def lowrank_failing(world, rank, where):
    """Low rank over shards, one process failing: its labels out of range (refused in Rust,
    before the first all-reduce) or its model another (refused before any work)."""
    dataset = data("classification")
    x, y = dataset.tensors
    idx = list(range(rank, N, world))
    net = model(3)
    if rank == 1 and where == "labels":
        y = torch.full_like(y, 7)
    if rank == 1 and where == "model":
        with torch.no_grad():
            net[0].weight.mul_(1.5)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64, sampler=idx)
    fspace.Laplace(net, "classification", "all", "lowrank", rank=5).fit(loader)


class _Objective(torch.nn.Module):
    """One process's loss of a DDP step: the data term of its shard, scaled by the world size
    and the global batch, plus the regulariser (module docs of ``fspace.torch``, "Under DDP")."""

    def __init__(self, method, world, n, batch):
        super().__init__()
        from fspace.torch import FSPRegularizer, GFSVIRegularizer, MeanField

        torch.manual_seed(3)
        self.net = torch.nn.Sequential(torch.nn.Linear(1, 12), torch.nn.Tanh(), torch.nn.Linear(12, 1)).double()
        self.method, self.scale = method, world * n / batch
        prior = fspace.kernels.RBF(1.0, 0.5)
        if method == "fsp":
            self.reg = FSPRegularizer(prior, context=([-3.0], [3.0]), n_context=30, include_batch=True, seed=1)
        else:
            self.q = MeanField(self.net)
            self.reg = GFSVIRegularizer(prior, context=([-3.0], [3.0]), n_context=20, gamma=1e-6, include_batch=True,
                                        seed=1)

    def forward(self, xb, yb):
        from fspace.torch import expected_log_likelihood

        if self.method == "fsp":
            return self.scale * 0.5 * ((self.net(xb) - yb) ** 2).sum() / 0.1**2 + self.reg(self.net, xb)
        f, var = self.q.linearized(self.net, xb, diagonal=True)
        return -self.scale * expected_log_likelihood(f, var, yb, 0.1) + self.reg(self.net, self.q, xb)


def ddp_training(world, rank):
    """FSPRegularizer and GFSVIRegularizer + MeanField trained under DDP: each process takes an
    uneven contiguous shard of every global batch of 61 points; the parameters after the steps."""
    from torch.nn.parallel import DistributedDataParallel

    g = torch.Generator().manual_seed(7)
    n, batch, steps = 122, 61, 4
    x = torch.rand(n, 1, generator=g, dtype=torch.float64) * 4 - 2
    y = torch.sin(2 * x) + 0.1 * torch.randn(n, 1, generator=g, dtype=torch.float64)
    bounds = [round(batch * r / world) for r in range(world + 1)]
    out = {}
    for method in ("fsp", "gfsvi"):
        objective = _Objective(method, world, n, batch)
        module = DistributedDataParallel(objective) if world > 1 else objective
        opt = torch.optim.SGD(objective.parameters(), lr=1e-5)
        for step in range(steps):
            lo = (step * batch) % n
            rows = slice(lo + bounds[rank], lo + bounds[rank + 1])
            opt.zero_grad()
            module(x[rows], y[rows]).backward()
            opt.step()
        out[method] = [v for p in objective.parameters() for v in p.detach().reshape(-1).tolist()]
    return out


def different_seeds(world, rank):
    from fspace.torch import FSPRegularizer

    net = torch.nn.Sequential(torch.nn.Linear(1, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)).double()
    FSPRegularizer(fspace.kernels.RBF(1.0, 0.5), context=([-3.0], [3.0]), n_context=10, seed=rank)(net)


def main():
    case, out = sys.argv[1], sys.argv[-1]
    torch.set_num_threads(1)
    if case == "mpi":
        # Under mpiexec: the communicator is the engine, torch.distributed is not initialised.
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        rank = comm.Get_rank()
        result = {"rank": rank, "fits": fits(comm.Get_size(), rank, comm),
                  "fsp": fsp_posthoc(comm.Get_size(), rank, comm), "ella": ella(comm.Get_size(), rank, comm),
                  "gfsvi": gfsvi(comm.Get_size(), rank, comm), "metrics": evaluation(comm.Get_size(), rank, comm),
                  "valla": valla(comm.Get_size(), rank, comm),
                  "fsp_training": fsp_training(comm.Get_size(), rank, comm)}
        with open(f"{out}/rank{rank}.json", "w") as f:
            json.dump(result, f)
        return
    world, rank, port = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=world, rank=rank)
    result = {"rank": rank}
    try:
        if case == "fits":
            result["fits"] = fits(world, rank)
        elif case == "padded":
            padded(world, rank)
        elif case == "failing":
            failing(world, rank)
        elif case == "valla":
            result["valla"] = valla(world, rank)
        elif case == "fsp_training":
            result["fsp_training"] = fsp_training(world, rank)
        elif case == "valla_failing":
            valla_failing(world, rank)
        elif case == "metrics":
            result["metrics"] = evaluation(world, rank)
        elif case == "metrics_failing":
            evaluation_failing(world, rank)
        elif case in ("lowrank_failing_labels", "lowrank_failing_model"):
            lowrank_failing(world, rank, case.rsplit("_", 1)[1])
        elif case == "fsp":
            result["fsp"] = fsp_posthoc(world, rank)
        elif case == "gfsvi":
            result["gfsvi"] = gfsvi(world, rank)
        elif case in ("gfsvi_failing_python", "gfsvi_failing_rust"):
            gfsvi_failing(world, rank, case.rsplit("_", 1)[1])
        elif case == "ella":
            result["ella"] = ella(world, rank)
        elif case == "ella_padded":
            ella_padded(world, rank)
        elif case == "ella_failing":
            ella_failing(world, rank)
        elif case == "fsp_failing":
            fsp_failing(world, rank)
        elif case == "ddp":
            result["ddp"] = ddp_training(world, rank)
        elif case == "seeds":
            different_seeds(world, rank)
    except Exception as e:  # reported to the test, which checks the kind and the message
        result["error"] = [type(e).__name__, str(e)]
        traceback.print_exc()
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
