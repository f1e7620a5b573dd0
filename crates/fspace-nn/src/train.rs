//! Minibatch MAP training of any [`Network`] ([`Mlp`], [`HelmholtzNet`]) with Adam.
//!
//! Each step minimises `(n/b) Σ_{i∈batch} −log p(yᵢ | f(xᵢ; w)) + R(w) + (λ/2)‖w‖²`, where the
//! data term comes from any [`fspace_core::Likelihood`] (its function-space gradient is pulled
//! back by `J(X_b)ᵀ`), and `R` is an optional regulariser hook that returns its value and its
//! own parameter-space gradient — FSP-Laplace supplies `αᵀ f(C; w)` with `α = K(C,C)⁻¹(f(C) −
//! μ(C))` held constant (gradient `J(C)ᵀα`), redrawing `C` each step.

use fspace_core::{Adam, EarlyStopping, Likelihood, Minibatches, StopDecision};
use nalgebra::{DMatrix, DVector};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rayon::prelude::*;

use crate::cnn::Cnn;
use crate::helmholtz::HelmholtzNet;
use crate::jsj::WeightedGram;
use crate::layers::{LayerInfo, LayerStatistics};
use crate::mlp::{all_finite, Mlp, NnError, Result};
use crate::ntk::{NtkPair, Outputs};

