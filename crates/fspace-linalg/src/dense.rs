//! Small dense factorizations: symmetric eigendecomposition, thin SVD of tall matrices, and
//! pseudo-inverse square roots.

use fspace_input::InputError;
use nalgebra::{DMatrix, DVector};

use crate::error::{ensure_finite, LinalgError, Result};
use crate::operator::ensure_symmetric;

/// Eigendecomposition of a symmetric matrix, eigenvalues **descending**, eigenvectors as columns
/// (no checks: for internal use on matrices known to be symmetric; only the lower triangle is
/// read).
///
/// The kernel is faer's self-adjoint eigensolver (blocked Householder tridiagonalisation and a
/// divide-and-conquer tridiagonal solver, parallel on rayon's pool) rather than nalgebra's
/// unblocked `symmetric_eigen`: measured on the 2-core machine, 7.3× faster at n = 3138 (the
/// KFAC input factor of the MNIST CNN's dense layer: 5.3 s against 39 s) and 4.4× at n = 1000;
/// `benches/eigh.rs` has the sweep. Results agree with nalgebra's to round-off (eigenvalues)
/// and up to each eigenvector's sign. faer reports non-convergence of its QR sweeps as an error
/// (never observed); it becomes [`LinalgError::NoConvergence`].
pub(crate) fn sym_eigh_desc(a: &DMatrix<f64>) -> Result<(DVector<f64>, DMatrix<f64>)> {
    let n = a.nrows();
    let evd = faer_evd(a)?;
    let mut vectors = DMatrix::zeros(n, n);
    let values = descending_into(&evd, &mut vectors);
    Ok((values, vectors))
}

/// faer's eigendecomposition of `a`'s lower triangle (`None` for `0 × 0`).
fn faer_evd(a: &DMatrix<f64>) -> Result<Option<faer::linalg::solvers::SelfAdjointEigen<f64>>> {
    let n = a.nrows();
    if n == 0 {
        return Ok(None);
    }
    let _clean = crate::vector_state::CleanOnDrop::parallel();
    // nalgebra stores column-major and densely, which is faer's column-major layout.
    let view = faer::MatRef::from_column_major_slice(a.as_slice(), n, n);
    view.self_adjoint_eigen(faer::Side::Lower).map(Some).map_err(|_| LinalgError::NoConvergence {
        method: "symmetric eigendecomposition (faer)",
        iterations: 0,
        residual: f64::NAN,
    })
}

/// The eigenvalues descending, and the eigenvectors in that order written over `out`
/// (`n × n`; faer sorts ascending).
fn descending_into(
    evd: &Option<faer::linalg::solvers::SelfAdjointEigen<f64>>,
    out: &mut DMatrix<f64>,
) -> DVector<f64> {
    let Some(evd) = evd else { return DVector::zeros(0) };
    let (s, u) = (evd.S(), evd.U());
    let n = out.nrows();
    for j in 0..n {
        let src = u.col(n - 1 - j);
        for (dst, v) in out.column_mut(j).iter_mut().zip(src.iter()) {
            *dst = *v;
        }
    }
    DVector::from_fn(n, |i, _| s[n - 1 - i])
}

/// Symmetric eigendecomposition `A = V Λ Vᵀ` with eigenvalues descending. Errors on non-square,
/// non-finite or asymmetric (relative asymmetry > 1e-10) input.
pub fn sym_eigh(a: &DMatrix<f64>) -> Result<(DVector<f64>, DMatrix<f64>)> {
    if a.nrows() != a.ncols() {
        return Err(LinalgError::Input(InputError::DimensionMismatch {
            what: "eigh: columns of a square matrix",
            expected: a.nrows(),
            found: a.ncols(),
        }));
    }
    ensure_finite("eigh input", a.iter())?;
    ensure_symmetric("eigh input", a, 1e-10)?;
    sym_eigh_desc(&((a + a.transpose()) * 0.5))
}

