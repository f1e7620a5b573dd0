//! # fspace-py
//!
//! The compiled module `fspace._fspace` of the Python package `fspace` (built by maturin from
//! `crates/fspace-py/pyproject.toml`). The pure-Python layer in `python/fspace/` turns a
//! PyTorch `nn.Sequential` (or a `state_dict` of numpy arrays) and Python kernel objects into
//! the arguments here; this module owns the numbers:
//!
//! * `Laplace` (`src/laplace.rs`): the linearised Laplace approximation of an MLP given as
//!   PyTorch's named tensors and one activation (or a torch model's callbacks), in
//!   laplace-torch's vocabulary (`"regression"` / `"classification"`, `hessian_structure`
//!   `"full" | "kron" | "diag" | "lowrank" | "ekfac"`, `subset_of_weights` `"all" |
//!   "last_layer" | "subnetwork"`): `fit` or a streamed fit (`begin_batches`, `add_batch`,
//!   `end_batches`), the curvature's eigenvalues and summary for the Python layer's evidence,
//!   the GLM moments at the λ and temperature set with `set_state`, network samples, weight
//!   samples, pickling through the posterior's versioned JSON. The laplace-torch surface
//!   (`fspace.Laplace`) is the Python layer's.
//! * The function-space methods, one class each (`src/methods/`): `FspLaplace`,
//!   `FspLaplacePosthoc`, `Gfsvi`, `Valla`, `Ella`, `ExactGp` — made from the method's Rust
//!   `Config` (a dict read through serde once; `Class.defaults()` holds the paper's values),
//!   the likelihood and the prior as a `GpPrior`'s dict; each declares what it reads
//!   (`Class.capabilities`) and fits a `Network` to a `DataSource` (arrays, rows read by
//!   position, batches pulled from Python; validation rows and a process shard with them) →
//!   `(Posterior, report)`. The posterior predicts, samples functions, returns trained weights
//!   and pickles. Progress goes to a Python callable.
//! * `NystromFeatures` (`src/nystrom.rs`): ELLA's Nyström feature map of a network, for the
//!   Python layer's laplace-torch `ELLA` surface, which keeps the posterior as tensors.
//! * `NtkKernel` (`src/ntk.rs`): a network's NTK blocks at a batch and inducing inputs and
//!   their gradient in the inducing inputs, for the laplace-torch `VaLLA` surface, which keeps
//!   the variational parameters as torch parameters.
//! * `gram(kernel, X, Y)`: a kernel's Gram matrix from its spec's dict; `rkhs_norm(prior, C, F,
//!   jitter)`: FSP-Laplace's regulariser at context points and its gradient in `F` (the
//!   `fspace.torch.FSPRegularizer` loss term).
//!
//! Long calls (fits, searches, predictions, samples) release the GIL; a progress callback
//! takes it back for its call only. A fit polls Python's signal handlers between its steps
//! (`src/interrupt.rs`), so Ctrl-C stops it within a fraction of a second with
//! `KeyboardInterrupt`, the object as it was. Errors keep the Rust error's text and map by kind
//! (`src/errors.rs`): bad input → `ValueError`, an unsupported request → `NotImplementedError`, a
//! curvature over its size limit → `MemoryError`, a numerical failure →
//! `fspace.NumericalError`. No input reaches a Rust panic.

mod callback;
mod convert;
mod errors;
mod functions;
mod interrupt;
mod laplace;
mod methods;
mod metrics;
mod ntk;
mod nystrom;

use pyo3::prelude::*;

/// The compiled half of the `fspace` Python package.
#[pymodule]
fn _fspace(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<laplace::PyLaplace>()?;
    m.add_class::<methods::PyPosterior>()?;
    m.add_class::<methods::source::PySource>()?;
    m.add_class::<methods::classes::Capabilities>()?;
    m.add_class::<methods::classes::PyNet>()?;
    m.add_class::<methods::classes::PyFspLaplace>()?;
    m.add_class::<methods::classes::PyFspLaplacePosthoc>()?;
    m.add_class::<methods::classes::PyGfsvi>()?;
    m.add_class::<methods::classes::PyValla>()?;
    m.add_class::<methods::classes::PyElla>()?;
    m.add_class::<methods::classes::PyExactGp>()?;
    m.add_class::<nystrom::PyNystromFeatures>()?;
    m.add_class::<ntk::PyNtkKernel>()?;
    m.add_function(wrap_pyfunction!(functions::gram, m)?)?;
    m.add_function(wrap_pyfunction!(functions::rkhs_norm, m)?)?;
    m.add_function(wrap_pyfunction!(functions::regularized_kl, m)?)?;
    m.add_function(wrap_pyfunction!(functions::gfsvi_objective, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::classification_sums, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::classification_metrics, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::regression_sums, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::regression_metrics, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::ood_metrics, m)?)?;
    m.add_function(wrap_pyfunction!(set_memory_limit, m)?)?;
    m.add_function(wrap_pyfunction!(memory_limit, m)?)?;
    m.add("NumericalError", m.py().get_type::<errors::NumericalError>())?;
    Ok(())
}

/// `set_memory_limit(bytes)`: the memory budget every fit, predictive and sampler checks before
/// its large allocations (`fspace_input::budget`), in bytes; `None` returns to
/// `FSPACE_MEMORY_LIMIT` or the machine's available memory.
#[pyfunction]
fn set_memory_limit(bytes: Option<u64>) -> PyResult<()> {
    if bytes == Some(0) {
        return Err(errors::value_error(
            "the memory limit must be at least 1 byte (None: the available memory)",
        ));
    }
    fspace_input::budget::set_limit(bytes);
    Ok(())
}

/// The memory budget in bytes now (`None` where it is unknown: no limit).
#[pyfunction]
fn memory_limit() -> Option<u64> {
    fspace_input::budget::limit()
}
