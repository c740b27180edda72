//! Cost of a job made of short-lived helpers under `memsight run`: a bash loop that runs `$(date)`
//! 200 times, alone and under `memsight run` (every process carries the preloaded library), in
//! interleaved rounds. The loop times itself, so the figure is the job's own time (not the
//! sidecar's start-up or report). Prints each round's ms both ways and the median ratio, and the
//! page faults per helper (the whole tree's minor faults, the sidecar's included under `memsight
//! run`): a count that a busy machine does not blur as it blurs times.
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

/// Runs `cmd` (ending in `/usr/bin/time -f %R -o <faults> bash -c LOOP`) and returns the loop's
/// elapsed ms and its tree's minor page faults per helper (GNU time's count of the loop's shell
/// and every process it waited for).
fn run(cmd: &mut Command, faults: &Path) -> Option<(f64, f64)> {
    let out = cmd.stderr(Stdio::null()).output().ok()?;
    let text = std::fs::read_to_string(faults).ok()?;
    let count: f64 = text.lines().last()?.trim().parse().ok()?;
    Some((elapsed_ms(&out.stdout)?, count / HELPERS))
}

/// Appends the loop, counted by GNU time into `faults`, to `cmd`.
fn timed<'a>(cmd: &'a mut Command, faults: &Path) -> &'a mut Command {
    cmd.args(["/usr/bin/time", "-f", "%R", "-o"])
        .arg(faults)
        .args(["bash", "-c", LOOP])
}

/// Helpers the loop runs (and two more `date`s that time it).
const HELPERS: f64 = 200.0;

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
    let faults = std::env::temp_dir().join(format!(
        "memsight-helper-bench-{}.faults",
        std::process::id()
    ));
    let (mut bare, mut under, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let (mut bare_faults, mut under_faults) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        let b = run(timed(&mut Command::new("env"), &faults), &faults);
        let mut job = Command::new(&memsight);
        job.args(["run", "--report"]).arg(&report).arg("--");
        let u = run(timed(&mut job, &faults), &faults);
        let (Some((b, bf)), Some((u, uf))) = (b, u) else {
            eprintln!("round {round}: a run failed (is `memsight` built?)");
            std::process::exit(1);
        };
        println!(
            "round {round:>2}: bare {b:7.1} ms, {bf:5.1} faults/helper   under memsight run {u:7.1} \
             ms, {uf:5.1} faults/helper   {:.3}×",
            u / b
        );
        bare.push(b);
        under.push(u);
        ratios.push(u / b);
        bare_faults.push(bf);
        under_faults.push(uf);
    }
    let _ = std::fs::remove_file(&report);
    let _ = std::fs::remove_file(&faults);
    println!(
        "200 short helpers ($(date) in a bash loop), {rounds} interleaved rounds: bare median {:.1} ms, \
         under memsight run {:.1} ms; median of per-round ratios {:.3}× (target ≤ 1.05×); page \
         faults per helper: bare {:.1}, under memsight run {:.1}",
        median(&mut bare),
        median(&mut under),
        median(&mut ratios),
        median(&mut bare_faults),
        median(&mut under_faults)
    );
}
