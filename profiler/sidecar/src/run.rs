//! `memsight run`: starts the job with profiling switched on through the environment, follows the
//! flight recorders of its processes until it ends, and writes the job's report with its
//! post-mortem, and one report per rank.

use crate::delivery::{
    check_report_path, deliver, lock_report, shell_code, to_stdout, RunOutcome, SidecarError,
};
use crate::job::{still_runs, JobRings};
use crate::outputs::Outputs;
use crate::outside::Outside;
use crate::watch::Watch;
use crate::{oomwatch, postmortem};
use memsight_format::clock::unix_ms;
use memsight_format::wire::runtime_dir;
use std::ffi::OsString;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
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
    /// The job's heap sampling (`MEMSIGHT_HEAP_SAMPLE`).
    pub heap_sampling: HeapSampling,
    /// Told the job's pid once it runs (a viewer in the same process connects then).
    pub on_spawn: Option<mpsc::Sender<u32>>,
    /// Preload memsight into a job that does not link it (and put the Python package on its path).
    pub preload: bool,
    /// Count the preloaded job's device memory through CUPTI (every `cuMemAlloc`/`cuMemFree`-family
    /// call of any library): the CUDA driver loads the preloaded library as its injection library.
    pub cupti: bool,
    /// Mark a PyTorch job's steps and phases from PyTorch's global hooks (memsight/_auto.py).
    pub auto_steps: bool,
    /// Turn on PyTorch's allocator history with Python stacks in a job that imports torch, and
    /// report the device memory by Python line at each device's peak and at an OOM
    /// (memsight/torch.py; `MEMSIGHT_DEVICE_HISTORY`).
    pub device_history: bool,
}

/// How `run` sets the job's heap sampling, which memsight's heap sampler reads from
/// `MEMSIGHT_HEAP_SAMPLE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeapSampling {
    /// One sample per this many bytes allocated on average (`--heap-sample`).
    Every(u64),
    /// Off (`--no-heap-profile`); `memsight heap sampling on PID` starts it.
    Off,
    /// Whatever `MEMSIGHT_HEAP_SAMPLE` the environment `run` starts from says (the job's session
    /// reads it, and says once on stderr when it cannot use it): no flag was given.
    Inherited,
}

