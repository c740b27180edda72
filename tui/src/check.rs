//! `memsight check REPORT [budgets…]`: the CI gate.

use memsight_analysis::budget::Budgets;
use memsight_format::units::parse_size;
use memsight_format::{text, Report};
use std::path::PathBuf;
use std::process::ExitCode;

/// Budgets from flags override those of `--budget FILE`.
#[derive(clap::Args)]
pub struct Args {
    /// The JSON report to check.
    report: PathBuf,
    /// Peak live heap: every allocation of the job, Rust and C/C++; of a job of several measured
    /// processes, their heaps at one moment where that is higher (e.g. 512MiB, 4GiB).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    max_host_peak: Option<u64>,
    /// Peak RSS (e.g. 6GiB).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    max_rss_peak: Option<u64>,
    /// Peak PSS total of the job's process tree, workers included (e.g. 8GiB).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    max_tree_pss: Option<u64>,
    /// jemalloc (resident − allocated) / resident at peak resident, between 0 and 1.
    #[arg(long, value_name = "RATIO")]
    max_fragmentation: Option<f64>,
    /// Live-heap growth per step after warm-up (e.g. 1MiB).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    max_leak_per_step: Option<u64>,
    /// Peak live libtorch CPU tensor bytes (e.g. 2GiB).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    max_tensor_peak: Option<u64>,
    /// Per device: peak allocator reserved bytes, else NVML used (e.g. 70GiB).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    max_device_peak: Option<u64>,
    /// Per device: (reserved − allocated) / reserved, between 0 and 1.
    #[arg(long, value_name = "RATIO")]
    max_device_fragmentation: Option<f64>,
    /// Per device: caching-allocator retries (cache flushes under memory pressure).
    #[arg(long, value_name = "N")]
    max_alloc_retries: Option<u64>,
    /// A budget file (TOML, `version = 1`; see docs/budget.example.toml).
    #[arg(long, value_name = "FILE.toml")]
    budget: Option<PathBuf>,
    /// Gate the whole run, the shutdown after training included (by default a report with a
    /// training window is gated on that window: see docs/report.md, `training`).
    #[arg(long)]
    whole_run: bool,
}

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("memsight check: {}", text::line(&msg.to_string()));
    ExitCode::from(2)
}

/// Runs the check; the exit code is the verdict.
pub fn run(a: Args) -> ExitCode {
    let flags = Budgets {
        max_host_peak: a.max_host_peak,
        max_rss_peak: a.max_rss_peak,
        max_tree_pss: a.max_tree_pss,
        max_fragmentation: a.max_fragmentation,
        max_leak_per_step: a.max_leak_per_step,
        max_tensor_peak: a.max_tensor_peak,
        max_device_peak: a.max_device_peak,
        max_device_fragmentation: a.max_device_fragmentation,
        max_alloc_retries: a.max_alloc_retries,
    };
    if let Err(e) = flags.validate() {
        return fail(e);
    }
    let budgets = match &a.budget {
        Some(f) => match Budgets::load(f) {
            Ok(b) => b.merge(flags),
            Err(e) => return fail(e),
        },
        None => flags,
    };
    if budgets.is_empty() {
        return fail("no budget given: pass --max-host-peak, --max-rss-peak, --max-tree-pss, --max-fragmentation, --max-leak-per-step, --max-tensor-peak, --max-device-peak, --max-device-fragmentation, --max-alloc-retries or --budget FILE");
    }
    let report = match Report::load(&a.report) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    let window = match &report.training {
        Some(w) if !a.whole_run => format!(
            " (the training window, to {}; --whole-run adds the shutdown after it)",
            w.last_step
                .map_or("the interpreter's exit".to_string(), |s| format!(
                    "step {s}"
                ))
        ),
        _ => String::new(),
    };
    // The other ranks of a job report: its headline is the lowest rank's alone.
    let mut rank_violations = other_ranks(&report, &a.report, &budgets, a.whole_run);
    let gated = if a.whole_run {
        report
    } else {
        report.within_training()
    };
    let mut violations = budgets.check(&gated);
    violations.append(&mut rank_violations);
    if violations.is_empty() {
        println!(
            "memsight check: {}: every budget holds{window}",
            text::line(&a.report.display().to_string())
        );
        ExitCode::SUCCESS
    } else {
        // Violations name phases, which come from the job: no escape sequence reaches the terminal.
        for v in &violations {
            println!("{}{window}", text::line(v));
        }
        ExitCode::from(1)
    }
}

