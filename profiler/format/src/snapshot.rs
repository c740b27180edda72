//! The one snapshot type: everything known about the job's memory at one instant. The sampler,
//! reports, `check`, summaries and (later) the wire format and viewer all read this type.

use crate::device::{DeviceSample, TensorStats};
use crate::heap::HeapStats;
use crate::host::{
    CgroupMemory, HostSample, JemallocStats, ProcessMemory, ProcessTree, SystemMemory,
};
use crate::units::fmt_bytes;
use serde::{Deserialize, Serialize};

/// Everything known about the job's memory at one instant.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Milliseconds since the session started.
    pub t_ms: u64,
    /// Training step at that moment (`memsight::step`).
    pub step: u64,
    /// Innermost phase path at that moment (`train/forward`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Tracking-allocator counters.
    pub heap: HeapStats,
    /// jemalloc statistics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jemalloc: Option<JemallocStats>,
    /// The process's RSS and its split.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<ProcessMemory>,
    /// The machine's total and available memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<SystemMemory>,
    /// The memory cgroup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<CgroupMemory>,
    /// The process and its descendants (sidecar's `attach`, which watches the whole tree).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<ProcessTree>,
    /// Tensor storage bytes (libtorch CPU allocator hook), when a tensor backend is installed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensors: Option<TensorStats>,
    /// Accelerator memory, one entry per device and backend.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceSample>,
    /// Sampling intervals missed since the session started (the sampler ran late: a starved,
    /// stopped or swapping process); absent while none were (wire 1.3).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub missed_intervals: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Snapshot {
    /// Assembles a snapshot from its parts.
    pub fn new(
        t_ms: u64,
        step: u64,
        phase: Option<String>,
        heap: HeapStats,
        host: HostSample,
    ) -> Self {
        Snapshot {
            t_ms,
            step,
            phase,
            heap,
            jemalloc: host.jemalloc,
            process: host.process,
            system: host.system,
            cgroup: host.cgroup,
            tree: None,
            tensors: None,
            devices: Vec::new(),
            missed_intervals: 0,
        }
    }

    /// Device `index` as its caching allocator (libtorch) sees it, else as the first backend that
    /// reports it.
    pub fn device(&self, index: u32) -> Option<&DeviceSample> {
        self.devices
            .iter()
            .filter(|d| d.index == index)
            .min_by_key(|d| d.backend != "libtorch-cuda")
    }

    /// Memory that can still be allocated: the smaller of MemAvailable and the cgroup headroom.
    pub fn available(&self) -> Option<u64> {
        let sys = self.system.map(|s| s.available);
        let cg = self.cgroup.and_then(|c| c.headroom());
        match (sys, cg) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The human-readable block printed at session start and end (seed 000's memory snapshot).
    pub fn render_block(&self, title: &str) -> String {
        let opt = |v: Option<u64>| v.map(fmt_bytes).unwrap_or_else(|| "n/a".into());
        let mut out = format!(
            "memsight · {title} · t={:.1}s · step {}{}\n",
            self.t_ms as f64 / 1000.0,
            self.step,
            self.phase
                .as_ref()
                .map(|p| format!(" · phase {p}"))
                .unwrap_or_default()
        );
        let rust = self.heap.rust_live_bytes;
        out += &format!(
            "  Allocated   {:>12}  live process heap, all code{}\n",
            fmt_bytes(self.heap.live_bytes),
            if rust == 0 || rust == self.heap.live_bytes {
                String::new()
            } else {
                format!(" (Rust's share {})", fmt_bytes(rust))
            }
        );
        if let Some(j) = self.jemalloc {
            out += &format!(
                "  In use      {:>12}  jemalloc active pages\n",
                fmt_bytes(j.active)
            );
        }
        out += &format!(
            "  Peak        {:>12}  peak live process heap\n",
            fmt_bytes(self.heap.peak_bytes)
        );
        out += &format!(
            "  System RSS  {:>12}  high-water {}{}\n",
            opt(self.process.map(|p| p.rss)),
            opt(self.process.map(|p| p.hwm)),
            self.process
                .map(|p| format!(
                    " · anon {} file {} shmem {}",
                    fmt_bytes(p.anon),
                    fmt_bytes(p.file),
                    fmt_bytes(p.shmem)
                ))
                .unwrap_or_default()
        );
        if let Some(t) = self.tensors {
            out += &format!(
                "  Tensors     {:>12}  live tensor storage (peak {})\n",
                fmt_bytes(t.live_bytes),
                fmt_bytes(t.peak_bytes)
            );
        }
        for d in &self.devices {
            out += &format!(
                "  cuda:{:<7} {:>12}  {} reserved {} of {} ({})\n",
                d.index,
                opt(d.allocated_bytes.or(d.used_bytes)),
                if d.allocated_bytes.is_some() {
                    "allocated,"
                } else {
                    "used,"
                },
                opt(d.reserved_bytes),
                opt(d.total_bytes),
                d.backend
            );
        }
        let limit = match self.cgroup {
            Some(c) => match c.limit {
                Some(l) => format!("cgroup v{} limit {}", c.version, fmt_bytes(l)),
                None => format!("cgroup v{} unlimited", c.version),
            },
            None => "no memory cgroup".into(),
        };
        out += &format!("  Available   {:>12}  {limit}\n", opt(self.available()));
        out
    }
}
