//! The [`LinearOperator`] contract and its basic implementations.
//!
//! An operator is a square linear map `A: ℝⁿ → ℝⁿ` known only through products `A v` and
//! `A V`. Lanczos, CG and the log-determinant estimators need nothing else, so kernel Gram
//! matrices, GGNs and Jacobian products can all be used without forming `n × n` matrices.

use std::sync::Arc;

use nalgebra::{DMatrix, DVector};

use crate::error::{ensure_dim, ensure_finite, LinalgError, Result};

/// A square linear operator known through matrix–vector products.
///
/// Implementors provide [`dim`](Self::dim) and [`matvec`](Self::matvec) (and, when a batched
/// product is cheaper than a loop, [`matmat`](Self::matmat)). `matvec`/`matmat` may assume their
/// argument has the right size; callers that handle user input use the checked
/// [`apply`](Self::apply)/[`apply_block`](Self::apply_block), which also reject non-finite
/// inputs and outputs.
pub trait LinearOperator: Send + Sync {
    /// The size `n` of the square operator.
    fn dim(&self) -> usize;

    /// `A v` for `v.len() == self.dim()` (precondition; see [`apply`](Self::apply)).
    fn matvec(&self, v: &DVector<f64>) -> DVector<f64>;

    /// `A V` for a block `V` of `dim() × k` columns. The default applies `matvec` per column.
    fn matmat(&self, v: &DMatrix<f64>) -> DMatrix<f64> {
        let mut out = DMatrix::zeros(v.nrows(), v.ncols());
        for (j, col) in v.column_iter().enumerate() {
            out.set_column(j, &self.matvec(&col.into_owned()));
        }
        out
    }

    /// Checked `A v`: dimension and finiteness of input and output are verified.
    fn apply(&self, v: &DVector<f64>) -> Result<DVector<f64>> {
        ensure_dim("operator input vector", self.dim(), v.len())?;
        ensure_finite("operator input vector", v.iter())?;
        let out = self.matvec(v);
        ensure_finite("operator output A·v", out.iter())?;
        Ok(out)
    }

    /// Checked `A V` for a block of vectors.
    fn apply_block(&self, v: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        ensure_dim("operator input block rows", self.dim(), v.nrows())?;
        ensure_finite("operator input block", v.iter())?;
        let out = self.matmat(v);
        ensure_finite("operator output A·V", out.iter())?;
        Ok(out)
    }
}

macro_rules! forward_operator {
    ($($wrapper:ty),*) => {$(
        impl<T: LinearOperator + ?Sized> LinearOperator for $wrapper {
            fn dim(&self) -> usize { (**self).dim() }
            fn matvec(&self, v: &DVector<f64>) -> DVector<f64> { (**self).matvec(v) }
            fn matmat(&self, v: &DMatrix<f64>) -> DMatrix<f64> { (**self).matmat(v) }
        }
    )*};
}
forward_operator!(&T, Box<T>, Arc<T>);

/// A dense symmetric matrix as an operator.
#[derive(Debug, Clone, PartialEq)]
pub struct DenseOperator {
    matrix: DMatrix<f64>,
}

impl DenseOperator {
    /// Wraps a square, finite matrix. Symmetry is not required here (solvers that need it check).
    pub fn new(matrix: DMatrix<f64>) -> Result<Self> {
        ensure_dim("dense operator columns", matrix.nrows(), matrix.ncols())?;
        ensure_finite("dense operator matrix", matrix.iter())?;
        Ok(Self { matrix })
    }

    /// The wrapped matrix.
    pub fn matrix(&self) -> &DMatrix<f64> {
        &self.matrix
    }

    /// Unwraps the matrix.
    pub fn into_inner(self) -> DMatrix<f64> {
        self.matrix
    }
}

impl LinearOperator for DenseOperator {
    fn dim(&self) -> usize {
        self.matrix.nrows()
    }
    fn matvec(&self, v: &DVector<f64>) -> DVector<f64> {
        &self.matrix * v
    }
    fn matmat(&self, v: &DMatrix<f64>) -> DMatrix<f64> {
        &self.matrix * v
    }
}

/// An operator given by a closure `v ↦ A v`.
pub struct FnOperator<F> {
    dim: usize,
    f: F,
}

impl<F: Fn(&DVector<f64>) -> DVector<f64> + Send + Sync> FnOperator<F> {
    /// Wraps `f`, which must map vectors of length `dim` to vectors of length `dim`.
    pub fn new(dim: usize, f: F) -> Self {
        Self { dim, f }
    }
}

