//! # fspace-testutil
//!
//! Helpers shared by the test suites of every fspace crate, so that no test file re-implements
//! them: seeded random numbers, central finite differences, SPD/PSD matrices with a *known*
//! spectrum (Q diag(λ) Qᵀ with Haar-random Q), and approximate-equality assertions that report
//! where and by how much two values differ; and the memory probe of the scaling examples.
//!
//! This crate is a dev-dependency only; library crates never depend on it.

pub mod mutate;

use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;

/// A deterministic RNG for tests.
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// An `r × c` matrix of i.i.d. standard normal entries.
pub fn randn(r: usize, c: usize, rng: &mut impl Rng) -> DMatrix<f64> {
    DMatrix::from_fn(r, c, |_, _| rng.sample(StandardNormal))
}

/// A vector of i.i.d. standard normal entries.
pub fn randn_vec(n: usize, rng: &mut impl Rng) -> DVector<f64> {
    DVector::from_fn(n, |_, _| rng.sample(StandardNormal))
}

/// `n` points in 2-D around three centres `(−2, 0)`, `(2, 0)`, `(0, 2.5)` with isotropic
/// Gaussian noise of standard deviation `spread`; point `i` belongs to class `i mod 3` (the
/// labels, as `f64`). A small, well-separated multi-class problem for classifier tests.
pub fn three_blobs(n: usize, spread: f64, rng: &mut impl Rng) -> (DMatrix<f64>, DVector<f64>) {
    const CENTRES: [(f64, f64); 3] = [(-2.0, 0.0), (2.0, 0.0), (0.0, 2.5)];
    let noise = randn(n, 2, rng) * spread;
    let x = DMatrix::from_fn(n, 2, |i, j| {
        let (cx, cy) = CENTRES[i % 3];
        (if j == 0 { cx } else { cy }) + noise[(i, j)]
    });
    (x, DVector::from_fn(n, |i, _| (i % 3) as f64))
}

/// An `r × c` matrix of i.i.d. uniform entries in `[lo, hi)`.
pub fn rand_uniform(r: usize, c: usize, lo: f64, hi: f64, rng: &mut impl Rng) -> DMatrix<f64> {
    DMatrix::from_fn(r, c, |_, _| rng.gen_range(lo..hi))
}

/// A Haar-distributed random orthogonal `n × n` matrix (QR of a Gaussian matrix with the sign
/// of R's diagonal fixed).
pub fn random_orthogonal(n: usize, rng: &mut impl Rng) -> DMatrix<f64> {
    let g = randn(n, n, rng);
    let qr = g.qr();
    let mut q = qr.q();
    let r = qr.r();
    for j in 0..n {
        if r[(j, j)] < 0.0 {
            q.column_mut(j).neg_mut();
        }
    }
    q
}

/// A symmetric matrix `Q diag(eigenvalues) Qᵀ` with a Haar-random `Q`; returns the matrix and
/// `Q` (whose columns are the eigenvectors, in the order of `eigenvalues`).
pub fn with_spectrum(eigenvalues: &[f64], rng: &mut impl Rng) -> (DMatrix<f64>, DMatrix<f64>) {
    let n = eigenvalues.len();
    let q = random_orthogonal(n, rng);
    let d = DMatrix::from_diagonal(&DVector::from_column_slice(eigenvalues));
    let a = &q * d * q.transpose();
    let a = (&a + a.transpose()) * 0.5;
    (a, q)
}

/// Geometrically spaced eigenvalues from `max` down to `min` (n values, n ≥ 1).
pub fn geometric_spectrum(n: usize, max: f64, min: f64) -> Vec<f64> {
    if n == 1 {
        return vec![max];
    }
    (0..n).map(|i| max * (min / max).powf(i as f64 / (n - 1) as f64)).collect()
}

/// A random SPD matrix with geometric spectrum in `[min_eig, max_eig]`.
pub fn spd(n: usize, max_eig: f64, min_eig: f64, rng: &mut impl Rng) -> DMatrix<f64> {
    with_spectrum(&geometric_spectrum(n, max_eig, min_eig), rng).0
}

/// Dense Moore–Penrose pseudo-inverse of a symmetric PSD matrix, treating eigenvalues below
/// `rtol · λ_max` as zero (the independent reference for Lanczos-based factors).
pub fn psd_pinv(a: &DMatrix<f64>, rtol: f64) -> DMatrix<f64> {
    let eig = a.clone().symmetric_eigen();
    let lmax = eig.eigenvalues.iter().cloned().fold(0.0_f64, f64::max);
    let n = a.nrows();
    let mut out = DMatrix::zeros(n, n);
    for (i, &l) in eig.eigenvalues.iter().enumerate() {
        if l > rtol * lmax {
            let v = eig.eigenvectors.column(i);
            out += (v * v.transpose()) / l;
        }
    }
    out
}

