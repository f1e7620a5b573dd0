//! File formats: CSV with a header (plain or gzip) and IDX (MNIST's format, plain or gzip).
//! Users bring the datasets that no registry ships (UCI energy, kin8nm, …, KMNIST) in these
//! formats through the same functions.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use flate2::read::GzDecoder;
use nalgebra::DMatrix;

use crate::error::{DataError, Result};

fn open(path: &Path) -> Result<Box<dyn Read>> {
    let file =
        File::open(path).map_err(|e| DataError::Io { path: path.to_path_buf(), message: e.to_string() })?;
    let reader = BufReader::new(file);
    Ok(if path.extension().is_some_and(|e| e == "gz") {
        Box::new(GzDecoder::new(reader))
    } else {
        Box::new(reader)
    })
}

/// A numeric table read from a CSV file: the header names and an `n × c` matrix.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    /// The file it came from.
    pub path: PathBuf,
    /// Column names from the header.
    pub header: Vec<String>,
    /// The cells.
    pub data: DMatrix<f64>,
}

impl Table {
    /// Index of a named column.
    pub fn column_index(&self, name: &str) -> Result<usize> {
        self.header
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| DataError::MissingColumn { path: self.path.clone(), name: name.to_string() })
    }
    /// Inputs from the named `features` and targets from the named `targets` columns (in the
    /// order given); other columns are dropped.
    pub fn select(&self, features: &[&str], targets: &[&str]) -> Result<crate::Dataset> {
        let x_idx = features.iter().map(|c| self.column_index(c)).collect::<Result<Vec<_>>>()?;
        let t_idx = targets.iter().map(|c| self.column_index(c)).collect::<Result<Vec<_>>>()?;
        Ok(crate::Dataset {
            x: self.data.select_columns(&x_idx),
            y: self.data.select_columns(&t_idx),
            feature_names: features.iter().map(|c| c.to_string()).collect(),
            target_names: targets.iter().map(|c| c.to_string()).collect(),
        })
    }
    /// Splits into inputs (all other columns) and targets (the named columns).
    pub fn split_targets(&self, targets: &[&str]) -> Result<crate::Dataset> {
        let t_idx = targets.iter().map(|t| self.column_index(t)).collect::<Result<Vec<_>>>()?;
        let x_idx: Vec<usize> = (0..self.header.len()).filter(|i| !t_idx.contains(i)).collect();
        Ok(crate::Dataset {
            x: self.data.select_columns(&x_idx),
            y: self.data.select_columns(&t_idx),
            feature_names: x_idx.iter().map(|&i| self.header[i].clone()).collect(),
            target_names: t_idx.iter().map(|&i| self.header[i].clone()).collect(),
        })
    }
}

/// Maps `(column name, raw cell)` to a number, or `None` for plain `f64` parsing.
pub type CellParser<'a> = &'a dyn Fn(&str, &str) -> Option<f64>;

/// Reads a CSV file with a header row whose cells are all numbers (`.gz` is decompressed).
/// Lines starting with `#` are comments (NOAA's files carry their terms of use that way).
/// `parse` maps a cell to a number for columns that need it (e.g. dates): it receives the
/// column name and the raw text and returns `None` to fall back to plain `f64` parsing.
///
/// Errors name the file, row and column: unreadable or truncated files, records with the wrong
/// number of columns, non-numeric cells, and NaN / infinite cells.
pub fn read_csv(path: impl AsRef<Path>, parse: Option<CellParser<'_>>) -> Result<Table> {
    let path = path.as_ref();
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(true)
        .comment(Some(b'#'))
        .from_reader(open(path)?);
    let header: Vec<String> = reader
        .headers()
        .map_err(|e| DataError::Corrupt {
            path: path.to_path_buf(),
            reason: format!("unreadable header: {e}"),
        })?
        .iter()
        .map(|h| h.trim().to_string())
        .collect();
    if header.is_empty() || header.iter().all(|h| h.is_empty()) {
        return Err(DataError::Corrupt { path: path.to_path_buf(), reason: "empty header".into() });
    }
    let mut cells = Vec::new();
    let mut rows = 0;
    for (r, record) in reader.records().enumerate() {
        let row = r + 1;
        let record = record.map_err(|e| DataError::Corrupt {
            path: path.to_path_buf(),
            reason: format!("row {row}: {e}"),
        })?;
        if record.len() != header.len() {
            return Err(DataError::ColumnCount {
                path: path.to_path_buf(),
                row,
                expected: header.len(),
                found: record.len(),
            });
        }
        for (column, raw) in record.iter().enumerate() {
            let raw = raw.trim();
            let value = match parse.and_then(|p| p(&header[column], raw)) {
                Some(v) => v,
                None => raw.parse::<f64>().map_err(|_| DataError::Parse {
                    path: path.to_path_buf(),
                    row,
                    column,
                    message: format!("{raw:?} in column {:?} is not a number", header[column]),
                })?,
            };
            if !value.is_finite() {
                return Err(DataError::NonFinite {
                    path: path.to_path_buf(),
                    row,
                    column,
                    name: header[column].clone(),
                });
            }
            cells.push(value);
        }
        rows += 1;
    }
    if rows == 0 {
        return Err(DataError::Corrupt { path: path.to_path_buf(), reason: "no data rows".into() });
    }
    Ok(Table {
        path: path.to_path_buf(),
        header: header.clone(),
        data: DMatrix::from_row_slice(rows, header.len(), &cells),
    })
}

