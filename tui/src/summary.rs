//! `memsight summary REPORT --format markdown|svg`: a CI step summary or a timeline plot.

use memsight_analysis::{plot, summary};
use memsight_format::Report;
use std::path::PathBuf;
use std::process::ExitCode;

/// Output formats.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Format {
    /// GitHub-flavoured markdown (for $GITHUB_STEP_SUMMARY).
    Markdown,
    /// An SVG plot of the memory timeline.
    Svg,
}

/// Where and how to render.
#[derive(clap::Args)]
pub struct Args {
    /// The JSON report.
    report: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value = "markdown")]
    format: Format,
    /// Write to this file instead of standard output.
    #[arg(long, short)]
    output: Option<PathBuf>,
}

/// Renders the summary; exit 2 on bad input.
pub fn run(a: Args) -> ExitCode {
    let report = match Report::load(&a.report) {
        Ok(mut r) => {
            memsight_analysis::heapprof::complete(&mut r, &a.report);
            r
        }
        Err(e) => {
            eprintln!("memsight summary: {e}");
            return ExitCode::from(2);
        }
    };
    let text = match a.format {
        Format::Markdown => summary::markdown(&report),
        Format::Svg => match plot::svg(&report) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("memsight summary: {e}");
                return ExitCode::from(2);
            }
        },
    };
    match &a.output {
        Some(p) => {
            if let Err(e) = memsight_format::safe_file::write(p, text.as_bytes()) {
                eprintln!("memsight summary: {}: {e}", p.display());
                return ExitCode::from(2);
            }
            println!("{}", p.display());
        }
        None => print!("{text}"),
    }
    ExitCode::SUCCESS
}
