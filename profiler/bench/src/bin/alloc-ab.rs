//! In-process A/B of memsight's allocator against bare jemalloc — Rust's path (`GlobalAlloc`) and
//! C code's (`malloc`/`free`, which memsight defines for the process) — both called from the same
//! process through out-of-line functions shaped like the `__rust_alloc`/`__rust_dealloc` shims, in
//! alternating chunks of a few milliseconds, and each chunk pair gives one ratio. On a shared VM
//! whose speed drifts by tens of percent between processes (see docs/benchmarks.md), the median of
//! many adjacent-chunk ratios is far steadier than comparing separate processes.
//!
//! `alloc-ab [PAIRS]` (default 400 chunk pairs per cell) prints, per workload and thread count, the
//! median ns per alloc+free of each side, the median and interquartile range of the pair ratios.
//!
//! Built with `memsight/heap-profile` (`make bench` does, as `alloc-ab-prof`), both sides run on
//! jemalloc built for heap profiling, with sampling as `MALLOC_CONF` says (memsight's default: one
//! sample per 512 KiB): that compares memsight's profiling build with the bare profiling jemalloc.
//! With sampling on it then prints what sampling itself costs: memsight with sampling switched off
//! and on between alternating chunks.

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
/// C code's path to bare jemalloc: its (prefixed) `malloc`/`free`.
struct BareC;
/// C code's path through memsight: the process's `malloc`/`free`, which memsight defines.
struct TrackedC;

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

impl Side for BareC {
    #[inline(never)]
    unsafe fn alloc(l: Layout) -> *mut u8 {
        tikv_jemalloc_sys::malloc(l.size()).cast()
    }
    #[inline(never)]
    unsafe fn dealloc(p: *mut u8, _: Layout) {
        tikv_jemalloc_sys::free(p.cast())
    }
}

impl Side for TrackedC {
    #[inline(never)]
    unsafe fn alloc(l: Layout) -> *mut u8 {
        libc::malloc(l.size()).cast()
    }
    #[inline(never)]
    unsafe fn dealloc(p: *mut u8, _: Layout) {
        libc::free(p.cast())
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

/// Operations (alloc+free pairs) per chunk.
const OPS: usize = 50_000;

/// One cell: `pairs` chunk pairs of sides `A` (bare) and `B` (tracked) on `threads` threads (all
/// threads run the same side at the same time); returns (A ns/op, B ns/op, ratio median, ratio
/// p25, ratio p75).
fn cell<A: Side, B: Side>(workload: &'static str, threads: usize, pairs: usize) -> [f64; 5] {
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let b = barrier.clone();
            std::thread::spawn(move || {
                let mut seed = 0x2545F4914F6CDD1D ^ t as u64;
                // Warm-up: thread caches and memsight's slot claim.
                chunk::<A>(workload, OPS, &mut seed);
                chunk::<B>(workload, OPS, &mut seed);
                let mut out = Vec::with_capacity(pairs);
                for i in 0..pairs {
                    // Alternate which side goes first, so neither always follows the other.
                    b.wait();
                    let (bare, tracked) = if i % 2 == 0 {
                        let x = chunk::<A>(workload, OPS, &mut seed);
                        b.wait();
                        (x, chunk::<B>(workload, OPS, &mut seed))
                    } else {
                        let y = chunk::<B>(workload, OPS, &mut seed);
                        b.wait();
                        (chunk::<A>(workload, OPS, &mut seed), y)
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
    summarize(&all)
}

/// (A ns/op, B ns/op, ratio median, ratio p25, ratio p75) of chunk pairs (A ns, B ns).
fn summarize(all: &[(f64, f64)]) -> [f64; 5] {
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

/// memsight with jemalloc's sampling off (A) and on (B), switched between alternating chunks on
/// one thread: what sampling itself costs.
fn sampling_cell(workload: &'static str, pairs: usize) -> [f64; 5] {
    use memsight::heapprof::control::set_sampling;
    let mut seed = 0x2545F4914F6CDD1D;
    chunk::<Tracked>(workload, OPS, &mut seed);
    let side = |on: bool, seed: &mut u64| {
        let _ = set_sampling(on);
        chunk::<Tracked>(workload, OPS, seed)
    };
    let all: Vec<(f64, f64)> = (0..pairs)
        .map(|i| {
            if i % 2 == 0 {
                let off = side(false, &mut seed);
                (off, side(true, &mut seed))
            } else {
                let on = side(true, &mut seed);
                (side(false, &mut seed), on)
            }
        })
        .collect();
    let _ = set_sampling(true);
    summarize(&all)
}

/// Which jemalloc both sides run on.
fn jemalloc_build() -> String {
    use memsight::heapprof::control;
    match (
        control::enabled(),
        control::sampling(),
        control::sample_bytes(),
    ) {
        (false, ..) => "jemalloc: not profiling (plain build, or prof:false)".into(),
        (true, Some(true), Some(b)) => {
            format!("jemalloc: built for heap profiling, one sample per {b} bytes")
        }
        (true, ..) => "jemalloc: built for heap profiling, sampling off".into(),
    }
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
    println!("{}", jemalloc_build());
    println!(
        "| workload | threads | jemalloc ns | memsight ns | ratio (median of pairs) | p25–p75 |"
    );
    println!("|---|---|---|---|---|---|");
    for threads in [1, 2] {
        for workload in ["box32", "mixed"] {
            let [b, t, r, lo, hi] = cell::<Bare, Tracked>(workload, threads, pairs);
            println!("| {workload} | {threads} | {b:.2} | {t:.2} | {r:.3}× | {lo:.3}–{hi:.3} |");
        }
    }
    println!();
    println!("C code's malloc/free: memsight's interposed functions vs jemalloc's own");
    println!(
        "| workload | threads | jemalloc ns | memsight ns | ratio (median of pairs) | p25–p75 |"
    );
    println!("|---|---|---|---|---|---|");
    for threads in [1, 2] {
        for workload in ["box32", "mixed"] {
            let [b, t, r, lo, hi] = cell::<BareC, TrackedC>(workload, threads, pairs);
            println!("| c-{workload} | {threads} | {b:.2} | {t:.2} | {r:.3}× | {lo:.3}–{hi:.3} |");
        }
    }
    if memsight::heapprof::control::sampling() == Some(true) {
        println!();
        println!(
            "What sampling costs: memsight, sampling off and on in alternating chunks, 1 thread"
        );
        println!("| workload | off ns | on ns | ratio (median of pairs) | p25–p75 |");
        println!("|---|---|---|---|---|");
        for workload in ["box32", "mixed"] {
            let [off, on, r, lo, hi] = sampling_cell(workload, pairs);
            println!("| {workload} | {off:.2} | {on:.2} | {r:.3}× | {lo:.3}–{hi:.3} |");
        }
    }
}
