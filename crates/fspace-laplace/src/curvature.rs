//! Curvature structures: the posterior precision `P = T·C + Λ` of each, in the structure's own
//! parameter coordinates (`0..dim`; the posterior maps them to flat network indices).
//!
//! `C` approximates the generalised Gauss–Newton matrix `GGN = Σᵢ J(xᵢ)ᵀ Hᵢ J(xᵢ)` (summed over
//! the data, not averaged), `T` is the temperature, `Λ = diag(λ)` the prior precision (one value
//! per parameter here; the posterior expands per-layer values).
//!
//! | structure | `C` | stored | `P⁻¹ v`, `log|P|`, sample |
//! |---|---|---|---|
//! | [`EigenCurvature`] (full, last-layer, low-rank) | `V diag(s) Vᵀ (+ diag(r))` | `dim × r` | `O(dim·r)`; Woodbury for non-isotropic `Λ` or a remainder |
//! | [`DiagCurvature`] | `diag(d)` | `dim` | `O(dim)` |
//! | [`BlockDiagCurvature`] | one dense block per layer | `Σ block²` | per block |
//! | [`KronCurvature`] (KFAC, EKFAC) | per layer `(Q_G ⊗ Q_A) diag(E) (Q_G ⊗ Q_A)ᵀ` | `Σ fan_in² + fan_out²` | two small GEMMs per side |
//! | [`SampleCurvature`] (sampled) | none: `P⁻¹ ≈ Z Zᵀ / K` from `K` draws at one `(T, λ)` | `dim × K` | `O(dim·K)`; no `log|P|` |

use fspace_input::InputError;
use nalgebra::{DMatrix, DVector};
use rand::RngCore;
use rand_distr::{Distribution, StandardNormal};
use serde::{Deserialize, Serialize};

use crate::error::{LaplaceError, Result};
use fspace_core::{LoadCheck, PersistError};
use fspace_nn::{LayerInfo, LayerKind};

pub(crate) fn randn(r: usize, c: usize, rng: &mut dyn RngCore) -> DMatrix<f64> {
    DMatrix::from_fn(r, c, |_, _| StandardNormal.sample(rng))
}

/// What every curvature structure provides, in its own coordinates `0..dim`.
pub trait CurvatureApprox {
    /// Structure name (`full`, `kfac`, …).
    fn name(&self) -> &'static str;
    /// Number of parameters the structure covers.
    fn dim(&self) -> usize;
    /// `log |T·C + diag(lam)|`.
    fn log_det_precision(&self, t: f64, lam: &DVector<f64>) -> Result<f64>;
    /// `(T·C + diag(lam))⁻¹ V` for a `dim × m` block.
    fn solve(&self, t: f64, lam: &DVector<f64>, v: &DMatrix<f64>) -> Result<DMatrix<f64>>;
    /// `s` draws (`dim × s`) from `N(0, (T·C + diag(lam))⁻¹)`, never forming `dim × dim`
    /// where the structure avoids it.
    fn sample(&self, t: f64, lam: &DVector<f64>, s: usize, rng: &mut dyn RngCore) -> Result<DMatrix<f64>>;
    /// `C` as a dense matrix (for tests and small models).
    fn to_dense(&self) -> DMatrix<f64>;
}

/// `C = V diag(s) Vᵀ + diag(r)` with orthonormal `V` (`dim × k`), `s ≥ 0` and an optional
/// diagonal remainder `r ≥ 0`. Full GGN (`k = rank`, from a thin SVD of the whitened Jacobian or
/// a dense eigendecomposition), last-layer GGN (dense eigendecomposition) and low-rank GGN
/// (Lanczos top-`k`) all use it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EigenCurvature {
    /// Name reported by [`CurvatureApprox::name`].
    pub label: String,
    /// Orthonormal eigenvectors `V` (`dim × k`).
    pub vectors: DMatrix<f64>,
    /// Eigenvalues `s` (descending, clamped at 0).
    pub values: DVector<f64>,
    /// Optional diagonal remainder `r` (`dim`).
    pub remainder: Option<DVector<f64>>,
}

/// The Woodbury pieces of `P = B + V D Vᵀ` with diagonal `B` and `D = T·diag(s₊)`:
/// `M = I + D^{1/2} Vᵀ B⁻¹ V D^{1/2}` (Cholesky factor) and `W = B⁻¹ V D^{1/2}`.
struct Woodbury {
    base: DVector<f64>,
    w: DMatrix<f64>,
    chol: nalgebra::Cholesky<f64, nalgebra::Dyn>,
}