/// What training and linearised inference need from a network: flat parameters, `f(X)`,
/// `J(X)·u` and `J(X)ᵀ·V` — all exact. `Send + Sync` so posteriors built on a network can be
/// shared across threads.
pub trait Network: Send + Sync {
    /// Input dimension `d`.
    fn input_dim(&self) -> usize;
    /// Output dimension `d'`.
    fn output_dim(&self) -> usize;
    /// Number of parameters.
    fn n_params(&self) -> usize;
    /// The flat parameter vector.
    fn params(&self) -> DVector<f64>;
    /// Replaces the parameters.
    fn set_params(&mut self, params: &DVector<f64>) -> Result<()>;
    /// `f(X)` (`n × d'`).
    fn forward(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>>;
    /// `J(X)ᵀ·V` (reverse mode) for a cotangent `V` (`n × d'`).
    fn vjp(&self, x: &DMatrix<f64>, v: &DMatrix<f64>) -> Result<DVector<f64>>;
    /// `J(X)·u` (`n × d'`, forward mode) for a parameter direction `u`.
    fn jvp(&self, x: &DMatrix<f64>, u: &DVector<f64>) -> Result<DMatrix<f64>>;

    /// `J(X)·U` for the `r` columns of `U` (`p × r`), point-major (`n·d' × r`: point `i`,
    /// output `o` is row `i·d' + o`). The default runs one [`jvp`](Self::jvp) per column,
    /// columns in parallel; the MLP and the CNN share one forward trace (per chunk of inputs)
    /// across the columns, which saves the forward pass of every column but the first.
    fn jvp_columns(&self, x: &DMatrix<f64>, u: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        check_columns("parameter directions U (rows = parameters)", u, self.n_params())?;
        let cols: Vec<DMatrix<f64>> = (0..u.ncols())
            .into_par_iter()
            .map(|j| self.jvp(x, &u.column(j).into_owned()))
            .collect::<Result<_>>()?;
        let q = self.output_dim();
        let mut out = DMatrix::zeros(x.nrows() * q, u.ncols());
        for (mut col, f) in out.column_iter_mut().zip(&cols) {
            for (i, row) in f.row_iter().enumerate() {
                col.rows_mut(i * q, q).copy_from(&row.transpose());
            }
        }
        Ok(out)
    }

    /// `[J(X)·u₁, …, J(X)·u_s]` for the columns of `U` (`p × s`), each `n × d'`: the
    /// [`jvp_columns`](Self::jvp_columns) result split per column — what a linearised
    /// posterior needs for `s` function samples `f(X) + J(X)·uⱼ`.
    fn jvp_blocks(&self, x: &DMatrix<f64>, u: &DMatrix<f64>) -> Result<Vec<DMatrix<f64>>> {
        let (n, q) = (x.nrows(), self.output_dim());
        let ju = self.jvp_columns(x, u)?;
        Ok(ju.column_iter().map(|c| DMatrix::from_row_slice(n, q, c.as_slice())).collect())
    }

    /// `J(X)ᵀ·L` (`p × r`) for the `r` point-major cotangent columns of `L` (`n·d' × r`, as
    /// [`jvp_columns`](Self::jvp_columns)). The default runs one [`vjp`](Self::vjp) per column,
    /// a few columns per thread at a time; the MLP and the CNN share one forward trace (per
    /// chunk of inputs) across the columns. Peak memory ≈ the `p × r` result.
    fn vjp_columns(&self, x: &DMatrix<f64>, l: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        let q = self.output_dim();
        check_columns("cotangents L (rows = points × outputs)", l, x.nrows() * q)?;
        let mut out = DMatrix::zeros(self.n_params(), l.ncols());
        let chunk = 4 * rayon::current_num_threads().max(1);
        for start in (0..l.ncols()).step_by(chunk) {
            let end = (start + chunk).min(l.ncols());
            let cols: Vec<DVector<f64>> = (start..end)
                .into_par_iter()
                .map(|j| self.vjp(x, &DMatrix::from_row_slice(x.nrows(), q, l.column(j).as_slice())))
                .collect::<Result<_>>()?;
            for (j, c) in (start..end).zip(cols) {
                out.set_column(j, &c);
            }
        }
        Ok(out)
    }

    /// `(f(X), J(X)ᵀ g)` where the cotangent `g = cotangent(f(X))` (`n × d'`) is computed from
    /// the outputs — a training step's forward and reverse pass. The default runs
    /// [`forward`](Self::forward) then [`vjp`](Self::vjp); the MLP and the CNN keep their
    /// forward trace and run it once.
    fn forward_vjp(
        &self,
        x: &DMatrix<f64>,
        cotangent: &mut dyn FnMut(&DMatrix<f64>) -> Result<DMatrix<f64>>,
    ) -> Result<(DMatrix<f64>, DVector<f64>)> {
        let f = self.forward(x)?;
        let v = cotangent(&f)?;
        let g = self.vjp(x, &v)?;
        Ok((f, g))
    }

    /// The GGN-vector product `Σᵢ J(xᵢ)ᵀ Hᵢ J(xᵢ) v` for per-point Hessian blocks `Hᵢ`
    /// (`d' × d'`): one forward- and one reverse-mode pass, for any network.
    fn ggn_vector_product(
        &self,
        x: &DMatrix<f64>,
        hessians: &[DMatrix<f64>],
        v: &DVector<f64>,
    ) -> Result<DVector<f64>> {
        let q = self.output_dim();
        check_hessians(hessians, x.nrows(), q)?;
        let jv = self.jvp(x, v)?;
        let hjv =
            DMatrix::from_fn(x.nrows(), q, |i, a| (0..q).map(|b| hessians[i][(a, b)] * jv[(i, b)]).sum());
        self.vjp(x, &hjv)
    }

    /// The Jacobian `J(X)` (`n·d' × p`, rows point-major: point `i`, output `o` is row
    /// `i·d' + o`). The default takes one reverse pass per row on its point; networks with an
    /// explicit batched rule override it.
    fn jacobian(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        let (n, q) = (x.nrows(), self.output_dim());
        let mut jac = DMatrix::zeros(n * q, self.n_params());
        for i in 0..n {
            let xi = x.rows(i, 1).into_owned();
            for o in 0..q {
                let e = DMatrix::from_fn(1, q, |_, c| (c == o) as u8 as f64);
                jac.row_mut(i * q + o).copy_from(&self.vjp(&xi, &e)?.transpose());
            }
        }
        Ok(jac)
    }

    /// The weight layers, in order (empty when the network exposes no layer structure, as
    /// the Helmholtz net, whose outputs are input-derivatives of two MLPs).
    fn layer_infos(&self) -> Vec<LayerInfo> {
        Vec::new()
    }

    /// Per-layer inputs and back-propagated output gradients (see [`LayerStatistics`]) for the
    /// columns of per-point cotangent factors `Lᵢ` (`d' × k`, e.g. `Hᵢ = LᵢLᵢᵀ`), one entry per
    /// [`layer_infos`](Self::layer_infos) layer. Networks without layer structure return
    /// [`NnError::Unsupported`].
    fn kfac_statistics(&self, _x: &DMatrix<f64>, _factors: &[DMatrix<f64>]) -> Result<Vec<LayerStatistics>> {
        Err(NnError::Unsupported { what: "per-layer statistics (KFAC) for this network".into() })
    }

    /// The inputs of the last (dense, linear) layer `φ(X)` (`n × fan_in`): with them the
    /// network's output is `W_L φ(x) + b_L`.
    fn last_layer_features(&self, _x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        Err(NnError::Unsupported { what: "last-layer features for this network".into() })
    }

    /// The empirical NTK block `J(X) J(Z)ᵀ` restricted to the selected outputs of each side
    /// (`rows(X) × rows(Z)`, see [`Outputs`]). The default forms both Jacobians; networks with
    /// a layer-wise rule (the MLP, VaLLA App. F.3) override it.
    fn ntk_block(
        &self,
        x: &DMatrix<f64>,
        xo: Outputs,
        z: &DMatrix<f64>,
        zo: Outputs,
    ) -> Result<DMatrix<f64>> {
        let q = self.output_dim();
        let pick = |jac: DMatrix<f64>, rows: Vec<(usize, usize)>| {
            DMatrix::from_fn(rows.len(), jac.ncols(), |r, c| jac[(rows[r].0 * q + rows[r].1, c)])
        };
        let (rx, rz) = (xo.rows(x.nrows(), q)?, zo.rows(z.nrows(), q)?);
        let jx = pick(self.jacobian(x)?, rx);
        let jz = pick(self.jacobian(z)?, rz);
        Ok(jx * jz.transpose())
    }

    /// The `d' × d'` blocks `J(xᵢ) J(xᵢ)ᵀ` (the NTK's diagonal blocks). The default streams the
    /// Jacobian in chunks of 64 points.
    fn ntk_diagonal(&self, x: &DMatrix<f64>) -> Result<Vec<DMatrix<f64>>> {
        let q = self.output_dim();
        let mut blocks = Vec::with_capacity(x.nrows());
        for start in (0..x.nrows()).step_by(64) {
            let len = 64.min(x.nrows() - start);
            let jac = self.jacobian(&x.rows(start, len).into_owned())?;
            for i in 0..len {
                let rows = jac.rows(i * q, q);
                blocks.push(rows * rows.transpose());
            }
        }
        Ok(blocks)
    }

    /// `(ntk_block(X, xo, Z, zo), ntk_block(Z, zo, Z, zo))`; networks with a layer-wise rule
    /// compute each side once.
    fn ntk_pair(
        &self,
        x: &DMatrix<f64>,
        xo: Outputs,
        z: &DMatrix<f64>,
        zo: Outputs,
    ) -> Result<(DMatrix<f64>, DMatrix<f64>)> {
        Ok((self.ntk_block(x, xo, z, zo)?, self.ntk_block(z, zo, z, zo)?))
    }

    /// [`ntk_pair`](Self::ntk_pair) together with the pull-back of
    /// [`ntk_pair_pullback_z`](Self::ntk_pair_pullback_z), which may reuse what the blocks
    /// computed (the MLP keeps both sides and their layer products: one VaLLA iteration then
    /// evaluates each side once). The default calls the two methods.
    fn ntk_pair_with_pullback<'a>(
        &'a self,
        x: &'a DMatrix<f64>,
        xo: Outputs<'a>,
        z: &'a DMatrix<f64>,
        zo: Outputs<'a>,
    ) -> Result<NtkPair<'a>> {
        let (kxz, kzz) = self.ntk_pair(x, xo, z, zo)?;
        Ok(NtkPair::new(kxz, kzz, move |c_xz, c_zz| self.ntk_pair_pullback_z(x, xo, z, zo, c_xz, c_zz)))
    }

    /// Gradient with respect to `Z` of `⟨C_xz, κ(X, Z)⟩ + ⟨C_zz, κ(Z, Z)⟩` (both arguments of
    /// `κ(Z, Z)` move). The default calls [`ntk_block_pullback_z`](Self::ntk_block_pullback_z)
    /// three times.
    fn ntk_pair_pullback_z(
        &self,
        x: &DMatrix<f64>,
        xo: Outputs,
        z: &DMatrix<f64>,
        zo: Outputs,
        c_xz: &DMatrix<f64>,
        c_zz: &DMatrix<f64>,
    ) -> Result<DMatrix<f64>> {
        let mut g = self.ntk_block_pullback_z(x, xo, z, zo, c_xz)?;
        g += self.ntk_block_pullback_z(z, zo, z, zo, c_zz)?;
        g += self.ntk_block_pullback_z(z, zo, z, zo, &c_zz.transpose())?;
        Ok(g)
    }

    /// `J(X) diag(s) J(X)ᵀ` for the selected outputs with its exact pull-back to the weights and
    /// to `s` (GFSVI / TFSVI differentiate the linearised network's function-space covariance).
    /// Networks without a rule for derivatives through their Jacobian return
    /// [`NnError::Unsupported`].
    fn weighted_gram(
        &self,
        _x: &DMatrix<f64>,
        _outputs: Outputs,
        _s: &DVector<f64>,
    ) -> Result<WeightedGram<'_>> {
        Err(NnError::Unsupported { what: "J S Jᵀ with its weight gradient for this network".into() })
    }

    /// Gradient with respect to `Z` of `⟨C, ntk_block(X, xo, Z, zo)⟩` (VaLLA moves its inducing
    /// inputs). Networks without a rule for derivatives through their Jacobian return
    /// [`NnError::Unsupported`]; methods then keep `Z` fixed.
    fn ntk_block_pullback_z(
        &self,
        _x: &DMatrix<f64>,
        _xo: Outputs,
        _z: &DMatrix<f64>,
        _zo: Outputs,
        _c: &DMatrix<f64>,
    ) -> Result<DMatrix<f64>> {
        Err(NnError::Unsupported { what: "NTK gradient with respect to inputs for this network".into() })
    }
}

