//! [`NativeNetwork`]: one type for either of fspace's layered networks, the [`Mlp`] or the
//! [`Cnn`], so a caller that learns the architecture at run time (the Python binding, which
//! converts whatever `nn.Sequential` it is given, or a loader of saved posteriors) keeps one
//! posterior type. Every [`Network`](crate::Network) method forwards to the wrapped network's own rule, so
//! nothing is slower than using the concrete type; the methods a network does not implement
//! (the CNN's NTK input gradients, say) give the same [`NnError::Unsupported`](crate::NnError::Unsupported) as it does.
//!
//! Saved as `{"Mlp": …}` or `{"Cnn": …}` (serde's external tag): a file states which network
//! it holds, and a file of one kind never loads as the other.

use serde::{Deserialize, Serialize};

use crate::{Cnn, Mlp};

/// An [`Mlp`] or a [`Cnn`] behind one [`Network`](crate::Network) (module docs).
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

/// Implements [`Network`](crate::Network) for an enum whose every variant wraps one network type, each
/// method forwarding to the wrapped network's own rule:
/// `enum_network!(MyNet { A(TypeA), B(TypeB) });`. [`Network::forward_vjp_many`](crate::Network::forward_vjp_many) takes the
/// wrapped type's rule when every network of the batch is of one variant (each network cloned
/// into a slice of that type) and the per-network default for a mixed batch. Exported so a
/// crate that adds its own network (the Python binding's torch callbacks) can put it beside
/// the native ones behind one type.
#[macro_export]
macro_rules! enum_network {
    ($enum:ident { $($variant:ident($ty:ty)),+ $(,)? }) => {
        const _: () = {
            use $crate::{JointCotangents, KfacFactorSums, LayerInfo, LayerStatistics, Network, NtkPair, Outputs, OutputsAndGradients, WeightedGram};
            use $crate::__nalgebra::{DMatrix, DVector};
            type R<T> = $crate::Result<T>;
            macro_rules! each {
                ($self_:expr, $n:ident => $body:expr) => {
                    match $self_ { $($enum::$variant($n) => $body,)+ }
                };
            }
            impl Network for $enum {
                fn input_dim(&self) -> usize { each!(self, n => Network::input_dim(n)) }
                fn output_dim(&self) -> usize { each!(self, n => Network::output_dim(n)) }
                fn n_params(&self) -> usize { each!(self, n => Network::n_params(n)) }
                fn params(&self) -> DVector<f64> { each!(self, n => Network::params(n)) }
                fn set_params(&mut self, params: &DVector<f64>) -> R<()> { each!(self, n => Network::set_params(n, params)) }
                fn forward(&self, x: &DMatrix<f64>) -> R<DMatrix<f64>> { each!(self, n => Network::forward(n, x)) }
                fn vjp(&self, x: &DMatrix<f64>, v: &DMatrix<f64>) -> R<DVector<f64>> { each!(self, n => Network::vjp(n, x, v)) }
                fn jvp(&self, x: &DMatrix<f64>, u: &DVector<f64>) -> R<DMatrix<f64>> { each!(self, n => Network::jvp(n, x, u)) }
                fn jvp_columns(&self, x: &DMatrix<f64>, u: &DMatrix<f64>) -> R<DMatrix<f64>> {
                    each!(self, n => Network::jvp_columns(n, x, u))
                }
                fn jvp_blocks(&self, x: &DMatrix<f64>, u: &DMatrix<f64>) -> R<Vec<DMatrix<f64>>> {
                    each!(self, n => Network::jvp_blocks(n, x, u))
                }
                fn vjp_columns(&self, x: &DMatrix<f64>, l: &DMatrix<f64>) -> R<DMatrix<f64>> {
                    each!(self, n => Network::vjp_columns(n, x, l))
                }
                fn forward_vjp(
                    &self,
                    x: &DMatrix<f64>,
                    cotangent: &mut dyn FnMut(&DMatrix<f64>) -> R<DMatrix<f64>>,
                ) -> R<(DMatrix<f64>, DVector<f64>)> {
                    each!(self, n => Network::forward_vjp(n, x, cotangent))
                }
                fn forward_vjp_many(
                    nets: &[Self],
                    x: &DMatrix<f64>,
                    cotangents: &mut JointCotangents<'_>,
                ) -> R<OutputsAndGradients> {
                    $(
                        let same: Option<Vec<$ty>> = nets
                            .iter()
                            .map(|n| if let $enum::$variant(m) = n { Some(m.clone()) } else { None })
                            .collect();
                        if let Some(same) = same {
                            return <$ty as Network>::forward_vjp_many(&same, x, cotangents);
                        }
                    )+
                    $crate::forward_vjp_many_default(nets, x, cotangents)
                }
                fn ggn_vector_product(&self, x: &DMatrix<f64>, hessians: &[DMatrix<f64>], v: &DVector<f64>) -> R<DVector<f64>> {
                    each!(self, n => Network::ggn_vector_product(n, x, hessians, v))
                }
                fn per_point_vjp(&self, x: &DMatrix<f64>, cotangents: &[DMatrix<f64>]) -> R<DMatrix<f64>> {
                    each!(self, n => Network::per_point_vjp(n, x, cotangents))
                }
                fn jacobian(&self, x: &DMatrix<f64>) -> R<DMatrix<f64>> { each!(self, n => Network::jacobian(n, x)) }
                fn layer_infos(&self) -> Vec<LayerInfo> { each!(self, n => Network::layer_infos(n)) }
                fn kfac_statistics(&self, x: &DMatrix<f64>, factors: &[DMatrix<f64>]) -> R<Vec<LayerStatistics>> {
                    each!(self, n => Network::kfac_statistics(n, x, factors))
                }
                fn kfac_factor_sums(&self, x: &DMatrix<f64>, factors: &[DMatrix<f64>], chunk: usize) -> R<Option<Vec<KfacFactorSums>>> {
                    each!(self, n => Network::kfac_factor_sums(n, x, factors, chunk))
                }
                fn last_layer_features(&self, x: &DMatrix<f64>) -> R<DMatrix<f64>> {
                    each!(self, n => Network::last_layer_features(n, x))
                }
                fn forward_with_last_layer_features(&self, x: &DMatrix<f64>) -> R<(DMatrix<f64>, DMatrix<f64>)> {
                    each!(self, n => Network::forward_with_last_layer_features(n, x))
                }
                fn ntk_block(&self, x: &DMatrix<f64>, xo: Outputs, z: &DMatrix<f64>, zo: Outputs) -> R<DMatrix<f64>> {
                    each!(self, n => Network::ntk_block(n, x, xo, z, zo))
                }
                fn ntk_diagonal(&self, x: &DMatrix<f64>) -> R<Vec<DMatrix<f64>>> { each!(self, n => Network::ntk_diagonal(n, x)) }
                fn ntk_pair(&self, x: &DMatrix<f64>, xo: Outputs, z: &DMatrix<f64>, zo: Outputs) -> R<(DMatrix<f64>, DMatrix<f64>)> {
                    each!(self, n => Network::ntk_pair(n, x, xo, z, zo))
                }
                fn ntk_pair_with_pullback<'a>(
                    &'a self,
                    x: &'a DMatrix<f64>,
                    xo: Outputs<'a>,
                    z: &'a DMatrix<f64>,
                    zo: Outputs<'a>,
                ) -> R<NtkPair<'a>> {
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
                ) -> R<DMatrix<f64>> {
                    each!(self, n => Network::ntk_pair_pullback_z(n, x, xo, z, zo, c_xz, c_zz))
                }
                fn weighted_gram(&self, x: &DMatrix<f64>, outputs: Outputs, s: &DVector<f64>) -> R<WeightedGram<'_>> {
                    each!(self, n => Network::weighted_gram(n, x, outputs, s))
                }
                fn ntk_block_pullback_z(
                    &self,
                    x: &DMatrix<f64>,
                    xo: Outputs,
                    z: &DMatrix<f64>,
                    zo: Outputs,
                    c: &DMatrix<f64>,
                ) -> R<DMatrix<f64>> {
                    each!(self, n => Network::ntk_block_pullback_z(n, x, xo, z, zo, c))
                }
            }
        };
    };
}

crate::enum_network!(NativeNetwork { Mlp(Mlp), Cnn(Cnn) });
