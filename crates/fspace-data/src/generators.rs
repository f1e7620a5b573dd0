//! The papers' synthetic data, generated exactly as described.

use fspace_input::InputError;
use nalgebra::{DMatrix, DVector};
use rand::{Rng, RngCore};
use rand_distr::{Distribution, Normal};

use crate::error::{DataError, Result};
use crate::preprocess::Standardizer;

/// Inputs and targets of a regression or classification task.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    /// Inputs, `n × d`.
    pub x: DMatrix<f64>,
    /// Targets, `n × t` (`t = 1` for scalar regression and class labels).
    pub y: DMatrix<f64>,
    /// Names of the input columns.
    pub feature_names: Vec<String>,
    /// Names of the target columns.
    pub target_names: Vec<String>,
}

impl Dataset {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.x.nrows()
    }
    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.x.nrows() == 0
    }
    /// The first target column as a vector.
    pub fn y_vec(&self) -> DVector<f64> {
        self.y.column(0).into_owned()
    }
    /// The rows `idx`.
    pub fn select(&self, idx: &[usize]) -> Dataset {
        Dataset {
            x: self.x.select_rows(idx),
            y: self.y.select_rows(idx),
            feature_names: self.feature_names.clone(),
            target_names: self.target_names.clone(),
        }
    }
}

fn names(prefix: &str, d: usize) -> Vec<String> {
    (0..d).map(|i| format!("{prefix}{i}")).collect()
}

fn nonzero(n: usize) -> Result<()> {
    if n == 0 {
        Err(DataError::Input(InputError::Invalid { what: "n", reason: "must be ≥ 1".into() }))
    } else {
        Ok(())
    }
}

fn noise(sigma: f64) -> Result<Normal<f64>> {
    if !(sigma.is_finite() && sigma >= 0.0) {
        return Err(DataError::Input(InputError::Invalid {
            what: "noise σ",
            reason: format!("{sigma} must be finite and ≥ 0"),
        }));
    }
    Normal::new(0.0, sigma)
        .map_err(|e| DataError::Input(InputError::Invalid { what: "noise σ", reason: e.to_string() }))
}

/// FSP-Laplace App. B.1 toy regression: `x ~ U([−1, −0.5] ∪ [0.5, 1])`, `y = sin(2πx) + ε`,
/// `ε ~ N(0, σ²)` (σ = 0.1 in the paper).
pub fn sine(n: usize, sigma: f64, rng: &mut dyn RngCore) -> Result<Dataset> {
    nonzero(n)?;
    let eps = noise(sigma)?;
    let x = DMatrix::from_fn(n, 1, |_, _| {
        let u: f64 = rng.gen_range(0.5..1.0);
        if rng.gen::<bool>() {
            u
        } else {
            -u
        }
    });
    let y = DMatrix::from_fn(n, 1, |i, _| (std::f64::consts::TAU * x[(i, 0)]).sin() + eps.sample(rng));
    Ok(Dataset { x, y, feature_names: vec!["x".into()], target_names: vec!["y".into()] })
}

/// The generalised-Laplace paper's cubic toy: `x ~ U(−4, 4)`, `y = x³ + ε`, `ε ~ N(0, 9)`.
pub fn cubic(n: usize, rng: &mut dyn RngCore) -> Result<Dataset> {
    nonzero(n)?;
    let eps = noise(3.0)?;
    let x: DMatrix<f64> = DMatrix::from_fn(n, 1, |_, _| rng.gen_range(-4.0..4.0));
    let y = DMatrix::from_fn(n, 1, |i, _| x[(i, 0)].powi(3) + eps.sample(rng));
    Ok(Dataset { x, y, feature_names: vec!["x".into()], target_names: vec!["y".into()] })
}

/// Two interleaving half-circles by scikit-learn's `make_moons` algorithm (`n/2` outer points
/// with label 0 on `(cos t, sin t)`, the rest inner with label 1 on `(1 − cos t, ½ − sin t)`,
/// `t` evenly spaced in `[0, π]`, shuffled, plus `N(0, noise²)` jitter; the papers use 0.1),
/// then standardised per feature. Returns the data and the fitted standardiser.
pub fn two_moons(n: usize, noise_sd: f64, rng: &mut dyn RngCore) -> Result<(Dataset, Standardizer)> {
    if n < 2 {
        return Err(DataError::Input(InputError::Invalid {
            what: "n",
            reason: "two moons need n ≥ 2".into(),
        }));
    }
    let eps = noise(noise_sd)?;
    let (n_out, n_in) = (n / 2, n - n / 2);
    let lin =
        |m: usize, k: usize| if m == 1 { 0.0 } else { std::f64::consts::PI * k as f64 / (m - 1) as f64 };
    let mut rows: Vec<(f64, f64, f64)> = (0..n_out)
        .map(|k| (lin(n_out, k).cos(), lin(n_out, k).sin(), 0.0))
        .chain((0..n_in).map(|k| (1.0 - lin(n_in, k).cos(), 0.5 - lin(n_in, k).sin(), 1.0)))
        .collect();
    rand::seq::SliceRandom::shuffle(rows.as_mut_slice(), rng);
    let x = DMatrix::from_fn(n, 2, |i, j| (if j == 0 { rows[i].0 } else { rows[i].1 }) + eps.sample(rng));
    let y = DMatrix::from_fn(n, 1, |i, _| rows[i].2);
    let scaler = Standardizer::fit(&x)?;
    let x = scaler.transform(&x)?;
    Ok((Dataset { x, y, feature_names: names("x", 2), target_names: vec!["label".into()] }, scaler))
}

