//! The functions of the compiled module that are not a method's fit: a kernel's Gram matrix,
//! and the loss terms of `fspace.torch` (FSP-Laplace's RKHS norm, GFSVI's regularised KL and
//! objective) with their gradients, which the torch modules' backward passes use and the tests
//! compare with.

use fspace_gfsvi::KlPrior;
use fspace_kernels::GpPrior;
use fspace_nn::Network;
use nalgebra::{DMatrix, DVector};
use numpy::{PyArray1, PyArray2, PyReadonlyArray2};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::convert::{activation, from_py, matrix, network, to_numpy};
use crate::errors::{raise, value_error};

/// A GP prior from the dict of a `GpPrior` (kernel spec and mean).
fn gp_prior(prior: &Bound<'_, PyAny>) -> PyResult<GpPrior> {
    from_py("the GP prior", prior)
}

/// The Gram matrix `K(X, Y)` (`n·d' × m·d'`, point-major) of a kernel given as the dict of a
/// `MatrixKernelSpec`.
#[pyfunction]
#[pyo3(signature = (*, kernel, x, y))]
pub(crate) fn gram<'py>(
    py: Python<'py>,
    kernel: &Bound<'py, PyAny>,
    x: PyReadonlyArray2<'py, f64>,
    y: PyReadonlyArray2<'py, f64>,
) -> PyResult<Bound<'py, PyArray2<f64>>> {
    let spec: fspace_kernels::MatrixKernelSpec = from_py("the kernel", kernel)?;
    let k = spec.build().map_err(raise)?;
    let (x, y) = (matrix(&x), matrix(&y));
    let g = py.detach(|| fspace_kernels::gram(&*k, &x, &y)).map_err(raise)?;
    Ok(to_numpy(py, &g))
}

/// `(½ (F − μ)ᵀ (Σ(C, C) + εI)⁻¹ (F − μ), α)` for function values `F` (`n_C × d'`) at the
/// context points `C` under the prior given as a `GpPrior`'s JSON, with FSP-Laplace's jitter
/// rule (`ε = jitter × mean prior variance`, more only if needed): the value of FSP-Laplace's
/// regulariser and its gradient `α` with respect to `F` (the torch loss term's backward).
#[pyfunction]
#[pyo3(signature = (*, prior, c, f, jitter))]
pub(crate) fn rkhs_norm<'py>(
    py: Python<'py>,
    prior: &Bound<'py, PyAny>,
    c: PyReadonlyArray2<'py, f64>,
    f: PyReadonlyArray2<'py, f64>,
    jitter: f64,
) -> PyResult<(f64, Bound<'py, PyArray2<f64>>)> {
    let prior = gp_prior(prior)?;
    let (c, f) = (matrix(&c), matrix(&f));
    let (value, alpha) = py
        .detach(|| {
            let context = fspace_fsp_laplace::ContextPrior::new(&prior, &c, f.ncols(), jitter)?;
            context.norm(&f)
        })
        .map_err(raise)?;
    Ok((value, to_numpy(py, &alpha)))
}

