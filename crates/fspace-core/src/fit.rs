//! The shape every method's `fit` shares: one data type in, `Fitted { posterior, report }` out,
//! progress through an optional [`Observer`].

use fspace_input::InputError;
use nalgebra::{DMatrix, DVector};

use crate::error::{ensure_dim, CoreError, Result};

/// A training set and an optional validation set, as every method takes them.
///
/// Inputs are `n × d` (points as rows); targets are `n × t` — `t = 1` for scalar regression and
/// for class labels (integers stored as `f64`), `t = d'` for vector-valued regression — so one
/// value serves every likelihood ([`LikelihoodSpec::target_dim`](crate::LikelihoodSpec::target_dim)).
/// Construction checks that the sets are non-empty, finite and of matching shapes; the
/// likelihood checks the targets' values.
#[derive(Debug, Clone, Copy)]
pub struct Data<'a> {
    x: &'a DMatrix<f64>,
    y: &'a DMatrix<f64>,
    validation: Option<(&'a DMatrix<f64>, &'a DMatrix<f64>)>,
}

fn check_set(x: &DMatrix<f64>, y: &DMatrix<f64>, inputs: &'static str, targets: &'static str) -> Result<()> {
    if x.nrows() == 0 {
        return Err(CoreError::Input(InputError::Empty { what: inputs }));
    }
    if x.ncols() == 0 {
        return Err(CoreError::Input(InputError::Invalid { what: inputs, reason: "have no columns".into() }));
    }
    ensure_dim(targets, x.nrows(), y.nrows())?;
    if y.ncols() == 0 {
        return Err(CoreError::Input(InputError::Empty { what: targets }));
    }
    fspace_input::ensure_bounded(inputs, x.iter())?;
    fspace_input::ensure_bounded(targets, y.iter())?;
    Ok(())
}

impl<'a> Data<'a> {
    /// A training set: `x` `n × d`, `y` `n × t`.
    pub fn new(x: &'a DMatrix<f64>, y: &'a DMatrix<f64>) -> Result<Self> {
        check_set(x, y, "training inputs", "training targets (one row per input)")?;
        Ok(Self { x, y, validation: None })
    }
    /// Adds a validation set of the same widths (early stopping, λ or γ selection).
    pub fn with_validation(self, x: &'a DMatrix<f64>, y: &'a DMatrix<f64>) -> Result<Self> {
        check_set(x, y, "validation inputs", "validation targets (one row per input)")?;
        ensure_dim("validation input columns", self.x.ncols(), x.ncols())?;
        ensure_dim("validation target columns", self.y.ncols(), y.ncols())?;
        Ok(Self { validation: Some((x, y)), ..self })
    }
    /// Adds `validation` when it is `Some`.
    pub fn with_optional_validation(
        self,
        validation: Option<(&'a DMatrix<f64>, &'a DMatrix<f64>)>,
    ) -> Result<Self> {
        match validation {
            Some((x, y)) => self.with_validation(x, y),
            None => Ok(self),
        }
    }
    /// Training inputs `n × d`.
    pub fn x(&self) -> &'a DMatrix<f64> {
        self.x
    }
    /// Training targets `n × t`.
    pub fn y(&self) -> &'a DMatrix<f64> {
        self.y
    }
    /// The validation set, if any.
    pub fn validation(&self) -> Option<(&'a DMatrix<f64>, &'a DMatrix<f64>)> {
        self.validation
    }
    /// Training targets as one point-major vector (`y[i·t + c]`), the form the
    /// [`Likelihood`](crate::Likelihood) trait takes.
    pub fn y_flat(&self) -> DVector<f64> {
        flatten(self.y)
    }
    /// Validation inputs and point-major targets.
    pub fn validation_flat(&self) -> Option<(&'a DMatrix<f64>, DVector<f64>)> {
        self.validation.map(|(x, y)| (x, flatten(y)))
    }
    /// Points in the training set.
    pub fn len(&self) -> usize {
        self.x.nrows()
    }
    /// Never true (construction refuses empty sets); for clippy's `len` convention.
    pub fn is_empty(&self) -> bool {
        self.x.nrows() == 0
    }
}

/// `n × t` targets as a point-major vector.
pub fn flatten(y: &DMatrix<f64>) -> DVector<f64> {
    DVector::from_iterator(y.len(), (0..y.nrows()).flat_map(|i| (0..y.ncols()).map(move |c| y[(i, c)])))
}

/// What every method's `fit` returns: the posterior and the method's report of what it did.
#[derive(Debug, Clone)]
pub struct Fitted<P, R> {
    /// The fitted posterior (implements [`Posterior`](crate::Posterior) and
    /// [`Persist`](crate::Persist)).
    pub posterior: P,
    /// Timings, iterations, chosen hyperparameters.
    pub report: R,
}

