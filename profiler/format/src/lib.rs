//! memsight-format: the one contract every side of memsight shares — the job (`memsight`), the
//! sidecar (`memsight-sidecar`), the analysis (`memsight-analysis`) and the viewer (`memsight-tui`).
//!
//! It holds plain data and its (de)serialization, and depends on no other memsight crate:
//!
//! ```text
//! units, clock, safe_file, text, input (leaves; input names sizes with units)
//! heap, host, device, phase, heap_profile, process (what one side measured)
//!   └─ snapshot ─ timeline               (one instant; the run's series and peaks)
//!        └─ report                       (the end of a run: peaks, tips, budgets' input)
//!             └─ wire                    (flight-recorder ring and socket records)
//! ```
//!
//! Each module imports only modules above it in this list, never below.

pub mod clock;
pub mod device;
pub mod heap;
pub mod heap_profile;
pub mod host;
pub mod input;
pub mod phase;
pub mod process;
pub mod report;
pub mod safe_dir;
pub mod safe_file;
pub mod snapshot;
pub mod text;
pub mod timeline;
pub mod units;
pub mod wire;

/// What a report tells of its job (its language, PyTorch, workers), for advice that fits it.
pub use report::job_context;
pub use report::Report;
pub use snapshot::Snapshot;
