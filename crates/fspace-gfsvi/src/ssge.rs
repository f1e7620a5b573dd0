//! The spectral Stein gradient estimator (SSGE; Shi, Sun & Zhu 2018) of the score `∇ log q(x)`
//! of an implicit distribution known only through samples — FVI's estimate of the variational
//! term of the functional KL gradient.
//!
//! With samples `x_1 … x_K`, an RBF kernel `k(x, y) = exp(−‖x − y‖²/2h²)` (median-heuristic
//! bandwidth), and the eigenpairs `(λ_j, u_j)` of the Gram matrix, the Nyström eigenfunctions
//! `ψ_j(x) = (√K/λ_j) Σ_k k(x, x_k) u_kj` approximate those of the kernel's integral operator
//! under `q`. By Stein's identity the score's coefficients in that basis are
//! `β_j = −E_q ∇ψ_j ≈ −(1/K) Σ_m ∇ψ_j(x_m)`, and `ĝ(x) = Σ_j β_j ψ_j(x)`. The eigenpairs kept
//! are the largest ones covering `threshold` of the Gram spectrum (Sun et al.'s 0.99).

use fspace_input::InputError;
use nalgebra::{DMatrix, SymmetricEigen};

use crate::error::{ensure_finite, invalid, GfsviError, Result};

/// SSGE settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ssge {
    /// Fraction of the Gram spectrum the kept eigenpairs cover (0.99).
    pub threshold: f64,
    /// Jitter `η` added to the Gram matrix's diagonal (0).
    pub eta: f64,
    /// Fixed bandwidth `h`; `None`: the median of the pairwise distances.
    pub bandwidth: Option<f64>,
}

impl Default for Ssge {
    fn default() -> Self {
        Self { threshold: 0.99, eta: 0.0, bandwidth: None }
    }
}

impl Ssge {
    /// `∇ log q` at each sample (rows of `samples`, `K × D`; `K ≥ 2`), `K × D`.
    pub fn score_at_samples(&self, samples: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        let (k, d) = samples.shape();
        if k < 2 || d == 0 {
            return Err(GfsviError::Input(InputError::Empty {
                what: "SSGE samples (need K ≥ 2 samples of dimension ≥ 1)",
            }));
        }
        ensure_finite("SSGE samples", samples.iter())?;
        if !(self.threshold > 0.0 && self.threshold <= 1.0) {
            return Err(invalid(
                "SSGE spectrum threshold",
                format!("{} (must be in (0, 1])", self.threshold),
            ));
        }
        if !(self.eta.is_finite() && self.eta >= 0.0) {
            return Err(invalid("SSGE jitter η", format!("{} (must be ≥ 0)", self.eta)));
        }
        let sq = squared_distances(samples);
        let h2 = match self.bandwidth {
            Some(h) if h.is_finite() && h > 0.0 => h * h,
            Some(h) => return Err(invalid("SSGE bandwidth", format!("{h} (must be > 0)"))),
            None => {
                let mut off: Vec<f64> =
                    (0..k).flat_map(|i| (i + 1..k).map(move |j| (i, j))).map(|(i, j)| sq[(i, j)]).collect();
                off.sort_by(f64::total_cmp);
                let med = off[off.len() / 2];
                if med > 0.0 {
                    med
                } else {
                    1.0
                }
            }
        };
        let mut gram = sq.map(|v| (-v / (2.0 * h2)).exp());
        for i in 0..k {
            gram[(i, i)] += self.eta;
        }
        let eig = SymmetricEigen::new(gram.clone());
        let mut order: Vec<usize> = (0..k).collect();
        order.sort_by(|&a, &b| eig.eigenvalues[b].total_cmp(&eig.eigenvalues[a]));
        let total: f64 = eig.eigenvalues.iter().map(|v| v.max(0.0)).sum();
        let mut kept = Vec::new();
        let mut acc = 0.0;
        for &j in &order {
            let l = eig.eigenvalues[j];
            if l <= 1e-12 * total {
                break;
            }
            kept.push(j);
            acc += l;
            if acc >= self.threshold * total {
                break;
            }
        }
        let kf = k as f64;
        // Ψ (K × J) at the samples; S_k = Σ_m k_mk (x_m − x_k) (K × D).
        let u = DMatrix::from_fn(k, kept.len(), |i, c| eig.eigenvectors[(i, kept[c])]);
        let lam: Vec<f64> = kept.iter().map(|&j| eig.eigenvalues[j]).collect();
        let mut psi = &gram * &u;
        for (c, mut col) in psi.column_iter_mut().enumerate() {
            col *= kf.sqrt() / lam[c];
        }
        let kx = &gram * samples;
        let rowsum: Vec<f64> = gram.row_iter().map(|r| r.sum()).collect();
        let s = DMatrix::from_fn(k, d, |i, c| kx[(i, c)] - rowsum[i] * samples[(i, c)]);
        // β_j = −(1/K) Σ_m ∇ψ_j(x_m) = (1/K)(√K/(λ_j h²)) Σ_k u_kj S_k.
        let mut beta = u.transpose() * s;
        for (c, mut row) in beta.row_iter_mut().enumerate() {
            row *= kf.sqrt() / (lam[c] * h2 * kf);
        }
        Ok(psi * beta)
    }
}

fn squared_distances(x: &DMatrix<f64>) -> DMatrix<f64> {
    let norms: Vec<f64> = x.row_iter().map(|r| r.norm_squared()).collect();
    let g = x * x.transpose();
    DMatrix::from_fn(x.nrows(), x.nrows(), |i, j| (norms[i] + norms[j] - 2.0 * g[(i, j)]).max(0.0))
}
