//! How a job ended, judged: the post-mortem's cause, its one-line description, and the findings of
//! the diagnosis engine for it (a Rust allocation failure, a device OOM, the OOM killer, a signal,
//! a plain exit).

use crate::watch::Watch;
use memsight_analysis::diagnose::{host_failure_kind, judge, Context, Facts, Finding, Kind};
use memsight_format::job_context::JobContext;
use memsight_format::report::{PostMortemFinding, Report};
use memsight_format::units::fmt_bytes;
use std::path::Path;
use std::process::ExitStatus;

/// What the diagnosis engine is told of a failed allocation of `bytes`: its size, and the
/// address-space limit it met (with the process's virtual size then) when the process had one.
fn failure_facts(bytes: u64, w: &Watch) -> Facts {
    let mut f = Facts::default();
    f.int("requested_bytes", bytes);
    if let Some(space) = w.failed_space {
        f.int("address_space_limit_bytes", space.limit_bytes);
        if let Some(v) = space.virtual_bytes {
            f.int("virtual_bytes", v);
        }
    }
    f
}

/// The address-space limit that refused a failed allocation of `bytes`: the process had one, and
/// its virtual size (when read) left no room for the request under it.
fn refused_by_limit(
    bytes: u64,
    w: &Watch,
) -> Option<memsight_format::wire::ring::FailedAddressSpace> {
    w.failed_space.filter(|s| s.refuses(bytes))
}

/// How watching ended.
#[derive(Clone, Copy, Debug)]
pub(crate) enum End {
    /// Our child exited (its status, if `wait` gave one).
    Child(Option<ExitStatus>),
    /// An attached process ended; only its parent learns the status.
    Ended,
    /// The sidecar was asked to stop while the process ran on.
    Detached,
    /// A process of the job ended without exiting: a signal ended it (its parent learned which).
    Killed,
}

