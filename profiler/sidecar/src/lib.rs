//! The sidecar: runs a job with profiling switched on through the environment, follows its
//! flight recorder, and writes the final report with a post-mortem — also when the job was killed,
//! which is when the data matters most. The job never waits for the sidecar; killing the sidecar
//! leaves the job running.
//!
//! Dependency direction: `memsight-format`, `memsight` (collectors) and `memsight-analysis`
//! (diagnosis, heap-profile symbolization) ← this crate ← `memsight-tui` (the `memsight` command).
//! Inside, `run` and `attach` drive the others; `watch` folds records, `outputs` serves them
//! (`server`, `metrics`), `postmortem` and `delivery` end the run; none of those imports a driver.

mod attach;
mod cause;
mod delivery;
pub mod inject;
mod job;
mod kmsg;
mod left_running;
pub mod metrics;
mod oomwatch;
mod outputs;
mod outside;
mod postmortem;
mod ranks;
mod run;
pub mod server;
mod stop_signals;
mod tree;
mod watch;

pub use attach::{attach, attachable, AttachOptions};
pub use delivery::{check_report_path, shell_code, to_stdout, RunOutcome, SidecarError};
pub use ranks::{job_report_for, launched_as, report_for};
pub use run::{run, HeapSampling, RunOptions};

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking the data over from a holder that panicked.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests;
