//! memsight's eyes on tensors and GPUs. Each backend is a cargo feature — `tch` (libtorch CPU
//! tensor hook, CUDA caching-allocator stats and OOM observer, autocast, backward, empty cache),
//! `nvml` (per-device and per-process GPU memory), `cudarc` (tracked device allocations) and
//! `cupti` (every driver allocation of the process, whatever library made it) — and
//! feeds memsight through [`memsight::devices`] only, so the sampler, reports, sidecar and viewer
//! need no backend knowledge. A backend that cannot work here (no libtorch CUDA build, no driver,
//! no device, or not compiled in) registers itself as absent with its reason instead of failing.
//!
//! ```no_run
//! #[global_allocator]
//! static ALLOC: memsight::Allocator = memsight::Allocator::new();
//!
//! let installed = memsight_integrations::install();
//! for line in installed.describe() { eprintln!("{line}"); }
//! let session = memsight::Session::builder().start();
//! ```

#[cfg(feature = "cudarc")]
pub mod cudarc_track;
/// CUPTI's driver-API memory callbacks (in the in-process crate, which the preloaded library
/// shares: see [`memsight::devices::cupti`]).
#[cfg(feature = "cupti")]
pub use memsight::devices::cupti;
#[cfg(feature = "nvml")]
pub mod nvml;
#[cfg(feature = "tch")]
pub mod torch;

pub mod alloc_conf;

use memsight::collect::SourceStatus;

/// What [`install`] set up: one status per backend.
#[derive(Clone, Debug, Default)]
pub struct Installed {
    /// Each backend's status (available, or why not).
    pub statuses: Vec<SourceStatus>,
}

impl Installed {
    /// One line per backend for the job's log.
    pub fn describe(&self) -> Vec<String> {
        self.statuses
            .iter()
            .map(|s| {
                format!(
                    "memsight: {} {}: {}",
                    s.name,
                    if s.available { "on" } else { "absent" },
                    s.detail
                )
            })
            .collect()
    }
}

/// Installs every backend compiled in (once; later calls only report). Backends compiled out are
/// registered as absent with the feature to enable.
// One push per backend, each under its own `cfg`: no single `vec![…]` fits every feature set.
#[allow(clippy::vec_init_then_push)]
pub fn install() -> Installed {
    let mut statuses = Vec::new();
    #[cfg(feature = "tch")]
    statuses.extend(torch::install());
    #[cfg(not(feature = "tch"))]
    statuses.push(absent(
        "libtorch",
        "not compiled in (build memsight-integrations with feature `tch`)",
    ));
    #[cfg(feature = "nvml")]
    statuses.push(nvml::install());
    #[cfg(not(feature = "nvml"))]
    statuses.push(absent(
        "nvml",
        "not compiled in (build memsight-integrations with feature `nvml`)",
    ));
    #[cfg(feature = "cudarc")]
    statuses.push(cudarc_track::install());
    #[cfg(not(feature = "cudarc"))]
    statuses.push(absent(
        "cudarc",
        "not compiled in (build memsight-integrations with feature `cudarc`)",
    ));
    #[cfg(feature = "cupti")]
    statuses.push(cupti::install());
    #[cfg(not(feature = "cupti"))]
    statuses.push(absent(
        "cupti",
        "not compiled in (build memsight-integrations with feature `cupti`)",
    ));
    Installed { statuses }
}

/// Registers `name` as absent with `why`, and returns that status.
pub(crate) fn absent(name: &str, why: &str) -> SourceStatus {
    memsight::devices::register_absent(name, why);
    SourceStatus {
        name: name.into(),
        available: false,
        detail: why.into(),
    }
}
