//! Prometheus exposition (opt-in, `--metrics ADDR`, loopback by default): every headline number of
//! the report, now and at its peak — the job's heap, tensor bytes, device memory and fragmentation
//! (per device), RSS, tree RSS/PSS, jemalloc resident, fragmentation, cgroup usage, limit and
//! headroom, OOM events by kind — and the step, labelled with the job and its rank (devices also by `device`), encoded by the
//! `prometheus-client` crate and served over plain HTTP at `/metrics`. docs/grafana has a dashboard
//! of them for a multi-rank job.

use memsight_format::device::{fold_peaks, DevicePeak};
use memsight_format::report::{Fragmentation, Report};
use memsight_format::snapshot::Snapshot;
use memsight_format::timeline::{raise_resident, PeakAt};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

mod http;
pub use http::{parse_addr, serve};

type Labels = Vec<(String, String)>;
type IntGauge = Family<Labels, Gauge>;
type FloatGauge = Family<Labels, Gauge<f64, AtomicU64>>;

/// The gauges, updated from every snapshot the sidecar sees.
pub struct Metrics {
    registry: Mutex<Registry>,
    labels: Labels,
    heap_live: IntGauge,
    heap_peak: IntGauge,
    rss: IntGauge,
    rss_hwm: IntGauge,
    tree_rss: IntGauge,
    tree_pss: IntGauge,
    cgroup_headroom: IntGauge,
    step: IntGauge,
    tensor_live: IntGauge,
    tensor_peak: IntGauge,
    device_allocated: IntGauge,
    device_reserved: IntGauge,
    device_used: IntGauge,
    device_allocated_peak: IntGauge,
    device_reserved_peak: IntGauge,
    device_used_peak: IntGauge,
    device_fragmentation: FloatGauge,
    rss_peak: IntGauge,
    tree_pss_peak: IntGauge,
    /// Per process of the job that carries memsight: its heap and PSS, labelled with its pid and
    /// role (`rank 1`, `worker of rank 0`…); a process's series goes when it does.
    process_heap: IntGauge,
    process_pss: IntGauge,
    process_labels: Mutex<Vec<Labels>>,
    jemalloc_resident: IntGauge,
    jemalloc_resident_peak: IntGauge,
    cgroup_usage: IntGauge,
    cgroup_usage_peak: IntGauge,
    cgroup_limit: IntGauge,
    /// Out-of-memory events by kind: a counter (`memsight_oom_events_total`), raised to each
    /// count the sidecar learns under `oom_counts`' lock.
    ooms: Family<Labels, Counter>,
    oom_counts: Mutex<()>,
    fragmentation: FloatGauge,
    /// Every sample's peaks so far (the report's own fold: fragmentation at the resident peak,
    /// device peaks, the tree's PSS peak).
    peaks: Mutex<Peaks>,
}

/// What the gauges of peaks are folded from, as the report folds them.
#[derive(Default)]
struct Peaks {
    /// The sample with the highest jemalloc resident so far, where fragmentation is measured.
    resident: Option<(PeakAt, Snapshot)>,
    devices: Vec<DevicePeak>,
    rss: u64,
    tree_pss: u64,
    cgroup_usage: u64,
    /// The cgroup's OOM-kill count at the first sample (the report counts kills since watching
    /// began).
    cgroup_kills_base: Option<u64>,
    /// Device OOM events the job's observer caught.
    device_oom_events: u64,
}

/// The `kind` label of `memsight_oom_events_total`.
const OOM_DEVICE: &str = "device";
const OOM_ALLOC: &str = "allocation_failure";
const OOM_KILL: &str = "cgroup_oom_kill";

/// Labels for a job: its program name, and RANK / LOCAL_RANK / WORLD_SIZE when set in the job's
/// environment: the process `pid`'s own (`/proc/PID/environ`, for `attach`), else this process's
/// (under `run` the job inherits it).
pub fn job_labels(program: &str, pid: Option<u32>) -> Labels {
    let name = std::path::Path::new(program)
        .file_name()
        .map_or_else(|| program.to_string(), |n| n.to_string_lossy().into_owned());
    let theirs = pid.and_then(|p| std::fs::read(format!("/proc/{p}/environ")).ok());
    let lookup = |var: &str| -> Option<String> {
        match &theirs {
            Some(block) => block.split(|b| *b == 0).find_map(|entry| {
                let entry = std::str::from_utf8(entry).ok()?;
                entry
                    .strip_prefix(var)
                    .and_then(|rest| rest.strip_prefix('='))
                    .map(str::to_string)
            }),
            None => std::env::var(var).ok(),
        }
    };
    let mut l = vec![("job".to_string(), name)];
    for (var, label) in [
        ("RANK", "rank"),
        ("LOCAL_RANK", "local_rank"),
        ("WORLD_SIZE", "world_size"),
    ] {
        if let Some(v) = lookup(var) {
            l.push((label.to_string(), v));
        }
    }
    l
}

fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Metrics {
    /// Registers every gauge with `labels`.
    pub fn new(labels: Labels) -> Self {
        let mut registry = Registry::default();
        let mut int = |name: &str, help: &str| {
            let g = IntGauge::default();
            registry.register(name, help, g.clone());
            g
        };
        let heap_live = int(
            "memsight_heap_live_bytes",
            "Live heap bytes of the job (tracking allocator)",
        );
        let heap_peak = int(
            "memsight_heap_peak_bytes",
            "Peak live heap bytes of the job",
        );
        let rss = int("memsight_rss_bytes", "Resident set size of the job");
        let rss_hwm = int("memsight_rss_hwm_bytes", "RSS high-water mark of the job");
        let tree_rss = int(
            "memsight_tree_rss_bytes",
            "RSS summed over the job and all its child processes (pages shared by several count once per process)",
        );
        let tree_pss = int(
            "memsight_tree_pss_bytes",
            "PSS summed over the job and all its child processes: their memory footprint, shared pages counted once",
        );
        let cgroup_headroom = int(
            "memsight_cgroup_headroom_bytes",
            "Bytes left below the memory cgroup limit",
        );
        let step = int("memsight_step", "Current training step");
        let tensor_live = int(
            "memsight_tensor_live_bytes",
            "Live tensor bytes (libtorch's allocator hook)",
        );
        let tensor_peak = int(
            "memsight_tensor_peak_bytes",
            "Peak live tensor bytes of the run",
        );
        let device_allocated = int(
            "memsight_device_allocated_bytes",
            "Device memory allocated to tensors by the framework's caching allocator, per device",
        );
        let device_reserved = int(
            "memsight_device_reserved_bytes",
            "Device memory reserved by the framework's caching allocator, per device",
        );
        let device_used = int(
            "memsight_device_used_bytes",
            "Device memory in use as the driver reports it (NVML), per device",
        );
        let device_allocated_peak = int(
            "memsight_device_allocated_peak_bytes",
            "Peak device memory allocated to tensors over the run, per device (the allocator's own peak when it keeps one)",
        );
        let device_reserved_peak = int(
            "memsight_device_reserved_peak_bytes",
            "Peak device memory reserved by the caching allocator over the run, per device",
        );
        let device_used_peak = int(
            "memsight_device_used_peak_bytes",
            "Peak driver-reported device memory in use over the run (NVML), per device",
        );
        let rss_peak = int(
            "memsight_rss_peak_bytes",
            "Peak RSS of the job over the run: the kernel's high-water mark, or the highest sampled RSS",
        );
        let process_heap = int(
            "memsight_process_heap_bytes",
            "Live heap bytes of one process of the job (pid, role: rank N, worker, launcher…)",
        );
        let process_pss = int(
            "memsight_process_pss_bytes",
            "PSS of one process of the job (pid, role: rank N, worker, launcher…)",
        );
        let tree_pss_peak = int(
            "memsight_tree_pss_peak_bytes",
            "Peak PSS total of the job and its child processes over the run (the report's process tree)",
        );
        let jemalloc_resident = int(
            "memsight_jemalloc_resident_bytes",
            "Heap pages jemalloc holds in memory, in use or cached",
        );
        let jemalloc_resident_peak = int(
            "memsight_jemalloc_resident_peak_bytes",
            "Peak jemalloc resident bytes over the run",
        );
        let cgroup_usage = int(
            "memsight_cgroup_usage_bytes",
            "Memory charged to the job's cgroup (includes page cache)",
        );
        let cgroup_usage_peak = int(
            "memsight_cgroup_usage_peak_bytes",
            "Peak memory charged to the job's cgroup over the run",
        );
        let cgroup_limit = int(
            "memsight_cgroup_limit_bytes",
            "The job's effective cgroup memory limit (absent when unlimited)",
        );
        let ooms = Family::<Labels, Counter>::default();
        registry.register(
            "memsight_oom_events",
            "Out-of-memory events of the run, by kind: device (OOMs the job's allocator observer caught), allocation_failure (heap allocations that returned null), cgroup_oom_kill (OOM kills in the job's cgroup since watching began)",
            ooms.clone(),
        );
        let mut float = |name: &str, help: &str| {
            let g = FloatGauge::default();
            registry.register(name, help, g.clone());
            g
        };
        let fragmentation = float(
            "memsight_fragmentation_ratio",
            "The run's heap fragmentation: jemalloc (resident - allocated) / resident at its resident peak so far",
        );
        let device_fragmentation = float(
            "memsight_device_fragmentation_ratio",
            "A device's fragmentation at its peak: (peak reserved - peak allocated) / peak reserved, per device",
        );
        Metrics {
            registry: Mutex::new(registry),
            labels,
            heap_live,
            heap_peak,
            rss,
            rss_hwm,
            tree_rss,
            tree_pss,
            cgroup_headroom,
            step,
            tensor_live,
            tensor_peak,
            device_allocated,
            device_reserved,
            device_used,
            device_allocated_peak,
            device_reserved_peak,
            device_used_peak,
            device_fragmentation,
            rss_peak,
            tree_pss_peak,
            process_heap,
            process_pss,
            process_labels: Mutex::new(Vec::new()),
            jemalloc_resident,
            jemalloc_resident_peak,
            cgroup_usage,
            cgroup_usage_peak,
            cgroup_limit,
            ooms,
            oom_counts: Mutex::new(()),
            fragmentation,
            peaks: Mutex::new(Peaks::default()),
        }
    }

    fn with(&self, label: &str, value: &str) -> Labels {
        let mut l = self.labels.clone();
        l.push((label.to_string(), value.to_string()));
        l
    }

    /// Raises the count of `kind` to `n` (a count never goes down: a lower one, from a source
    /// that saw less, is ignored).
    fn set_ooms(&self, kind: &str, n: u64) {
        let _one_at_a_time = crate::lock(&self.oom_counts);
        let c = self.ooms.get_or_create(&self.with("kind", kind));
        let now = c.get();
        if n > now {
            c.inc_by(n - now);
        }
    }

    /// A device OOM the job's observer caught.
    pub fn device_oom(&self) {
        let mut p = crate::lock(&self.peaks);
        p.device_oom_events += 1;
        let n = p.device_oom_events.max(allocator_ooms(&p.devices));
        self.set_ooms(OOM_DEVICE, n);
    }

    /// Heap allocations that failed so far (the flight recorder's count).
    pub fn alloc_failures(&self, n: u64) {
        self.set_ooms(OOM_ALLOC, n);
    }

    /// The final report's counts, once the job ended: its OOM kills and device OOMs.
    pub fn finish(&self, r: &Report) {
        if let Some(k) = r.post_mortem.as_ref().and_then(|pm| pm.cgroup_oom_kills) {
            self.set_ooms(OOM_KILL, k);
        }
        let p = crate::lock(&self.peaks);
        let devices = (r.device_ooms.len() as u64)
            .max(p.device_oom_events)
            .max(allocator_ooms(&r.devices));
        if devices > 0 || !r.devices.is_empty() {
            self.set_ooms(OOM_DEVICE, devices);
        }
    }

    /// The per-process gauges of the tree's measured processes; those of processes gone are removed.
    fn update_processes(&self, t: &memsight_format::host::ProcessTree) {
        let mut now = Vec::new();
        for p in &t.processes {
            let (Some(heap), Some(role)) = (p.heap, p.role.as_ref()) else {
                continue;
            };
            let mut l = self.labels.clone();
            l.push(("pid".into(), p.pid.to_string()));
            l.push(("role".into(), role.clone()));
            self.process_heap.get_or_create(&l).set(clamp(heap));
            if let Some(pss) = p.pss {
                self.process_pss.get_or_create(&l).set(clamp(pss));
            }
            now.push(l);
        }
        let mut seen = crate::lock(&self.process_labels);
        for gone in seen.iter().filter(|l| !now.contains(l)) {
            self.process_heap.remove(gone);
            self.process_pss.remove(gone);
        }
        *seen = now;
    }

    /// The live heap of each measured process of the job (pid, heap, role), as its flight
    /// recorder last said it: set at every poll, not only when the process tree is read (its PSS
    /// is read as often as its cost allows, seconds apart in a large job). Processes gone are
    /// removed with the next tree read.
    pub fn process_heaps(&self, heaps: &[(u32, u64, String)]) {
        for (pid, heap, role) in heaps {
            let mut l = self.labels.clone();
            l.push(("pid".into(), pid.to_string()));
            l.push(("role".into(), role.clone()));
            self.process_heap.get_or_create(&l).set(clamp(*heap));
        }
    }

    /// Sets the gauges from a snapshot (sources a snapshot lacks keep their last value).
    pub fn update(&self, s: &Snapshot) {
        let l = &self.labels;
        self.step.get_or_create(l).set(clamp(s.step));
        if s.heap.allocations > 0 {
            self.heap_live
                .get_or_create(l)
                .set(clamp(s.heap.live_bytes));
            self.heap_peak
                .get_or_create(l)
                .set(clamp(s.heap.peak_bytes));
        }
        if let Some(p) = &s.process {
            self.rss.get_or_create(l).set(clamp(p.rss));
            self.rss_hwm.get_or_create(l).set(clamp(p.hwm));
        }
        if let Some(t) = &s.tree {
            self.tree_rss.get_or_create(l).set(clamp(t.total_rss));
            if let Some(pss) = t.total_pss {
                self.tree_pss.get_or_create(l).set(clamp(pss));
            }
            self.update_processes(t);
        }
        if let Some(h) = s.cgroup.and_then(|c| c.headroom()) {
            self.cgroup_headroom.get_or_create(l).set(clamp(h));
        }
        if let Some(t) = &s.tensors {
            self.tensor_live.get_or_create(l).set(clamp(t.live_bytes));
            self.tensor_peak.get_or_create(l).set(clamp(t.peak_bytes));
        }
        if let Some(c) = s.cgroup {
            self.cgroup_usage.get_or_create(l).set(clamp(c.usage));
            if let Some(lim) = c.limit {
                self.cgroup_limit.get_or_create(l).set(clamp(lim));
            }
        }
        if let Some(j) = s.jemalloc {
            self.jemalloc_resident
                .get_or_create(l)
                .set(clamp(j.resident));
        }
        for d in &s.devices {
            let dl = self.with("device", &d.index.to_string());
            for (gauge, value) in [
                (&self.device_allocated, d.allocated_bytes),
                (&self.device_reserved, d.reserved_bytes),
                (&self.device_used, d.used_bytes),
            ] {
                if let Some(v) = value {
                    gauge.get_or_create(&dl).set(clamp(v));
                }
            }
        }
        self.update_peaks(s);
    }

    /// The gauges of peaks, folded as the report folds them.
    fn update_peaks(&self, s: &Snapshot) {
        let l = &self.labels;
        let mut p = crate::lock(&self.peaks);
        raise_resident(&mut p.resident, s);
        if let Some((at, _)) = &p.resident {
            self.jemalloc_resident_peak
                .get_or_create(l)
                .set(clamp(at.bytes));
        }
        if let Some(f) = Fragmentation::at_resident_peak(p.resident.as_ref()) {
            self.fragmentation.get_or_create(l).set(f.resident_ratio);
        }
        if let Some(m) = &s.process {
            p.rss = p.rss.max(m.rss).max(m.hwm);
            self.rss_peak.get_or_create(l).set(clamp(p.rss));
        }
        if let Some(pss) = s.tree.as_ref().and_then(|t| t.total_pss) {
            p.tree_pss = p.tree_pss.max(pss);
            self.tree_pss_peak.get_or_create(l).set(clamp(p.tree_pss));
        }
        if let Some(c) = s.cgroup {
            p.cgroup_usage = p.cgroup_usage.max(c.usage).max(c.peak.unwrap_or(0));
            self.cgroup_usage_peak
                .get_or_create(l)
                .set(clamp(p.cgroup_usage));
            if let Some(k) = c.oom_kills {
                let base = *p.cgroup_kills_base.get_or_insert(k);
                self.set_ooms(OOM_KILL, k.saturating_sub(base));
            }
        }
        if s.devices.is_empty() {
            return;
        }
        fold_peaks(&mut p.devices, &s.devices);
        for d in &p.devices {
            let dl = self.with("device", &d.index.to_string());
            for (gauge, value) in [
                (&self.device_allocated_peak, d.peak_allocated_bytes),
                (&self.device_reserved_peak, d.peak_reserved_bytes),
                (&self.device_used_peak, d.peak_used_bytes),
            ] {
                if let Some(v) = value {
                    gauge.get_or_create(&dl).set(clamp(v));
                }
            }
            if let Some(f) = d.peak_fragmentation {
                self.device_fragmentation.get_or_create(&dl).set(f);
            }
        }
        let n = p.device_oom_events.max(allocator_ooms(&p.devices));
        self.set_ooms(OOM_DEVICE, n);
    }

    /// The exposition text (OpenMetrics).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let registry = crate::lock(&self.registry);
        if encode(&mut out, &registry).is_err() {
            out.clear();
        }
        out
    }
}

/// The caching allocators' own OOM counts, summed over devices (one backend per device: the
/// highest count of its backends).
fn allocator_ooms(devices: &[DevicePeak]) -> u64 {
    let mut by_device: Vec<(u32, u64)> = Vec::new();
    for d in devices {
        let n = d.ooms.unwrap_or(0);
        match by_device.iter_mut().find(|(i, _)| *i == d.index) {
            Some((_, m)) => *m = (*m).max(n),
            None => by_device.push((d.index, n)),
        }
    }
    by_device.iter().map(|(_, n)| n).sum()
}
