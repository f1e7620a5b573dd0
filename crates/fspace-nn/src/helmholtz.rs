//! The Helmholtz vector-field network of FSP-Laplace App. B.2 (eq. B.2): two scalar MLPs
//! `Φ(·; w₁)`, `Ψ(·; w₂)` on ℝ² and `f(x) = ∇Φ(x) + rot Ψ(x)` with `rot Ψ = (∂Ψ/∂x₂, −∂Ψ/∂x₁)`.
//! Every output is an *input*-derivative of a network, so `f` is curl-free plus divergence-free
//! by construction, and its parameter derivatives are second-order: `Jᵀ·V` is reverse mode
//! through the taped input-tangent rules (one pass per potential).

use fspace_input::InputError;
use nalgebra::{DMatrix, DVector};
use rayon::prelude::*;

use serde::{Deserialize, Serialize};

use crate::activation::Activation;
use crate::error::{NnError, Result};
use crate::mlp::{Mlp, MlpConfig};

/// `f = ∇Φ + rot Ψ`; parameters are `[w_Φ, w_Ψ]` (serde: both potentials; deserialising
/// checks that each is a scalar network on ℝ²).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(try_from = "HelmholtzData")]
pub struct HelmholtzNet {
    phi: Mlp,
    psi: Mlp,
}

/// The serialised form of a [`HelmholtzNet`].
#[derive(Deserialize)]
struct HelmholtzData {
    phi: Mlp,
    psi: Mlp,
}

impl TryFrom<HelmholtzData> for HelmholtzNet {
    type Error = NnError;
    fn try_from(d: HelmholtzData) -> Result<Self> {
        for (name, net) in [("Φ", &d.phi), ("Ψ", &d.psi)] {
            if net.input_dim() != 2 || net.output_dim() != 1 {
                return Err(NnError::Input(InputError::Invalid {
                    what: "Helmholtz potential",
                    reason: format!(
                        "{name} maps {} → {} values; a potential maps ℝ² → ℝ",
                        net.input_dim(),
                        net.output_dim()
                    ),
                }));
            }
        }
        Ok(Self { phi: d.phi, psi: d.psi })
    }
}

fn column_tangent(n: usize, j: usize) -> DMatrix<f64> {
    DMatrix::from_fn(n, 2, |_, c| (c == j) as u8 as f64)
}

impl HelmholtzNet {
    /// Two scalar MLPs `2 → hidden → 1` (the paper: 2×100 tanh), seeded `seed` and `seed + 1`.
    pub fn new(hidden: Vec<usize>, activation: Activation, seed: u64) -> Result<Self> {
        let cfg = |seed| MlpConfig { input_dim: 2, hidden: hidden.clone(), output_dim: 1, activation, seed };
        Ok(Self { phi: Mlp::new(cfg(seed))?, psi: Mlp::new(cfg(seed + 1))? })
    }

    /// The potential network `Φ`.
    pub fn phi(&self) -> &Mlp {
        &self.phi
    }
    /// The stream-function network `Ψ`.
    pub fn psi(&self) -> &Mlp {
        &self.psi
    }
    /// Input dimension (2).
    pub fn input_dim(&self) -> usize {
        2
    }
    /// Output dimension (2: a velocity field on ℝ²).
    pub fn output_dim(&self) -> usize {
        2
    }
    /// Number of parameters.
    pub fn n_params(&self) -> usize {
        self.phi.n_params() + self.psi.n_params()
    }
    /// Names and ranges of the parameter blocks (`phi.layer0.weight`, …, `psi.layer2.bias`).
    pub fn param_blocks(&self) -> Vec<(String, std::ops::Range<usize>)> {
        let k = self.phi.n_params();
        let phi = self.phi.param_blocks().into_iter().map(|(n, r)| (format!("phi.{n}"), r));
        let psi =
            self.psi.param_blocks().into_iter().map(|(n, r)| (format!("psi.{n}"), r.start + k..r.end + k));
        phi.chain(psi).collect()
    }
    /// `[w_Φ, w_Ψ]`.
    pub fn params(&self) -> DVector<f64> {
        let (a, b) = (self.phi.params(), self.psi.params());
        DVector::from_iterator(a.len() + b.len(), a.iter().chain(b.iter()).cloned())
    }
    /// Sets `[w_Φ, w_Ψ]`.
    pub fn set_params(&mut self, p: &DVector<f64>) -> Result<()> {
        if p.len() != self.n_params() {
            return Err(NnError::Input(InputError::DimensionMismatch {
                what: "parameter vector",
                expected: self.n_params(),
                found: p.len(),
            }));
        }
        let k = self.phi.n_params();
        self.phi.set_params(&p.rows(0, k).into_owned())?;
        self.psi.set_params(&p.rows(k, p.len() - k).into_owned())
    }

    fn gradient_of(net: &Mlp, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        let n = x.nrows();
        let (d0, d1) = (net.input_jvp(x, &column_tangent(n, 0))?, net.input_jvp(x, &column_tangent(n, 1))?);
        Ok(DMatrix::from_fn(n, 2, |i, j| if j == 0 { d0[(i, 0)] } else { d1[(i, 0)] }))
    }

