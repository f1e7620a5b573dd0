//! The harness every experiment runs in: the command line ([`cli`]), the registry's types
//! ([`registry`]), an experiment's output folder, log and resumable checkpoint ([`report`]),
//! and the figures ([`plot`]). Nothing here knows a particular experiment.

pub mod cli;
pub mod plot;
pub mod registry;
pub mod report;
