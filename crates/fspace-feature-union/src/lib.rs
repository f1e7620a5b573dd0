//! No code. This crate's dependencies turn on, in every build of the workspace, the features of
//! third-party crates that only some builds would otherwise enable (see its `Cargo.toml`), so
//! that `cargo test --workspace --release`, `cargo xtask` and maturin's build of `fspace-py`
//! share one compiled dependency graph instead of compiling it three times.
