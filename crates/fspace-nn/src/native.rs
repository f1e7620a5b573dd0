//! [`NativeNetwork`]: one type for either of fspace's layered networks, the [`Mlp`] or the
//! [`Cnn`], so a caller that learns the architecture at run time (the Python binding, which
//! converts whatever `nn.Sequential` it is given, or a loader of saved posteriors) keeps one
//! posterior type. Every [`Network`] method forwards to the wrapped network's own rule, so
//! nothing is slower than using the concrete type; the methods a network does not implement
//! (the CNN's NTK input gradients, say) give the same [`NnError::Unsupported`] as it does.
//!
//! Saved as `{"Mlp": …}` or `{"Cnn": …}` (serde's external tag): a file states which network
//! it holds, and a file of one kind never loads as the other.

use nalgebra::{DMatrix, DVector};
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::layers::{LayerInfo, LayerStatistics};
use crate::network::{JointCotangents, Network, NtkPair, Outputs, OutputsAndGradients, WeightedGram};
use crate::{Cnn, Mlp};

/// An [`Mlp`] or a [`Cnn`] behind one [`Network`] (module docs).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum NativeNetwork {
    /// A dense network.
    Mlp(Mlp),
    /// A convolutional network.
    Cnn(Cnn),
}

impl From<Mlp> for NativeNetwork {
    fn from(net: Mlp) -> Self {
        Self::Mlp(net)
    }
}

impl From<Cnn> for NativeNetwork {
    fn from(net: Cnn) -> Self {
        Self::Cnn(net)
    }
}

impl NativeNetwork {
    /// `"mlp"` or `"cnn"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Mlp(_) => "mlp",
            Self::Cnn(_) => "cnn",
        }
    }
}

/// Runs `$body` with `$n` bound to the wrapped network.
macro_rules! each {
    ($self:expr, $n:ident => $body:expr) => {
        match $self {
            NativeNetwork::Mlp($n) => $body,
            NativeNetwork::Cnn($n) => $body,
        }
    };
}

