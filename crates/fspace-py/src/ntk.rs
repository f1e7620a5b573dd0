//! `fspace._fspace.NtkKernel`: the empirical neural tangent kernel's blocks of a network and
//! their pull-back to the inducing inputs, for laplace-torch's `VaLLA` surface
//! (`fspace.VaLLALaplace`). That layer keeps the variational factor, `λ` and `σ` as torch
//! parameters and evaluates the objective on the `M × M` and `b·d' × M` blocks; the network
//! calls — `f(X)`, `J(X) J(Z)ᵀ`, `J(Z) J(Z)ᵀ`, the per-point `J(xᵢ) J(xᵢ)ᵀ`, and the gradient
//! of `⟨C_xz, J(X)J(Z)ᵀ⟩ + ⟨C_zz, J(Z)J(Z)ᵀ⟩` in `Z` — run here with the GIL released
//! (the MLP's layer-wise rule, VaLLA App. F.3: no Jacobian is formed).

use fspace_nn::{Network, Outputs};
use nalgebra::DMatrix;
use numpy::ndarray::Array3;
use numpy::{PyArray2, PyArray3, PyReadonlyArray2};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::callback::PyNetwork;
use crate::convert::{matrix, to_numpy};
use crate::errors::value_error;
use crate::nystrom::any_network;

/// `(f, K_xz, K_zz, K_xx)`: outputs `n × d'`, the cross block `n·d' × M` (point-major rows),
/// the inducing block `M × M` and the per-point blocks `n × d' × d'`.
type Blocks<'py> = (
    Bound<'py, PyArray2<f64>>,
    Bound<'py, PyArray2<f64>>,
    Bound<'py, PyArray2<f64>>,
    Bound<'py, PyArray3<f64>>,
);

/// The unit NTK `J Jᵀ` of a network (module docs).
#[pyclass(name = "NtkKernel", module = "fspace._fspace")]
pub(crate) struct PyNtkKernel {
    net: PyNetwork,
}

impl PyNtkKernel {
    fn check_inputs(&self, what: &str, x: &DMatrix<f64>) -> PyResult<()> {
        if x.ncols() != self.net.input_dim() {
            return Err(value_error(format!(
                "{what} has {} columns but the network takes {} inputs",
                x.ncols(),
                self.net.input_dim()
            )));
        }
        if x.iter().any(|v| !v.is_finite()) {
            return Err(value_error(format!("{what} has a non-finite entry")));
        }
        Ok(())
    }

    /// `X` and `Z` as matrices after checking both and `Z`'s outputs.
    fn checked_pair(
        &self,
        x: &PyReadonlyArray2<'_, f64>,
        z: &PyReadonlyArray2<'_, f64>,
        outputs: &[usize],
    ) -> PyResult<(DMatrix<f64>, DMatrix<f64>)> {
        let (x, z) = (matrix(x), matrix(z));
        self.check_inputs("x", &x)?;
        self.check_inputs("the inducing inputs", &z)?;
        self.check_outputs(&z, outputs)?;
        Ok((x, z))
    }

    fn check_outputs(&self, z: &DMatrix<f64>, outputs: &[usize]) -> PyResult<()> {
        if outputs.len() != z.nrows() {
            return Err(value_error(format!(
                "{} inducing outputs for {} inducing inputs: give one output index per input",
                outputs.len(),
                z.nrows()
            )));
        }
        let q = self.net.output_dim();
        if let Some(bad) = outputs.iter().find(|&&o| o >= q) {
            return Err(value_error(format!("inducing output {bad} is not below the network's {q} outputs")));
        }
        Ok(())
    }
}

#[pymethods]
impl PyNtkKernel {
    /// `NtkKernel(*, state=None, activation_name="", architecture=None, calls=None)`: the
    /// network as `Laplace` takes it (a native network's weights, or a torch model's calls).
    #[new]
    #[pyo3(signature = (*, state=None, activation_name="", architecture=None, calls=None))]
    fn new(
        state: Option<&Bound<'_, PyDict>>,
        activation_name: &str,
        architecture: Option<&Bound<'_, PyAny>>,
        calls: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        Ok(Self { net: any_network(state, activation_name, architecture, calls)? })
    }

