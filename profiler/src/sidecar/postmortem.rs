//! The sidecar's final report: the job's own report when it finished in-process, else one rebuilt
//! from the flight recorder; either way with a post-mortem of how the job ended.

use super::Watch;
use crate::collect::SourceStatus;
use crate::diagnose::{judge, Context, Facts, Finding, Kind};
use crate::report::build::{build, steps_from_snapshots, Parts};
use crate::report::{Job, JobExit, PostMortem, PostMortemFinding, Report};
use crate::timeline::PeakAt;
use crate::units::fmt_bytes;
use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::time::Duration;

/// How watching ended.
#[derive(Clone, Copy, Debug)]
pub(crate) enum End {
    /// Our child exited (its status, if `wait` gave one).
    Child(Option<ExitStatus>),
    /// An attached process ended; only its parent learns the status.
    Ended,
    /// The sidecar was asked to stop while the process ran on.
    Detached,
}

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
}

fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGKILL => "SIGKILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGHUP => "SIGHUP",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGPIPE => "SIGPIPE",
        _ => return format!("signal {sig}"),
    };
    format!("{name} (signal {sig})")
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
fn at(s: &crate::snapshot::Snapshot) -> PeakAt {
    PeakAt::at(s.heap.live_bytes, s)
}

fn where_(p: &PeakAt) -> String {
    match &p.phase {
        Some(ph) => format!("step {} in phase {ph}", p.step),
        None => format!("step {}", p.step),
    }
}