impl EigenCurvature {
    fn isotropic(&self, lam: &DVector<f64>) -> Option<f64> {
        let l0 = lam[0];
        (self.remainder.is_none() && lam.iter().all(|&l| l == l0)).then_some(l0)
    }

    fn woodbury(&self, t: f64, lam: &DVector<f64>) -> Result<Woodbury> {
        let base = match &self.remainder {
            Some(r) => r * t + lam,
            None => lam.clone(),
        };
        let mut w = self.vectors.clone();
        for (j, mut col) in w.column_iter_mut().enumerate() {
            let d = (t * self.values[j].max(0.0)).sqrt();
            for (i, x) in col.iter_mut().enumerate() {
                *x *= d / base[i];
            }
        }
        // M = I + D^{1/2} Vᵀ B⁻¹ V D^{1/2} = I + (V D^{1/2})ᵀ W.
        let mut vd = self.vectors.clone();
        for (j, mut col) in vd.column_iter_mut().enumerate() {
            col *= (t * self.values[j].max(0.0)).sqrt();
        }
        let m = DMatrix::identity(w.ncols(), w.ncols()) + vd.transpose() * &w;
        let chol = m.cholesky().ok_or(LaplaceError::Linalg(fspace_linalg::LinalgError::CholeskyFailed {
            what: "Woodbury capacitance matrix I + D^½VᵀB⁻¹VD^½ of the posterior precision",
            max_jitter: 0.0,
        }))?;
        Ok(Woodbury { base, w, chol })
    }
}

impl Woodbury {
    fn solve(&self, v: &DMatrix<f64>) -> DMatrix<f64> {
        let mut bv = v.clone();
        for mut col in bv.column_iter_mut() {
            col.component_div_assign(&self.base);
        }
        // P⁻¹ v = B⁻¹v − W M⁻¹ Wᵀ v·… with W = B⁻¹ V D^{1/2}: Wᵀ v = D^{1/2} Vᵀ B⁻¹ v.
        let inner = self.chol.solve(&(self.w.transpose() * v));
        bv - &self.w * inner
    }
}

impl CurvatureApprox for EigenCurvature {
    fn name(&self) -> &'static str {
        match self.label.as_str() {
            "full" => "full",
            "last_layer" => "last_layer",
            _ => "low_rank",
        }
    }
    fn dim(&self) -> usize {
        self.vectors.nrows()
    }
    fn log_det_precision(&self, t: f64, lam: &DVector<f64>) -> Result<f64> {
        if let Some(l) = self.isotropic(lam) {
            let k = self.values.len();
            return Ok(self.values.iter().map(|s| (t * s.max(0.0) + l).ln()).sum::<f64>()
                + (self.dim() - k) as f64 * l.ln());
        }
        let wb = self.woodbury(t, lam)?;
        let logdet_m: f64 = 2.0 * wb.chol.l().diagonal().iter().map(|d| d.ln()).sum::<f64>();
        Ok(wb.base.iter().map(|b| b.ln()).sum::<f64>() + logdet_m)
    }
    fn solve(&self, t: f64, lam: &DVector<f64>, v: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        if let Some(l) = self.isotropic(lam) {
            // P⁻¹ = V diag(1/(Ts + λ) − 1/λ) Vᵀ + I/λ.
            let mut c = self.vectors.transpose() * v;
            for (j, mut row) in c.row_iter_mut().enumerate() {
                row *= 1.0 / (t * self.values[j].max(0.0) + l) - 1.0 / l;
            }
            return Ok(&self.vectors * c + v / l);
        }
        Ok(self.woodbury(t, lam)?.solve(v))
    }
    fn sample(&self, t: f64, lam: &DVector<f64>, s: usize, rng: &mut dyn RngCore) -> Result<DMatrix<f64>> {
        let z = randn(self.dim(), s, rng);
        if let Some(l) = self.isotropic(lam) {
            // P^{-1/2} z = V diag((Ts + λ)^{-1/2} − λ^{-1/2}) Vᵀ z + z/√λ.
            let mut c = self.vectors.transpose() * &z;
            for (j, mut row) in c.row_iter_mut().enumerate() {
                row *= 1.0 / (t * self.values[j].max(0.0) + l).sqrt() - 1.0 / l.sqrt();
            }
            return Ok(&self.vectors * c + z / l.sqrt());
        }
        // Perturb and solve: b = B^{1/2} z₁ + V (T s)^{1/2} z₂ ~ N(0, P), so P⁻¹ b ~ N(0, P⁻¹).
        let wb = self.woodbury(t, lam)?;
        let mut b = z;
        for mut col in b.column_iter_mut() {
            col.component_mul_assign(&wb.base.map(f64::sqrt));
        }
        let mut z2 = randn(self.values.len(), s, rng);
        for (j, mut row) in z2.row_iter_mut().enumerate() {
            row *= (t * self.values[j].max(0.0)).sqrt();
        }
        b += &self.vectors * z2;
        Ok(wb.solve(&b))
    }
    fn to_dense(&self) -> DMatrix<f64> {
        let mut vs = self.vectors.clone();
        for (j, mut col) in vs.column_iter_mut().enumerate() {
            col *= self.values[j];
        }
        let mut c = vs * self.vectors.transpose();
        if let Some(r) = &self.remainder {
            for i in 0..r.len() {
                c[(i, i)] += r[i];
            }
        }
        c
    }
}

