//! The real datasets shipped in the repository's `datasets/` folder (provenance, licences and
//! checksums in `datasets/README.md`). Nothing is downloaded: files are read from
//! `$FSPACE_DATASETS` if set, else from the workspace's `datasets/` directory. Every loader
//! here checks the file's SHA-256 against [`BUNDLED_SHA256`] before reading it, so a modified
//! copy is refused ([`DataError::ChecksumMismatch`]) instead of
//! silently changing the numbers; the general loaders (`read_csv`, `read_idx`, …) read a
//! user's own files unchecked.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use crate::error::{DataError, Result};
use crate::generators::Dataset;
use crate::loaders::{read_csv, read_idx_images};

/// The directory holding the bundled files.
pub fn dataset_dir() -> PathBuf {
    std::env::var_os("FSPACE_DATASETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../datasets")))
}

/// `(file under the datasets directory, SHA-256 in hex)` of every bundled file — the values
/// `datasets/README.md` records.
pub const BUNDLED_SHA256: &[(&str, &str)] = &[
    ("boston_housing.csv", "fd6aae7c42ed5998b4157a6149aa35d47c60fc0664c5bcfea5f3df4f423376cc"),
    ("concrete.csv", "c2690f237285ede14fa54fe05dbe6a83ce510f65de6a8c5f8cafd6cefd9f38e2"),
    ("mauna_loa_co2.csv", "8e8d277356c7f1e9204e127f52123a77d0bc9db222a994f4adcf4bf3788ef415"),
    ("gulfdata_train.csv", "dcd75987abb9fb1c35dd3d76c724f330523b1af236fa0a2b113ab0e8b8912751"),
    ("gulfdata_test.csv", "f4e50eec95fabc687795f3b2021c310fccd1f473e5dadefc653763af6663ab24"),
    ("yacht_hydrodynamics.data", "1638f9806fefc050259068b3a5d695431b2ed16020b7c57478af02f83081baf0"),
    ("winequality_red.csv", "f5eb6b494f4f6431698dce8fb15c356d091c2a5dc13f823742dcc9709a327b4a"),
    ("digits.csv.gz", "46abec6b12486ad9e51943373abcf22bbea1b5a51a1619b361570d8893f1464a"),
    ("mnist/t10k-images-idx3-ubyte.gz", "1a1a05eab793c14bb050b398624a11b0ffd1a2953baed553b1b9bd079e2a20be"),
    ("mnist/t10k-labels-idx1-ubyte.gz", "b91679a0acfe4ba0e50a2437a903084cba1f5f92592b016a25a7dfd00455798b"),
    ("mnist/train-images-idx3-ubyte.gz", "0b367032e93c5d0cea0925647cfdb18614af8ee15f83e6f2fc2ad904a6835971"),
    ("mnist/train-labels-idx1-ubyte.gz", "1787548bbe0bff1ec2ecdc0ef292b02df999e2d1a6002d27500982c652b17203"),
    (
        "fashion_mnist/t10k-images-idx3-ubyte.gz",
        "cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",
    ),
    (
        "fashion_mnist/t10k-labels-idx1-ubyte.gz",
        "8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",
    ),
    (
        "fashion_mnist/train-images-idx3-ubyte.gz",
        "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",
    ),
    (
        "fashion_mnist/train-labels-idx1-ubyte.gz",
        "0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",
    ),
];

/// The hex SHA-256 of a file.
pub fn sha256_hex(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path)
        .map_err(|e| DataError::Io { path: path.to_path_buf(), message: e.to_string() })?;
    Ok(Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect())
}

/// A file as last verified: path, length, modification time.
type FileStamp = (PathBuf, u64, Option<std::time::SystemTime>);

/// `dir/file` after checking its SHA-256 against [`BUNDLED_SHA256`]; `file` must be one of the
/// bundled names. A file is hashed once per process (keyed by path, length and modification
/// time, so an edit during the process is still caught).
pub fn verified_bundled_file(dir: &Path, file: &str) -> Result<PathBuf> {
    static VERIFIED: Mutex<Option<HashSet<FileStamp>>> = Mutex::new(None);
    let Some((_, expected)) = BUNDLED_SHA256.iter().find(|(name, _)| *name == file) else {
        return Err(fspace_input::invalid(
            "bundled file",
            format!("{file:?} is not one of the bundled datasets"),
        )
        .into());
    };
    let path = dir.join(file);
    let meta =
        std::fs::metadata(&path).map_err(|e| DataError::Io { path: path.clone(), message: e.to_string() })?;
    let key = (path.clone(), meta.len(), meta.modified().ok());
    if VERIFIED.lock().map(|g| g.as_ref().is_some_and(|s| s.contains(&key))).unwrap_or(false) {
        return Ok(path);
    }
    let found = sha256_hex(&path)?;
    if found != *expected {
        return Err(DataError::ChecksumMismatch { path, expected: expected.to_string(), found });
    }
    if let Ok(mut guard) = VERIFIED.lock() {
        guard.get_or_insert_with(HashSet::new).insert(key);
    }
    Ok(path)
}

/// [`verified_bundled_file`] in [`dataset_dir`].
fn bundled(file: &str) -> Result<PathBuf> {
    verified_bundled_file(&dataset_dir(), file)
}

/// Mauna Loa monthly mean CO₂ (ppm), NOAA GML's record from March 1958 to June 2026 (820
/// months; Scripps before May 1974, NOAA after). Input: NOAA's `decimal date` (mid-month);
/// target: `average` (the monthly mean the papers model; gaps already interpolated by NOAA).
pub fn mauna_loa() -> Result<Dataset> {
    read_csv(bundled("mauna_loa_co2.csv")?, None)?.select(&["decimal date"], &["average"])
}

/// The Gulf of Mexico drifter task of FSP-Laplace App. B.2 / GPJax's "GulfDrifters" example:
/// `(train, test)` with inputs `(lon, lat)` in degrees and targets the velocity components
/// `(ubar, vbar)` in m/s. Train: the 20 drifter measurements; test: the 544 averaged velocities
/// on the regular 34 × 16 grid over [−90.8, −83.8] × [24.0, 27.5].
pub fn gulf_drifters() -> Result<(Dataset, Dataset)> {
    let read = |file: &str| read_csv(bundled(file)?, None)?.select(&["lon", "lat"], &["ubar", "vbar"]);
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
    let path = bundled("yacht_hydrodynamics.data")?;
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
    read_csv(bundled("boston_housing.csv")?, None)?.split_targets(&["MEDV"])
}

/// Concrete compressive strength (Yeh 1998; 1030 × 8 features, target `compressive_strength`).
pub fn concrete() -> Result<Dataset> {
    read_csv(bundled("concrete.csv")?, None)?.split_targets(&["compressive_strength"])
}

/// Red wine quality (Cortez et al. 2009; 1599 × 11 features, target `quality`).
pub fn wine_quality_red() -> Result<Dataset> {
    read_csv(bundled("winequality_red.csv")?, None)?.split_targets(&["quality"])
}

/// scikit-learn's 8×8 digits (1797 × 64 pixel counts 0–16, label 0–9). The file has no header
/// row, so it is parsed here directly.
pub fn digits() -> Result<Dataset> {
    use std::io::Read;
    let path = bundled("digits.csv.gz")?;
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
    read_idx_images(
        bundled(&format!("{folder}/{prefix}-images-idx3-ubyte.gz"))?,
        bundled(&format!("{folder}/{prefix}-labels-idx1-ubyte.gz"))?,
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
