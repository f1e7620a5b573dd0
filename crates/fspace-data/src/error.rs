//! Error type of the data crate.

use std::path::PathBuf;

use thiserror::Error;

/// Everything that can go wrong when generating, loading or splitting data.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum DataError {
    /// A shape, non-finite, empty or out-of-range input (the workspace's shared
    /// [`fspace_input::InputError`]).
    #[error(transparent)]
    Input(#[from] fspace_input::InputError),
    /// A file could not be opened or read.
    #[error("cannot read {path}: {message}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS / decoder message.
        message: String,
    },
    /// A cell that is not a number, or a malformed record.
    #[error("{path}: row {row}, column {column}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based data row (after the header).
        row: usize,
        /// 0-based column (or the column count for malformed records).
        column: usize,
        /// What was wrong.
        message: String,
    },
    /// A NaN or infinite cell.
    #[error("{path}: non-finite value in row {row}, column {column} ({name})")]
    NonFinite {
        /// The file.
        path: PathBuf,
        /// 1-based data row.
        row: usize,
        /// 0-based column.
        column: usize,
        /// The column's header name.
        name: String,
    },
    /// A record with the wrong number of columns.
    #[error("{path}: row {row} has {found} columns, the header has {expected}")]
    ColumnCount {
        /// The file.
        path: PathBuf,
        /// 1-based data row.
        row: usize,
        /// Header columns.
        expected: usize,
        /// Columns in this row.
        found: usize,
    },
    /// A file whose structure is wrong (bad magic number, truncated payload, empty table).
    #[error("{path}: corrupt or truncated file: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// A bundled file whose SHA-256 differs from the one recorded for it (`datasets/README.md`):
    /// edited, re-encoded, truncated or replaced. Restore it from the repository.
    #[error("{path}: the bundled file was modified (SHA-256 {found}, recorded {expected}); restore it from the repository")]
    ChecksumMismatch {
        /// The file.
        path: PathBuf,
        /// The recorded digest (hex).
        expected: String,
        /// The file's digest (hex).
        found: String,
    },
    /// A requested column does not exist.
    #[error("{path}: no column named {name:?}")]
    MissingColumn {
        /// The file.
        path: PathBuf,
        /// The column.
        name: String,
    },
}

/// Result alias of this crate.
pub type Result<T, E = DataError> = std::result::Result<T, E>;
