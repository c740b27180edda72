//! The one interface through which tensor and accelerator backends (libtorch, cudarc, NVML — in the
//! `memsight-integrations` crate) feed memsight: tensor-byte counters, device samples taken by the
//! session's sampler, and device OOM events. The sampler, reports, sidecar and viewer read only
//! these types, so they need no knowledge of any backend.

pub mod cupti;

pub use crate::tensors;
pub use memsight_format::device::{
    fold_peaks, DeviceLines, DeviceOom, DevicePeak, DeviceProcess, DeviceSample, SegmentMap,
};

use crate::collect::SourceStatus;
use memsight_format::wire::Record;
use std::sync::Mutex;

/// A backend that can be sampled for device memory.
pub trait DeviceSource: Send {
    /// Short name for the report's source list (`libtorch-cuda`, `nvml`, `cudarc`).
    fn name(&self) -> &str;
    /// Whether it delivers values, and why not.
    fn status(&self) -> SourceStatus;
    /// Appends one sample per device it sees.
    fn sample(&mut self, out: &mut Vec<DeviceSample>);
}

struct Registry {
    sources: Vec<Box<dyn DeviceSource>>,
    /// Statuses of backends that are not sampled: absent ones (they say why) and hooks.
    notes: Vec<SourceStatus>,
    ooms: Vec<DeviceOom>,
    /// The latest device-by-line record of each device's peak.
    lines: Vec<DeviceLines>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    sources: Vec::new(),
    notes: Vec::new(),
    ooms: Vec::new(),
    lines: Vec::new(),
});

/// Most OOM events kept for the report (each is also written to the flight recorder).
const MAX_OOMS: usize = 64;

/// Adds a device source; the session's sampler reads it on every sample.
pub fn register(source: Box<dyn DeviceSource>) {
    crate::sys::lock(&REGISTRY).sources.push(source);
}

/// Records that a backend is absent, with its reason, so reports say why there is no data.
pub fn register_absent(name: &str, why: &str) {
    note_source(SourceStatus {
        name: name.into(),
        available: false,
        detail: why.into(),
    });
}

/// Records the status of a backend that is not sampled (a hook such as libtorch's CPU allocator,
/// or an absent backend), so the report's source list shows it.
pub fn note_source(status: SourceStatus) {
    let mut r = crate::sys::lock(&REGISTRY);
    r.notes.retain(|s| s.name != status.name);
    r.notes.push(status);
}

/// One sample from every registered source.
pub fn sample_all() -> Vec<DeviceSample> {
    let mut out = Vec::new();
    for s in crate::sys::lock(&REGISTRY).sources.iter_mut() {
        s.sample(&mut out);
    }
    out
}

/// Every backend's status: registered sources, absent backends and, when present, the tensor hook.
pub fn statuses() -> Vec<SourceStatus> {
    let r = crate::sys::lock(&REGISTRY);
    let mut v: Vec<SourceStatus> = r.sources.iter().map(|s| s.status()).collect();
    v.extend(r.notes.iter().cloned());
    v
}

/// Records a device OOM: kept for the report and written to the flight recorder at once, so a
/// sidecar has it even if the job dies next. Call from outside allocator locks.
pub fn record_oom(mut oom: DeviceOom) {
    oom.step = crate::phases::current_step();
    oom.phase = crate::phases::process_phase();
    if let Some(t_ms) = crate::flight::session_ms() {
        oom.t_ms = t_ms;
        crate::flight::append(&Record::DeviceOom(Box::new(oom.clone())));
    }
    let mut r = crate::sys::lock(&REGISTRY);
    if r.ooms.len() < MAX_OOMS {
        r.ooms.push(oom);
    }
}

/// Device OOMs recorded so far.
pub fn ooms() -> Vec<DeviceOom> {
    crate::sys::lock(&REGISTRY).ooms.clone()
}

/// Records a device's allocated memory at its peak so far by Python line (it replaces the
/// device's earlier record): kept for the report and written to the flight recorder, so a report
/// rebuilt after the job died has it too.
pub fn record_lines(mut lines: DeviceLines) {
    if let Some(t_ms) = crate::flight::session_ms() {
        lines.t_ms = t_ms;
        crate::flight::append(&Record::DeviceLines(Box::new(lines.clone())));
    }
    let mut r = crate::sys::lock(&REGISTRY);
    r.lines.retain(|l| l.device != lines.device);
    r.lines.push(lines);
}

/// The device-by-line records so far, one per device.
pub fn lines() -> Vec<DeviceLines> {
    crate::sys::lock(&REGISTRY).lines.clone()
}
