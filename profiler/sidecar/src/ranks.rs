//! The job's processes in its reports: one report per rank (`--report` takes `{rank}`), and in
//! the job's report every measured process with its role, peaks and end, the ranks side by side,
//! and which process failed first — the others' errors (a torchrun shutting its ranks down, a
//! DataLoader's "worker killed" error) are its consequences.

use crate::cause::End;
use crate::delivery::{deliver, to_stdout, SidecarError};
use crate::job::{JobRings, Member};
use crate::kmsg::KernelLog;
use crate::postmortem;
use memsight_format::process::{JobProcess, ProcessEnd, Role};
use memsight_format::report::{PostMortemFinding, Report};
use memsight_format::units::fmt_bytes;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How far apart two samples of a process must be for it to have had a session had it carried
/// memsight (a session starts at 100 ms).
const UNMEASURED_AFTER_MS: u64 = 500;

/// The placeholder `--report` takes for the rank.
const RANK: &str = "{rank}";

/// Where the report of `rank` goes (`None`: the job's): `{rank}` in the path replaced by the rank
/// (`job` for the job's report), else `<stem>.rank<N>.json` beside the job's report.
pub fn report_for(report: &Path, rank: Option<u32>) -> PathBuf {
    match rank {
        Some(r) => named(report, &r.to_string(), &format!(".rank{r}.json")),
        None => job_report_for(report, None),
    }
}

/// Where the job's report goes when this `memsight run` was itself started as rank `launched_as`
/// of a launcher that starts one per rank or per node (`srun`, `mpirun`, `torchrun --no-python`:
/// [`launched_as`]): for a rank `N` above 0, `{rank}` in the path replaced by `job-<N>` (else
/// `<stem>.job-<N>.json`), so that the runs of one job, on one machine or on shared storage, each
/// keep their report (they all wrote, and locked, the one `job` path: every run but the first was
/// refused). Rank 0's run, a run outside a launcher (`None`), and one in a batch script (which
/// Slurm gives `SLURM_PROCID` 0) keep the path itself, `{rank}` replaced by `job`.
pub fn job_report_for(report: &Path, launched_as: Option<u32>) -> PathBuf {
    match launched_as {
        Some(n) if n > 0 => named(report, &format!("job-{n}"), &format!(".job-{n}.json")),
        _ if has_placeholder(report) => named(report, "job", ""),
        _ => report.to_path_buf(),
    }
}

/// The rank this process was started as by a distributed launcher, from its environment (the
/// variables [`RankEnv`](memsight_format::process::RankEnv) reads); `None` outside one.
pub fn launched_as() -> Option<u32> {
    memsight_format::process::RankEnv::from_env().map(|r| r.rank)
}

/// Whether `report` holds the `{rank}` placeholder.
fn has_placeholder(report: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let placeholder = RANK.as_bytes();
    report
        .as_os_str()
        .as_bytes()
        .windows(placeholder.len())
        .any(|w| w == placeholder)
}

/// `report` with every `{rank}` replaced by `who`, or, without one, its file name's stem followed
/// by `suffix` (the path itself for an empty `suffix`).
fn named(report: &Path, who: &str, suffix: &str) -> PathBuf {
    use std::ffi::OsString;
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    // As bytes: a path need not be UTF-8, and a lossy copy would name another file.
    if has_placeholder(report) {
        let placeholder = RANK.as_bytes();
        let mut out = Vec::new();
        let mut rest = report.as_os_str().as_bytes();
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix(placeholder) {
                out.extend_from_slice(who.as_bytes());
                rest = after;
            } else {
                out.push(rest[0]);
                rest = &rest[1..];
            }
        }
        return PathBuf::from(OsString::from_vec(out));
    }
    if suffix.is_empty() {
        return report.to_path_buf();
    }
    let mut name = report
        .file_stem()
        .map_or_else(|| OsString::from("memsight-report"), |s| s.to_owned());
    name.push(suffix);
    report.with_file_name(name)
}

