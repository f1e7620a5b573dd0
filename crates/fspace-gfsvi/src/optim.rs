//! The optimisation loop every method of this crate shares: Adam ascent on a flat parameter
//! vector over shuffled minibatches, validation every `eval_every` steps, early stopping with
//! patience restoring the best parameters.

use fspace_core::{Adam, Minibatches};
use fspace_core::{Observer, Progress};
use nalgebra::DVector;
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use crate::error::{invalid, GfsviError, Result};

/// Optimiser settings shared by GFSVI, TFSVI, FVI and MFVI.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OptimConfig {
    /// Adam learning rate.
    pub learning_rate: f64,
    /// Minibatch size (the whole training set if larger; App. A.2.2: 2 000).
    pub batch_size: usize,
    /// Maximum number of Adam steps.
    pub max_steps: usize,
    /// Validation every this many steps (when a validation set is given).
    pub eval_every: usize,
    /// Stop after this many validations without improvement (0: never stop early); the
    /// parameters of the best validation are restored.
    pub patience: usize,
    /// Seed of minibatch order, measurement points and Monte-Carlo draws.
    pub seed: u64,
}

impl Default for OptimConfig {
    fn default() -> Self {
        Self {
            learning_rate: 1e-3,
            batch_size: 2000,
            max_steps: 10_000,
            eval_every: 100,
            patience: 10,
            seed: 0,
        }
    }
}

impl OptimConfig {
    pub(crate) fn validate(&self) -> Result<()> {
        if !(self.learning_rate.is_finite() && self.learning_rate > 0.0) {
            return Err(invalid("learning rate", format!("{} (must be > 0)", self.learning_rate)));
        }
        if self.batch_size == 0 {
            return Err(invalid("batch size", "must be ≥ 1"));
        }
        if self.max_steps == 0 {
            return Err(invalid("maximum number of steps", "must be ≥ 1"));
        }
        if self.eval_every == 0 {
            return Err(invalid("validation interval", "must be ≥ 1"));
        }
        Ok(())
    }
}

/// What an optimisation run did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OptimReport {
    /// Steps taken.
    pub steps: usize,
    /// Step whose parameters were kept (the best validation; the last step without one).
    pub best_step: usize,
    /// `(step, objective on that step's minibatch)` every `eval_every` steps.
    pub objective: Vec<(usize, f64)>,
    /// `(step, validation loss)` at each validation.
    pub validation: Vec<(usize, f64)>,
}

/// A validation loss to minimise, evaluated on the current parameters.
pub(crate) type Validator<'a> = &'a mut dyn FnMut(&DVector<f64>) -> Result<f64>;

/// Maximises a stochastic objective: `step(θ, batch, rng)` returns the minibatch objective and
/// its gradient; `validate(θ)` (if any) a loss to minimise.
pub(crate) fn optimise(
    mut theta: DVector<f64>,
    n: usize,
    config: &OptimConfig,
    mut step: impl FnMut(&DVector<f64>, &[usize], &mut StdRng) -> Result<(f64, DVector<f64>)>,
    mut validate: Option<Validator<'_>>,
    observer: &mut dyn Observer,
) -> Result<(DVector<f64>, OptimReport)> {
    config.validate()?;
    let mut rng = StdRng::seed_from_u64(config.seed);
    let batches = Minibatches::new(n, config.batch_size.min(n), false)?;
    let mut adam = Adam::new(theta.len(), config.learning_rate);
    let mut report = OptimReport { steps: 0, best_step: 0, objective: Vec::new(), validation: Vec::new() };
    let mut best = (f64::INFINITY, theta.clone());
    let mut since_best = 0;
    'outer: loop {
        for batch in batches.epoch(&mut rng) {
            let (value, grad) = step(&theta, &batch, &mut rng)?;
            if !value.is_finite() {
                return Err(GfsviError::Diverged { step: report.steps, what: "objective" });
            }
            if grad.iter().any(|g| !g.is_finite()) {
                return Err(GfsviError::Diverged { step: report.steps, what: "gradient" });
            }
            adam.ascend(&mut theta, &grad);
            report.steps += 1;
            let t = report.steps;
            if t.is_multiple_of(config.eval_every) || t == config.max_steps {
                report.objective.push((t, value));
                let validation = match validate.as_mut() {
                    Some(val) => Some(val(&theta)?),
                    None => None,
                };
                observer.observe(&Progress {
                    step: t,
                    total: config.max_steps,
                    loss: Some(-value),
                    validation,
                });
                if let Some(loss) = validation {
                    report.validation.push((t, loss));
                    if loss < best.0 {
                        best = (loss, theta.clone());
                        report.best_step = t;
                        since_best = 0;
                    } else {
                        since_best += 1;
                        if config.patience > 0 && since_best >= config.patience {
                            break 'outer;
                        }
                    }
                }
            }
            if t >= config.max_steps {
                break 'outer;
            }
        }
    }
    if report.validation.is_empty() || !best.0.is_finite() {
        report.best_step = report.steps;
        return Ok((theta, report));
    }
    Ok((best.1, report))
}