/// The Gulf of Mexico box of FSP-Laplace App. B.2: longitude [−90.8, −83.8], latitude [24.0, 27.5].
pub const GULF_BOX: ([f64; 2], [f64; 2]) = ([-90.8, 24.0], [-83.8, 27.5]);

/// Our synthetic ocean-current field on [`GULF_BOX`] (the paper uses GLAD drifter data, which no
/// registry ships). `f = ∇Φ + rot Ψ` with `rot Ψ = (∂Ψ/∂x₂, −∂Ψ/∂x₁)` and closed-form
/// potentials (coordinates in degrees, velocities in m/s-like units):
///
/// * stream function `Ψ = A exp(−‖x − c_e‖²/2r_e²) + B tanh((x₂ − 26 − 0.3 sin(1.2 x₁))/0.5)`:
///   an anticyclonic eddy (`A = −0.6`, `c_e = (−87.5, 25.6)`, `r_e = 0.8`) shed from a
///   meandering eastward jet (`B = 0.25`), like the Loop Current;
/// * potential `Φ = C exp(−‖x − c_s‖²/2r_s²)` (`C = 0.08`, `c_s = (−89.5, 26.8)`, `r_s = 0.6`):
///   a weak divergent source (river outflow / upwelling), so the field is not divergence-free.
///
/// Returns the velocity and its curl-free and divergence-free parts at each point (`n × 2`).
pub fn ocean_current_field(x: &DMatrix<f64>) -> Result<(DMatrix<f64>, DMatrix<f64>, DMatrix<f64>)> {
    if x.ncols() != 2 {
        return Err(DataError::Input(InputError::Invalid {
            what: "points",
            reason: format!("need 2 columns, got {}", x.ncols()),
        }));
    }
    if x.iter().any(|v| !v.is_finite()) {
        return Err(DataError::Input(InputError::Invalid {
            what: "points",
            reason: "non-finite coordinate".into(),
        }));
    }
    let n = x.nrows();
    let (mut curl_free, mut div_free) = (DMatrix::zeros(n, 2), DMatrix::zeros(n, 2));
    for i in 0..n {
        let (x1, x2) = (x[(i, 0)], x[(i, 1)]);
        // Φ: Gaussian source. ∇Φ = −Φ (x − c)/r².
        let (c1, c2, r2, big_c) = (-89.5, 26.8, 0.36, 0.08);
        let phi = big_c * (-((x1 - c1).powi(2) + (x2 - c2).powi(2)) / (2.0 * r2)).exp();
        curl_free[(i, 0)] = -phi * (x1 - c1) / r2;
        curl_free[(i, 1)] = -phi * (x2 - c2) / r2;
        // Ψ: eddy + jet. ∂Ψ/∂x₁ and ∂Ψ/∂x₂.
        let (e1, e2, re2, a) = (-87.5, 25.6, 0.64, -0.6);
        let eddy = a * (-((x1 - e1).powi(2) + (x2 - e2).powi(2)) / (2.0 * re2)).exp();
        let (d1_eddy, d2_eddy) = (-eddy * (x1 - e1) / re2, -eddy * (x2 - e2) / re2);
        let b = 0.25;
        let s = (x2 - 26.0 - 0.3 * (1.2 * x1).sin()) / 0.5;
        let sech2 = 1.0 - s.tanh().powi(2);
        let (d1_jet, d2_jet) = (b * sech2 * (-0.3 * 1.2 * (1.2 * x1).cos()) / 0.5, b * sech2 / 0.5);
        div_free[(i, 0)] = d2_eddy + d2_jet;
        div_free[(i, 1)] = -(d1_eddy + d1_jet);
    }
    Ok((&curl_free + &div_free, curl_free, div_free))
}

/// The ocean-current task mirroring FSP-Laplace App. B.2: `n_train` (20 in the paper) noisy
/// velocities at uniform locations in [`GULF_BOX`] (noise σ per component), and the noise-free
/// field on a `34 × 16` test grid (longitude-major).
pub fn ocean_current(n_train: usize, sigma: f64, rng: &mut dyn RngCore) -> Result<(Dataset, Dataset)> {
    nonzero(n_train)?;
    let eps = noise(sigma)?;
    let (lo, hi) = GULF_BOX;
    let x = DMatrix::from_fn(n_train, 2, |_, j| rng.gen_range(lo[j]..hi[j]));
    let (v, _, _) = ocean_current_field(&x)?;
    let y = v.map(|u| u + eps.sample(rng));
    let (gx, gy) = (34usize, 16usize);
    let grid = DMatrix::from_fn(gx * gy, 2, |i, j| {
        let (k, m) = if j == 0 { (i / gy, gx) } else { (i % gy, gy) };
        lo[j] + (hi[j] - lo[j]) * k as f64 / (m - 1) as f64
    });
    let (v_test, _, _) = ocean_current_field(&grid)?;
    let names_x = vec!["longitude".to_string(), "latitude".to_string()];
    let names_y = vec!["u".to_string(), "v".to_string()];
    Ok((
        Dataset { x, y, feature_names: names_x.clone(), target_names: names_y.clone() },
        Dataset { x: grid, y: v_test, feature_names: names_x, target_names: names_y },
    ))
}