/// `C = diag(d)`: the GGN's diagonal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiagCurvature {
    /// The diagonal `d` (`dim`, ≥ 0).
    pub diag: DVector<f64>,
}

impl CurvatureApprox for DiagCurvature {
    fn name(&self) -> &'static str {
        "diag"
    }
    fn dim(&self) -> usize {
        self.diag.len()
    }
    fn log_det_precision(&self, t: f64, lam: &DVector<f64>) -> Result<f64> {
        Ok(self.diag.iter().zip(lam.iter()).map(|(d, l)| (t * d + l).ln()).sum())
    }
    fn solve(&self, t: f64, lam: &DVector<f64>, v: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        let p = &self.diag * t + lam;
        let mut out = v.clone();
        for mut col in out.column_iter_mut() {
            col.component_div_assign(&p);
        }
        Ok(out)
    }
    fn sample(&self, t: f64, lam: &DVector<f64>, s: usize, rng: &mut dyn RngCore) -> Result<DMatrix<f64>> {
        let sd = (&self.diag * t + lam).map(|p| 1.0 / p.sqrt());
        let mut z = randn(self.dim(), s, rng);
        for mut col in z.column_iter_mut() {
            col.component_mul_assign(&sd);
        }
        Ok(z)
    }
    fn to_dense(&self) -> DMatrix<f64> {
        DMatrix::from_diagonal(&self.diag)
    }
}

/// One dense GGN block per layer (B-Diag), each stored by its complete eigendecomposition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockDiagCurvature {
    /// `(offset, block)`: the block covers coordinates `offset..offset + block.dim()`.
    pub blocks: Vec<(usize, EigenCurvature)>,
}

impl BlockDiagCurvature {
    fn lam_of(lam: &DVector<f64>, offset: usize, len: usize) -> DVector<f64> {
        lam.rows(offset, len).into_owned()
    }
}

impl CurvatureApprox for BlockDiagCurvature {
    fn name(&self) -> &'static str {
        "block_diag"
    }
    fn dim(&self) -> usize {
        self.blocks.iter().map(|(_, b)| b.dim()).sum()
    }
    fn log_det_precision(&self, t: f64, lam: &DVector<f64>) -> Result<f64> {
        self.blocks.iter().map(|(o, b)| b.log_det_precision(t, &Self::lam_of(lam, *o, b.dim()))).sum()
    }
    fn solve(&self, t: f64, lam: &DVector<f64>, v: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        let mut out = DMatrix::zeros(v.nrows(), v.ncols());
        for (o, b) in &self.blocks {
            let part = b.solve(t, &Self::lam_of(lam, *o, b.dim()), &v.rows(*o, b.dim()).into_owned())?;
            out.rows_mut(*o, b.dim()).copy_from(&part);
        }
        Ok(out)
    }
    fn sample(&self, t: f64, lam: &DVector<f64>, s: usize, rng: &mut dyn RngCore) -> Result<DMatrix<f64>> {
        let mut out = DMatrix::zeros(self.dim(), s);
        for (o, b) in &self.blocks {
            let part = b.sample(t, &Self::lam_of(lam, *o, b.dim()), s, rng)?;
            out.rows_mut(*o, b.dim()).copy_from(&part);
        }
        Ok(out)
    }
    fn to_dense(&self) -> DMatrix<f64> {
        let n = self.dim();
        let mut c = DMatrix::zeros(n, n);
        for (o, b) in &self.blocks {
            c.view_mut((*o, *o), (b.dim(), b.dim())).copy_from(&b.to_dense());
        }
        c
    }
}

