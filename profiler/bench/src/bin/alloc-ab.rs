//! In-process A/B of memsight's allocator against bare jemalloc: both are called from the same
//! process through out-of-line functions shaped like the `__rust_alloc`/`__rust_dealloc` shims, in
//! alternating chunks of a few milliseconds, and each chunk pair gives one ratio. On a shared VM
//! whose speed drifts by tens of percent between processes (see docs/benchmarks.md), the median of
//! many adjacent-chunk ratios is far steadier than comparing separate processes.
//!
//! `alloc-ab [PAIRS]` (default 400 chunk pairs per cell) prints, per workload and thread count, the
//! median ns per alloc+free of each side, the median and interquartile range of the pair ratios.

use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::Instant;

/// The program's own allocator is bare jemalloc; memsight's is called directly.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;
static TRACKED: memsight::Allocator = memsight::Allocator::new();

/// One side of the comparison: an allocator reached through out-of-line calls, as Rust code reaches
/// the global allocator.
trait Side {
    unsafe fn alloc(l: Layout) -> *mut u8;
    unsafe fn dealloc(p: *mut u8, l: Layout);
}

struct Bare;
struct Tracked;

impl Side for Bare {
    #[inline(never)]
    unsafe fn alloc(l: Layout) -> *mut u8 {
        tikv_jemallocator::Jemalloc.alloc(l)
    }
    #[inline(never)]
    unsafe fn dealloc(p: *mut u8, l: Layout) {
        tikv_jemallocator::Jemalloc.dealloc(p, l)
    }
}

impl Side for Tracked {
    #[inline(never)]
    unsafe fn alloc(l: Layout) -> *mut u8 {
        TRACKED.alloc(l)
    }
    #[inline(never)]
    unsafe fn dealloc(p: *mut u8, l: Layout) {
        TRACKED.dealloc(p, l)
    }
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// Runs `ops` alloc+free pairs of `workload` through side `S`; returns the elapsed nanoseconds.
fn chunk<S: Side>(workload: &str, ops: usize, seed: &mut u64) -> f64 {
    let t = Instant::now();
    // SAFETY: every pointer is freed once, with the layout it was allocated with; null is checked.
    unsafe {
        match workload {
            "box32" => {
                let l = Layout::from_size_align_unchecked(32, 1);
                for _ in 0..ops {
                    let p = black_box(S::alloc(l));
                    if !p.is_null() {
                        p.write(1);
                        S::dealloc(p, l);
                    }
                }
            }
            _ => {
                let mut ring = [(std::ptr::null_mut::<u8>(), 0usize); 64];
                for i in 0..ops {
                    let n = 8 + (xorshift(seed) % 4089) as usize;
                    let l = Layout::from_size_align_unchecked(n, 1);
                    let p = black_box(S::alloc(l));
                    let (old, old_n) = std::mem::replace(&mut ring[i % 64], (p, n));
                    if !old.is_null() {
                        S::dealloc(old, Layout::from_size_align_unchecked(old_n, 1));
                    }
                }
                for (p, n) in ring {
                    if !p.is_null() {
                        S::dealloc(p, Layout::from_size_align_unchecked(n, 1));
                    }
                }
            }
        }
    }
    t.elapsed().as_nanos() as f64
}

/// One cell: `pairs` chunk pairs on `threads` threads (all threads run the same side at the same
/// time); returns (bare ns/op, tracked ns/op, ratio median, ratio p25, ratio p75).
fn cell(workload: &'static str, threads: usize, pairs: usize) -> [f64; 5] {
    const OPS: usize = 50_000;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let b = barrier.clone();
            std::thread::spawn(move || {
                let mut seed = 0x2545F4914F6CDD1D ^ t as u64;
                // Warm-up: thread caches and memsight's slot claim.
                chunk::<Bare>(workload, OPS, &mut seed);
                chunk::<Tracked>(workload, OPS, &mut seed);
                let mut out = Vec::with_capacity(pairs);
                for i in 0..pairs {
                    // Alternate which side goes first, so neither always follows the other.
                    b.wait();
                    let (bare, tracked) = if i % 2 == 0 {
                        let x = chunk::<Bare>(workload, OPS, &mut seed);
                        b.wait();
                        (x, chunk::<Tracked>(workload, OPS, &mut seed))
                    } else {
                        let y = chunk::<Tracked>(workload, OPS, &mut seed);
                        b.wait();
                        (chunk::<Bare>(workload, OPS, &mut seed), y)
                    };
                    out.push((bare, tracked));
                }
                out
            })
        })
        .collect();
    let all: Vec<(f64, f64)> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap_or_default())
        .collect();
    let q = |mut v: Vec<f64>, f: f64| {
        v.sort_by(f64::total_cmp);
        v.get(((v.len() as f64 - 1.0) * f).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    let ratios: Vec<f64> = all.iter().map(|(b, t)| t / b).collect();
    [
        q(all.iter().map(|p| p.0 / OPS as f64).collect(), 0.5),
        q(all.iter().map(|p| p.1 / OPS as f64).collect(), 0.5),
        q(ratios.clone(), 0.5),
        q(ratios.clone(), 0.25),
        q(ratios, 0.75),
    ]
}

fn main() {
    let pairs: usize = match std::env::args().nth(1).map(|a| a.parse()) {
        None => 400,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("usage: alloc-ab [PAIRS]   (PAIRS: a positive number of chunk pairs)");
            std::process::exit(2);
        }
    };
    println!(
        "| workload | threads | jemalloc ns | memsight ns | ratio (median of pairs) | p25–p75 |"
    );
    println!("|---|---|---|---|---|---|");
    for threads in [1, 2] {
        for workload in ["box32", "mixed"] {
            let [b, t, r, lo, hi] = cell(workload, threads, pairs);
            println!("| {workload} | {threads} | {b:.2} | {t:.2} | {r:.3}× | {lo:.3}–{hi:.3} |");
        }
    }
}
