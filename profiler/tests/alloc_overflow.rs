//! Thread lifetimes and the registry: a thread's counts survive its exit (folded into the shared
//! block, its entry reused by later threads), and threads beyond the 1024 entries alive at once
//! share one block: counting stays exact and a large allocation there still reaches the peak.

mod common;

use std::hint::black_box;
use std::sync::{Arc, Barrier};

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

/// One test (the harness's own threads allocate between tests, which would move the baseline).
#[test]
fn thread_lifetimes_keep_counts_exact() {
    counts_survive_thread_exit_and_entries_are_reused();
    threads_beyond_the_registry_share_one_block_and_count_exactly();
}

fn counts_survive_thread_exit_and_entries_are_reused() {
    let before = common::baseline();
    // Far more threads than entries, one after another: each exit frees its entry.
    for _ in 0..1500 {
        std::thread::spawn(churn_and_count).join().unwrap();
    }
    let after = common::settled_at(before.rust_live_bytes);
    assert_eq!(
        after.rust_live_bytes, before.rust_live_bytes,
        "live bytes drifted"
    );
    assert!(after.allocations - before.allocations >= 1500 * 201);
    assert!(after.deallocations - before.deallocations >= 1500 * 201);
    assert!(after.reallocations - before.reallocations >= 1500);

    // Memory allocated on a thread and freed on another after the first one exited (the exited
    // thread's block was folded with those bytes live in it).
    let base = memsight::stats().rust_live_bytes;
    let kept = std::thread::spawn(|| black_box(vec![3u8; 10 << 10]))
        .join()
        .unwrap();
    assert_eq!(
        common::settled_at(base + (10 << 10)).rust_live_bytes,
        base + (10 << 10)
    );
    drop(kept);
    assert_eq!(common::settled_at(base).rust_live_bytes, base);
}

fn threads_beyond_the_registry_share_one_block_and_count_exactly() {
    const ALIVE: usize = 1100;
    let before = memsight::stats();
    let gate = Arc::new(Barrier::new(ALIVE + 1));
    let threads: Vec<_> = (0..ALIVE)
        .map(|_| {
            let g = gate.clone();
            std::thread::Builder::new()
                .stack_size(128 << 10)
                .spawn(move || {
                    churn_and_count();
                    g.wait(); // all alive at once: some found no entry
                    churn_and_count();
                    g.wait();
                })
                .unwrap()
        })
        .collect();
    gate.wait();

    // With every entry taken, a new thread counts in the shared block: its 32 MiB buffer must
    // still show in the peak, within the documented bound (64 KiB per allocating thread).
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
    let bound = 3 * memsight::alloc::FLUSH_BYTES as u64;
    assert!(
        peak + bound >= 32 << 20,
        "peak {peak} missed the 32 MiB buffer"
    );

    gate.wait();
    for t in threads {
        t.join().unwrap();
    }
    drop(gate);
    let after = common::settled_at(before.rust_live_bytes);
    assert_eq!(
        after.rust_live_bytes, before.rust_live_bytes,
        "live bytes drifted"
    );
    assert!(after.allocations - before.allocations >= 2 * ALIVE as u64 * 201);
    assert!(after.deallocations - before.deallocations >= 2 * ALIVE as u64 * 201);
}
