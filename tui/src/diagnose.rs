//! `memsight diagnose [FILE|-]`: every OOM message in a log, with its facts, a verdict and ranked
//! remedies. Exit 0 when at least one OOM was diagnosed, 1 when none was found, 2 on bad input.

use memsight_analysis::diagnose::{diagnose, judge, postmortem, render, Context, Diagnosis};
use memsight_format::{input, text, Report};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

/// Reads a log (or `-` for standard input) and diagnoses each OOM message in it.
#[derive(clap::Args)]
pub struct Args {
    /// The log or error text (`-` or nothing: standard input). With --report and no log (a
    /// terminal or an empty standard input), the report's own findings are diagnosed: the host
    /// memory failure its post-mortem states (an OOM-killed worker or rank) and the device OOMs
    /// it caught.
    file: Option<PathBuf>,
    /// Print `{"findings": [...]}` as JSON instead of text.
    #[arg(long)]
    json: bool,
    /// The job's memsight report: its per-step leak slope can turn the verdict into `leak`; a kill
    /// the log states of a process its post-mortem judged takes that judgement (role, rank, step,
    /// the cgroup's limit, the kernel's figure); with no log, its post-mortem and device OOMs are
    /// what is diagnosed.
    #[arg(long, value_name = "REPORT.json")]
    report: Option<PathBuf>,
    /// The PyTorch allocator configuration the job ran with (default: $PYTORCH_CUDA_ALLOC_CONF).
    #[arg(long, value_name = "CONF")]
    alloc_conf: Option<String>,
}

/// The `--json` document.
#[derive(serde::Serialize)]
struct Findings<'a> {
    findings: &'a [memsight_analysis::diagnose::Diagnosis],
}

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("memsight diagnose: {msg}");
    ExitCode::from(2)
}

/// Runs the diagnosis.
pub fn run(a: Args) -> ExitCode {
    let mut ctx = Context::from_env();
    if a.alloc_conf.is_some() {
        ctx.alloc_conf = a.alloc_conf.clone();
    }
    let report = match a.report.as_deref().map(Report::load).transpose() {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    if let Some(r) = &report {
        ctx.leak = r.leak.clone();
        // Remedies that fit the job the report describes (its language, PyTorch, workers).
        ctx.job = Some(memsight_format::job_context::JobContext::of(r));
    }
    let caught = |r: &Report| {
        let path = a
            .report
            .as_deref()
            .unwrap_or(std::path::Path::new("the report"));
        let mut found: Vec<Diagnosis> = postmortem::host_findings(r, &ctx);
        found.extend(
            r.device_ooms
                .iter()
                .map(|o| judge(memsight_analysis::diagnose::device_oom::finding(o), &ctx)),
        );
        (
            format!(
                "the report {} (its post-mortem and the device OOMs it caught)",
                path.display()
            ),
            found,
        )
    };
    // With --report and no log named: a terminal on standard input means there is no log; a piped
    // log with no OOM message (or an empty one) falls back to the OOMs the report caught.
    let found = match (&a.file, &report) {
        (None, Some(r)) if std::io::stdin().is_terminal() => caught(r),
        _ => match read_log(a.file.as_deref(), &ctx) {
            Ok((name, found)) if found.is_empty() && a.file.is_none() => match &report {
                Some(r) => match caught(r) {
                    // Both were read: say so, not only the empty input.
                    (read, none) if none.is_empty() => (format!("{name} or in {read}"), none),
                    judged => judged,
                },
                None => (name, found),
            },
            // A kill the log states of a process the report's post-mortem judged is one finding.
            Ok((name, found)) => match &report {
                Some(r) => (name, postmortem::join_log(found, r, &ctx)),
                None => (name, found),
            },
            Err(e) => return fail(e),
        },
    };
    print(found, a.json)
}

/// Reads the log (`-` or nothing: standard input) and diagnoses it; (its name, the findings).
fn read_log(
    file: Option<&std::path::Path>,
    ctx: &Context,
) -> Result<(String, Vec<Diagnosis>), String> {
    let (name, bytes) = match file {
        None => ("standard input".to_string(), read_stdin()),
        Some(p) if p.as_os_str() == "-" => ("standard input".to_string(), read_stdin()),
        Some(p) => (
            p.display().to_string(),
            input::read(p, input::MAX_LOG_BYTES)
                .map_err(|e| format!("cannot read {}: {e}", p.display())),
        ),
    };
    // Logs may hold stray bytes (progress bars, binary dumps); keep everything readable.
    let text = String::from_utf8_lossy(&bytes?).into_owned();
    Ok((name, diagnose(&text, ctx)))
}

/// Prints the findings; exit 0 when there is one, 1 when none, 2 when the JSON cannot be written.
fn print((name, found): (String, Vec<Diagnosis>), json: bool) -> ExitCode {
    let out = if json {
        // Serialized directly, not through `serde_json::Value`: facts may pass u64 (a 2^64-byte
        // size), which a `Value` cannot hold.
        match serde_json::to_string_pretty(&Findings { findings: &found }) {
            Ok(s) => s + "\n",
            Err(e) => return fail(format!("cannot write JSON: {e}")),
        }
    } else if found.is_empty() {
        format!("memsight diagnose: no out-of-memory message found in {name}\n")
    } else {
        let n = found.len();
        let mut s = format!(
            "memsight diagnose: {n} out-of-memory message{} in {name}\n\n",
            if n == 1 { "" } else { "s" }
        );
        for (i, d) in found.iter().enumerate() {
            s.push_str(&render(d, i + 1));
            s.push('\n');
        }
        s
    };
    // A closed pipe (`| head`) is not an error worth a message.
    // Log lines may carry terminal escape sequences (the JSON escapes its own).
    let out = if json {
        out
    } else {
        text::block(&out).into_owned()
    };
    let _ = std::io::stdout().lock().write_all(out.as_bytes());
    if found.is_empty() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn read_stdin() -> Result<Vec<u8>, String> {
    input::read_limited(std::io::stdin().lock(), input::MAX_LOG_BYTES, 0)
        .map_err(|e| format!("cannot read standard input: {e}"))
}
