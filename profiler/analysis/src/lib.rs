//! memsight-analysis: what memsight works out from recorded data, outside the job — OOM diagnosis,
//! the memory estimator and the GPU planner, budgets, heap-profile reading and symbolization
//! (pprof, flamegraphs), and text and SVG summaries of reports.
//!
//! It reads only `memsight-format` types and never links into a training job (except a job built
//! with `memsight`'s `symbolize` feature, which symbolizes its own profiles without a sidecar).
//! Dependency direction: `memsight-format` ← this crate ← `memsight-sidecar`, `memsight-tui`.
//! Its modules are independent of one another: none imports another, except `diagnose`, which
//! reads a report's leak estimate (from the format crate) and nothing else here.

pub mod budget;
pub mod diagnose;
pub mod estimate;
pub mod heapprof;
pub mod plan;
#[cfg(feature = "plot")]
pub mod plot;
pub mod summary;