/// `(D̂_KL^γ, ∂/∂F, ∂/∂Σ_q)`: GFSVI's regularised KL (eqs. 7–8, 11)
/// `KL(N(F, Σ_q + γM·I) ‖ N(μ(C), K(C, C) + γM·I))` between the linearised network's Gaussian at
/// the `M` measurement points `C` — function values `F` (`M × d'`) and covariance `Σ_q = J S Jᵀ`
/// (`M·d'` square, point-major) — and the prior given as a `GpPrior`'s JSON, with its gradients
/// (the torch loss term's backward). `Σ_q` is symmetrised first, `(Σ_q + Σ_qᵀ)/2`, so the value
/// is a function of every entry and the gradient `½((K + γM·I)⁻¹ − (Σ_q + γM·I)⁻¹)` is its
/// derivative entry by entry.
#[pyfunction]
#[pyo3(signature = (*, prior, c, f, cov, gamma))]
#[allow(clippy::type_complexity)]
pub(crate) fn regularized_kl<'py>(
    py: Python<'py>,
    prior: &Bound<'py, PyAny>,
    c: PyReadonlyArray2<'py, f64>,
    f: PyReadonlyArray2<'py, f64>,
    cov: PyReadonlyArray2<'py, f64>,
    gamma: f64,
) -> PyResult<(f64, Bound<'py, PyArray2<f64>>, Bound<'py, PyArray2<f64>>)> {
    let prior = gp_prior(prior)?;
    let (c, f, cov) = (matrix(&c), matrix(&f), matrix(&cov));
    let (m, q) = (c.nrows(), prior.output_dim());
    if f.nrows() != m || f.ncols() != q {
        return Err(value_error(format!(
            "function values of shape {}×{} do not match {m} measurement points × {q} prior outputs",
            f.nrows(),
            f.ncols()
        )));
    }
    if cov.nrows() != m * q || cov.ncols() != m * q {
        return Err(value_error(format!(
            "the covariance is {}×{}; {m} measurement points × {q} outputs need {} square",
            cov.nrows(),
            cov.ncols(),
            m * q
        )));
    }
    let kl = py
        .detach(|| -> Result<_, fspace_gfsvi::GfsviError> {
            let mean_q = DVector::from_iterator(m * q, f.transpose().iter().copied());
            let cov_q = (&cov + cov.transpose()) * 0.5;
            let (mean_p, cov_p) = (prior.mean_at(&c)?, prior.gram(&c)?);
            fspace_gfsvi::regularized_kl(&mean_q, &cov_q, &mean_p, &cov_p, gamma, m, false)
        })
        .map_err(raise)?;
    let grad_f = DMatrix::from_row_slice(m, q, kl.grad_mean.as_slice());
    Ok((kl.value, to_numpy(py, &grad_f), to_numpy(py, &kl.grad_cov_q)))
}

/// GFSVI's objective `L = E_q[log p(y_b | f)]·n/b − D̂_KL^γ` (Gaussian likelihood) and its
/// gradients with respect to `(m, ρ = log √s, log σ_y)` on a native network (`state` +
/// `activation_name`): the Rust reference the torch loss terms of `fspace.torch` are checked
/// against. Returns `(L, expected log likelihood, divergence, ∂L/∂m, ∂L/∂ρ, ∂L/∂log σ_y)`.
#[pyfunction]
#[pyo3(signature = (*, state, activation_name, mean, log_std, log_noise_std, prior, x_b, y_b, n_total, x_m, gamma))]
#[allow(clippy::too_many_arguments)]
#[allow(clippy::type_complexity)]
pub(crate) fn gfsvi_objective<'py>(
    py: Python<'py>,
    state: &Bound<'py, PyDict>,
    activation_name: &str,
    mean: Vec<f64>,
    log_std: Vec<f64>,
    log_noise_std: f64,
    prior: &Bound<'py, PyAny>,
    x_b: PyReadonlyArray2<'py, f64>,
    y_b: PyReadonlyArray2<'py, f64>,
    n_total: usize,
    x_m: PyReadonlyArray2<'py, f64>,
    gamma: f64,
) -> PyResult<(f64, f64, f64, Bound<'py, PyArray1<f64>>, Bound<'py, PyArray1<f64>>, f64)> {
    let mut net = network(state, activation(activation_name)?, None)?;
    let prior = KlPrior::Gp(gp_prior(prior)?);
    let p = net.n_params();
    for (what, found) in [("mean", mean.len()), ("log_std", log_std.len())] {
        if found != p {
            return Err(value_error(format!("{what} has {found} entries; the network has {p} weights")));
        }
    }
    let params = fspace_gfsvi::VariationalParams {
        mean: DVector::from_vec(mean),
        log_std: DVector::from_vec(log_std),
        log_noise_std,
    };
    let (x_b, y_b, x_m) = (matrix(&x_b), matrix(&y_b), matrix(&x_m));
    let v = py
        .detach(|| fspace_gfsvi::objective(&mut net, &params, &prior, &x_b, &y_b, n_total, &x_m, gamma))
        .map_err(raise)?;
    Ok((
        v.value,
        v.expected_log_lik,
        v.divergence,
        PyArray1::from_slice(py, v.grad.mean.as_slice()),
        PyArray1::from_slice(py, v.grad.log_std.as_slice()),
        v.grad.log_noise_std,
    ))
}
