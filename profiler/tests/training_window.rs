//! `memsight::end_training` in a Rust program: the report's training window holds the exact heap
//! peak up to the call, the step then running ends, what follows is the `shutdown` phase (its
//! allocations are not the last step's), and a second session in the process starts with no
//! window of the first's.

use std::hint::black_box;
use std::path::PathBuf;

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

const MIB: u64 = 1 << 20;

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("memsight-training-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Allocates `mib` MiB and touches every page.
fn hold(mib: u64) -> Vec<u8> {
    let mut v = vec![0u8; (mib * MIB) as usize];
    for i in (0..v.len()).step_by(4096) {
        v[i] = 1;
    }
    black_box(v)
}

#[test]
fn the_training_window_ends_at_end_training_and_a_second_session_has_none() {
    let dir = scratch("window");
    let session = memsight::Session::builder()
        .report_path(dir.join("first.json"))
        .quiet()
        .start()
        .unwrap();
    let mut kept = Vec::new();
    for n in 0..4 {
        session.step(n);
        kept.push(hold(8));
    }
    assert!(memsight::end_training());
    assert!(
        !memsight::end_training(),
        "only the first call ends training"
    );
    let teardown = hold(96);
    drop(teardown);
    let r = session.finish().unwrap();
    let w = r.training.as_ref().expect("a training window");
    assert_eq!(w.ended_by, "end_training");
    assert_eq!(w.last_step, Some(3));
    assert!(
        (32 * MIB..80 * MIB).contains(&w.heap_peak_bytes),
        "window peak {} MiB",
        w.heap_peak_bytes >> 20
    );
    assert!(r.peaks.heap_peak_bytes > w.heap_peak_bytes + 90 * MIB);
    assert_eq!(r.peaks.heap_peak_phase.as_deref(), Some("shutdown"));
    let last = r.steps.last().unwrap();
    assert_eq!(last.step, 3);
    assert!(
        last.peak_bytes < 80 * MIB,
        "last step {} MiB",
        last.peak_bytes >> 20
    );
    let gated = r.within_training();
    assert_eq!(gated.peaks.heap_peak_bytes, w.heap_peak_bytes);
    assert!(gated.phases.iter().all(|p| p.path != "shutdown"));
    drop(kept);

    let second = memsight::Session::builder()
        .report_path(dir.join("second.json"))
        .quiet()
        .start()
        .unwrap();
    second.step(0);
    let r2 = second.finish().unwrap();
    assert!(r2.training.is_none(), "{:?}", r2.training);
    assert!(r2.phases.iter().all(|p| p.path != "shutdown"));
    let _ = std::fs::remove_dir_all(&dir);
}
