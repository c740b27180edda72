//! The device side of a snapshot and a report, as plain data: accelerator samples, their peaks over
//! a run, device OOMs caught as they happened, and tensor-byte counters. The backends that fill them
//! (libtorch, cudarc, NVML) register through `memsight::devices`.

use crate::units::max_opt;
use serde::{Deserialize, Serialize};

/// One process holding memory on a device (from NVML).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceProcess {
    /// The PID as the driver reports it (host PID namespace).
    pub host_pid: u32,
    /// The same process's PID in our PID namespace, when it is visible here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Device memory it holds, when the driver says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    /// True when it is the profiled job itself.
    pub is_job: bool,
}

/// One segment (driver allocation) of a caching allocator, for the segment map: its size and its
/// blocks folded into equal cells, each holding the allocated share of that slice (0–255).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentMap {
    /// Segment size.
    pub bytes: u64,
    /// Bytes allocated inside it.
    pub allocated_bytes: u64,
    /// Allocated share of each equal slice, 0 (free) to 255 (full), in address order.
    pub cells: Vec<u8>,
}

/// One accelerator's memory at one instant, as one backend sees it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceSample {
    /// Device index (CUDA ordinal).
    pub index: u32,
    /// Which backend measured it: `libtorch-cuda`, `cudarc`, `nvml`, or from Python `torch-cuda`.
    pub backend: String,
    /// Device name, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Device memory size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_bytes: Option<u64>,
    /// Device memory free (driver view: every process counts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_bytes: Option<u64>,
    /// Device memory used by every process (NVML).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    /// Bytes handed out by the job's allocator (tensors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_bytes: Option<u64>,
    /// Bytes the job's caching allocator holds from the driver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_bytes: Option<u64>,
    /// Bytes in blocks that are in use or awaiting stream sync.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_bytes: Option<u64>,
    /// Free bytes inside split blocks (fragmentation the allocator cannot return).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inactive_split_bytes: Option<u64>,
    /// Bytes the callers asked for (before rounding).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_bytes: Option<u64>,
    /// The allocator's own peak of `allocated_bytes` (exact, between samples too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_allocated_bytes: Option<u64>,
    /// The allocator's own peak of `reserved_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_reserved_bytes: Option<u64>,
    /// Times the allocator freed its cache and retried (a sign of memory pressure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alloc_retries: Option<u64>,
    /// Out-of-memory errors raised by the allocator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ooms: Option<u64>,
    /// GPU utilization in percent (NVML).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization_pct: Option<u32>,
    /// Processes holding memory on the device (NVML).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<DeviceProcess>,
    /// The allocator's largest segments, largest first (about once a second).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub segments: Vec<SegmentMap>,
}

impl DeviceSample {
    /// (reserved − allocated) / reserved: memory the caching allocator holds but cannot use.
    pub fn fragmentation(&self) -> Option<f64> {
        let r = self.reserved_bytes?;
        let a = self.allocated_bytes?;
        (r > 0).then(|| r.saturating_sub(a) as f64 / r as f64)
    }

    /// The largest amount other processes hold on this device.
    pub fn others_bytes(&self) -> u64 {
        self.processes
            .iter()
            .filter(|p| !p.is_job)
            .filter_map(|p| p.used_bytes)
            .sum()
    }
}

/// A device out-of-memory, caught at the moment it happened (libtorch's OOM observer).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceOom {
    /// Milliseconds since the session started (0 without a session).
    #[serde(default)]
    pub t_ms: u64,
    /// Training step at that moment.
    #[serde(default)]
    pub step: u64,
    /// Phase at that moment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Device index.
    pub device: u32,
    /// The request that failed, in bytes.
    pub requested_bytes: u64,
    /// Device total memory.
    pub total_bytes: u64,
    /// Device free memory (driver view).
    pub free_bytes: u64,
    /// Bytes the allocator had handed out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_bytes: Option<u64>,
    /// Bytes the allocator held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_bytes: Option<u64>,
    /// Free bytes inside split blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inactive_split_bytes: Option<u64>,
    /// The largest free block in the allocator's segments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub largest_free_block_bytes: Option<u64>,
    /// Other processes on the device (NVML), when known.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<DeviceProcess>,
    /// The device memory allocated at the OOM by Python line, and the line whose request failed
    /// (PyTorch's allocator history, `memsight run --device-history`; added in wire 1.7).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lines: Option<Box<DeviceLines>>,
}