/// Checks one `d' × k` cotangent factor per point, all with the same `k ≥ 1`; returns `k`.
pub(crate) fn check_factors(factors: &[DMatrix<f64>], n: usize, q: usize) -> Result<usize> {
    if factors.len() != n || factors.iter().any(|l| l.nrows() != q) {
        return Err(NnError::DimensionMismatch {
            what: "cotangent factors (one d' × k per point)",
            expected: n,
            found: factors.len(),
        });
    }
    let k = factors.first().map_or(0, |l| l.ncols());
    if k == 0 || factors.iter().any(|l| l.ncols() != k) {
        return Err(NnError::DimensionMismatch {
            what: "cotangent factor columns (equal, ≥ 1)",
            expected: k.max(1),
            found: 0,
        });
    }
    if factors.iter().any(|l| l.iter().any(|v| !v.is_finite())) {
        return Err(NnError::NonFinite { what: "cotangent factors" });
    }
    Ok(k)
}

/// A matrix of column vectors of length `rows`, all finite.
pub(crate) fn check_columns(what: &'static str, m: &DMatrix<f64>, rows: usize) -> Result<()> {
    if m.nrows() != rows {
        return Err(NnError::DimensionMismatch { what, expected: rows, found: m.nrows() });
    }
    if !all_finite(m.as_slice()) {
        return Err(NnError::NonFinite { what });
    }
    Ok(())
}

