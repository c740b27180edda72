//! `memsight merge --report OUT REPORT…`: one job report from a multi-node job's reports. Each
//! node's `memsight run` writes its ranks' reports (and a job report of its own) to shared storage;
//! this puts every rank side by side — peaks, skew, and the rank that failed first — with no
//! cluster protocol of memsight's own. Inputs are rank reports or per-node job reports; the lowest
//! rank's report is the merged report's base (its timeline, phases and steps).

use memsight_format::process::JobProcess;
use memsight_format::text;
use memsight_format::units::fmt_bytes;
use memsight_format::Report;
use std::path::PathBuf;
use std::process::ExitCode;

/// The reports to merge and where the merged one goes.
#[derive(clap::Args)]
pub struct Args {
    /// Where the merged job report goes.
    #[arg(long, value_name = "PATH")]
    report: PathBuf,
    /// Rank reports or per-node job reports that `memsight run` wrote.
    #[arg(required = true, value_name = "REPORT")]
    reports: Vec<PathBuf>,
}

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("memsight merge: {}", text::line(&msg.to_string()));
    ExitCode::from(2)
}

/// Merges the reports; exit 2 on bad input.
pub fn run(a: Args) -> ExitCode {
    let mut loaded = Vec::new();
    for p in &a.reports {
        match Report::load(p) {
            Ok(r) => loaded.push((p.clone(), r)),
            Err(e) => return fail(e),
        }
    }
    let merged = match merge(loaded) {
        Ok(m) => m,
        Err(e) => return fail(e),
    };
    if let Err(e) = merged.save(&a.report) {
        return fail(e);
    }
    for r in &merged.ranks {
        println!(
            "rank {:>4}  pid {:>8}  heap peak {:>11}  RSS peak {:>11}  {}",
            rank_of(r).unwrap_or_default(),
            r.pid,
            fmt_bytes(r.heap_peak_bytes),
            r.rss_peak_bytes
                .map(fmt_bytes)
                .unwrap_or_else(|| "—".into()),
            text::line(&r.end.description)
        );
    }
    if let Some(skew) = crate::summary::rank_skew(&merged.ranks) {
        println!("{}", text::line(&skew));
    }
    if let Some(pm) = &merged.post_mortem {
        println!("{}", text::line(&pm.description));
    }
    eprintln!("memsight · merged report written to {}", a.report.display());
    ExitCode::SUCCESS
}

/// Says which memsight wrote which report when they were not all the same version (nodes upgraded
/// one at a time): their figures may be defined differently.
fn mixed_versions(inputs: &[(PathBuf, Report)]) -> Option<String> {
    let mut versions: Vec<(&str, &PathBuf)> = Vec::new();
    for (path, r) in inputs {
        if !versions.iter().any(|(v, _)| *v == r.memsight_version) {
            versions.push((&r.memsight_version, path));
        }
    }
    (versions.len() > 1).then(|| {
        let each: Vec<String> = versions
            .iter()
            .map(|(v, p)| format!("{v} ({})", p.display()))
            .collect();
        format!(
            "the reports were written by different memsight versions: {}; a figure may be \
             defined differently in each",
            each.join(", ")
        )
    })
}

/// Says when two of the reports' runs never met in time (one ended before the other began, by the
/// clocks that stamped them): the ranks of one job run together — they meet in its rendezvous and
/// its collectives —, so such reports are of different jobs or runs, and putting them side by side
/// (the skew, the rank that failed first) compares runs that have nothing to do with each other.
fn apart_in_time(inputs: &[(PathBuf, Report)]) -> Option<String> {
    // A run's end is never taken before its start (a report's clock stamps out of order).
    let end = |r: &Report| r.job.end_unix_ms.max(r.job.start_unix_ms);
    let (ended, a) = inputs
        .iter()
        .min_by_key(|(_, r)| end(r))
        .map(|(p, r)| (end(r), p))?;
    let (began, b) = inputs
        .iter()
        .max_by_key(|(_, r)| r.job.start_unix_ms)
        .map(|(p, r)| (r.job.start_unix_ms, p))?;
    (ended < began).then(|| {
        format!(
            "{}'s run ended {:.1} s before {}'s began: the ranks of one job run at the same time, \
             so these reports are of different jobs or runs and the figures side by side compare \
             them; merge the reports of one run",
            a.display(),
            (began - ended) as f64 / 1000.0,
            b.display()
        )
    })
}

fn rank_of(p: &JobProcess) -> Option<u32> {
    match p.role {
        Some(memsight_format::process::Role::Rank { rank }) => Some(rank),
        _ => None,
    }
}

