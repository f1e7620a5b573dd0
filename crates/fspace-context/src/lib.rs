//! # fspace-context
//!
//! Context (measurement) points: the finite sets `C` at which function-space methods compare
//! the network with its GP prior. FSP-Laplace estimates the RKHS norm `‖f − μ‖²_H` at points
//! redrawn every step from a distribution `P_C` (uniform on a box widened around the data, or
//! rows of an unlabelled dataset), and computes the posterior covariance at fixed, space-filling
//! points (grid, Halton, Sobol, Latin hypercube). GFSVI and FVI draw measurement points the same
//! way; FVI mixes uniform points with the current training batch.
//!
//! * [`Sampler`]: `sample(n, rng) → n × d` matrix.
//! * [`UniformSampler`], [`GridSampler`], [`HaltonSampler`], [`SobolSampler`],
//!   [`LatinHypercube`], [`DatasetSampler`], [`MixtureSampler`].
//! * [`BoundingBox`]: explicit, or [`BoundingBox::from_data`] (range widened by half its width).
//! * [`centered_l2_discrepancy`]: a uniformity measure to compare samplers.
//!
//! All randomness comes from the caller's RNG or an explicit seed.
#![doc = include_str!("../README.md")]

pub mod bbox;
pub mod error;
pub mod lowdisc;
pub mod sampler;

pub use bbox::BoundingBox;
pub use error::{ContextError, Result};
pub use lowdisc::{
    centered_l2_discrepancy, first_primes, radical_inverse, HaltonSampler, SobolSampler, SOBOL_MAX_DIM,
};
pub use sampler::{DatasetSampler, GridSampler, LatinHypercube, MixtureSampler, Sampler, UniformSampler};