/// `log N(y; 0, cov)` by a dense Cholesky: the reference for a GP's log marginal likelihood.
pub fn dense_log_normal(y: &DVector<f64>, cov: &DMatrix<f64>) -> f64 {
    let chol = cov.clone().cholesky().expect("an SPD covariance");
    let alpha = chol.solve(y);
    let logdet: f64 = 2.0 * chol.l().diagonal().iter().map(|v| v.ln()).sum::<f64>();
    -0.5 * y.dot(&alpha) - 0.5 * logdet - 0.5 * y.len() as f64 * std::f64::consts::TAU.ln()
}

/// Central finite-difference gradient of a scalar function at `x` with step `h`.
pub fn fd_gradient(f: impl Fn(&[f64]) -> f64, x: &[f64], h: f64) -> Vec<f64> {
    let mut xp = x.to_vec();
    (0..x.len())
        .map(|i| {
            xp[i] = x[i] + h;
            let fp = f(&xp);
            xp[i] = x[i] - h;
            let fm = f(&xp);
            xp[i] = x[i];
            (fp - fm) / (2.0 * h)
        })
        .collect()
}

/// Central finite-difference Jacobian (rows: outputs, columns: inputs) of a vector function.
pub fn fd_jacobian(f: impl Fn(&[f64]) -> Vec<f64>, x: &[f64], h: f64) -> DMatrix<f64> {
    let m = f(x).len();
    let mut jac = DMatrix::zeros(m, x.len());
    let mut xp = x.to_vec();
    for i in 0..x.len() {
        xp[i] = x[i] + h;
        let fp = f(&xp);
        xp[i] = x[i] - h;
        let fm = f(&xp);
        xp[i] = x[i];
        for r in 0..m {
            jac[(r, i)] = (fp[r] - fm[r]) / (2.0 * h);
        }
    }
    jac
}

/// Relative error `|a − b| / max(|b|, floor)`.
pub fn rel_err(a: f64, b: f64, floor: f64) -> f64 {
    (a - b).abs() / b.abs().max(floor)
}

/// Asserts `|actual − expected| ≤ atol + rtol·|expected|` for every pair, naming the first
/// failing index.
#[track_caller]
pub fn assert_all_close(actual: &[f64], expected: &[f64], rtol: f64, atol: f64) {
    assert_eq!(actual.len(), expected.len(), "length mismatch");
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        let tol = atol + rtol * e.abs();
        assert!(
            (a - e).abs() <= tol,
            "index {i}: actual {a:.12e}, expected {e:.12e}, |diff| {:.3e} > tol {tol:.3e}",
            (a - e).abs()
        );
    }
}

/// Asserts two matrices agree in relative Frobenius norm: ‖A − B‖_F ≤ rtol·‖B‖_F + atol.
#[track_caller]
pub fn assert_mat_close(actual: &DMatrix<f64>, expected: &DMatrix<f64>, rtol: f64, atol: f64) {
    assert_eq!(actual.shape(), expected.shape(), "shape mismatch");
    let diff = (actual - expected).norm();
    let tol = rtol * expected.norm() + atol;
    assert!(diff <= tol, "‖A − B‖_F = {diff:.3e} > {tol:.3e} (‖B‖_F = {:.3e})", expected.norm());
}

/// Whether two matrices have the same shape and every entry the same bits (the check for a
/// rewrite that promises to keep the arithmetic of the code it replaces).
pub fn same_bits(a: &DMatrix<f64>, b: &DMatrix<f64>) -> bool {
    a.shape() == b.shape() && a.iter().zip(b.iter()).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Relative Frobenius error ‖A − B‖_F / ‖B‖_F.
pub fn rel_frob(actual: &DMatrix<f64>, expected: &DMatrix<f64>) -> f64 {
    (actual - expected).norm() / expected.norm().max(f64::MIN_POSITIVE)
}

/// A `kB` field of `/proc/self/status` (`"VmRSS:"`, `"VmHWM:"` = peak resident set), `0` where
/// it cannot be read (non-Linux): the peak-memory probe of the scaling examples.
pub fn proc_status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).map(|l| l.to_string()))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// One thread's part of an all-reduce and its failure flag.
type Deposit = (DVector<f64>, bool);

