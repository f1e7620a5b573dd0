//! Every dense factorisation and product of the workspace, through faer's kernels: the Cholesky
//! factor ([`cholesky_lower`]), triangular solves ([`solve_lower`], [`solve_upper_of_lower`]),
//! `AᵀA` ([`gram`], [`gram_serial`]), `AB` ([`matmul`], [`matmul_serial`]), `AᵀB`
//! ([`matmul_tn_serial`]) and `(A⁻¹, log|A|)` ([`spd_inverse_and_logdet`]).
//!
//! faer's kernels beat nalgebra's (column by column) and the workspace's earlier blocked
//! routines on every shape measured: 1.04–1.9× for the products, 2–5× for the Cholesky factor
//! and the triangular solves (`cargo bench -p fspace-linalg --bench cholesky`,
//! `docs/PERFORMANCE.md`). faer splits a product's output between threads, never a sum, and its
//! Cholesky blocking does not depend on the thread count, so the bits do not depend on the
//! machine's cores (`faer_routines_give_the_same_bits_on_any_number_of_threads`).

use faer::dyn_stack::{MemBuffer, MemStack};
use faer::linalg::cholesky::llt::factor as llt_factor;
use faer::linalg::cholesky::llt::inverse as llt_inverse;
use faer::linalg::matmul::triangular::{self, BlockStructure};
use faer::linalg::triangular_solve;
use faer::{Accum, MatMut, MatRef, Par};
use nalgebra::DMatrix;

use crate::vector_state::CleanOnDrop;

/// A column-major nalgebra matrix as a faer view (the same dense layout; no copy).
fn view(a: &DMatrix<f64>) -> MatRef<'_, f64> {
    MatRef::from_column_major_slice(a.as_slice(), a.nrows(), a.ncols())
}

fn view_mut(a: &mut DMatrix<f64>) -> MatMut<'_, f64> {
    let (r, c) = a.shape();
    MatMut::from_column_major_slice_mut(a.as_mut_slice(), r, c)
}

/// The lower Cholesky factor `L` (`LLᵀ = A`, upper triangle zero) of a symmetric matrix given
/// by its lower triangle, on all rayon threads; `None` if `A` is not square, not finite or not
/// numerically positive definite (a pivot ≤ 0).
pub fn cholesky_lower(a: &DMatrix<f64>) -> Option<DMatrix<f64>> {
    let n = a.nrows();
    if a.ncols() != n || a.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let mut l = a.clone();
    let par = Par::rayon(0);
    let _clean = CleanOnDrop::parallel();
    let mut mem = MemBuffer::new(llt_factor::cholesky_in_place_scratch::<f64>(n, par, Default::default()));
    llt_factor::cholesky_in_place(
        view_mut(&mut l),
        Default::default(),
        par,
        MemStack::new(&mut mem),
        Default::default(),
    )
    .ok()?;
    // faer leaves the strict upper triangle as scratch.
    for j in 1..n {
        l.as_mut_slice()[j * n..j * n + j].fill(0.0);
    }
    if (0..n).any(|i| !(l[(i, i)] > 0.0 && l[(i, i)].is_finite())) {
        return None;
    }
    Some(l)
}

/// `L⁻¹ B` for a lower-triangular `L` with a positive diagonal (forward substitution), on all
/// rayon threads.
///
/// # Panics
/// If `L` is not square or `B`'s rows differ from its size.
pub fn solve_lower(l: &DMatrix<f64>, b: &DMatrix<f64>) -> DMatrix<f64> {
    assert!(l.is_square() && l.nrows() == b.nrows(), "solve_lower: L {:?}, B {:?}", l.shape(), b.shape());
    let _clean = CleanOnDrop::parallel();
    let mut x = b.clone();
    triangular_solve::solve_lower_triangular_in_place(view(l), view_mut(&mut x), Par::rayon(0));
    x
}

