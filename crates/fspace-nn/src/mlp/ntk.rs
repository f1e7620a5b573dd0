//! The empirical NTK of an [`Mlp`] layer by layer (VaLLA App. F.3), its diagonal blocks, and
//! its gradient with respect to the inputs of one side (VaLLA optimises inducing inputs `Z`),
//! as explicit rules on nalgebra GEMMs.
//!
//! With layer `j` computing `h_j = a_j W_jᵀ + b_j` (`a_0 = x`, `a_{j+1} = σ(h_j)`, the last
//! layer linear) and `δ_j(x, o) = ∂f_o/∂h_j` (`δ_{L−1} = e_o`,
//! `δ_j = (δ_{j+1} W_{j+1}) ⊙ σ'(h_j)`), a weight's derivative is `δ_j a_jᵀ` and a bias's `δ_j`:
//!
//! `κ((x, o), (z, o')) = Σ_j ⟨δ_j(x, o), δ_j(z, o')⟩ · (⟨a_j(x), a_j(z)⟩ + 1)`.
//!
//! The gradient of `⟨C, κ(X, Z)⟩` with respect to `Z` back-propagates the cotangents of
//! `a_j(Z)` (through the forward pass) and of `δ_j(Z)` (through the δ recursion, which needs
//! `σ''`). dfdx's reverse mode through taped tangents (`Mlp::ntk_pullback_z`) computes the
//! same quantity one inducing point and output at a time; the tests check both against central
//! finite differences.

use fspace_input::InputError;
use nalgebra::{DMatrix, DVector};

use crate::error::{NnError, Result};
use crate::mlp::Mlp;
use crate::network::{NtkPair, Outputs};

/// One side of an NTK block: layer inputs, pre-activations and back-propagated gradients.
pub(crate) struct Side {
    /// `(point, output)` per row of the δ matrices.
    pub(crate) rows: Vec<(usize, usize)>,
    /// `a_j` (`n × fan_in_j`), `j = 0..L`.
    pub(crate) a: Vec<DMatrix<f64>>,
    /// `σ'(h_j)` of the hidden layers (`n × fan_out_j`), `j = 0..L−1`, evaluated once per point
    /// (the δ rows of one point share it).
    pub(crate) slope: Vec<DMatrix<f64>>,
    /// `σ''(h_j)` of the hidden layers (`n × fan_out_j`), `j = 0..L−1`.
    pub(crate) curvature: Vec<DMatrix<f64>>,
    /// `δ_j` (`rows × fan_out_j`), `j = 0..L`.
    pub(crate) delta: Vec<DMatrix<f64>>,
    /// `P_j = δ_{j+1} W_{j+1}` (`rows × fan_out_j`), `j = 0..L−1` (so `δ_j = P_j ⊙ σ'(h_j)`).
    pub(crate) pre_slope: Vec<DMatrix<f64>>,
}

pub(crate) fn affine(a: &DMatrix<f64>, w: &DMatrix<f64>, b: &DVector<f64>) -> DMatrix<f64> {
    let mut h = a * w.transpose();
    for (c, bc) in b.iter().enumerate() {
        h.column_mut(c).add_scalar_mut(*bc);
    }
    h
}

impl Mlp {
    pub(crate) fn ntk_side(
        &self,
        weights: &[(DMatrix<f64>, DVector<f64>)],
        x: &DMatrix<f64>,
        outputs: Outputs,
    ) -> Result<Side> {
        self.check_inputs(x)?;
        let q = self.output_dim();
        let rows = outputs.rows(x.nrows(), q)?;
        let act = self.config().activation;
        let depth = weights.len();
        let mut a = vec![x.clone()];
        let mut slope = Vec::with_capacity(depth - 1);
        let mut curvature = Vec::with_capacity(depth - 1);
        for (j, (w, b)) in weights.iter().enumerate().take(depth - 1) {
            let mut hj = affine(&a[j], w, b);
            let (mut sj, mut cj) = (hj.clone(), hj.clone());
            for ((h, s), c) in hj.iter_mut().zip(sj.iter_mut()).zip(cj.iter_mut()) {
                (*h, *s, *c) = act.value_slope_curvature(*h);
            }
            a.push(hj);
            slope.push(sj);
            curvature.push(cj);
        }
        let mut delta = vec![DMatrix::zeros(0, 0); depth];
        delta[depth - 1] = DMatrix::from_fn(rows.len(), q, |r, o| (rows[r].1 == o) as u8 as f64);
        let mut pre_slope = vec![DMatrix::zeros(0, 0); depth - 1];
        for j in (0..depth - 1).rev() {
            let p = &delta[j + 1] * &weights[j + 1].0;
            delta[j] = DMatrix::from_fn(p.nrows(), p.ncols(), |r, k| p[(r, k)] * slope[j][(rows[r].0, k)]);
            pre_slope[j] = p;
        }
        Ok(Side { rows, a, slope, curvature, delta, pre_slope })
    }

