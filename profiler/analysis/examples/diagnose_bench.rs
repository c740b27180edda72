//! Times `memsight_analysis::diagnose` on logs of N OOM messages (the corpus's messages in turn, each with
//! a log prefix and a traceback between them), for N given on the command line (default 16000
//! and 100000). Prints one line per size: messages, bytes, findings, seconds.
//!
//! `cargo run --release -p memsight --example diagnose_bench [N…]`

use memsight_analysis::diagnose::{diagnose, Context};
use std::time::Instant;

fn main() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/oom-corpus");
    let mut texts = Vec::new();
    for file in ["cases.jsonl", "traps.jsonl"] {
        let body = match std::fs::read_to_string(format!("{dir}/{file}")) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("diagnose_bench: cannot read {dir}/{file}: {e}");
                std::process::exit(2);
            }
        };
        for line in body.lines().filter(|l| !l.trim().is_empty()) {
            let v: serde_json::Value = match serde_json::from_str(line) {
                Ok(v) => v,
                Err(e) => {
                    eprintln!("diagnose_bench: bad corpus line in {file}: {e}");
                    std::process::exit(2);
                }
            };
            if let Some(t) = v["text"].as_str() {
                texts.push(t.to_string());
            }
        }
    }
    let sizes: Vec<usize> = match std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(v) if !v.is_empty() => v,
        Ok(_) => vec![16_000, 100_000],
        Err(e) => {
            eprintln!("diagnose_bench: sizes must be counts of messages: {e}");
            std::process::exit(2);
        }
    };
    println!("messages\tbytes\tfindings\tseconds");
    for n in sizes {
        let mut log = String::new();
        for i in 0..n {
            log.push_str(&format!(
                "2026-11-21 10:00:00 step {i} loss 2.31\n[rank0]: "
            ));
            log.push_str(&texts[i % texts.len()]);
            log.push_str("\nTraceback (most recent call last):\n  File \"train.py\", line 1\n\n");
        }
        let t = Instant::now();
        let found = diagnose(&log, &Context::default());
        let s = t.elapsed().as_secs_f64();
        println!("{n}\t{}\t{}\t{s:.2}", log.len(), found.len());
    }
}
