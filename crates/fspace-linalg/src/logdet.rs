//! Log-determinants of SPD operators by stochastic Lanczos quadrature (Ubaru, Chen & Saad
//! 2017): `log det A = tr log A ≈ (1/N) Σₚ ‖zₚ‖² Σₖ τₖ² log θₖ`, with Rademacher probes `zₚ` and
//! `(θₖ, τₖ)` the eigenvalues and first eigenvector components of the `m`-step Lanczos
//! tridiagonal started at `zₚ/‖zₚ‖`. Exact log-determinants of dense matrices come from
//! [`cholesky_jitter`](crate::cholesky_jitter).

use fspace_input::InputError;
use nalgebra::DVector;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

use crate::dense::sym_eigh_desc;
use crate::error::{LinalgError, Result};
use crate::lanczos::{lanczos, LanczosConfig, StartVector};
use crate::operator::LinearOperator;

/// Options of SLQ.
///
/// | name | default | purpose |
/// |---|---|---|
/// | `probes` | 30 | Rademacher probe vectors |
/// | `steps` | 30 | Lanczos steps per probe |
/// | `seed` | 0 | probe seed |
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlqConfig {
    /// Number of probes (≥ 2, for a standard error).
    pub probes: usize,
    /// Lanczos steps per probe (≥ 1).
    pub steps: usize,
    /// Seed of the probes.
    pub seed: u64,
}

impl Default for SlqConfig {
    fn default() -> Self {
        Self { probes: 30, steps: 30, seed: 0 }
    }
}

/// An SLQ estimate with its Monte-Carlo standard error.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlqEstimate {
    /// The estimate of `log det A`.
    pub value: f64,
    /// Standard error of the mean over probes.
    pub std_error: f64,
}

/// Estimates `log det A` for an SPD operator. Probes run in parallel; the result is
/// deterministic for a seed. Errors if a Ritz value is ≤ 0 (`NotPositiveDefinite`).
pub fn slq_logdet(op: &dyn LinearOperator, config: &SlqConfig) -> Result<SlqEstimate> {
    let n = op.dim();
    if config.probes < 2 || config.steps == 0 || n == 0 {
        return Err(LinalgError::Input(InputError::Invalid {
            what: "slq config",
            reason: format!(
                "needs probes ≥ 2, steps ≥ 1, n ≥ 1 (got {}, {}, {n})",
                config.probes, config.steps
            ),
        }));
    }
    let samples: Vec<f64> = (0..config.probes)
        .into_par_iter()
        .map(|p| {
            let mut rng = StdRng::seed_from_u64(config.seed.wrapping_mul(1_000_003).wrapping_add(p as u64));
            let z = DVector::from_fn(n, |_, _| if rng.gen::<bool>() { 1.0 } else { -1.0 });
            let cfg = LanczosConfig {
                max_rank: config.steps,
                start: StartVector::Given(z),
                check_symmetry: p == 0,
                pivot_tol: 0.0,
                project_start: false,
                ..LanczosConfig::default()
            };
            let dec = lanczos(op, &cfg)?;
            let (theta, w) = sym_eigh_desc(&dec.tridiagonal())?;
            if let Some(&bad) = theta.iter().find(|&&t| t <= 0.0) {
                return Err(LinalgError::NotPositiveDefinite {
                    what: "slq operator (Ritz value)",
                    value: bad,
                });
            }
            Ok(n as f64 * (0..theta.len()).map(|k| w[(0, k)].powi(2) * theta[k].ln()).sum::<f64>())
        })
        .collect::<Result<_>>()?;
    let m = samples.len() as f64;
    let mean = samples.iter().sum::<f64>() / m;
    let var = samples.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / (m - 1.0);
    Ok(SlqEstimate { value: mean, std_error: (var / m).sqrt() })
}