/// A signal's name and number, as the post-mortem says them.
pub(crate) fn signal_name(sig: i32) -> String {
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

/// `step N in phase P`, or `step N` outside any phase.
pub(crate) fn step_and_phase(step: u64, phase: Option<&str>) -> String {
    match phase {
        Some(ph) => format!("step {step} in phase {ph}"),
        None => format!("step {step}"),
    }
}

/// What the sidecar saw of the end.
pub(crate) struct Seen {
    pub end: End,
    pub status: Option<ExitStatus>,
    pub signal: Option<i32>,
    pub pid: u32,
    pub oom_kills: Option<u64>,
    /// The workers the job's process tree gives this process (`None`: its report tells).
    pub workers: Option<usize>,
    /// ` at step N in phase P` of the last sample, or empty.
    pub place: String,
}

impl Seen {
    fn code(&self) -> Option<i32> {
        self.status.and_then(|s| s.code())
    }

    /// `exited with code 3`, or `ended`.
    fn exit(&self) -> String {
        match self.code() {
            Some(c) => format!("exited with code {c}"),
            None => "ended".to_string(),
        }
    }

    /// ` at step N in phase P` where the first failed allocation happened, as the process said it
    /// (wire 1.10); else the last sample's place.
    fn failure_place(&self, w: &Watch) -> String {
        match &w.failed_at {
            Some((step, phase)) => format!(" at {}", step_and_phase(*step, phase.as_deref())),
            None => self.place.clone(),
        }
    }

    /// How the job ended after a memory failure: `{by_signal} SIGABRT (signal 6)` when a signal
    /// ended it, else its exit.
    fn after_failure(&self, by_signal: &str) -> String {
        match self.signal {
            Some(s) => format!("{by_signal} {}", signal_name(s)),
            None => self.exit(),
        }
    }

    /// The cause (`out_of_memory`, `oom_killed`, `signaled`, `detached`, `ended`, `exited`), its
    /// description, and the diagnosis engine's findings.
    pub(crate) fn judge(
        &self,
        report: &Report,
        w: &Watch,
    ) -> (&'static str, String, Vec<PostMortemFinding>) {
        // What the job is (its language, PyTorch, workers, the memory it could have): the
        // findings' kinds and remedies fit it.
        let mut job = JobContext::of(report);
        job.memory_bytes = machine_memory().or(job.memory_bytes);
        job.workers = self.workers.or(job.workers);
        let failed_kind = host_failure_kind(&job);
        let ctx = Context {
            leak: report.leak.clone(),
            job: Some(job),
            ..Context::from_env()
        };
        let mut findings = Vec::new();
        let (failures, failed_bytes) = w.alloc_failures;
        let oom_killed =
            self.signal == Some(libc::SIGKILL) && self.oom_kills.is_some_and(|k| k > 0);
        // A failed allocation the job survived (it went on and exited with code 0) is not how it
        // ended: it is said beside the exit, and the judge's finding stays for the reader.
        let survived = failures > 0 && self.signal.is_none() && self.code() == Some(0);
        let (cause, description) = if survived {
            findings.push(finding(failed_kind, failure_facts(failed_bytes, w), &ctx));
            let (cause, text) = self.plain_end();
            let place = self.failure_place(w);
            let what = match failures {
                1 => format!("an allocation of {} failed{place}", fmt_bytes(failed_bytes)),
                n => format!(
                    "{n} allocations failed (the first of {}{place})",
                    fmt_bytes(failed_bytes)
                ),
            };
            (cause, format!("{text}; {what} and the job went on"))
        } else if failures > 0 {
            let place = self.failure_place(w);
            findings.push(finding(failed_kind, failure_facts(failed_bytes, w), &ctx));
            let how = self.after_failure("aborted with");
            let job = ctx.job.as_ref();
            let limit = job.and_then(|j| j.limit_bytes);
            let capacity = job.and_then(JobContext::capacity_bytes);
            let description = match capacity.filter(|&m| failed_bytes > m) {
                // Not a memory shortage: no amount of freeing could have served it.
                Some(m) => format!(
                    "a single {} allocation failed{}, more than {}: a request that can never \
                     fit here; it {how}",
                    fmt_bytes(failed_bytes),
                    place,
                    if limit == Some(m) {
                        format!("the memory cgroup's limit of {}", fmt_bytes(m))
                    } else {
                        format!("this machine's {} of memory and swap", fmt_bytes(m))
                    }
                ),
                None => match refused_by_limit(failed_bytes, w) {
                    Some(space) => format!(
                        "the job ran out of memory under its address-space limit: a {} \
                         allocation failed{} under RLIMIT_AS {}{}; it {how}",
                        fmt_bytes(failed_bytes),
                        place,
                        fmt_bytes(space.limit_bytes),
                        space.virtual_bytes.map_or(String::new(), |v| format!(
                            " with {} already mapped",
                            fmt_bytes(v)
                        ))
                    ),
                    None => format!(
                        "the job ran out of memory: a {} allocation failed{}; it {how}",
                        fmt_bytes(failed_bytes),
                        place
                    ),
                },
            };
            ("out_of_memory", description)
        } else if let Some(o) = report.device_ooms.last() {
            let d = memsight_analysis::diagnose::device_oom::finding(o);
            findings.push(finding(d.kind, d.facts, &ctx));
            let earlier = match report.device_ooms.len() {
                1 => String::new(),
                n => format!(" (the last of {n} device OOMs)"),
            };
            let when = match o.phase.as_deref() {
                Some(p) => format!(" at step {} in {p}", o.step),
                None => format!(" at step {}", o.step),
            };
            // With the allocator history (`--device-history`): the line that asked, and the lines
            // holding the memory then.
            let lines = o
                .lines
                .as_ref()
                .map(|l| {
                    let asked = l
                        .failed_request
                        .as_ref()
                        .map(|f| format!("; it was asked at {}", f.short()))
                        .unwrap_or_default();
                    let held = match l.top_text(3) {
                        t if t.is_empty() => String::new(),
                        t => format!("; allocated then: {t}"),
                    };
                    format!("{asked}{held}")
                })
                .unwrap_or_default();
            (
                "out_of_memory",
                format!(
                    "the job ran out of device memory: a {} request on cuda:{} failed with {} of {} free{when}{earlier}{lines}; it {}",
                    fmt_bytes(o.requested_bytes),
                    o.device,
                    fmt_bytes(o.free_bytes),
                    fmt_bytes(o.total_bytes),
                    self.after_failure("was killed by")
                ),
            )
        } else if oom_killed {
            findings.push(finding(
                Kind::LinuxOomKiller,
                self.oom_kill_facts(report, w),
                &ctx,
            ));
            (
                "oom_killed",
                format!(
                    "killed by the OOM killer (SIGKILL with a cgroup OOM kill){}",
                    self.place
                ),
            )
        } else {
            self.plain_end()
        };
        (cause, description, findings)
    }

    /// The facts of a cgroup OOM kill, as the diagnosis engine reads them from a kernel log.
    fn oom_kill_facts(&self, report: &Report, w: &Watch) -> Facts {
        let mut f = Facts::default();
        f.int("pid", self.pid);
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
        f
    }

    /// An end that is no memory failure: a signal, a detach, an exit.
    fn plain_end(&self) -> (&'static str, String) {
        let place = &self.place;
        if let Some(sig) = self.signal {
            return ("signaled", format!("killed by {}{place}", signal_name(sig)));
        }
        match self.end {
            End::Detached => (
                "detached",
                format!("memsight detached{place}; the process runs on"),
            ),
            End::Ended => ("ended", format!("the process ended{place}")),
            End::Killed => (
                "signaled",
                format!("killed by a signal{place} (it ended without exiting)"),
            ),
            End::Child(_) => ("exited", self.exit()),
        }
    }
}

/// One judged finding, in the post-mortem's words.
fn finding(kind: Kind, facts: Facts, ctx: &Context) -> PostMortemFinding {
    let d = judge(
        Finding {
            kind,
            facts,
            line: 0,
        },
        ctx,
    );
    PostMortemFinding {
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
    }
}

/// This machine's memory and swap (`/proc/meminfo`), in bytes.
fn machine_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    };
    Some(kib("MemTotal:")?.saturating_add(kib("SwapTotal:").unwrap_or(0)) * 1024)
}
