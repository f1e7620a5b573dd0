//! From a spec back to a kernel: [`KernelSpec::build`], [`MatrixKernelSpec::build`], and the
//! serde implementations of boxed kernels, which go through their specs. Kept apart from the
//! spec types so that the kernels (which produce specs) and the specs do not import each
//! other: kernels → spec ← builders → kernels.

use serde::{Deserialize, Serialize};

use crate::basic::{Constant, Linear, White};
use crate::combinators::{Product, Scaled, Sum};
use crate::error::{KernelError, Result};
use crate::kernel::{Kernel, MatrixKernel, SecondOrderKernel};
use crate::multi::{Helmholtz, Independent};
use crate::periodic::Periodic;
use crate::spec::{serialize_spec, KernelSpec, MatrixKernelSpec};
use crate::stationary::{Matern12, Matern32, Matern52, RationalQuadratic, Rbf, RqProfile, Stationary};

impl KernelSpec {
    /// Builds the kernel, validating every hyperparameter.
    pub fn build(&self) -> Result<Box<dyn Kernel>> {
        Ok(match self {
            Self::Rbf { variance, lengthscales } => Rbf::ard(*variance, lengthscales.clone())?.boxed(),
            Self::Matern12 { variance, lengthscales } => {
                Matern12::ard(*variance, lengthscales.clone())?.boxed()
            }
            Self::Matern32 { variance, lengthscales } => {
                Matern32::ard(*variance, lengthscales.clone())?.boxed()
            }
            Self::Matern52 { variance, lengthscales } => {
                Matern52::ard(*variance, lengthscales.clone())?.boxed()
            }
            Self::RationalQuadratic { variance, lengthscales, alpha } => {
                RationalQuadratic::ard(*variance, lengthscales.clone(), *alpha)?.boxed()
            }
            Self::Periodic { variance, lengthscales, period } => {
                Periodic::ard(*variance, lengthscales.clone(), *period)?.boxed()
            }
            Self::Linear { variance } => Linear::new(*variance)?.boxed(),
            Self::Constant { variance } => Constant::new(*variance)?.boxed(),
            Self::White { variance } => White::new(*variance)?.boxed(),
            Self::Sum { terms } => Sum::new(terms.iter().map(|t| t.build()).collect::<Result<_>>()?)?.boxed(),
            Self::Product { factors } => {
                Product::new(factors.iter().map(|t| t.build()).collect::<Result<_>>()?)?.boxed()
            }
            Self::Scaled { scale, kernel } => Scaled::new(*scale, kernel.build()?)?.boxed(),
        })
    }

    /// Builds a kernel with analytic cross second derivatives (RBF, Matérn-5/2, rational
    /// quadratic); other kernels are rejected with [`KernelError::Unsupported`].
    pub fn build_second_order(&self) -> Result<Box<dyn SecondOrderKernel>> {
        Ok(match self {
            Self::Rbf { variance, lengthscales } => Box::new(Rbf::ard(*variance, lengthscales.clone())?),
            Self::Matern52 { variance, lengthscales } => Box::new(Matern52::ard(*variance, lengthscales.clone())?),
            Self::RationalQuadratic { variance, lengthscales, alpha } => Box::new(
                Stationary::with_profile(*variance, lengthscales.clone(), RqProfile::new(*alpha)?)?,
            ),
            other => {
                return Err(KernelError::Unsupported(format!(
                    "kernel {other:?} has no analytic second derivatives (use rbf, matern52 or rational_quadratic)"
                )))
            }
        })
    }
}

impl MatrixKernelSpec {
    /// Builds the kernel.
    pub fn build(&self) -> Result<Box<dyn MatrixKernel>> {
        Ok(match self {
            Self::Scalar(k) => Box::new(k.build()?),
            Self::Independent { kernel, outputs } => Box::new(Independent::new(kernel.build()?, *outputs)?),
            Self::Helmholtz { phi, psi } => {
                Box::new(Helmholtz::new(phi.build_second_order()?, psi.build_second_order()?)?)
            }
        })
    }
}

/// Boxed kernels serialise as their [`KernelSpec`] (natural-scale hyperparameters), so a
/// composite kernel (`Sum`, `Product`, `Scaled`) or a model holding one can be saved; a user
/// kernel without a spec is a serialisation error that names it.
impl Serialize for Box<dyn Kernel> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        serialize_spec(self.spec(), self, serializer)
    }
}

impl<'de> Deserialize<'de> for Box<dyn Kernel> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        KernelSpec::deserialize(deserializer)?.build().map_err(serde::de::Error::custom)
    }
}

impl Serialize for Box<dyn SecondOrderKernel> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        serialize_spec(self.spec(), self, serializer)
    }
}

impl<'de> Deserialize<'de> for Box<dyn SecondOrderKernel> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        KernelSpec::deserialize(deserializer)?.build_second_order().map_err(serde::de::Error::custom)
    }
}

impl Serialize for Box<dyn MatrixKernel> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        serialize_spec(self.matrix_spec(), self, serializer)
    }
}

impl<'de> Deserialize<'de> for Box<dyn MatrixKernel> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        MatrixKernelSpec::deserialize(deserializer)?.build().map_err(serde::de::Error::custom)
    }
}
