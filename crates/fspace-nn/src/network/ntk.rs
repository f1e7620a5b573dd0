//! The NTK types of the [`Network`](crate::Network) trait: which outputs of each point enter a
//! block, and a pair of blocks `κ(X, Z)`, `κ(Z, Z)` with their pull-back to `Z` (VaLLA optimises
//! its inducing inputs through it).

use fspace_input::InputError;
use nalgebra::DMatrix;

use crate::error::{NnError, Result};

/// Which outputs of each point enter an NTK block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outputs<'a> {
    /// All `d'` outputs of every point; rows point-major (`i·d' + o`).
    All,
    /// One output per point: row `i` is output `o[i]` of point `i` (VaLLA's inducing points
    /// each carry one class).
    One(&'a [usize]),
}

impl Outputs<'_> {
    /// `(point, output)` of every row, after checking lengths and ranges.
    pub(crate) fn rows(&self, n: usize, q: usize) -> Result<Vec<(usize, usize)>> {
        match self {
            Self::All => Ok((0..n * q).map(|r| (r / q, r % q)).collect()),
            Self::One(o) => {
                if o.len() != n {
                    return Err(NnError::Input(InputError::DimensionMismatch {
                        what: "output selection (one output per point)",
                        expected: n,
                        found: o.len(),
                    }));
                }
                if let Some(&bad) = o.iter().find(|&&v| v >= q) {
                    return Err(NnError::Input(InputError::DimensionMismatch {
                        what: "selected output index (must be < d')",
                        expected: q,
                        found: bad,
                    }));
                }
                Ok(o.iter().enumerate().map(|(i, &v)| (i, v)).collect())
            }
        }
    }
}

/// `κ(X, Z)`, `κ(Z, Z)` and the pull-back of cotangents of both to `Z`
/// (see [`Network::ntk_pair_with_pullback`](crate::Network::ntk_pair_with_pullback)).
pub struct NtkPair<'a> {
    /// `κ(X, Z)` (`rows(X) × rows(Z)`).
    pub kxz: DMatrix<f64>,
    /// `κ(Z, Z)` (`rows(Z) × rows(Z)`).
    pub kzz: DMatrix<f64>,
    pullback: Box<PairPullback<'a>>,
}

type PairPullback<'a> = dyn Fn(&DMatrix<f64>, &DMatrix<f64>) -> Result<DMatrix<f64>> + 'a;

impl<'a> NtkPair<'a> {
    /// Wraps blocks and a pull-back `(C_xz, C_zz) ↦ ∂/∂Z (⟨C_xz, κ(X, Z)⟩ + ⟨C_zz, κ(Z, Z)⟩)`
    /// (for [`Network`](crate::Network) implementations).
    pub fn new(
        kxz: DMatrix<f64>,
        kzz: DMatrix<f64>,
        pullback: impl Fn(&DMatrix<f64>, &DMatrix<f64>) -> Result<DMatrix<f64>> + 'a,
    ) -> Self {
        Self { kxz, kzz, pullback: Box::new(pullback) }
    }
    /// Gradient with respect to `Z` (`m × d`) of `⟨C_xz, κ(X, Z)⟩ + ⟨C_zz, κ(Z, Z)⟩` (both
    /// arguments of `κ(Z, Z)` move).
    pub fn pullback_z(&self, c_xz: &DMatrix<f64>, c_zz: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        (self.pullback)(c_xz, c_zz)
    }
}
