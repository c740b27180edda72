//! Fuzzing the OOM parser and verdict engine with proptest: arbitrary text, and corpus messages cut,
//! spliced, re-wrapped and mixed with noise, never panic, and every finding serializes.
//! `PROPTEST_CASES=N` raises the number of executions per property (default 16384).

use memsight_analysis::diagnose::{diagnose, Context};
use proptest::prelude::*;
use std::path::PathBuf;
use std::sync::LazyLock;

static TEXTS: LazyLock<Vec<String>> = LazyLock::new(|| {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/oom-corpus");
    ["cases.jsonl", "traps.jsonl", "wild.jsonl"]
        .iter()
        .flat_map(|f| {
            std::fs::read_to_string(dir.join(f))
                .unwrap()
                .lines()
                .map(|l| {
                    let v: serde_json::Value = serde_json::from_str(l).unwrap();
                    v["text"].as_str().unwrap().to_string()
                })
                .collect::<Vec<_>>()
        })
        .collect()
});

fn check(text: &str) {
    let ctx = Context::default();
    for d in diagnose(text, &ctx) {
        serde_json::to_string(&d).unwrap();
        assert!(!d.remedies.is_empty(), "a finding without remedies: {d:?}");
    }
}

/// Cuts `s` at a char boundary at or below `at`.
fn floor(s: &str, at: usize) -> usize {
    let mut i = at.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(16384),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbitrary_text_never_panics(s in "\\PC{0,400}") {
        check(&s);
    }

    #[test]
    fn oom_shaped_noise_never_panics(
        parts in prop::collection::vec(
            prop_oneof![
                Just("CUDA out of memory. Tried to allocate ".to_string()),
                Just("GPU 0 has a total capacity of ".to_string()),
                Just(" of which ".to_string()),
                Just("Process 12 has ".to_string()),
                Just("memory allocation of ".to_string()),
                Just("Killed process 1 (".to_string()),
                Just("oom-kill:".to_string()),
                Just(" bytes failed".to_string()),
                Just("99999999999999999999999999999999.99 GiB".to_string()),
                Just("(GPU 0; ".to_string()),
                "[0-9]{1,30}(\\.[0-9]{1,4})? ?(bytes|KiB|MiB|GiB|kB|B)",
                "[ -~\\n]{0,20}",
            ],
            0..24,
        )
    ) {
        check(&parts.concat());
    }

    #[test]
    fn mutated_corpus_messages_never_panic(
        i in 0usize..1000, j in 0usize..1000,
        cut in 0usize..4000, splice in 0usize..4000,
        noise in "\\PC{0,40}", wrap in 1usize..120,
    ) {
        let texts = &*TEXTS;
        let a = &texts[i % texts.len()];
        let b = &texts[j % texts.len()];
        // Truncated, spliced into another message, noise inserted, hard-wrapped.
        let cut_a = &a[..floor(a, cut)];
        let at = floor(b, splice);
        let spliced = format!("{}{cut_a}{noise}{}", &b[..at], &b[at..]);
        let wrapped: String = spliced
            .chars()
            .enumerate()
            .flat_map(|(k, c)| (k > 0 && k % wrap == 0).then_some('\n').into_iter().chain([c]))
            .collect();
        check(&spliced);
        check(&wrapped);
    }
}
