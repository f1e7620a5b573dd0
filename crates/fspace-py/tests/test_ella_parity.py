"""laplace-torch 0.3's ``hessian_structure="gp"`` with ``functional_approximation="nystrom"``
(its ``ELLA`` class) against ``fspace.Laplace`` with the same call: the same Nyström points and
outputs from the same seeds, so the same projected curvature, predictive, tuned prior precision
and samples; then what fspace refuses and why."""

from __future__ import annotations

import contextlib
import pickle
import warnings

import pytest

torch = pytest.importorskip("torch")
laplace = pytest.importorskip("laplace", reason="laplace-torch is installed by `cargo xtask test`")

import fspace  # noqa: E402
from test_laplace_parity import _Residual, close, data, loader, mlp  # noqa: E402


@contextlib.contextmanager
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield

# The features are K JVPs in both libraries (torch.func.jvp there, fspace's forward mode here):
# equal to rounding, amplified by the conditioning of G / σ² + λ I.
RTOL = 1e-9


def _pair(lik, model, positional, **options):
    sigma = 0.3 if lik == "regression" else 1.0
    args = dict(subsample_size=options.pop("subsample_size", 40), n_eigenvalues=options.pop("n_eigenvalues", 12),
                sigma_noise=sigma, prior_precision=options.pop("prior_precision", 0.5), seed=options.pop("seed", 7))
    out = []
    for lib in (laplace, fspace):
        if positional:
            # ELLA's positional order after the structure: subsample_size, n_eigenvalues, sigma_noise,
            # prior_precision, prior_mean, temperature, ..., seed (the 11th).
            la = lib.Laplace(model, lik, "all", "gp", args["subsample_size"], args["n_eigenvalues"], args["sigma_noise"],
                             args["prior_precision"], 0.0, 1.0, False, "input_ids", "labels", None, None, args["seed"],
                             functional_approximation="nystrom", **options)
        else:
            la = lib.Laplace(model, lik, subset_of_weights="all", hessian_structure="gp",
                             functional_approximation="nystrom", **args, **options)
        out.append(la)
    return out


@pytest.mark.parametrize("lik", ["regression", "classification"])
@pytest.mark.parametrize("positional", [False, True], ids=["keyword", "positional"])
def test_ella_gives_laplace_torchs_numbers(lik, positional):
    """ELLA's curvature, directions (up to sign), validation NLLs, predictive (joint, diagonal, every link, MC) ≤ 1e-9; grid search NLLs ≤ 1e-6 and the same λ."""
    d_out = 2 if lik == "regression" else 3
    model = mlp(2, d_out, 3)
    x, y = data(lik, 150, 4, d_out)
    xv, yv = data(lik, 60, 5, d_out)
    ref, la = _pair(lik, model, positional)
    assert type(la).__name__ == "ELLALaplace" and type(ref).__name__ == "ELLA"
    with quiet():
        ref.fit(loader(x, y, 32), val_loader=loader(xv, yv, 32), val_steps=2)
    la.fit(loader(x, y, 32), val_loader=loader(xv, yv, 32), val_steps=2)
    assert la.n_data == ref.n_data == 150 and la.n_outputs == ref.n_outputs == d_out
    # The directions agree up to each column's sign (an eigenvector's sign is arbitrary), and
    # the feature-space matrices with them: S G S for the signs S; every prediction is the same.
    v, vr = la.dual_directions, ref.dual_directions
    s = torch.sign((v * vr).sum(0))
    close(v * s, vr, RTOL, "dual_directions")
    close(la.feature_gram * s[:, None] * s[None, :], ref.feature_gram, RTOL, "feature_gram")
    close(la.chol_precision * s[:, None] * s[None, :], ref.chol_precision, RTOL, "chol_precision")
    assert la.fit_history_["processed_examples"] == ref.fit_history_["processed_examples"]
    close(torch.tensor(la.fit_history_["val_nll"]), torch.tensor(ref.fit_history_["val_nll"]), RTOL, "val_nll")
    xt = x[:7]
    if lik == "regression":
        for kw in (dict(), dict(diagonal_output=True), dict(joint=True)):
            (m, c), (mr, cr) = la(xt, **kw), ref(xt, **kw)
            close(m, mr, RTOL, f"mean {kw}")
            close(c, cr, RTOL, f"covariance {kw}")
    else:
        for link in ("probit", "bridge", "bridge_norm"):
            close(la(xt, link_approx=link), ref(xt, link_approx=link), RTOL, link)
        g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
        close(la(xt, link_approx="mc", n_samples=50, generator=g1),
              ref(xt, link_approx="mc", n_samples=50, generator=g2), RTOL, "mc")
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    close(la.predictive_samples(xt, n_samples=20, generator=g1),
          ref.predictive_samples(xt, n_samples=20, generator=g2), RTOL, "samples")
    # Joint draws: the 7·d' × 7·d' covariance has rank ≤ K, and its root (laplace-torch's
    # eigendecomposition of a singular matrix) turns rounding into 1e-9-relative differences.
    close(la.predictive_samples(xt, n_samples=20, generator=g1, joint=True),
          ref.predictive_samples(xt, n_samples=20, generator=g2, joint=True), 1e-6, "joint samples")
    # laplace-torch's ELLA tuning: λ by validation NLL on its grid. At the grid's small end
    # (λ = 1e-4) G / σ² + λ I is conditioned ~1e8, which turns the features' rounding
    # differences into ~1e-7 relative differences of those NLLs; the chosen λ is the same.
    la.optimize_prior_precision(val_loader=loader(xv, yv, 32), grid_size=25)
    with quiet():
        ref.optimize_prior_precision(val_loader=loader(xv, yv, 32), grid_size=25)
    close(la.prior_precision, ref.prior_precision, RTOL, "tuned λ")
    close(torch.tensor([t["val_nll"] for t in la.fit_history_["tuning"]]),
          torch.tensor([t["val_nll"] for t in ref.fit_history_["tuning"]]), 1e-6, "grid NLLs")
    # Changing a hyperparameter refactors the precision, as laplace-torch's setters do.
    la.prior_precision, ref.prior_precision = 2.0, 2.0
    close(la.predictive_moments(xt)[1], ref.predictive_moments(xt)[1], RTOL, "covariance at λ = 2")