/// Each rank of a job report other than the one its headline is (the lowest rank's row with the
/// headline's pid: nodes of a merged report reuse pids): gated on its own report, read from the
/// path its row names (also beside the job's report, where the job's directory moved) and taken
/// only when it is that process's (its pid, rank and end match the row), in the same window as
/// the headline, on every budget but the process tree's (the job's, gated on the headline). When
/// no such report can be read, on the heap and RSS peaks its row keeps, and said on standard
/// error. One line per violation, led by the rank.
fn other_ranks(
    report: &Report,
    path: &std::path::Path,
    budgets: &Budgets,
    whole_run: bool,
) -> Vec<String> {
    use memsight_format::units::fmt_bytes;
    // The process tree is the job's (every rank, its workers and the launcher), gated once on the
    // headline: a rank's own report has none.
    let budgets = &Budgets {
        max_tree_pss: None,
        ..budgets.clone()
    };
    let headline = report.ranks.iter().position(|r| r.pid == report.job.pid);
    let mut out = Vec::new();
    for (i, row) in report.ranks.iter().enumerate() {
        if Some(i) == headline {
            continue;
        }
        let who = format!("{} (pid {})", row.role_text(), row.pid);
        let own = row.report.as_deref().map(std::path::PathBuf::from);
        let beside = own
            .as_deref()
            .and_then(std::path::Path::file_name)
            .map(|n| path.with_file_name(n));
        // Each path tried, and why it was not this process's report.
        let mut why = Vec::new();
        let mut loaded = None;
        for p in own.iter().chain(beside.iter()) {
            match Report::load(p) {
                Ok(r) if is_report_of(&r, row) => {
                    loaded = Some(r);
                    break;
                }
                Ok(_) => why.push(format!("{} is another process's report", p.display())),
                Err(e) => why.push(e.to_string()),
            }
        }
        match loaded {
            Some(r) => {
                let r = if whole_run { r } else { r.within_training() };
                out.extend(budgets.check(&r).into_iter().map(|v| format!("{who}: {v}")));
            }
            None => {
                if why.is_empty() {
                    why.push("its row names none".into());
                }
                eprintln!(
                    "memsight check: {}",
                    text::line(&format!(
                        "{who}: its own report could not be read ({}): only the heap and RSS \
                         peaks its row in the job's report keeps are gated",
                        why.join("; ")
                    ))
                );
                let gates = [
                    (
                        "host peak",
                        budgets.max_host_peak,
                        Some(row.heap_peak_bytes),
                    ),
                    ("rss peak", budgets.max_rss_peak, row.rss_peak_bytes),
                ];
                for (what, max, value) in gates {
                    if let (Some(max), Some(v)) = (max, value) {
                        if v > max {
                            out.push(format!(
                                "{who}: {what} {} exceeds budget {} (its own report could not \
                                 be read: its row's peak is gated)",
                                fmt_bytes(v),
                                fmt_bytes(max)
                            ));
                        }
                    }
                }
            }
        }
    }
    out
}

/// Whether `r` is the report of the process `row` describes: its pid, the rank its own row gives
/// and the instant it ended (a stale report of an earlier run, or of a rank on another node that
/// reused the pid, is not).
fn is_report_of(r: &Report, row: &memsight_format::process::JobProcess) -> bool {
    r.job.pid == row.pid
        && row.end.unix_ms.is_none_or(|t| t == r.job.end_unix_ms)
        && r.ranks
            .iter()
            .all(|own| own.pid != row.pid || own.role == row.role)
}
