//! The Alg. 2 scaling problem shared by the `laplace` bench and the `laplace_scaling` example:
//! 500 data points in ℝ², a Gaussian likelihood (σ = 0.1), an RBF prior (ℓ = 0.3, numerically
//! high rank so that Lanczos runs to its maximum), `n_c` Halton context points on [−3, 3]² and
//! a 2×`width` tanh MLP.

use fspace_context::{BoundingBox, HaltonSampler, Sampler};
use fspace_core::Gaussian;
use fspace_kernels::GpPrior;
use fspace_kernels::Rbf;
use fspace_nn::{Activation, Mlp, MlpConfig};
use nalgebra::{DMatrix, DVector};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// Network, data, context points, prior and likelihood of one case.
pub struct Problem {
    /// The 2×`width` tanh MLP at initialisation.
    pub net: Mlp,
    /// Inputs (500 × 2).
    pub x: DMatrix<f64>,
    /// Targets `sin(2x₁) + x₂`.
    pub y: DVector<f64>,
    /// Halton context points.
    pub context: DMatrix<f64>,
    /// Centred RBF prior.
    pub prior: GpPrior,
    /// Gaussian likelihood.
    pub likelihood: Gaussian,
}

/// The case with `n_c` context points and hidden width `width`.
pub fn problem(n_c: usize, width: usize) -> Problem {
    let mut rng = StdRng::seed_from_u64(0);
    let x: DMatrix<f64> = DMatrix::from_fn(500, 2, |_, _| rng.gen_range(-1.5..1.5));
    let y = DVector::from_fn(500, |i, _| (x[(i, 0)] * 2.0).sin() + x[(i, 1)]);
    let context = HaltonSampler::new(BoundingBox::cube(2, -3.0, 3.0).unwrap()).sample(n_c, &mut rng).unwrap();
    let net = Mlp::new(MlpConfig {
        input_dim: 2,
        hidden: vec![width, width],
        output_dim: 1,
        activation: Activation::Tanh,
        seed: 0,
    })
    .unwrap();
    let prior = GpPrior::centered(Rbf::new(1.0, 0.3).unwrap());
    Problem { net, x, y, context, prior, likelihood: Gaussian::new(0.1).unwrap() }
}
