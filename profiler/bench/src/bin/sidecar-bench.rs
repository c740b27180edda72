//! Cost of watching a job from outside: the demo training job (examples/train_mlp) alone and under
//! `memsight run --interval 100ms` (10 Hz), interleaved; prints the job's ms/step both ways and the
//! sidecar's own CPU use (utime + stime from /proc over its lifetime) as a share of one core.
//!
//! `sidecar-bench [STEPS] [ROUNDS]` (default 1600 steps ≈ 1 minute, 2 rounds). Needs the release
//! binaries `memsight` and `examples/train_mlp` (make bench builds them).

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

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let steps: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1600);
    let rounds: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2);
    let dir: PathBuf = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    let job = dir.join("examples/train_mlp");
    let memsight = dir.join("memsight");
    let tmp = std::env::temp_dir();
    let report = tmp.join(format!(
        "memsight-sidecar-bench-{}.json",
        std::process::id()
    ));
    let (mut alone, mut watched, mut cpu) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        eprintln!("round {round}/{rounds}");
        let out = Command::new(&job)
            .arg(steps.to_string())
            .arg(&report)
            .stderr(Stdio::null())
            .output()
            .expect("train_mlp runs");
        alone.extend(ms_per_step(&String::from_utf8_lossy(&out.stdout)));

        let child = Command::new(&memsight)
            .args(["run", "--interval", "100ms", "--report"])
            .arg(&report)
            .arg("--")
            .arg(&job)
            .arg(steps.to_string())
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
        if let Ok(Ok(out)) = reader.join() {
            watched.extend(ms_per_step(&String::from_utf8_lossy(&out.stdout)));
        }
        if last.1 > Duration::ZERO {
            cpu.push(100.0 * last.0 / last.1.as_secs_f64());
        }
    }
    let _ = std::fs::remove_file(&report);
    let med = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let (a, w) = (med(alone.clone()), med(watched.clone()));
    println!("job ms/step alone {alone:?} → median {a:.1}; under memsight run {watched:?} → median {w:.1} ({:.3}×)", w / a);
    println!("sidecar CPU at 10 Hz: {cpu:.3?} % of one core (target ≤ 1%)");
}