/// The report path of a rank's `n`-th restarted process: `r-1.restart2.json` for `r-1.json`
/// (`n` 0: the path itself).
fn restart_path(path: &Path, n: usize) -> PathBuf {
    if n == 0 {
        return path.to_path_buf();
    }
    let mut name = path.file_stem().map_or_else(
        || std::ffi::OsString::from("memsight-report"),
        |s| s.to_owned(),
    );
    name.push(format!(".restart{n}"));
    if let Some(ext) = path.extension() {
        name.push(".");
        name.push(ext);
    }
    path.with_file_name(name)
}

/// Whether member `a` started before member `b` (its ring first; the pid when they tie).
fn started_before(a: &Member, b: &Member) -> bool {
    let key = |m: &Member| (m.watch.ring_start_unix_ms.unwrap_or(0), m.pid);
    key(a) < key(b)
}

/// What the job's reports are assembled from.
pub(crate) struct Assembly<'a> {
    pub job: &'a JobRings,
    pub kernel: &'a KernelLog,
    pub oom_kills: Option<u64>,
    pub interval: Duration,
    /// The report path the user gave (`-`: standard output, where rank reports are not written).
    pub report: &'a Path,
    /// The job's first process and how `wait` said it ended.
    pub root: (u32, Option<std::process::ExitStatus>),
    /// The first stop signal `memsight run` received (SIGINT, SIGTERM, SIGHUP) and when (Unix ms):
    /// a process that ended after it was stopped with the job, not the first to fail.
    pub stopped: Option<(libc::c_int, u64)>,
}

