//! `memsight run [--report PATH] [--interval D] -- CMD ARGS…`: runs a job under the sidecar and
//! writes its report with a post-mortem; exits with the job's code (128 + signal when killed).

use memsight::sidecar::{run as run_job, RunOptions};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Runs a job with memsight switched on and watches it from outside.
#[derive(clap::Args)]
pub struct Args {
    /// Where to write the report.
    #[arg(long, default_value = "memsight-report.json")]
    report: PathBuf,
    /// Sampling interval of the job (`100ms`, `1s`, or milliseconds).
    #[arg(long, default_value = "100ms", value_parser = parse_interval)]
    interval: Duration,
    /// The job: `-- CMD ARGS…`.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<OsString>,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1000)
    } else {
        (t, 1)
    };
    match num.trim().parse::<u64>() {
        Ok(v) if v * scale >= 1 && v * scale <= 3_600_000 => Ok(Duration::from_millis(v * scale)),
        _ => Err(format!(
            "`{s}` is not an interval between 1ms and 1h (e.g. 100ms, 1s)"
        )),
    }
}

/// Runs the job; the exit code is the job's.
pub fn run(a: Args) -> ExitCode {
    let opts = RunOptions {
        command: a.command,
        report: a.report,
        interval: a.interval,
    };
    match run_job(&opts) {
        Ok(outcome) => {
            if let Some(pm) = &outcome.report.post_mortem {
                eprintln!("memsight · {}", pm.description);
                for f in &pm.findings {
                    eprintln!("memsight · verdict {}: {}", f.verdict, f.evidence);
                    if let Some(first) = f.remedies.first() {
                        eprintln!("memsight · first remedy: {first}");
                    }
                }
            }
            eprintln!("memsight · report written to {}", opts.report.display());
            ExitCode::from(outcome.exit_code.clamp(0, 255) as u8)
        }
        Err(e) => {
            eprintln!("memsight run: {e}");
            ExitCode::from(match e {
                memsight::sidecar::SidecarError::Spawn(..) => 127,
                _ => 2,
            })
        }
    }
}
