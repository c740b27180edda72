//! Runs every allocator variant on every workload in interleaved rounds (separate processes, since
//! the global allocator is per binary), takes medians and prints the ratio table.
//!
//! `alloc-bench [ROUNDS]` (default 7). Needs the sibling binaries `churn-*` (make bench builds them)
//! and `heaptrack` on PATH (skipped with a note when missing). `memsight` is the accounting alone
//! (heap sampling off), `memsight sampling` memsight as a job's session runs it (one sample per
//! 512 KiB).

use std::path::{Path, PathBuf};
use std::process::Command;

struct Variant {
    name: &'static str,
    bin: &'static str,
    heaptrack: bool,
    ops: usize,
    /// `MEMSIGHT_HEAP_SAMPLE` for the run (memsight's heap sampler), else the caller's is removed.
    heap_sample: Option<&'static str>,
}

fn run(dir: &Path, v: &Variant, workload: &str, threads: usize) -> Option<f64> {
    let bin = dir.join(v.bin);
    let args = [workload.to_string(), threads.to_string(), v.ops.to_string()];
    let out = if v.heaptrack {
        let trace =
            std::env::temp_dir().join(format!("memsight-bench-heaptrack-{}", std::process::id()));
        let o = Command::new("heaptrack")
            .arg("-o")
            .arg(&trace)
            .arg(&bin)
            .args(&args)
            .output()
            .ok()?;
        for ext in ["", ".zst", ".gz"] {
            let _ = std::fs::remove_file(format!("{}{ext}", trace.display()));
        }
        o
    } else {
        let mut c = Command::new(&bin);
        match v.heap_sample {
            Some(rate) => c.env("MEMSIGHT_HEAP_SAMPLE", rate),
            None => c.env_remove("MEMSIGHT_HEAP_SAMPLE"),
        };
        c.args(&args).output().ok()?
    };
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("ns_per_op="))
        .and_then(|v| v.trim().parse().ok())
}

/// Median of the finite values (NaN when there are none).
fn median(mut v: Vec<f64>) -> f64 {
    v.retain(|x| x.is_finite());
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        f64::NAN
    } else {
        v[v.len() / 2]
    }
}

/// Median over rounds of the ratio `a / b` within each round: runs of one round are seconds apart,
/// so this cancels the machine's slow drift that a ratio of medians keeps.
fn round_ratio(a: &[f64], b: &[f64]) -> f64 {
    median(a.iter().zip(b).map(|(x, y)| x / y).collect())
}

fn main() {
    let rounds: usize = match std::env::args().nth(1).map(|a| a.parse()) {
        None => 7,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("usage: alloc-bench [ROUNDS]   (ROUNDS: a positive number of rounds)");
            std::process::exit(2);
        }
    };
    let dir: PathBuf = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    let have_heaptrack = Command::new("heaptrack").arg("--version").output().is_ok();
    let mut variants = vec![
        Variant {
            name: "jemalloc",
            bin: "churn-jemalloc",
            heaptrack: false,
            ops: 2_000_000,
            heap_sample: None,
        },
        Variant {
            name: "memsight",
            bin: "churn-memsight",
            heaptrack: false,
            ops: 2_000_000,
            heap_sample: Some("off"),
        },
        Variant {
            name: "memsight sampling",
            bin: "churn-memsight",
            heaptrack: false,
            ops: 2_000_000,
            heap_sample: Some("512KiB"),
        },
        Variant {
            name: "glibc",
            bin: "churn-system",
            heaptrack: false,
            ops: 2_000_000,
            heap_sample: None,
        },
        Variant {
            name: "dhat-rs",
            bin: "churn-dhat",
            heaptrack: false,
            ops: 200_000,
            heap_sample: None,
        },
    ];
    if have_heaptrack {
        variants.push(Variant {
            name: "heaptrack",
            bin: "churn-system",
            heaptrack: true,
            ops: 200_000,
            heap_sample: None,
        });
    } else {
        eprintln!("heaptrack not found on PATH: its column is skipped (Debian: apt-get install heaptrack)");
    }
    for v in &variants {
        if !dir.join(v.bin).exists() {
            eprintln!("{} missing in {}: run `make bench`", v.bin, dir.display());
            std::process::exit(2);
        }
    }
    let cases = [
        ("box32", 1),
        ("batch1000", 1),
        ("mixed", 1),
        ("box32", 2),
        ("batch1000", 2),
        ("mixed", 2),
    ];
    let mut samples = vec![vec![Vec::new(); variants.len()]; cases.len()];
    for round in 0..rounds {
        eprintln!("round {}/{rounds}", round + 1);
        for (ci, (w, t)) in cases.iter().enumerate() {
            for (vi, v) in variants.iter().enumerate() {
                // A failed run stays as NaN, so every variant keeps one entry per round.
                samples[ci][vi].push(run(&dir, v, w, *t).unwrap_or(f64::NAN));
            }
        }
    }
    let idx = |n: &str| variants.iter().position(|v| v.name == n);
    println!("\nns per alloc+free (median of {rounds} interleaved rounds; in parentheses the median over rounds of the ratio to the allocator underneath, from the same round)\n");
    print!("| workload | threads |");
    for v in &variants {
        print!(" {} |", v.name);
    }
    println!(" heaptrack ÷ memsight overhead (relative; ns added) | dhat ÷ memsight overhead (relative; ns added) |");
    println!("|---|---|{}---|---|", "---|".repeat(variants.len()));
    for (ci, (w, t)) in cases.iter().enumerate() {
        let m: Vec<f64> = samples[ci].iter().map(|s| median(s.clone())).collect();
        let je = m[idx("jemalloc").unwrap_or(0)];
        let gl = m[idx("glibc").unwrap_or(0)];
        print!("| {w} | {t} |");
        for (vi, v) in variants.iter().enumerate() {
            // The allocator underneath each variant.
            let base = match v.name {
                "memsight" | "memsight sampling" | "glibc" => idx("jemalloc"),
                "heaptrack" | "dhat-rs" => idx("glibc"),
                _ => None,
            };
            match base {
                Some(b) => {
                    let r = round_ratio(&samples[ci][vi], &samples[ci][b]);
                    print!(" {:.1} ({:.2}×) |", m[vi], r);
                }
                None => print!(" {:.1} |", m[vi]),
            }
        }
        // Overhead two ways: relative to each tool's own allocator underneath (heaptrack and dhat
        // run over glibc, memsight over jemalloc), and as nanoseconds added per alloc+free.
        let ms = m[idx("memsight").unwrap_or(0)];
        let ms_over = ms / je - 1.0;
        let ms_added = ms - je;
        let ratio = |name: &str| match idx(name) {
            Some(i) => {
                let (over, added) = (m[i] / gl - 1.0, m[i] - gl);
                if ms_over <= 0.005 || ms_added <= 0.05 {
                    format!("> {:.0}× (memsight within noise)", over / 0.005)
                } else {
                    format!("{:.0}×; {:.0}×", over / ms_over, added / ms_added)
                }
            }
            None => "n/a".into(),
        };
        println!(" {} | {} |", ratio("heaptrack"), ratio("dhat-rs"));
    }
}
