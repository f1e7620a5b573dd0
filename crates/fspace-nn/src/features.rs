//! Input feature maps applied before a network, e.g. the Mauna Loa setup's
//! `(t, sin(2πt/T), cos(2πt/T))`. They transform inputs only, so the network's parameter
//! Jacobian is unchanged.

use fspace_input::InputError;
use nalgebra::DMatrix;
use serde::{Deserialize, Serialize};

use crate::error::{NnError, Result};

/// A feature map `x ↦ φ(x)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum FeatureMap {
    /// Keep `x`.
    Identity,
    /// Append `sin(2π x_c / T)` and `cos(2π x_c / T)` for input column `c`.
    Periodic {
        /// The column.
        column: usize,
        /// The period `T > 0`.
        period: f64,
    },
}

impl FeatureMap {
    /// Output dimension for `d` input columns.
    pub fn output_dim(&self, d: usize) -> usize {
        match self {
            Self::Identity => d,
            Self::Periodic { .. } => d.saturating_add(2),
        }
    }
    /// `φ(X)` row by row.
    pub fn apply(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        match *self {
            Self::Identity => Ok(x.clone()),
            Self::Periodic { column, period } => {
                if column >= x.ncols() {
                    return Err(NnError::Input(InputError::DimensionMismatch {
                        what: "periodic feature column",
                        expected: x.ncols(),
                        found: column,
                    }));
                }
                if !(period.is_finite() && period > 0.0) {
                    return Err(NnError::Input(InputError::NonFinite {
                        what: "period (must be finite and > 0)",
                    }));
                }
                let d = x.ncols();
                Ok(DMatrix::from_fn(x.nrows(), d + 2, |i, j| {
                    let w = std::f64::consts::TAU * x[(i, column)] / period;
                    match j {
                        j if j < d => x[(i, j)],
                        j if j == d => w.sin(),
                        _ => w.cos(),
                    }
                }))
            }
        }
    }
}

/// A network applied to mapped inputs, `x ↦ net(φ(x))`: the prior, the context points and the
/// data stay in the raw input space (e.g. time `t`) while the network sees `φ(t)` (Mauna Loa:
/// `(t, sin 2πt/T, cos 2πt/T)`). Parameters, and so every parameter derivative (`J·u`, `Jᵀ·V`,
/// the Jacobian, GGN products, layer statistics), are the inner network's at `φ(X)`.
///
/// Deserialising checks what [`new`](Featurized::new) checks.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(
    try_from = "FeaturizedData<N>",
    bound(deserialize = "N: crate::Network + serde::de::DeserializeOwned")
)]
pub struct Featurized<N> {
    map: FeatureMap,
    input_dim: usize,
    net: N,
}

/// The serialised form of a [`Featurized`].
#[derive(Deserialize)]
struct FeaturizedData<N> {
    map: FeatureMap,
    input_dim: usize,
    net: N,
}

impl<N: crate::Network> TryFrom<FeaturizedData<N>> for Featurized<N> {
    type Error = NnError;
    fn try_from(d: FeaturizedData<N>) -> Result<Self> {
        if d.input_dim == 0 {
            return Err(NnError::Input(InputError::Empty { what: "feature map input columns" }));
        }
        Self::new(d.map, d.input_dim, d.net)
    }
}

impl<N: crate::Network> Featurized<N> {
    /// Wraps `net`, whose inputs must be `map`'s outputs for `input_dim` raw columns.
    pub fn new(map: FeatureMap, input_dim: usize, net: N) -> Result<Self> {
        if map.output_dim(input_dim) != net.input_dim() {
            return Err(NnError::Input(InputError::DimensionMismatch {
                what: "feature map output vs. network input",
                expected: net.input_dim(),
                found: map.output_dim(input_dim),
            }));
        }
        // Validate the map once (column in range, period > 0).
        map.apply(&DMatrix::zeros(1, input_dim))?;
        Ok(Self { map, input_dim, net })
    }
    /// The inner network.
    pub fn inner(&self) -> &N {
        &self.net
    }
    /// The feature map.
    pub fn map(&self) -> &FeatureMap {
        &self.map
    }
    fn features(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        if x.ncols() != self.input_dim {
            return Err(NnError::Input(InputError::DimensionMismatch {
                what: "input columns",
                expected: self.input_dim,
                found: x.ncols(),
            }));
        }
        self.map.apply(x)
    }
}

