//! The session: a builder, the sampler thread that fills the timeline, and the final report.
//!
//! Environment overrides (so `memsight run` can switch a binary's session without code changes;
//! every `MEMSIGHT_*` variable is in one table, docs/environment.md): `MEMSIGHT_REPORT` (report
//! path), `MEMSIGHT_INTERVAL_MS` (sampling interval), `MEMSIGHT_QUIET=1` (no snapshot blocks on
//! stderr), `MEMSIGHT_RING` (the flight-recorder ring's path, set by `memsight run`; `off` for
//! none), `MEMSIGHT_PROFILE_DIR` (where heap profiles go; by default beside the report, see
//! [`crate::heapprof::dir_for_report`]), `MEMSIGHT_HEAP_SAMPLE` (`off` or the mean bytes between
//! heap samples). They take precedence over the builder; a value that cannot be used is said once
//! on stderr and the default (or the builder's setting) is kept — never a lost job. Without
//! `MEMSIGHT_RING` a session writes its ring to `ring-<pid>.bin` in the runtime directory, where
//! `memsight attach` finds it, and removes it when it finishes.
//!
//! The report's destination is checked when the session starts (its directory exists and a file
//! can be created there; nothing is created), and opened then: the report is written into that
//! directory at the end.

use crate::alloc;
use crate::collect::{HostCollector, HostSample};
use crate::devices;
use crate::flight;
use crate::heapprof;
use crate::phases;
use crate::sys::{lock, unix_ms};
use memsight_format::report::{self, Job, JobExit, Report, ReportError};
use memsight_format::safe_dir::Dir;
use memsight_format::snapshot::Snapshot;
use sampler::{append_snapshot, Shared};

mod by_hand;
mod panicked;
mod place;
mod sampler;
pub mod signals;
use memsight_format::timeline::{Timeline, DEFAULT_CAPACITY};
use memsight_format::wire::ring::RingWriter;
use memsight_format::wire::{self, Record};
pub use place::{exiting, forked, writes_user_report};
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

static ACTIVE: AtomicBool = AtomicBool::new(false);
static CURRENT: Mutex<Option<Arc<Shared>>> = Mutex::new(None);

/// Why a session could not start or finish.
#[derive(Debug)]
pub enum SessionError {
    /// Another session is running in this process.
    AlreadyRunning,
    /// A setting is out of range.
    InvalidConfig(String),
    /// The sampler thread could not be spawned.
    Spawn(std::io::Error),
    /// The report could not be written.
    Report(ReportError),
    /// The report path set with [`SessionBuilder::report_path`] cannot be written (found when the
    /// session starts; nothing was created).
    ReportPath {
        /// The report path.
        path: PathBuf,
        /// Why it cannot be written.
        source: std::io::Error,
    },
}

impl fmt::Display for SessionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SessionError::AlreadyRunning => {
                f.write_str("a memsight session is already running in this process")
            }
            SessionError::InvalidConfig(why) => {
                write!(f, "invalid memsight session setting: {why}")
            }
            SessionError::Spawn(e) => write!(f, "cannot start the memsight sampler thread: {e}"),
            SessionError::Report(e) => write!(f, "cannot write the memsight report: {e}"),
            SessionError::ReportPath { path, source } => write!(
                f,
                "the memsight report cannot be written to {}: {source}",
                path.display()
            ),
        }
    }
}

impl std::error::Error for SessionError {}

/// Configures a [`Session`]. Every setting is optional.
#[derive(Clone, Debug)]
pub struct SessionBuilder {
    interval: Duration,
    report_path: Option<PathBuf>,
    timeline_capacity: usize,
    quiet: bool,
    ring: RingChoice,
    /// The report path came from `MEMSIGHT_REPORT` (a path that cannot be written is then a
    /// warning, not an error).
    report_from_env: bool,
    /// In a job started by hand: the user's path keeps this report only if no process of the job
    /// that is more its main process wrote one (`by_hand`).
    offered: bool,
}

/// Where the session's flight recorder goes.
#[derive(Clone, Debug)]
enum RingChoice {
    /// `ring-<pid>.bin` in the runtime directory, removed at finish.
    Default,
    /// A path a sidecar chose (it removes the file).
    At(PathBuf),
    /// No flight recorder.
    Off,
}