    /// The curl-free part `∇Φ(X)` (`n × 2`).
    pub fn curl_free_part(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        Self::gradient_of(&self.phi, x)
    }

    /// The divergence-free part `rot Ψ(X) = (∂Ψ/∂x₂, −∂Ψ/∂x₁)` (`n × 2`).
    pub fn divergence_free_part(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        let g = Self::gradient_of(&self.psi, x)?;
        Ok(DMatrix::from_fn(g.nrows(), 2, |i, j| if j == 0 { g[(i, 1)] } else { -g[(i, 0)] }))
    }

    /// `f(X)` (`n × 2`).
    pub fn forward(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        Ok(self.curl_free_part(x)? + self.divergence_free_part(x)?)
    }

    /// `J(X)ᵀ·V` for a cotangent `V` (`n × 2`): `Σᵢ ∇_w [∇Φ(xᵢ)·Vᵢ]` and
    /// `Σᵢ ∇_w [∇Ψ(xᵢ)·(−Vᵢ₁, Vᵢ₀)]`, each one taped input-tangent pass.
    pub fn vjp(&self, x: &DMatrix<f64>, v: &DMatrix<f64>) -> Result<DVector<f64>> {
        if v.shape() != (x.nrows(), 2) {
            return Err(NnError::Input(InputError::DimensionMismatch {
                what: "cotangent (n × 2)",
                expected: 2 * x.nrows(),
                found: v.len(),
            }));
        }
        if v.iter().any(|c| !c.is_finite()) {
            return Err(NnError::Input(InputError::NonFinite { what: "cotangent" }));
        }
        let ones = DMatrix::from_element(x.nrows(), 1, 1.0);
        let rotated = DMatrix::from_fn(x.nrows(), 2, |i, j| if j == 0 { -v[(i, 1)] } else { v[(i, 0)] });
        let (_, g_phi, _) = self.phi.taped_tangent(x, Some(v), None, &ones)?;
        let (_, g_psi, _) = self.psi.taped_tangent(x, Some(&rotated), None, &ones)?;
        Ok(DVector::from_iterator(self.n_params(), g_phi.into_iter().chain(g_psi)))
    }

    /// The parameter Jacobian (`2n × p`, rows point-major), one [`vjp`](Self::vjp) per row.
    pub fn jacobian(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        let n = x.nrows();
        let mut jac = DMatrix::zeros(2 * n, self.n_params());
        for i in 0..n {
            let xi = x.rows(i, 1).into_owned();
            for a in 0..2 {
                let e = DMatrix::from_fn(1, 2, |_, j| (j == a) as u8 as f64);
                jac.set_row(2 * i + a, &self.vjp(&xi, &e)?.transpose());
            }
        }
        Ok(jac)
    }

    /// `J(X)·u` (`n × 2`), through the Jacobian (`O(n·p)` reverse passes; a forward-over-
    /// forward rule would avoid them).
    pub fn jvp(&self, x: &DMatrix<f64>, u: &DVector<f64>) -> Result<DMatrix<f64>> {
        if u.len() != self.n_params() {
            return Err(NnError::Input(InputError::DimensionMismatch {
                what: "tangent vector u",
                expected: self.n_params(),
                found: u.len(),
            }));
        }
        let ju = self.jacobian(x)? * u;
        Ok(DMatrix::from_fn(x.nrows(), 2, |i, a| ju[2 * i + a]))
    }

    /// `J(X)·U` for the columns of `U` (`p × r`), point-major (`2n × r`): the Jacobian of a
    /// chunk of 16 points at a time (chunks in parallel) times `U`, so the reverse
    /// passes are paid once for all `r` columns instead of once per column. Peak memory per
    /// thread ≈ `2·JVP_CHUNK × p` numbers.
    pub fn jvp_columns(&self, x: &DMatrix<f64>, u: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        crate::network::check_columns("parameter directions U (rows = parameters)", u, self.n_params())?;
        let n = x.nrows();
        let starts: Vec<usize> = (0..n).step_by(JVP_CHUNK).collect();
        let blocks: Vec<DMatrix<f64>> = starts
            .into_par_iter()
            .map(|s| {
                let rows = JVP_CHUNK.min(n - s);
                Ok(self.jacobian(&x.rows(s, rows).into_owned())? * u)
            })
            .collect::<Result<_>>()?;
        let mut out = DMatrix::zeros(2 * n, u.ncols());
        for (k, b) in blocks.iter().enumerate() {
            out.rows_mut(2 * k * JVP_CHUNK, b.nrows()).copy_from(b);
        }
        Ok(out)
    }
}

/// Points per Jacobian chunk in [`HelmholtzNet::jvp_columns`].
const JVP_CHUNK: usize = 16;

/// [`Network`](crate::Network) for [`HelmholtzNet`], forwarding to its inherent methods.
mod network {
    use super::HelmholtzNet;
    use crate::error::Result;
    use crate::network::network_impl;
    use nalgebra::DMatrix;

    network_impl!(HelmholtzNet {
        fn jvp_columns(&self, x: &DMatrix<f64>, u: &DMatrix<f64>) -> Result<DMatrix<f64>> {
            <HelmholtzNet>::jvp_columns(self, x, u)
        }
    });
}
