//! # fspace-fsp-laplace
//!
//! FSP-Laplace (Cinquin, Pförtner, Fortuin, Hennig, Bamler 2024): a neural network trained
//! under a Gaussian-process prior *in function space*, then a linearised Laplace approximation
//! of the same objective — so that the network's uncertainty follows what the GP says about
//! functions (smoothness, lengthscale, periodicity, physics) instead of an isotropic weight
//! prior.
//!
//! **Objective** (eq. 3.5, 3.7): `R(w) = −Σᵢ log p(yᵢ | f(xᵢ; w)) + ½‖f(·; w) − μ‖²_{H_Σ}`, the
//! RKHS norm estimated at context points `C` by `(f(C) − μ(C))ᵀ Σ(C,C)⁻¹ (f(C) − μ(C))`.
//! * [`train`] — Alg. 1: minibatches with the NLL scaled by `n/b`, context points redrawn
//!   from a sampler every step (default: uniform on the data box widened by half its range).
//! * [`laplace`] — Alg. 2: Lanczos–LDLᵀ on `Σ(C,C)`, `M = J(C)ᵀL`, thin SVD, the GGN projected
//!   on `range(M)`, eigendecomposition, `S` with `S Sᵀ ≈ Λ†`, and the prior-variance truncation.
//!   Matrix-free, memory `O(p·r)`. [`LaplaceBasis`] splits it where the data enter: steps 1–3
//!   from the context points alone, [`LaplaceBasis::add`] of a batch into a [`DataSum`] (step
//!   4's `k × k` sum, mergeable across batches and processes), [`LaplaceBasis::finish`] for
//!   steps 5–6; [`posthoc_basis`] starts it from an [`FspConfig`], for data that arrive in
//!   batches.
//! * [`FspLaplace`] implements `fspace_core::Posterior`: GLM predictive `N(f(x; w*), ‖J(x)S‖²)`,
//!   exact linearised function samples, class probabilities through `fspace_core`.
//! * [`fit`] — both steps with the paper's defaults ([`FspConfig`]); [`fit_rows`] the same over
//!   rows read by position (`fspace_core::RowSource`: a loader over a map-style data set) with
//!   one minibatch in memory — the in-memory fit's weights and posterior to the bit.
//! * [`fit_regression_prior`] / [`fit_classification_prior`] — prior hyperparameters by marginal
//!   likelihood (exact GP; Milios et al.'s Dirichlet targets for classes), as in App. B.1.
//!
//! ```
//! use fspace_fsp_laplace::{fit, FspConfig};
//! use fspace_kernels::GpPrior;
//! use fspace_core::{Data, LikelihoodSpec, Posterior};
//! use fspace_kernels::Rbf;
//! use fspace_nn::{Activation, Mlp, MlpConfig};
//! use rand::SeedableRng;
//!
//! let data = fspace_data::sine(60, 0.1, &mut rand::rngs::StdRng::seed_from_u64(0)).unwrap();
//! let prior = GpPrior::centered(Rbf::new(1.0, 0.3).unwrap());
//! let net = Mlp::new(MlpConfig { input_dim: 1, hidden: vec![16, 16], output_dim: 1,
//!                                activation: Activation::Tanh, seed: 0 }).unwrap();
//! let config =
//!     FspConfig { schedule: fspace_core::Schedule::epochs(50), batch_size: 30, learning_rate: 5e-3, ..Default::default() };
//! let post = fit(net, LikelihoodSpec::gaussian(0.1), &prior, &Data::new(&data.x, &data.y)?, &config)?
//!     .posterior;
//! let pred = post.predict(&nalgebra::DMatrix::from_row_slice(2, 1, &[0.75, 3.0])).unwrap();
//! assert!(pred.var[(1, 0)] > pred.var[(0, 0)]); // far from the data: more uncertain
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod error;
mod fit;
mod laplace;
mod prior;
mod train;

pub use error::{FspError, Result};
pub use fit::{
    context_points, fit, fit_observed, fit_posthoc, fit_posthoc_sharded, fit_rows, fit_sharded,
    posthoc_basis, with_data_points, ContextDesign, FitSummary, FspConfig,
};
pub use laplace::{
    laplace, laplace_sharded, DataSum, FspLaplace, FspLaplaceConfig, LaplaceBasis, LaplaceReport, ReduceStep,
};
pub use prior::{fit_classification_prior, fit_regression_prior};
pub use train::{objective, rkhs_regularizer, train, train_rows, train_sharded, ContextPrior, TrainOptions};
