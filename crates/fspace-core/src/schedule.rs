//! One schedule for every iterative fit: how long it runs, when it is evaluated on the
//! validation set, when it stops early and which state it returns.
//!
//! A *step* is one optimiser update (one minibatch); an *epoch* is one pass over the training
//! set (`⌈n / b⌉` steps for batch size `b`). A [`Schedule`] says
//!
//! * `length` — how long to run, in steps or epochs;
//! * `evaluate_every` — the interval between evaluations, in steps or epochs; the last step is
//!   always evaluated, so a run ends on a known validation loss;
//! * `patience` — the run stops at the `patience`-th evaluation in a row that did not improve on
//!   the best validation loss (`Some(1)`: at the first that does not improve; `None`: never);
//! * `restore_best` — whether the state of the best evaluation is returned (else the last).
//!
//! Evaluations score the validation set, so `patience` and `restore_best` act only when the
//! data carry one; a `patience` without validation data is refused
//! ([`ScheduleRun::new`]), never ignored. A non-finite validation loss never counts as an
//! improvement.
//!
//! [`ScheduleRun`] is the loop-side bookkeeping every method shares: which steps evaluate, the
//! best loss so far and the stop decision.

use fspace_input::InputError;
use serde::{Deserialize, Serialize};

use crate::error::{CoreError, Result};

/// A duration, or an interval, in optimiser steps or in passes over the training set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Span {
    /// Optimiser steps (minibatches).
    Steps(usize),
    /// Passes over the training set.
    Epochs(usize),
}

impl Span {
    /// The span in steps, for `steps_per_epoch` steps per epoch.
    pub fn in_steps(self, steps_per_epoch: usize) -> usize {
        match self {
            Span::Steps(s) => s,
            Span::Epochs(e) => e.saturating_mul(steps_per_epoch),
        }
    }
    /// The span in epochs (a partial epoch counts as one), for `steps_per_epoch ≥ 1`.
    pub fn in_epochs(self, steps_per_epoch: usize) -> usize {
        match self {
            Span::Steps(s) => s.div_ceil(steps_per_epoch.max(1)),
            Span::Epochs(e) => e,
        }
    }
    fn count(self) -> usize {
        match self {
            Span::Steps(c) | Span::Epochs(c) => c,
        }
    }
}

/// How long an iterative fit runs, when it is evaluated, when it stops early and what it keeps
/// (module docs: [`crate::schedule`]).
///
/// | field | meaning |
/// |---|---|
/// | `length` | steps or epochs to run (the most, with early stopping) |
/// | `evaluate_every` | steps or epochs between validation evaluations (the last step is always evaluated) |
/// | `patience` | stop at the `patience`-th evaluation in a row without improvement (≥ 1); `None`: never stop early |
/// | `restore_best` | return the state of the best evaluation instead of the last |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    /// How long to run.
    pub length: Span,
    /// Interval between evaluations.
    pub evaluate_every: Span,
    /// Evaluations in a row without improvement that end the run (`None`: never).
    pub patience: Option<usize>,
    /// Return the best evaluation's state (with validation data).
    pub restore_best: bool,
}

impl Schedule {
    /// `steps` optimiser steps, evaluated at the last one only, no early stopping, the best
    /// evaluated state kept.
    pub fn steps(steps: usize) -> Self {
        Self {
            length: Span::Steps(steps),
            evaluate_every: Span::Steps(steps),
            patience: None,
            restore_best: true,
        }
    }
    /// `epochs` passes, evaluated after each, no early stopping, the best evaluated state kept.
    pub fn epochs(epochs: usize) -> Self {
        Self {
            length: Span::Epochs(epochs),
            evaluate_every: Span::Epochs(1),
            patience: None,
            restore_best: true,
        }
    }
    /// Evaluates every `k` steps.
    pub fn every_steps(self, k: usize) -> Self {
        Self { evaluate_every: Span::Steps(k), ..self }
    }
    /// Evaluates every `k` epochs.
    pub fn every_epochs(self, k: usize) -> Self {
        Self { evaluate_every: Span::Epochs(k), ..self }
    }
    /// Stops at the `patience`-th evaluation in a row without improvement.
    pub fn patience(self, patience: usize) -> Self {
        Self { patience: Some(patience), ..self }
    }
    /// Sets the patience (`None`: never stop early).
    pub fn with_patience(self, patience: Option<usize>) -> Self {
        Self { patience, ..self }
    }
    /// Returns the last state instead of the best evaluated one.
    pub fn keep_last(self) -> Self {
        Self { restore_best: false, ..self }
    }
    /// Checks the schedule on its own: a length and an interval ≥ 1, a patience ≥ 1.
    pub fn validate(&self) -> Result<()> {
        let invalid = |what: &'static str, reason: &str| {
            Err(CoreError::Input(InputError::Invalid { what, reason: reason.into() }))
        };
        if self.length.count() == 0 {
            return invalid("schedule length", "must be ≥ 1 step or epoch");
        }
        if self.evaluate_every.count() == 0 {
            return invalid("schedule evaluation interval", "must be ≥ 1 step or epoch");
        }
        if self.patience == Some(0) {
            return invalid(
                "schedule patience",
                "must be ≥ 1 (evaluations without improvement); None turns early stopping off",
            );
        }
        Ok(())
    }
}