/// Checks one `d' × d'` Hessian block per point.
pub(crate) fn check_hessians(hessians: &[DMatrix<f64>], n: usize, q: usize) -> Result<()> {
    if hessians.len() != n || hessians.iter().any(|h| h.shape() != (q, q)) {
        return Err(NnError::DimensionMismatch {
            what: "Hessian blocks (one d' × d' per point)",
            expected: n,
            found: hessians.len(),
        });
    }
    Ok(())
}

/// `diag(Σᵢ J(xᵢ)ᵀ Hᵢ J(xᵢ))` from the point-major Jacobian rows (`n·d' × p`).
pub(crate) fn ggn_diagonal_from_jacobian(
    jac: &DMatrix<f64>,
    hessians: &[DMatrix<f64>],
    q: usize,
) -> DVector<f64> {
    let mut diag = DVector::zeros(jac.ncols());
    for (i, h) in hessians.iter().enumerate() {
        for a in 0..q {
            for b in 0..q {
                if h[(a, b)] != 0.0 {
                    diag += jac.row(i * q + a).transpose().component_mul(&jac.row(i * q + b).transpose())
                        * h[(a, b)];
                }
            }
        }
    }
    diag
}

macro_rules! network_impl {
    ($t:ty { $($extra:item)* }) => {
        impl Network for $t {
            fn n_params(&self) -> usize { <$t>::n_params(self) }
            fn params(&self) -> DVector<f64> { <$t>::params(self) }
            fn set_params(&mut self, p: &DVector<f64>) -> Result<()> { <$t>::set_params(self, p) }
            fn forward(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> { <$t>::forward(self, x) }
            fn vjp(&self, x: &DMatrix<f64>, v: &DMatrix<f64>) -> Result<DVector<f64>> { <$t>::vjp(self, x, v) }
            fn jvp(&self, x: &DMatrix<f64>, u: &DVector<f64>) -> Result<DMatrix<f64>> { <$t>::jvp(self, x, u) }
            fn input_dim(&self) -> usize { <$t>::input_dim(self) }
            fn output_dim(&self) -> usize { <$t>::output_dim(self) }
            fn jacobian(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> { <$t>::jacobian(self, x) }
            $($extra)*
        }
    };
}
network_impl!(HelmholtzNet {
    fn jvp_columns(&self, x: &DMatrix<f64>, u: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        <HelmholtzNet>::jvp_columns(self, x, u)
    }
});
network_impl!(Mlp {
    fn forward_vjp(
        &self,
        x: &DMatrix<f64>,
        cotangent: &mut dyn FnMut(&DMatrix<f64>) -> Result<DMatrix<f64>>,
    ) -> Result<(DMatrix<f64>, DVector<f64>)> {
        <Mlp>::forward_vjp(self, x, cotangent)
    }
    fn weighted_gram(&self, x: &DMatrix<f64>, outputs: Outputs, s: &DVector<f64>) -> Result<WeightedGram<'_>> {
        <Mlp>::weighted_gram(self, x, outputs, s)
    }
    fn layer_infos(&self) -> Vec<LayerInfo> { <Mlp>::layer_infos(self) }
    fn kfac_statistics(&self, x: &DMatrix<f64>, factors: &[DMatrix<f64>]) -> Result<Vec<LayerStatistics>> {
        <Mlp>::kfac_statistics(self, x, factors)
    }
    fn last_layer_features(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> { <Mlp>::last_layer_features(self, x) }
    fn ntk_block(&self, x: &DMatrix<f64>, xo: Outputs, z: &DMatrix<f64>, zo: Outputs) -> Result<DMatrix<f64>> {
        <Mlp>::ntk_block(self, x, xo, z, zo)
    }
    fn ntk_diagonal(&self, x: &DMatrix<f64>) -> Result<Vec<DMatrix<f64>>> { <Mlp>::ntk_diagonal(self, x) }
    fn jvp_columns(&self, x: &DMatrix<f64>, u: &DMatrix<f64>) -> Result<DMatrix<f64>> { <Mlp>::jvp_columns(self, x, u) }
    fn vjp_columns(&self, x: &DMatrix<f64>, l: &DMatrix<f64>) -> Result<DMatrix<f64>> { <Mlp>::vjp_columns(self, x, l) }
    fn ntk_block_pullback_z(
        &self,
        x: &DMatrix<f64>,
        xo: Outputs,
        z: &DMatrix<f64>,
        zo: Outputs,
        c: &DMatrix<f64>,
    ) -> Result<DMatrix<f64>> {
        <Mlp>::ntk_block_pullback_z(self, x, xo, z, zo, c)
    }
    fn ntk_pair(&self, x: &DMatrix<f64>, xo: Outputs, z: &DMatrix<f64>, zo: Outputs) -> Result<(DMatrix<f64>, DMatrix<f64>)> {
        <Mlp>::ntk_pair(self, x, xo, z, zo)
    }
    fn ntk_pair_with_pullback<'a>(
        &'a self,
        x: &'a DMatrix<f64>,
        xo: Outputs<'a>,
        z: &'a DMatrix<f64>,
        zo: Outputs<'a>,
    ) -> Result<NtkPair<'a>> {
        <Mlp>::ntk_pair_with_pullback(self, x, xo, z, zo)
    }
    fn ntk_pair_pullback_z(
        &self,
        x: &DMatrix<f64>,
        xo: Outputs,
        z: &DMatrix<f64>,
        zo: Outputs,
        c_xz: &DMatrix<f64>,
        c_zz: &DMatrix<f64>,
    ) -> Result<DMatrix<f64>> {
        <Mlp>::ntk_pair_pullback_z(self, x, xo, z, zo, c_xz, c_zz)
    }
});
network_impl!(Cnn {
    fn forward_vjp(
        &self,
        x: &DMatrix<f64>,
        cotangent: &mut dyn FnMut(&DMatrix<f64>) -> Result<DMatrix<f64>>,
    ) -> Result<(DMatrix<f64>, DVector<f64>)> {
        <Cnn>::forward_vjp(self, x, cotangent)
    }
    fn layer_infos(&self) -> Vec<LayerInfo> { <Cnn>::layer_infos(self) }
    fn kfac_statistics(&self, x: &DMatrix<f64>, factors: &[DMatrix<f64>]) -> Result<Vec<LayerStatistics>> {
        <Cnn>::kfac_statistics(self, x, factors)
    }
    fn last_layer_features(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> { <Cnn>::last_layer_features(self, x) }
    fn jvp_columns(&self, x: &DMatrix<f64>, u: &DMatrix<f64>) -> Result<DMatrix<f64>> { <Cnn>::jvp_columns(self, x, u) }
    fn vjp_columns(&self, x: &DMatrix<f64>, l: &DMatrix<f64>) -> Result<DMatrix<f64>> { <Cnn>::vjp_columns(self, x, l) }
});

/// A regulariser `R(w)`: returns `(R(w), ∇_w R(w))` for the current network; called once per
/// step with the step's RNG (e.g. to redraw context points).
pub type Regularizer<'a, N = Mlp> = dyn FnMut(&N, &mut StdRng) -> Result<(f64, DVector<f64>)> + 'a;

/// Options of [`train_map`].
///
/// | name | default | purpose |
/// |---|---|---|
/// | `epochs` | 1000 | passes over the data (upper bound with early stopping) |
/// | `batch_size` | 100 | minibatch size `b` |
/// | `learning_rate` | 1e-3 | Adam step |
/// | `weight_decay` | 0 | `λ` of `(λ/2)‖w‖²` (an isotropic Gaussian weight prior) |
/// | `patience` | `None` | early stopping on the validation loss (needs validation data) |
/// | `seed` | 0 | shuffling and the regulariser's RNG |
/// | `learn_likelihood` | false | also fit the likelihood's own parameters (Gaussian `log σ`) |
#[derive(Debug, Clone, PartialEq)]
pub struct TrainConfig {
    /// Epochs.
    pub epochs: usize,
    /// Minibatch size.
    pub batch_size: usize,
    /// Adam learning rate.
    pub learning_rate: f64,
    /// L2 weight decay λ.
    pub weight_decay: f64,
    /// Early-stopping patience in epochs.
    pub patience: Option<usize>,
    /// Seed.
    pub seed: u64,
    /// Fit the likelihood's learnable parameters ([`Likelihood::params`]) jointly, with the
    /// same Adam step (the papers' "learned noise scale").
    pub learn_likelihood: bool,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            epochs: 1000,
            batch_size: 100,
            learning_rate: 1e-3,
            weight_decay: 0.0,
            patience: None,
            seed: 0,
            learn_likelihood: false,
        }
    }
}