impl<F: Fn(&DVector<f64>) -> DVector<f64> + Send + Sync> LinearOperator for FnOperator<F> {
    fn dim(&self) -> usize {
        self.dim
    }
    fn matvec(&self, v: &DVector<f64>) -> DVector<f64> {
        (self.f)(v)
    }
}

/// `A + B` for two operators of the same size.
pub struct SumOperator<A, B> {
    a: A,
    b: B,
}

impl<A: LinearOperator, B: LinearOperator> SumOperator<A, B> {
    /// `A + B`; errors if the sizes differ.
    pub fn new(a: A, b: B) -> Result<Self> {
        ensure_dim("sum operator second term", a.dim(), b.dim())?;
        Ok(Self { a, b })
    }
}

impl<A: LinearOperator, B: LinearOperator> LinearOperator for SumOperator<A, B> {
    fn dim(&self) -> usize {
        self.a.dim()
    }
    fn matvec(&self, v: &DVector<f64>) -> DVector<f64> {
        self.a.matvec(v) + self.b.matvec(v)
    }
    fn matmat(&self, v: &DMatrix<f64>) -> DMatrix<f64> {
        self.a.matmat(v) + self.b.matmat(v)
    }
}

/// `c · A`.
pub struct ScaledOperator<A> {
    scale: f64,
    a: A,
}

impl<A: LinearOperator> ScaledOperator<A> {
    /// `scale · a`; the scale must be finite.
    pub fn new(scale: f64, a: A) -> Result<Self> {
        ensure_finite("operator scale", [scale].iter())?;
        Ok(Self { scale, a })
    }
}

impl<A: LinearOperator> LinearOperator for ScaledOperator<A> {
    fn dim(&self) -> usize {
        self.a.dim()
    }
    fn matvec(&self, v: &DVector<f64>) -> DVector<f64> {
        self.a.matvec(v) * self.scale
    }
    fn matmat(&self, v: &DMatrix<f64>) -> DMatrix<f64> {
        self.a.matmat(v) * self.scale
    }
}

/// A diagonal operator `diag(d)`.
#[derive(Debug, Clone, PartialEq)]
pub struct DiagonalOperator {
    diag: DVector<f64>,
}

impl DiagonalOperator {
    /// `diag(d)` with finite entries.
    pub fn new(diag: DVector<f64>) -> Result<Self> {
        ensure_finite("diagonal operator entries", diag.iter())?;
        Ok(Self { diag })
    }

    /// `c · I` of size `n`.
    pub fn identity_scaled(n: usize, c: f64) -> Result<Self> {
        Self::new(DVector::from_element(n, c))
    }

    /// The diagonal.
    pub fn diagonal(&self) -> &DVector<f64> {
        &self.diag
    }
}

impl LinearOperator for DiagonalOperator {
    fn dim(&self) -> usize {
        self.diag.len()
    }
    fn matvec(&self, v: &DVector<f64>) -> DVector<f64> {
        v.component_mul(&self.diag)
    }
    fn matmat(&self, v: &DMatrix<f64>) -> DMatrix<f64> {
        let mut out = v.clone();
        for mut col in out.column_iter_mut() {
            col.component_mul_assign(&self.diag);
        }
        out
    }
}

/// Forms the dense matrix of an operator by applying it to the identity (tests and small `n`).
pub fn to_dense(op: &dyn LinearOperator) -> DMatrix<f64> {
    op.matmat(&DMatrix::identity(op.dim(), op.dim()))
}

/// One column-major pass over a square `A`: `visit(k, a_ij, a_ji)` for every entry (`k` its
/// column-major index) and the squared norms `(‖A‖_F², ‖A − Aᵀ‖_F²)`, without forming `Aᵀ`.
fn symmetry_sweep(a: &DMatrix<f64>, mut visit: impl FnMut(usize, f64, f64)) -> (f64, f64) {
    let (n, src) = (a.nrows(), a.as_slice());
    let (mut norm_sq, mut asym_sq) = (0.0, 0.0);
    for j in 0..n {
        for i in 0..n {
            let (x, y) = (src[j * n + i], src[i * n + j]);
            norm_sq += x * x;
            asym_sq += (x - y) * (x - y);
            visit(j * n + i, x, y);
        }
    }
    (norm_sq, asym_sq)
}

/// `‖A − Aᵀ‖_F / ‖A‖_F` from the squared norms (0 for the zero matrix).
fn asymmetry_ratio((norm_sq, asym_sq): (f64, f64)) -> f64 {
    if norm_sq == 0.0 {
        0.0
    } else {
        (asym_sq / norm_sq).sqrt()
    }
}

