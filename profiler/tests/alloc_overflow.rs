//! Past the 1023 exclusive per-thread slots, further threads share the overflow slot: counting
//! stays exact and a large allocation there still reaches the peak.

mod common;

use std::hint::black_box;

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

fn churn_and_count() {
    for i in 0..200usize {
        let b = black_box(vec![i as u8; 1 + i * 7]);
        drop(b);
    }
    let mut v: Vec<u64> = black_box(Vec::new());
    for i in 0..1000 {
        v.push(i);
    }
    drop(black_box(v));
}

#[test]
fn threads_beyond_the_slot_array_are_counted_exactly() {
    let before = memsight::stats();
    // Slots are never released, so 1100 short-lived threads exhaust the exclusive ones.
    for _ in 0..1100 {
        std::thread::spawn(churn_and_count).join().unwrap();
    }
    let after = common::settled_at(before.live_bytes);
    assert_eq!(after.live_bytes, before.live_bytes, "live bytes drifted");
    assert!(after.allocations - before.allocations >= 1100 * 201);
    assert!(after.deallocations - before.deallocations >= 1100 * 201);
    assert!(after.reallocations - before.reallocations >= 1100);

    // An overflow-slot thread's 32 MiB buffer shows in the peak.
    memsight::reset_peak();
    let base = memsight::stats().live_bytes;
    std::thread::spawn(|| {
        let mut big = vec![0u8; 32 << 20];
        for i in (0..big.len()).step_by(4096) {
            big[i] = 1;
        }
        black_box(&big);
    })
    .join()
    .unwrap();
    let peak = memsight::stats().peak_bytes - base;
    assert!(peak >= 32 << 20, "peak {peak} missed the 32 MiB buffer");
    assert_eq!(common::settled_at(base).live_bytes, base);
}