/// A device's allocated memory at one moment by the Python line that allocated it, from PyTorch's
/// own allocator history (`torch.cuda.memory._record_memory_history` with Python stacks, read by
/// the `memsight.torch` package: `memsight run --device-history`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceLines {
    /// Device index.
    pub device: u32,
    /// `peak` (the highest allocated point the history holds) or `oom` (allocated at an OOM).
    pub moment: String,
    /// Milliseconds since the session started, when it was recorded (0 without a session).
    #[serde(default)]
    pub t_ms: u64,
    /// Bytes allocated at that moment, as asked for (the allocator's history and its
    /// `requested_bytes` statistic count them so; its allocated bytes add each block's rounding).
    pub live_bytes: u64,
    /// Of those, bytes in blocks without a Python stack (see the categories `backward` and
    /// `before history`).
    #[serde(default)]
    pub no_stack_bytes: u64,
    /// Bytes of lines below the ones listed.
    #[serde(default)]
    pub other_lines_bytes: u64,
    /// The lines holding the most, largest first.
    #[serde(default)]
    pub lines: Vec<DeviceLine>,
    /// The bytes by category (parameters, gradients, optimizer state, activations, backward,
    /// before history, other), largest first.
    #[serde(default)]
    pub categories: Vec<DeviceCategory>,
    /// Allocator actions the history held when read (bounded: a ring of the last ones).
    #[serde(default)]
    pub history_entries: u64,
    /// The allocator's own peak of requested bytes (`requested_bytes.all.peak`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocator_peak_bytes: Option<u64>,
    /// For a `peak`: whether the history reached back to the allocator's own peak (false: it
    /// holds a lower one, the highest of its window).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub covers_peak: Option<bool>,
    /// For an `oom`: the request that failed and the line that made it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_request: Option<DeviceLine>,
}

