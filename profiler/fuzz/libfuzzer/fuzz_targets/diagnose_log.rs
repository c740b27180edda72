//! Fuzzes `memsight diagnose`'s log parser and verdict engine: any bytes (read as the CLI reads a
//! log, lossily as UTF-8) are diagnosed without a panic, and every finding has remedies and
//! serializes to JSON (also with facts past u64).
//!
//! `cargo +nightly fuzz run diagnose_log -- -runs=1000000` from `profiler/fuzz/libfuzzer`; seed it with the
//! corpus texts (`scripts/fuzz-seeds.sh`); counts in docs/benchmarks.md.

#![no_main]

use libfuzzer_sys::fuzz_target;
use memsight_analysis::diagnose::{diagnose, render, Context};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for (i, d) in diagnose(&text, &Context::default()).iter().enumerate() {
        assert!(!d.remedies.is_empty(), "a finding without remedies: {d:?}");
        if let Err(e) = serde_json::to_string(d) {
            panic!("a finding that does not serialize: {e}: {d:?}");
        }
        let _ = render(d, i + 1);
    }
});