/// The processes of a sharded fit, as threads: [`ThreadReduce::reduce`] deposits each thread's
/// part, waits for all of them, and returns their sum in thread order — `None` when any thread
/// said it failed (the caller turns that into its crate's error).
pub struct ThreadReduce {
    /// Each thread's part and failure flag, once deposited.
    parts: std::sync::Mutex<Vec<Option<Deposit>>>,
    barrier: std::sync::Barrier,
}

impl ThreadReduce {
    /// An all-reduce over `world` threads.
    pub fn new(world: usize) -> Self {
        Self { parts: std::sync::Mutex::new(vec![None; world]), barrier: std::sync::Barrier::new(world) }
    }

    /// The sum of every thread's `part` (each thread calls it with its `rank`), or `None` when
    /// any of them said `failed`.
    pub fn reduce(&self, rank: usize, part: DVector<f64>, failed: bool) -> Option<DVector<f64>> {
        self.parts.lock().unwrap()[rank] = Some((part, failed));
        self.barrier.wait();
        let (sum, any_failed) = {
            let parts = self.parts.lock().unwrap();
            let all: Vec<_> = parts.iter().map(|p| p.clone().unwrap()).collect();
            let sum = all.iter().skip(1).fold(all[0].0.clone(), |acc, (p, _)| acc + p);
            (sum, all.iter().any(|(_, f)| *f))
        };
        self.barrier.wait();
        (!any_failed).then_some(sum)
    }

    /// [`ThreadReduce::reduce`] as a crate's reduce step: a thread's failure is the input error
    /// "the sum over the processes: another process failed" on every other thread.
    pub fn sum<E: From<fspace_input::InputError>>(
        &self,
        rank: usize,
        part: DVector<f64>,
        failed: bool,
    ) -> Result<DVector<f64>, E> {
        self.reduce(rank, part, failed).ok_or_else(|| {
            fspace_input::InputError::Invalid {
                what: "the sum over the processes",
                reason: "another process failed".into(),
            }
            .into()
        })
    }
}

/// Training rows held elsewhere, read by position (`fspace_core::RowSource` over an in-memory
/// copy): records the largest read and the rows read in all, and can turn one position's first
/// target into `bad` (a corrupt record of a loader).
pub struct CountingRows {
    rows: fspace_core::RowsInMemory,
    n: usize,
    /// The most rows one read asked for.
    pub largest_read: usize,
    /// Rows read in all.
    pub read: usize,
    /// `(position, value)`: that row's first target is read as `value`.
    pub bad: Option<(usize, f64)>,
}

impl CountingRows {
    /// The rows of `x` (`n × d`) with targets `y` (`n × t`).
    pub fn new(x: &DMatrix<f64>, y: &DMatrix<f64>) -> Self {
        let flat = fspace_core::fit::flatten(y);
        let rows = fspace_core::RowsInMemory::new(x, flat, y.ncols()).expect("n × t targets");
        Self { rows, n: x.nrows(), largest_read: 0, read: 0, bad: None }
    }
}

impl fspace_core::RowSource for CountingRows {
    fn len(&self) -> usize {
        self.n
    }
    fn rows(&mut self, positions: &[usize]) -> fspace_core::Result<(DMatrix<f64>, DVector<f64>)> {
        self.largest_read = self.largest_read.max(positions.len());
        self.read += positions.len();
        let (x, mut y) = self.rows.rows(positions)?;
        if let Some((at, value)) = self.bad {
            if let Some(i) = positions.iter().position(|&p| p == at) {
                let t = y.len() / positions.len();
                y[i * t] = value;
            }
        }
        Ok((x, y))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_spectrum_is_recovered() {
        let mut r = rng(1);
        let eigs = [5.0, 2.0, 1.0, 0.0];
        let (a, _) = with_spectrum(&eigs, &mut r);
        let mut got: Vec<f64> = a.symmetric_eigen().eigenvalues.iter().cloned().collect();
        got.sort_by(|x, y| y.partial_cmp(x).unwrap());
        assert_all_close(&got, &eigs, 0.0, 1e-12);
    }

    #[test]
    fn finite_differences_of_a_cubic() {
        let g = fd_gradient(|x| x[0].powi(3) + 2.0 * x[1], &[2.0, 1.0], 1e-5);
        assert_all_close(&g, &[12.0, 2.0], 1e-9, 1e-8);
    }
}