/// `L⁻ᵀ B` for a lower-triangular `L` with a positive diagonal (back substitution against `Lᵀ`,
/// read from `L` without forming the transpose), on all rayon threads.
///
/// # Panics
/// If `L` is not square or `B`'s rows differ from its size.
pub fn solve_upper_of_lower(l: &DMatrix<f64>, b: &DMatrix<f64>) -> DMatrix<f64> {
    assert!(
        l.is_square() && l.nrows() == b.nrows(),
        "solve_upper_of_lower: L {:?}, B {:?}",
        l.shape(),
        b.shape()
    );
    let _clean = CleanOnDrop::parallel();
    let mut x = b.clone();
    triangular_solve::solve_upper_triangular_in_place(view(l).transpose(), view_mut(&mut x), Par::rayon(0));
    x
}

/// `AᵀA` (`n × n`) of a tall `A` (`p × n`): the lower triangle by one GEMM on all rayon
/// threads, then mirrored (`pn²/2` multiply-adds).
pub fn gram(a: &DMatrix<f64>) -> DMatrix<f64> {
    gram_with(a, Par::rayon(0))
}

/// [`gram`] on the calling thread, for loops that are already parallel over independent items
/// (the same bits: faer never splits a sum between threads).
pub fn gram_serial(a: &DMatrix<f64>) -> DMatrix<f64> {
    gram_with(a, Par::Seq)
}

/// `AᵀB` on the calling thread, reading `A` transposed in place (no copy); see [`gram_serial`].
///
/// # Panics
/// If `A` and `B` have different numbers of rows.
pub fn matmul_tn_serial(a: &DMatrix<f64>, b: &DMatrix<f64>) -> DMatrix<f64> {
    assert_eq!(a.nrows(), b.nrows(), "matmul_tn_serial: A has {} rows, B {}", a.nrows(), b.nrows());
    let _clean = CleanOnDrop::serial();
    let mut out = DMatrix::zeros(a.ncols(), b.ncols());
    faer::linalg::matmul::matmul(
        view_mut(&mut out),
        Accum::Replace,
        view(a).transpose(),
        view(b),
        1.0,
        Par::Seq,
    );
    out
}

/// `AB` on the calling thread; see [`gram_serial`].
///
/// # Panics
/// If `A`'s columns and `B`'s rows differ.
pub fn matmul_serial(a: &DMatrix<f64>, b: &DMatrix<f64>) -> DMatrix<f64> {
    matmul_with(a, b, Par::Seq)
}

fn gram_with(a: &DMatrix<f64>, par: Par) -> DMatrix<f64> {
    let _clean = CleanOnDrop::for_par(par);
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
        par,
    );
    g.fill_upper_triangle_with_lower_triangle();
    g
}

/// `A B` on all rayon threads.
///
/// # Panics
/// If `A`'s columns and `B`'s rows differ (as nalgebra's product does).
pub fn matmul(a: &DMatrix<f64>, b: &DMatrix<f64>) -> DMatrix<f64> {
    matmul_with(a, b, Par::rayon(0))
}

fn matmul_with(a: &DMatrix<f64>, b: &DMatrix<f64>, par: Par) -> DMatrix<f64> {
    assert_eq!(a.ncols(), b.nrows(), "matmul: A has {} columns, B {} rows", a.ncols(), b.nrows());
    let _clean = CleanOnDrop::for_par(par);
    let mut out = DMatrix::zeros(a.nrows(), b.ncols());
    faer::linalg::matmul::matmul(view_mut(&mut out), Accum::Replace, view(a), view(b), 1.0, par);
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
    let l = cholesky_lower(a)?;
    let logdet = 2.0 * (0..n).map(|i| l[(i, i)].ln()).sum::<f64>();
    let _clean = CleanOnDrop::parallel();
    let par = Par::rayon(0);
    let mut inv = DMatrix::zeros(n, n);
    let mut mem = MemBuffer::new(llt_inverse::inverse_scratch::<f64>(n, par));
    llt_inverse::inverse(view_mut(&mut inv), view(&l), par, MemStack::new(&mut mem));
    inv.fill_upper_triangle_with_lower_triangle();
    Some((inv, logdet))
}
