//! `memsight attach PID`: a sidecar for a process it did not start. A process with a memsight
//! session is followed through its flight recorder (`ring-<pid>.bin`); any other process — a
//! Python PyTorch job, say — is sampled from outside: /proc status, the memory cgroup, and the
//! process tree (data-loader workers and other children, each with its RSS).

use crate::delivery::{RunOutcome, SidecarError};
use crate::outside::Outside;
use crate::postmortem::{self, End, Ending};
use crate::watch::Watch;
use memsight::collect::command_line;
use memsight_format::clock::unix_ms;
use memsight_format::wire::ring::RingReader;
use memsight_format::wire::{default_ring_path, ring_of};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What to attach to.
#[derive(Clone, Debug)]
pub struct AttachOptions {
    /// The process.
    pub pid: u32,
    /// Where the report goes.
    pub report: PathBuf,
    /// Sampling interval (uninstrumented mode).
    pub interval: Duration,
    /// Serve Prometheus metrics at this address.
    pub metrics: Option<std::net::SocketAddr>,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// The fields of `/proc/PID/stat` after the command name, the state first; `None` once the
/// process is gone.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    Some(after.split_whitespace().map(str::to_owned).collect())
}

/// The process's start time in clock ticks after boot (field 22 of `stat`, the 20th after the
/// name) from its fields: a pid reused by a new process has another one. `None` for a zombie (it
/// has ended; only its parent has not collected it yet).
fn start_ticks_of(fields: &[String]) -> Option<u64> {
    if fields.first()? == "Z" {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// The start time of process `pid` ([`start_ticks_of`]); `None` once it is gone or a zombie.
fn start_ticks(pid: u32) -> Option<u64> {
    start_ticks_of(&stat_fields(pid)?)
}

/// Whether process `pid` can be watched: it exists, has not exited (a zombie) and is not a kernel
/// thread (`PF_KTHREAD` in its flags); the error says which. Gives its start time in clock ticks
/// ([`start_ticks`]), which tells it from a later process that reuses its pid.
pub fn attachable(pid: u32) -> Result<u64, SidecarError> {
    const PF_KTHREAD: u64 = 0x0020_0000;
    let fields = stat_fields(pid).ok_or(SidecarError::NoProcess(pid))?;
    if fields.first().is_some_and(|s| s == "Z") {
        return Err(SidecarError::Zombie(pid));
    }
    // After the state: ppid, pgrp, session, tty, tpgid, then the flags.
    let flags: u64 = fields.get(6).and_then(|f| f.parse().ok()).unwrap_or(0);
    if pid != 0 && flags & PF_KTHREAD != 0 {
        return Err(SidecarError::KernelThread(pid));
    }
    start_ticks_of(&fields).ok_or(SidecarError::NoProcess(pid))
}

/// The process's start as Unix milliseconds.
fn start_unix_ms(ticks: u64) -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let btime: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(btime * 1000 + ticks * 1000 / hz)
}

/// Watches process `opts.pid` until it ends or this process gets SIGINT/SIGTERM, then writes the
/// report.
pub fn attach(opts: &AttachOptions) -> Result<RunOutcome, SidecarError> {
    let pid = opts.pid;
    crate::delivery::check_report_path(&opts.report)?;
    let ticks = attachable(pid)?;
    let proc_start = start_unix_ms(ticks);
    let mut command = command_line(pid);
    let mut oom = crate::oomwatch::OomWatch::new(pid);
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        libc::signal(
            libc::SIGINT,
            on_stop_signal as *const () as libc::sighandler_t,
        );
        libc::signal(
            libc::SIGTERM,
            on_stop_signal as *const () as libc::sighandler_t,
        );
    }
    let mut watch = Watch::new();
    watch.add_trees_of(pid);
    // A ring of this very process: the one its environment names (a process of a `memsight run`
    // job writes `<job prefix>-p<pid>-….bin`, `MEMSIGHT_RING` names another), else the default
    // path; same pid, written after it started (not a stale file).
    let mut reader = ring_of(pid)
        .ok()
        .or_else(|| default_ring_path(pid).ok())
        .and_then(|p| RingReader::open(&p).ok())
        .filter(|r| {
            r.info().pid == pid && proc_start.is_none_or(|s| r.info().start_unix_ms + 1000 >= s)
        });
    let mut outside = reader.is_none().then(|| Outside::open(pid, opts.interval));
    if let Some(r) = &reader {
        watch.ring_start_unix_ms = Some(r.info().start_unix_ms);
    }
    let mut outputs = crate::outputs::Outputs::new(opts.metrics, &command, Some(pid))?;
    outputs.listen(pid, &command);
    let attach_unix_ms = unix_ms();
    let mut next = Instant::now();
    let end = loop {
        if STOP.load(Ordering::SeqCst) {
            break End::Detached;
        }
        if start_ticks(pid) != Some(ticks) {
            break End::Ended;
        }
        if Instant::now() >= next {
            next += opts.interval;
            oom.refresh();
            if let Some(r) = reader.as_mut() {
                watch.poll(r, &outputs);
            } else if let Some(o) = outside.as_mut() {
                o.tick(&mut watch, &outputs);
                command.clone_from(&o.command);
            }
        }
        std::thread::sleep(opts.interval.min(Duration::from_millis(20)));
    };
    let died_unix_ms = unix_ms();
    // SAFETY: restoring default dispositions.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::signal(libc::SIGTERM, libc::SIG_DFL);
    }
    if let Some(r) = reader.as_mut() {
        watch.drain(r, matches!(end, End::Ended), &outputs);
    }
    if let Some(o) = &outside {
        watch.sources = o.sources();
    }
    let oom_kills = oom.kills();
    let report = postmortem::final_report(Ending {
        watch: &watch,
        end,
        pid,
        command: &command,
        start_unix_ms: watch.ring_start_unix_ms.unwrap_or(attach_unix_ms),
        died_unix_ms,
        interval: opts.interval,
        oom_kills,
        job_report: None,
        workers: None,
    });
    outputs.end(&report);
    let report_error = crate::delivery::deliver(&report, &opts.report).err();
    Ok(RunOutcome {
        exit_code: 0,
        report,
        report_path: opts.report.clone(),
        report_error,
        rank_errors: Vec::new(),
    })
}