    /// The NTK block `J(X) J(Z)ᵀ` restricted to the selected outputs of each side
    /// (`rows(X) × rows(Z)`), layer by layer without forming `J`. Cost
    /// `O(rows_X · rows_Z · Σ_j width_j)`, memory independent of `p`.
    pub fn ntk_block(
        &self,
        x: &DMatrix<f64>,
        xo: Outputs,
        z: &DMatrix<f64>,
        zo: Outputs,
    ) -> Result<DMatrix<f64>> {
        let w = self.dense_weights();
        let sx = self.ntk_side(&w, x, xo)?;
        // `κ(X, X)` (a joint predictive's prior block): one side serves both.
        let other;
        let sz = if std::ptr::eq(x, z) && xo == zo {
            &sx
        } else {
            other = self.ntk_side(&w, z, zo)?;
            &other
        };
        // Layer by layer, each layer's two products dropped once added (the pull-back's callers
        // keep all of them): the same additions in the same order as `block_from_products`.
        let mut k = DMatrix::zeros(sx.rows.len(), sz.rows.len());
        for j in 0..sx.a.len() {
            add_layer_product(&mut k, &sx, sz, &layer_product(&sx, sz, j));
        }
        Ok(k)
    }

    /// `(κ(X, Z), κ(Z, Z))` for the selected outputs, computing each side once (VaLLA needs
    /// both every iteration).
    pub fn ntk_pair(
        &self,
        x: &DMatrix<f64>,
        xo: Outputs,
        z: &DMatrix<f64>,
        zo: Outputs,
    ) -> Result<(DMatrix<f64>, DMatrix<f64>)> {
        let pair = self.ntk_pair_with_pullback(x, xo, z, zo)?;
        Ok((pair.kxz, pair.kzz))
    }

    /// `(κ(X, Z), κ(Z, Z))` with a pull-back to `Z` that reuses both sides and their layer
    /// products (VaLLA's iteration evaluates the blocks, then pulls the objective's cotangents
    /// back; computing the sides once halves the NTK cost).
    pub fn ntk_pair_with_pullback<'a>(
        &'a self,
        x: &DMatrix<f64>,
        xo: Outputs,
        z: &DMatrix<f64>,
        zo: Outputs,
    ) -> Result<NtkPair<'a>> {
        let weights = self.dense_weights();
        let (sx, sz) = (self.ntk_side(&weights, x, xo)?, self.ntk_side(&weights, z, zo)?);
        let (pxz, pzz) = (layer_products(&sx, &sz), layer_products(&sz, &sz));
        let (kxz, kzz) = (block_from_products(&sx, &sz, &pxz), block_from_products(&sz, &sz, &pzz));
        let pullback = move |c_xz: &DMatrix<f64>, c_zz: &DMatrix<f64>| -> Result<DMatrix<f64>> {
            check_cotangent(c_xz, sx.rows.len(), sz.rows.len())?;
            check_cotangent(c_zz, sz.rows.len(), sz.rows.len())?;
            let (mut dbar, mut abar) = side_cotangents(&sx, &sz, &pxz, c_xz);
            let (d2, a2) = side_cotangents(&sz, &sz, &pzz, &(c_zz + c_zz.transpose()));
            for j in 0..dbar.len() {
                dbar[j] += &d2[j];
                abar[j] += &a2[j];
            }
            Ok(self.backprop_side(&weights, &sz, dbar, abar))
        };
        Ok(NtkPair::new(kxz, kzz, pullback))
    }

    /// Gradient with respect to `Z` of `⟨C_xz, κ(X, Z)⟩ + ⟨C_zz, κ(Z, Z)⟩` (both arguments of
    /// the second block move), with one pass through each side.
    pub fn ntk_pair_pullback_z(
        &self,
        x: &DMatrix<f64>,
        xo: Outputs,
        z: &DMatrix<f64>,
        zo: Outputs,
        c_xz: &DMatrix<f64>,
        c_zz: &DMatrix<f64>,
    ) -> Result<DMatrix<f64>> {
        self.ntk_pair_with_pullback(x, xo, z, zo)?.pullback_z(c_xz, c_zz)
    }
}

