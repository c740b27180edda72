//! The sidecar: runs a job with profiling switched on through the environment, follows its
//! flight recorder, and writes the final report with a post-mortem — also when the job was killed,
//! which is when the data matters most. The job never waits for the sidecar; killing the sidecar
//! leaves the job running.

mod attach;
pub mod metrics;
mod oomwatch;
mod postmortem;
pub mod server;

pub use attach::{attach, AttachOptions};

use crate::report::Report;
use crate::snapshot::Snapshot;
use crate::sys::unix_ms;
use crate::timeline::Timeline;
use crate::wire::ring::RingReader;
use crate::wire::runtime_dir;
use crate::wire::Record;
use std::ffi::OsString;
use std::fmt;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Command, ExitStatus};
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// What `memsight run` was asked to do.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// The command and its arguments.
    pub command: Vec<OsString>,
    /// Where the final report goes; `-` writes it to standard output.
    pub report: PathBuf,
    /// Sampling interval the job is switched on with.
    pub interval: Duration,
    /// Serve Prometheus metrics at this address.
    pub metrics: Option<std::net::SocketAddr>,
    /// Send the job's stdout and stderr to this file instead of the terminal (`--live`).
    pub job_output: Option<PathBuf>,
    /// Heap profiling: `None` off, else the mean bytes between samples (a power of two).
    pub heap_sample_bytes: Option<u64>,
    /// Told the job's pid once it runs (a viewer in the same process connects then).
    pub on_spawn: Option<mpsc::Sender<u32>>,
}

/// How the run ended.
#[derive(Debug)]
pub struct RunOutcome {
    /// The job's exit code, 128 + signal when it was killed.
    pub exit_code: i32,
    /// The report.
    pub report: Report,
    /// Why the report did not reach its path, when it did not (the job's code still stands).
    pub report_error: Option<SidecarError>,
}

/// Whether `report` means standard output (`--report -`).
pub fn to_stdout(report: &std::path::Path) -> bool {
    report.as_os_str() == "-"
}

/// Checks, before the job starts, that `report` can be written (see [`crate::safe_file`]).
pub fn check_report_path(report: &std::path::Path) -> Result<(), SidecarError> {
    if to_stdout(report) {
        return Ok(());
    }
    crate::safe_file::check_writable(report).map_err(|e| {
        SidecarError::Report(crate::report::ReportError::Io {
            path: report.to_path_buf(),
            source: e,
        })
    })
}

/// Writes the final report to its path, or to standard output for `-`.
pub(crate) fn deliver(report: &Report, to: &std::path::Path) -> Result<(), SidecarError> {
    if to_stdout(to) {
        use std::io::Write;
        let json = report.to_json().map_err(SidecarError::Report)?;
        let mut out = std::io::stdout().lock();
        return out
            .write_all(&json)
            .and_then(|()| out.write_all(b"\n"))
            .and_then(|()| out.flush())
            .map_err(|e| {
                SidecarError::Report(crate::report::ReportError::Io {
                    path: to.to_path_buf(),
                    source: e,
                })
            });
    }
    report.save(to).map_err(SidecarError::Report)
}

/// Why the sidecar could not do its job.
#[derive(Debug)]
pub enum SidecarError {
    /// No command given.
    NoCommand,
    /// The command could not be started.
    Spawn(String, std::io::Error),
    /// The runtime directory could not be made.
    RuntimeDir(PathBuf, std::io::Error),
    /// The report could not be written.
    Report(crate::report::ReportError),
    /// `attach` was given a pid with no process.
    NoProcess(u32),
    /// The metrics address could not be bound.
    Metrics(std::net::SocketAddr, std::io::Error),
}

impl fmt::Display for SidecarError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SidecarError::NoCommand => {
                f.write_str("no command given: memsight run [OPTIONS] -- CMD ARGS…")
            }
            SidecarError::Spawn(cmd, e) => write!(f, "cannot start `{cmd}`: {e}"),
            SidecarError::RuntimeDir(p, e) => {
                write!(f, "cannot use runtime directory {}: {e}", p.display())
            }
            SidecarError::Report(e) => write!(f, "cannot write the report: {e}"),
            SidecarError::NoProcess(pid) => write!(f, "no process {pid} (see `ps`)"),
            SidecarError::Metrics(a, e) => write!(f, "cannot serve metrics at {a}: {e}"),
        }
    }
}

