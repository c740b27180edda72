//! Cost of a job made of short-lived helpers under `memsight run`: a bash loop that runs `$(date)`
//! 200 times, alone and under `memsight run` (every process carries the preloaded library), in
//! interleaved rounds. The loop times itself, so the figure is the job's own time (not the
//! sidecar's start-up or report). Prints each round's ms both ways and the median ratio.
//!
//! `helper-bench [ROUNDS]` (default 15). Needs the release `memsight` and the preloaded library
//! (make bench builds them).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The loop; prints its own elapsed nanoseconds last.
const LOOP: &str = "s=$(date +%s%N); for i in $(seq 200); do x=$(date); done; e=$(date +%s%N); \
                    echo $((e - s))";

fn elapsed_ms(out: &[u8]) -> Option<f64> {
    let text = String::from_utf8_lossy(out);
    let ns: f64 = text.lines().last()?.trim().parse().ok()?;
    Some(ns / 1e6)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(15);
    let dir: PathBuf = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    let memsight = dir.join("memsight");
    let report =
        std::env::temp_dir().join(format!("memsight-helper-bench-{}.json", std::process::id()));
    let (mut bare, mut under, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        let b = Command::new("bash")
            .args(["-c", LOOP])
            .stderr(Stdio::null())
            .output()
            .ok()
            .and_then(|o| elapsed_ms(&o.stdout));
        let u = Command::new(&memsight)
            .args(["run", "--report"])
            .arg(&report)
            .args(["--", "bash", "-c", LOOP])
            .stderr(Stdio::null())
            .output()
            .ok()
            .and_then(|o| elapsed_ms(&o.stdout));
        let (Some(b), Some(u)) = (b, u) else {
            eprintln!("round {round}: a run failed (is `memsight` built?)");
            std::process::exit(1);
        };
        println!(
            "round {round:>2}: bare {b:7.1} ms   under memsight run {u:7.1} ms   {:.3}×",
            u / b
        );
        bare.push(b);
        under.push(u);
        ratios.push(u / b);
    }
    let _ = std::fs::remove_file(&report);
    println!(
        "200 short helpers ($(date) in a bash loop), {rounds} interleaved rounds: bare median {:.1} ms, \
         under memsight run {:.1} ms; median of per-round ratios {:.3}× (target ≤ 1.05×)",
        median(&mut bare),
        median(&mut under),
        median(&mut ratios)
    );
}