/// One progress event of an iterative fit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    /// The method's step counter (epoch for MAP training, iteration for the VI methods).
    pub step: usize,
    /// Its budget.
    pub total: usize,
    /// The training objective the method minimises at this step (its own scale), if computed.
    pub loss: Option<f64>,
    /// The validation loss at this step, if evaluated.
    pub validation: Option<f64>,
}

/// Receives [`Progress`] from an iterative fit (a progress bar, a log, a plot of the loss).
/// Closures `FnMut(&Progress)` are observers.
pub trait Observer {
    /// Called by the method at its reporting points.
    fn observe(&mut self, progress: &Progress);
}

impl<F: FnMut(&Progress)> Observer for F {
    fn observe(&mut self, progress: &Progress) {
        self(progress)
    }
}

/// The observer of `fit` without one: ignores everything.
#[derive(Debug, Clone, Copy, Default)]
pub struct Silent;

impl Observer for Silent {
    fn observe(&mut self, _: &Progress) {}
}

/// One process's part of a fit sharded over several processes (the training loops of VaLLA,
/// GFSVI, MAP and FSP-Laplace, and the multi-pass Laplace structures): process `rank` of `world`, whose rows follow those of
/// the processes before it in the global order, and `reduce(part, failed)`, which returns the
/// sum of every process's `part` — or an error (of the method's type `E`) where any process
/// said `failed`. The engine behind it (a torch.distributed group, MPI) is the caller's: the
/// methods know none. Every process calls the fit with the same model and settings; a process
/// whose own work fails sends the failure flag in its next reduce and returns its error, so
/// none waits forever.
pub struct ProcessShard<'a, E> {
    /// This process's position.
    pub rank: usize,
    /// The number of processes.
    pub world: usize,
    /// The all-reduce (sum) of a vector over the processes, with a failure flag.
    /// (`Send`, so a method may call it from its worker threads, one call at a time.)
    pub reduce: &'a mut (dyn FnMut(DVector<f64>, bool) -> std::result::Result<DVector<f64>, E> + Send),
}

/// Who holds what in a sharded fit, from its first all-reduce
/// ([`ProcessShard::exchange_layout`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ShardLayout {
    /// `counts[set][process]`: every process's rows of each set (training, validation, …).
    pub counts: Vec<Vec<usize>>,
    /// The `sums` every process sent with its counts, summed.
    pub sums: DVector<f64>,
}

impl ShardLayout {
    /// The rows of `set` held by the processes before `rank`: the first global row of `rank`'s.
    pub fn offset(&self, set: usize, rank: usize) -> usize {
        self.counts[set][..rank].iter().sum()
    }
    /// The rows of `set` on every process together.
    pub fn total(&self, set: usize) -> usize {
        self.counts[set].iter().sum()
    }
}

impl<E: From<InputError>> ProcessShard<'_, E> {
    /// The first all-reduce of a sharded fit: this process's row `counts` (one per set) in its
    /// slots and `sums` added as they are, in one round of `counts.len()·world + sums.len()`
    /// numbers, with `local` (the process's own checks) as the failure flag. A rank outside
    /// `0..world` fails as a local failure does, so no process waits.
    pub fn exchange_layout(
        &mut self,
        local: std::result::Result<(), E>,
        counts: &[usize],
        sums: DVector<f64>,
    ) -> std::result::Result<ShardLayout, E> {
        let (rank, world, sets) = (self.rank, self.world, counts.len());
        let width = sets * world + sums.len();
        let part = local.and_then(|()| {
            if rank >= world {
                return Err(E::from(InputError::Invalid {
                    what: "shard",
                    reason: format!("rank {rank} of {world} processes"),
                }));
            }
            let mut part = DVector::zeros(width);
            for (set, &count) in counts.iter().enumerate() {
                part[set * world + rank] = count as f64;
            }
            part.rows_mut(sets * world, sums.len()).copy_from(&sums);
            Ok(part)
        });
        let summed = self.sum(part, width)?;
        let count = |v: f64| {
            if v >= 0.0 && v.fract() == 0.0 && v < 9.007_199_254_740_992e15 {
                Ok(v as usize)
            } else {
                Err(E::from(InputError::Invalid {
                    what: "the processes' row counts",
                    reason: format!("{v} is not a count"),
                }))
            }
        };
        let counts = (0..sets)
            .map(|set| (0..world).map(|r| count(summed[set * world + r])).collect())
            .collect::<std::result::Result<_, E>>()?;
        Ok(ShardLayout { counts, sums: summed.rows(sets * world, width - sets * world).into_owned() })
    }
}

impl<E> ProcessShard<'_, E> {
    /// `part` summed over the processes; a local error is sent as the failure flag (with zeros
    /// of the `width` the others send) and returned.
    pub fn sum(
        &mut self,
        part: std::result::Result<DVector<f64>, E>,
        width: usize,
    ) -> std::result::Result<DVector<f64>, E> {
        match part {
            Ok(part) => (self.reduce)(part, false),
            Err(e) => {
                let _ = (self.reduce)(DVector::zeros(width), true);
                Err(e)
            }
        }
    }
}
