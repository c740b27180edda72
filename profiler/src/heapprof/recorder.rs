//! When the running job writes heap profiles: at new heap peaks (5% above the last peak profile,
//! at most one per `MEMSIGHT_HEAP_PEAK_EVERY_MS` unless the peak doubled; each is the sampled set
//! live at the instant of the session's exact peak so far, however short the peak, and the session
//! writes it once more as it finishes), at step boundaries
//! (the first after warm-up and the latest, for the growth view), on request through the ring, and
//! at session end. Each dump is announced on the flight recorder so the sidecar has it even if the
//! job dies next.
//!
//! Tuning by environment: `MEMSIGHT_HEAP_PEAK_EVERY_MS` (least time between peak dumps, default
//! 500), `MEMSIGHT_HEAP_STEP_EVERY_MS` (least time between step dumps, default 2000).

use super::control;
use crate::sys::lock;
use memsight_format::heap_profile::{DumpKind, DumpRecord};
use memsight_format::safe_dir::Dir;
use memsight_format::wire::ring::RingWriter;
use memsight_format::wire::Record;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A peak dump needs the heap to have grown this much since the last one.
const PEAK_GROWTH: f64 = 1.05;
/// Step dumps start at this step (steps 0 and 1 build optimizer state and caches).
const FIRST_STEP: u64 = 2;

struct Recorder {
    /// The profile directory, open: every profile is written relative to it.
    dir: Arc<Dir>,
    started: Instant,
    ring: Option<&'static RingWriter>,
    /// The job's current step (told at each step boundary).
    step: u64,
    peak_every: Duration,
    step_every: Duration,
    peak_dumped_bytes: u64,
    last_peak: Option<Instant>,
    last_step: Option<Instant>,
    /// Profiles written through [`request`] (numbers their files).
    api_dumps: u64,
    requests_seen: u64,
    sampling_seen: u64,
    records: Vec<DumpRecord>,
}

static RECORDER: Mutex<Option<Recorder>> = Mutex::new(None);

/// The milliseconds the environment variable `name` says, or `default` (said once on stderr when
/// it holds something else than a number).
fn env_ms(name: &str, default: u64) -> Duration {
    let Some(v) = std::env::var_os(name) else {
        return Duration::from_millis(default);
    };
    match v.to_str().and_then(|s| s.trim().parse().ok()) {
        Some(ms) => Duration::from_millis(ms),
        None => {
            crate::sys::warn_env_once(
                name,
                &v,
                &format!("it is not a number of milliseconds; using {default}"),
            );
            Duration::from_millis(default)
        }
    }
}

/// Starts recording into `dir` (created component by component, never through another user's
/// link, and refused when another user owns it): what is in effect, or why there is no heap
/// profiling.
pub(crate) fn start(
    dir: &Path,
    started: Instant,
    ring: Option<&'static RingWriter>,
    step: u64,
) -> Result<String, String> {
    let rate = control::configure_from_env()?;
    let opened = Dir::create_own(dir, 0o755)
        .map_err(|e| format!("cannot create heap profile directory: {e}"))?;
    *lock(&RECORDER) = Some(Recorder {
        dir: Arc::new(opened),
        started,
        ring,
        step,
        peak_every: env_ms("MEMSIGHT_HEAP_PEAK_EVERY_MS", 500),
        step_every: env_ms("MEMSIGHT_HEAP_STEP_EVERY_MS", 2000),
        peak_dumped_bytes: 0,
        last_peak: None,
        last_step: None,
        api_dumps: 0,
        requests_seen: ring.map_or(0, RingWriter::heap_dump_requests),
        sampling_seen: ring.map_or(0, RingWriter::heap_sampling_request),
        records: Vec::new(),
    });
    Ok(match rate {
        Some(b) => format!(
            "one allocation sampled per {} on average, profiles in {}",
            memsight_format::units::fmt_bytes(b),
            dir.display()
        ),
        None => format!(
            "sampling off (MEMSIGHT_HEAP_SAMPLE=off); `memsight heap sampling on PID` starts it, \
             profiles go to {}",
            dir.display()
        ),
    })
}

fn sampling_now() -> bool {
    control::sampling() == Some(true)
}

impl Recorder {
    fn write(&mut self, kind: DumpKind, name: &str, step: u64, heap_bytes: u64) -> Option<PathBuf> {
        let path = self.dir.path().join(name);
        // A peak profile is the sampled set at the session's exact peak, whenever it is written.
        let written = if kind == DumpKind::Peak {
            control::dump_peak(&self.dir, OsStr::new(name))
        } else {
            control::dump(&self.dir, OsStr::new(name))
        };
        if let Err(e) = written {
            eprintln!("memsight: {e}");
            return None;
        }
        let record = DumpRecord {
            kind,
            path: path.display().to_string(),
            t_ms: self.started.elapsed().as_millis() as u64,
            step,
            heap_bytes,
        };
        if let Some(r) = self.ring {
            r.append(&Record::HeapProfile(record.clone()));
        }
        // A new peak profile replaces the file of the last one.
        self.records.retain(|d| d.path != record.path);
        self.records.push(record);
        Some(path)
    }
}