/// What an evaluation decides (from [`ScheduleRun::record`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopDecision {
    /// A new best validation loss: keep (a copy of) the current state.
    Improved,
    /// No improvement, patience not exhausted.
    Continue,
    /// Patience exhausted: stop (and restore the best state if the schedule says so).
    Stop,
}

/// A [`Schedule`] being run: the steps that evaluate, the best validation loss and the count
/// of evaluations without improvement.
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleRun {
    total_steps: usize,
    evaluate_every: usize,
    patience: Option<usize>,
    restore_best: bool,
    validated: bool,
    best: f64,
    best_step: Option<usize>,
    bad: usize,
}

impl ScheduleRun {
    /// Starts `schedule` for a loop of `steps_per_epoch ≥ 1` steps per epoch; `validated` says
    /// whether the data carry a validation set. Errors: an invalid schedule, or a patience
    /// without validation data.
    pub fn new(schedule: &Schedule, steps_per_epoch: usize, validated: bool) -> Result<Self> {
        schedule.validate()?;
        if steps_per_epoch == 0 {
            return Err(CoreError::Input(InputError::Invalid {
                what: "steps per epoch",
                reason: "must be ≥ 1".into(),
            }));
        }
        if schedule.patience.is_some() && !validated {
            return Err(CoreError::Input(InputError::Invalid {
                what: "schedule patience",
                reason:
                    "early stopping needs validation data (give Data::with_validation or set patience None)"
                        .into(),
            }));
        }
        Ok(Self {
            total_steps: schedule.length.in_steps(steps_per_epoch),
            evaluate_every: schedule.evaluate_every.in_steps(steps_per_epoch),
            patience: schedule.patience,
            restore_best: schedule.restore_best,
            validated,
            best: f64::INFINITY,
            best_step: None,
            bad: 0,
        })
    }
    /// Steps the whole schedule runs without early stopping.
    pub fn total_steps(&self) -> usize {
        self.total_steps
    }
    /// Whether the run evaluates after `step` (1-based): every interval, and at the last step.
    pub fn evaluates_after(&self, step: usize) -> bool {
        step.is_multiple_of(self.evaluate_every) || step == self.total_steps
    }
    /// Whether `step` (1-based) is the last of the schedule.
    pub fn is_last(&self, step: usize) -> bool {
        step >= self.total_steps
    }
    /// Records the validation loss evaluated after `step`.
    pub fn record(&mut self, step: usize, loss: f64) -> StopDecision {
        if loss.is_finite() && loss < self.best {
            self.best = loss;
            self.best_step = Some(step);
            self.bad = 0;
            return StopDecision::Improved;
        }
        self.bad += 1;
        match self.patience {
            Some(p) if self.bad >= p => StopDecision::Stop,
            _ => StopDecision::Continue,
        }
    }
    /// Whether the best evaluated state is to be returned: the schedule says so, the data carry
    /// a validation set and some evaluation had a finite loss.
    pub fn restores_best(&self) -> bool {
        self.restore_best && self.validated && self.best_step.is_some()
    }
    /// The best validation loss so far (`∞` before a finite one).
    pub fn best(&self) -> f64 {
        self.best
    }
    /// The step of the best validation loss, if any was finite.
    pub fn best_step(&self) -> Option<usize> {
        self.best_step
    }
}