impl Default for SessionBuilder {
    fn default() -> Self {
        SessionBuilder {
            interval: Duration::from_millis(100),
            report_path: None,
            timeline_capacity: DEFAULT_CAPACITY,
            quiet: false,
            ring: RingChoice::Default,
            report_from_env: false,
            offered: false,
        }
    }
}

impl SessionBuilder {
    /// Sampling interval (default 100 ms; at least 1 ms).
    ///
    /// ```
    /// let b = memsight::Session::builder().interval(std::time::Duration::from_millis(50));
    /// ```
    pub fn interval(mut self, d: Duration) -> Self {
        self.interval = d;
        self
    }

    /// Where [`Session::finish`] writes the JSON report (default: no file). [`Self::start`] fails
    /// when it cannot be written there (a missing directory, a directory at the path), and creates
    /// nothing that was not asked for.
    ///
    /// ```
    /// let b = memsight::Session::builder().report_path("memsight-report.json");
    /// ```
    pub fn report_path(mut self, p: impl Into<PathBuf>) -> Self {
        self.report_path = Some(p.into());
        self
    }

    /// Most snapshots kept in the timeline (default 3000); older history is merged, peaks kept.
    ///
    /// ```
    /// let b = memsight::Session::builder().timeline_capacity(10_000);
    /// ```
    pub fn timeline_capacity(mut self, n: usize) -> Self {
        self.timeline_capacity = n;
        self
    }

    /// Do not print the snapshot block to stderr at start and finish.
    ///
    /// ```
    /// let b = memsight::Session::builder().quiet();
    /// ```
    pub fn quiet(mut self) -> Self {
        self.quiet = true;
        self
    }

    fn apply_env(mut self) -> Result<Self, SessionError> {
        if let Some(p) = std::env::var_os("MEMSIGHT_REPORT").filter(|p| !p.is_empty()) {
            self.report_path = Some(p.into());
            self.report_from_env = true;
        }
        if let Some(ms) = std::env::var_os("MEMSIGHT_INTERVAL_MS") {
            // A bad value costs a warning, never the job (it reached the job through its
            // environment, often from a script far from the code that starts the session).
            match ms.to_str().and_then(|m| m.trim().parse::<u64>().ok()) {
                Some(ms) if ms > 0 => self.interval = Duration::from_millis(ms),
                _ => crate::sys::warn_env_once(
                    "MEMSIGHT_INTERVAL_MS",
                    &ms,
                    &format!(
                        "it is not a number of milliseconds above 0; sampling every {} ms",
                        self.interval.as_millis()
                    ),
                ),
            }
        }
        if let Some(q) = std::env::var_os("MEMSIGHT_QUIET") {
            match q.to_str().map(|v| v.trim().to_ascii_lowercase()).as_deref() {
                Some("1" | "true" | "yes" | "on") => self.quiet = true,
                Some("0" | "false" | "no" | "off" | "") => {}
                _ => crate::sys::warn_env_once(
                    "MEMSIGHT_QUIET",
                    &q,
                    "it is neither 1 nor 0; the session prints as set in the code",
                ),
            }
        }
        match std::env::var_os("MEMSIGHT_RING").filter(|p| !p.is_empty()) {
            Some(p) if p == "off" => self.ring = RingChoice::Off,
            Some(p) => self.ring = RingChoice::At(p.into()),
            None if place::forked_here() && place::job_prefix().is_none() => {
                // A fork outside `memsight run`: its parent's report is its parent's.
                self.report_path = None;
            }
            None => {
                // In a job under `memsight run`: every process has a ring of its own, and only
                // the one `memsight run` started writes the user's report; the others leave
                // theirs beside their ring, for the sidecar to assemble the job from.
                if let Some(prefix) = place::job_prefix() {
                    let ring = place::ring_in_job(&prefix);
                    if !place::writes_user_report() {
                        self.report_path = Some(ring.with_extension("json"));
                    }
                    // The sidecar speaks for the job: its processes print nothing of their own.
                    self.quiet = true;
                    self.ring = RingChoice::At(ring);
                }
            }
        }
        if self.report_from_env && self.report_path.is_some() && place::job_prefix().is_none() {
            // A job started by hand: every process of it offers its report, the path keeps the
            // main one's; the first process alone speaks.
            self.offered = true;
            if !place::writes_user_report() {
                self.quiet = true;
            }
        }
        Ok(self)
    }