impl Assembly<'_> {
    /// Whether the OOM killer ended `m`: the kernel named it, or (its log unreadable) it ended
    /// without exiting while the job's cgroup counted a kill and it was the largest such process.
    fn oom_killed(&self, m: &Member) -> bool {
        if m.exit_code.is_some() || !m.ended() {
            return false;
        }
        if !self.kernel.kills.is_empty() {
            return self.kernel.kills.contains_key(&m.pid);
        }
        self.oom_kills.is_some_and(|k| k > 0)
            && self
                .job
                .members
                .iter()
                .filter(|o| o.ended() && o.exit_code.is_none())
                .max_by_key(|o| last_rss(o))
                .is_some_and(|o| o.pid == m.pid)
    }

    /// How `m` ended, in the post-mortem's terms.
    /// The wait status of the job's first process, for the member that was its last program.
    fn root_status(&self, m: &Member) -> Option<std::process::ExitStatus> {
        (m.pid == self.root.0 && !m.exec_d)
            .then_some(self.root.1)
            .flatten()
    }

    fn end_of(&self, m: &Member) -> End {
        if let Some(s) = self.root_status(m) {
            return End::Child(Some(s));
        }
        match m.exit_code {
            Some(c) => End::Child(Some(std::process::ExitStatus::from_raw((c & 0xff) << 8))),
            None if self.oom_killed(m) => {
                End::Child(Some(std::process::ExitStatus::from_raw(libc::SIGKILL)))
            }
            None if m.ended() => End::Killed,
            None => End::Detached,
        }
    }

    fn process_end(&self, m: &Member) -> ProcessEnd {
        let root = self.root_status(m);
        let code = m.exit_code.or(root.and_then(|s| s.code()));
        let signal = root.and_then(|s| s.signal());
        let (kind, description) = match (code, m.ended()) {
            _ if m.exec_d => ("exec", "exec'd another program".to_string()),
            (None, _) if signal.is_some() => (
                "killed",
                format!(
                    "killed by {}",
                    crate::cause::signal_name(signal.unwrap_or_default())
                ),
            ),
            (Some(c), _) => ("exited", format!("exited with code {c}")),
            (None, true) if self.oom_killed(m) => (
                "oom_killed",
                match self.kernel.kills.get(&m.pid).and_then(|k| k.rss_bytes) {
                    Some(rss) => format!(
                        "killed by the OOM killer at {} resident (the kernel's figure)",
                        fmt_bytes(rss)
                    ),
                    None => "killed by the OOM killer".to_string(),
                },
            ),
            (None, true) => (
                "killed",
                match self.signalled_by(m) {
                    Some((by, sig)) => format!(
                        "ended without exiting: killed by a signal after {} (pid {}) of the job \
                         sent it {}",
                        by.role.map_or_else(|| "process".into(), |r| r.describe()),
                        by.pid,
                        crate::cause::signal_name(sig)
                    ),
                    None => "ended without exiting: killed by a signal".to_string(),
                },
            ),
            (None, false) => ("running", "still running".to_string()),
        };
        ProcessEnd {
            kind: kind.into(),
            code,
            unix_ms: m.ended_unix_ms,
            description,
        }
    }

    fn row(&self, m: &Member, report: Option<PathBuf>) -> JobProcess {
        let last_tree = m
            .watch
            .last()
            .and_then(|s| s.tree.as_ref())
            .and_then(|t| t.processes.iter().find(|p| p.pid == m.pid).cloned());
        let outside = self.outside_sample(m.pid);
        let last = m.watch.last();
        JobProcess {
            pid: m.pid,
            ppid: m.info.ppid,
            role: m.role,
            command: m.command.clone(),
            heap_peak_bytes: m.heap_peak(),
            // The kernel's high-water mark (VmHWM) where sampled, as the process's own report
            // and `check` say it: the highest sampled RSS alone was 1–2% below it.
            rss_peak_bytes: m
                .watch
                .timeline
                .samples()
                .iter()
                .filter_map(|s| s.process.map(|p| p.rss.max(p.hwm)))
                .max(),
            last_pss_bytes: last_tree
                .as_ref()
                .and_then(|p| p.pss)
                .or(outside.as_ref().and_then(|p| p.pss)),
            last_uss_bytes: last_tree
                .as_ref()
                .and_then(|p| p.uss)
                .or(outside.as_ref().and_then(|p| p.uss)),
            last_step: last.map_or(0, |s| s.step),
            last_phase: last.and_then(|s| s.phase.clone()),
            end: self.process_end(m),
            report: report.map(|p| p.display().to_string()),
        }
    }

    /// The last sample of process `pid` in the principal's process trees (read from outside: a
    /// forked worker's PSS and USS).
    fn outside_sample(&self, pid: u32) -> Option<memsight_format::host::TreeProcess> {
        let p = self.job.principal()?;
        p.watch
            .timeline
            .samples()
            .iter()
            .rev()
            .filter_map(|s| s.tree.as_ref())
            .find_map(|t| t.processes.iter().find(|q| q.pid == pid).cloned())
    }

    /// Writes one report per rank; returns the first error.
    pub(crate) fn write_rank_reports(&self, job: &mut Report) -> Vec<(u32, SidecarError)> {
        let mut errors = Vec::new();
        let mut rows = Vec::new();
        let superseded = self.job.superseded();
        for (i, m) in self.job.members.iter().enumerate() {
            let Some(Role::Rank { rank }) = m.role else {
                continue;
            };
            // A rank a launcher started again (`torchrun --max-restarts`): each of its processes
            // keeps its own report, the first at the rank's path, later ones `.restartN` beside.
            // An image that exec'd the rank's program is not another process: the program's
            // report is the rank's.
            let program = |o: &&Member| o.role == m.role && !o.exec_d;
            let succeeded = m.exec_d
                && self
                    .job
                    .members
                    .iter()
                    .filter(program)
                    .any(|o| o.pid == m.pid);
            let earlier = self
                .job
                .members
                .iter()
                .filter(program)
                .filter(|o| started_before(o, m))
                .count();
            let path = (!to_stdout(self.report) && !succeeded)
                .then(|| restart_path(&report_for(self.report, Some(rank)), earlier));
            let mut report = self.member_report(m);
            // Its own sites at its peak (the job's report has the headline rank's). Only for a
            // report that is written: an image that exec'd the rank's program has none.
            if path.is_some() {
                crate::delivery::add_heap_profile(
                    &mut report,
                    &m.watch.heap_dumps,
                    path.as_deref(),
                );
            }
            // A rank's report says which rank it is (`memsight merge` puts them side by side).
            report.ranks = vec![self.row(m, path.clone())];
            let written = match &path {
                Some(p) => match deliver(&report, p) {
                    Ok(()) => Some(p.clone()),
                    Err(e) => {
                        errors.push((rank, e));
                        None
                    }
                },
                None => None,
            };
            // The rank is its process's latest image: one row per process, not per program
            // (a rank started through a wrapper or shim that exec'd is its program).
            if !superseded[i] {
                rows.push((rank, self.row(m, written)));
            }
        }
        rows.sort_by_key(|(r, _)| *r);
        job.ranks = rows.into_iter().map(|(_, row)| row).collect();
        errors.sort_by_key(|(r, _)| *r);
        errors
    }

    /// A member's own report: its timeline, steps and phases, with the post-mortem of its end.
    fn member_report(&self, m: &Member) -> Report {
        let command: Vec<std::ffi::OsString> = m.command.iter().map(Into::into).collect();
        postmortem::final_report(postmortem::Ending {
            watch: &m.watch,
            end: self.end_of(m),
            pid: m.pid,
            command: &command,
            start_unix_ms: m.watch.ring_start_unix_ms.unwrap_or(0),
            died_unix_ms: m
                .ended_unix_ms
                .unwrap_or_else(memsight_format::clock::unix_ms),
            interval: self.interval,
            oom_kills: self.oom_killed(m).then_some(1),
            job_report: None,
            // The workers of this process's part of the job: itself when it is one, and the
            // workers it forked.
            workers: Some(
                self.job
                    .members
                    .iter()
                    .filter(|o| o.pid == m.pid || o.info.ppid == m.pid)
                    .filter(|o| matches!(o.role, Some(Role::Worker { .. })))
                    .count(),
            ),
        })
    }

    /// The job's report: its processes, and the process that failed first leads its post-mortem.
    pub(crate) fn describe_job(&self, report: &mut Report) {
        let unmeasured = self.unmeasured();
        if self.job.members.len() > 1 || !report.ranks.is_empty() || !unmeasured.is_empty() {
            report.processes = self.job.members.iter().map(|m| self.row(m, None)).collect();
        }
        if self.job.members.len() > 1 {
            self.add_job_heap(report);
        }
        if !unmeasured.is_empty() {
            let names: Vec<String> = unmeasured
                .iter()
                .map(|p| format!("{} (pid {})", p.command.join(" "), p.pid))
                .collect();
            report.sources.push(memsight::collect::SourceStatus {
                name: "unmeasured processes".into(),
                available: false,
                detail: format!(
                    "{} of the job had no memsight session (started without LD_PRELOAD, \
                     statically linked, or carrying the library but allocating too little to \
                     start one, as a launcher that only waits does): no heap of their own; their \
                     memory is in the process tree only",
                    names.join(", ")
                ),
            });
            report.processes.extend(unmeasured);
        }
        // The first process's own end is the job's, said by the post-mortem already.
        let Some(first) = self
            .first_failure()
            .filter(|m| self.root_status(m).is_none())
        else {
            return;
        };
        let row = self.row(first, None);
        let Some(pm) = report.post_mortem.as_mut() else {
            return;
        };
        if let Some((sig, at)) = self.stopped {
            if first.ended_unix_ms.is_none_or(|end| end >= at) {
                let then = pm.description.clone();
                pm.description = format!(
                    "stopped from outside: {} reached memsight and the job (Ctrl-C, or a \
                     scheduler ending the job) before any of its processes failed; then the \
                     job: {then}",
                    crate::cause::signal_name(sig)
                );
                pm.job_end = Some(then);
                return;
            }
        }
        // A process that exited with an error in a job that succeeded is no failure of the job.
        let killed = matches!(row.end.kind.as_str(), "killed" | "oom_killed");
        if pm.exit_code == Some(0) && !killed {
            return;
        }
        let who = format!("{} (pid {})", row.role_text(), first.pid);
        let place = self.place_of_end(first, &row);
        let size = self.size_at_end(first, &row);
        let then = pm.description.clone();
        pm.description = format!(
            "{who} failed first: {} at {place}{size}; then the job: {then}",
            row.end.description
        );
        pm.job_end = Some(then);
        if self.oom_killed(first) {
            pm.cause = "oom_killed".into();
            let member = self.member_report(first);
            let findings: Vec<PostMortemFinding> = member
                .post_mortem
                .map(|p| p.findings)
                .unwrap_or_default()
                .into_iter()
                .map(|mut f| {
                    f.evidence = format!("{who}{size}: {}", f.evidence);
                    f
                })
                .collect();
            pm.findings.splice(0..0, findings);
        } else if pm.cause == "exited" || pm.cause == "signaled" {
            pm.cause = row.end.kind.clone();
        }
    }

    /// The job's heap peak (the highest total of its measured processes' live heaps at one
    /// moment), over the run and over the training window, placed at the report's process's step
    /// and phase then.
    fn add_job_heap(&self, report: &mut Report) {
        use memsight_format::report::job_heap_peak;
        let series = self.job.heap_series();
        report.peaks.job_heap_peak =
            job_heap_peak(&series, None).map(|(t, b)| report.job_heap_peak_at(t, b));
        let window = report
            .training
            .as_ref()
            .and_then(|w| job_heap_peak(&series, Some(w.end_unix_ms)))
            .map(|(t, b)| report.job_heap_peak_at(t, b));
        if let Some(w) = report.training.as_mut() {
            w.job_heap_peak = window;
        }
    }

    /// Where in training `m` ended: its own step and phase when its steps moved; else (a forked
    /// DataLoader worker keeps the step it was forked at, a spawned one never steps) the step
    /// and phase of the process that trains at `m`'s last sample: its nearest ancestor whose
    /// steps moved, else the job's principal.
    fn place_of_end(&self, m: &Member, row: &JobProcess) -> String {
        let at = crate::cause::step_and_phase;
        let Some(trainer) = self.trainer_of(m) else {
            return at(row.last_step, row.last_phase.as_deref());
        };
        let start = trainer.watch.ring_start_unix_ms.unwrap_or(0);
        // Its last own sample, not when its end was seen: by then the trainer may be reacting
        // to it (a DataLoader's "worker killed" error, the interpreter's shutdown).
        let end = match m.watch.last() {
            Some(_) => last_sample_unix_ms(m),
            None => m.ended_unix_ms.unwrap_or(u64::MAX),
        };
        let samples = trainer.watch.timeline.samples();
        let Some(s) = samples
            .iter()
            .rev()
            .find(|s| start.saturating_add(s.t_ms) <= end)
            .or(samples.first())
        else {
            return at(row.last_step, row.last_phase.as_deref());
        };
        let role = trainer
            .role
            .map_or_else(|| "process".into(), |r| r.describe());
        format!(
            "{} of the training loop ({role}, pid {})",
            at(s.step, s.phase.as_deref()),
            trainer.pid
        )
    }

    /// The member whose steps place `m`'s end when `m`'s own steps never moved: its nearest
    /// ancestor among the members whose steps did, else the principal when its steps did.
    fn trainer_of(&self, m: &Member) -> Option<&Member> {
        if steps_moved(m) {
            return None;
        }
        let members = &self.job.members;
        let mut ppid = m.info.ppid;
        for _ in 0..64 {
            let Some(parent) = members.iter().find(|o| o.pid == ppid && o.pid != m.pid) else {
                break;
            };
            if steps_moved(parent) {
                return Some(parent);
            }
            ppid = parent.info.ppid;
        }
        self.job
            .principal()
            .filter(|p| p.pid != m.pid && steps_moved(p))
    }

    /// Processes of the job's tree that lived long enough to have a session (seen in samples
    /// [`UNMEASURED_AFTER_MS`] apart) but wrote no ring: they carry no memsight.
    fn unmeasured(&self) -> Vec<JobProcess> {
        let Some(p) = self.job.principal() else {
            return Vec::new();
        };
        let start = p.watch.ring_start_unix_ms.unwrap_or(0);
        let mut seen: Vec<(memsight_format::host::TreeProcess, u64, u64)> = Vec::new();
        for s in p.watch.timeline.samples() {
            let Some(t) = &s.tree else { continue };
            let at = start + s.t_ms;
            for q in &t.processes {
                if self.job.members.iter().any(|m| m.pid == q.pid) {
                    continue;
                }
                match seen.iter_mut().find(|(o, _, _)| o.pid == q.pid) {
                    Some((o, _, last)) => {
                        *last = at;
                        o.rss = o.rss.max(q.rss);
                        o.pss = q.pss;
                        o.uss = q.uss;
                    }
                    None => seen.push((q.clone(), at, at)),
                }
            }
        }
        seen.into_iter()
            .filter(|(_, first, last)| last.saturating_sub(*first) >= UNMEASURED_AFTER_MS)
            .map(|(q, _, _)| JobProcess {
                pid: q.pid,
                ppid: q.ppid,
                role: None,
                command: vec![q.name.clone()],
                heap_peak_bytes: 0,
                rss_peak_bytes: Some(q.rss),
                last_pss_bytes: q.pss,
                last_uss_bytes: q.uss,
                last_step: 0,
                last_phase: None,
                end: ProcessEnd {
                    kind: "unmeasured".into(),
                    code: None,
                    unix_ms: None,
                    description: "no memsight session: its memory is in the process tree only"
                        .into(),
                },
                report: None,
            })
            .collect()
    }

    /// `; 1.1 GiB resident at the kill (kernel), 607 MiB unique when last sampled`.
    fn size_at_end(&self, m: &Member, row: &JobProcess) -> String {
        let mut parts = Vec::new();
        if let Some(k) = self.kernel.kills.get(&m.pid).and_then(|k| k.rss_bytes) {
            parts.push(format!("{} resident at the kill (kernel)", fmt_bytes(k)));
        }
        if let Some(rss) = m.watch.last().and_then(|s| s.process.map(|p| p.rss)) {
            parts.push(format!(
                "{} resident at its last own sample",
                fmt_bytes(rss)
            ));
        }
        if let Some(u) = row.last_uss_bytes {
            parts.push(format!("{} unique when last sampled", fmt_bytes(u)));
        }
        parts.push(format!(
            "its own heap peak {}",
            fmt_bytes(row.heap_peak_bytes)
        ));
        format!(" ({})", parts.join(", "))
    }

    /// The member of the job that last sent `m` a signal while `m` ran (its flight recorder's
    /// `signal_sent` records), and the signal.
    fn signalled_by(&self, m: &Member) -> Option<(&Member, i32)> {
        let started = m.watch.ring_start_unix_ms.unwrap_or(0);
        self.job
            .members
            .iter()
            .filter(|o| o.pid != m.pid)
            .filter_map(|o| {
                let &(sig, at) = o.watch.signals_sent.get(&m.pid)?;
                (at >= started).then_some((o, sig, at))
            })
            .max_by_key(|&(_, _, at)| at)
            .map(|(o, sig, _)| (o, sig))
    }

    /// The member that failed first (killed, OOM-killed, or exited with an error), by when its
    /// end was seen; a kill before an error exit seen at the same poll. A process killed by a
    /// signal (not the OOM killer) is no failure when the job stopped it itself: another of the
    /// job's processes sent it a signal and it is not the job's main process or a rank (a pool
    /// terminating its workers, a DataLoader's shutdown, a `subprocess` timeout); nor, whoever
    /// sent the signal, in a job whose first process then exited with code 0.
    fn first_failure(&self) -> Option<&Member> {
        let succeeded = self.root.1.is_some_and(|s| s.success());
        self.job
            .members
            .iter()
            .filter(|m| {
                let end = self.process_end(m);
                let stopped_by_job = end.kind == "killed"
                    && !matches!(m.role, Some(Role::Main | Role::Rank { .. }))
                    && self.signalled_by(m).is_some();
                end.failed() && !stopped_by_job && !(succeeded && end.kind == "killed")
            })
            .min_by_key(|m| {
                (
                    m.ended_unix_ms.unwrap_or(u64::MAX),
                    m.exit_code.is_some(),
                    last_sample_unix_ms(m),
                )
            })
    }
}

/// Whether a member's step changed while it ran (a forked worker starts at its parent's step and
/// keeps it).
fn steps_moved(m: &Member) -> bool {
    let mut steps = m.watch.timeline.samples().iter().map(|s| s.step);
    steps.next().is_some_and(|first| steps.any(|s| s != first))
}

/// A member's last sampled RSS.
fn last_rss(m: &Member) -> u64 {
    m.watch
        .last()
        .and_then(|s| s.process.map(|p| p.rss))
        .unwrap_or(0)
}

/// When a member last sampled.
fn last_sample_unix_ms(m: &Member) -> u64 {
    m.watch.ring_start_unix_ms.unwrap_or(0) + m.watch.last().map_or(0, |s| s.t_ms)
}