impl Network for NativeNetwork {
    fn input_dim(&self) -> usize {
        each!(self, n => n.input_dim())
    }
    fn output_dim(&self) -> usize {
        each!(self, n => Network::output_dim(n))
    }
    fn n_params(&self) -> usize {
        each!(self, n => Network::n_params(n))
    }
    fn params(&self) -> DVector<f64> {
        each!(self, n => Network::params(n))
    }
    fn set_params(&mut self, params: &DVector<f64>) -> Result<()> {
        each!(self, n => Network::set_params(n, params))
    }
    fn forward(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        each!(self, n => Network::forward(n, x))
    }
    fn vjp(&self, x: &DMatrix<f64>, v: &DMatrix<f64>) -> Result<DVector<f64>> {
        each!(self, n => Network::vjp(n, x, v))
    }
    fn jvp(&self, x: &DMatrix<f64>, u: &DVector<f64>) -> Result<DMatrix<f64>> {
        each!(self, n => Network::jvp(n, x, u))
    }
    fn jvp_columns(&self, x: &DMatrix<f64>, u: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        each!(self, n => Network::jvp_columns(n, x, u))
    }
    fn jvp_blocks(&self, x: &DMatrix<f64>, u: &DMatrix<f64>) -> Result<Vec<DMatrix<f64>>> {
        each!(self, n => Network::jvp_blocks(n, x, u))
    }
    fn vjp_columns(&self, x: &DMatrix<f64>, l: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        each!(self, n => Network::vjp_columns(n, x, l))
    }
    fn forward_vjp(
        &self,
        x: &DMatrix<f64>,
        cotangent: &mut dyn FnMut(&DMatrix<f64>) -> Result<DMatrix<f64>>,
    ) -> Result<(DMatrix<f64>, DVector<f64>)> {
        each!(self, n => Network::forward_vjp(n, x, cotangent))
    }
    /// The wrapped type's rule when every network is of one kind (each network is cloned
    /// into a slice of that type: `p` numbers per network, small beside the passes); the
    /// per-network default otherwise.
    fn forward_vjp_many(
        nets: &[Self],
        x: &DMatrix<f64>,
        cotangents: &mut JointCotangents<'_>,
    ) -> Result<OutputsAndGradients> {
        let mlps: Option<Vec<Mlp>> =
            nets.iter().map(|n| if let Self::Mlp(m) = n { Some(m.clone()) } else { None }).collect();
        if let Some(mlps) = mlps {
            return <Mlp as Network>::forward_vjp_many(&mlps, x, cotangents);
        }
        let cnns: Option<Vec<Cnn>> =
            nets.iter().map(|n| if let Self::Cnn(c) = n { Some(c.clone()) } else { None }).collect();
        if let Some(cnns) = cnns {
            return <Cnn as Network>::forward_vjp_many(&cnns, x, cotangents);
        }
        crate::network::forward_vjp_many_default(nets, x, cotangents)
    }
    fn ggn_vector_product(
        &self,
        x: &DMatrix<f64>,
        hessians: &[DMatrix<f64>],
        v: &DVector<f64>,
    ) -> Result<DVector<f64>> {
        each!(self, n => Network::ggn_vector_product(n, x, hessians, v))
    }
    fn jacobian(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        each!(self, n => Network::jacobian(n, x))
    }
    fn layer_infos(&self) -> Vec<LayerInfo> {
        each!(self, n => Network::layer_infos(n))
    }
    fn kfac_statistics(&self, x: &DMatrix<f64>, factors: &[DMatrix<f64>]) -> Result<Vec<LayerStatistics>> {
        each!(self, n => Network::kfac_statistics(n, x, factors))
    }
    fn last_layer_features(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> {
        each!(self, n => Network::last_layer_features(n, x))
    }
    fn ntk_block(
        &self,
        x: &DMatrix<f64>,
        xo: Outputs,
        z: &DMatrix<f64>,
        zo: Outputs,
    ) -> Result<DMatrix<f64>> {
        each!(self, n => Network::ntk_block(n, x, xo, z, zo))
    }
    fn ntk_diagonal(&self, x: &DMatrix<f64>) -> Result<Vec<DMatrix<f64>>> {
        each!(self, n => Network::ntk_diagonal(n, x))
    }
    fn ntk_pair(
        &self,
        x: &DMatrix<f64>,
        xo: Outputs,
        z: &DMatrix<f64>,
        zo: Outputs,
    ) -> Result<(DMatrix<f64>, DMatrix<f64>)> {
        each!(self, n => Network::ntk_pair(n, x, xo, z, zo))
    }
    fn ntk_pair_with_pullback<'a>(
        &'a self,
        x: &'a DMatrix<f64>,
        xo: Outputs<'a>,
        z: &'a DMatrix<f64>,
        zo: Outputs<'a>,
    ) -> Result<NtkPair<'a>> {
        each!(self, n => Network::ntk_pair_with_pullback(n, x, xo, z, zo))
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
        each!(self, n => Network::ntk_pair_pullback_z(n, x, xo, z, zo, c_xz, c_zz))
    }
    fn weighted_gram(
        &self,
        x: &DMatrix<f64>,
        outputs: Outputs,
        s: &DVector<f64>,
    ) -> Result<WeightedGram<'_>> {
        each!(self, n => Network::weighted_gram(n, x, outputs, s))
    }
    fn ntk_block_pullback_z(
        &self,
        x: &DMatrix<f64>,
        xo: Outputs,
        z: &DMatrix<f64>,
        zo: Outputs,
        c: &DMatrix<f64>,
    ) -> Result<DMatrix<f64>> {
        each!(self, n => Network::ntk_block_pullback_z(n, x, xo, z, zo, c))
    }
}
