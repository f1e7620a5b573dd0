//! The fspace experiment harness as a library: [`harness`] (CLI, registry types, run folder,
//! log, typed checkpoint, plots, publishing), [`protocols`] (data, splits and evaluation shared
//! by experiments) and [`experiments`] (one module per experiment, its typed metrics, and the
//! registry [`EXPERIMENTS`]). The `xtask` binary (`cargo xtask`) is a thin `main` over it; the
//! end-to-end tests in `xtask/tests/` run experiments through it and read their typed metrics.

pub mod experiments;
pub mod harness;
pub mod protocols;

pub use experiments::EXPERIMENTS;
