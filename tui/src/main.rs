//! The `memsight` command: verb dispatch only. Each verb lives in its own module.

mod check;
mod diagnose;
mod estimate;
mod estimate_check;
mod estimate_hf;
mod heap;
mod merge;
mod plan;
mod preload;
mod run;
mod summary;
mod top;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Memory profiler and OOM-diagnosis tool for ML training jobs.
#[derive(Parser)]
#[command(name = "memsight", version, about)]
struct Cli {
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Subcommand)]
enum Verb {
    /// Check a report against memory budgets: exit 0 when all hold, 1 on a violation, 2 on bad input.
    Check(check::Args),
    /// Turn a report into a markdown CI summary or an SVG timeline plot.
    Summary(summary::Args),
    /// Find every OOM message in a log; give each a verdict and ranked remedies (exit 1: none found).
    Diagnose(diagnose::Args),
    /// Estimate a model's training memory (GPT-style dimensions or a Hugging Face config.json):
    /// breakdown, peak, largest micro-batch that fits.
    Estimate(Box<EstimateArgs>),
    /// One job report from a multi-node job's rank reports (or each node's job report): the ranks
    /// side by side and the rank that failed first.
    Merge(merge::Args),
    /// Plan how many jobs to run on each GPU from measured reports' device peaks (seed 003).
    Plan(plan::Args),
    /// Heap profiles: top allocation sites, growth between two, flamegraph, pprof; ask a job for one.
    Heap(heap::Args),
    /// Run a job with memsight switched on; write its report with a post-mortem, even if it is killed.
    Run(run::Args),
    /// Watch a running process (with or without memsight inside) until it ends; write its report.
    Attach(run::AttachArgs),
    /// The live viewer: attach to a job's sidecar (by pid or socket path).
    Top(top::TopArgs),
    /// Replay a finished run's report through the viewer's screens.
    View(top::ViewArgs),
}

/// `memsight estimate`'s arguments: the dimensions and training options, and the Hugging Face
/// config's (which, when given, describe the model instead).
#[derive(clap::Args)]
struct EstimateArgs {
    #[command(flatten)]
    gpt: estimate::Args,
    #[command(flatten)]
    hf: estimate_hf::HfArgs,
}

/// A command that only prints (a report, sites, a diagnosis) ends quietly when its reader goes
/// away (`memsight heap top … | head`), as Unix tools do, instead of failing to print: Rust's
/// runtime ignores `SIGPIPE`, so its default action is put back. Not for `run`, `attach`, `top`
/// and `view`, which outlive a closed pipe (the job goes on; the sidecar must not die).
fn end_quietly_on_closed_pipe() {
    // SAFETY: restores a signal's default disposition; no handler runs.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    preload::register();
    if !matches!(
        cli.verb,
        Verb::Run(_) | Verb::Attach(_) | Verb::Top(_) | Verb::View(_)
    ) {
        end_quietly_on_closed_pipe();
    }
    match cli.verb {
        Verb::Check(a) => check::run(a),
        Verb::Summary(a) => summary::run(a),
        Verb::Diagnose(a) => diagnose::run(a),
        Verb::Estimate(a) if a.hf.hf_config.is_some() => estimate_hf::run(&a.gpt, &a.hf),
        Verb::Estimate(a) => estimate::run(a.gpt),
        Verb::Merge(a) => merge::run(a),
        Verb::Plan(a) => plan::run(a),
        Verb::Heap(a) => heap::run(a),
        Verb::Run(a) => run::run(a),
        Verb::Attach(a) => run::attach(a),
        Verb::Top(a) => top::top(a),
        Verb::View(a) => top::view(a),
    }
}
