//! The harness every experiment runs in: the command line ([`cli`]), the registry's types
//! ([`registry`]), an experiment's output folder and log ([`report`]), its resumable typed
//! checkpoint and per-unit driver ([`checkpoint`]),
//! the figures ([`plot`]), and the copy of a finished run into `docs/results/` ([`publish`]). Nothing here knows a particular experiment.

pub mod checkpoint;
pub mod cli;
pub mod plot;
pub mod publish;
pub mod python_reference;
pub mod registry;
pub mod report;
pub mod test;