impl DeviceLines {
    /// The top `n` lines in one phrase: `144.0 MiB model.py:87 forward (activations), …`.
    pub fn top_text(&self, n: usize) -> String {
        self.lines
            .iter()
            .take(n)
            .map(|l| {
                format!(
                    "{} {} ({})",
                    crate::units::fmt_bytes(l.bytes),
                    l.short(),
                    l.category
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Device bytes allocated by one Python line.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceLine {
    /// The source file, as Python names it.
    pub file: String,
    /// The line number.
    pub line: u32,
    /// The function.
    pub function: String,
    /// Bytes allocated there and live at the moment.
    pub bytes: u64,
    /// Blocks.
    pub blocks: u64,
    /// The category holding most of its bytes.
    #[serde(default)]
    pub category: String,
    /// The stack of its largest block, innermost first, `file:line function` each (bounded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stack: Vec<String>,
}

impl DeviceLine {
    /// `train.py:112 forward`: the file's name without its directories.
    pub fn short(&self) -> String {
        let name = self.file.rsplit('/').next().unwrap_or(&self.file);
        format!("{name}:{} {}", self.line, self.function)
    }
}

/// Device bytes of one category.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceCategory {
    /// `parameters`, `gradients`, `optimizer state`, `activations`, `backward`, `before history`,
    /// `other`.
    pub name: String,
    /// Bytes.
    pub bytes: u64,
}

/// One device's peaks over a whole run, as one backend saw them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DevicePeak {
    /// Device index.
    pub index: u32,
    /// The backend that measured it.
    pub backend: String,
    /// Device name, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Device memory size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_bytes: Option<u64>,
    /// Highest allocated (tensor) bytes: the allocator's own peak when it keeps one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_allocated_bytes: Option<u64>,
    /// Highest reserved bytes: the allocator's own peak when it keeps one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_reserved_bytes: Option<u64>,
    /// Highest driver-reported used bytes (every process on the device).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_used_bytes: Option<u64>,
    /// (peak reserved − peak allocated) / peak reserved: the share of the reserved peak that never
    /// held tensors at once (cached and fragmented blocks at the peak). Not the highest sampled
    /// ratio: between steps, activations are freed but stay cached, and that ratio nears 100% in
    /// every healthy job (0.9996 after the OOM measured on an H100, docs/gpu.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_fragmentation: Option<f64>,
    /// Allocator retries (cache flushes) by the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alloc_retries: Option<u64>,
    /// Allocator OOMs by the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ooms: Option<u64>,
    /// Most memory other processes held on the device at one sample.
    pub peak_others_bytes: u64,
    /// Most memory the job itself held on the device at one sample, as the driver counts it per
    /// process (NVML): its allocator's reservation plus the CUDA context and library workspaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_job_used_bytes: Option<u64>,
}

impl DevicePeak {
    /// The figure a device budget compares: peak reserved, else peak driver-reported used.
    pub fn footprint(&self) -> Option<u64> {
        self.peak_reserved_bytes.or(self.peak_used_bytes)
    }

    /// Folds one sample of this device and backend in.
    pub fn fold(&mut self, s: &DeviceSample) {
        self.name = s.name.clone().or(self.name.take());
        self.total_bytes = s.total_bytes.or(self.total_bytes);
        self.peak_allocated_bytes = max_opt(
            self.peak_allocated_bytes,
            max_opt(s.peak_allocated_bytes, s.allocated_bytes),
        );
        self.peak_reserved_bytes = max_opt(
            self.peak_reserved_bytes,
            max_opt(s.peak_reserved_bytes, s.reserved_bytes),
        );
        self.peak_used_bytes = max_opt(self.peak_used_bytes, s.used_bytes);
        self.peak_fragmentation = self
            .peak_reserved_bytes
            .zip(self.peak_allocated_bytes)
            .filter(|&(r, _)| r > 0)
            .map(|(r, a)| r.saturating_sub(a) as f64 / r as f64);
        self.alloc_retries = max_opt(self.alloc_retries, s.alloc_retries);
        self.ooms = max_opt(self.ooms, s.ooms);
        self.peak_others_bytes = self.peak_others_bytes.max(s.others_bytes());
        let own = s
            .processes
            .iter()
            .find(|p| p.is_job)
            .and_then(|p| p.used_bytes);
        self.peak_job_used_bytes = max_opt(self.peak_job_used_bytes, own);
    }
}

/// Folds a sample's devices into per-(device, backend) peaks.
pub fn fold_peaks(peaks: &mut Vec<DevicePeak>, samples: &[DeviceSample]) {
    for s in samples {
        let i = match peaks
            .iter()
            .position(|p| p.index == s.index && p.backend == s.backend)
        {
            Some(i) => i,
            None => {
                peaks.push(DevicePeak {
                    index: s.index,
                    backend: s.backend.clone(),
                    ..Default::default()
                });
                peaks.len() - 1
            }
        };
        peaks[i].fold(s);
    }
}

/// Tensor memory at one instant, as reported by the tensor backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorStats {
    /// Bytes of live tensor storage (usable size of each block).
    pub live_bytes: u64,
    /// Highest `live_bytes` since start or the last reset (`memsight::devices::tensors::reset_peak`).
    pub peak_bytes: u64,
    /// Tensor storage allocations so far.
    pub allocs: u64,
    /// Tensor storage frees so far.
    pub frees: u64,
}
