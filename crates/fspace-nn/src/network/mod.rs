//! The [`Network`] contract: what training and linearised inference need from a network. Each
//! network implements it in its own file through [`network_impl!`], which forwards the trait's
//! methods to the network's inherent ones.

mod gram;
mod ntk;

pub(crate) use gram::check_variances;
pub use gram::{GramCotangent, WeightedGram};
pub use ntk::{NtkPair, Outputs};

use fspace_input::InputError;
use nalgebra::{DMatrix, DVector};
use rayon::prelude::*;

use crate::error::{all_finite, NnError, Result};
use crate::layers::{KfacFactorSums, LayerInfo, LayerStatistics};

/// Points per [`Network::per_point_vjp`] call of the default [`Network::jacobian`].
const JACOBIAN_BLOCK_POINTS: usize = 64;

/// The cotangent rule of [`Network::forward_vjp_many`]: every network's outputs in, one
/// cotangent per network out.
pub type JointCotangents<'a> = dyn FnMut(&[DMatrix<f64>]) -> Result<Vec<DMatrix<f64>>> + 'a;

/// What [`Network::forward_vjp_many`] returns: each network's outputs and weight gradient.
pub type OutputsAndGradients = (Vec<DMatrix<f64>>, Vec<DVector<f64>>);

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

    /// Per-point reverse passes (per-sample gradients): for every point `i` of `X` and every
    /// column `c` of its cotangent block `Lᵢ` (`d' × k`, the same `k` for all points), the row
    /// `Lᵢ[:, c]ᵀ J(xᵢ)`, returned as column `i·k + c` of a `p × n·k` matrix — never summed over
    /// points, and no `n·d' × p` Jacobian formed. The default runs
    /// [`vjp_columns`](Self::vjp_columns) on each point; a network whose rule batches the points
    /// (a torch model's `vmap`) overrides it. Peak memory ≈ the `p × n·k` result.
    fn per_point_vjp(&self, x: &DMatrix<f64>, cotangents: &[DMatrix<f64>]) -> Result<DMatrix<f64>> {
        let k = check_point_cotangents(cotangents, x.nrows(), self.output_dim())?;
        let mut out = DMatrix::zeros(self.n_params(), x.nrows() * k);
        for (i, l) in cotangents.iter().enumerate() {
            let rows = self.vjp_columns(&x.rows(i, 1).into_owned(), l)?;
            out.columns_mut(i * k, k).copy_from(&rows);
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

    /// [`forward_vjp`](Self::forward_vjp) for several networks at the same inputs (the weight
    /// samples of a stochastic network, say) whose cotangents may depend on every network's
    /// outputs: `f_s = f(X; w_s)` for all `s`, then `g = cotangents(&[f_s])` (one `n × d'`
    /// matrix per network) and `J_s(X)ᵀ g_s`. Returns the outputs and the weight gradients, in
    /// the networks' order. The default runs the forward passes, then the reverse passes,
    /// networks in parallel; the MLP and the CNN keep each network's forward trace between the
    /// two.
    fn forward_vjp_many(
        nets: &[Self],
        x: &DMatrix<f64>,
        cotangents: &mut JointCotangents<'_>,
    ) -> Result<OutputsAndGradients>
    where
        Self: Sized,
    {
        forward_vjp_many_default(nets, x, cotangents)
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
    /// `i·d' + o`). The default runs [`per_point_vjp`](Self::per_point_vjp) over identity
    /// cotangents, 64 points per call, so a network that batches its per-point passes (a torch
    /// model's `vmap`) computes many rows per call and no point's pass runs over another's
    /// inputs; networks with an explicit batched rule override it.
    fn jacobian(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        let (n, q) = (x.nrows(), self.output_dim());
        let mut jac = DMatrix::zeros(n * q, self.n_params());
        let eye = DMatrix::<f64>::identity(q, q);
        for start in (0..n).step_by(JACOBIAN_BLOCK_POINTS) {
            let len = JACOBIAN_BLOCK_POINTS.min(n - start);
            let rows_t = self.per_point_vjp(&x.rows(start, len).into_owned(), &vec![eye.clone(); len])?;
            jac.rows_mut(start * q, len * q).copy_from(&rows_t.transpose());
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

    /// The Kronecker-factor sums of every [`layer_infos`](Self::layer_infos) layer over all of
    /// `x` for the columns of the per-point cotangent factors `Lᵢ`, what KFAC keeps of
    /// [`kfac_statistics`](Self::kfac_statistics), taking `chunk` points at a time. `None`
    /// (the default): the network has no cheaper route than its statistics, and the caller sums
    /// those chunk by chunk. A torch model overrides it so its statistics are summed on its own
    /// device and never cross to Rust.
    fn kfac_factor_sums(
        &self,
        _x: &DMatrix<f64>,
        _factors: &[DMatrix<f64>],
        _chunk: usize,
    ) -> Result<Option<Vec<KfacFactorSums>>> {
        Ok(None)
    }

    /// The inputs of the last (dense, linear) layer `φ(X)` (`n × fan_in`): with them the
    /// network's output is `W_L φ(x) + b_L`.
    fn last_layer_features(&self, _x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        Err(NnError::Unsupported { what: "last-layer features for this network".into() })
    }

    /// The outputs `f(X)` (`n × d'`) and the last layer's inputs `φ(X)` (`n × fan_in`)
    /// together. The default makes two calls ([`forward`](Self::forward), then
    /// [`last_layer_features`](Self::last_layer_features)); a network whose passes are costly
    /// (a torch model) overrides it with one pass that returns both, as a last-layer fit and
    /// its predictive need both at the same points.
    fn forward_with_last_layer_features(&self, x: &DMatrix<f64>) -> Result<(DMatrix<f64>, DMatrix<f64>)> {
        Ok((self.forward(x)?, self.last_layer_features(x)?))
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

/// [`Network::forward_vjp_many`]'s default: the forward passes, then the reverse passes,
/// networks in parallel (for a wrapper that falls back on it, as [`enum_network!`](crate::enum_network)'s
/// mixed batches).
pub fn forward_vjp_many_default<N: Network>(
    nets: &[N],
    x: &DMatrix<f64>,
    cotangents: &mut JointCotangents<'_>,
) -> Result<OutputsAndGradients> {
    let fs = nets.par_iter().map(|net| net.forward(x)).collect::<Result<Vec<_>>>()?;
    let vs = cotangents(&fs)?;
    check_one_per_network(vs.len(), nets.len())?;
    let gs = nets.par_iter().zip(&vs).map(|(net, v)| net.vjp(x, v)).collect::<Result<Vec<_>>>()?;
    Ok((fs, gs))
}

/// [`Network::forward_vjp_many`] for a network that can keep its forward trace `T`: every
/// network's trace (in parallel), the outputs read from the traces (`rows × d'`, row-major),
/// the cotangents, then every network's adjoint on its kept trace for its cotangent (row-major
/// in, the weight gradient out; in parallel).
pub(crate) fn forward_vjp_traced<N: Network, T: Send>(
    nets: &[N],
    rows: usize,
    cotangents: &mut JointCotangents<'_>,
    trace: impl Fn(&N) -> T + Sync,
    output: impl Fn(&T) -> Vec<f64>,
    adjoint: impl Fn(&N, T, Vec<f64>) -> Vec<f64> + Sync,
) -> Result<OutputsAndGradients> {
    let traces: Vec<T> = nets.par_iter().map(&trace).collect();
    let fs: Vec<DMatrix<f64>> = nets
        .iter()
        .zip(&traces)
        .map(|(net, t)| DMatrix::from_row_slice(rows, net.output_dim(), &output(t)))
        .collect();
    let vs = cotangents(&fs)?;
    check_one_per_network(vs.len(), nets.len())?;
    for (net, v) in nets.iter().zip(&vs) {
        crate::batch::check_cotangent(v, rows, net.output_dim())?;
    }
    let gs = nets
        .par_iter()
        .zip(traces)
        .zip(&vs)
        .map(|((net, t), v)| DVector::from_vec(adjoint(net, t, crate::batch::row_major(v))))
        .collect();
    Ok((fs, gs))
}

/// [`Network::forward_vjp_many`]'s rule: one cotangent per network.
pub(crate) fn check_one_per_network(cotangents: usize, nets: usize) -> Result<()> {
    if cotangents != nets {
        return Err(NnError::Input(InputError::DimensionMismatch {
            what: "cotangents (one per network)",
            expected: nets,
            found: cotangents,
        }));
    }
    Ok(())
}

/// Checks one `d' × k` cotangent factor per point, all with the same `k ≥ 1`; returns `k`.
pub(crate) fn check_factors(factors: &[DMatrix<f64>], n: usize, q: usize) -> Result<usize> {
    if factors.len() != n || factors.iter().any(|l| l.nrows() != q) {
        return Err(NnError::Input(InputError::DimensionMismatch {
            what: "cotangent factors (one d' × k per point)",
            expected: n,
            found: factors.len(),
        }));
    }
    let k = factors.first().map_or(0, |l| l.ncols());
    if k == 0 || factors.iter().any(|l| l.ncols() != k) {
        return Err(NnError::Input(InputError::DimensionMismatch {
            what: "cotangent factor columns (equal, ≥ 1)",
            expected: k.max(1),
            found: 0,
        }));
    }
    if factors.iter().any(|l| l.iter().any(|v| !v.is_finite())) {
        return Err(NnError::Input(InputError::NonFinite { what: "cotangent factors" }));
    }
    Ok(k)
}

/// A matrix of column vectors of length `rows`, all finite.
pub fn check_columns(what: &'static str, m: &DMatrix<f64>, rows: usize) -> Result<()> {
    if m.nrows() != rows {
        return Err(NnError::Input(InputError::DimensionMismatch { what, expected: rows, found: m.nrows() }));
    }
    if !all_finite(m.as_slice()) {
        return Err(NnError::Input(InputError::NonFinite { what }));
    }
    Ok(())
}

/// Checks one `d' × d'` Hessian block per point.
pub(crate) fn check_hessians(hessians: &[DMatrix<f64>], n: usize, q: usize) -> Result<()> {
    if hessians.len() != n || hessians.iter().any(|h| h.shape() != (q, q)) {
        return Err(NnError::Input(InputError::DimensionMismatch {
            what: "Hessian blocks (one d' × d' per point)",
            expected: n,
            found: hessians.len(),
        }));
    }
    Ok(())
}

/// Checks per-point cotangent blocks for [`Network::per_point_vjp`]: one `d' × k` block per
/// point, the same `k` for all; returns `k`.
pub fn check_point_cotangents(cotangents: &[DMatrix<f64>], n: usize, q: usize) -> Result<usize> {
    if cotangents.len() != n {
        return Err(NnError::Input(InputError::DimensionMismatch {
            what: "per-point cotangent blocks (one per point)",
            expected: n,
            found: cotangents.len(),
        }));
    }
    let k = cotangents.first().map_or(0, |l| l.ncols());
    for l in cotangents {
        if l.nrows() != q {
            return Err(NnError::Input(InputError::DimensionMismatch {
                what: "per-point cotangent block rows (network outputs)",
                expected: q,
                found: l.nrows(),
            }));
        }
        if l.ncols() != k {
            return Err(NnError::Input(InputError::DimensionMismatch {
                what: "per-point cotangent block columns (the first block's columns)",
                expected: k,
                found: l.ncols(),
            }));
        }
        if l.iter().any(|v| !v.is_finite()) {
            return Err(NnError::Input(InputError::NonFinite { what: "per-point cotangents" }));
        }
    }
    Ok(k)
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

/// Implements [`Network`] for a type by forwarding to its inherent methods of the same names;
/// the braces take the type's extra (overriding) trait methods.
macro_rules! network_impl {
    ($t:ty { $($extra:item)* }) => {
        impl $crate::network::Network for $t {
            fn n_params(&self) -> usize { <$t>::n_params(self) }
            fn params(&self) -> nalgebra::DVector<f64> { <$t>::params(self) }
            fn set_params(&mut self, p: &nalgebra::DVector<f64>) -> $crate::error::Result<()> { <$t>::set_params(self, p) }
            fn forward(&self, x: &nalgebra::DMatrix<f64>) -> $crate::error::Result<nalgebra::DMatrix<f64>> { <$t>::forward(self, x) }
            fn vjp(&self, x: &nalgebra::DMatrix<f64>, v: &nalgebra::DMatrix<f64>) -> $crate::error::Result<nalgebra::DVector<f64>> { <$t>::vjp(self, x, v) }
            fn jvp(&self, x: &nalgebra::DMatrix<f64>, u: &nalgebra::DVector<f64>) -> $crate::error::Result<nalgebra::DMatrix<f64>> { <$t>::jvp(self, x, u) }
            fn input_dim(&self) -> usize { <$t>::input_dim(self) }
            fn output_dim(&self) -> usize { <$t>::output_dim(self) }
            fn jacobian(&self, x: &nalgebra::DMatrix<f64>) -> $crate::error::Result<nalgebra::DMatrix<f64>> { <$t>::jacobian(self, x) }
            $($extra)*
        }
    };
}
pub(crate) use network_impl;
