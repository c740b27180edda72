//! `memsight-gpt`: trains the reference GPT under memsight and writes a report. This file parses
//! the command line and dispatches to [`memsight_gpt::commands`].

use clap::{Parser, Subcommand};
use memsight_gpt::cli::TrainArgs;
use memsight_gpt::commands::{self, AblateArgs, AnalyzeArgs, GenerateArgs};
use std::process::ExitCode;

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

#[derive(Parser)]
#[command(
    name = "memsight-gpt",
    version,
    about = "memsight's reference GPT training loop (tch)",
    args_override_self = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Train under memsight and write a report.
    Train(Box<TrainArgs>),
    /// Baseline, each switch alone and all together, each in its own process: a table of
    /// memory, time and loss (markdown, JSON, SVG).
    Ablate(AblateArgs),
    /// Greedy generation with a KV cache (prealloc, grow or none) under memsight.
    Generate(GenerateArgs),
    /// Attention analysis: first-layer-only loading, head-chunked maps as heatmaps, sampling mode.
    Analyze(AnalyzeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // tch panics on libtorch errors (shape mismatches, out of memory): report the first line of
    // libtorch's message as an error instead of a Rust panic with a C++ backtrace.
    std::panic::set_hook(Box::new(|_| {}));
    let outcome = std::panic::catch_unwind(|| match cli.cmd {
        Cmd::Train(a) => commands::train(*a),
        Cmd::Ablate(a) => commands::ablate(a),
        Cmd::Generate(a) => commands::generate(a),
        Cmd::Analyze(a) => commands::analyze(a),
    });
    let r = outcome.unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("unknown panic");
        // tch's message is a Debug string: its newlines are escaped ("\\n").
        let first = msg.split("\\n").next().unwrap_or(msg);
        let first = first.lines().next().unwrap_or(first);
        // tch unwraps its `TchError::Torch(msg)`: keep libtorch's own words.
        let first = first
            .split_once("Torch(\"")
            .map_or(first, |(_, m)| m.trim_end_matches("\")"));
        Err(format!("libtorch error: {first}"))
    });
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("memsight-gpt: {e}");
            ExitCode::from(2)
        }
    }
}