/// Called by the sampler with the heap's current size: dumps at a new peak, and serves requests.
pub(crate) fn on_sample(heap_bytes: u64, step: u64) {
    #[cfg(feature = "sampling")]
    crate::alloc::sampling::refresh_walker();
    let mut guard = lock(&RECORDER);
    let Some(r) = guard.as_mut() else { return };
    if let Some(ring) = r.ring {
        let wanted = ring.heap_sampling_request();
        if wanted != r.sampling_seen {
            r.sampling_seen = wanted;
            if wanted != 0 {
                if let Err(e) = control::set_sampling(wanted == 1) {
                    eprintln!("memsight: {e}");
                }
            }
        }
        let requests = ring.heap_dump_requests();
        if requests > r.requests_seen {
            r.requests_seen = requests;
            r.write(
                DumpKind::Request,
                &format!("request-{requests}.heap"),
                step,
                heap_bytes,
            );
        }
    }
    // At most one peak dump per `peak_every`, unless the peak doubled since the last one (a
    // bounded number of extra dumps: one per doubling). The session's peak, not the heap now, says
    // when: a spike shorter than the sampling interval raised it, and the dump is its set.
    if !sampling_now() {
        return;
    }
    let peak = run_peak_bytes().max(heap_bytes);
    let due = r.last_peak.is_none_or(|t| t.elapsed() >= r.peak_every)
        || peak >= r.peak_dumped_bytes.saturating_mul(2);
    if due && peak as f64 >= r.peak_dumped_bytes as f64 * PEAK_GROWTH && peak > 0 {
        if r.write(DumpKind::Peak, "peak.heap", step, peak).is_some() {
            r.peak_dumped_bytes = peak;
        }
        r.last_peak = Some(Instant::now());
    }
}

/// Called at the start of step `n` (the training loop's thread): the first dump after warm-up is
/// kept as the growth view's baseline, later ones replace each other.
pub(crate) fn on_step(n: u64) {
    let mut guard = lock(&RECORDER);
    let Some(r) = guard.as_mut() else { return };
    r.step = n;
    if n < FIRST_STEP || r.last_step.is_some_and(|t| t.elapsed() < r.step_every) || !sampling_now()
    {
        return;
    }
    r.last_step = Some(Instant::now());
    let heap = heap_bytes_now();
    if r.write(DumpKind::Step, &format!("step-{n}.heap"), n, heap)
        .is_none()
    {
        return;
    }
    // Keep the first step profile (the growth view's baseline) and the latest.
    let steps: Vec<String> = r
        .records
        .iter()
        .filter(|d| d.kind == DumpKind::Step)
        .map(|d| d.path.clone())
        .collect();
    if let [_, previous, _] = steps.as_slice() {
        if let Some(name) = Path::new(previous).file_name() {
            let _ = r.dir.remove_file(name);
        }
        r.records.retain(|d| &d.path != previous);
    }
}

/// Writes the profile at the session's exact peak (`peak_step`: the step it happened in) and the
/// final profile, and stops; returns every profile still on disk, oldest first.
pub(crate) fn finish(step: u64, peak_step: u64) -> Vec<DumpRecord> {
    let mut guard = lock(&RECORDER);
    let Some(mut r) = guard.take() else {
        return Vec::new();
    };
    if sampling_now() {
        r.write(DumpKind::Peak, "peak.heap", peak_step, run_peak_bytes());
        r.write(DumpKind::Final, "final.heap", step, heap_bytes_now());
    }
    r.records
}

/// The session's peak of the process heap so far.
fn run_peak_bytes() -> u64 {
    crate::alloc::stats().run_peak_bytes
}

/// Writes a profile now (the public [`super::dump`]).
pub(crate) fn request() -> Result<PathBuf, String> {
    let mut guard = lock(&RECORDER);
    match guard.as_mut() {
        Some(r) => {
            r.api_dumps += 1;
            let n = r.api_dumps;
            r.write(
                DumpKind::Request,
                &format!("api-{n}.heap"),
                r.step,
                heap_bytes_now(),
            )
            .ok_or_else(|| "the heap profile could not be written".to_string())
        }
        None => Err(format!(
            "no memsight session with heap profiling is running: {}",
            control::HOW_TO_ENABLE
        )),
    }
}

/// The process heap's live bytes now (exact, no jemalloc epoch advance).
fn heap_bytes_now() -> u64 {
    crate::alloc::counters::heap_live()
}