/// One layer of a Kronecker-factored curvature, in `[W | b]` row-major coordinates
/// (`r·(fan_in + 1) + j`): `C = (Q_G ⊗ Q_A) diag(vec E) (Q_G ⊗ Q_A)ᵀ` with `E = g aᵀ` (KFAC:
/// the factors' eigenvalues) or `E` re-fitted to the per-example curvature (EKFAC).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KronLayer {
    /// Eigenvalues of the input factor `A` (the layer's width: `fan_in + 1`, or `fan_in`
    /// without a bias).
    pub a_values: DVector<f64>,
    /// Eigenvectors of `A`.
    pub a_vectors: DMatrix<f64>,
    /// Eigenvalues of the output-gradient factor `G` (`fan_out`).
    pub g_values: DVector<f64>,
    /// Eigenvectors of `G`.
    pub g_vectors: DMatrix<f64>,
    /// EKFAC's re-fitted eigenvalues (`fan_out × (fan_in + 1)`); `None` for KFAC.
    pub fitted: Option<DMatrix<f64>>,
}

impl KronLayer {
    /// Rows `fan_out` and columns `fan_in + 1` of the layer's coordinate matrix.
    pub fn shape(&self) -> (usize, usize) {
        (self.g_values.len(), self.a_values.len())
    }

    /// The curvature's eigenvalues `E` (`fan_out × (fan_in + 1)`).
    pub fn eigenvalues(&self) -> DMatrix<f64> {
        match &self.fitted {
            Some(e) => e.clone(),
            None => &self.g_values * self.a_values.transpose(),
        }
    }

    /// The precision's eigenvalues `T·E_{rj} + λ_j`, with `λ_j` the prior precision of the
    /// input factor's eigenvector `j` ([`column_lambdas`](Self::column_lambdas)).
    pub(crate) fn precision_eigenvalues(&self, t: f64, lam: &DVector<f64>) -> DMatrix<f64> {
        let e = self.eigenvalues();
        DMatrix::from_fn(e.nrows(), e.ncols(), |r, j| t * e[(r, j)].max(0.0) + lam[j])
    }

    /// The prior precision each eigenvector of the input factor sees, from `lam` (λ of this
    /// layer's `fan_out × (fan_in + 1)` coordinates, row-major). `T·C + diag(λ)` keeps the
    /// Kronecker eigenbasis when λ is one value over the layer, or — a prior per parameter
    /// tensor with the bias in its own block — one value over the weight and one over the bias:
    /// λ constant down each input column and over each eigenvector's support. Anything finer is
    /// refused (`InputError::Invalid`).
    pub(crate) fn column_lambdas(&self, lam: &[f64]) -> Result<DVector<f64>> {
        let (r, c) = self.shape();
        let l0 = lam[0];
        if lam.iter().all(|&l| l == l0) {
            return Ok(DVector::from_element(c, l0));
        }
        let refuse = || {
            LaplaceError::Input(InputError::Invalid {
                what: "prior precision",
                reason:
                    "Kronecker-factored curvature takes one prior precision per layer, or one for its \
                         weight and one for its bias when the bias is a separate block (kron_bias = Separate)"
                        .into(),
            })
        };
        if (1..r).any(|i| (0..c).any(|j| lam[i * c + j] != lam[j])) {
            return Err(refuse());
        }
        let mut out = DVector::from_element(c, l0);
        for k in 0..c {
            let mut seen: Option<f64> = None;
            for (j, &v) in self.a_vectors.column(k).iter().enumerate() {
                if v != 0.0 {
                    match seen {
                        None => seen = Some(lam[j]),
                        Some(l) if l != lam[j] => return Err(refuse()),
                        Some(_) => {}
                    }
                }
            }
            out[k] = seen.unwrap_or(l0);
        }
        Ok(out)
    }

