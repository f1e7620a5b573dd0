//! dfdx's taped passes of the MLP: reverse mode through taped tangents (`taped_tangent`, which
//! the Helmholtz net's second-order `Jᵀ·V` and `input_jvp` use), and the independent references
//! the tests compare the GEMM rules with (`jvp_taped`, `vjp_taped`, `jsj_pullback`,
//! `ntk_pullback_z`).

use dfdx::prelude::*;
use std::ops::AddAssign;

use nalgebra::DMatrix;

use super::*;
use crate::error::{NnError, Result};
use crate::tape::TM;

impl Mlp {
    /// The same as [`jvp`](Self::jvp) through dfdx tensor operations (the reference the tests
    /// compare the GEMM rule with).
    pub fn jvp_taped(&self, x: &DMatrix<f64>, u: &DVector<f64>) -> Result<DMatrix<f64>> {
        self.check_inputs(x)?;
        self.check_vector("tangent vector u", u)?;
        let (trace, _) = self.trace(x);
        let (w, _) = self.tensors(&self.params);
        let (uw, ub) = self.tensors(u.as_slice());
        let n = x.nrows();
        let mut tangent: Option<M> = None; // ȧ, the tangent of the layer input
        for l in 0..w.len() {
            // ż = ȧ Wᵀ + a Uᵀ + u_b
            let mut zd =
                trace.inputs[l].clone().matmul(uw[l].clone().permute::<_, Axes2<1, 0>>()) + bcast(&ub[l], n);
            if let Some(t) = tangent {
                zd = zd + t.matmul(w[l].clone().permute::<_, Axes2<1, 0>>());
            }
            if l + 1 == w.len() {
                return Ok(to_matrix(&zd));
            }
            let slope = self.act_map(&trace.pre[l], |v| self.config.activation.slope(v));
            tangent = Some(slope * zd); // ȧ = σ'(z) ⊙ ż
        }
        unreachable!("an MLP has at least one layer")
    }

    /// `J(X)ᵀ·V` by dfdx's reverse mode on `Σ f(X) ⊙ V`: the independent reference the tests
    /// compare the GEMM rule of [`vjp`](Self::vjp) with.
    pub fn vjp_taped(&self, x: &DMatrix<f64>, v: &DMatrix<f64>) -> Result<DVector<f64>> {
        self.check_inputs(x)?;
        crate::batch::check_cotangent(v, x.nrows(), self.config.output_dim)?;
        let (w, b) = self.tensors(&self.params);
        let n = x.nrows();
        let input = to_tensor(&self.dev, x);
        let mut a: TM = input.clone().leaky_trace() * 0.0 + input; // tape on the left from the start
        for l in 0..w.len() {
            let z = a.matmul(w[l].clone().permute::<_, Axes2<1, 0>>()) + bcast(&b[l], n);
            a = if l + 1 == w.len() { z } else { self.config.activation.taped(z) };
        }
        let grads = (a * to_tensor(&self.dev, v)).sum().backward();
        let mut out = vec![0.0; self.n_params()];
        for (layer, (wl, bl)) in self.layers().iter().zip(w.iter().zip(&b)) {
            out[layer.w..layer.b].copy_from_slice(&grads.get(wl).as_vec());
            out[layer.b..layer.b + layer.fan_out].copy_from_slice(&grads.get(bl).as_vec());
        }
        Ok(DVector::from_vec(out))
    }

