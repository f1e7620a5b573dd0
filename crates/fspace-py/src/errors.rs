//! Rust errors → Python exceptions, by kind; the message is always the Rust error's text.
//!
//! | kind | Python | Rust errors |
//! |---|---|---|
//! | bad input | `ValueError` | `InputError`, invalid targets, hyperparameters, configurations, too many inducing points |
//! | unsupported | `NotImplementedError` | a likelihood or structure the method does not have |
//! | too large | `MemoryError` | a curvature over its size limit, a request over the memory budget (`InputError::TooLarge`) |
//! | numerical | `fspace.NumericalError` | non-PSD matrices, failed factorisations, divergence, breakdown |
//! | interrupted | `KeyboardInterrupt` (or the exception Python's signal handler raised) | `InputError::Interrupted`: a Ctrl-C seen between two steps (`src/interrupt.rs`) |
//!
//! Wrapper variants (`Core`, `Nn`, `Kernel`, `Linalg`, `Gp`, …) take the kind of the error they
//! wrap, and a `CoreError::Method` the kind of the method error inside it.

use fspace_context::ContextError;
use fspace_core::{CoreError, PersistError};
use fspace_fsp_laplace::FspError;
use fspace_gfsvi::GfsviError;
use fspace_gp::GpError;
use fspace_input::InputError;
use fspace_interop::InteropError;
use fspace_kernels::KernelError;
use fspace_laplace::LaplaceError;
use fspace_linalg::LinalgError;
use fspace_nn::NnError;
use fspace_valla::VallaError;
use pyo3::exceptions::{
    PyKeyboardInterrupt, PyMemoryError, PyNotImplementedError, PyRuntimeError, PyValueError,
};
use pyo3::PyErr;

pyo3::create_exception!(
    fspace,
    NumericalError,
    PyRuntimeError,
    "A numerical failure inside fspace (a matrix that is not positive definite, an iteration that broke down)."
);

/// What went wrong, as Python classes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Value,
    Unsupported,
    TooLarge,
    Numerical,
    Interrupted,
}

/// An error of one of fspace's crates, classed by [`Kind`].
pub(crate) trait Classify: std::fmt::Display {
    fn kind(&self) -> Kind;
}

/// The Python exception for `e`: its kind's class with `e`'s text.
pub(crate) fn raise<E: Classify>(e: E) -> PyErr {
    let text = e.to_string();
    match e.kind() {
        Kind::Value => PyValueError::new_err(text),
        Kind::Unsupported => PyNotImplementedError::new_err(text),
        Kind::TooLarge => PyMemoryError::new_err(text),
        Kind::Numerical => NumericalError::new_err(text),
        Kind::Interrupted => PyKeyboardInterrupt::new_err(text),
    }
}

/// A `ValueError` for a saved file that does not load, naming what was expected; a file of
/// another kind is named by the Python class that saves it, not by its Rust type.
pub(crate) fn persist_error(what: &str, e: PersistError) -> PyErr {
    match &e {
        PersistError::WrongType { expected, found } => PyValueError::new_err(format!(
            "not a saved fspace {what}: the file holds {}, not {}",
            saved_kind(found),
            saved_kind(expected)
        )),
        _ => PyValueError::new_err(format!("not a saved fspace {what}: {e}")),
    }
}

/// What a saved file's kind is to a Python user: the class (and method) that writes it.
fn saved_kind(kind: &str) -> String {
    let name = match kind {
        "fspace_fsp_laplace::FspLaplace" => "an FSPLaplace posterior",
        "fspace_gfsvi::LinearizedPosterior" => "a GFSVI posterior",
        "fspace_gfsvi::WeightSamplePosterior" => "a weight-sample posterior (FVI, mean-field VI)",
        "fspace_gp::ExactGp" => "an ExactGP posterior",
        "fspace_gp::LaplaceGpClassifier" => "a GP classifier",
        "fspace_gp::SparseDirichletGp" => "a sparse Dirichlet GP classifier",
        "fspace_gp::Svgp" => "a sparse variational GP",
        "fspace_laplace::LaplacePosterior" => "a Laplace posterior",
        "fspace_valla::EllaPosterior" => "an ELLA posterior",
        "fspace_valla::VallaPosterior" => "a VaLLA posterior",
        other => return format!("a {other:?} file"),
    };
    name.to_string()
}

/// A `ValueError` with `text`.
pub(crate) fn value_error(text: impl Into<String>) -> PyErr {
    PyValueError::new_err(text.into())
}

