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
//! memsight's heap sampler runs as in a job's session (one sample per 512 KiB, or
//! `MEMSIGHT_HEAP_SAMPLE`: a size or `off`). With sampling on it then prints what sampling itself
//! costs: memsight with sampling switched off and on between alternating chunks, on 1 and 2
//! threads, and the cost per sample that follows from the samples taken.

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
            "batch1000" => {
                let l = Layout::from_size_align_unchecked(64, 8);
                let mut held = [std::ptr::null_mut::<u8>(); 1000];
                for _ in 0..ops / 1000 {
                    for h in held.iter_mut() {
                        *h = black_box(S::alloc(l));
                    }
                    for h in held {
                        if !h.is_null() {
                            S::dealloc(h, l);
                        }
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

/// memsight with its heap sampling off (A) and on (B), switched between alternating chunks on
/// `threads` threads (all in the same state at once): what sampling itself costs. Also returns the
/// samples taken per operation while on.
fn sampling_cell(workload: &'static str, threads: usize, pairs: usize) -> ([f64; 5], f64) {
    use memsight::alloc::sampling;
    use memsight::heapprof::control::set_sampling;
    let barrier = Arc::new(Barrier::new(threads));
    let taken = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let b = barrier.clone();
            let taken = taken.clone();
            std::thread::spawn(move || {
                let mut seed = 0x2545F4914F6CDD1D ^ t as u64;
                chunk::<Tracked>(workload, OPS, &mut seed);
                let side = |on: bool, seed: &mut u64| {
                    b.wait();
                    let before = sampling::counts().taken;
                    if t == 0 {
                        let _ = set_sampling(on);
                    }
                    b.wait();
                    let ns = chunk::<Tracked>(workload, OPS, seed);
                    b.wait();
                    if on && t == 0 {
                        let n = sampling::counts().taken - before;
                        taken.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                    }
                    ns
                };
                (0..pairs)
                    .map(|i| {
                        if i % 2 == 0 {
                            let off = side(false, &mut seed);
                            (off, side(true, &mut seed))
                        } else {
                            let on = side(true, &mut seed);
                            (side(false, &mut seed), on)
                        }
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let all: Vec<(f64, f64)> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap_or_default())
        .collect();
    let _ = set_sampling(true);
    let ops = (pairs * threads * OPS) as f64;
    (
        summarize(&all),
        taken.load(std::sync::atomic::Ordering::Relaxed) as f64 / ops,
    )
}

/// The heap sampler's state, started as a session starts it.
fn sampler_state() -> String {
    match memsight::heapprof::control::configure_from_env() {
        Ok(Some(b)) => format!("memsight heap sampling: one sample per {b} bytes"),
        Ok(None) => "memsight heap sampling: off (MEMSIGHT_HEAP_SAMPLE=off)".into(),
        Err(e) => format!("memsight heap sampling: unavailable ({e})"),
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
    println!("{}", sampler_state());
    println!(
        "| workload | threads | jemalloc ns | memsight ns | ratio (median of pairs) | p25–p75 |"
    );
    println!("|---|---|---|---|---|---|");
    for threads in [1, 2] {
        for workload in ["box32", "batch1000", "mixed"] {
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
        println!("What sampling costs: memsight, sampling off and on in alternating chunks");
        println!(
            "| workload | threads | off ns | on ns | ratio (median of pairs) | p25–p75 | samples per 1000 ops | ns per sample |"
        );
        println!("|---|---|---|---|---|---|---|---|");
        for threads in [1, 2] {
            for workload in ["box32", "batch1000", "mixed"] {
                let ([off, on, r, lo, hi], per_op) = sampling_cell(workload, threads, pairs);
                let per_sample = if per_op > 0.0 {
                    format!("{:.0}", (on - off) / per_op)
                } else {
                    "—".into()
                };
                println!(
                    "| {workload} | {threads} | {off:.2} | {on:.2} | {r:.3}× | {lo:.3}–{hi:.3} | {:.2} | {per_sample} |",
                    per_op * 1000.0
                );
            }
        }
        let c = memsight::alloc::sampling::counts();
        println!(
            "{} samples, {} of their stacks walked by libgcc's unwinder (the caching walker stopped early)",
            c.taken, c.slow_walks
        );
    }
}