    /// For each eigenvalue of [`eigenvalues`](Self::eigenvalues) in column-major order, a
    /// coordinate of the layer (row-major) whose λ is the one that eigenvalue's precision adds
    /// (the largest entry of its input-factor eigenvector, first row).
    fn eigenvalue_owners(&self) -> Vec<usize> {
        let (r, c) = self.shape();
        let support: Vec<usize> = (0..c).map(|k| self.a_vectors.column(k).iamax()).collect();
        (0..r * c).map(|m| support[m / r]).collect()
    }
}

/// Kronecker-factored curvature (KFAC, or EKFAC when the layers carry fitted eigenvalues),
/// layers laid out one after the other.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KronCurvature {
    /// Per layer.
    pub layers: Vec<KronLayer>,
    /// The network layer (in `Network::layer_infos` order) of each entry of `layers`; empty:
    /// every layer, in order. The other layers' weights stay at their MAP values.
    #[serde(default)]
    pub network_layers: Vec<usize>,
}

impl KronCurvature {
    /// Whether it covers the last of a network's `layers` layers alone (last-layer KFAC /
    /// EKFAC).
    pub(crate) fn covers_last_layer_only(&self, layers: usize) -> bool {
        layers > 0 && self.network_layers == [layers - 1]
    }

    fn offsets(&self) -> Vec<usize> {
        let mut o = 0;
        self.layers
            .iter()
            .map(|l| {
                let here = o;
                let (r, c) = l.shape();
                o += r * c;
                here
            })
            .collect()
    }

    /// The λ of each input-factor eigenvector of the layer at `offset` (see
    /// [`KronLayer::column_lambdas`]).
    pub(crate) fn layer_lambdas(
        layer: &KronLayer,
        lam: &DVector<f64>,
        offset: usize,
    ) -> Result<DVector<f64>> {
        let (r, c) = layer.shape();
        layer.column_lambdas(&lam.as_slice()[offset..offset + r * c])
    }

    /// Whether this is EKFAC.
    pub fn is_ekfac(&self) -> bool {
        self.layers.first().is_some_and(|l| l.fitted.is_some())
    }
}

impl CurvatureApprox for KronCurvature {
    fn name(&self) -> &'static str {
        if self.is_ekfac() {
            "ekfac"
        } else {
            "kfac"
        }
    }
    fn dim(&self) -> usize {
        self.layers.iter().map(|l| l.shape().0 * l.shape().1).sum()
    }
    fn log_det_precision(&self, t: f64, lam: &DVector<f64>) -> Result<f64> {
        let mut total = 0.0;
        for (layer, o) in self.layers.iter().zip(self.offsets()) {
            let l = Self::layer_lambdas(layer, lam, o)?;
            total += layer.precision_eigenvalues(t, &l).iter().map(|e| e.ln()).sum::<f64>();
        }
        Ok(total)
    }
    fn solve(&self, t: f64, lam: &DVector<f64>, v: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        // Per layer, the k columns' r × c blocks Vₘ go through G (Gᵀ Vₘ A ⊘ E) Aᵀ together: side by
        // side (r × k·c) for the products with G, stacked (k·r × c) for those with A — four
        // products per layer instead of four per column.
        let k = v.ncols();
        let mut out = DMatrix::zeros(v.nrows(), k);
        for (layer, o) in self.layers.iter().zip(self.offsets()) {
            let (r, c) = layer.shape();
            let e = layer.precision_eigenvalues(t, &Self::layer_lambdas(layer, lam, o)?);
            let side = DMatrix::from_fn(r, k * c, |i, col| v[(o + i * c + col % c, col / c)]);
            let left = layer.g_vectors.transpose() * side;
            let stacked = DMatrix::from_fn(k * r, c, |row, j| left[(row % r, (row / r) * c + j)]);
            let mut rot = stacked * &layer.a_vectors;
            for j in 0..c {
                for row in 0..k * r {
                    rot[(row, j)] /= e[(row % r, j)];
                }
            }
            let side = DMatrix::from_fn(r, k * c, |i, col| rot[((col / c) * r + i, col % c)]);
            let back_left = &layer.g_vectors * side;
            let stacked = DMatrix::from_fn(k * r, c, |row, j| back_left[(row % r, (row / r) * c + j)]);
            let back = stacked * layer.a_vectors.transpose();
            for m in 0..k {
                for i in 0..r {
                    for j in 0..c {
                        out[(o + i * c + j, m)] = back[(m * r + i, j)];
                    }
                }
            }
        }
        Ok(out)
    }
    fn sample(&self, t: f64, lam: &DVector<f64>, s: usize, rng: &mut dyn RngCore) -> Result<DMatrix<f64>> {
        let mut out = DMatrix::zeros(self.dim(), s);
        for (layer, o) in self.layers.iter().zip(self.offsets()) {
            let (r, c) = layer.shape();
            let sd =
                layer.precision_eigenvalues(t, &Self::layer_lambdas(layer, lam, o)?).map(|e| 1.0 / e.sqrt());
            for m in 0..s {
                let z = randn(r, c, rng).component_mul(&sd);
                let back = &layer.g_vectors * z * layer.a_vectors.transpose();
                for i in 0..r {
                    for j in 0..c {
                        out[(o + i * c + j, m)] = back[(i, j)];
                    }
                }
            }
        }
        Ok(out)
    }
    fn to_dense(&self) -> DMatrix<f64> {
        let n = self.dim();
        let mut out = DMatrix::zeros(n, n);
        for (layer, o) in self.layers.iter().zip(self.offsets()) {
            let (r, c) = layer.shape();
            let q = layer.g_vectors.kronecker(&layer.a_vectors);
            let e = layer.eigenvalues();
            let mut qe = q.clone();
            for i in 0..r {
                for j in 0..c {
                    qe.column_mut(i * c + j).scale_mut(e[(i, j)]);
                }
            }
            out.view_mut((o, o), (r * c, r * c)).copy_from(&(qe * q.transpose()));
        }
        out
    }
}