/// The merged report: the lowest rank's report with every rank's row, every node's processes, and
/// a post-mortem that starts with the rank that failed first.
pub fn merge(inputs: Vec<(PathBuf, Report)>) -> Result<Report, String> {
    let mut rows: Vec<(u32, JobProcess, usize)> = Vec::new();
    for (i, (path, r)) in inputs.iter().enumerate() {
        if r.ranks.is_empty() {
            return Err(format!(
                "{} has no ranks: give the reports `memsight run` wrote for a distributed job \
                 (its `{{rank}}` reports, or each node's job report)",
                path.display()
            ));
        }
        for row in &r.ranks {
            let Some(rank) = rank_of(row) else { continue };
            // One report's rows of a rank are its restarts (`torchrun --max-restarts`), each a
            // process of its own; across reports a rank is one node's.
            if let Some((_, seen, j)) = rows.iter().find(|(k, _, j)| *k == rank && *j != i) {
                // A node's job report and that node's own rank reports carry the same row: the
                // usual slip of a glob (`shared/r-*.json`), said as such.
                let hint = if same_process(seen, row) {
                    " (the same process: give each node's job report or its rank reports, \
                     not both)"
                } else {
                    ""
                };
                return Err(format!(
                    "rank {rank} is in both {} and {}{hint}",
                    inputs[*j].0.display(),
                    path.display()
                ));
            }
            let mut row = row.clone();
            row.report.get_or_insert_with(|| path.display().to_string());
            rows.push((rank, row, i));
        }
    }
    rows.sort_by_key(|(rank, _, _)| *rank);
    if let Some(said) = missing_ranks(rows.iter().map(|(rank, _, _)| *rank)) {
        eprintln!("memsight merge: {said} from the reports given: a node's reports left out?");
    }
    if let Some(said) = mixed_versions(&inputs) {
        eprintln!("memsight merge: {}", text::line(&said));
    }
    if let Some(said) = apart_in_time(&inputs) {
        eprintln!("memsight merge: {}", text::line(&said));
    }
    let base = rows
        .first()
        .map(|(_, _, i)| *i)
        .ok_or("no ranks to merge")?;
    let mut merged = inputs[base].1.clone();
    merged.processes = inputs
        .iter()
        .flat_map(|(_, r)| r.processes.iter().cloned())
        .collect();
    merged.ranks = rows.iter().map(|(_, row, _)| row.clone()).collect();
    let first = merged
        .ranks
        .iter()
        .filter(|r| r.end.failed())
        .min_by_key(|r| (r.end.unix_ms.unwrap_or(u64::MAX), r.end.code.is_some()))
        .cloned();
    if let (Some(first), Some(pm)) = (first, merged.post_mortem.as_mut()) {
        let who = format!("{} (pid {})", first.role_text(), first.pid);
        if !pm.description.starts_with(&who) {
            // A node's job report says which of its own processes failed first; across the
            // nodes another did, so only what it says of its own job is kept.
            let own = pm.job_end.as_deref().unwrap_or(&pm.description);
            pm.description = format!(
                "{who} failed first (of {} ranks): {} at step {}; this report is rank {}'s: {}",
                rows.len(),
                first.end.description,
                first.last_step,
                rows[0].0,
                own
            );
        }
    }
    Ok(merged)
}

/// Whether two rows describe one process: the same pid, command and end (a node's job report and
/// its own rank report), not one pid reused by another node or run.
fn same_process(a: &JobProcess, b: &JobProcess) -> bool {
    a.pid == b.pid && a.ppid == b.ppid && a.command == b.command && a.end == b.end
}

/// The ranks below the highest one given that no report has, said (`ranks 1, 2 are missing`),
/// the first eight by number and how many more.
fn missing_ranks(given: impl Iterator<Item = u32>) -> Option<String> {
    let given: std::collections::BTreeSet<u32> = given.collect();
    let top = u64::from(given.last().copied()?);
    let count = top + 1 - given.len() as u64;
    if count == 0 {
        return None;
    }
    let first: Vec<String> = (0..=top)
        .filter(|r| u32::try_from(*r).is_ok_and(|r| !given.contains(&r)))
        .take(8)
        .map(|r| r.to_string())
        .collect();
    let more = count - first.len() as u64;
    Some(match (count, more) {
        (1, _) => format!("rank {} is missing", first.join("")),
        (_, 0) => format!("ranks {} are missing", first.join(", ")),
        _ => format!("ranks {} and {more} more are missing", first.join(", ")),
    })
}
