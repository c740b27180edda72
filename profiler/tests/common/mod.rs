//! Shared by the allocator tests.

use std::time::{Duration, Instant};

/// Heap statistics once Rust's live bytes are back at `target`, or after 10 s: a joined thread may still
/// run its thread-local destructors (frees) for a moment after `join` returns, so a baseline must
/// come back soon, not necessarily at once. Rust's share, because glibc keeps C allocations of
/// its own across thread exits (thread-control blocks it caches for reuse).
pub fn settled_at(target: u64) -> memsight::HeapStats {
    let t = Instant::now();
    let mut s = memsight::stats();
    while s.rust_live_bytes != target && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
        s = memsight::stats();
    }
    s
}

/// Heap statistics to measure from at a test's start, read after a pause: the test harness's
/// main thread records the test it just started (a queue entry with the test's name, about
/// 900 bytes it keeps) right after starting it, which would otherwise land between a baseline and
/// the end of the test.
pub fn baseline() -> memsight::HeapStats {
    std::thread::sleep(Duration::from_millis(200));
    memsight::stats()
}