/// `K` draws `zⱼ ~ N(0, (T·GGN + λI)⁻¹)` of the linearised posterior at one `(T, λ)`
/// (`crate::sampled`): the covariance is their second moment `Z Zᵀ / K`. Solves and samples
/// at any other `(T, λ)`, and the log-determinant, are errors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleCurvature {
    /// The draws, `p × K`.
    pub samples: DMatrix<f64>,
    /// `T` of the draws.
    pub temperature: f64,
    /// λ of the draws (EM's last value).
    pub prior_precision: f64,
}

/// A fitted curvature of any structure (serialisable; dispatches [`CurvatureApprox`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Curvature {
    /// Full, last-layer or low-rank GGN.
    Eigen(EigenCurvature),
    /// Diagonal GGN.
    Diag(DiagCurvature),
    /// Layer-block-diagonal GGN.
    BlockDiag(BlockDiagCurvature),
    /// KFAC or EKFAC.
    Kron(KronCurvature),
    /// Posterior draws (sampled linearised Laplace).
    Samples(SampleCurvature),
}

impl Curvature {
    fn inner(&self) -> &dyn CurvatureApprox {
        match self {
            Self::Eigen(c) => c,
            Self::Diag(c) => c,
            Self::BlockDiag(c) => c,
            Self::Kron(c) => c,
            Self::Samples(c) => c,
        }
    }

    /// For each of [`eigenvalues`](Self::eigenvalues), the curvature coordinate whose prior
    /// precision the precision's eigenvalue adds (`T·eᵢ + λ_{owner(i)}`), checked against the
    /// coordinates' λ: `Some` where `T·C + diag(λ)` keeps the stored eigenbasis — the diagonal
    /// structure for any λ, KFAC / EKFAC for a λ per layer or per parameter tensor (bias in its
    /// own block) — and `None` otherwise (a structure without eigenvalues, or an eigenbasis that
    /// a non-constant λ does not keep). With it the evidence stays `O(len)` and differentiable
    /// in λ beyond one λ.
    pub fn eigenvalue_owners(&self, lam: &DVector<f64>) -> Result<Option<Vec<usize>>> {
        Ok(match self {
            Self::Diag(d) => Some((0..d.diag.len()).collect()),
            Self::Kron(k) => {
                let mut owners = Vec::with_capacity(k.dim());
                for (layer, o) in k.layers.iter().zip(k.offsets()) {
                    KronCurvature::layer_lambdas(layer, lam, o)?;
                    owners.extend(layer.eigenvalue_owners().into_iter().map(|c| o + c));
                }
                Some(owners)
            }
            Self::Eigen(_) | Self::BlockDiag(_) | Self::Samples(_) => None,
        })
    }

