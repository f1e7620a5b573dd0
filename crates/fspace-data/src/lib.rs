//! # fspace-data
//!
//! Data for the experiments, all reproducible and offline:
//!
//! * [`generators`]: the papers' synthetic tasks — [`sine`] (FSP-Laplace App. B.1),
//!   [`two_moons`] (scikit-learn's algorithm, standardised), [`cubic`] (generalised Laplace),
//!   and a documented synthetic [`ocean_current`] field on the Gulf of Mexico box (App. B.2).
//! * [`bundled`]: real data shipped in `datasets/` (Mauna Loa CO₂, the Gulf of Mexico drifters,
//!   Boston housing, concrete, red wine quality, yacht, 8×8 digits, MNIST, Fashion-MNIST), with provenance in `datasets/README.md`.
//! * [`loaders`]: CSV (with header, optionally gzip) and IDX readers with row/column-precise
//!   errors, so users can bring the datasets that no registry ships.
//! * [`preprocess`]: k-fold with a validation fraction, chronological split, standardisation
//!   with exact inverse, one-hot encoding; context-point boxes come from
//!   [`fspace_context::BoundingBox::from_data`] (re-exported as [`BoundingBox`]).
#![doc = include_str!("../README.md")]

pub mod bundled;
pub mod error;
pub mod generators;
pub mod loaders;
pub mod preprocess;

pub use bundled::{
    boston, concrete, dataset_dir, digits, fashion_mnist, gulf_drifters, mauna_loa, mnist, sha256_hex,
    verified_bundled_file, wine_quality_red, yacht, Split, BUNDLED_SHA256,
};
pub use error::{DataError, Result};
pub use fspace_context::BoundingBox;
pub use generators::{cubic, ocean_current, ocean_current_field, sine, two_moons, Dataset, GULF_BOX};
pub use loaders::{read_csv, read_idx, read_idx_images, CellParser, IdxArray, Table};
pub use preprocess::{chronological_split, distinct_rows, kfold, one_hot, Fold, OneHotLayout, Standardizer};
