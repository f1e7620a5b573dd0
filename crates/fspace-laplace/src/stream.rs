//! Fitting from data that arrive in parts: the curvature's sums over the data as a value that
//! grows batch by batch ([`LaplaceSums::add`]), merges exactly with the sums of other parts
//! ([`LaplaceSums::merge`]: other loaders, other processes) and is finished once into the
//! posterior ([`LaplaceSums::finish`]). Nothing holds more than one batch of the data.
//!
//! | structure (weights) | what is summed | memory |
//! |---|---|---|
//! | `Diag` (all) | `diag(GGN)` | `p` |
//! | `Kfac` (all, last layer) | per layer `Σ ããᵀ`, `Σ ã`, rows, `Σ δδᵀ` (`G` is divided by the total `n` at the end) | `Σ fan_in² + fan_out²` |
//! | `Full` (all), `Full` / `Diag` (subnetwork) | the dense GGN block `Σ RᵀR` | `dim²` |
//! | `Full`, `LastLayer` (last layer) | the last layer's `Σ Hᵢ ⊗ φ̃ᵢφ̃ᵢᵀ` | `(d'(h + 1))²` |
//! | `Diag` (last layer) | its diagonal `Σ Hᵢ[o, o] φ̃ᵢ_c²` | `d'(h + 1)` |
//!
//! plus `log p(D | w*)` and the point count. The structures that pass over the data more than
//! once (EKFAC's eigenvalue re-fit, low rank's Lanczos products, the sampled structure's CG,
//! B-Diag's per-layer blocks) are refused with a typed error: fit them with
//! [`fit`](crate::fit()) on the whole data, or — KFAC, EKFAC and low rank — over shards with
//! [`fit_sharded`](crate::fit_sharded), which all-reduces each of their sums as it is formed.
//!
//! The sums are the same numbers [`fit`](crate::fit()) forms; only the order of additions
//! differs (batch by batch), so a streamed posterior equals the in-memory one to rounding
//! (`tests/laplace.rs`, `a_streamed_fit_equals_the_in_memory_fit_for_every_streamable_structure`).

use std::time::Instant;

use fspace_core::{Fitted, LikelihoodSpec};
use fspace_input::InputError;
use fspace_linalg::sym_eigh_owned;
use fspace_nn::{LayerInfo, Network};
use nalgebra::{DMatrix, DVector};

use crate::config::LaplaceConfig;
use crate::construct::{
    check_subnetwork, checked_last_layer, dense_gram, diagonal, flat_count, kron_from_sums, kron_sums,
    last_layer_diagonal, last_layer_gram, KronSums,
};
use crate::curvature::{Curvature, CurvatureApprox, DiagCurvature, EigenCurvature};
use crate::data::data_for;
use crate::error::{LaplaceError, Result};
use crate::fit::{assemble, check_data, check_settings, check_weights};
use crate::posterior::LaplacePosterior;
use crate::structure::{FitReport, Structure, Weights};

/// What a structure sums over the data.
#[derive(Debug, Clone, PartialEq)]
enum Sums {
    /// `diag(GGN)` over every parameter.
    Diag(DVector<f64>),
    /// The dense GGN over `indices` (every parameter, or a subnetwork's).
    Dense { gram: DMatrix<f64>, indices: Option<Vec<usize>> },
    /// The last layer's dense GGN.
    LastLayer { gram: DMatrix<f64>, layer: LayerInfo },
    /// The diagonal of the last layer's GGN.
    LastLayerDiag { diag: DVector<f64>, layer: LayerInfo },
    /// KFAC's factor sums.
    Kron(KronSums),
}

/// The curvature's partial sums over the batches added so far (module docs).
#[derive(Debug, Clone)]
pub struct LaplaceSums {
    likelihood: LikelihoodSpec,
    config: LaplaceConfig,
    sums: Sums,
    /// `log p(D | w*)` over the points added.
    log_likelihood: f64,
    n_data: usize,
    /// The network's shape, checked at every call.
    shape: (usize, usize, usize),
    started: Instant,
}

fn unsupported(structure: &'static str, reason: &str) -> LaplaceError {
    LaplaceError::Unsupported { structure, reason: reason.into() }
}