    /// The eigenvalues of `C` (the curvature without temperature or prior), `None` where the
    /// structure holds none (the sampled structure) or `C` is not diagonal in a stored basis
    /// (a low-rank curvature with a diagonal remainder). The `dim − len` eigenvalues not listed
    /// are 0 (a low-rank or thin-SVD full curvature keeps only its non-zero ones). With one
    /// prior precision λ every structure's `log |T·C + λI| = Σ log(T·eᵢ + λ) + (dim − len)·log λ`:
    /// what a differentiable evidence (λ, σ, T as tensors) needs, `O(len)` per evaluation.
    pub fn eigenvalues(&self) -> Option<Vec<f64>> {
        match self {
            Self::Eigen(e) if e.remainder.is_none() => Some(e.values.iter().map(|v| v.max(0.0)).collect()),
            Self::Eigen(_) | Self::Samples(_) => None,
            Self::Diag(d) => Some(d.diag.iter().copied().collect()),
            Self::BlockDiag(b) => {
                let mut out = Vec::with_capacity(b.dim());
                for (_, block) in &b.blocks {
                    if block.remainder.is_some() {
                        return None;
                    }
                    out.extend(block.values.iter().map(|v| v.max(0.0)));
                }
                Some(out)
            }
            Self::Kron(k) => Some(
                k.layers
                    .iter()
                    .flat_map(|l| l.eigenvalues().iter().map(|e| e.max(0.0)).collect::<Vec<_>>())
                    .collect(),
            ),
        }
    }
}

impl CurvatureApprox for Curvature {
    fn name(&self) -> &'static str {
        self.inner().name()
    }
    fn dim(&self) -> usize {
        self.inner().dim()
    }
    fn log_det_precision(&self, t: f64, lam: &DVector<f64>) -> Result<f64> {
        self.inner().log_det_precision(t, lam)
    }
    fn solve(&self, t: f64, lam: &DVector<f64>, v: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.inner().solve(t, lam, v)
    }
    fn sample(&self, t: f64, lam: &DVector<f64>, s: usize, rng: &mut dyn RngCore) -> Result<DMatrix<f64>> {
        self.inner().sample(t, lam, s, rng)
    }
    fn to_dense(&self) -> DMatrix<f64> {
        self.inner().to_dense()
    }
}

