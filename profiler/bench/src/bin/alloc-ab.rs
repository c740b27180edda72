//! In-process A/B of memsight's allocator against bare jemalloc — Rust's path (`GlobalAlloc`) and
//! C code's (`malloc`/`free`, which memsight defines for the process) — both called from the same
//! process through out-of-line functions shaped like the `__rust_alloc`/`__rust_dealloc` shims, in
//! alternating chunks of a few milliseconds, and each chunk pair gives one ratio. On a shared VM
//! whose speed drifts by tens of percent between processes (see docs/benchmarks.md), the median of
//! many adjacent-chunk ratios is far steadier than comparing separate processes.
//!
//! `alloc-ab [PAIRS [RUNS]] [rust] [c] [sampling]` (default 400 chunk pairs per cell, one run, all
//! tables) prints the CPU model and, per workload and thread count, the median ns per alloc+free of
//! each side, the ns added, the median of the pair ratios and their spread (p25–p75 for one run;
//! with RUNS > 1 every cell runs RUNS times, interleaved with the others, and the row shows the
//! medians over runs and the range of the runs' ratios).
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

/// "Count nothing twice" (issue 41), measured before it is built: what memsight's paths would cost
/// if they kept on the hot path only a compare of jemalloc's own per-thread counter against a mark
/// (no counts of their own, no separate sample stream), the sampled-block test on a free, and a
/// tail call. The slow path here only places the marks 64 KiB ahead; a real one would publish and
/// sample there.
mod je_mark {
    use std::cell::Cell;

    /// This thread's pointers to jemalloc's allocated/deallocated counters and its marks.
    pub struct Marks {
        pub allocated: Cell<*const u64>,
        pub freed: Cell<*const u64>,
        pub alloc_mark: Cell<u64>,
        pub free_mark: Cell<u64>,
    }

    static NONE: u64 = u64::MAX;

    thread_local! {
        pub static MARKS: Marks = const {
            Marks {
                allocated: Cell::new(&NONE),
                freed: Cell::new(&NONE),
                alloc_mark: Cell::new(0),
                free_mark: Cell::new(0),
            }
        };
    }

    fn counter(name: &std::ffi::CStr) -> *const u64 {
        let mut p: *mut u64 = std::ptr::null_mut();
        let mut len = std::mem::size_of::<*mut u64>();
        // SAFETY: a NUL-terminated name; `p` and `len` describe a pointer-sized output.
        let rc = unsafe {
            tikv_jemalloc_sys::mallctl(
                name.as_ptr(),
                (&raw mut p).cast(),
                &mut len,
                std::ptr::null_mut(),
                0,
            )
        };
        if rc == 0 && !p.is_null() {
            p
        } else {
            &NONE
        }
    }

    /// The slow path: takes the counters on first use, places both marks 64 KiB ahead.
    #[cold]
    #[inline(never)]
    pub fn settle() {
        MARKS.with(|m| {
            if std::ptr::eq(m.allocated.get(), &NONE) {
                m.allocated.set(counter(c"thread.allocatedp"));
                m.freed.set(counter(c"thread.deallocatedp"));
            }
            // SAFETY: jemalloc's counters of this thread.
            unsafe {
                m.alloc_mark
                    .set((*m.allocated.get()).wrapping_add(64 << 10));
                m.free_mark.set((*m.freed.get()).wrapping_add(64 << 10));
            }
        });
    }

    /// Whether this thread's allocated counter stays below its mark after `size` more bytes.
    #[inline(always)]
    pub fn alloc_fits(size: usize) -> bool {
        // SAFETY: `allocated` points at jemalloc's counter of this thread (or at `NONE`).
        MARKS.with(|m| unsafe { *m.allocated.get() }.wrapping_add(size as u64) < m.alloc_mark.get())
    }

    /// As [`alloc_fits`], for a free of `size` bytes.
    #[inline(always)]
    pub fn free_fits(size: usize) -> bool {
        // SAFETY: as above.
        MARKS.with(|m| unsafe { *m.freed.get() }.wrapping_add(size as u64) < m.free_mark.get())
    }

    /// Whether this thread's freed counter passed its mark (checked after a C `free`).
    #[inline(always)]
    pub fn freed_past() -> bool {
        // SAFETY: as above.
        MARKS.with(|m| unsafe { *m.freed.get() } >= m.free_mark.get())
    }

