//! Dense products and the SPD inverse through faer's kernels: `AᵀA` ([`gram`]), `AB`
//! ([`matmul`]) and `(A⁻¹, log|A|)` ([`spd_inverse_and_logdet`]).
//!
//! faer's kernels beat `matrixmultiply`'s on this workspace's shapes by 1.04–1.9× (products) and
//! 2.2–2.7× (the inverse at n ≥ 500; `docs/performance-history.md`, fifth round), and faer splits a product's output
//! between threads, never a sum, so the bits do not depend on the number of threads. Its rounding is
//! not nalgebra's: the [`blocked`](crate::blocked) routines keep nalgebra's operation order for
//! the computations whose published numbers were produced with it (FSP-Laplace, FVI, the GPs).
//! GFSVI and TFSVI (`J S Jᵀ`, its pull-back and the KL's inverses) use these.

use faer::dyn_stack::{MemBuffer, MemStack};
use faer::linalg::cholesky::llt::inverse as llt_inverse;
use faer::linalg::matmul::triangular::{self, BlockStructure};
use faer::{Accum, MatMut, MatRef, Par};
use nalgebra::DMatrix;

/// A column-major nalgebra matrix as a faer view (the same dense layout; no copy).
fn view(a: &DMatrix<f64>) -> MatRef<'_, f64> {
    MatRef::from_column_major_slice(a.as_slice(), a.nrows(), a.ncols())
}

fn view_mut(a: &mut DMatrix<f64>) -> MatMut<'_, f64> {
    let (r, c) = a.shape();
    MatMut::from_column_major_slice_mut(a.as_mut_slice(), r, c)
}

/// `AᵀA` (`n × n`) of a tall `A` (`p × n`): the lower triangle by one GEMM on all rayon
/// threads, then mirrored (`pn²/2` multiply-adds).
pub fn gram(a: &DMatrix<f64>) -> DMatrix<f64> {
    let n = a.ncols();
    let mut g = DMatrix::zeros(n, n);
    triangular::matmul(
        view_mut(&mut g),
        BlockStructure::TriangularLower,
        Accum::Replace,
        view(a).transpose(),
        BlockStructure::Rectangular,
        view(a),
        BlockStructure::Rectangular,
        1.0,
        Par::rayon(0),
    );
    g.fill_upper_triangle_with_lower_triangle();
    g
}

/// `A B` on all rayon threads.
///
/// # Panics
/// If `A`'s columns and `B`'s rows differ (as nalgebra's product does).
pub fn matmul(a: &DMatrix<f64>, b: &DMatrix<f64>) -> DMatrix<f64> {
    assert_eq!(a.ncols(), b.nrows(), "matmul: A has {} columns, B {} rows", a.ncols(), b.nrows());
    let mut out = DMatrix::zeros(a.nrows(), b.ncols());
    faer::linalg::matmul::matmul(view_mut(&mut out), Accum::Replace, view(a), view(b), 1.0, Par::rayon(0));
    out
}

/// `(A⁻¹, log|A|)` of a symmetric positive definite `A` (its lower triangle is read): faer's
/// Cholesky factor `L`, its triangular inverse and `A⁻¹ = L⁻ᵀL⁻¹` (lower triangle, then
/// mirrored), on all rayon threads; `None` if `A` is not square, not finite or not numerically
/// positive definite.
pub fn spd_inverse_and_logdet(a: &DMatrix<f64>) -> Option<(DMatrix<f64>, f64)> {
    let n = a.nrows();
    if a.ncols() != n || a.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let llt = view(a).llt(faer::Side::Lower).ok()?;
    let l = llt.L();
    let logdet = 2.0 * (0..n).map(|i| l[(i, i)].ln()).sum::<f64>();
    let par = Par::rayon(0);
    let mut inv = DMatrix::zeros(n, n);
    let mut mem = MemBuffer::new(llt_inverse::inverse_scratch::<f64>(n, par));
    llt_inverse::inverse(view_mut(&mut inv), l, par, MemStack::new(&mut mem));
    inv.fill_upper_triangle_with_lower_triangle();
    Some((inv, logdet))
}
