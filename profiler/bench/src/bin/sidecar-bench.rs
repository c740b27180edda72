//! Cost of watching a job from outside: the sidecar's own CPU use (utime + stime from /proc over
//! its lifetime) as a share of one core, under `memsight run --interval 100ms` (10 Hz).
//!
//! Two jobs: `mlp` (default), the demo training job (examples/train_mlp) alone and watched,
//! interleaved, which also prints the job's ms/step both ways; and `hold4g`, a Python job that
//! holds a 4 GiB dataset shared with two forked DataLoader-style workers at 10 Hz
//! (`profiler/bench/jobs/hold4g.py`, run by `$PYTHON`, else `$VIRTUAL_ENV/bin/python`, else
//! `python3`). Several `--memsight` binaries are run in turn within each round (their order
//! alternating between rounds), so a before/after comparison shares the machine's load.
//!
//! `sidecar-bench [STEPS] [ROUNDS]` (default 1600 steps ≈ 1 minute, 2 rounds), or
//! `sidecar-bench [--job mlp|hold4g] [--steps N] [--seconds S] [--gib G] [--rounds R]
//! [--interval 100ms] [--memsight PATH]...`. Needs the release binaries `memsight` and
//! `examples/train_mlp` (make bench builds them).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn ms_per_step(stdout: &str) -> Option<f64> {
    stdout
        .lines()
        .rev()
        .filter_map(|l| l.split('|').nth(3))
        .filter_map(|f| f.trim().strip_suffix("ms/step"))
        .find_map(|v| v.trim().parse().ok())
}

/// utime + stime of `pid` in seconds.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let f: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    Some(ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64)
}

/// What the command line asked for.
struct Options {
    job: String,
    steps: u64,
    seconds: f64,
    gib: f64,
    rounds: usize,
    interval: String,
    memsight: Vec<PathBuf>,
}

fn options(dir: &Path) -> Options {
    let mut o = Options {
        job: "mlp".into(),
        steps: 1600,
        seconds: 30.0,
        gib: 4.0,
        rounds: 2,
        interval: "100ms".into(),
        memsight: Vec::new(),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut positional = 0;
    let mut i = 0;
    while i < args.len() {
        let value = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--job" => o.job = value,
            "--steps" => o.steps = value.parse().unwrap_or(o.steps),
            "--seconds" => o.seconds = value.parse().unwrap_or(o.seconds),
            "--gib" => o.gib = value.parse().unwrap_or(o.gib),
            "--rounds" => o.rounds = value.parse().unwrap_or(o.rounds),
            "--interval" => o.interval = value,
            "--memsight" => o.memsight.push(PathBuf::from(value)),
            a => {
                match positional {
                    0 => o.steps = a.parse().unwrap_or(o.steps),
                    _ => o.rounds = a.parse().unwrap_or(o.rounds),
                }
                positional += 1;
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    if o.memsight.is_empty() {
        o.memsight.push(dir.join("memsight"));
    }
    o
}

fn python() -> OsString {
    std::env::var_os("PYTHON")
        .or_else(|| {
            std::env::var_os("VIRTUAL_ENV")
                .map(|v| PathBuf::from(v).join("bin/python").into_os_string())
        })
        .unwrap_or_else(|| "python3".into())
}

/// Runs `job` under `memsight run`: the sidecar's CPU share of one core (%) and the job's stdout.
fn watched(memsight: &Path, interval: &str, report: &Path, job: &[OsString]) -> (f64, String) {
    let child = Command::new(memsight)
        .args(["run", "--interval", interval, "--report"])
        .arg(report)
        .arg("--")
        .args(job)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("memsight runs");
    let pid = child.id();
    let t = Instant::now();
    let reader = std::thread::spawn(move || child.wait_with_output());
    let mut last = (0.0, Duration::ZERO);
    while !reader.is_finished() {
        if let Some(c) = cpu_seconds(pid) {
            last = (c, t.elapsed());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let stdout = match reader.join() {
        Ok(Ok(out)) => String::from_utf8_lossy(&out.stdout).into_owned(),
        _ => String::new(),
    };
    let cpu = if last.1 > Duration::ZERO {
        100.0 * last.0 / last.1.as_secs_f64()
    } else {
        f64::NAN
    };
    (cpu, stdout)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() {
    let dir: PathBuf = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    let o = options(&dir);
    let train_mlp = dir.join("examples/train_mlp");
    let report = std::env::temp_dir().join(format!(
        "memsight-sidecar-bench-{}.json",
        std::process::id()
    ));
    let job: Vec<OsString> = match o.job.as_str() {
        "hold4g" => vec![
            python(),
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("jobs/hold4g.py")
                .into_os_string(),
            o.seconds.to_string().into(),
            o.gib.to_string().into(),
        ],
        _ => vec![
            train_mlp.clone().into_os_string(),
            o.steps.to_string().into(),
        ],
    };
    let n = o.memsight.len();
    let (mut alone, mut steps, mut cpu) = (Vec::new(), vec![Vec::new(); n], vec![Vec::new(); n]);
    for round in 1..=o.rounds {
        eprintln!("round {round}/{}", o.rounds);
        if o.job == "mlp" {
            let out = Command::new(&train_mlp)
                .arg(o.steps.to_string())
                .arg(&report)
                .stderr(Stdio::null())
                .output()
                .expect("train_mlp runs");
            alone.extend(ms_per_step(&String::from_utf8_lossy(&out.stdout)));
        }
        for k in 0..n {
            let b = if round % 2 == 0 { n - 1 - k } else { k };
            let (c, stdout) = watched(&o.memsight[b], &o.interval, &report, &job);
            eprintln!("  {}: sidecar {c:.3}% of a core", o.memsight[b].display());
            cpu[b].push(c);
            steps[b].extend(ms_per_step(&stdout));
        }
    }
    let _ = std::fs::remove_file(&report);
    println!(
        "job {} under memsight run --interval {}, {} rounds",
        o.job, o.interval, o.rounds
    );
    for (b, m) in o.memsight.iter().enumerate() {
        if o.job == "mlp" {
            let (a, w) = (median(alone.clone()), median(steps[b].clone()));
            println!(
                "{}: job ms/step alone {alone:?} → median {a:.1}; watched {:?} → median {w:.1} ({:.3}×)",
                m.display(),
                steps[b],
                w / a
            );
        }
        println!(
            "{}: sidecar CPU {:.3?} % of one core → median {:.3}% (target ≤ 1%)",
            m.display(),
            cpu[b],
            median(cpu[b].clone())
        );
    }
}