    /// The sampled-block test of a free (one subtraction and compare against constants).
    #[inline(always)]
    pub fn sampled(p: *const u8) -> bool {
        (p as usize).wrapping_sub(64 << 40) < 1 << 40
    }
}

/// Rust's path with only jemalloc's counter compared against a mark.
struct MarkRust;
/// C's path the same way: `malloc` compares and tail-calls; `free` calls, then compares (a free
/// has no size to compare before).
struct MarkC;

impl Side for MarkRust {
    #[inline(never)]
    unsafe fn alloc(l: Layout) -> *mut u8 {
        if !je_mark::alloc_fits(l.size()) {
            je_mark::settle();
        }
        tikv_jemallocator::Jemalloc.alloc(l)
    }
    #[inline(never)]
    unsafe fn dealloc(p: *mut u8, l: Layout) {
        if je_mark::sampled(p) || !je_mark::free_fits(l.size()) {
            je_mark::settle();
        }
        tikv_jemallocator::Jemalloc.dealloc(p, l)
    }
}

impl Side for MarkC {
    #[inline(never)]
    unsafe fn alloc(l: Layout) -> *mut u8 {
        if !je_mark::alloc_fits(l.size()) {
            je_mark::settle();
        }
        tikv_jemalloc_sys::malloc(l.size()).cast()
    }
    #[inline(never)]
    unsafe fn dealloc(p: *mut u8, _: Layout) {
        if je_mark::sampled(p) {
            je_mark::settle();
        }
        tikv_jemalloc_sys::free(p.cast());
        if je_mark::freed_past() {
            je_mark::settle();
        }
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

/// The CPU's model name (`/proc/cpuinfo`), for the tables: a ratio means little without it.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// Median of `v` (NaN when empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// One table row over rounds: per round (bare ns, tracked ns, ratio, p25, p75); printed as the
/// medians over rounds, the ns added, and the range of the rounds' ratios.
fn row(name: &str, threads: usize, rounds: &[[f64; 5]], extra: &str) {
    let col = |i: usize| median(rounds.iter().map(|r| r[i]).collect());
    let (b, t, r) = (col(0), col(1), col(2));
    let lo = rounds.iter().map(|r| r[2]).fold(f64::INFINITY, f64::min);
    let hi = rounds
        .iter()
        .map(|r| r[2])
        .fold(f64::NEG_INFINITY, f64::max);
    let spread = if rounds.len() > 1 {
        format!("{lo:.3}–{hi:.3} ({} runs)", rounds.len())
    } else {
        format!("{:.3}–{:.3} (p25–p75)", rounds[0][3], rounds[0][4])
    };
    println!(
        "| {name} | {threads} | {b:.2} | {t:.2} | {:+.2} | {r:.3}× | {spread} |{extra}",
        t - b
    );
}

const HEADER: &str =
    "| workload | threads | {A} ns/op | {B} ns/op | ns added | ratio (median) | spread |";

fn header(a: &str, b: &str, extra: &str) {
    println!("{}{extra}", HEADER.replace("{A}", a).replace("{B}", b));
    let cols = HEADER.matches('|').count() - 1 + extra.matches('|').count();
    println!("{}|", "|---".repeat(cols));
}

const USAGE: &str = "usage: alloc-ab [PAIRS [RUNS]] [rust] [c] [sampling] [variants]
  PAIRS: chunk pairs per cell and run (default 400); RUNS: interleaved runs of every cell
  (default 1; the table then shows the median over runs and the range of the runs' ratios);
  the words pick tables (default: rust, c and sampling; variants: jemalloc's own counter against
  a mark, then a tail call -- issue 41's count-nothing-twice hot path -- vs bare jemalloc)";

fn main() {
    let mut nums = Vec::new();
    let mut tables = Vec::new();
    for a in std::env::args().skip(1) {
        match a.parse::<usize>() {
            Ok(n) if n > 0 => nums.push(n),
            _ if ["rust", "c", "sampling", "variants"].contains(&a.as_str()) => tables.push(a),
            _ => {
                eprintln!("{USAGE}");
                std::process::exit(2);
            }
        }
    }
    if nums.len() > 2 {
        eprintln!("{USAGE}");
        std::process::exit(2);
    }
    let pairs = nums.first().copied().unwrap_or(400);
    let runs = nums.get(1).copied().unwrap_or(1);
    let want = |t: &str| (tables.is_empty() && t != "variants") || tables.iter().any(|x| x == t);
    println!("CPU: {}", cpu_model());
    println!("{}", sampler_state());
    println!("{pairs} chunk pairs of {OPS} alloc+free per cell and run, {runs} interleaved run(s)");
    type Cell = Box<dyn Fn() -> ([f64; 5], f64)>;
    let mut cells: Vec<(&str, String, usize, Cell)> = Vec::new();
    if want("rust") {
        for threads in [1, 2] {
            for workload in ["box32", "batch1000", "mixed"] {
                cells.push((
                    "rust",
                    workload.into(),
                    threads,
                    Box::new(move || (cell::<Bare, Tracked>(workload, threads, pairs), 0.0)),
                ));
            }
        }
    }
    if want("c") {
        for threads in [1, 2] {
            for workload in ["box32", "mixed"] {
                cells.push((
                    "c",
                    format!("c-{workload}"),
                    threads,
                    Box::new(move || (cell::<BareC, TrackedC>(workload, threads, pairs), 0.0)),
                ));
            }
        }
    }
    if want("variants") {
        for threads in [1, 2] {
            for workload in ["box32", "mixed"] {
                cells.push((
                    "variants",
                    workload.into(),
                    threads,
                    Box::new(move || (cell::<Bare, MarkRust>(workload, threads, pairs), 0.0)),
                ));
                cells.push((
                    "variants",
                    format!("c-{workload}"),
                    threads,
                    Box::new(move || (cell::<BareC, MarkC>(workload, threads, pairs), 0.0)),
                ));
            }
        }
    }
    let sampling_on = memsight::heapprof::control::sampling() == Some(true);
    if want("sampling") && sampling_on {
        for threads in [1, 2] {
            for workload in ["box32", "batch1000", "mixed"] {
                cells.push((
                    "sampling",
                    workload.into(),
                    threads,
                    Box::new(move || sampling_cell(workload, threads, pairs)),
                ));
            }
        }
    }
    let mut results: Vec<Vec<([f64; 5], f64)>> = vec![Vec::new(); cells.len()];
    for _ in 0..runs {
        for (i, c) in cells.iter().enumerate() {
            results[i].push((c.3)());
        }
    }
    let mut last = "";
    for (i, (table, name, threads, _)) in cells.iter().enumerate() {
        if *table != last {
            last = table;
            println!();
            match *table {
                "rust" => {
                    println!("Rust's path (GlobalAlloc): memsight vs bare jemalloc");
                    header("jemalloc", "memsight", "");
                }
                "c" => {
                    println!(
                        "C code's malloc/free: memsight's interposed functions vs jemalloc's own"
                    );
                    header("jemalloc", "memsight", "");
                }
                "variants" => {
                    println!(
                        "Variants: jemalloc's per-thread counter against a mark, then a tail call \
                         (no counts of memsight's own), vs bare jemalloc"
                    );
                    header("jemalloc", "variant", "");
                }
                _ => {
                    println!(
                        "What sampling costs: memsight, sampling off and on in alternating chunks"
                    );
                    header("off", "on", " samples per 1000 ops | ns per sample |");
                }
            }
        }
        let rounds: Vec<[f64; 5]> = results[i].iter().map(|r| r.0).collect();
        let extra = if *table == "sampling" {
            let per_op = median(results[i].iter().map(|r| r.1).collect());
            let added = median(rounds.iter().map(|r| r[1] - r[0]).collect());
            let per_sample = if per_op > 0.0 {
                format!("{:.0}", added / per_op)
            } else {
                "—".into()
            };
            format!(" {:.2} | {per_sample} |", per_op * 1000.0)
        } else {
            String::new()
        };
        row(name, *threads, &rounds, &extra);
    }
    if want("sampling") && sampling_on {
        let c = memsight::alloc::sampling::counts();
        println!(
            "{} samples, {} of their stacks walked by libgcc's unwinder (the caching walker stopped early)",
            c.taken, c.slow_walks
        );
    } else if want("sampling") {
        println!("(sampling off: no sampling table)");
    }
}
