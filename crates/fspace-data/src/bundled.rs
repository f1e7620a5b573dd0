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

/// Mauna Loa monthly mean CO₂ (ppm), NOAA GML's record from March 1958 to June 2026 (820
/// months; Scripps before May 1974, NOAA after). Input: NOAA's `decimal date` (mid-month);
/// target: `average` (the monthly mean the papers model; gaps already interpolated by NOAA).
pub fn mauna_loa() -> Result<Dataset> {
    read_csv(dataset_dir().join("mauna_loa_co2.csv"), None)?.select(&["decimal date"], &["average"])
}

/// The Gulf of Mexico drifter task of FSP-Laplace App. B.2 / GPJax's "GulfDrifters" example:
/// `(train, test)` with inputs `(lon, lat)` in degrees and targets the velocity components
/// `(ubar, vbar)` in m/s. Train: the 20 drifter measurements; test: the 544 averaged velocities
/// on the regular 34 × 16 grid over [−90.8, −83.8] × [24.0, 27.5].
pub fn gulf_drifters() -> Result<(Dataset, Dataset)> {
    let read =
        |file: &str| read_csv(dataset_dir().join(file), None)?.select(&["lon", "lat"], &["ubar", "vbar"]);
    Ok((read("gulfdata_train.csv")?, read("gulfdata_test.csv")?))
}

/// Yacht hydrodynamics (Gerritsma et al., UCI; 308 × 6 hull features, target the residuary
/// resistance per unit weight of displacement). The file is whitespace-separated, no header.
pub fn yacht() -> Result<Dataset> {
    const NAMES: [&str; 7] = [
        "lcb_position",
        "prismatic_coefficient",
        "length_displacement_ratio",
        "beam_draught_ratio",
        "length_beam_ratio",
        "froude_number",
        "residuary_resistance",
    ];
    let path = dataset_dir().join("yacht_hydrodynamics.data");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| crate::DataError::Io { path: path.clone(), message: e.to_string() })?;
    let table = parse_headerless_table(&path, &text, NAMES.len(), None)?;
    Ok(Dataset {
        x: table.columns(0, 6).into_owned(),
        y: table.columns(6, 1).into_owned(),
        feature_names: NAMES[..6].iter().map(|s| s.to_string()).collect(),
        target_names: vec![NAMES[6].into()],
    })
}

/// Parses numeric rows without a header (blank lines skipped) with exactly `cols` fields each,
/// separated by `sep` (`None`: any whitespace).
fn parse_headerless_table(
    path: &std::path::Path,
    text: &str,
    cols: usize,
    sep: Option<char>,
) -> Result<nalgebra::DMatrix<f64>> {
    let mut cells = Vec::new();
    let mut rows = 0;
    for (r, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let fields: Vec<&str> = match sep {
            Some(c) => line.split(c).map(str::trim).collect(),
            None => line.split_whitespace().collect(),
        };
        if fields.len() != cols {
            return Err(crate::DataError::ColumnCount {
                path: path.to_path_buf(),
                row: r + 1,
                expected: cols,
                found: fields.len(),
            });
        }
        for (column, f) in fields.iter().enumerate() {
            let v: f64 = f.parse().map_err(|_| crate::DataError::Parse {
                path: path.to_path_buf(),
                row: r + 1,
                column,
                message: format!("{f:?} is not a number"),
            })?;
            if !v.is_finite() {
                return Err(crate::DataError::NonFinite {
                    path: path.to_path_buf(),
                    row: r + 1,
                    column,
                    name: format!("column {column}"),
                });
            }
            cells.push(v);
        }
        rows += 1;
    }
    if rows == 0 {
        return Err(crate::DataError::Corrupt { path: path.to_path_buf(), reason: "no data rows".into() });
    }
    Ok(nalgebra::DMatrix::from_row_slice(rows, cols, &cells))
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
    let table = parse_headerless_table(&path, &text, 65, Some(','))?;
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
