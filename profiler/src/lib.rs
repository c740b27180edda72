//! memsight: a memory profiler for ML training jobs, linked into the job.
//!
//! ```no_run
//! #[global_allocator]
//! static ALLOC: memsight::Allocator = memsight::Allocator::new();
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let session = memsight::Session::builder()
//!         .interval(std::time::Duration::from_millis(100))
//!         .report_path("memsight-report.json")
//!         .start()?;
//!     for n in 0..10 {
//!         memsight::step(n);
//!         let _g = memsight::phase("forward");
//!     }
//!     let s = memsight::stats();
//!     println!("live {} peak {}", s.live_bytes, s.peak_bytes);
//!     memsight::reset_peak();
//!     let _report = session.finish()?;
//!     Ok(())
//! }
//! ```
//!
//! # Limitations
//! - The call counts and size histogram are Rust's (through the installed [`Allocator`]); the
//!   process heap's live and peak bytes count C and C++ code (libtorch tensors) too, through the
//!   `malloc` family memsight defines over the same jemalloc.
//! - Heap sampling (allocation sites, [`heapprof`]) starts when the program loads, after the shared
//!   libraries' own initialisers; their start-up allocations have no sites.
//! - The peak is within 64 KiB per allocating thread of the true peak (see [`alloc`]).
//! - Phases are per thread: each thread nests its own ([`phase`]); a phase's peak is the process
//!   heap's over the phase's time. An async task's phases follow the thread that polls it (the
//!   `memsight-tracing` layer opens them per poll).
//! - [`testing`] measures the calling thread only (work handed to other threads is not in it).
//! - jemalloc statistics refresh only on an epoch advance, done once per sample.
//!
//! # Crates
//! This crate is what runs inside the job; it stays small (its dependency tree is jemalloc,
//! framehop (the heap sampler's stack walker), serde and libc). The data it produces is `memsight-format`'s (re-exported here: [`report`],
//! [`snapshot`], [`timeline`], [`wire`], [`units`]); the sidecar (`memsight-sidecar`), the analysis
//! (`memsight-analysis`: diagnosis, estimates, heap-profile symbolization) and the viewer
//! (`memsight-tui`) sit on top and never link into a job. Direction:
//! `memsight-format` ← `memsight` ← `memsight-sidecar` ← `memsight-tui`.
//!
//! Inside, each module imports only modules listed before it (no circles):
//! `sys` → `alloc`, `collect`, `tensors`, `flight`, `testing` → `heapprof`, `phases` → `devices` →
//! `training` → `session`.

pub mod alloc;
pub mod collect;
pub mod devices;
mod flight;
pub mod heapprof;
mod phases;
pub mod pyframes;
pub mod pymalloc;
mod session;
mod sys;
pub mod tensors;
pub mod testing;
mod training;

pub use memsight_format::{report, safe_file, snapshot, timeline, units, wire};

pub use alloc::{reset_peak, size_histogram, stats, Allocator, HeapStats};
pub use phases::{
    current_phase, current_step, monitor, phase, PhaseGuard, PhaseMeasurement, PhaseStats,
    StepStats,
};

/// Marks the start of training step `n`: the previous step's peak and end live bytes are
/// recorded. A process whose environment came to name its rank since its session greeted (the
/// first rank of Lightning's launcher) says so again in its ring.
pub fn step(n: u64) {
    session::note_rank();
    phases::step(n);
    session::step_began();
}
pub use report::Report;
pub use session::{print_snapshot, snapshot, Session, SessionBuilder, SessionError};
pub use training::{end_training, end_training_by};

/// What the preloaded library tells the session about its process (a fork, an exit), and how
/// memsight spawns its own threads in a job (with the job's signals blocked in them).
pub mod process {
    pub use crate::session::{exiting, forget_inherited, forked, signals, writes_user_report};
    pub use crate::sys::spawn_without_signals;
}
pub use snapshot::Snapshot;