/// Progress after each epoch (for a progress bar or a log).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainProgress {
    /// Epoch just finished (1-based).
    pub epoch: usize,
    /// Mean training objective per step over the epoch.
    pub train_loss: f64,
    /// Validation NLL per point, if validation data was given.
    pub validation_loss: Option<f64>,
}

/// What [`train_map`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainReport {
    /// Epochs run.
    pub epochs: usize,
    /// Whether early stopping ended training (the best parameters were restored).
    pub stopped_early: bool,
    /// Per-epoch progress.
    pub history: Vec<TrainProgress>,
}

fn nll_loss<N: Network>(net: &N, lik: &dyn Likelihood, x: &DMatrix<f64>, y: &DVector<f64>) -> Result<f64> {
    lik.nll(&net.forward(x)?, y).map_err(|e| NnError::Likelihood(e.to_string()))
}

/// Trains `net` (and, with `learn_likelihood`, the likelihood's parameters) in place.
/// `validation` enables early stopping (restores the best weights and likelihood
/// parameters, also when the epochs run out first); `progress` is called after every epoch.
pub fn train_map<N: Network>(
    net: &mut N,
    likelihood: &mut dyn Likelihood,
    x: &DMatrix<f64>,
    y: &DVector<f64>,
    validation: Option<(&DMatrix<f64>, &DVector<f64>)>,
    mut regularizer: Option<&mut Regularizer<'_, N>>,
    config: &TrainConfig,
    mut progress: impl FnMut(&TrainProgress),
) -> Result<TrainReport> {
    let n = x.nrows();
    let t = likelihood.target_dim();
    if y.len() != n * t {
        return Err(NnError::DimensionMismatch {
            what: "targets vs. inputs × targets per point",
            expected: n * t,
            found: y.len(),
        });
    }
    likelihood.check_targets(y).map_err(|e| NnError::Likelihood(e.to_string()))?;
    if config.patience.is_some() && validation.is_none() {
        return Err(NnError::Likelihood("early stopping needs validation data".into()));
    }
    let batches =
        Minibatches::new(n, config.batch_size, false).map_err(|e| NnError::Likelihood(e.to_string()))?;
    let mut stopper = config.patience.map(|p| EarlyStopping::new(p, 0.0).expect("valid min_delta"));
    let mut rng = StdRng::seed_from_u64(config.seed);
    // Minibatch rows are gathered from a point-major copy: a column-major gather touches
    // every column of the whole data set per batch (cache misses dominate on MNIST).
    let d = x.ncols();
    let x_rows = x.transpose();
    let mut theta = net.params();
    let p = theta.len();
    let n_lik = if config.learn_likelihood { likelihood.params().len() } else { 0 };
    let mut lik_theta = likelihood.params();
    let mut adam = Adam::new(p + n_lik, config.learning_rate);
    let mut joint = DVector::zeros(p + n_lik);
    let mut best = (theta.clone(), lik_theta.clone());
    let mut history = Vec::new();
    let mut stopped_early = false;
    for epoch in 1..=config.epochs {
        let mut total = 0.0;
        let epoch_batches = batches.epoch(&mut rng);
        for idx in &epoch_batches {
            // Contiguous row copies from the point-major copy, then one transposition.
            let mut rows = Vec::with_capacity(idx.len() * d);
            for &i in idx {
                rows.extend_from_slice(&x_rows.as_slice()[i * d..(i + 1) * d]);
            }
            let xb = DMatrix::from_row_slice(idx.len(), d, &rows);
            let yb = DVector::from_iterator(
                idx.len() * t,
                idx.iter().flat_map(|&i| (0..t).map(move |k| y[i * t + k])),
            );
            let scale = n as f64 / idx.len() as f64;
            let (mut nll, mut lik_grad) = (0.0, DVector::zeros(0));
            let lik = &*likelihood;
            let (_, mut grad) = net.forward_vjp(&xb, &mut |f: &DMatrix<f64>| {
                let lik_err = |e: fspace_core::CoreError| NnError::Likelihood(e.to_string());
                nll = lik.nll(f, &yb).map_err(lik_err)?;
                if n_lik > 0 {
                    lik_grad = lik.nll_param_grad(f, &yb).map_err(lik_err)? * scale;
                }
                Ok(lik.nll_grad(f, &yb).map_err(lik_err)? * scale)
            })?;
            let mut loss = scale * nll;
            if let Some(reg) = regularizer.as_deref_mut() {
                let (r, g) = reg(net, &mut rng)?;
                loss += r;
                grad += g;
            }
            if config.weight_decay > 0.0 {
                loss += 0.5 * config.weight_decay * theta.norm_squared();
                grad += &theta * config.weight_decay;
            }
            if !loss.is_finite() || !all_finite(grad.as_slice()) || !all_finite(lik_grad.as_slice()) {
                return Err(NnError::NonFinite {
                    what: "training loss or gradient (diverged; lower the learning rate)",
                });
            }
            if n_lik == 0 {
                adam.descend(&mut theta, &grad);
            } else {
                joint.rows_mut(0, p).copy_from(&theta);
                joint.rows_mut(p, n_lik).copy_from(&lik_theta);
                let g = DVector::from_iterator(p + n_lik, grad.iter().chain(lik_grad.iter()).cloned());
                adam.descend(&mut joint, &g);
                theta.copy_from(&joint.rows(0, p));
                lik_theta.copy_from(&joint.rows(p, n_lik));
                likelihood.set_params(&lik_theta).map_err(|e| NnError::Likelihood(e.to_string()))?;
            }
            net.set_params(&theta)?;
            total += loss;
        }
        let validation_loss = match validation {
            Some((xv, yv)) => Some(nll_loss(net, &*likelihood, xv, yv)? / xv.nrows() as f64),
            None => None,
        };
        let p = TrainProgress { epoch, train_loss: total / epoch_batches.len() as f64, validation_loss };
        progress(&p);
        history.push(p);
        if let (Some(stopper), Some(v)) = (stopper.as_mut(), validation_loss) {
            match stopper.update(v) {
                StopDecision::Improved => best = (theta.clone(), lik_theta.clone()),
                StopDecision::Continue => {}
                StopDecision::Stop => {
                    net.set_params(&best.0)?;
                    if n_lik > 0 {
                        likelihood.set_params(&best.1).map_err(|e| NnError::Likelihood(e.to_string()))?;
                    }
                    stopped_early = true;
                    break;
                }
            }
        }
    }
    // Out of epochs with validation data: the best epoch's parameters too (the last epochs may
    // have been worse without exhausting the patience).
    if !stopped_early && stopper.is_some() && validation.is_some() {
        net.set_params(&best.0)?;
        if n_lik > 0 {
            likelihood.set_params(&best.1).map_err(|e| NnError::Likelihood(e.to_string()))?;
        }
    }
    Ok(TrainReport { epochs: history.len(), stopped_early, history })
}
