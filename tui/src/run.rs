//! `memsight run [--report PATH] [--interval D] -- CMD ARGS…`: runs a job under the sidecar and
//! writes its report with a post-mortem; exits with the job's code (128 + signal when killed).

/// `eprintln!` that never panics: with `--live` the terminal may be gone (its pty closed) while
/// the job still runs, and its report must still be written.
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

use memsight_format::text;
use memsight_format::units::fmt_bytes;
use memsight_sidecar::{
    attach as attach_to, run as run_job, AttachOptions, HeapSampling, RunOptions,
};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// What `run` and `attach` share: where the report goes, how often to sample, metrics.
#[derive(clap::Args)]
pub struct Watching {
    /// Where to write the report (`-`: standard output). Checked before the job starts: it must be
    /// a regular file or absent, in a directory memsight can write.
    #[arg(long, default_value = "memsight-report.json")]
    report: PathBuf,
    /// Sampling interval (`100ms`, `1s`, or milliseconds): the job's under `run`; the sidecar's
    /// own for a process without memsight under `attach`.
    #[arg(long, default_value = "100ms", value_parser = parse_interval)]
    interval: Duration,
    /// Serve Prometheus metrics at ADDR (e.g. 127.0.0.1:9464 or localhost:9464; port 0 picks one).
    #[arg(long, value_name = "ADDR", value_parser = memsight_sidecar::metrics::parse_addr)]
    metrics: Option<std::net::SocketAddr>,
}

/// Runs a job with memsight switched on and watches it from outside.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    watching: Watching,
    /// Open the live viewer in this terminal; the job's output goes to REPORT's name + `.log`.
    #[arg(long)]
    live: bool,
    /// Mean bytes between heap samples (allocation sites) [default: MEMSIGHT_HEAP_SAMPLE when
    /// set, else 512KiB]. The profiles go to REPORT's name + `.heap/`.
    #[arg(long, value_parser = parse_sample, value_name = "SIZE")]
    heap_sample: Option<u64>,
    /// Start the job with heap sampling off (no allocation sites in the report unless switched on
    /// with `memsight heap sampling on PID`).
    #[arg(long)]
    no_heap_profile: bool,
    /// Do not preload memsight into a job that does not link it (a Python or C++ program): it is
    /// then sampled from outside only (RSS, no heap, no steps).
    #[arg(long)]
    no_preload: bool,
    /// Count the job's device memory through CUPTI: every `cuMemAlloc`/`cuMemFree`-family call of
    /// any library (candle, cudarc, CuPy, libtorch) in a job that does not link memsight, with no
    /// change to its code (CUDA's injection interface; `libcupti` must be on LD_LIBRARY_PATH or in
    /// MEMSIGHT_CUPTI_LIB). Counts the process that carries the session (not the processes it
    /// spawns; a job that links memsight uses memsight-integrations' `cupti` feature instead).
    /// Off by default: CUPTI has one subscriber per process, which PyTorch's and Nsight's
    /// profilers also want.
    #[arg(long, conflicts_with = "no_preload")]
    cupti: bool,
    /// Do not mark steps and phases in a PyTorch job automatically (by default a job that imports
    /// torch gets its steps from the optimizer and the phases forward, backward, optimizer, data
    /// and eval from PyTorch's global hooks; a job's own `memsight.step`/`phase` calls take over).
    #[arg(long)]
    no_auto_steps: bool,
    /// In a PyTorch job, turn on PyTorch's allocator history with Python stacks (bounded to
    /// MEMSIGHT_DEVICE_HISTORY_ENTRIES actions, 100000) and report which Python lines hold the
    /// device memory at each device's peak and at an OOM. Costs about 2 µs per device allocation
    /// (PyTorch's figure) and a read of the history each time the allocator's peak grows 5%.
    #[arg(long)]
    device_history: bool,
    /// The job: `-- CMD ARGS…`.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<OsString>,
}

/// Watches a running process until it ends (or Ctrl-C), then writes its report.
#[derive(clap::Args)]
pub struct AttachArgs {
    /// The process id.
    pid: u32,
    #[command(flatten)]
    watching: Watching,
}

/// Attaches; exit 0 once the report is written, 2 when there is no such process.
pub fn attach(a: AttachArgs) -> ExitCode {
    let w = a.watching;
    let opts = AttachOptions {
        pid: a.pid,
        report: w.report,
        interval: w.interval,
        metrics: w.metrics,
    };
    // A pid that cannot be watched is said before anything claims to watch it.
    if let Err(e) = memsight_sidecar::attachable(opts.pid) {
        say!("memsight attach: {}", text::line(&e.to_string()));
        return ExitCode::from(2);
    }
    say!(
        "memsight · watching process {} (Ctrl-C to detach)",
        opts.pid
    );
    match attach_to(&opts) {
        Ok(outcome) => finish(&outcome, &opts.report),
        Err(e) => {
            say!("memsight attach: {}", text::line(&e.to_string()));
            ExitCode::from(2)
        }
    }
}

