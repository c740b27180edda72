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
    /// Peak live process heap: every allocation of the job, Rust and C/C++ (e.g. 512MiB, 4GiB).
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
    let gated = if a.whole_run {
        report
    } else {
        report.within_training()
    };
    let violations = budgets.check(&gated);
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