    /// `d'`, the network's outputs.
    #[getter]
    fn output_dim(&self) -> usize {
        self.net.output_dim()
    }

    /// `(f(X), J(X)J(Z)ᵀ, J(Z)J(Z)ᵀ, [J(xᵢ)J(xᵢ)ᵀ])` with every output of `X` (rows
    /// point-major) and output `outputs[m]` of inducing input `m`.
    fn blocks<'py>(
        &self,
        py: Python<'py>,
        x: PyReadonlyArray2<'py, f64>,
        z: PyReadonlyArray2<'py, f64>,
        outputs: Vec<usize>,
    ) -> PyResult<Blocks<'py>> {
        let (x, z) = self.checked_pair(&x, &z, &outputs)?;
        let errors = self.net.errors();
        let net = &self.net;
        let (f, kxz, kzz, kxx) = py
            .detach(|| -> fspace_nn::Result<_> {
                let f = net.forward(&x)?;
                let (kxz, kzz) = net.ntk_pair(&x, Outputs::All, &z, Outputs::One(&outputs))?;
                Ok((f, kxz, kzz, net.ntk_diagonal(&x)?))
            })
            .map_err(|e| errors.raise(e))?;
        let q = net.output_dim();
        let cube = Array3::from_shape_fn((x.nrows(), q, q), |(i, a, b)| kxx[i][(a, b)]);
        Ok((to_numpy(py, &f), to_numpy(py, &kxz), to_numpy(py, &kzz), PyArray3::from_owned_array(py, cube)))
    }

    /// `J(X)J(X)ᵀ` (`n·d' × n·d'`, rows point-major): the joint predictive's prior block.
    fn joint_block<'py>(
        &self,
        py: Python<'py>,
        x: PyReadonlyArray2<'py, f64>,
    ) -> PyResult<Bound<'py, PyArray2<f64>>> {
        let x = matrix(&x);
        self.check_inputs("x", &x)?;
        let errors = self.net.errors();
        let net = &self.net;
        let k =
            py.detach(|| net.ntk_block(&x, Outputs::All, &x, Outputs::All)).map_err(|e| errors.raise(e))?;
        Ok(to_numpy(py, &k))
    }

    /// The gradient in `Z` (`M × d`) of `⟨C_xz, J(X)J(Z)ᵀ⟩ + ⟨C_zz, J(Z)J(Z)ᵀ⟩` (both arguments
    /// of the inducing block move), `C_xz` `n·d' × M` and `C_zz` `M × M` as `blocks` returns
    /// the kernels. A network without the NTK's input gradient (a CNN, a torch model's calls)
    /// raises `NotImplementedError`.
    fn pullback_z<'py>(
        &self,
        py: Python<'py>,
        x: PyReadonlyArray2<'py, f64>,
        z: PyReadonlyArray2<'py, f64>,
        outputs: Vec<usize>,
        c_xz: PyReadonlyArray2<'py, f64>,
        c_zz: PyReadonlyArray2<'py, f64>,
    ) -> PyResult<Bound<'py, PyArray2<f64>>> {
        let (x, z) = self.checked_pair(&x, &z, &outputs)?;
        let (c_xz, c_zz) = (matrix(&c_xz), matrix(&c_zz));
        let (m, rows) = (z.nrows(), x.nrows() * self.net.output_dim());
        if c_xz.shape() != (rows, m) || c_zz.shape() != (m, m) {
            return Err(value_error(format!(
                "the cotangents are {:?} and {:?}; the blocks are ({rows}, {m}) and ({m}, {m})",
                c_xz.shape(),
                c_zz.shape()
            )));
        }
        let errors = self.net.errors();
        let net = &self.net;
        let g = py
            .detach(|| net.ntk_pair_pullback_z(&x, Outputs::All, &z, Outputs::One(&outputs), &c_xz, &c_zz))
            .map_err(|e| errors.raise(e))?;
        Ok(to_numpy(py, &g))
    }
}