    /// Starts sampling. Fails if a session is already running in this process, or when the
    /// report path the builder was given cannot be written (one `MEMSIGHT_REPORT` gave is a warning
    /// on stderr and no report file instead).
    pub fn start(self) -> Result<Session, SessionError> {
        let mut cfg = self.apply_env()?;
        if cfg.interval < Duration::from_millis(1) {
            return Err(SessionError::InvalidConfig(format!(
                "interval {:?} is below 1 ms",
                cfg.interval
            )));
        }
        let report_dir = match open_report_dir(cfg.report_path.as_deref()) {
            Ok(dir) => dir,
            Err((path, source)) if cfg.report_from_env => {
                // By hand, every process of the job finds the same path: the first one says so.
                if !cfg.offered || place::writes_user_report() {
                    eprintln!(
                        "memsight: MEMSIGHT_REPORT={}: cannot write a report there ({source}); \
                         the job runs without a report file",
                        path.display()
                    );
                }
                cfg.report_path = None;
                None
            }
            Err((path, source)) => return Err(SessionError::ReportPath { path, source }),
        };
        if ACTIVE.swap(true, Ordering::SeqCst) {
            return Err(SessionError::AlreadyRunning);
        }
        panicked::install();
        let started_unix_ms = unix_ms();
        // The job never fails because its watcher's ring cannot be made: it says so and runs on.
        let ring_path = match &cfg.ring {
            RingChoice::Off => None,
            RingChoice::At(p) => Some(p.clone()),
            // A file left by a dead process that had our pid is stale, unless someone holds it
            // (a job with our pid in another PID namespace sharing the directory).
            RingChoice::Default => wire::default_ring_path(std::process::id())
                .ok()
                .inspect(|p| {
                    wire::remove_stale_files();
                    if wire::ring::is_unused(p) {
                        let _ = std::fs::remove_file(p);
                    }
                }),
        };
        let ring = ring_path.as_deref().and_then(|p| {
            let interval_ms = cfg.interval.as_millis() as u64;
            match RingWriter::create(p, std::process::id(), started_unix_ms, interval_ms) {
                Ok(w) => {
                    let w = w.install_alloc_failure_words();
                    let hello = Record::Hello {
                        pid: std::process::id(),
                        command: std::env::args_os()
                            .map(|a| a.to_string_lossy().into_owned())
                            .collect(),
                        start_unix_ms: started_unix_ms,
                        interval_ms,
                        memsight_version: env!("CARGO_PKG_VERSION").into(),
                        process: place::info(),
                    };
                    w.append(&hello);
                    place::own();
                    Some((w, hello))
                }
                Err(e) => {
                    eprintln!("memsight: no flight recorder at {}: {e}", p.display());
                    None
                }
            }
        });
        let (ring, hello) = ring.map_or((None, None), |(w, h)| (Some(w), Some(h)));
        let started = Instant::now();
        let profile_dir = std::env::var_os("MEMSIGHT_PROFILE_DIR")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .map(|d| {
                // Each process of a job profiles into a directory of its own.
                if place::job_prefix().is_some() && !place::writes_user_report() {
                    d.join(format!("p{}", std::process::id()))
                } else {
                    d
                }
            })
            .or_else(|| {
                let dir = heapprof::dir_for_report(cfg.report_path.as_deref()?);
                // Also in a job started by hand, where they share the report's path.
                Some(if cfg.offered && !place::writes_user_report() {
                    dir.join(format!("p{}", std::process::id()))
                } else {
                    dir
                })
            })
            // The report names its profiles by absolute path: a reader started elsewhere finds them.
            .map(|d| std::path::absolute(&d).unwrap_or(d));
        let heap_profile = match &profile_dir {
            Some(dir) => heapprof::start(dir, started, ring, phases::current_step()).inspect_err(
                // Said even in a quiet session: a refused directory is a choice the user must see
                // (once per job: by the process `memsight run` started).
                |e| {
                    if place::writes_user_report() {
                        eprintln!("memsight: no heap profiles: {e}")
                    }
                },
            ),
            None => Err("no report path, so no heap profiles are written".into()),
        };
        let shared = Arc::new(Shared {
            started,
            heap_profile,
            started_unix_ms,
            ring,
            timeline: Mutex::new(Timeline::with_capacity(cfg.timeline_capacity)),
            collector: Mutex::new(HostCollector::for_self()),
            stop: Mutex::new(false),
            wake: Condvar::new(),
            missed: AtomicU64::new(0),
            nudged: AtomicBool::new(false),
        });
        let first = shared.sample();
        if !cfg.quiet {
            eprint!("{}", first.render_block("session start"));
        }
        shared.record(first);
        let sampler = Some(spawn_sampler(&shared, cfg.interval).map_err(|e| {
            ACTIVE.store(false, Ordering::SeqCst);
            SessionError::Spawn(e)
        })?);
        *lock(&CURRENT) = Some(Arc::clone(&shared));
        flight::install(ring, started, hello);
        Ok(Session {
            shared,
            sampler,
            cfg,
            report_dir,
            finished: false,
        })
    }
}