/// [`sym_eigh`] of a matrix the caller gives up: symmetrised in place (the same checks and
/// errors) and its storage reused for the eigenvectors once faer has read it — the same
/// eigenpairs to the bit, with three `n × n` buffers fewer (the transpose, the symmetric part,
/// the eigenvector copy), whose fresh pages are a measurable share of a large factorisation
/// (docs/PERFORMANCE.md, "Fresh pages").
pub fn sym_eigh_owned(mut a: DMatrix<f64>) -> Result<(DVector<f64>, DMatrix<f64>)> {
    if a.nrows() != a.ncols() {
        return Err(LinalgError::Input(InputError::DimensionMismatch {
            what: "eigh: columns of a square matrix",
            expected: a.nrows(),
            found: a.ncols(),
        }));
    }
    crate::operator::symmetrise_in_place("eigh input", &mut a, 1e-10)?;
    let evd = faer_evd(&a)?;
    let values = descending_into(&evd, &mut a);
    Ok((values, a))
}

/// The thin SVD `M = U diag(s) Vᵀ` of a tall `p × r` matrix (`p ≥ r`), singular values
/// descending, in `O(p·r²)`: Householder QR `M = Q R`, then the SVD of the small `R`.
pub struct ThinSvd {
    /// Left singular vectors (`p × r`, orthonormal columns).
    pub u: DMatrix<f64>,
    /// Singular values, descending.
    pub s: DVector<f64>,
    /// Right singular vectors (`r × r`, orthogonal).
    pub v: DMatrix<f64>,
}

/// See [`ThinSvd`]. Errors on wide or non-finite input. Copies `m`; [`thin_svd_owned`]
/// consumes it instead.
pub fn thin_svd(m: &DMatrix<f64>) -> Result<ThinSvd> {
    thin_svd_owned(m.clone())
}

/// [`thin_svd`] consuming its input: the QR factorisation works in `m`'s storage, so the peak
/// memory is two `p × r` matrices (`Q`, then `U`) rather than four.
pub fn thin_svd_owned(m: DMatrix<f64>) -> Result<ThinSvd> {
    let (p, r) = m.shape();
    if r == 0 || p < r {
        return Err(LinalgError::Input(InputError::Invalid {
            what: "thin_svd input",
            reason: format!("needs p ≥ r ≥ 1, got {p} × {r}"),
        }));
    }
    ensure_finite("thin_svd input", m.iter())?;
    let qr = m.qr();
    let (q, rr) = (qr.q(), qr.r());
    drop(qr);
    let svd = rr.svd(true, true);
    let (ur, vt) = (svd.u.expect("requested"), svd.v_t.expect("requested"));
    let mut order: Vec<usize> = (0..r).collect();
    order.sort_by(|&i, &j| svd.singular_values[j].total_cmp(&svd.singular_values[i]));
    let s = DVector::from_iterator(r, order.iter().map(|&i| svd.singular_values[i]));
    let u = &q * ur.select_columns(&order);
    let v = vt.transpose().select_columns(&order);
    Ok(ThinSvd { u, s, v })
}

/// A square root of the pseudo-inverse of a symmetric PSD matrix: `F` (`n × k`) with
/// `F Fᵀ = A†`, keeping eigenvalues above `rtol · λ_max` (`F = V₊ Λ₊^{-1/2}`). Errors if `A`
/// has an eigenvalue below `−rtol·λ_max` (not PSD).
pub fn psd_pinv_sqrt(a: &DMatrix<f64>, rtol: f64) -> Result<DMatrix<f64>> {
    let (values, vectors) = sym_eigh(a)?;
    let lmax = values.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    if let Some(&neg) = values.iter().find(|&&v| v < -rtol * lmax) {
        return Err(LinalgError::NotPositiveDefinite { what: "psd_pinv_sqrt input", value: neg });
    }
    let keep: Vec<usize> = (0..values.len()).filter(|&i| values[i] > rtol * lmax).collect();
    let mut f = vectors.select_columns(&keep);
    for (c, &i) in keep.iter().enumerate() {
        f.column_mut(c).scale_mut(1.0 / values[i].sqrt());
    }
    Ok(f)
}

/// Writes `Q[:, ..m] · Y` (`Y` is `m × ℓ`, `ℓ ≤ m`) over `Q`'s first `ℓ` columns, a block of
/// rows at a time, so the product never exists beside `Q`.
pub(crate) fn rotate_basis_in_place(q: &mut DMatrix<f64>, y: &DMatrix<f64>) {
    const BLOCK_ROWS: usize = 4096;
    let (m, l) = y.shape();
    let n = q.nrows();
    let mut start = 0;
    while start < n {
        let rows = BLOCK_ROWS.min(n - start);
        let block = q.view((start, 0), (rows, m)) * y;
        q.view_mut((start, 0), (rows, l)).copy_from(&block);
        start += rows;
    }
}
