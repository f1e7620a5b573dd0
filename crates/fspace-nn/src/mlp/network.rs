//! [`Network`](crate::Network) for [`Mlp`], forwarding to its inherent methods.

use super::Mlp;
use crate::error::Result;
use crate::layers::LayerInfo;
use crate::layers::LayerStatistics;
use crate::network::network_impl;
use crate::network::NtkPair;
use crate::network::Outputs;
use crate::network::WeightedGram;
use nalgebra::DMatrix;
use nalgebra::DVector;

network_impl!(Mlp {
    fn forward_vjp_many(
        nets: &[Mlp],
        x: &DMatrix<f64>,
        cotangents: &mut crate::network::JointCotangents<'_>,
    ) -> Result<crate::network::OutputsAndGradients> {
        <Mlp>::forward_vjp_many(nets, x, cotangents)
    }
    fn forward_vjp(
        &self,
        x: &DMatrix<f64>,
        cotangent: &mut dyn FnMut(&DMatrix<f64>) -> Result<DMatrix<f64>>,
    ) -> Result<(DMatrix<f64>, DVector<f64>)> {
        <Mlp>::forward_vjp(self, x, cotangent)
    }
    fn weighted_gram(&self, x: &DMatrix<f64>, outputs: Outputs, s: &DVector<f64>) -> Result<WeightedGram<'_>> {
        <Mlp>::weighted_gram(self, x, outputs, s)
    }
    fn layer_infos(&self) -> Vec<LayerInfo> { <Mlp>::layer_infos(self) }
    fn kfac_statistics(&self, x: &DMatrix<f64>, factors: &[DMatrix<f64>]) -> Result<Vec<LayerStatistics>> {
        <Mlp>::kfac_statistics(self, x, factors)
    }
    fn last_layer_features(&self, x: &DMatrix<f64>) -> Result<DMatrix<f64>> { <Mlp>::last_layer_features(self, x) }
    fn ntk_block(&self, x: &DMatrix<f64>, xo: Outputs, z: &DMatrix<f64>, zo: Outputs) -> Result<DMatrix<f64>> {
        <Mlp>::ntk_block(self, x, xo, z, zo)
    }
    fn ntk_diagonal(&self, x: &DMatrix<f64>) -> Result<Vec<DMatrix<f64>>> { <Mlp>::ntk_diagonal(self, x) }
    fn jvp_columns(&self, x: &DMatrix<f64>, u: &DMatrix<f64>) -> Result<DMatrix<f64>> { <Mlp>::jvp_columns(self, x, u) }
    fn vjp_columns(&self, x: &DMatrix<f64>, l: &DMatrix<f64>) -> Result<DMatrix<f64>> { <Mlp>::vjp_columns(self, x, l) }
    fn ntk_block_pullback_z(
        &self,
        x: &DMatrix<f64>,
        xo: Outputs,
        z: &DMatrix<f64>,
        zo: Outputs,
        c: &DMatrix<f64>,
    ) -> Result<DMatrix<f64>> {
        <Mlp>::ntk_block_pullback_z(self, x, xo, z, zo, c)
    }
    fn ntk_pair(&self, x: &DMatrix<f64>, xo: Outputs, z: &DMatrix<f64>, zo: Outputs) -> Result<(DMatrix<f64>, DMatrix<f64>)> {
        <Mlp>::ntk_pair(self, x, xo, z, zo)
    }
    fn ntk_pair_with_pullback<'a>(
        &'a self,
        x: &'a DMatrix<f64>,
        xo: Outputs<'a>,
        z: &'a DMatrix<f64>,
        zo: Outputs<'a>,
    ) -> Result<NtkPair<'a>> {
        <Mlp>::ntk_pair_with_pullback(self, x, xo, z, zo)
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
        <Mlp>::ntk_pair_pullback_z(self, x, xo, z, zo, c_xz, c_zz)
    }
});
