//! The evaluation metrics as partial sums that merge (`fspace_metrics::partial`): Python's
//! `fspace.metrics` forms a shard's sums here, all-reduces them over a process group and
//! finishes the metrics here from the sum, so a sharded evaluation gives the whole test set's
//! numbers.

use fspace_metrics::{ClassificationSums, RegressionSums, Scores};
use numpy::{PyReadonlyArray1, PyReadonlyArray2};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::convert::matrix;
use crate::errors::raise;

/// The classification sums (`4 + 3·bins` values: points, NLL, correct, Brier, then ECE's bin
/// counts, confidences and correct counts) of probabilities `probs` (`n × C`) at labels `y`.
#[pyfunction]
#[pyo3(signature = (*, probs, y, bins))]
pub(crate) fn classification_sums(
    probs: PyReadonlyArray2<'_, f64>,
    y: PyReadonlyArray1<'_, f64>,
    bins: usize,
) -> PyResult<Vec<f64>> {
    let mut sums = ClassificationSums::new(bins).map_err(raise)?;
    sums.add(&matrix(&probs), y.as_slice()?).map_err(raise)?;
    Ok(sums.to_flat())
}

/// NLL, accuracy, Brier score and ECE (and the point count) of summed classification sums.
#[pyfunction]
#[pyo3(signature = (*, bins, flat))]
pub(crate) fn classification_metrics<'py>(
    py: Python<'py>,
    bins: usize,
    flat: Vec<f64>,
) -> PyResult<Bound<'py, PyDict>> {
    let sums = ClassificationSums::from_flat(bins, &flat).map_err(raise)?;
    let out = PyDict::new(py);
    out.set_item("nll", sums.nll().map_err(raise)?)?;
    out.set_item("accuracy", sums.accuracy().map_err(raise)?)?;
    out.set_item("brier", sums.brier().map_err(raise)?)?;
    out.set_item("ece", sums.ece().map_err(raise)?)?;
    out.set_item("n", sums.points())?;
    Ok(out)
}

/// The regression sums (15 values: points, NLL, squared error, CRPS, then CQM's coverage counts
/// at 11 levels) of Gaussian predictives `N(mean, var)` at targets `y` (flattened alike).
#[pyfunction]
#[pyo3(signature = (*, mean, var, y))]
pub(crate) fn regression_sums(
    mean: PyReadonlyArray1<'_, f64>,
    var: PyReadonlyArray1<'_, f64>,
    y: PyReadonlyArray1<'_, f64>,
) -> PyResult<Vec<f64>> {
    let mut sums = RegressionSums::new();
    sums.add(mean.as_slice()?, var.as_slice()?, y.as_slice()?).map_err(raise)?;
    Ok(sums.to_flat())
}

/// NLL, RMSE, CRPS, CQM and its coverage curve `[(α, γ)]` (and the point count) of summed
/// regression sums.
#[pyfunction]
pub(crate) fn regression_metrics<'py>(py: Python<'py>, flat: Vec<f64>) -> PyResult<Bound<'py, PyDict>> {
    let sums = RegressionSums::from_flat(&flat).map_err(raise)?;
    let out = PyDict::new(py);
    out.set_item("nll", sums.nll().map_err(raise)?)?;
    out.set_item("rmse", sums.rmse().map_err(raise)?)?;
    out.set_item("crps", sums.crps().map_err(raise)?)?;
    let (cqm, curve) = sums.cqm().map_err(raise)?;
    out.set_item("cqm", cqm)?;
    out.set_item("coverage", curve)?;
    out.set_item("n", sums.points())?;
    Ok(out)
}

/// ROC-AUC and the decision stump's accuracy separating out-of-distribution scores from
/// in-distribution ones (every score together: these rank, they do not sum).
#[pyfunction]
#[pyo3(signature = (*, id_scores, ood_scores))]
pub(crate) fn ood_metrics<'py>(
    py: Python<'py>,
    id_scores: PyReadonlyArray1<'_, f64>,
    ood_scores: PyReadonlyArray1<'_, f64>,
) -> PyResult<Bound<'py, PyDict>> {
    let mut scores = Scores::new();
    scores.add_in_distribution(id_scores.as_slice()?).map_err(raise)?;
    scores.add_out_of_distribution(ood_scores.as_slice()?).map_err(raise)?;
    let out = PyDict::new(py);
    out.set_item("roc_auc", scores.roc_auc().map_err(raise)?)?;
    out.set_item("stump_accuracy", scores.stump_accuracy().map_err(raise)?)?;
    Ok(out)
}