/// `NotSymmetric` unless `asymmetry ≤ tol`.
fn check_asymmetry(what: &'static str, asymmetry: f64, tol: f64) -> Result<()> {
    if asymmetry <= tol {
        Ok(())
    } else {
        Err(LinalgError::NotSymmetric { what, asymmetry })
    }
}

/// Relative asymmetry ‖A − Aᵀ‖_F / ‖A‖_F (0 for the zero matrix, ∞ for a non-square one).
pub fn relative_asymmetry(a: &DMatrix<f64>) -> f64 {
    if !a.is_square() {
        return f64::INFINITY;
    }
    asymmetry_ratio(symmetry_sweep(a, |_, _, _| {}))
}

/// Errors with `NotSymmetric` unless ‖A − Aᵀ‖_F ≤ tol·‖A‖_F.
pub fn ensure_symmetric(what: &'static str, a: &DMatrix<f64>, tol: f64) -> Result<()> {
    check_asymmetry(what, relative_asymmetry(a), tol)
}

/// `(A + Aᵀ)/2` of a square matrix in the same pass that checks it: `NonFinite` unless every
/// entry is finite, `NotSymmetric` unless ‖A − Aᵀ‖_F ≤ tol·‖A‖_F (the test of
/// [`ensure_symmetric`]).
pub(crate) fn symmetric_part(what: &'static str, a: &DMatrix<f64>, tol: f64) -> Result<DMatrix<f64>> {
    let n = a.nrows();
    let mut sym = DMatrix::zeros(n, n);
    let out = sym.as_mut_slice();
    checked_symmetry_sweep(what, a, tol, |k, x, y| out[k] = (x + y) * 0.5)?;
    Ok(sym)
}

/// [`symmetry_sweep`] with the checks [`symmetric_part`] and [`symmetrise_in_place`] share:
/// every entry finite, `‖A − Aᵀ‖_F ≤ tol·‖A‖_F`.
fn checked_symmetry_sweep(
    what: &'static str,
    a: &DMatrix<f64>,
    tol: f64,
    mut visit: impl FnMut(usize, f64, f64),
) -> Result<()> {
    let mut finite = true;
    let sums = symmetry_sweep(a, |k, x, y| {
        finite &= x.is_finite();
        visit(k, x, y);
    });
    if !finite {
        return Err(LinalgError::Input(fspace_input::InputError::NonFinite { what }));
    }
    check_asymmetry(what, asymmetry_ratio(sums), tol)
}

/// [`symmetric_part`] written over `a` itself (the same entries to the bit: `(x + y)/2` is
/// `(y + x)/2` in IEEE arithmetic), for a caller that owns the matrix: no second `n × n` buffer.
pub(crate) fn symmetrise_in_place(what: &'static str, a: &mut DMatrix<f64>, tol: f64) -> Result<()> {
    checked_symmetry_sweep(what, a, tol, |_, _, _| {})?;
    let n = a.nrows();
    let data = a.as_mut_slice();
    for j in 0..n {
        for i in j + 1..n {
            let v = (data[j * n + i] + data[i * n + j]) * 0.5;
            data[j * n + i] = v;
            data[i * n + j] = v;
        }
    }
    Ok(())
}

impl SymmetricEntries for DenseOperator {
    fn entries_dim(&self) -> usize {
        self.matrix.nrows()
    }
    fn diagonal_entries(&self) -> DVector<f64> {
        self.matrix.diagonal()
    }
    fn column_entries(&self, j: usize) -> DVector<f64> {
        self.matrix.column(j).into_owned()
    }
}

/// Access to the diagonal and single columns of a symmetric matrix, without forming it (what a
/// pivoted Cholesky needs). The kernel Gram operator implements it.
pub trait SymmetricEntries {
    /// The size `n`.
    fn entries_dim(&self) -> usize;
    /// The diagonal.
    fn diagonal_entries(&self) -> DVector<f64>;
    /// Column `j`.
    fn column_entries(&self, j: usize) -> DVector<f64>;
}

impl SymmetricEntries for DMatrix<f64> {
    fn entries_dim(&self) -> usize {
        self.nrows()
    }
    fn diagonal_entries(&self) -> DVector<f64> {
        self.diagonal()
    }
    fn column_entries(&self, j: usize) -> DVector<f64> {
        self.column(j).into_owned()
    }
}
