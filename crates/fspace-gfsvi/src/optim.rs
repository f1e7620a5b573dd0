//! The optimisation loop every method of this crate shares: Adam ascent on a flat parameter
//! vector over shuffled minibatches under a [`Schedule`]: validation at its evaluations, early
//! stopping with its patience, the best parameters restored.

use fspace_core::{Adam, Minibatches, Schedule, ScheduleRun, StopDecision};
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
    /// Length (steps or epochs), evaluation interval, patience in evaluations (needs a
    /// validation set) and best-state restore.
    pub schedule: Schedule,
    /// Seed of minibatch order, measurement points and Monte-Carlo draws.
    pub seed: u64,
}

impl Default for OptimConfig {
    fn default() -> Self {
        Self {
            learning_rate: 1e-3,
            batch_size: 2000,
            schedule: Schedule::steps(10_000).every_steps(100),
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
        self.schedule.validate()?;
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
    /// `(step, objective on that step's minibatch)` at every evaluation of the schedule.
    pub objective: Vec<(usize, f64)>,
    /// `(step, validation loss)` at each validation.
    pub validation: Vec<(usize, f64)>,
}

/// A validation loss to minimise, evaluated on the current parameters.
pub(crate) type Validator<'a> = &'a mut dyn FnMut(&DVector<f64>) -> Result<f64>;

/// Maximises a stochastic objective: `step(θ, batch, rng)` returns the minibatch objective and
/// its gradient (and checks for an interrupt: a sharded step reports one through its reduce); `validate(θ)` (if any) a loss to minimise. A schedule with a patience needs
/// `validate`.
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
    let mut schedule = ScheduleRun::new(&config.schedule, batches.batches_per_epoch(), validate.is_some())?;
    let total = schedule.total_steps();
    let mut adam = Adam::new(theta.len(), config.learning_rate);
    let mut report = OptimReport { steps: 0, best_step: 0, objective: Vec::new(), validation: Vec::new() };
    let mut best = theta.clone();
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
            if schedule.evaluates_after(t) {
                report.objective.push((t, value));
                let validation = match validate.as_mut() {
                    Some(val) => Some(val(&theta)?),
                    None => None,
                };
                observer.observe(&Progress { step: t, total, loss: Some(-value), validation });
                if let Some(loss) = validation {
                    report.validation.push((t, loss));
                    match schedule.record(t, loss) {
                        StopDecision::Improved => best = theta.clone(),
                        StopDecision::Continue => {}
                        StopDecision::Stop => break 'outer,
                    }
                }
            }
            if schedule.is_last(t) {
                break 'outer;
            }
        }
    }
    match schedule.best_step() {
        Some(at) if schedule.restores_best() => {
            report.best_step = at;
            Ok((best, report))
        }
        _ => {
            report.best_step = report.steps;
            Ok((theta, report))
        }
    }
}
