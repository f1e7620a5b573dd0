//! Hidden-layer activations: values, slopes and the taped tangent rules.

use dfdx::prelude::*;
use serde::{Deserialize, Serialize};

use crate::tape::TM;

/// Hidden-layer activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Activation {
    /// `tanh z`.
    Tanh,
    /// `max(z, 0)`.
    Relu,
    /// `1/(1 + e^{−z})`.
    Sigmoid,
    /// `log(1 + e^z)`.
    Softplus,
    /// GELU, tanh form `½z(1 + tanh(√(2/π)(z + 0.044715z³)))` (dfdx's `fast_gelu`).
    Gelu,
}

pub(crate) const GELU_C: f64 = 0.797_884_560_802_865_4; // √(2/π)

impl Activation {
    /// `σ(z)`.
    pub fn value(self, z: f64) -> f64 {
        match self {
            Self::Tanh => z.tanh(),
            Self::Relu => z.max(0.0),
            Self::Sigmoid => 1.0 / (1.0 + (-z).exp()),
            Self::Softplus => z.max(0.0) + (-z.abs()).exp().ln_1p(),
            Self::Gelu => 0.5 * z * (1.0 + (GELU_C * (z + 0.044715 * z.powi(3))).tanh()),
        }
    }
    /// `σ'(z)` (ReLU: 0 at z = 0).
    pub fn slope(self, z: f64) -> f64 {
        match self {
            Self::Tanh => 1.0 - z.tanh().powi(2),
            Self::Relu => (z > 0.0) as u8 as f64,
            Self::Sigmoid | Self::Softplus => {
                let s = 1.0 / (1.0 + (-z).exp());
                if self == Self::Sigmoid {
                    s * (1.0 - s)
                } else {
                    s
                }
            }
            Self::Gelu => {
                let t = (GELU_C * (z + 0.044715 * z.powi(3))).tanh();
                0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * GELU_C * (1.0 + 3.0 * 0.044715 * z * z)
            }
        }
    }
    /// `(σ(z), σ'(z))` together (tanh and the logistic evaluated once).
    #[inline]
    pub(crate) fn value_slope(self, z: f64) -> (f64, f64) {
        match self {
            Self::Tanh => {
                let t = z.tanh();
                (t, 1.0 - t * t)
            }
            Self::Sigmoid => {
                let s = 1.0 / (1.0 + (-z).exp());
                (s, s * (1.0 - s))
            }
            _ => (self.value(z), self.slope(z)),
        }
    }
    /// `(σ(z), σ'(z), σ''(z))` together (tanh evaluated once), for the NTK rules that need all
    /// three at every hidden unit.
    pub(crate) fn value_slope_curvature(self, z: f64) -> (f64, f64, f64) {
        match self {
            Self::Tanh => {
                let t = z.tanh();
                let s = 1.0 - t * t;
                (t, s, -2.0 * t * s)
            }
            _ => (self.value(z), self.slope(z), self.curvature(z)),
        }
    }
    /// `σ''(z)` (ReLU: 0), for derivatives *through* back-propagated gradients (the NTK's
    /// gradient with respect to inputs).
    pub(crate) fn curvature(self, z: f64) -> f64 {
        match self {
            Self::Tanh => {
                let t = z.tanh();
                -2.0 * t * (1.0 - t * t)
            }
            Self::Relu => 0.0,
            Self::Sigmoid => {
                let s = 1.0 / (1.0 + (-z).exp());
                s * (1.0 - s) * (1.0 - 2.0 * s)
            }
            Self::Softplus => {
                let s = 1.0 / (1.0 + (-z).exp());
                s * (1.0 - s)
            }
            Self::Gelu => {
                let (a, c) = (0.044715, GELU_C);
                let t = (c * (z + a * z.powi(3))).tanh();
                let (u1, u2) = (c * (1.0 + 3.0 * a * z * z), 6.0 * c * a * z);
                (1.0 - t * t) * u1 + 0.5 * z * (1.0 - t * t) * (u2 - 2.0 * t * u1 * u1)
            }
        }
    }
    pub(crate) fn taped(self, z: TM) -> TM {
        match self {
            Self::Tanh => z.tanh(),
            Self::Relu => z.relu(),
            Self::Sigmoid => z.sigmoid(),
            Self::Gelu => z.fast_gelu(),
            Self::Softplus => {
                // relu(z) + log(1 + e^{−|z|}): stable; both branches end in the returned sum.
                let branch = z.with_empty_tape();
                z.relu() + ((branch.abs().negate().exp() + 1.0).ln())
            }
        }
    }
}
