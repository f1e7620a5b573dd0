//! The crate's error type.

use thiserror::Error;

/// Everything that can go wrong reading or writing tensor files and matching them to a network.
/// `file` is the path (or the label given to an in-memory buffer) the error is about.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum InteropError {
    /// The file could not be opened, read or written.
    #[error("{file}: {reason}")]
    Io {
        /// The file.
        file: String,
        /// The operating system's message.
        reason: String,
    },
    /// The file ends before the data its header announces (an interrupted copy or download).
    #[error("{file} is truncated: {reason}")]
    Truncated {
        /// The file.
        file: String,
        /// What was missing.
        reason: String,
    },
    /// The file is not a valid safetensors / .npz / .npy file.
    #[error("{file} is not a valid {format} file: {reason}")]
    Corrupt {
        /// The file.
        file: String,
        /// The format it was read as.
        format: &'static str,
        /// The parser's message.
        reason: String,
    },
    /// The file name's extension is none of `.safetensors`, `.npz`, `.npy`.
    #[error("{file}: unknown tensor file format (expected .safetensors, .npz or .npy)")]
    UnknownFormat {
        /// The file.
        file: String,
    },
    /// A tensor of an element type fspace does not read (integers, f16, bf16, objects, …).
    #[error("{file}: tensor `{name}` has dtype {dtype}; only 64- and 32-bit floats are read")]
    UnsupportedDtype {
        /// The file.
        file: String,
        /// The tensor.
        name: String,
        /// Its element type as the file names it.
        dtype: String,
    },
    /// A tensor the network needs is not in the file.
    #[error("{file}: tensor `{name}` is missing (the file has: {available})")]
    MissingTensor {
        /// The file.
        file: String,
        /// The missing tensor.
        name: String,
        /// The tensors the file does have, comma-separated.
        available: String,
    },
    /// A tensor's shape differs from what the network needs.
    #[error("{file}: tensor `{name}` has shape {found:?}, the network needs {expected:?}")]
    ShapeMismatch {
        /// The file.
        file: String,
        /// The tensor.
        name: String,
        /// The shape the network needs.
        expected: Vec<usize>,
        /// The shape in the file.
        found: Vec<usize>,
    },
    /// A tensor whose name is not `<layer>.weight` or `<layer>.bias`.
    #[error("{file}: tensor `{name}` is not a layer's weight or bias (remove it from the map, or name the layers explicitly)")]
    UnknownName {
        /// The file.
        file: String,
        /// The tensor.
        name: String,
    },
    /// Tensors left over after every layer of the network took its weight and bias: the file
    /// holds a different (larger) network, or buffers fspace has no place for.
    #[error("{file}: tensors not used by the network: {names}")]
    UnusedTensors {
        /// The file.
        file: String,
        /// The left-over tensors, comma-separated.
        names: String,
    },
    /// The file holds a different number of weight layers than the network.
    #[error("{file}: the file holds {found} {kind} layers, the network has {expected}")]
    LayerCount {
        /// The file.
        file: String,
        /// `dense` or `convolutional`.
        kind: &'static str,
        /// The network's count.
        expected: usize,
        /// The file's count.
        found: usize,
    },
    /// The architecture cannot be read from the tensors alone.
    #[error("{file}: cannot infer the architecture: {reason}")]
    Ambiguous {
        /// The file.
        file: String,
        /// Why.
        reason: String,
    },
    /// The file, a tensor or an archive member is larger than the caller allows
    /// ([`TensorLimits`](crate::TensorLimits)); refused before anything of that size is allocated.
    #[error("{file}: {what} is {size}, more than the limit of {limit} (raise TensorLimits to read it)")]
    TooLarge {
        /// The file.
        file: String,
        /// What is too large (`file bytes`, `elements of tensor `w``, `inflated bytes of member `w.npy``).
        what: String,
        /// Its size (as declared, or as read so far).
        size: u64,
        /// The limit in force.
        limit: u64,
    },
    /// NaN or ±∞ in a tensor.
    #[error("{file}: tensor `{name}` contains a non-finite value")]
    NonFinite {
        /// The file.
        file: String,
        /// The tensor.
        name: String,
    },
    /// A tensor's element count differs from the product of its shape, or an output array is
    /// malformed.
    #[error("invalid array `{name}`: {reason}")]
    InvalidArray {
        /// The array.
        name: String,
        /// Why.
        reason: String,
    },
    /// From the network crate (building the network from the loaded shapes).
    #[error(transparent)]
    Nn(#[from] fspace_nn::NnError),
    /// From the posterior contract (computing the exported predictions).
    #[error(transparent)]
    Core(#[from] fspace_core::CoreError),
}

/// Result alias of this crate.
pub type Result<T, E = InteropError> = std::result::Result<T, E>;

pub(crate) fn io_error(file: &str, e: &std::io::Error) -> InteropError {
    InteropError::Io { file: file.to_string(), reason: e.to_string() }
}
