//! # fspace-linalg
//!
//! Matrix-free linear algebra for function-space inference. Everything iterative here works on
//! a square [`LinearOperator`] `A` known only through products `A v`, so kernel Gram matrices
//! with `n = 10⁴` context points or Gauss–Newton matrices of networks with `p = 10⁵` weights
//! are never formed.
//!
//! * Operators: [`DenseOperator`], [`FnOperator`], [`SumOperator`], [`ScaledOperator`],
//!   [`DiagonalOperator`], [`LowRankPlusDiagonal`] (and the kernel Gram operator in
//!   `fspace-kernels`).
//! * [`lanczos()`] with full reorthogonalisation and embedded LDLᵀ; [`pinv_factor`] gives
//!   `F Fᵀ ≈ A†` (FSP-Laplace Alg. 2); Ritz pairs for truncated eigendecompositions;
//!   [`thick_restart_lanczos`] finds the top `k` eigenpairs in a basis of bounded size.
//! * [`cg()`] with [`DiagonalPreconditioner`] or [`PivotedCholeskyPreconditioner`].
//! * [`cholesky_jitter`] (reports its jitter), triangular solves, exact log-determinants,
//!   [`slq_logdet`] for operators, rank-k Cholesky [`cholesky_rank_update`]s and downdates.
//! * faer-backed Cholesky factor, triangular solves, dense products and SPD inverse in [`fast`].
//! * Small dense helpers: [`thin_svd`] of tall matrices in `O(p r²)`, [`sym_eigh`] (and
//!   [`sym_eigh_owned`], in place),
//!   [`psd_pinv_sqrt`].
//!
//! Every failure is a [`LinalgError`] naming what was wrong — iteration breakdown is reported
//! as an outcome in the info structs, never as a panic or a silent NaN.
//!
//! This crate is the bottom of the workspace: it depends on nalgebra, faer, rand and rayon.
#![doc = include_str!("../README.md")]

pub mod cg;
pub mod cholesky;
pub mod dense;
pub mod error;
pub mod fast;
pub mod lanczos;
pub mod logdet;
pub mod lowrank;
pub mod operator;
pub mod thick_restart;
mod vector_state;

pub use cg::{
    cg, cg_columns, pivoted_cholesky, BlockMap, CgColumnsInfo, CgConfig, CgInfo, DiagonalPreconditioner,
    PivotedCholeskyPreconditioner, Preconditioner,
};
pub use cholesky::{
    cholesky_jitter, cholesky_jitter_owned, cholesky_rank_update, JitterConfig, JitteredCholesky, UpdateSign,
};
pub use dense::{psd_pinv_sqrt, sym_eigh, sym_eigh_owned, thin_svd, thin_svd_owned, ThinSvd};
pub use error::{LinalgError, Result};
pub use lanczos::{
    lanczos, pinv_factor, pinv_factor_from, pinv_factor_restarted, probe_symmetry, LanczosConfig,
    LanczosDecomposition, LanczosInfo, PinvInfo, PinvMethod, RestartedPinvInfo, StartVector, StopReason,
    TridiagonalLdlt,
};
pub use logdet::{slq_logdet, SlqConfig, SlqEstimate};
pub use lowrank::LowRankPlusDiagonal;
pub use operator::{
    ensure_symmetric, relative_asymmetry, to_dense, DenseOperator, DiagonalOperator, FnOperator,
    LinearOperator, ScaledOperator, SumOperator, SymmetricEntries,
};
pub use thick_restart::{
    thick_restart_lanczos, ThickRestartConfig, ThickRestartInfo, ThickRestartStop, TopEigenpairs,
};