/// The report to write: the job's own, or one rebuilt from the ring; with the post-mortem.
pub(crate) fn final_report(e: Ending) -> Report {
    let w = e.watch;
    let exit = job_exit(e.end);
    let status = match e.end {
        End::Child(s) => s,
        _ => None,
    };
    let own = w
        .finished_report
        .as_ref()
        .filter(|p| e.job_report.is_none_or(|want| p.as_path() == want))
        .and_then(|p| Report::load(p).ok());
    let mut report = own.unwrap_or_else(|| {
        let (pid, command) = match &w.hello {
            Some(crate::wire::Record::Hello { pid, command, .. }) => (*pid, command.clone()),
            _ => (
                e.pid,
                e.command.iter().map(|c| c.to_string_lossy().into_owned()).collect(),
            ),
        };
        let ring = match (&w.ring_error, w.ring_start_unix_ms) {
            (Some(err), _) => SourceStatus {
                name: "flight_recorder".into(),
                available: false,
                detail: err.clone(),
            },
            (None, Some(_)) => SourceStatus {
                name: "flight_recorder".into(),
                available: true,
                detail: "rebuilt from the job's flight recorder after it ended without its own report".into(),
            },
            (None, None) => SourceStatus {
                name: "flight_recorder".into(),
                available: false,
                detail: "the job opened no flight recorder (it does not link memsight, or never started a session)".into(),
            },
        };
        build(Parts {
            job: Job {
                pid,
                command,
                start_unix_ms: e.start_unix_ms,
                end_unix_ms: e.died_unix_ms,
                exit: exit.clone(),
            },
            interval_ms: e.interval.as_millis() as u64,
            timeline: &w.timeline,
            heap: w.last().map(|s| s.heap).unwrap_or_default(),
            phases: w.phases.clone(),
            steps: steps_from_snapshots(w.timeline.samples()),
            histogram: Vec::new(),
            sources: std::iter::once(ring).chain(w.sources.iter().cloned()).collect(),
            tensors: w.last().and_then(|s| s.tensors),
            device_ooms: w.device_ooms.clone(),
        })
    });
    report.job.exit = exit;
    report.job.end_unix_ms = e.died_unix_ms;

    let last = w.last().map(at);
    let last_age = w
        .last()
        .map(|s| e.died_unix_ms.saturating_sub(e.start_unix_ms + s.t_ms));
    let heap_peak = w
        .timeline
        .samples()
        .iter()
        .max_by_key(|s| s.heap.live_bytes)
        .map(at);
    let signal = status.and_then(|s| s.signal());
    let (failures, failed_bytes) = w.alloc_failures;
    let oom_killed = signal == Some(libc::SIGKILL) && e.oom_kills.is_some_and(|k| k > 0);
    let place = last
        .as_ref()
        .map_or(String::new(), |p| format!(" at {}", where_(p)));

    let ctx = Context {
        leak: report.leak.clone(),
        ..Context::from_env()
    };
    let mut findings = Vec::new();
    let mut finding = |kind: Kind, facts: Facts| {
        let d = judge(
            Finding {
                kind,
                facts,
                line: 0,
            },
            &ctx,
        );
        findings.push(PostMortemFinding {
            kind: kind.as_str().into(),
            verdict: serde_json::to_value(d.verdict.verdict)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            evidence: d.verdict.evidence,
            // The job already ran under memsight: "profile it" is no advice here.
            remedies: d
                .remedies
                .into_iter()
                .filter(|r| r.id != "profile")
                .map(|r| r.action)
                .collect(),
        });
    };
    let (cause, description) = if failures > 0 {
        let mut f = Facts::default();
        f.int("requested_bytes", failed_bytes);
        finding(Kind::RustAllocFailure, f);
        let how = signal.map_or_else(
            || match status.and_then(|s| s.code()) {
                Some(c) => format!("exited with code {c}"),
                None => "ended".to_string(),
            },
            |s| format!("aborted with {}", signal_name(s)),
        );
        (
            "out_of_memory",
            format!(
                "the job ran out of memory: a {} allocation failed{place}; it {how}",
                fmt_bytes(failed_bytes)
            ),
        )
    } else if let Some(o) = report.device_ooms.last().cloned() {
        let d = crate::diagnose::device_oom::finding(&o);
        finding(d.kind, d.facts);
        let how = match (signal, status.and_then(|s| s.code())) {
            (Some(s), _) => format!("it was killed by {}", signal_name(s)),
            (None, Some(c)) => format!("it exited with code {c}"),
            (None, None) => "it ended".to_string(),
        };
        let earlier = match report.device_ooms.len() {
            1 => String::new(),
            n => format!(" (the last of {n} device OOMs)"),
        };
        let when = o
            .phase
            .as_deref()
            .map_or(format!(" at step {}", o.step), |p| {
                format!(" at step {} in {p}", o.step)
            });
        (
            "out_of_memory",
            format!(
                "the job ran out of device memory: a {} request on cuda:{} failed with {} of {} free{when}{earlier}; {how}",
                fmt_bytes(o.requested_bytes),
                o.device,
                fmt_bytes(o.free_bytes),
                fmt_bytes(o.total_bytes)
            ),
        )
    } else if oom_killed {
        let mut f = Facts::default();
        f.int("pid", e.pid);
        if let Some(name) = report.job.command.first() {
            let name = Path::new(name)
                .file_name()
                .map_or(name.as_str(), |n| n.to_str().unwrap_or(name));
            f.text("process_name", name);
        }
        f.text("scope", "memcg");
        let cg = w.last().and_then(|s| s.cgroup);
        if let Some(limit) = cg.and_then(|c| c.limit) {
            f.int("memory_limit_bytes", limit);
        }
        if let Some(usage) = cg.map(|c| c.usage) {
            f.int("memory_usage_bytes", usage);
        }
        finding(Kind::LinuxOomKiller, f);
        (
            "oom_killed",
            format!("killed by the OOM killer (SIGKILL with a cgroup OOM kill){place}"),
        )
    } else if let Some(sig) = signal {
        ("signaled", format!("killed by {}{place}", signal_name(sig)))
    } else {
        match (e.end, status.and_then(|s| s.code())) {
            (End::Detached, _) => (
                "detached",
                format!("memsight detached{place}; the process runs on"),
            ),
            (End::Ended, _) => ("ended", format!("the process ended{place}")),
            (_, Some(c)) => ("exited", format!("exited with code {c}")),
            (_, None) => ("exited", "ended".to_string()),
        }
    };
    let age = last_age.map_or(String::new(), |a| {
        format!("; last sample {a} ms before the end")
    });
    report.post_mortem = Some(PostMortem {
        cause: cause.into(),
        description: format!("{description}{age}"),
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
