//! `memsight diagnose [FILE|-]`: every OOM message in a log, with its facts, a verdict and ranked
//! remedies. Exit 0 when at least one OOM was diagnosed, 1 when none was found, 2 on bad input.

use memsight::diagnose::{diagnose, render, Context};
use memsight::Report;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

/// Reads a log (or `-` for standard input) and diagnoses each OOM message in it.
#[derive(clap::Args)]
pub struct Args {
    /// The log or error text (`-` or nothing: standard input).
    file: Option<PathBuf>,
    /// Print `{"findings": [...]}` as JSON instead of text.
    #[arg(long)]
    json: bool,
    /// The job's memsight report: its per-step leak slope can turn the verdict into `leak`.
    #[arg(long, value_name = "REPORT.json")]
    report: Option<PathBuf>,
    /// The PyTorch allocator configuration the job ran with (default: $PYTORCH_CUDA_ALLOC_CONF).
    #[arg(long, value_name = "CONF")]
    alloc_conf: Option<String>,
}

/// The `--json` document.
#[derive(serde::Serialize)]
struct Findings<'a> {
    findings: &'a [memsight::diagnose::Diagnosis],
}

fn fail(msg: impl std::fmt::Display) -> ExitCode {
    eprintln!("memsight diagnose: {msg}");
    ExitCode::from(2)
}

/// Runs the diagnosis.
pub fn run(a: Args) -> ExitCode {
    let (name, bytes) = match a.file.as_deref() {
        None => ("standard input".to_string(), read_stdin()),
        Some(p) if p.as_os_str() == "-" => ("standard input".to_string(), read_stdin()),
        Some(p) => (
            p.display().to_string(),
            std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display())),
        ),
    };
    let bytes = match bytes {
        Ok(b) => b,
        Err(e) => return fail(e),
    };
    // Logs may hold stray bytes (progress bars, binary dumps); keep everything readable.
    let text = String::from_utf8_lossy(&bytes);
    let mut ctx = Context::from_env();
    if a.alloc_conf.is_some() {
        ctx.alloc_conf = a.alloc_conf;
    }
    if let Some(path) = &a.report {
        match Report::load(path) {
            Ok(r) => ctx.leak = r.leak,
            Err(e) => return fail(e),
        }
    }
    let found = diagnose(&text, &ctx);
    let out = if a.json {
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
    let _ = std::io::stdout().lock().write_all(out.as_bytes());
    if found.is_empty() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

fn read_stdin() -> Result<Vec<u8>, String> {
    let mut b = Vec::new();
    std::io::stdin()
        .read_to_end(&mut b)
        .map_err(|e| format!("cannot read standard input: {e}"))?;
    Ok(b)
}
