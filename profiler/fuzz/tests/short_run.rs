//! A short run of every fuzz target (part of `make test`): no input may make a parser panic.
//! `make fuzz` runs each for a million executions.

use memsight_fuzz::{run, Target};

#[test]
fn every_parser_survives_a_short_fuzz_run() {
    for t in Target::ALL {
        let out = run(t, 3_000, 7);
        assert_eq!(out.executions, 3_000);
        assert!(
            out.crashes.is_empty(),
            "{}: {} crashes, first: {}",
            t.name(),
            out.crashes.len(),
            out.crashes[0].1
        );
        // The seeds themselves parse, so the mutations start from inputs that go deep.
        assert!(out.accepted > 0, "{}: nothing was accepted", t.name());
    }
}