impl std::error::Error for SidecarError {}

/// The exit code a shell would show: the code, or 128 + signal.
pub fn shell_code(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// What the sidecar gathered while the job ran.
pub(crate) struct Watch {
    pub timeline: Timeline,
    pub hello: Option<Record>,
    pub finished_report: Option<PathBuf>,
    pub ring_start_unix_ms: Option<u64>,
    pub dropped: u64,
    /// Ring drops already told to viewers.
    dropped_told: u64,
    pub alloc_failures: (u64, u64),
    pub ring_error: Option<String>,
    /// Sources the sidecar read itself (uninstrumented `attach`).
    pub sources: Vec<crate::collect::SourceStatus>,
    /// The job's latest phase statistics.
    pub phases: Vec<crate::PhaseStats>,
    /// Device OOMs the job's observer recorded.
    pub device_ooms: Vec<crate::devices::DeviceOom>,
    /// Heap profiles the job announced, one per file still on disk.
    pub heap_dumps: Vec<crate::heapprof::DumpRecord>,
}

impl Watch {
    pub(crate) fn new() -> Self {
        Watch {
            timeline: Timeline::with_capacity(crate::timeline::DEFAULT_CAPACITY),
            hello: None,
            finished_report: None,
            ring_start_unix_ms: None,
            dropped: 0,
            dropped_told: 0,
            alloc_failures: (0, 0),
            ring_error: None,
            sources: Vec::new(),
            phases: Vec::new(),
            device_ooms: Vec::new(),
            heap_dumps: Vec::new(),
        }
    }

    /// Opens the job's ring once it exists; a ring that cannot be read is remembered as the reason.
    fn open_ring(&mut self, reader: &mut Option<RingReader>, path: &std::path::Path) {
        if reader.is_some() || !path.exists() {
            return;
        }
        match RingReader::open(path) {
            Ok(r) => {
                self.ring_start_unix_ms = Some(r.info().start_unix_ms);
                self.ring_error = None;
                *reader = Some(r);
            }
            Err(e) => self.ring_error = Some(e.to_string()),
        }
    }

    /// The latest snapshot (compaction only merges older ones).
    pub fn last(&self) -> Option<&Snapshot> {
        self.timeline.last()
    }

    /// Reads the records written since the last poll; records lost from the ring meanwhile are
    /// told to viewers as a `dropped` notice (their count of missed records includes them).
    pub(crate) fn poll(&mut self, r: &mut RingReader, out: &Outputs) {
        let records = r.poll();
        self.take(records, out);
        self.tell_drops(r, out);
    }

    fn tell_drops(&mut self, r: &RingReader, out: &Outputs) {
        let lost = r.dropped().saturating_sub(self.dropped_told);
        if lost > 0 {
            out.emit(&Record::Dropped { count: lost });
            self.dropped_told = r.dropped();
        }
    }

    /// Reads what the writer left once watching stops: every remaining record (`writer_gone`:
    /// one it died writing counts as dropped), the drop count and the failed allocations.
    fn drain(&mut self, r: &mut RingReader, writer_gone: bool, out: &Outputs) {
        let records = if writer_gone {
            r.poll_final()
        } else {
            r.poll()
        };
        self.take(records, out);
        self.tell_drops(r, out);
        self.dropped = r.dropped();
        self.alloc_failures = r.alloc_failures();
    }

    fn take(&mut self, records: Vec<Record>, out: &Outputs) {
        for r in records {
            out.emit(&r);
            match r {
                Record::Snapshot(s) => self.timeline.push(*s),
                Record::Finished { report_path } => {
                    self.finished_report = report_path.map(PathBuf::from);
                }
                h @ Record::Hello { .. } => self.hello = Some(h),
                Record::Phases { phases } => self.phases = phases,
                Record::DeviceOom(o) => self.device_ooms.push(*o),
                Record::HeapProfile(d) => {
                    // One record per file still on disk (rotated step profiles are deleted), so a
                    // long job's list stays short.
                    self.heap_dumps
                        .retain(|o| o.path != d.path && std::path::Path::new(&o.path).exists());
                    self.heap_dumps.push(d);
                }
                _ => {}
            }
        }
    }
}

/// Where the sidecar sends what it sees while the job runs: viewers' socket, Prometheus.
pub(crate) struct Outputs {
    server: Option<server::Server>,
    metrics: Option<Arc<metrics::Metrics>>,
}

impl Outputs {
    /// Binds the metrics address (an explicit request: failing is an error).
    pub(crate) fn new(
        addr: Option<std::net::SocketAddr>,
        command: &[OsString],
    ) -> Result<Self, SidecarError> {
        let metrics = match addr {
            None => None,
            Some(a) => {
                let program = command
                    .first()
                    .map(|c| c.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let m = Arc::new(metrics::Metrics::new(metrics::job_labels(&program)));
                let bound =
                    metrics::serve(a, Arc::clone(&m)).map_err(|e| SidecarError::Metrics(a, e))?;
                if !bound.ip().is_loopback() {
                    eprintln!(
                        "memsight: metrics on {bound} are readable by anyone who can reach it"
                    );
                }
                eprintln!("memsight · Prometheus metrics at http://{bound}/metrics");
                Some(m)
            }
        };
        Ok(Outputs {
            server: None,
            metrics,
        })
    }

    /// Opens the viewers' socket for `pid`; without one the sidecar still writes its report.
    pub(crate) fn listen(&mut self, pid: u32, command: &[OsString]) {
        let command = command
            .iter()
            .map(|c| c.to_string_lossy().into_owned())
            .collect();
        let started = server::socket_path(pid)
            .map_err(|(p, e)| format!("{}: {e}", p.display()))
            .and_then(|p| {
                server::Server::start(&p, pid, command).map_err(|e| format!("{}: {e}", p.display()))
            });
        match started {
            Ok(s) => self.server = Some(s),
            Err(e) => eprintln!("memsight: no live socket for viewers: {e}"),
        }
    }

    /// Sends a record to viewers and updates the metrics.
    pub(crate) fn emit(&self, r: &Record) {
        if let Some(s) = &self.server {
            s.publish(r);
        }
        if let (Some(m), Record::Snapshot(s)) = (&self.metrics, r) {
            m.update(s);
        }
    }

    /// Tells viewers how the job ended, then closes the socket.
    pub(crate) fn end(self, report: &Report) {
        if let Some(pm) = &report.post_mortem {
            self.emit(&Record::Ended {
                description: pm.description.clone(),
                post_mortem: Some(Box::new(pm.clone())),
            });
        }
    }
}

/// The environment that sets the job's heap sampling (`heap-profile` builds read it; others
/// ignore it) and says where its profiles go (`memsight-report.heap/` here for `--report -`).
fn heap_profile_env(opts: &RunOptions) -> Vec<(&'static str, OsString)> {
    let sample = match opts.heap_sample_bytes {
        Some(b) => OsString::from(b.to_string()),
        None => OsString::from("off"),
    };
    vec![
        ("MEMSIGHT_HEAP_SAMPLE", sample),
        (
            "MEMSIGHT_PROFILE_DIR",
            crate::heapprof::dir_for_report(if to_stdout(&opts.report) {
                std::path::Path::new("memsight-report.json")
            } else {
                &opts.report
            })
            .into_os_string(),
        ),
    ]
}

/// Runs `opts.command` under the sidecar and writes the report.
pub fn run(opts: &RunOptions) -> Result<RunOutcome, SidecarError> {
    let (program, args) = opts.command.split_first().ok_or(SidecarError::NoCommand)?;
    check_report_path(&opts.report)?;
    let dir = runtime_dir().map_err(|(p, e)| SidecarError::RuntimeDir(p, e))?;
    crate::wire::remove_stale_rings();
    let tag = format!("{}-{}", std::process::id(), unix_ms());
    let ring_path = dir.join(format!("ring-{tag}.bin"));
    // The job writes its own report straight to the requested path, so it is there even if the
    // sidecar is killed; the sidecar then replaces it with one that has the post-mortem. For
    // standard output it goes to the runtime directory (never removed unless delivered).
    let job_report = if to_stdout(&opts.report) {
        dir.join(format!("job-report-{tag}.json"))
    } else {
        std::path::absolute(&opts.report).map_err(|e| {
            SidecarError::Report(crate::report::ReportError::Io {
                path: opts.report.clone(),
                source: e,
            })
        })?
    };

    let mut outputs = Outputs::new(opts.metrics, &opts.command)?;
    let start_unix_ms = unix_ms();
    let mut cmd = Command::new(program);
    if let Some(log) = &opts.job_output {
        let file = crate::safe_file::Pending::new(log)
            .and_then(|p| p.commit())
            .map_err(|e| {
                SidecarError::Spawn(
                    format!("{} (log {})", program.to_string_lossy(), log.display()),
                    e,
                )
            })?;
        let err = file
            .try_clone()
            .map_err(|e| SidecarError::Spawn(program.to_string_lossy().into_owned(), e))?;
        cmd.stdout(file).stderr(err);
    }
    let mut child = cmd
        .args(args)
        .env("MEMSIGHT_RING", &ring_path)
        .env("MEMSIGHT_REPORT", &job_report)
        .env(
            "MEMSIGHT_INTERVAL_MS",
            opts.interval.as_millis().max(1).to_string(),
        )
        .envs(heap_profile_env(opts))
        .spawn()
        .map_err(|e| SidecarError::Spawn(program.to_string_lossy().into_owned(), e))?;
    let pid = child.id();
    outputs.listen(pid, &opts.command);
    if let Some(tx) = &opts.on_spawn {
        let _ = tx.send(pid);
    }
    let mut oom = oomwatch::OomWatch::new(pid);
    // Ctrl-C reaches the job through the process group; the sidecar stays to write the report.
    // SAFETY: setting a signal disposition to SIG_IGN.
    unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };

    // A thread waits for the job so its death is timed precisely; the main loop follows the ring.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let status = child.wait();
        let _ = tx.send((status, unix_ms()));
    });
    let mut watch = Watch::new();
    let mut reader: Option<RingReader> = None;
    let poll = opts.interval.min(Duration::from_millis(50));
    let (status, died_unix_ms) = loop {
        watch.open_ring(&mut reader, &ring_path);
        if let Some(r) = reader.as_mut() {
            watch.poll(r, &outputs);
        }
        oom.refresh();
        match rx.recv_timeout(poll) {
            Ok(done) => break done,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                break (
                    Err(std::io::Error::other("the wait thread ended")),
                    unix_ms(),
                )
            }
        }
    };
    // SAFETY: restoring the default disposition.
    unsafe { libc::signal(libc::SIGINT, libc::SIG_DFL) };
    watch.open_ring(&mut reader, &ring_path);
    if let Some(r) = reader.as_mut() {
        watch.drain(r, true, &outputs);
    }
    let status = status.ok();
    let oom_kills = oom.kills();
    let report = postmortem::final_report(postmortem::Ending {
        watch: &watch,
        end: postmortem::End::Child(status),
        pid,
        command: &opts.command,
        start_unix_ms: watch.ring_start_unix_ms.unwrap_or(start_unix_ms),
        died_unix_ms,
        interval: opts.interval,
        oom_kills,
        job_report: Some(&job_report),
    });
    let mut report = report;
    if report.heap_profile.is_none() {
        let dir = if to_stdout(&opts.report) {
            std::path::Path::new("")
        } else {
            opts.report.parent().unwrap_or(std::path::Path::new(""))
        };
        report.set_heap_profile(crate::heapprof::summarize(&watch.heap_dumps, dir));
    }
    outputs.end(&report);
    let report_error = deliver(&report, &opts.report).err();
    let _ = std::fs::remove_file(&ring_path);
    if report_error.is_none() && to_stdout(&opts.report) {
        let _ = std::fs::remove_file(&job_report);
    }
    Ok(RunOutcome {
        exit_code: status.map_or(1, shell_code),
        report,
        report_error,
    })
}

#[cfg(test)]
mod tests;