    /// `Σᵢₒ weights[i, o] · ḟ(xᵢ)ₒ` and its gradients with respect to the weights and to the
    /// inputs `X`, where `ḟ` is
    /// the tangent of the output for an input tangent `x_dot` (`n × d`) and/or a parameter
    /// tangent `u`. The tangent rules are taped dfdx operations, so reverse mode differentiates
    /// *through* them (reverse-over-tangent). Supported for tanh, sigmoid, softplus and ReLU.
    pub(crate) fn taped_tangent(
        &self,
        x: &DMatrix<f64>,
        x_dot: Option<&DMatrix<f64>>,
        u: Option<&[f64]>,
        weights: &DMatrix<f64>,
    ) -> Result<(f64, Vec<f64>, DMatrix<f64>)> {
        let n = x.nrows();
        let (w, b) = self.tensors(&self.params);
        let param_tangent = u.map(|u| self.tensors(u));
        let act = self.config.activation;
        let taped = |m: &DMatrix<f64>| -> TM {
            let t = to_tensor(&self.dev, m);
            t.clone().leaky_trace() * 0.0 + t // tape on the left (trap 1)
        };
        let input = to_tensor(&self.dev, x);
        let mut a: TM = input.clone().leaky_trace() * 0.0 + input.clone();
        let mut ad: Option<TM> = x_dot.map(taped);
        for l in 0..w.len() {
            let wt = w[l].clone().permute::<_, Axes2<1, 0>>();
            let a_branch = a.with_empty_tape();
            let z: TM = a.matmul(wt.clone()) + bcast(&b[l], n);
            let lin: Option<TM> = param_tangent.as_ref().map(|(uw, ub)| {
                a_branch.matmul(uw[l].clone().permute::<_, Axes2<1, 0>>()) + bcast(&ub[l], n)
            });
            let zd: TM = match (ad, lin) {
                (Some(t), Some(lin)) => t.matmul(wt) + lin,
                (Some(t), None) => t.matmul(wt),
                (None, Some(lin)) => lin,
                (None, None) => {
                    return Err(NnError::Input(InputError::Empty {
                        what: "tangent (need an input or a parameter tangent)",
                    }))
                }
            };
            if l + 1 == w.len() {
                // Merge the primal tape into the scalar, or its gradients are lost (trap 2).
                let objective = (zd * to_tensor(&self.dev, weights)).sum() + z.sum() * 0.0;
                let value = objective.array();
                let grads = objective.backward();
                // Per layer W then b: the flat parameter layout.
                let g = w
                    .iter()
                    .zip(&b)
                    .flat_map(|(wl, bl)| {
                        let mut v = grads.get(wl).as_vec();
                        v.extend(grads.get(bl).as_vec());
                        v
                    })
                    .collect();
                let grad_x = to_matrix(&grads.get(&input));
                return Ok((value, g, grad_x));
            }
            let (h, slope): (TM, TM) = match act {
                Activation::Tanh => {
                    let h = z.tanh();
                    let s = h.with_empty_tape().square().negate() + 1.0;
                    (h, s)
                }
                Activation::Sigmoid => {
                    let h = z.sigmoid();
                    let hb = h.with_empty_tape();
                    let s = hb.with_empty_tape() * (hb.negate() + 1.0);
                    (h, s)
                }
                Activation::Softplus => {
                    let zb = z.with_empty_tape();
                    (act.taped(z), zb.sigmoid())
                }
                Activation::Relu => {
                    let mask = self.act_map(&z.retaped::<NoneTape>(), |v| (v > 0.0) as u8 as f64);
                    (z.relu(), mask.leaky_trace() * 1.0)
                }
                Activation::Gelu => {
                    // σ'(z) = ½(1 + t) + ½ z (1 − t²) c (1 + 3a z²), t = tanh(c(z + a z³)),
                    // taped so that its own derivative reaches z (each branch a tape copy).
                    let zb = z.with_empty_tape();
                    let h = act.taped(z);
                    let z2 = zb.with_empty_tape().square();
                    let u = (z2.with_empty_tape() * zb.with_empty_tape() * 0.044715 + zb.with_empty_tape())
                        * GELU_C;
                    let t = u.tanh();
                    let dinner = (z2 * (3.0 * 0.044715) + 1.0) * GELU_C;
                    let s =
                        (t.with_empty_tape() + 1.0) * 0.5 + zb * 0.5 * (t.square().negate() + 1.0) * dinner;
                    (h, s)
                }
            };
            ad = Some(slope * zd);
            a = h;
        }
        unreachable!("an MLP has at least one layer")
    }