/// The environment that sets the job's heap sampling (memsight's heap sampler reads it) and says
/// where its profiles go (beside the job's report `job_report`; `memsight-report.heap/` here for
/// `--report -`).
fn heap_profile_env(opts: &RunOptions, job_report: &Path) -> Vec<(&'static str, OsString)> {
    let sample = match opts.heap_sampling {
        HeapSampling::Every(b) => Some(OsString::from(b.to_string())),
        HeapSampling::Off => Some(OsString::from("off")),
        HeapSampling::Inherited => None,
    };
    let mut env: Vec<(&'static str, OsString)> = sample
        .map(|s| ("MEMSIGHT_HEAP_SAMPLE", s))
        .into_iter()
        .collect();
    env.push((
        "MEMSIGHT_PROFILE_DIR",
        // The job's report's (`r-job.heap/` for `--report 'r-{rank}.json'`).
        memsight::heapprof::dir_for_report(&if to_stdout(&opts.report) {
            PathBuf::from("memsight-report.json")
        } else {
            job_report.to_path_buf()
        })
        .into_os_string(),
    ));
    env
}

/// Runs `opts.command` under the sidecar and writes the report.
pub fn run(opts: &RunOptions) -> Result<RunOutcome, SidecarError> {
    let (program, args) = opts.command.split_first().ok_or(SidecarError::NoCommand)?;
    // A run started as one rank or node of a larger job by its launcher has a report of its own.
    let report_path = crate::ranks::job_report_for(&opts.report, crate::ranks::launched_as());
    check_report_path(&report_path)?;
    let dir = runtime_dir().map_err(|(p, e)| SidecarError::RuntimeDir(p, e))?;
    let _report_lock = lock_report(&dir, &report_path)?;
    memsight_format::wire::remove_stale_files();
    let tag = format!("{}-{}", std::process::id(), unix_ms());
    let ring_prefix = dir.join(format!("ring-{tag}"));
    let job_report = job_report_path(&report_path, &dir, &tag)?;

    let mut outputs = Outputs::new(opts.metrics, &opts.command, None)?;
    let start_unix_ms = unix_ms();
    let mut cmd = Command::new(program);
    cmd.args(args)
        // Every process of the job that carries memsight writes its own ring under this prefix.
        .env("MEMSIGHT_JOB", &ring_prefix)
        .env("MEMSIGHT_SIDECAR_PID", std::process::id().to_string())
        .env("MEMSIGHT_REPORT", &job_report)
        .env(
            "MEMSIGHT_INTERVAL_MS",
            opts.interval.as_millis().max(1).to_string(),
        )
        .envs(heap_profile_env(opts, &report_path))
        .env(
            "MEMSIGHT_AUTO_STEPS",
            if opts.auto_steps { "1" } else { "0" },
        )
        .env(
            "MEMSIGHT_DEVICE_HISTORY",
            if opts.device_history { "1" } else { "0" },
        );
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
    let mut kernel = crate::kmsg::KernelLog::open();
    let child = cmd
        .spawn()
        .map_err(|e| SidecarError::Spawn(program.to_string_lossy().into_owned(), e))?;
    let pid = child.id();
    outputs.listen(pid, &opts.command);
    if let Some(tx) = &opts.on_spawn {
        let _ = tx.send(pid);
    }
    let mut oom = oomwatch::OomWatch::new(pid);
    let mut job = JobRings::new(&ring_prefix, pid);
    let mut outside_watch = Watch::new();
    outside_watch.add_trees_of(pid);
    let mut watching = Watching {
        job: &mut job,
        outside_watch: &mut outside_watch,
        outputs: &outputs,
        oom: &mut oom,
        stops: &mut stops,
        kernel: &mut kernel,
    };
    let (status, died_unix_ms) = follow(child, opts, &mut watching);
    let left_running =
        crate::left_running::describe(&crate::left_running::after_grace(&ring_prefix));
    if let Some(said) = &left_running {
        eprintln!("memsight: {said}");
    }
    drop(stops);
    kernel.poll();
    let oom_kills = oom.kills();
    let principal = job.principal();
    let watch = principal.map_or(&outside_watch, |m| &m.watch);
    let mut report = postmortem::final_report(postmortem::Ending {
        watch,
        end: postmortem::End::Child(status),
        pid,
        command: &opts.command,
        start_unix_ms: watch.ring_start_unix_ms.unwrap_or(start_unix_ms),
        died_unix_ms,
        interval: opts.interval,
        oom_kills,
        job_report: principal
            .filter(|m| m.pid != pid)
            .map_or(Some(job_report.as_path()), |_| None),
        workers: None,
    });
    crate::delivery::add_heap_profile(
        &mut report,
        &watch.heap_dumps,
        (!to_stdout(&opts.report)).then_some(report_path.as_path()),
    );
    let ranks = crate::ranks::Assembly {
        job: &job,
        kernel: &kernel,
        oom_kills,
        interval: opts.interval,
        report: &opts.report,
        root: (pid, status),
        stopped: crate::stop_signals::stopped(),
    };
    let rank_errors = ranks.write_rank_reports(&mut report);
    ranks.describe_job(&mut report);
    if let Some(detail) = left_running {
        report.sources.push(memsight::collect::SourceStatus {
            name: "processes left running".into(),
            available: false,
            detail,
        });
    }
    job.remove_member_reports();
    outputs.end(&report);
    let report_error = deliver(&report, &report_path).err();
    if report_error.is_none() && to_stdout(&opts.report) {
        let _ = std::fs::remove_file(&job_report);
    }
    Ok(RunOutcome {
        exit_code: status.map_or(1, shell_code),
        report,
        report_path,
        report_error,
        rank_errors,
    })
}

/// Where the job writes its own report: straight to the requested path, so it is there even if
/// the sidecar is killed (the sidecar then replaces it with one that has the post-mortem); for
/// standard output, the runtime directory (never removed unless delivered).
fn job_report_path(
    report: &std::path::Path,
    dir: &std::path::Path,
    tag: &str,
) -> Result<PathBuf, SidecarError> {
    if to_stdout(report) {
        return Ok(dir.join(format!("job-report-{tag}.json")));
    }
    std::path::absolute(report).map_err(|e| {
        SidecarError::Report(memsight_format::report::ReportError::Io {
            path: report.to_path_buf(),
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

/// What `follow` watches with.
struct Watching<'a> {
    job: &'a mut JobRings,
    /// The job's samples taken from outside before any of its processes opened a ring.
    outside_watch: &'a mut Watch,
    outputs: &'a Outputs,
    oom: &'a mut oomwatch::OomWatch,
    stops: &'a mut crate::stop_signals::StopSignals,
    kernel: &'a mut crate::kmsg::KernelLog,
}

/// Follows the job's rings until its first process ends, then drains them: its exit status (when
/// `wait` gave one) and when it died. Until a process of the job opens a ring the job is sampled
/// from outside, as `attach` does; a job that never opens one (it does not carry memsight) keeps
/// those samples as its timeline, and one that does drops them for its own. Ctrl-C reaches the job
/// through the process group; the sidecar notes it meanwhile (never ends of it), to write the report, and outlives
/// SIGTERM and SIGHUP ([`crate::stop_signals`]).
fn follow(
    mut child: std::process::Child,
    opts: &RunOptions,
    w: &mut Watching,
) -> (Option<ExitStatus>, u64) {
    w.stops.follow(child.id());
    // A thread waits for the job so its death is timed precisely; this loop follows the rings.
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    let mut outside = Some(Outside::open(child.id(), opts.interval));
    std::thread::spawn(move || {
        let status = child.wait();
        let _ = tx.send((status, unix_ms()));
    });
    let poll = opts.interval.min(Duration::from_millis(50));
    let outside_from = std::time::Instant::now() + OUTSIDE_GRACE;
    // Since when no ring of the job is written while its first process runs on (it exec'd a
    // program without memsight): past [`RING_GAP`], it is sampled from outside again.
    let mut no_ring_since: Option<std::time::Instant> = None;
    let mut fell_back = false;
    // The job's first process exec'd a program that opened no ring (yet): sampled from outside
    // from that instant, kept if no ring takes over before the job ends or falls back.
    let mut gap: Option<ExecGap> = None;
    let mut ranks_checked = std::collections::HashSet::new();
    let (status, died_unix_ms) = loop {
        w.job.discover();
        w.job.poll(w.outputs);
        check_rank_reports(w.job, &opts.report, &mut ranks_checked);
        let live = w.job.any_live();
        if let Some(i) = w.job.principal {
            if live && !fell_back {
                leave_outside(&mut outside, w.outside_watch);
            }
            no_ring_since = if live {
                gap = None;
                None
            } else {
                no_ring_since.or_else(|| Some(std::time::Instant::now()))
            };
            if !live && !fell_back && gap.is_none() && w.job.root_exec_d() && still_runs(pid) {
                gap = Some(ExecGap::open(pid, i, &w.job.members[i], opts.interval));
            }
            if let Some(g) = gap.as_mut() {
                g.tick();
            }
            let long_gap = no_ring_since.is_some_and(|t| t.elapsed() >= RING_GAP);
            if long_gap && !fell_back && still_runs(pid) {
                fell_back = true;
                let g = gap
                    .take()
                    .unwrap_or_else(|| ExecGap::open(pid, i, &w.job.members[i], opts.interval));
                outside = Some(g.keep(&mut w.job.members, w.outputs));
                eprintln!(
                    "memsight · job {pid} left its flight recorder and runs on (it exec'd a \
                     program without memsight?): sampled from outside from now on"
                );
            }
            if fell_back {
                if let Some(o) = outside.as_mut() {
                    o.tick(&mut w.job.members[i].watch, w.outputs);
                }
            }
        } else if let Some(o) = outside.as_mut() {
            // Sampled from its first instant, told to viewers once the rings had their chance.
            if std::time::Instant::now() < outside_from {
                w.outside_watch.quiet = true;
            } else {
                w.outside_watch.speak(w.outputs);
            }
            o.tick(w.outside_watch, w.outputs);
        }
        w.oom.refresh();
        w.kernel.poll();
        w.stops.poll();
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
    w.job.finish(w.outputs);
    // A program the job exec'd that ended before the gap fell back, and that no ring took over
    // from: its outside samples are the job's last.
    if let Some(g) = gap {
        if !w.job.members.iter().any(|m| {
            m.watch
                .ring_start_unix_ms
                .is_some_and(|s| s >= g.since_unix_ms)
        }) {
            g.keep(&mut w.job.members, w.outputs);
        }
    }
    if w.job.principal.is_none() {
        if let Some(o) = outside.as_ref() {
            w.outside_watch.sources = o.sources();
        }
    }
    (status.ok(), died_unix_ms)
}

/// Checks the report path of each rank as it appears (ranks are known only once they run): a
/// path that cannot be written (a link, a FIFO, another user's file planted where a rank's
/// report goes) is said at once, while the job runs, not only after it ended.
fn check_rank_reports(
    job: &JobRings,
    report: &std::path::Path,
    checked: &mut std::collections::HashSet<u32>,
) {
    if to_stdout(report) {
        return;
    }
    for m in &job.members {
        let Some(memsight_format::process::Role::Rank { rank }) = m.role else {
            continue;
        };
        if !checked.insert(rank) {
            continue;
        }
        let path = crate::ranks::report_for(report, Some(rank));
        if let Err(e) = check_report_path(&path) {
            eprintln!(
                "memsight · rank {rank}'s report cannot be written ({}); the job runs on and \
                 the rank stays in the job's report",
                memsight_format::text::line(&e.to_string())
            );
        }
    }
}

/// Outside samples of the job's first process after it exec'd a program, taken from that instant
/// and held back until it is known that no ring of the new program takes over (a program that
/// carries memsight opens one once it has run 100 ms; one started without `LD_PRELOAD`, by
/// `env -i` or a launcher that clears the environment, never does).
struct ExecGap {
    outside: Outside,
    /// The member whose timeline the samples continue (the principal when the gap began).
    member: usize,
    since_unix_ms: u64,
    samples: Vec<memsight_format::snapshot::Snapshot>,
}

impl ExecGap {
    /// Starts sampling process `pid` on member `m`'s time axis, at its last step.
    fn open(pid: u32, member: usize, m: &crate::job::Member, interval: Duration) -> Self {
        let since_unix_ms = unix_ms();
        let elapsed = m
            .watch
            .ring_start_unix_ms
            .map_or(0, |s| since_unix_ms.saturating_sub(s));
        let step = m.watch.last().map_or(0, |s| s.step);
        ExecGap {
            outside: Outside::open(pid, interval).after_ring(elapsed, step),
            member,
            since_unix_ms,
            samples: Vec::new(),
        }
    }

    fn tick(&mut self) {
        if let Some(s) = self.outside.due() {
            self.samples.push(s);
        }
    }

    /// Puts the samples held back into the member's timeline (and to viewers, if they follow
    /// it); the sampler goes on from there.
    fn keep(self, members: &mut [crate::job::Member], out: &Outputs) -> Outside {
        if let Some(m) = members.get_mut(self.member) {
            let records = self
                .samples
                .into_iter()
                .map(|s| memsight_format::wire::Record::Snapshot(Box::new(s)))
                .collect();
            m.watch.take(records, out);
        }
        self.outside
    }
}

/// How long the job may go without a ring being written, while its first process runs, before it
/// is sampled from outside again: longer than a process waits to start its session.
const RING_GAP: Duration = Duration::from_secs(1);

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
