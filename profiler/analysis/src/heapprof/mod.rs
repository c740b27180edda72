//! Reading the heap profiles a job wrote (jemalloc `heap_v2` dumps, Rust and C/C++ allocations
//! alike): symbolized into the sites that hold the bytes, a pprof file, flamegraphs, the growth
//! between two profiles, and the report's heap-profile section.

pub mod complete;
pub mod dump;
pub mod flame;
pub mod pprof;
pub mod profile;
pub mod summary;
pub mod symbolize;

pub use complete::complete;
pub use memsight_format::heap_profile::{
    DumpKind, DumpRecord, Growth, HeapProfile, ProfileView, Site, SiteGrowth, SourceSite,
};
pub use profile::{growth, Profile};
pub use summary::{sites_view, summarize};