    /// Pullback of `Φ(w, s) = ⟨C, J(X; w) diag(s) J(X; w)ᵀ⟩` for a symmetric cotangent `C`
    /// (`n·d' × n·d'`, point-major): returns `(∂Φ/∂w, ∂Φ/∂s)`. GFSVI's KL term depends on the
    /// weights through exactly this covariance. Uses `dΦ = 2 tr(dJ · U)` with `U = diag(s) Jᵀ C`
    /// held fixed, differentiated by reverse-over-tangent per point and output (`n·d'` passes on
    /// one point each, `O(n·d'·p)`).
    pub fn jsj_pullback(
        &self,
        x: &DMatrix<f64>,
        s: &DVector<f64>,
        c: &DMatrix<f64>,
    ) -> Result<(DVector<f64>, DVector<f64>)> {
        self.check_inputs(x)?;
        self.check_vector("diagonal s", s)?;
        let nq = x.nrows() * self.config.output_dim;
        if c.shape() != (nq, nq) {
            return Err(NnError::Input(InputError::DimensionMismatch {
                what: "cotangent of J S Jᵀ (n·d' square)",
                expected: nq,
                found: c.nrows(),
            }));
        }
        if c.iter().any(|v| !v.is_finite()) {
            return Err(NnError::Input(InputError::NonFinite { what: "cotangent of J S Jᵀ" }));
        }
        let jac = self.jacobian(x)?;
        let cj = c * &jac; // n·d' × p
        let grad_s = DVector::from_fn(self.n_params(), |k, _| jac.column(k).dot(&cj.column(k)));
        // U = diag(s) Jᵀ C: column j is the tangent for output row j.
        let mut u = cj.transpose();
        for (k, mut row) in u.row_iter_mut().enumerate() {
            row *= s[k];
        }
        let q = self.config.output_dim;
        let mut grad_w = DVector::zeros(self.n_params());
        for i in 0..x.nrows() {
            let xi = x.rows(i, 1).into_owned();
            for a in 0..q {
                let col = u.column(i * q + a).into_owned();
                let pick = DMatrix::from_fn(1, q, |_, o| (o == a) as u8 as f64);
                let (_, g, _) = self.taped_tangent(&xi, None, Some(col.as_slice()), &pick)?;
                grad_w += DVector::from_vec(g) * 2.0;
            }
        }
        Ok((grad_w, grad_s))
    }

    /// Gradient with respect to the inducing inputs `Z` (`m × d`) of `⟨C, J(X) J(Z)ᵀ⟩` for a
    /// cotangent `C` (`n·d' × m·d'`) of an NTK block (VaLLA optimises `Z`). With `G = J(X)ᵀC`
    /// fixed, this is `∂/∂Z tr(J(Z) G)`: one taped parameter-tangent pass per inducing point and
    /// output, differentiated with respect to its input.
    pub fn ntk_pullback_z(
        &self,
        x: &DMatrix<f64>,
        z: &DMatrix<f64>,
        c: &DMatrix<f64>,
    ) -> Result<DMatrix<f64>> {
        self.check_inputs(z)?;
        let q = self.config.output_dim;
        if c.shape() != (x.nrows() * q, z.nrows() * q) {
            return Err(NnError::Input(InputError::DimensionMismatch {
                what: "NTK cotangent (n·d' × m·d')",
                expected: x.nrows() * z.nrows() * q * q,
                found: c.len(),
            }));
        }
        if c.iter().any(|v| !v.is_finite()) {
            return Err(NnError::Input(InputError::NonFinite { what: "NTK cotangent" }));
        }
        let g = self.jacobian(x)?.transpose() * c; // p × m·d'
        let mut grad = DMatrix::zeros(z.nrows(), z.ncols());
        for j in 0..z.nrows() {
            let zj = z.rows(j, 1).into_owned();
            for a in 0..q {
                let pick = DMatrix::from_fn(1, q, |_, o| (o == a) as u8 as f64);
                let col = g.column(j * q + a).into_owned();
                let (_, _, gx) = self.taped_tangent(&zj, None, Some(col.as_slice()), &pick)?;
                grad.row_mut(j).add_assign(&gx.row(0));
            }
        }
        Ok(grad)
    }
}
