//! The MLP's hot paths as batched GEMMs ([`crate::gemm`]): `f(X)`, `J·u`, `Jᵀ·V` and the fused
//! training pass `(f(X), Jᵀ g(f(X)))` that runs the forward pass once.
//!
//! Batches are row-major (`n × width`, a point per row). Layer `l` computes
//! `Z_l = A_{l−1} W_lᵀ + 1 b_lᵀ`, `A_l = σ(Z_l)`; the rules are
//!
//! * tangent: `Ż_l = Ȧ_{l−1} W_lᵀ + A_{l−1} U_lᵀ + 1 u_bᵀ`, `Ȧ_l = σ'(Z_l) ⊙ Ż_l`;
//! * adjoint: `Δ_L = V`, `∂W_l = Δ_lᵀ A_{l−1}`, `∂b_l = Δ_lᵀ 1`,
//!   `Δ_{l−1} = (Δ_l W_l) ⊙ σ'(Z_{l−1})`.
//!
//! The input `X` (an nalgebra column-major `n × d`) is read in place as the transpose of a
//! row-major `d × n`. The dfdx reverse mode (`Mlp::vjp_taped`) stays as the independent
//! check of the adjoint rule in the tests, beside finite differences and the adjoint identity.

use nalgebra::{DMatrix, DVector};
use rayon::prelude::*;

use crate::batch::{activate, add_column_sums, bias_rows, check_cotangent, row_major, scale_by};
use crate::error::Result;
use crate::gemm::{gemm, Operand};
use crate::mlp::Mlp;
use crate::network::check_columns;

/// What a forward pass keeps: the hidden activations `A_1 … A_{L−1}` and their slopes.
pub(crate) struct BatchTrace {
    n: usize,
    hidden: Vec<Vec<f64>>,
    slopes: Vec<Vec<f64>>,
    output: Vec<f64>,
}

impl BatchTrace {
    /// The output `f(X)` (row-major `n × d'`).
    pub(crate) fn output(&self) -> &[f64] {
        &self.output
    }
}

impl Mlp {
    /// Layer `l`'s input: `X` in place for `l = 0`, else `A_l`.
    fn layer_input<'a>(&self, x: &'a DMatrix<f64>, trace: &'a BatchTrace, l: usize) -> Operand<'a> {
        let layer = self.layers()[l];
        if l == 0 {
            Operand::new(x.as_slice(), layer.fan_in, trace.n).t()
        } else {
            Operand::new(&trace.hidden[l - 1], trace.n, layer.fan_in)
        }
    }

    /// The forward pass; with `keep`, the hidden activations and slopes for a tangent or
    /// adjoint pass. `x` is checked by the caller.
    pub(crate) fn batch_trace(&self, x: &DMatrix<f64>, keep: bool) -> BatchTrace {
        let n = x.nrows();
        let p = self.flat();
        let layers = self.layers();
        let act = self.config().activation;
        let mut trace = BatchTrace { n, hidden: Vec::new(), slopes: Vec::new(), output: Vec::new() };
        let mut scratch: Vec<f64> = Vec::new(); // the previous activation when not kept
        for (l, layer) in layers.iter().enumerate() {
            let mut z = bias_rows(p, layer.b, layer.fan_out, n);
            let input = match (l, keep) {
                (0, _) => Operand::new(x.as_slice(), layer.fan_in, n).t(),
                (_, true) => Operand::new(trace.hidden.last().expect("layer input"), n, layer.fan_in),
                (_, false) => Operand::new(&scratch, n, layer.fan_in),
            };
            gemm(
                &mut z,
                input,
                Operand::new(&p[layer.w..layer.b], layer.fan_out, layer.fan_in).t(),
                1.0,
                1.0,
            );
            if l + 1 == layers.len() {
                trace.output = z;
                break;
            }
            if keep {
                let mut slopes = Vec::new();
                activate(act, &mut z, Some(&mut slopes));
                trace.slopes.push(slopes);
                trace.hidden.push(z); // `hidden[l]` is layer l + 1's input
            } else {
                activate(act, &mut z, None);
                scratch = z;
            }
        }
        trace
    }

    /// `Jᵀ V` accumulated into `grad` (row-major cotangent `v`, `n × d'`).
    pub(crate) fn batch_adjoint(&self, x: &DMatrix<f64>, trace: &BatchTrace, v: Vec<f64>, grad: &mut [f64]) {
        let n = trace.n;
        let p = self.flat();
        let layers = self.layers();
        let mut delta = v;
        for l in (0..layers.len()).rev() {
            let layer = layers[l];
            let d = Operand::new(&delta, n, layer.fan_out);
            gemm(&mut grad[layer.w..layer.b], d.t(), self.layer_input(x, trace, l), 1.0, 1.0);
            add_column_sums(&delta, layer.fan_out, &mut grad[layer.b..layer.b + layer.fan_out]);
            if l > 0 {
                let mut back = vec![0.0; n * layer.fan_in];
                gemm(&mut back, d, Operand::new(&p[layer.w..layer.b], layer.fan_out, layer.fan_in), 1.0, 0.0);
                scale_by(&mut back, &trace.slopes[l - 1]);
                delta = back;
            }
        }
    }

