//! The sidecar's final report: the job's own report when it finished in-process, else one rebuilt
//! from the flight recorder; either way with a post-mortem of how the job ended.

pub(crate) use crate::cause::End;
use crate::cause::{self, signal_name};
use crate::watch::Watch;
use memsight::collect::SourceStatus;
use memsight_format::report::build::{build, steps_from_snapshots, Parts};
use memsight_format::report::{Job, JobExit, PostMortem, Report};
use memsight_format::timeline::PeakAt;
use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::Duration;

/// Everything known when the job ended.
pub(crate) struct Ending<'a> {
    pub watch: &'a Watch,
    pub end: End,
    pub pid: u32,
    pub command: &'a [OsString],
    pub start_unix_ms: u64,
    pub died_unix_ms: u64,
    pub interval: Duration,
    pub oom_kills: Option<u64>,
    /// The report path the sidecar asked the job to use (`run`); `None` accepts the job's own.
    pub job_report: Option<&'a Path>,
    /// The workers the job's process tree gives this process, when it is one process of a job
    /// (a rank's own report has no tree to count them in); `None`: its report tells.
    pub workers: Option<usize>,
}

fn job_exit(end: End) -> JobExit {
    let status =
        match end {
            End::Child(s) => s,
            End::Ended => return JobExit {
                kind: "ended".into(),
                code: None,
                signal: None,
                description:
                    "the process ended (its exit status goes to its parent, not to memsight attach)"
                        .into(),
            },
            End::Killed => {
                return JobExit {
                    kind: "signaled".into(),
                    code: None,
                    signal: None,
                    description: "ended without exiting: killed by a signal".into(),
                }
            }
            End::Detached => {
                return JobExit {
                    kind: "running".into(),
                    code: None,
                    signal: None,
                    description: "memsight detached while the process was still running".into(),
                }
            }
        };
    match status {
        Some(s) if s.signal().is_some() => {
            let sig = s.signal().unwrap_or(0);
            JobExit {
                kind: "signaled".into(),
                code: None,
                signal: Some(sig),
                description: format!("killed by {}", signal_name(sig)),
            }
        }
        Some(s) => {
            let code = s.code().unwrap_or(1);
            JobExit {
                kind: "exited".into(),
                code: Some(code),
                signal: None,
                description: format!("exited with code {code}"),
            }
        }
        None => JobExit {
            kind: "unknown".into(),
            code: None,
            signal: None,
            description: "the sidecar could not learn how the job ended".into(),
        },
    }
}

/// A sample's live heap, and when.
fn at(s: &memsight_format::snapshot::Snapshot) -> PeakAt {
    PeakAt::at(s.heap.live_bytes, s)
}

/// The report to write: the job's own, or one rebuilt from the ring; with the post-mortem.
pub(crate) fn final_report(e: Ending) -> Report {
    let w = e.watch;
    let status = match e.end {
        End::Child(s) => s,
        _ => None,
    };
    let mut report = own_report(&e).unwrap_or_else(|| rebuilt_report(&e));
    report.job.exit = job_exit(e.end);
    report.job.end_unix_ms = e.died_unix_ms;

    let last = w.last().map(at);
    let last_age = w
        .last()
        .map(|s| e.died_unix_ms.saturating_sub(e.start_unix_ms + s.t_ms));
    // Where the sampled heap first came within reach of its highest value: the rule the report's
    // headline and phase table follow, so all three name the same step.
    let samples = w.timeline.samples();
    let heap_peak = samples
        .iter()
        .map(|s| s.heap.live_bytes)
        .max()
        .and_then(|top| {
            let near = memsight_format::report::build::reached(top);
            samples.iter().find(|s| s.heap.live_bytes >= near).map(at)
        });
    let signal = status.and_then(|s| s.signal());
    let ending = cause::Seen {
        end: e.end,
        status,
        signal,
        pid: e.pid,
        oom_kills: e.oom_kills,
        workers: e.workers,
        place: last
            .as_ref()
            .map_or(String::new(), |p| format!(" at {}", where_(p))),
    };
    let (cause, description, findings) = ending.judge(&report, w);
    let age = last_age.map_or(String::new(), |a| {
        format!("; last sample {a} ms before the end")
    });
    report.post_mortem = Some(PostMortem {
        cause: cause.into(),
        description: format!("{description}{age}"),
        job_end: None,
        exit_code: status.and_then(|s| s.code()),
        signal,
        last_sample_age_ms: last_age,
        last_sample: last,
        heap_peak,
        cgroup_oom_kills: e.oom_kills,
        records_dropped: w.dropped,
        findings,
    });
    report
}

fn where_(p: &PeakAt) -> String {
    cause::step_and_phase(p.step, p.phase.as_deref())
}

/// The report the job wrote itself when it finished in-process (at the path asked for, if any).
fn own_report(e: &Ending) -> Option<Report> {
    e.watch
        .finished_report
        .as_ref()
        .filter(|p| e.job_report.is_none_or(|want| p.as_path() == want))
        .and_then(|p| Report::load(p).ok())
        .map(|mut r| {
            r.add_trees(&e.watch.timeline);
            r
        })
}

/// A report rebuilt from what the flight recorder delivered (a job that died, or one without a
/// session of its own).
fn rebuilt_report(e: &Ending) -> Report {
    let w = e.watch;
    let (pid, command) = match &w.hello {
        Some(memsight_format::wire::Record::Hello { pid, command, .. }) => (*pid, command.clone()),
        _ => (
            e.pid,
            e.command
                .iter()
                .map(|c| c.to_string_lossy().into_owned())
                .collect(),
        ),
    };
    let mut report = build(Parts {
        job: Job {
            pid,
            command,
            start_unix_ms: e.start_unix_ms,
            end_unix_ms: e.died_unix_ms,
            exit: job_exit(e.end),
        },
        interval_ms: e.interval.as_millis() as u64,
        timeline: &w.timeline,
        heap: w.last().map(|s| s.heap).unwrap_or_default(),
        phases: w.phases.clone(),
        steps: steps_from_snapshots(w.timeline.samples()),
        histogram: w.histogram.clone(),
        sources: std::iter::once(ring_status(w))
            .chain(w.sources.iter().cloned())
            .collect(),
        tensors: w.last().and_then(|s| s.tensors),
        device_ooms: w.device_ooms.clone(),
    });
    report.device_lines = w.device_lines.clone();
    report
}

/// What the flight recorder gave: a rebuilt report, an error, or nothing (no session in the job).
fn ring_status(w: &Watch) -> SourceStatus {
    let (available, detail) = match (&w.ring_error, w.ring_start_unix_ms) {
        (Some(err), _) => (false, err.clone()),
        (None, Some(_)) => (
            true,
            "rebuilt from the job's flight recorder after it ended without its own report".into(),
        ),
        (None, None) => (
            false,
            "the job opened no flight recorder (it does not link memsight, or never started a session)"
                .into(),
        ),
    };
    SourceStatus {
        name: "flight_recorder".into(),
        available,
        detail,
    }
}