impl LaplaceSums {
    /// Empty sums for `net` (at its MAP weights), `likelihood` and `config`; the settings are
    /// checked now, as [`fit`](crate::fit()) checks them.
    pub fn new<N: Network>(net: &N, likelihood: LikelihoodSpec, config: &LaplaceConfig) -> Result<Self> {
        check_settings(&likelihood, config)?;
        let lik = likelihood.build()?;
        if lik.output_dim() != net.output_dim() {
            return Err(LaplaceError::Input(InputError::DimensionMismatch {
                what: "likelihood outputs vs network outputs",
                expected: net.output_dim(),
                found: lik.output_dim(),
            }));
        }
        check_weights(net)?;
        // The structure's matrices now; each batch's per-point blocks at `add`.
        crate::fit::check_memory(net, 0, config)?;
        let p = net.n_params();
        let last_layer = |structure, limit: usize| -> Result<Sums> {
            let layer = checked_last_layer(net, structure)?;
            let dim = layer.n_params();
            if dim > limit {
                return Err(LaplaceError::TooLarge {
                    structure,
                    what: "last-layer parameters",
                    size: dim,
                    limit,
                });
            }
            Ok(Sums::LastLayer { gram: DMatrix::zeros(dim, dim), layer })
        };
        let dense = |indices: Option<Vec<usize>>, limit: usize, structure| -> Result<Sums> {
            let dim = indices.as_ref().map_or(p, Vec::len);
            if dim > limit {
                return Err(LaplaceError::TooLarge { structure, what: "parameters", size: dim, limit });
            }
            Ok(Sums::Dense { gram: DMatrix::zeros(dim, dim), indices })
        };
        if !crate::structure::support(&config.structure, &config.weights)?.streams {
            return Err(unsupported(
                config.structure.name(),
                "passes over the data more than once (EKFAC re-fits its eigenvalues, low rank multiplies by the GGN \
                 in every Lanczos step, sampled runs CG, B-Diag forms per-layer blocks): fit it with \
                 fspace_laplace::fit on the whole data (or over shards with fspace_laplace::fit_sharded: kfac, \
                 ekfac and low rank); diag, kfac, full and last_layer stream",
            ));
        }
        let sums = match (&config.structure, &config.weights) {
            (Structure::Diag, Weights::All) => Sums::Diag(DVector::zeros(p)),
            (Structure::Diag, Weights::LastLayer) => {
                let layer = checked_last_layer(net, "diag")?;
                Sums::LastLayerDiag { diag: DVector::zeros(layer.n_params()), layer }
            }
            (Structure::Full(c), Weights::LastLayer) => last_layer("full", c.max_params)?,
            (Structure::LastLayer(c), _) => last_layer("last_layer", c.max_params)?,
            (Structure::Full(c), Weights::All) => dense(None, c.max_params, "full")?,
            (Structure::Full(c), Weights::Subnetwork(idx)) => dense(Some(idx.clone()), c.max_params, "full")?,
            (Structure::Diag, Weights::Subnetwork(idx)) => {
                dense(Some(idx.clone()), crate::structure::FullConfig::default().max_params, "diag")?
            }
            (Structure::Kfac, Weights::All | Weights::LastLayer) => {
                Sums::Kron(KronSums::zeros(net, &config.weights, "kfac")?)
            }
            // Every other pair is refused by `support` above.
            (s, _) => return Err(unsupported(s.name(), "it does not stream")),
        };
        if let Weights::Subnetwork(idx) = &config.weights {
            check_subnetwork(idx, p)?;
        }
        Ok(Self {
            likelihood,
            config: config.clone(),
            sums,
            log_likelihood: 0.0,
            n_data: 0,
            shape: (net.input_dim(), net.output_dim(), p),
            started: Instant::now(),
        })
    }

    fn check_network<N: Network>(&self, net: &N) -> Result<()> {
        let shape = (net.input_dim(), net.output_dim(), net.n_params());
        if shape != self.shape {
            return Err(LaplaceError::Input(InputError::Invalid {
                what: "network",
                reason: format!(
                    "(inputs, outputs, parameters) {shape:?} differ from the {:?} the sums were started with",
                    self.shape
                ),
            }));
        }
        Ok(())
    }