    /// `J u` (row-major `n × d'`).
    pub(crate) fn batch_tangent(&self, x: &DMatrix<f64>, trace: &BatchTrace, u: &[f64]) -> Vec<f64> {
        let n = trace.n;
        let p = self.flat();
        let layers = self.layers();
        let mut tangent: Vec<f64> = Vec::new();
        for (l, layer) in layers.iter().enumerate() {
            let mut zd = bias_rows(u, layer.b, layer.fan_out, n);
            gemm(
                &mut zd,
                self.layer_input(x, trace, l),
                Operand::new(&u[layer.w..layer.b], layer.fan_out, layer.fan_in).t(),
                1.0,
                1.0,
            );
            if l > 0 {
                gemm(
                    &mut zd,
                    Operand::new(&tangent, n, layer.fan_in),
                    Operand::new(&p[layer.w..layer.b], layer.fan_out, layer.fan_in).t(),
                    1.0,
                    1.0,
                );
            }
            if l + 1 < layers.len() {
                scale_by(&mut zd, &trace.slopes[l]);
            }
            tangent = zd;
        }
        tangent
    }

    /// `(f(X), Jᵀ g)` with the cotangent `g = cotangent(f(X))` (`n × d'`), one forward and one
    /// reverse pass (the training step).
    pub fn forward_vjp(
        &self,
        x: &DMatrix<f64>,
        cotangent: &mut dyn FnMut(&DMatrix<f64>) -> Result<DMatrix<f64>>,
    ) -> Result<(DMatrix<f64>, DVector<f64>)> {
        self.check_inputs(x)?;
        let (n, q) = (x.nrows(), self.output_dim());
        let trace = self.batch_trace(x, true);
        let f = DMatrix::from_row_slice(n, q, trace.output());
        let v = cotangent(&f)?;
        check_cotangent(&v, n, q)?;
        let mut grad = vec![0.0; self.n_params()];
        self.batch_adjoint(x, &trace, row_major(&v), &mut grad);
        Ok((f, DVector::from_vec(grad)))
    }

    /// [`Network::forward_vjp_many`](crate::Network::forward_vjp_many) for MLPs: each
    /// network's forward trace is kept for its reverse pass.
    pub fn forward_vjp_many(
        nets: &[Mlp],
        x: &DMatrix<f64>,
        cotangents: &mut crate::network::JointCotangents<'_>,
    ) -> Result<crate::network::OutputsAndGradients> {
        for net in nets {
            net.check_inputs(x)?;
        }
        crate::network::forward_vjp_traced(
            nets,
            x.nrows(),
            cotangents,
            |net| net.batch_trace(x, true),
            |trace| trace.output().to_vec(),
            |net, trace, v_rows| {
                let mut grad = vec![0.0; net.n_params()];
                net.batch_adjoint(x, &trace, v_rows, &mut grad);
                grad
            },
        )
    }

    /// `J(X)·U` point-major (`n·d' × r`) for the columns of `U` (`p × r`): one forward trace,
    /// then one tangent pass per column, columns in parallel.
    pub fn jvp_columns(&self, x: &DMatrix<f64>, u: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.check_inputs(x)?;
        let p = self.n_params();
        check_columns("parameter directions U (rows = parameters)", u, p)?;
        let nq = x.nrows() * self.output_dim();
        let trace = self.batch_trace(x, true);
        let mut out = DMatrix::zeros(nq, u.ncols());
        out.as_mut_slice().par_chunks_mut(nq.max(1)).enumerate().for_each(|(j, col)| {
            let t = self.batch_tangent(x, &trace, &u.as_slice()[j * p..(j + 1) * p]);
            col.copy_from_slice(&t);
        });
        Ok(out)
    }

    /// `J(X)ᵀ·L` (`p × r`) for point-major cotangent columns `L` (`n·d' × r`): one forward
    /// trace, then one reverse pass per column, columns in parallel.
    pub fn vjp_columns(&self, x: &DMatrix<f64>, l: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.check_inputs(x)?;
        let nq = x.nrows() * self.output_dim();
        check_columns("cotangents L (rows = points × outputs)", l, nq)?;
        let p = self.n_params();
        let trace = self.batch_trace(x, true);
        let mut out = DMatrix::zeros(p, l.ncols());
        out.as_mut_slice().par_chunks_mut(p.max(1)).enumerate().for_each(|(j, grad)| {
            self.batch_adjoint(x, &trace, l.as_slice()[j * nq..(j + 1) * nq].to_vec(), grad);
        });
        Ok(out)
    }
}
