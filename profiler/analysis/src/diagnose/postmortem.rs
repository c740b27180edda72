//! The host memory failures a report's post-mortem states — an OOM kill of the job or of one of
//! its processes (a DataLoader worker, a rank), a failed host allocation — as diagnoses beside the
//! device OOMs the report caught (`memsight diagnose --report`).
//!
//! The sidecar judged each when the job ended, with what only it saw (the kernel's figure at the
//! kill): its verdict and evidence are kept. The remedies are the engine's for the process the
//! report names as failed first, so a worker gets a worker's remedies, each with its reason.

use super::facts::Facts;
use super::{judge, Context, Diagnosis, Finding, Kind, Remedy, VerdictKind};
use memsight_format::process::JobProcess;
use memsight_format::report::{PostMortemFinding, Report};
use std::path::Path;

/// The post-mortem's host findings, judged (none when the report has no post-mortem or it found
/// no host memory failure). Device findings are left to the report's `device_ooms`.
pub fn host_findings(report: &Report, ctx: &Context) -> Vec<Diagnosis> {
    let Some(pm) = &report.post_mortem else {
        return Vec::new();
    };
    pm.findings
        .iter()
        .filter_map(|f| {
            let kind = parse::<Kind>(&f.kind)?;
            is_host(kind).then(|| diagnosis(kind, f, report, ctx))
        })
        .collect()
}

/// A log's findings joined with the report of the run that wrote it. A log's host finding naming
/// a process (`pid`) that the report's post-mortem judged is that judgement — its verdict, its
/// evidence and its remedies, which rest on what only the sidecar saw (the process's role, rank,
/// step and phase, the cgroup's limit, the kernel's figure) — keeping the log's line and the log's
/// own facts, with the report's facts the log does not state added. Every other finding is kept as
/// the log's alone.
pub fn join_log(log: Vec<Diagnosis>, report: &Report, ctx: &Context) -> Vec<Diagnosis> {
    let judged = host_findings(report, ctx);
    log.into_iter()
        .map(|d| {
            let pid = d.facts.get("pid").filter(|_| is_host(d.kind));
            match pid.and_then(|pid| judged.iter().find(|j| j.facts.get("pid") == Some(pid))) {
                Some(j) => joined(d, j),
                None => d,
            }
        })
        .collect()
}

fn joined(log: Diagnosis, judged: &Diagnosis) -> Diagnosis {
    let mut facts = log.facts;
    for (name, value) in judged.facts.iter() {
        if facts.get(name).is_none() {
            facts.set(name, value.clone());
        }
    }
    Diagnosis {
        kind: log.kind,
        facts,
        line: log.line,
        verdict: judged.verdict.clone(),
        remedies: judged.remedies.clone(),
        workload: judged.workload.or(log.workload),
    }
}

fn is_host(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::LinuxOomKiller
            | Kind::OomKillReport
            | Kind::RustAllocFailure
            | Kind::HostAllocFailure
            | Kind::TorchCpuOom
    )
}

/// A snake_case name (`linux_oom_killer`, `host_oom`) as its enum.
fn parse<T: serde::de::DeserializeOwned>(name: &str) -> Option<T> {
    serde_json::from_value(serde_json::Value::String(name.to_string())).ok()
}

fn diagnosis(kind: Kind, pm: &PostMortemFinding, report: &Report, ctx: &Context) -> Diagnosis {
    let facts = if kind == Kind::LinuxOomKiller {
        killed_facts(report)
    } else {
        Facts::default()
    };
    let mut d = judge(
        Finding {
            kind,
            facts,
            line: 0,
        },
        ctx,
    );
    if let Some(verdict) = parse::<VerdictKind>(&pm.verdict) {
        d.verdict.verdict = verdict;
        d.verdict.evidence = pm.evidence.clone();
    }
    // The job already ran under memsight: "profile it" is no advice here.
    d.remedies.retain(|r| r.id != "profile");
    // A failed allocation's size is the sidecar's alone (the report keeps no facts of it): its
    // remedies, chosen with that size for this job, stand.
    if kind != Kind::LinuxOomKiller && !pm.remedies.is_empty() {
        d.remedies = pm
            .remedies
            .iter()
            .map(|action| Remedy {
                id: "post_mortem",
                action: action.clone(),
                why: "the sidecar's advice when the job ended, from the size that failed".into(),
                saving_bytes: None,
            })
            .collect();
    }
    d
}

/// The process the kernel killed: the first the report's process tree says was OOM-killed, else
/// the job's own process.
fn killed_facts(report: &Report) -> Facts {
    let mut f = Facts::default();
    let killed = report
        .processes
        .iter()
        .filter(|p| p.end.kind == "oom_killed")
        .min_by_key(|p| p.end.unix_ms.unwrap_or(u64::MAX));
    match killed {
        Some(p) => process_facts(&mut f, p),
        None => {
            f.int("pid", report.job.pid);
            f.opt_text("process_name", name(&report.job.command));
        }
    }
    // The sidecar calls a SIGKILL an OOM kill only when the job's memory cgroup counted one.
    f.text("scope", "memcg");
    let cgroup = report.timeline.iter().rev().find_map(|s| s.cgroup);
    if let Some(limit) = cgroup.and_then(|c| c.limit) {
        f.int("memory_limit_bytes", limit);
        // The highest the job's samples saw (its peak when the cgroup's rose during the job):
        // the last sample is after the kill freed the killed process's memory.
        let reached = report
            .timeline
            .iter()
            .filter_map(|s| s.cgroup)
            .map(|c| c.peak.unwrap_or(0).max(c.usage))
            .max();
        f.opt_int("memory_usage_bytes", reached.map(i128::from));
    }
    f
}

fn process_facts(f: &mut Facts, p: &JobProcess) {
    f.int("pid", p.pid);
    f.opt_text("process_name", name(&p.command));
    f.text("role", p.role_text());
    f.opt_int("rss_peak_bytes", p.rss_peak_bytes.map(i128::from));
    f.opt_int("last_uss_bytes", p.last_uss_bytes.map(i128::from));
    f.opt_int("last_pss_bytes", p.last_pss_bytes.map(i128::from));
    f.int("step", p.last_step);
    f.opt_text("phase", p.last_phase.as_deref());
}

/// The program's file name (`python` for `/venv/bin/python`).
fn name(command: &[String]) -> Option<&str> {
    let first = command.first()?;
    Some(
        Path::new(first)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or(first),
    )
}
