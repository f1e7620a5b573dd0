//! The real datasets shipped in the repository's `datasets/` folder (provenance, licences and
//! checksums in `datasets/README.md`). Nothing is downloaded: files are read from
//! `$FSPACE_DATASETS` if set, else from the workspace's `datasets/` directory.

use std::path::PathBuf;

use crate::error::Result;
use crate::generators::Dataset;
use crate::loaders::{read_csv, read_idx_images};

/// The directory holding the bundled files.
pub fn dataset_dir() -> PathBuf {
    std::env::var_os("FSPACE_DATASETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../datasets")))
}

/// Mauna Loa monthly CO₂ (ppm), March 1958 – 2020 (741 months; Scripps, CC-BY-4.0). Input:
/// decimal year `year + (month − 1)/12`; targets: `CO2` (the series used by the papers).
pub fn mauna_loa() -> Result<Dataset> {
    let date = |col: &str, raw: &str| -> Option<f64> {
        if col != "Date" {
            return None;
        }
        let mut parts = raw.split('-');
        let year: f64 = parts.next()?.parse().ok()?;
        let month: f64 = parts.next()?.parse().ok()?;
        Some(year + (month - 1.0) / 12.0)
    };
    let table = read_csv(dataset_dir().join("mauna_loa_co2.csv"), Some(&date))?;
    let mut d = table.split_targets(&["CO2"])?;
    // Keep the date as the only input (drop the seasonally adjusted series).
    let keep = d.feature_names.iter().position(|n| n == "Date").expect("column exists");
    d.x = d.x.columns(keep, 1).into_owned();
    d.feature_names = vec!["year".into()];
    Ok(d)
}

/// Boston housing (506 × 13 features, target `MEDV`).
pub fn boston() -> Result<Dataset> {
    read_csv(dataset_dir().join("boston_housing.csv"), None)?.split_targets(&["MEDV"])
}

/// Concrete compressive strength (Yeh 1998; 1030 × 8 features, target `compressive_strength`).
pub fn concrete() -> Result<Dataset> {
    read_csv(dataset_dir().join("concrete.csv"), None)?.split_targets(&["compressive_strength"])
}

/// Red wine quality (Cortez et al. 2009; 1599 × 11 features, target `quality`).
pub fn wine_quality_red() -> Result<Dataset> {
    read_csv(dataset_dir().join("winequality_red.csv"), None)?.split_targets(&["quality"])
}

/// scikit-learn's 8×8 digits (1797 × 64 pixel counts 0–16, label 0–9). The file has no header
/// row, so it is parsed here directly.
pub fn digits() -> Result<Dataset> {
    use std::io::Read;
    let path = dataset_dir().join("digits.csv.gz");
    let file = std::fs::File::open(&path)
        .map_err(|e| crate::DataError::Io { path: path.clone(), message: e.to_string() })?;
    let mut text = String::new();
    flate2::read::GzDecoder::new(file)
        .read_to_string(&mut text)
        .map_err(|e| crate::DataError::Corrupt { path: path.clone(), reason: e.to_string() })?;
    let mut cells = Vec::new();
    let mut rows = 0;
    for (r, line) in text.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let fields: Vec<&str> = line.split(',').collect();
        if fields.len() != 65 {
            return Err(crate::DataError::ColumnCount {
                path: path.clone(),
                row: r + 1,
                expected: 65,
                found: fields.len(),
            });
        }
        for (column, f) in fields.iter().enumerate() {
            let v: f64 = f.trim().parse().map_err(|_| crate::DataError::Parse {
                path: path.clone(),
                row: r + 1,
                column,
                message: format!("{f:?} is not a number"),
            })?;
            cells.push(v);
        }
        rows += 1;
    }
    let table = nalgebra::DMatrix::from_row_slice(rows, 65, &cells);
    Ok(Dataset {
        x: table.columns(0, 64).into_owned(),
        y: table.columns(64, 1).into_owned(),
        feature_names: (0..64).map(|j| format!("pixel{j}")).collect(),
        target_names: vec!["label".into()],
    })
}

/// Which part of an image dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// The 60 000 training images.
    Train,
    /// The 10 000 test images.
    Test,
}

fn idx_pair(folder: &str, split: Split) -> Result<Dataset> {
    let prefix = match split {
        Split::Train => "train",
        Split::Test => "t10k",
    };
    let dir = dataset_dir().join(folder);
    read_idx_images(
        dir.join(format!("{prefix}-images-idx3-ubyte.gz")),
        dir.join(format!("{prefix}-labels-idx1-ubyte.gz")),
    )
}

/// MNIST (LeCun et al.), pixels scaled to [0, 1], 784 columns.
pub fn mnist(split: Split) -> Result<Dataset> {
    idx_pair("mnist", split)
}

/// Fashion-MNIST (Xiao et al. 2017), pixels scaled to [0, 1], 784 columns.
pub fn fashion_mnist(split: Split) -> Result<Dataset> {
    idx_pair("fashion_mnist", split)
}