fn check_cotangent(c: &DMatrix<f64>, rows: usize, cols: usize) -> Result<()> {
    if c.shape() != (rows, cols) {
        return Err(NnError::Input(InputError::DimensionMismatch {
            what: "NTK cotangent (rows(X) × rows(Z))",
            expected: rows * cols,
            found: c.len(),
        }));
    }
    if c.iter().any(|v| !v.is_finite()) {
        return Err(NnError::Input(InputError::NonFinite { what: "NTK cotangent" }));
    }
    Ok(())
}

/// Per layer, `(⟨a_j(X), a_j(Z)⟩, ⟨δ_j(X), δ_j(Z)⟩)` (points × points, rows × rows): the
/// GEMMs both the block and its pull-back need.
fn layer_products(sx: &Side, sz: &Side) -> Vec<(DMatrix<f64>, DMatrix<f64>)> {
    (0..sx.a.len()).map(|j| layer_product(sx, sz, j)).collect()
}

/// Layer `j`'s `(⟨a_j(X), a_j(Z)⟩, ⟨δ_j(X), δ_j(Z)⟩)`.
fn layer_product(sx: &Side, sz: &Side, j: usize) -> (DMatrix<f64>, DMatrix<f64>) {
    (&sx.a[j] * sz.a[j].transpose(), &sx.delta[j] * sz.delta[j].transpose())
}

/// `k += ⟨δ_j(X), δ_j(Z)⟩ ∘ (⟨a_j(X), a_j(Z)⟩ + 1)` at the selected rows: one layer's share of
/// the block.
fn add_layer_product(k: &mut DMatrix<f64>, sx: &Side, sz: &Side, (aa, dd): &(DMatrix<f64>, DMatrix<f64>)) {
    for (s, &(pz, _)) in sz.rows.iter().enumerate() {
        for (r, &(px, _)) in sx.rows.iter().enumerate() {
            k[(r, s)] += dd[(r, s)] * (aa[(px, pz)] + 1.0);
        }
    }
}

fn block_from_products(sx: &Side, sz: &Side, products: &[(DMatrix<f64>, DMatrix<f64>)]) -> DMatrix<f64> {
    let mut k = DMatrix::zeros(sx.rows.len(), sz.rows.len());
    for product in products {
        add_layer_product(&mut k, sx, sz, product);
    }
    k
}

/// The cotangents of `δ_j(Z)` (`rows_Z × fan_out_j`) and `a_j(Z)` (`m × fan_in_j`) of
/// `⟨C, κ(X, Z)⟩`, layer by layer.
fn side_cotangents(
    sx: &Side,
    sz: &Side,
    products: &[(DMatrix<f64>, DMatrix<f64>)],
    c: &DMatrix<f64>,
) -> (Vec<DMatrix<f64>>, Vec<DMatrix<f64>>) {
    let (n, m) = (sx.a[0].nrows(), sz.a[0].nrows());
    let depth = sx.a.len();
    let mut dbar = Vec::with_capacity(depth);
    let mut abar = Vec::with_capacity(depth);
    for (j, (aa, dd)) in products.iter().enumerate() {
        let mut weighted = DMatrix::zeros(sx.rows.len(), sz.rows.len());
        let mut e = DMatrix::zeros(n, m);
        for (s, &(pz, _)) in sz.rows.iter().enumerate() {
            for (r, &(px, _)) in sx.rows.iter().enumerate() {
                let crs = c[(r, s)];
                weighted[(r, s)] = crs * (aa[(px, pz)] + 1.0);
                e[(px, pz)] += crs * dd[(r, s)];
            }
        }
        dbar.push(weighted.transpose() * &sx.delta[j]);
        abar.push(e.transpose() * &sx.a[j]);
    }
    (dbar, abar)
}

