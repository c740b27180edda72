//! `memsight run`: starts the job with profiling switched on through the environment, follows its
//! flight recorder until it ends, and writes the report with its post-mortem.

use crate::delivery::{
    check_report_path, deliver, lock_report, shell_code, to_stdout, RunOutcome, SidecarError,
};
use crate::outputs::Outputs;
use crate::outside::Outside;
use crate::watch::Watch;
use crate::{oomwatch, postmortem};
use memsight_format::clock::unix_ms;
use memsight_format::wire::ring::RingReader;
use memsight_format::wire::runtime_dir;
use std::ffi::OsString;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::{Command, ExitStatus};
use std::sync::mpsc;
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
    /// Preload memsight into a job that does not link it (and put the Python package on its path).
    pub preload: bool,
    /// Count the preloaded job's device memory through CUPTI (every `cuMemAlloc`/`cuMemFree`-family
    /// call of any library): the CUDA driver loads the preloaded library as its injection library.
    pub cupti: bool,
}

/// The environment that sets the job's heap sampling (memsight's heap sampler reads it) and says
/// where its profiles go (`memsight-report.heap/` here for `--report -`).
fn heap_profile_env(opts: &RunOptions) -> Vec<(&'static str, OsString)> {
    let sample = match opts.heap_sample_bytes {
        Some(b) => OsString::from(b.to_string()),
        None => OsString::from("off"),
    };
    vec![
        ("MEMSIGHT_HEAP_SAMPLE", sample),
        (
            "MEMSIGHT_PROFILE_DIR",
            memsight::heapprof::dir_for_report(if to_stdout(&opts.report) {
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
    let _report_lock = lock_report(&dir, &opts.report)?;
    memsight_format::wire::remove_stale_files();
    let tag = format!("{}-{}", std::process::id(), unix_ms());
    let ring_path = dir.join(format!("ring-{tag}.bin"));
    let job_report = job_report_path(opts, &dir, &tag)?;

    let mut outputs = Outputs::new(opts.metrics, &opts.command, None)?;
    let start_unix_ms = unix_ms();
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("MEMSIGHT_RING", &ring_path)
        .env("MEMSIGHT_REPORT", &job_report)
        .env(
            "MEMSIGHT_INTERVAL_MS",
            opts.interval.as_millis().max(1).to_string(),
        )
        .envs(heap_profile_env(opts));
    let _injected = opts
        .preload
        .then(|| crate::inject::prepare(&mut cmd, &dir, &tag, opts.cupti));
    if let Some(log) = &opts.job_output {
        send_output_to(&mut cmd, program, log)?;
    } else if to_stdout(&opts.report) {
        // Standard output carries the report alone: the job's output goes to standard error.
        let err = std::io::stderr()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| SidecarError::Spawn(program.to_string_lossy().into_owned(), e))?;
        cmd.stdout(std::process::Stdio::from(err));
    }
    // Before the job starts: a SIGTERM at its first instant must not end the sidecar (a caught
    // signal's handler does not pass through exec, so the job starts with the default action).
    let mut stops = crate::stop_signals::StopSignals::install();
    let child = cmd
        .spawn()
        .map_err(|e| SidecarError::Spawn(program.to_string_lossy().into_owned(), e))?;
    let pid = child.id();
    outputs.listen(pid, &opts.command);
    if let Some(tx) = &opts.on_spawn {
        let _ = tx.send(pid);
    }
    let mut oom = oomwatch::OomWatch::new(pid);
    let mut watch = Watch::new();
    watch.add_trees_of(pid);
    let (status, died_unix_ms) = follow(
        child, opts, &ring_path, &mut watch, &outputs, &mut oom, &mut stops,
    );
    drop(stops);
    let mut report = postmortem::final_report(postmortem::Ending {
        watch: &watch,
        end: postmortem::End::Child(status),
        pid,
        command: &opts.command,
        start_unix_ms: watch.ring_start_unix_ms.unwrap_or(start_unix_ms),
        died_unix_ms,
        interval: opts.interval,
        oom_kills: oom.kills(),
        job_report: Some(&job_report),
    });
    if report.heap_profile.is_none() {
        let dir = if to_stdout(&opts.report) {
            std::path::Path::new("")
        } else {
            opts.report.parent().unwrap_or(std::path::Path::new(""))
        };
        report.set_heap_profile(memsight_analysis::heapprof::summarize(
            &watch.heap_dumps,
            dir,
        ));
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

/// Where the job writes its own report: straight to the requested path, so it is there even if
/// the sidecar is killed (the sidecar then replaces it with one that has the post-mortem); for
/// standard output, the runtime directory (never removed unless delivered).
fn job_report_path(
    opts: &RunOptions,
    dir: &std::path::Path,
    tag: &str,
) -> Result<PathBuf, SidecarError> {
    if to_stdout(&opts.report) {
        return Ok(dir.join(format!("job-report-{tag}.json")));
    }
    std::path::absolute(&opts.report).map_err(|e| {
        SidecarError::Report(memsight_format::report::ReportError::Io {
            path: opts.report.clone(),
            source: e,
        })
    })
}

/// Sends the job's stdout and stderr to `log` (`--live`), created as a new file.
fn send_output_to(
    cmd: &mut Command,
    program: &std::ffi::OsStr,
    log: &std::path::Path,
) -> Result<(), SidecarError> {
    let file = memsight_format::safe_file::Pending::new(log)
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
    Ok(())
}

/// Follows the job's ring until it ends, then drains it: its exit status (when `wait` gave one)
/// and when it died. Until the job opens its ring it is sampled from outside, as `attach` does; a
/// job that never opens one (it does not link memsight) keeps those samples as its timeline, and
/// one that does drops them for its own. Ctrl-C reaches the job through the process group; the sidecar ignores it
/// meanwhile, to write the report, and outlives SIGTERM and SIGHUP ([`crate::stop_signals`]).
fn follow(
    mut child: std::process::Child,
    opts: &RunOptions,
    ring_path: &std::path::Path,
    watch: &mut Watch,
    outputs: &Outputs,
    oom: &mut oomwatch::OomWatch,
    stops: &mut crate::stop_signals::StopSignals,
) -> (Option<ExitStatus>, u64) {
    // SAFETY: setting a signal disposition to SIG_IGN.
    unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
    stops.follow(child.id());
    // A thread waits for the job so its death is timed precisely; this loop follows the ring.
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    let mut outside = Some(Outside::open(child.id(), opts.interval));
    std::thread::spawn(move || {
        let status = child.wait();
        let _ = tx.send((status, unix_ms()));
    });
    let mut reader: Option<RingReader> = None;
    let poll = opts.interval.min(Duration::from_millis(50));
    let outside_from = std::time::Instant::now() + OUTSIDE_GRACE;
    // The ring's writer left while the job lives (it exec'd a program without the session): the
    // ring is not reopened and the job is sampled from outside again.
    let mut ring_done = false;
    let (status, died_unix_ms) = loop {
        if !ring_done {
            watch.open_ring(&mut reader, ring_path);
        }
        if let Some(r) = reader.as_mut() {
            leave_outside(&mut outside, watch);
            watch.poll(r, outputs);
            if !watch.finished && r.writer_gone(ring_path) && still_runs(pid) {
                watch.drain(r, true, outputs);
                reader = None;
                ring_done = true;
                let elapsed = watch
                    .ring_start_unix_ms
                    .map_or(0, |s| unix_ms().saturating_sub(s));
                let step = watch.last().map_or(0, |s| s.step);
                outside = Some(Outside::open(pid, opts.interval).after_ring(elapsed, step));
                eprintln!(
                    "memsight · job {pid} left its flight recorder and runs on (it exec'd a \
                     program without memsight?): sampled from outside from now on"
                );
            }
        } else if let Some(o) = outside.as_mut() {
            // Sampled from its first instant, told to viewers once the ring had its chance.
            if std::time::Instant::now() < outside_from {
                watch.quiet = true;
            } else {
                watch.speak(outputs);
            }
            o.tick(watch, outputs);
        }
        oom.refresh();
        stops.poll();
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
    if !ring_done {
        watch.open_ring(&mut reader, ring_path);
    }
    if let Some(r) = reader.as_mut() {
        leave_outside(&mut outside, watch);
        watch.drain(r, true, outputs);
    } else if let Some(o) = outside.as_ref().filter(|_| !ring_done) {
        watch.sources = o.sources();
    }
    (status.ok(), died_unix_ms)
}

/// How long a job has to open its flight recorder before its outside samples reach viewers. It is
/// sampled from outside from its first instant (a short job without a ring still has its
/// samples), but those a ring then replaces are never shown: a viewer shows what the report keeps.
const OUTSIDE_GRACE: Duration = Duration::from_millis(500);

/// The job's ring is open: stops sampling it from outside and drops what was sampled so.
fn leave_outside(outside: &mut Option<Outside>, watch: &mut Watch) {
    if outside.take().is_some() {
        watch.forget_samples();
    }
    // What the ring says is told to viewers (the outside samples kept quiet were never shown).
    watch.quiet = false;
}

/// Whether process `pid` still runs (exists and is not a zombie): a writer that left because the
/// job ended is the end, not a hand-over to outside sampling.
fn still_runs(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().to_string())
        })
        .is_some_and(|rest| !rest.starts_with('Z') && !rest.starts_with('X'))
}