/// Spawns the sampler thread, with the job's signals blocked in it
/// ([`crate::sys::spawn_without_signals`]). Its stack size is given, so spawning reads no environment variable:
/// [`Session::start_sampler`] may run inside `malloc`, whose caller may hold the environment's lock.
fn spawn_sampler(shared: &Arc<Shared>, interval: Duration) -> std::io::Result<JoinHandle<()>> {
    let worker = Arc::clone(shared);
    crate::sys::spawn_without_signals(
        std::thread::Builder::new()
            .name("memsight-sampler".into())
            .stack_size(SAMPLER_STACK),
        move || worker.run(interval),
    )
}

/// The sampler thread's stack: the standard library's default for spawned threads.
const SAMPLER_STACK: usize = 2 << 20;

/// A running profiling session: samples memory until [`Session::finish`] (or drop).
pub struct Session {
    shared: Arc<Shared>,
    sampler: Option<JoinHandle<()>>,
    cfg: SessionBuilder,
    /// The report's directory, opened at start.
    report_dir: Option<Arc<Dir>>,
    finished: bool,
}

/// Checks that a report can be written at `path` (a regular file or nothing there, and a file can
/// be created in its directory; nothing is left behind) and opens its directory.
fn open_report_dir(
    path: Option<&std::path::Path>,
) -> Result<Option<Arc<Dir>>, (PathBuf, std::io::Error)> {
    let Some(path) = path else {
        return Ok(None);
    };
    let fail = |e| (path.to_path_buf(), e);
    memsight_format::safe_file::check_writable(path).map_err(fail)?;
    Dir::parent_of(path)
        .map(|d| Some(Arc::new(d)))
        .map_err(fail)
}

/// Writes `report` under `path`'s file name into `dir` (its directory, opened at start): complete
/// or not at all, only over a regular file.
fn write_report(
    report: &Report,
    dir: &Arc<Dir>,
    path: &std::path::Path,
) -> Result<(), SessionError> {
    use std::io::Write;
    let io = |source| {
        SessionError::Report(ReportError::Io {
            path: path.to_path_buf(),
            source,
        })
    };
    let name = path
        .file_name()
        .ok_or_else(|| io(std::io::Error::other("the report path names no file")))?;
    let json = report.to_json().map_err(SessionError::Report)?;
    let mut pending =
        memsight_format::safe_file::Pending::in_dir(Arc::clone(dir), name).map_err(io)?;
    pending.file().write_all(&json).map_err(io)?;
    pending.file().sync_data().map_err(io)?;
    pending.commit().map(drop).map_err(io)
}

impl Session {
    /// A builder with the defaults (100 ms interval, no report file).
    pub fn builder() -> SessionBuilder {
        SessionBuilder::default()
    }

    /// Marks the start of training step `n` (as [`crate::step`]).
    pub fn step(&self, n: u64) {
        crate::step(n)
    }

    /// Opens a phase on the calling thread (as [`crate::phase`]).
    pub fn phase(&self, name: &str) -> phases::PhaseGuard {
        phases::phase(name)
    }

    /// The report path in effect (builder or `MEMSIGHT_REPORT`).
    pub fn report_path(&self) -> Option<&std::path::Path> {
        self.cfg.report_path.as_deref()
    }

    /// A copy of the timeline so far.
    pub fn timeline(&self) -> Vec<Snapshot> {
        lock(&self.shared.timeline).samples().to_vec()
    }

    /// The report's heap-profile section of a session without a sidecar: symbolized with the
    /// `symbolize` feature (in a forked child: `heapprof::report_section`); otherwise the
    /// profiles, and how to read their sites.
    fn heap_profile_section(
        &self,
        dumps: Vec<heapprof::DumpRecord>,
    ) -> Option<heapprof::HeapProfile> {
        let dir = self
            .cfg
            .report_path
            .as_deref()
            .and_then(std::path::Path::parent)
            .map(PathBuf::from)
            .unwrap_or_default();
        heapprof::report_section(dumps, &dir)
    }

