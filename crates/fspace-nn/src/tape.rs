//! The dfdx tensor types of the taped reference passes (`jvp_taped`, `vjp_taped`, the
//! reverse-over-tangent pull-backs), shared by the MLP and the activations' taped rules.

use dfdx::prelude::*;

/// The CPU device.
pub(crate) type Dev = Cpu;
/// A runtime-shaped matrix.
pub(crate) type M = Tensor<(usize, usize), f64, Dev>;
/// A runtime-shaped vector.
pub(crate) type V = Tensor<(usize,), f64, Dev>;
/// A matrix on a gradient tape.
pub(crate) type TM = Tensor<(usize, usize), f64, Dev, OwnedTape<f64, Dev>>;