/// The load checks of a saved curvature, against the network it belongs to (`p` parameters,
/// `infos` its layers) and the flat index of each curvature coordinate.
pub(crate) fn check_loaded(
    curvature: &Curvature,
    check: &LoadCheck,
    p: usize,
    infos: &[LayerInfo],
    indices: &[usize],
) -> std::result::Result<(), PersistError> {
    let field = |f: &str| format!("curvature.{f}");
    let dim = indices.len();
    match curvature {
        Curvature::Eigen(e) => {
            check_eigen(check, &field("Eigen"), e, dim)?;
            if e.label == "last_layer" {
                // The predictive takes this structure's Jacobian from the last layer's features.
                let last = infos.last().ok_or_else(|| {
                    check.invalid(field("Eigen.label"), "a last-layer curvature on a network without layers")
                })?;
                check.ensure(
                    last.kind == LayerKind::Dense && indices == last.kron_order().as_slice(),
                    "indices",
                    || format!("must be the last layer {}'s [W | b] coordinates", last.name),
                )?;
            }
        }
        Curvature::Diag(d) => {
            check.len(&field("Diag.diag"), d.diag.len(), dim)?;
            check.non_negative(&field("Diag.diag"), d.diag.iter())?;
            // All parameters in order (the layer-wise predictive reads the diagonal by flat
            // index), the last layer's [W | b] coordinates (DiagLLLaplace) or a subnetwork's
            // increasing indices (DiagSubnetLaplace).
            let last = infos.last().map(|l| l.kron_order());
            let increasing = indices.windows(2).all(|w| w[0] < w[1]);
            check.ensure(increasing || last.as_deref() == Some(indices), "indices", || {
                format!(
                    "a diagonal curvature covers increasing parameter indices (all {p}, or a subnetwork's) or the \
                     last layer's [W | b]"
                )
            })?;
        }
        Curvature::BlockDiag(b) => {
            let mut next = 0;
            for (k, (offset, block)) in b.blocks.iter().enumerate() {
                let f = field(&format!("BlockDiag.blocks[{k}]"));
                check.ensure(*offset == next, &f, || format!("starts at {offset}, must start at {next}"))?;
                check.ensure(block.dim() <= dim - next, &f, || format!("overruns the {dim} coordinates"))?;
                check_eigen(check, &f, block, block.dim())?;
                next += block.dim();
            }
            check.ensure(next == dim, &field("BlockDiag.blocks"), || {
                format!("cover {next} of {dim} coordinates")
            })?;
        }
        Curvature::Kron(k) => {
            let ids: Vec<usize> = if k.network_layers.is_empty() {
                (0..k.layers.len()).collect()
            } else {
                k.network_layers.clone()
            };
            check.len(&field("Kron.network_layers"), ids.len(), k.layers.len())?;
            let mut expected = Vec::new();
            for (j, (&l, layer)) in ids.iter().zip(&k.layers).enumerate() {
                let f = field(&format!("Kron.layers[{j}]"));
                let info = infos.get(l).ok_or_else(|| {
                    check.invalid(
                        field("Kron.network_layers"),
                        format!("layer {l} of a {}-layer network", infos.len()),
                    )
                })?;
                check.ensure(j == 0 || ids[j - 1] < l, &field("Kron.network_layers"), || {
                    "must be increasing".into()
                })?;
                let (r, c) = (info.fan_out, info.width());
                check.len(&format!("{f}.g_values"), layer.g_values.len(), r)?;
                check.shape(&format!("{f}.g_vectors"), layer.g_vectors.shape(), (r, r))?;
                check.len(&format!("{f}.a_values"), layer.a_values.len(), c)?;
                check.shape(&format!("{f}.a_vectors"), layer.a_vectors.shape(), (c, c))?;
                for (name, v) in
                    [("g_values", layer.g_values.as_slice()), ("a_values", layer.a_values.as_slice())]
                {
                    check.finite(&format!("{f}.{name}"), v)?;
                }
                // The factors' eigenvectors are orthonormal.
                check.unit_entries(&format!("{f}.g_vectors"), layer.g_vectors.iter())?;
                check.unit_entries(&format!("{f}.a_vectors"), layer.a_vectors.iter())?;
                // The factors are PSD (their eigenvalues are stored clipped at 0): a negative one
                // would flip the sign of a predictive variance.
                check.non_negative(&format!("{f}.g_values"), layer.g_values.iter())?;
                check.non_negative(&format!("{f}.a_values"), layer.a_values.iter())?;
                if let Some(e) = &layer.fitted {
                    check.shape(&format!("{f}.fitted"), e.shape(), (r, c))?;
                    check.finite(&format!("{f}.fitted"), e.iter())?;
                    check.non_negative(&format!("{f}.fitted"), e.iter())?;
                }
                expected.extend(info.kron_order());
            }
            check.ensure(indices == expected.as_slice(), "indices", || {
                "must be the Kronecker layers' [W | b] coordinates, layer by layer".into()
            })?;
        }
        Curvature::Samples(s) => {
            check.ensure(
                s.samples.nrows() == dim && s.samples.ncols() >= 1,
                &field("Samples.samples"),
                || format!("is {} × {}, must be {dim} × K with K ≥ 1", s.samples.nrows(), s.samples.ncols()),
            )?;
            check.finite(&field("Samples.samples"), s.samples.iter())?;
            check.positive(&field("Samples.temperature"), s.temperature)?;
            check.positive(&field("Samples.prior_precision"), s.prior_precision)?;
        }
    }
    Ok(())
}

fn check_eigen(
    check: &LoadCheck,
    field: &str,
    e: &EigenCurvature,
    dim: usize,
) -> std::result::Result<(), PersistError> {
    let k = e.values.len();
    check.shape(&format!("{field}.vectors"), e.vectors.shape(), (dim, k))?;
    // Orthonormal eigenvectors (full, last layer, a subnetwork, block and low-rank Ritz vectors).
    check.unit_entries(&format!("{field}.vectors"), e.vectors.iter())?;
    check.non_negative(&format!("{field}.values"), e.values.iter())?;
    if let Some(r) = &e.remainder {
        check.len(&format!("{field}.remainder"), r.len(), dim)?;
        check.non_negative(&format!("{field}.remainder"), r.iter())?;
    }
    Ok(())
}