    /// Stops the sampler thread until [`Session::start_sampler`] (the session keeps its ring and
    /// timeline): for the moment a program changes its credentials (`setresuid`, `setgroups`…),
    /// which the C library applies to every thread of the process, aborting it when one refuses;
    /// memsight's thread may lack a capability the program kept on its own thread (`setpriv`).
    pub fn pause_sampler(&mut self) {
        let Some(h) = self.sampler.take() else {
            return;
        };
        *lock(&self.shared.stop) = true;
        self.shared.wake.notify_all();
        let _ = h.join();
        *lock(&self.shared.stop) = false;
    }

    /// Starts the sampler thread again after [`Session::pause_sampler`]; does nothing when it runs
    /// or the session finished.
    pub fn start_sampler(&mut self) -> Result<(), SessionError> {
        if self.finished || self.sampler.is_some() {
            return Ok(());
        }
        let sampler =
            spawn_sampler(&self.shared, self.cfg.interval).map_err(SessionError::Spawn)?;
        self.sampler = Some(sampler);
        Ok(())
    }

    /// Stops sampling, takes a last snapshot, writes the report (when a path is set) and returns it.
    pub fn finish(mut self) -> Result<Report, SessionError> {
        self.finish_inner()
    }

    fn finish_inner(&mut self) -> Result<Report, SessionError> {
        self.finished = true;
        *lock(&self.shared.stop) = true;
        self.shared.wake.notify_all();
        if let Some(h) = self.sampler.take() {
            let _ = h.join();
        }
        let last = self.shared.sample();
        if !self.cfg.quiet {
            eprint!("{}", last.render_block("session end"));
        }
        if let Some(r) = &self.shared.ring {
            append_snapshot(r, &last);
        }
        self.shared.record_signals();
        let training = crate::training::close();
        self.shared.record_phases();
        // The step whose peak is the session's: where the exact peak's profile was.
        let peak_step = phases::step_stats()
            .iter()
            .max_by_key(|s| s.peak_bytes)
            .map_or(phases::current_step(), |s| s.step);
        let dumps = heapprof::finish(phases::current_step(), peak_step);
        let report = {
            let mut tl = lock(&self.shared.timeline);
            tl.push(last);
            let mut sources = lock(&self.shared.collector).sources();
            sources.extend(devices::statuses());
            sources.push(crate::collect::SourceStatus {
                name: "heap profile".into(),
                available: self.shared.heap_profile.is_ok(),
                detail: match &self.shared.heap_profile {
                    Ok(what) => what.clone(),
                    Err(why) => why.clone(),
                },
            });
            let end_unix_ms = unix_ms();
            report::build::build(report::build::Parts {
                job: Job {
                    pid: std::process::id(),
                    command: std::env::args_os()
                        .map(|a| a.to_string_lossy().into_owned())
                        .collect(),
                    start_unix_ms: self.shared.started_unix_ms,
                    end_unix_ms,
                    exit: match panicked::unwinding() {
                        Some(why) => JobExit {
                            kind: "panicked".into(),
                            code: None,
                            signal: None,
                            description: format!("the job panicked: {why}"),
                        },
                        None => JobExit {
                            kind: "finished".into(),
                            code: None,
                            signal: None,
                            description: "session finished in-process".into(),
                        },
                    },
                },
                interval_ms: self.cfg.interval.as_millis() as u64,
                timeline: &tl,
                heap: alloc::stats(),
                phases: phases::phase_stats(),
                steps: phases::step_stats(),
                histogram: report::histogram_buckets(&alloc::size_histogram()),
                sources,
                tensors: devices::tensors::stats(),
                device_ooms: devices::ooms(),
            })
        };
        // Under `memsight run` the sidecar symbolizes (it outlives the job); otherwise a build
        // with the `symbolize` feature does it here, and any other lists the profiles and says how
        // to read them.
        let report = {
            let mut report = report;
            report.device_lines = devices::lines();
            report.python_arenas = crate::pymalloc::latest();
            if training.is_some() {
                report.training = training;
                report.tips = report::tips::derive(&report);
            }
            if !matches!(self.cfg.ring, RingChoice::At(_)) && !dumps.is_empty() {
                report.set_heap_profile(self.heap_profile_section(dumps));
            }
            report
        };
        *lock(&CURRENT) = None;
        flight::remove();
        // A later session in this process starts from no steps, phases or peak of this one.
        phases::reset();
        alloc::restart_run_peak();
        ACTIVE.store(false, Ordering::SeqCst);
        if let (Some(p), Some(dir)) = (&self.cfg.report_path, &self.report_dir) {
            let kept = if self.cfg.offered {
                by_hand::offer_report(&report, dir, p)?
            } else {
                write_report(&report, dir, p).map(|()| None)?
            };
            if !self.cfg.quiet {
                match kept {
                    None => eprintln!("memsight · report written to {}", p.display()),
                    Some(by_hand::Kept {
                        report: main,
                        nested: false,
                    }) => eprintln!(
                        "memsight · {} keeps the report of the job's main process, pid {} ({}): \
                         it ran training steps or held more heap than this one (pid {}); \
                         `memsight run` reports every process of the job",
                        p.display(),
                        main.job.pid,
                        main.job.command.join(" "),
                        std::process::id()
                    ),
                    Some(by_hand::Kept {
                        report: last,
                        nested: true,
                    }) => eprintln!(
                        "memsight · {} keeps the report of pid {} ({}), a command line this \
                         process (pid {}) ran as a job of its own",
                        p.display(),
                        last.job.pid,
                        last.job.command.join(" "),
                        std::process::id()
                    ),
                }
            }
        }
        if let Some(r) = &self.shared.ring {
            r.append(&Record::Finished {
                report_path: self
                    .cfg
                    .report_path
                    .as_ref()
                    .map(|p| p.display().to_string()),
            });
            // The default ring is ours to remove; a sidecar's is the sidecar's.
            if matches!(self.cfg.ring, RingChoice::Default) {
                let _ = std::fs::remove_file(r.path());
            }
        }
        Ok(report)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if !self.finished {
            if let Err(e) = self.finish_inner() {
                eprintln!("memsight: {e}");
            }
        }
    }
}