impl Mlp {
    /// The `d' × d'` diagonal blocks `J(xᵢ) J(xᵢ)ᵀ` of the NTK at each point.
    pub fn ntk_diagonal(&self, x: &DMatrix<f64>) -> Result<Vec<DMatrix<f64>>> {
        let q = self.output_dim();
        let side = self.ntk_side(&self.dense_weights(), x, Outputs::All)?;
        let mut blocks = vec![DMatrix::zeros(q, q); x.nrows()];
        for j in 0..side.a.len() {
            for (i, block) in blocks.iter_mut().enumerate() {
                let scale = side.a[j].row(i).norm_squared() + 1.0;
                let d = side.delta[j].rows(i * q, q);
                *block += (d * d.transpose()) * scale;
            }
        }
        Ok(blocks)
    }

    /// Gradient with respect to `Z` (`m × d`) of `⟨C, κ(X, Z)⟩` for a cotangent `C` of
    /// [`ntk_block`](Self::ntk_block)`(X, xo, Z, zo)` (explicit rule; see the module docs).
    /// For a symmetric block `κ(Z, Z)` call it with `C` and with `Cᵀ` and add.
    pub fn ntk_block_pullback_z(
        &self,
        x: &DMatrix<f64>,
        xo: Outputs,
        z: &DMatrix<f64>,
        zo: Outputs,
        c: &DMatrix<f64>,
    ) -> Result<DMatrix<f64>> {
        let w = self.dense_weights();
        let (sx, sz) = (self.ntk_side(&w, x, xo)?, self.ntk_side(&w, z, zo)?);
        check_cotangent(c, sx.rows.len(), sz.rows.len())?;
        let (dbar, abar) = side_cotangents(&sx, &sz, &layer_products(&sx, &sz), c);
        Ok(self.backprop_side(&w, &sz, dbar, abar))
    }

    /// Back-propagates cotangents of one side's `δ_j` and `a_j` to its inputs.
    fn backprop_side(
        &self,
        weights: &[(DMatrix<f64>, DVector<f64>)],
        sz: &Side,
        mut dbar: Vec<DMatrix<f64>>,
        mut abar: Vec<DMatrix<f64>>,
    ) -> DMatrix<f64> {
        let depth = weights.len();
        let m = sz.a[0].nrows();
        // Through the δ recursion, bottom layer first (δ_j depends on δ_{j+1}).
        let mut hbar: Vec<DMatrix<f64>> =
            sz.slope.iter().map(|s| DMatrix::zeros(s.nrows(), s.ncols())).collect();
        for j in 0..depth - 1 {
            let g = &dbar[j];
            let mut pbar = DMatrix::zeros(g.nrows(), g.ncols());
            for (r, &(pz, _)) in sz.rows.iter().enumerate() {
                for k in 0..g.ncols() {
                    hbar[j][(pz, k)] += g[(r, k)] * sz.pre_slope[j][(r, k)] * sz.curvature[j][(pz, k)];
                    pbar[(r, k)] = g[(r, k)] * sz.slope[j][(pz, k)];
                }
            }
            let up = pbar * weights[j + 1].0.transpose();
            dbar[j + 1] += up;
        }
        // Through the forward pass, top layer first.
        for j in (0..depth - 1).rev() {
            let sj = &sz.slope[j];
            let total =
                DMatrix::from_fn(m, sj.ncols(), |i, k| hbar[j][(i, k)] + abar[j + 1][(i, k)] * sj[(i, k)]);
            let back = total * &weights[j].0;
            abar[j] += back;
        }
        abar.swap_remove(0)
    }
}
