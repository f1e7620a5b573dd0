//! [`Network`](crate::Network) for [`Cnn`], forwarding to its inherent methods.

use super::Cnn;
use crate::error::Result;
use crate::layers::LayerInfo;
use crate::layers::LayerStatistics;
use crate::network::network_impl;
use nalgebra::DMatrix;
use nalgebra::DVector;

network_impl!(Cnn {
    fn forward_vjp_many(
        nets: &[Cnn],
        x: &DMatrix<f64>,
        cotangents: &mut crate::network::JointCotangents<'_>,
    ) -> Result<crate::network::OutputsAndGradients> {
        for net in nets {
            net.check_inputs(x)?;
        }
        Cnn::batched_forward_vjp_many(nets, x, cotangents)
    }
    fn forward_vjp(
        &self,
        x: &DMatrix<f64>,
        cotangent: &mut dyn FnMut(&DMatrix<f64>) -> Result<DMatrix<f64>>,
    ) -> Result<(DMatrix<f64>, DVector<f64>)> {
        <Cnn>::forward_vjp(self, x, cotangent)
    }
    fn layer_infos(&self) -> Vec<LayerInfo> { <Cnn>::layer_infos(self) }
    fn kfac_statistics(&self, x: &DMatrix<f64>, factors: &[DMatrix<f64>]) -> Result<Vec<LayerStatistics>> {
        <Cnn>::kfac_statistics(self, x, factors)
    }
    fn last_layer_features(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> { <Cnn>::last_layer_features(self, x) }
    fn jvp_columns(&self, x: &DMatrix<f64>, u: &DMatrix<f64>) -> Result<DMatrix<f64>> { <Cnn>::jvp_columns(self, x, u) }
    fn vjp_columns(&self, x: &DMatrix<f64>, l: &DMatrix<f64>) -> Result<DMatrix<f64>> { <Cnn>::vjp_columns(self, x, l) }
});
