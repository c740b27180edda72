//! Prometheus exposition (opt-in, `--metrics ADDR`, loopback by default): the job's live and peak
//! heap, tensor bytes, device memory (per device), RSS, tree RSS/PSS, fragmentation, cgroup
//! headroom and step, labelled with the job and its rank (devices also by `device`), encoded by the
//! `prometheus-client` crate and served over plain HTTP at `/metrics`. docs/grafana has a dashboard
//! of them for a multi-rank job.

use memsight_format::report::Fragmentation;
use memsight_format::snapshot::Snapshot;
use memsight_format::timeline::{raise_resident, PeakAt};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
    fragmentation: FloatGauge,
    /// The sample with the highest jemalloc resident so far, where fragmentation is measured.
    resident_peak: Mutex<Option<(PeakAt, Snapshot)>>,
}

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
        let fragmentation = FloatGauge::default();
        registry.register(
            "memsight_fragmentation_ratio",
            "The run's heap fragmentation: jemalloc (resident - allocated) / resident at its resident peak so far",
            fragmentation.clone(),
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
            fragmentation,
            resident_peak: Mutex::new(None),
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
        }
        if let Some(h) = s.cgroup.and_then(|c| c.headroom()) {
            self.cgroup_headroom.get_or_create(l).set(clamp(h));
        }
        if let Some(t) = &s.tensors {
            self.tensor_live.get_or_create(l).set(clamp(t.live_bytes));
            self.tensor_peak.get_or_create(l).set(clamp(t.peak_bytes));
        }
        for d in &s.devices {
            let mut dl = l.clone();
            dl.push(("device".to_string(), d.index.to_string()));
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
        let mut peak = crate::lock(&self.resident_peak);
        raise_resident(&mut peak, s);
        if let Some(f) = Fragmentation::at_resident_peak(peak.as_ref()) {
            self.fragmentation.get_or_create(l).set(f.resident_ratio);
        }
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

/// Parses a metrics address: `IP:PORT`, `[IPv6]:PORT` or `HOST:PORT` (`localhost:9464`), the
/// first address the name resolves to.
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    use std::net::ToSocketAddrs;
    if let Ok(a) = s.parse() {
        return Ok(a);
    }
    match s.to_socket_addrs() {
        Ok(mut addrs) => addrs
            .next()
            .ok_or_else(|| format!("`{s}` resolves to no address")),
        Err(e) => Err(format!(
            "`{s}` is not an address (HOST:PORT, e.g. 127.0.0.1:9464 or localhost:9464): {e}"
        )),
    }
}

/// Connections answered at once; more are told 503 and closed.
const MAX_CONNECTIONS: usize = 16;
/// Longest a client has to send its request and take the answer.
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);

/// Longest the accept loop spends telling a client over the limit that it is busy.
const REFUSAL_DEADLINE: Duration = Duration::from_millis(200);

/// Answers 503 to a client over the limit. Its request is read first (within
/// [`REFUSAL_DEADLINE`]): closing a socket with unread bytes resets the connection, and the client
/// may then lose the answer (seen on a loaded 2-core machine).
fn refuse(mut conn: TcpStream) {
    let deadline = std::time::Instant::now() + REFUSAL_DEADLINE;
    let _ = conn.set_read_timeout(Some(REFUSAL_DEADLINE));
    let _ = conn.set_write_timeout(Some(REFUSAL_DEADLINE));
    let mut buf = [0u8; 4096];
    let mut tail = [0u8; 4];
    while std::time::Instant::now() < deadline {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                for &b in &buf[..n] {
                    tail = [tail[1], tail[2], tail[3], b];
                }
                if &tail == b"\r\n\r\n" {
                    break;
                }
            }
        }
    }
    let _ = conn.write_all(
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    let _ = conn.shutdown(std::net::Shutdown::Write);
}

/// Serves `/metrics` at `addr` on a thread of its own; returns the address bound (port 0 picks
/// one). Each connection is answered on its own thread, at most [`MAX_CONNECTIONS`] at once, and
/// gets [`REQUEST_DEADLINE`] in all: a slow or idle client cannot hold the others up.
pub fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    let busy = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("memsight-metrics".into())
        .spawn(move || {
            for conn in listener.incoming().flatten() {
                if busy.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
                    busy.fetch_sub(1, Ordering::AcqRel);
                    refuse(conn);
                    continue;
                }
                let (m, b) = (Arc::clone(&metrics), Arc::clone(&busy));
                let spawned = std::thread::Builder::new()
                    .name("memsight-metrics-conn".into())
                    .spawn(move || {
                        let _ = answer(conn, &m);
                        b.fetch_sub(1, Ordering::AcqRel);
                    });
                if spawned.is_err() {
                    busy.fetch_sub(1, Ordering::AcqRel);
                }
            }
        })?;
    Ok(bound)
}

fn answer(mut conn: TcpStream, metrics: &Metrics) -> io::Result<()> {
    let deadline = std::time::Instant::now() + REQUEST_DEADLINE;
    let left = || {
        deadline
            .checked_duration_since(std::time::Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| io::Error::new(io::ErrorKind::TimedOut, "request too slow"))
    };
    conn.set_write_timeout(Some(REQUEST_DEADLINE))?;
    let mut req = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 16 * 1024 {
        conn.set_read_timeout(Some(left()?))?;
        let n = conn.read(&mut buf)?;
        if n == 0 {
            break;
        }
        req.extend_from_slice(&buf[..n]);
    }
    let first = req.split(|&b| b == b'\n').next().unwrap_or_default();
    let (status, ctype, body) =
        if first.starts_with(b"GET /metrics ") || first.starts_with(b"GET /metrics?") {
            (
                "200 OK",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                metrics.encode(),
            )
        } else {
            (
                "404 Not Found",
                "text/plain",
                "memsight serves /metrics only\n".to_string(),
            )
        };
    write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}
