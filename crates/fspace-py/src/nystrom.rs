//! `fspace._fspace.NystromFeatures`: ELLA's Nyström feature map `φ(x) = J(x) V` on a network
//! (fspace-valla's [`NystromFeatures`]), for laplace-torch's `ELLA` surface
//! (`fspace.ELLALaplace`), which keeps `G = Σ ΦᵢᵀHᵢΦᵢ`, `λ`, `σ` and `T` as tensors and streams
//! `G` over a loader. The network calls (the kernel at the Nyström points, the `K` VJPs, the
//! features of each batch) run here with the GIL released.

use fspace_nn::Network;
use fspace_valla::{FeatureRoute, NystromFeatures};
use nalgebra::DMatrix;
use numpy::ndarray::Array3;
use numpy::{PyArray1, PyArray2, PyArray3, PyReadonlyArray2};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::callback::{callback_network, PyNetwork};
use crate::convert::{activation, matrix, network, to_numpy};
use crate::errors::value_error;

/// `(Φ, f)` as numpy arrays: features `n × d' × K`, outputs `n × d'`.
type FeaturesAndOutputs<'py> = (Bound<'py, PyArray3<f64>>, Bound<'py, PyArray2<f64>>);

/// Builds the network of the keyword arguments shared with `Laplace`: a native network from
/// `state` / `activation_name` / `architecture`, or a torch model's `calls`.
pub(crate) fn any_network(
    state: Option<&Bound<'_, PyDict>>,
    activation_name: &str,
    architecture: Option<&Bound<'_, PyAny>>,
    calls: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyNetwork> {
    match (calls, state) {
        (Some(calls), _) => callback_network(calls, None),
        (None, Some(state)) => Ok(network(state, activation(activation_name)?, architecture)?.into()),
        (None, None) => Err(value_error("the network is missing: give state or calls")),
    }
}

/// ELLA's Nyström features of a network (module docs).
#[pyclass(name = "NystromFeatures", module = "fspace._fspace")]
pub(crate) struct PyNystromFeatures {
    net: PyNetwork,
    features: NystromFeatures,
}

#[pymethods]
impl PyNystromFeatures {
    /// `NystromFeatures(*, points, outputs, num_eigen, state=None, activation_name="",
    /// architecture=None, calls=None, saved=None)`: the map at `points` (`M × d`, one output
    /// index each) keeping `num_eigen` features, or the map `saved` by `to_json` (then `points`,
    /// `outputs` and `num_eigen` are not given).
    #[new]
    #[pyo3(signature = (*, points=None, outputs=None, num_eigen=None, state=None, activation_name="", architecture=None, calls=None, saved=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        points: Option<PyReadonlyArray2<'_, f64>>,
        outputs: Option<Vec<usize>>,
        num_eigen: Option<usize>,
        state: Option<&Bound<'_, PyDict>>,
        activation_name: &str,
        architecture: Option<&Bound<'_, PyAny>>,
        calls: Option<&Bound<'_, PyAny>>,
        saved: Option<&str>,
    ) -> PyResult<Self> {
        let net = any_network(state, activation_name, architecture, calls)?;
        let errors = net.errors();
        let features = match (saved, points, outputs, num_eigen) {
            (Some(text), None, None, None) => {
                let features: NystromFeatures = serde_json::from_str(text)
                    .map_err(|e| value_error(format!("the saved Nyström feature map does not parse: {e}")))?;
                features.check(&net).map_err(crate::errors::raise)?;
                features
            }
            (None, Some(points), Some(outputs), Some(num_eigen)) => {
                let points = matrix(&points);
                py.detach(|| NystromFeatures::build(&net, points, outputs, num_eigen, FeatureRoute::Auto))
                    .map_err(|e| errors.raise(e))?
            }
            _ => return Err(value_error("give either saved, or points, outputs and num_eigen")),
        };
        Ok(Self { net, features })
    }

    /// `(Φ, f)`: the features `n × d' × K` and the network's outputs `n × d'` at `x`.
    fn eval<'py>(&self, py: Python<'py>, x: PyReadonlyArray2<'py, f64>) -> PyResult<FeaturesAndOutputs<'py>> {
        let errors = self.net.errors();
        let x = matrix(&x);
        if x.ncols() != self.net.input_dim() {
            return Err(value_error(format!(
                "x has {} columns but the network takes {} inputs",
                x.ncols(),
                self.net.input_dim()
            )));
        }
        let (net, features) = (&self.net, &self.features);
        let (phi, f) = py
            .detach(|| -> fspace_valla::Result<(DMatrix<f64>, DMatrix<f64>)> {
                Ok((features.eval(net, &x)?, net.forward(&x)?))
            })
            .map_err(|e| errors.raise(e))?;
        let (n, q, k) = (x.nrows(), net.output_dim(), features.num_features());
        let cube = Array3::from_shape_fn((n, q, k), |(i, o, j)| phi[(i * q + o, j)]);
        Ok((PyArray3::from_owned_array(py, cube), to_numpy(py, &f)))
    }

    /// `K`, the features.
    #[getter]
    fn num_features(&self) -> usize {
        self.features.num_features()
    }

    /// The `M` eigenvalues of the unit NTK at the Nyström points (descending).
    #[getter]
    fn kernel_eigenvalues<'py>(&self, py: Python<'py>) -> Bound<'py, PyArray1<f64>> {
        PyArray1::from_slice(py, self.features.kernel_eigenvalues().as_slice())
    }

    /// The parameter directions `V` (`p × K`), laplace-torch's `dual_directions`.
    fn directions<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArray2<f64>>> {
        let errors = self.net.errors();
        let (net, features) = (&self.net, &self.features);
        let v = py.detach(|| features.directions(net)).map_err(|e| errors.raise(e))?;
        Ok(to_numpy(py, &v))
    }

    /// The feature map as JSON (the network is not in it: rebuild with the same model).
    fn to_json(&self) -> PyResult<String> {
        serde_json::to_string(&self.features).map_err(|e| value_error(e.to_string()))
    }
}