/// An IDX array of unsigned bytes (the MNIST family's format).
#[derive(Debug, Clone, PartialEq)]
pub struct IdxArray {
    /// Dimensions (e.g. `[60000, 28, 28]`).
    pub dims: Vec<usize>,
    /// Row-major bytes.
    pub data: Vec<u8>,
}

/// Reads an IDX file of type `u8` (magic `0x00000803` images or `0x00000801` labels, any rank);
/// `.gz` is decompressed. Checks the magic number and that the payload has exactly the size the
/// header announces.
pub fn read_idx(path: impl AsRef<Path>) -> Result<IdxArray> {
    let path = path.as_ref();
    let mut bytes = Vec::new();
    open(path)?.read_to_end(&mut bytes).map_err(|e| DataError::Corrupt {
        path: path.to_path_buf(),
        reason: format!("cannot decode: {e}"),
    })?;
    let corrupt = |reason: String| DataError::Corrupt { path: path.to_path_buf(), reason };
    if bytes.len() < 4 {
        return Err(corrupt("shorter than the 4-byte magic number".into()));
    }
    if bytes[0] != 0 || bytes[1] != 0 || bytes[2] != 0x08 {
        return Err(corrupt(format!("magic {:02x?} is not an unsigned-byte IDX file", &bytes[..4])));
    }
    let rank = bytes[3] as usize;
    let header_len = 4 + 4 * rank;
    if rank == 0 || bytes.len() < header_len {
        return Err(corrupt(format!("rank {rank} header does not fit in {} bytes", bytes.len())));
    }
    let dims: Vec<usize> = (0..rank)
        .map(|k| u32::from_be_bytes(bytes[4 + 4 * k..8 + 4 * k].try_into().expect("4 bytes")) as usize)
        .collect();
    let expected: usize = dims.iter().product();
    let payload = bytes.len() - header_len;
    if payload != expected {
        return Err(corrupt(format!("header announces {dims:?} = {expected} bytes, payload has {payload}")));
    }
    Ok(IdxArray { dims, data: bytes.split_off(header_len) })
}

/// Images and labels from a pair of IDX files: inputs are pixels scaled to `[0, 1]`, one row
/// per image (`n × h·w`), targets the labels. Errors if the counts differ.
pub fn read_idx_images(images: impl AsRef<Path>, labels: impl AsRef<Path>) -> Result<crate::Dataset> {
    let (img, lab) = (read_idx(&images)?, read_idx(&labels)?);
    if img.dims.len() < 2 || lab.dims.len() != 1 || img.dims[0] != lab.dims[0] {
        return Err(DataError::Corrupt {
            path: images.as_ref().to_path_buf(),
            reason: format!("images {:?} and labels {:?} do not match", img.dims, lab.dims),
        });
    }
    let n = img.dims[0];
    let d = img.data.len() / n;
    Ok(crate::Dataset {
        x: DMatrix::from_fn(n, d, |i, j| img.data[i * d + j] as f64 / 255.0),
        y: DMatrix::from_fn(n, 1, |i, _| lab.data[i] as f64),
        feature_names: (0..d).map(|j| format!("pixel{j}")).collect(),
        target_names: vec!["label".into()],
    })
}