/// In a forked child that carries memsight: forgets the session its parent runs (its sampler
/// thread did not survive the fork; its ring is the parent's), without waiting for a lock another
/// thread of the parent held at the fork, so that the child can start a session of its own.
pub fn forget_inherited() {
    if let Ok(mut current) = CURRENT.try_lock() {
        // Not dropped: its fields belong to the parent's threads, which are gone here.
        std::mem::forget(current.take());
    }
    memsight_format::wire::ring::forget_in_forked_child(flight::forget_in_child());
    signals::forget_inherited();
    ACTIVE.store(false, Ordering::SeqCst);
}

/// Says this process's rank again in its ring when its environment names one its greeting did
/// not (called at each training step, on the thread that marks it: the one that sets the
/// environment, in the launchers seen).
pub(crate) fn note_rank() {
    flight::rank_now(memsight_format::process::RankEnv::from_env);
}

/// A step began: a watched session samples soon (at once unless it sampled a moment ago), so a job
/// that dies now is not placed at its previous step (the sidecar's post-mortem reads where the job
/// was from the last sample; the in-process report needs no such sample).
pub(crate) fn step_began() {
    if let Some(shared) = lock(&CURRENT).as_ref().filter(|s| s.ring.is_some()) {
        shared.nudge();
    }
}

/// A snapshot taken now: through the running session's collectors, or fresh ones without a session.
pub fn snapshot() -> Snapshot {
    let current = lock(&CURRENT).clone();
    match current {
        Some(shared) => shared.sample(),
        None => own_snapshot(0, HostCollector::for_self().sample()),
    }
}

/// This process's snapshot at `t_ms`: its heap counters, step and phase, the host sample, and
/// what its tensor and device backends report.
fn own_snapshot(t_ms: u64, host: HostSample) -> Snapshot {
    let mut s = Snapshot::new(
        t_ms,
        phases::current_step(),
        phases::process_phase(),
        alloc::stats(),
        host,
    );
    s.tensors = devices::tensors::stats();
    s.devices = devices::sample_all();
    s
}

/// Prints the human-readable snapshot block (Allocated / In use / Peak / System RSS / Available)
/// to stderr.
pub fn print_snapshot(title: &str) {
    eprint!("{}", snapshot().render_block(title));
}