impl Classify for InputError {
    fn kind(&self) -> Kind {
        match self {
            InputError::Interrupted { .. } => Kind::Interrupted,
            InputError::TooLarge { .. } => Kind::TooLarge,
            _ => Kind::Value,
        }
    }
}

impl Classify for InteropError {
    fn kind(&self) -> Kind {
        Kind::Value
    }
}

impl Classify for ContextError {
    fn kind(&self) -> Kind {
        Kind::Value
    }
}

impl Classify for LinalgError {
    fn kind(&self) -> Kind {
        match self {
            LinalgError::Input(e) => e.kind(),
            _ => Kind::Numerical,
        }
    }
}

impl Classify for KernelError {
    fn kind(&self) -> Kind {
        match self {
            KernelError::Linalg(e) => e.kind(),
            KernelError::Unsupported(_) => Kind::Unsupported,
            _ => Kind::Value,
        }
    }
}

impl Classify for NnError {
    fn kind(&self) -> Kind {
        match self {
            NnError::Input(e) => e.kind(),
            NnError::Likelihood(_) => Kind::Value,
            NnError::Unsupported { .. } => Kind::Unsupported,
            _ => Kind::Numerical,
        }
    }
}

impl Classify for CoreError {
    fn kind(&self) -> Kind {
        match self {
            CoreError::Input(e) => e.kind(),
            CoreError::InvalidTarget { .. } => Kind::Value,
            CoreError::Unsupported { .. } => Kind::Unsupported,
            CoreError::NotPsd { .. } => Kind::Numerical,
            CoreError::Method { source, .. } => {
                macro_rules! inner {
                    ($($t:ty),*) => {$(
                        if let Some(e) = source.downcast_ref::<$t>() {
                            return e.kind();
                        }
                    )*};
                }
                inner!(
                    LaplaceError,
                    FspError,
                    GfsviError,
                    VallaError,
                    GpError,
                    NnError,
                    KernelError,
                    LinalgError,
                    InputError,
                    CoreError
                );
                Kind::Numerical
            }
        }
    }
}

impl Classify for LaplaceError {
    fn kind(&self) -> Kind {
        match self {
            LaplaceError::Input(e) => e.kind(),
            LaplaceError::Nn(e) => e.kind(),
            LaplaceError::Core(e) => e.kind(),
            LaplaceError::Linalg(e) => e.kind(),
            LaplaceError::TooLarge { .. } => Kind::TooLarge,
            LaplaceError::Unsupported { .. } => Kind::Unsupported,
            // Another fit's record, or an unreadable one: a bad file argument.
            LaplaceError::EmCheckpoint { .. } => Kind::Value,
        }
    }
}

impl Classify for GpError {
    fn kind(&self) -> Kind {
        match self {
            GpError::Input(e) => e.kind(),
            GpError::Kernel(e) => e.kind(),
            GpError::Linalg(e) => e.kind(),
            GpError::Core(e) => e.kind(),
            _ => Kind::Numerical,
        }
    }
}

impl Classify for FspError {
    fn kind(&self) -> Kind {
        match self {
            FspError::Input(e) => e.kind(),
            FspError::Network(e) => e.kind(),
            FspError::Kernel(e) => e.kind(),
            FspError::Linalg(e) => e.kind(),
            FspError::Core(e) => e.kind(),
            FspError::Context(e) => e.kind(),
            FspError::Gp(e) => e.kind(),
        }
    }
}

impl Classify for GfsviError {
    fn kind(&self) -> Kind {
        match self {
            GfsviError::Input(e) => e.kind(),
            GfsviError::Nn(e) => e.kind(),
            GfsviError::Core(e) => e.kind(),
            GfsviError::Kernel(e) => e.kind(),
            GfsviError::Context(e) => e.kind(),
            _ => Kind::Numerical,
        }
    }
}

impl Classify for VallaError {
    fn kind(&self) -> Kind {
        match self {
            VallaError::Input(e) => e.kind(),
            VallaError::Nn(e) => e.kind(),
            VallaError::Core(e) => e.kind(),
            VallaError::Linalg(e) => e.kind(),
            VallaError::Gp(e) => e.kind(),
            VallaError::TooManyPoints { .. }
            | VallaError::InvalidTarget { .. }
            | VallaError::RankDeficient { .. } => Kind::Value,
            _ => Kind::Numerical,
        }
    }
}

impl Classify for fspace_metrics::MetricsError {
    fn kind(&self) -> Kind {
        match self {
            fspace_metrics::MetricsError::Input(e) => e.kind(),
            // A NaN score, a label out of range, a row that is not a probability vector.
            _ => Kind::Value,
        }
    }
}