def test_ella_balanced_points_shuffled_loader_and_a_torch_model():
    """Balanced selection, a shuffling loader (the points are chosen by index, not by visit
    order) and a module with a custom forward (fspace's torch path)."""
    torch.manual_seed(0)
    model = _Residual(3).double()
    x, y = data("classification", 120, 8, 3)
    shuffled = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=25, shuffle=True,
                                           generator=torch.Generator().manual_seed(1))
    ref, la = _pair("classification", model, False, subsample_size=30, n_eigenvalues=9)
    with quiet():
        ref.fit(shuffled, balanced=True)
    la.fit(shuffled, balanced=True)
    s = torch.sign((la.dual_directions * ref.dual_directions).sum(0))
    close(la.feature_gram * s[:, None] * s[None, :], ref.feature_gram, RTOL, "feature_gram")
    close(la(x[:5]), ref(x[:5]), RTOL, "probit")


def test_ella_state_dict_and_pickle_restore_the_posterior():
    """`state_dict` / `load_state_dict` and pickling restore the predictive exactly; a tampered curvature is refused."""
    model = mlp(2, 1, 2)
    x, y = data("regression", 80, 1, 1)
    la = fspace.Laplace(model, "regression", "all", "gp", functional_approximation="nystrom", subsample_size=30,
                        n_eigenvalues=8, sigma_noise=0.2)
    la.fit(loader(x, y))
    m, c = la(x[:5])
    other = fspace.Laplace(model, "regression", "all", "gp", functional_approximation="nystrom", subsample_size=30,
                           n_eigenvalues=8, sigma_noise=0.2)
    other.load_state_dict(la.state_dict())
    close(other(x[:5])[1], c, 1e-14, "state_dict")
    again = pickle.loads(pickle.dumps(la))
    close(again(x[:5])[1], c, 1e-14, "pickle")
    # A query does not change what is saved.
    la(x[:5], diagonal_output=True)
    assert pickle.dumps(la.state_dict()["fspace_feature_map"]) == pickle.dumps(other.state_dict()["fspace_feature_map"])
    bad = la.state_dict()
    bad["feature_gram"] = torch.full((8, 8), float("nan"), dtype=torch.float64)
    with pytest.raises(ValueError, match="feature_gram"):
        other.load_state_dict(bad)


def test_ella_refuses_what_laplace_torch_refuses_and_names_what_fspace_lacks():
    """laplace-torch's refusals (sizes, subset, λ, σ, approximation names, rank deficiency) with its messages; what fspace lacks named."""
    model = mlp(2, 3, 1)
    x, y = data("classification", 50, 2, 3)

    def make(**kw):
        args = dict(subsample_size=20, n_eigenvalues=5)
        args.update(kw)
        return fspace.Laplace(model, "classification", args.pop("subset", "all"), "gp",
                              functional_approximation=args.pop("approx", "nystrom"), **args)

    with pytest.raises(ValueError, match="Require 0 < n_eigenvalues <= subsample_size"):
        make(n_eigenvalues=30)
    with pytest.raises(ValueError, match="require subset_of_weights='all'"):
        make(subset="last_layer")
    with pytest.raises(ValueError, match="scalar prior_precision"):
        make(prior_precision=torch.ones(3))
    with pytest.raises(ValueError, match="sigma_noise != 1"):
        make(sigma_noise=0.5)
    with pytest.raises(ValueError, match="functional_approximation must be"):
        make(approx="kmeans")
    with pytest.raises(ValueError, match="requires hessian_structure='gp'"):
        fspace.Laplace(model, "classification", "all", "kron", functional_approximation="nystrom")
    with pytest.raises(NotImplementedError, match="FunctionalLaplace"):
        fspace.Laplace(model, "classification", "all", "gp", n_subset=10)
    with pytest.raises(TypeError, match="subsample_size"):  # "variational" is VaLLA, without ELLA's options
        make(approx="variational")
    la = make()
    with pytest.raises(RuntimeError, match="Call fit"):
        la(x)
    with pytest.raises(ValueError, match="subsample_size cannot exceed"):
        make(subsample_size=60, n_eigenvalues=5).fit(loader(x, y))
    la.fit(loader(x, y))
    with pytest.raises(NotImplementedError, match="marginal likelihood"):
        la.log_marginal_likelihood()
    with pytest.raises(ValueError, match="Only gp"):
        la(x, pred_type="glm")
    with pytest.raises(ValueError, match="gridsearch requires val_loader"):
        la.optimize_prior_precision()
    with pytest.raises(ValueError, match="positive finite scalar"):
        la.prior_precision = -1.0
    # A rank-deficient Nyström kernel: more features than the 20 sampled directions can carry
    # (a 2-3 network whose kernel has rank ≤ 9).
    tiny = torch.nn.Sequential(torch.nn.Linear(2, 3)).double()
    for lib in (laplace, fspace):
        with pytest.raises(ValueError, match="insufficient positive rank"):
            with quiet():
                lib.Laplace(tiny, "classification", "all", "gp", functional_approximation="nystrom",
                            subsample_size=20, n_eigenvalues=15).fit(loader(x, y))