    /// Adds a batch: inputs `x` (`n × d`) and targets `y` (`n × t`, `t` the likelihood's
    /// targets per point), checked as [`fit`](crate::fit()) checks its data. An empty batch
    /// adds nothing.
    pub fn add<N: Network>(&mut self, net: &N, x: &DMatrix<f64>, y: &DMatrix<f64>) -> Result<()> {
        self.check_network(net)?;
        if x.nrows() != y.nrows() {
            return Err(LaplaceError::Input(InputError::DimensionMismatch {
                what: "target rows vs input rows",
                expected: x.nrows(),
                found: y.nrows(),
            }));
        }
        if x.nrows() == 0 {
            return Ok(());
        }
        crate::fit::check_memory(net, x.nrows(), &self.config)?;
        let lik = self.likelihood.build()?;
        check_data(net, lik.as_ref(), &fspace_core::Data::new(x, y)?)?;
        let yflat = DVector::from_iterator(
            y.len(),
            (0..y.nrows()).flat_map(|i| (0..y.ncols()).map(move |j| y[(i, j)])),
        );
        let chunk = self.config.chunk_points;
        let (f, features) = crate::fit::first_pass(net, x, &self.config)?;
        let log_likelihood = -lik.nll(&f, &yflat)?;
        let mut data = data_for(x, &f, &yflat, lik.as_ref(), chunk, self.config.curvature)?;
        data.features = features;
        let k = data.factors.first().map_or(1, |l| l.ncols());
        // A batch smaller than a chunk per thread is split so that every thread gets a part
        // (a loader's batches are often smaller than the in-memory fit's chunks).
        let threads = rayon::current_num_threads().max(1);
        let per_thread = x.nrows().div_ceil(threads).max(1);
        data.chunk = crate::ggn::statistics_chunk(&net.layer_infos(), k, data.chunk.min(per_thread));
        match &mut self.sums {
            Sums::Diag(d) => *d += diagonal(net, &data)?,
            Sums::Dense { gram, indices } => *gram += dense_gram(net, &data, indices.as_deref())?,
            Sums::LastLayer { gram, layer } => *gram += last_layer_gram(net, &data, layer)?,
            Sums::LastLayerDiag { diag, layer } => *diag += last_layer_diagonal(net, &data, layer)?,
            Sums::Kron(s) => s.add(&kron_sums(net, &data, &self.config.weights, "kfac")?),
        }
        self.log_likelihood += log_likelihood;
        self.n_data += x.nrows();
        Ok(())
    }

    /// Adds the sums of another part of the data (the same network, likelihood and settings).
    pub fn merge(&mut self, other: &LaplaceSums) -> Result<()> {
        if other.likelihood != self.likelihood || other.config != self.config || other.shape != self.shape {
            return Err(LaplaceError::Input(InputError::Invalid {
                what: "sums to merge",
                reason: "were started with another likelihood, settings or network shape".into(),
            }));
        }
        match (&mut self.sums, &other.sums) {
            (Sums::Diag(a), Sums::Diag(b))
            | (Sums::LastLayerDiag { diag: a, .. }, Sums::LastLayerDiag { diag: b, .. }) => *a += b,
            (Sums::Dense { gram: a, .. }, Sums::Dense { gram: b, .. })
            | (Sums::LastLayer { gram: a, .. }, Sums::LastLayer { gram: b, .. }) => *a += b,
            (Sums::Kron(a), Sums::Kron(b)) => a.add(b),
            _ => unreachable!("equal settings give the same kind of sums"),
        }
        self.log_likelihood += other.log_likelihood;
        self.n_data += other.n_data;
        Ok(())
    }

    /// The partial sums as one flat vector, for an element-wise sum over processes (an
    /// all-reduce): every summed number in a fixed order — the diagonal, the dense block
    /// (column-major) or, per KFAC layer, `Σ ããᵀ`, `Σ ã`, `Σ δδᵀ` and the input rows — then
    /// `log p(D | w*)` and the point count. The element-wise sum of several processes' vectors,
    /// read back by [`set_flat`](Self::set_flat), is their [`merge`](Self::merge); counts
    /// travel as `f64`, exact below 2⁵³.
    pub fn to_flat(&self) -> Vec<f64> {
        let mut out = Vec::new();
        match &self.sums {
            Sums::Diag(d) | Sums::LastLayerDiag { diag: d, .. } => out.extend_from_slice(d.as_slice()),
            Sums::Dense { gram, .. } | Sums::LastLayer { gram, .. } => out.extend_from_slice(gram.as_slice()),
            Sums::Kron(s) => out.extend(s.to_flat()),
        }
        out.push(self.log_likelihood);
        out.push(self.n_data as f64);
        out
    }

