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
        Format::Markdown => with_ranks(summary::markdown(&report), &report),
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

/// The summary with the job's ranks side by side (a job report's headline is its lowest rank's
/// alone), before its post-mortem.
fn with_ranks(markdown: String, report: &Report) -> String {
    let Some(table) = ranks_markdown(report) else {
        return markdown;
    };
    match markdown.find("\n### Post-mortem") {
        Some(at) => format!("{}\n{table}{}", &markdown[..at], &markdown[at..]),
        None => format!("{markdown}\n{table}"),
    }
}

/// `### Ranks`: each rank's heap and RSS peaks, last USS, step and end, and the skew between the
/// largest and the smallest heap peak; `None` for a report with fewer than two ranks.
pub fn ranks_markdown(report: &Report) -> Option<String> {
    use memsight_format::units::fmt_bytes;
    use std::fmt::Write;
    if report.ranks.len() < 2 {
        return None;
    }
    let cell = |s: &str| memsight_format::text::line(s).replace('|', "\\|");
    let mut out = String::from(
        "### Ranks\n\n| rank | pid | heap peak | RSS peak | USS (last) | last step | end |\n\
         |---|---:|---:|---:|---:|---:|---|\n",
    );
    for r in &report.ranks {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            cell(&r.role_text()),
            r.pid,
            fmt_bytes(r.heap_peak_bytes),
            r.rss_peak_bytes.map_or_else(|| "–".into(), fmt_bytes),
            r.last_uss_bytes.map_or_else(|| "–".into(), fmt_bytes),
            r.last_step,
            cell(&r.end.description)
        );
    }
    if let Some(skew) = rank_skew(&report.ranks) {
        let _ = writeln!(out, "\n{}", cell(&skew));
    }
    Some(out)
}

/// `skew: rank 2's heap peak 453.55 MiB is 1.86× rank 0's 243.84 MiB (the smallest)`, between the
/// largest and the smallest heap peak of the ranks.
pub fn rank_skew(ranks: &[memsight_format::process::JobProcess]) -> Option<String> {
    use memsight_format::units::fmt_bytes;
    let max = ranks.iter().max_by_key(|r| r.heap_peak_bytes)?;
    let min = ranks.iter().min_by_key(|r| r.heap_peak_bytes)?;
    if ranks.len() < 2 || min.heap_peak_bytes == 0 {
        return None;
    }
    Some(format!(
        "skew: {}'s heap peak {} is {:.2}× {}'s {} (the smallest)",
        max.role_text(),
        fmt_bytes(max.heap_peak_bytes),
        max.heap_peak_bytes as f64 / min.heap_peak_bytes as f64,
        min.role_text(),
        fmt_bytes(min.heap_peak_bytes)
    ))
}
