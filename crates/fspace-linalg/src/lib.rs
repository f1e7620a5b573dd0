//! # fspace-linalg
//!
//! Matrix-free linear algebra for function-space inference. Everything here works on a square
//! [`LinearOperator`] `A` known only through products `A v`, so kernel Gram matrices with
//! `n = 10⁴` context points or Gauss–Newton matrices of networks with `p = 10⁵` weights are never
//! formed.
//!
//! This crate is the bottom of the workspace: it depends on nalgebra only.
#![doc = include_str!("../README.md")]

pub mod error;
pub mod operator;

pub use error::{LinalgError, Result};
pub use operator::{
    to_dense, DenseOperator, DiagonalOperator, FnOperator, LinearOperator, ScaledOperator,
    SumOperator,
};