/// Prints the post-mortem and where the report went (or why it did not); the job's exit code
/// either way.
fn finish(outcome: &memsight_sidecar::RunOutcome, report: &std::path::Path) -> ExitCode {
    // The post-mortem quotes the job's command line and phase names: escaped, like every line here.
    let line = |s: &dyn std::fmt::Display| text::line(&s.to_string()).into_owned();
    if let Some(pm) = &outcome.report.post_mortem {
        say!("memsight · {}", line(&pm.description));
        for f in &pm.findings {
            say!(
                "memsight · verdict {}: {}",
                line(&f.verdict),
                line(&f.evidence)
            );
            if let Some(first) = f.remedies.first() {
                say!("memsight · first remedy: {}", line(first));
            }
        }
    }
    // Device memory by Python line (`--device-history`): where each device's peak was.
    for l in &outcome.report.device_lines {
        say!(
            "memsight · cuda:{} at its peak, {} allocated: {}",
            l.device,
            fmt_bytes(l.live_bytes),
            line(&l.top_text(3))
        );
    }
    for (rank, e) in &outcome.rank_errors {
        say!(
            "memsight: rank {rank}'s report was not written: {}",
            line(e)
        );
    }
    match &outcome.report_error {
        Some(e) => say!("memsight: the report was not written: {}", line(e)),
        None if memsight_sidecar::to_stdout(report) => {}
        None => {
            say!(
                "memsight · report written to {}",
                line(&outcome.report_path.display())
            );
            for r in &outcome.report.ranks {
                if let Some(p) = &r.report {
                    say!("memsight · {} report written to {}", r.role_text(), line(p));
                }
            }
        }
    }
    ExitCode::from(outcome.exit_code.clamp(0, 255) as u8)
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
    let ms = num
        .trim()
        .parse::<u64>()
        .ok()
        .and_then(|v| v.checked_mul(scale));
    match ms {
        Some(ms) if (1..=3_600_000).contains(&ms) => Ok(Duration::from_millis(ms)),
        _ => Err(format!(
            "`{s}` is not an interval between 1ms and 1h (e.g. 100ms, 1s)"
        )),
    }
}

fn parse_sample(s: &str) -> Result<u64, String> {
    match memsight_format::units::parse_size(s) {
        Ok(n) if (4096..=(1 << 40)).contains(&n) => Ok(n),
        Ok(_) => Err(format!("`{s}` is outside 4KiB..1TiB")),
        Err(e) => Err(e.to_string()),
    }
}

/// The job's heap sampling: a flag given, else the environment's `MEMSIGHT_HEAP_SAMPLE` (the
/// job's session reads it), else one sample per 512 KiB.
fn heap_sampling(off: bool, every: Option<u64>) -> HeapSampling {
    match (off, every) {
        (true, _) => HeapSampling::Off,
        (false, Some(b)) => HeapSampling::Every(b),
        (false, None) if std::env::var_os("MEMSIGHT_HEAP_SAMPLE").is_some() => {
            HeapSampling::Inherited
        }
        (false, None) => HeapSampling::Every(512 << 10),
    }
}

/// Runs the job; the exit code is the job's.
pub fn run(a: Args) -> ExitCode {
    use std::io::IsTerminal;
    let live = a.live && std::io::stdout().is_terminal() && std::io::stdin().is_terminal();
    if a.live && !live {
        say!("memsight · --live needs a terminal; running headless");
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let w = a.watching;
    let log = live.then(|| {
        if memsight_sidecar::to_stdout(&w.report) {
            PathBuf::from("memsight-report.log")
        } else {
            w.report.with_extension("log")
        }
    });
    let mut opts = RunOptions {
        command: a.command,
        report: w.report,
        interval: w.interval,
        metrics: w.metrics,
        job_output: log.clone(),
        heap_sampling: heap_sampling(a.no_heap_profile, a.heap_sample),
        on_spawn: live.then_some(tx),
        preload: !a.no_preload,
        cupti: a.cupti,
        auto_steps: !a.no_auto_steps,
        device_history: a.device_history,
    };
    let result = if live {
        // The sidecar's thread holds the only sender: when it fails before the job starts, it
        // drops it, `recv` returns, and its error is printed below (a sender kept here would
        // leave `recv` waiting forever).
        let sidecar = {
            let for_sidecar = opts.clone();
            opts.on_spawn = None;
            std::thread::spawn(move || run_job(&for_sidecar))
        };
        // The viewer runs while the job does; closing it leaves the job running to its end.
        if let Ok(pid) = rx.recv() {
            match memsight_sidecar::server::socket_path(pid) {
                Ok(socket) => {
                    let t = std::time::Instant::now();
                    while !socket.exists() && t.elapsed() < Duration::from_secs(5) {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    let _ = crate::top::live(&socket);
                }
                Err((p, e)) => say!("memsight: no viewer: {}: {e}", p.display()),
            }
            say!("memsight · viewer closed; waiting for the job to end");
            if let Some(l) = &log {
                say!("memsight · the job's output is in {}", l.display());
            }
        }
        match sidecar.join() {
            Ok(r) => r,
            Err(_) => {
                say!("memsight run: the sidecar thread failed; the job's report may be missing");
                return ExitCode::from(2);
            }
        }
    } else {
        run_job(&opts)
    };
    match result {
        Ok(outcome) => finish(&outcome, &opts.report),
        Err(e) => {
            say!("memsight run: {}", text::line(&e.to_string()));
            ExitCode::from(match e {
                memsight_sidecar::SidecarError::Spawn(..) => 127,
                _ => 2,
            })
        }
    }
}