impl<N: crate::Network> crate::Network for Featurized<N> {
    fn input_dim(&self) -> usize {
        self.input_dim
    }
    fn output_dim(&self) -> usize {
        self.net.output_dim()
    }
    fn n_params(&self) -> usize {
        self.net.n_params()
    }
    fn params(&self) -> nalgebra::DVector<f64> {
        self.net.params()
    }
    fn set_params(&mut self, params: &nalgebra::DVector<f64>) -> Result<()> {
        self.net.set_params(params)
    }
    fn forward(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.net.forward(&self.features(x)?)
    }
    fn vjp(&self, x: &DMatrix<f64>, v: &DMatrix<f64>) -> Result<nalgebra::DVector<f64>> {
        self.net.vjp(&self.features(x)?, v)
    }
    fn jvp(&self, x: &DMatrix<f64>, u: &nalgebra::DVector<f64>) -> Result<DMatrix<f64>> {
        self.net.jvp(&self.features(x)?, u)
    }
    fn jvp_columns(&self, x: &DMatrix<f64>, u: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.net.jvp_columns(&self.features(x)?, u)
    }
    fn vjp_columns(&self, x: &DMatrix<f64>, l: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.net.vjp_columns(&self.features(x)?, l)
    }
    fn forward_vjp(
        &self,
        x: &DMatrix<f64>,
        cotangent: &mut dyn FnMut(&DMatrix<f64>) -> Result<DMatrix<f64>>,
    ) -> Result<(DMatrix<f64>, nalgebra::DVector<f64>)> {
        self.net.forward_vjp(&self.features(x)?, cotangent)
    }
    fn ggn_vector_product(
        &self,
        x: &DMatrix<f64>,
        hessians: &[DMatrix<f64>],
        v: &nalgebra::DVector<f64>,
    ) -> Result<nalgebra::DVector<f64>> {
        self.net.ggn_vector_product(&self.features(x)?, hessians, v)
    }
    fn jacobian(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.net.jacobian(&self.features(x)?)
    }
    fn layer_infos(&self) -> Vec<crate::LayerInfo> {
        self.net.layer_infos()
    }
    fn kfac_statistics(
        &self,
        x: &DMatrix<f64>,
        factors: &[DMatrix<f64>],
    ) -> Result<Vec<crate::LayerStatistics>> {
        self.net.kfac_statistics(&self.features(x)?, factors)
    }
    fn kfac_factor_sums(
        &self,
        x: &DMatrix<f64>,
        factors: &[DMatrix<f64>],
        chunk: usize,
    ) -> Result<Option<Vec<crate::KfacFactorSums>>> {
        self.net.kfac_factor_sums(&self.features(x)?, factors, chunk)
    }
    fn last_layer_features(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        self.net.last_layer_features(&self.features(x)?)
    }
    fn forward_with_last_layer_features(&self, x: &DMatrix<f64>) -> Result<(DMatrix<f64>, DMatrix<f64>)> {
        self.net.forward_with_last_layer_features(&self.features(x)?)
    }
    fn ntk_block(
        &self,
        x: &DMatrix<f64>,
        xo: crate::Outputs,
        z: &DMatrix<f64>,
        zo: crate::Outputs,
    ) -> Result<DMatrix<f64>> {
        self.net.ntk_block(&self.features(x)?, xo, &self.features(z)?, zo)
    }
    fn ntk_diagonal(&self, x: &DMatrix<f64>) -> Result<Vec<DMatrix<f64>>> {
        self.net.ntk_diagonal(&self.features(x)?)
    }
}
