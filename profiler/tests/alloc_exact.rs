//! Exactness of the counters under load: 10M alloc/free on 2 threads return live bytes exactly to
//! baseline, and a known 100 MiB buffer shows as a peak within 1%.

mod common;

use std::hint::black_box;

#[global_allocator]
static ALLOC: memsight::Allocator = memsight::Allocator::new();

fn churn(n: usize) {
    for i in 0..n {
        let b: Box<[u8; 48]> = black_box(Box::new([i as u8; 48]));
        drop(black_box(b));
        if i % 1024 == 0 {
            // Mixed sizes and a realloc so every counter path runs.
            let mut v: Vec<u8> = black_box(Vec::with_capacity(1 + i % 5000));
            v.resize(9000, 1);
            drop(black_box(v));
        }
    }
}

#[test]
fn ten_million_alloc_free_on_two_threads_return_to_baseline_and_peak_is_exact() {
    let before = common::baseline();
    let threads: Vec<_> = (0..2)
        .map(|_| std::thread::spawn(|| churn(5_000_000)))
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let after = common::settled_at(before.rust_live_bytes);
    assert_eq!(
        after.rust_live_bytes, before.rust_live_bytes,
        "live bytes did not return to baseline"
    );
    assert!(after.allocations - before.allocations >= 10_000_000);
    assert!(after.deallocations - before.deallocations >= 10_000_000);
    assert!(after.reallocations > before.reallocations);

    // A known 100 MiB buffer, every page touched.
    memsight::reset_peak();
    let base = memsight::stats().live_bytes;
    let mut big = vec![0u8; 100 << 20];
    for i in (0..big.len()).step_by(4096) {
        big[i] = i as u8;
    }
    black_box(&big);
    let during = memsight::stats();
    assert_eq!(during.live_bytes - base, 100 << 20);
    drop(big);
    let peak = memsight::stats().peak_bytes - base;
    let err = (peak as f64 - (100u64 << 20) as f64).abs() / (100u64 << 20) as f64;
    assert!(err < 0.01, "peak {peak} not within 1% of 100 MiB");
    assert_eq!(memsight::stats().live_bytes, base);
}