    /// Replaces the sums by a vector of [`to_flat`](Self::to_flat)'s layout (typically the
    /// all-reduced sum of every process's). Errors: another length, a non-finite value, a count
    /// that is not a whole number ≥ 0; the sums are unchanged on error.
    pub fn set_flat(&mut self, flat: &[f64]) -> Result<()> {
        let expected = self.to_flat().len();
        if flat.len() != expected {
            return Err(LaplaceError::Input(InputError::DimensionMismatch {
                what: "flat partial sums",
                expected,
                found: flat.len(),
            }));
        }
        fspace_input::ensure_finite("flat partial sums", flat.iter())?;
        let n_data = flat_count(flat[expected - 1], "flat partial sums' point count")?;
        let mut sums = self.sums.clone();
        let mut at = 0;
        let mut take = |len: usize| {
            let part = &flat[at..at + len];
            at += len;
            part
        };
        match &mut sums {
            Sums::Diag(d) | Sums::LastLayerDiag { diag: d, .. } => {
                let len = d.len();
                d.copy_from_slice(take(len));
            }
            Sums::Dense { gram, .. } | Sums::LastLayer { gram, .. } => {
                let len = gram.len();
                gram.copy_from_slice(take(len));
            }
            Sums::Kron(s) => {
                let len = s.flat_len();
                s.set_flat(take(len))?;
            }
        }
        self.sums = sums;
        self.log_likelihood = flat[expected - 2];
        self.n_data = n_data;
        Ok(())
    }

    /// The number of points added (over every merged part).
    pub fn n_data(&self) -> usize {
        self.n_data
    }

    /// `log p(D | w*)` over the points added.
    pub fn log_likelihood(&self) -> f64 {
        self.log_likelihood
    }

    /// The posterior of the sums: the curvature factorised once (an eigendecomposition per
    /// dense block or Kronecker factor), then λ, `T` and the predictive as [`fit`](crate::fit())
    /// sets them.
    pub fn finish<N: Network>(&self, net: N) -> Result<Fitted<LaplacePosterior<N>, FitReport>> {
        self.check_network(&net)?;
        if self.n_data == 0 {
            return Err(LaplaceError::Input(InputError::Empty {
                what: "training inputs (no batch was added)",
            }));
        }
        let eigen = |gram: &DMatrix<f64>, label: &str| -> Result<EigenCurvature> {
            let (values, vectors) = sym_eigh_owned(gram.clone())?; // the sums stay for override=False
            Ok(EigenCurvature {
                label: label.into(),
                vectors,
                values: values.map(|v| v.max(0.0)),
                remainder: None,
            })
        };
        let diag_of = |gram: &DMatrix<f64>| {
            Curvature::Diag(DiagCurvature { diag: gram.diagonal().map(|v| v.max(0.0)) })
        };
        let is_diag = matches!(self.config.structure, Structure::Diag);
        let (curvature, indices) = match &self.sums {
            Sums::Diag(d) => {
                (Curvature::Diag(DiagCurvature { diag: d.clone() }), (0..self.shape.2).collect())
            }
            Sums::Dense { gram, indices } => {
                let idx = indices.clone().unwrap_or_else(|| (0..self.shape.2).collect());
                if is_diag {
                    (diag_of(gram), idx)
                } else {
                    let label = if indices.is_some() { "subnetwork" } else { "full" };
                    (Curvature::Eigen(eigen(gram, label)?), idx)
                }
            }
            Sums::LastLayer { gram, layer } => {
                (Curvature::Eigen(eigen(gram, "last_layer")?), layer.kron_order())
            }
            Sums::LastLayerDiag { diag, layer } => {
                (Curvature::Diag(DiagCurvature { diag: diag.clone() }), layer.kron_order())
            }
            Sums::Kron(s) => {
                let (k, idx) = kron_from_sums(s, self.n_data, self.config.kron_bias)?;
                (Curvature::Kron(k), idx)
            }
        };
        let report = FitReport { dim: curvature.dim(), ..Default::default() };
        assemble(
            net,
            self.likelihood,
            &self.config,
            curvature,
            indices,
            self.log_likelihood,
            self.n_data,
            report,
            self.started,
        )
    }
}

/// A Laplace fit from batches `(x, y)` that arrive one at a time (a loader, a file read in
/// parts): [`LaplaceSums`] over them, finished once. Equal to [`fit`](crate::fit()) on the
/// concatenated data to rounding; holds one batch at a time.
pub fn fit_batches<N: Network>(
    net: N,
    likelihood: LikelihoodSpec,
    batches: impl IntoIterator<Item = (DMatrix<f64>, DMatrix<f64>)>,
    config: &LaplaceConfig,
) -> Result<Fitted<LaplacePosterior<N>, FitReport>> {
    let mut sums = LaplaceSums::new(&net, likelihood, config)?;
    for (x, y) in batches {
        sums.add(&net, &x, &y)?;
    }
    sums.finish(net)
}
