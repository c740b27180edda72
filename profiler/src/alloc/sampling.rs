//! memsight's heap sampler: one allocation per `rate` bytes on average, chosen where each thread's
//! byte counters pass a sample point, with its call stack — the allocation sites of heap profiles,
//! for Rust and C/C++ allocations alike, in every build with the `jemalloc` feature.
//!
//! As Go's runtime and tcmalloc do: a thread's allocated bytes form a stream; sample points sit at
//! exponentially distributed distances (mean `rate`) along it, and the allocation that crosses
//! one is sampled. An allocation of `s` bytes is then sampled with probability `1 − e^(−s/rate)`,
//! which a reader divides out (jeprof's correction, `memsight_analysis::heapprof::dump`). Each
//! thread has two streams: Rust's allocations (the counters' requested bytes, whose fast-path mark
//! is lowered to the next point, so the check costs nothing more there) and C's (`malloc` family,
//! one more compare on its fast path).
//!
//! A sampled block is served by the sampled arena ([`super::sample_heap`]), whose address range
//! tells a free of a sampled block with one compare; its stack is taken by the caching walker
//! ([`super::unwind`], libgcc's `_Unwind_Backtrace` when that cannot) and kept in
//! [`super::sample_table`]. Sampling starts in the executable's pre-initialiser
//! ([`start_at_load`]). The profile is written in jemalloc's
//! `heap_v2` text format, so every reader of heap profiles (sites, growth, flamegraphs, pprof)
//! reads it unchanged.

use super::counters::{self, Local};
use super::{sample_heap, sample_table, unwind};
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};

/// The default mean bytes between samples (Go's runtime samples at the same rate).
pub const DEFAULT_RATE: u64 = 512 * 1024;

/// Mean bytes between samples; 0: sampling off.
static RATE: AtomicU64 = AtomicU64::new(0);
/// Bumped at every change of [`RATE`]: a thread re-arms when its generation differs.
static GENERATION: AtomicU64 = AtomicU64::new(1);
/// Allocations that were due a sample but were served unsampled (the sampled arena was full).
static LOST: AtomicU64 = AtomicU64::new(0);
/// Samples whose stack the caching walker could not take (libgcc's unwinder did).
static SLOW_WALKS: AtomicU64 = AtomicU64::new(0);
/// Seeds the threads' random streams apart.
static SEED: AtomicU64 = AtomicU64::new(0x2545_F491_4F6C_DD1D);

/// One thread's sample points (inside its `counters::Local`).
pub(crate) struct Points {
    /// The Rust stream's next sample point, in the thread's cumulative allocated bytes (0: not
    /// armed; `u64::MAX`: off).
    rust_at: AtomicU64,
    /// Bytes this thread requested through the `malloc` family.
    pub(crate) c_bytes: AtomicU64,
    /// The C stream's next sample point in `c_bytes` (0: not armed; `u64::MAX`: off).
    pub(crate) c_at: AtomicU64,
    /// The [`GENERATION`] these points were armed for.
    generation: AtomicU64,
    /// The thread's random state (xorshift64*).
    rng: AtomicU64,
    /// Set while this thread is inside the sampler: its nested allocations are not sampled.
    busy: AtomicBool,
    /// The top of this thread's stack, for the stack walker (0: not looked up yet; `usize::MAX`:
    /// unknown, libgcc's unwinder walks).
    stack_top: AtomicUsize,
    /// This thread's cache of sampled blocks (`super::sample_heap`): jemalloc's index + 1 (0: not
    /// made yet; `u32::MAX`: none).
    pub(crate) tcache: AtomicU32,
}

impl Points {
    pub(crate) const fn new() -> Self {
        Points {
            rust_at: AtomicU64::new(0),
            c_bytes: AtomicU64::new(0),
            c_at: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            rng: AtomicU64::new(0),
            busy: AtomicBool::new(false),
            stack_top: AtomicUsize::new(0),
            tcache: AtomicU32::new(0),
        }
    }

    /// A distance to the next sample point: exponential with mean `rate` (at least 1 byte).
    fn draw(&self, rate: u64) -> u64 {
        let mut x = self.rng.load(Relaxed);
        if x == 0 {
            x = SEED.fetch_add(0x9E37_79B9_7F4A_7C15, Relaxed) ^ (self as *const _ as u64);
            x |= 1;
        }
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.store(x, Relaxed);
        let bits = x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11;
        // Uniform in (0, 1].
        let u = (bits as f64 + 1.0) / (1u64 << 53) as f64;
        ((-ln(u) * rate as f64) as u64).max(1)
    }

    /// Re-arms both streams when the rate changed since they were armed.
    fn rearm_if_stale(&self, rust_bytes: u64) {
        let g = GENERATION.load(Relaxed);
        if self.generation.load(Relaxed) == g {
            return;
        }
        self.generation.store(g, Relaxed);
        let rate = RATE.load(Relaxed);
        if rate == 0 {
            self.rust_at.store(u64::MAX, Relaxed);
            self.c_at.store(u64::MAX, Relaxed);
        } else {
            self.rust_at
                .store(rust_bytes.saturating_add(self.draw(rate)), Relaxed);
            let c = self.c_bytes.load(Relaxed);
            self.c_at.store(c.saturating_add(self.draw(rate)), Relaxed);
        }
    }

    /// The Rust stream's next point (for the counters' fast-path mark), re-armed when stale.
    pub(crate) fn rust_point(&self, rust_bytes: u64) -> u64 {
        self.rearm_if_stale(rust_bytes);
        self.rust_at.load(Relaxed)
    }

    /// Whether an allocation growing the Rust stream from `before` by `size` bytes is due a sample;
    /// re-arms past it when it is.
    fn rust_due(&self, before: u64, size: usize) -> bool {
        self.rearm_if_stale(before);
        self.passes(&self.rust_at, before.saturating_add(size as u64))
    }

    /// Adds a C call's `size` bytes to the C stream when they stay below its next sample point:
    /// `true`, the call goes straight to the allocator; `false` (nothing added), it takes the
    /// sampler's slow path ([`c_due`]). The fast paths' one check, for the linked and the
    /// preloaded library alike.
    #[inline(always)]
    pub(crate) fn c_stream_takes(&self, size: usize) -> bool {
        let c = self.c_bytes.load(Relaxed).wrapping_add(size as u64);
        if c < self.c_at.load(Relaxed) {
            self.c_bytes.store(c, Relaxed);
            true
        } else {
            false
        }
    }

    /// Adds a C call's `size` bytes to the C stream; whether it is due a sample (re-armed past it).
    fn c_due(&self, size: usize, rust_bytes: u64) -> bool {
        let after = self.c_bytes.load(Relaxed).wrapping_add(size as u64);
        self.c_bytes.store(after, Relaxed);
        self.rearm_if_stale(rust_bytes);
        self.passes(&self.c_at, after)
    }

    /// Whether a stream now at `after` has passed its point `at` (not while this thread is inside
    /// the sampler); the point then moves a fresh distance past `after`.
    fn passes(&self, at: &AtomicU64, after: u64) -> bool {
        if self.busy.load(Relaxed) || after < at.load(Relaxed) {
            return false;
        }
        let rate = RATE.load(Relaxed);
        at.store(after.saturating_add(self.draw(rate)), Relaxed);
        rate != 0
    }

    /// Draws the point `at` afresh from `from` (a stream that is armed while sampling is on).
    fn rearm_from(&self, at: &AtomicU64, from: u64) {
        let rate = RATE.load(Relaxed);
        if rate != 0 && at.load(Relaxed) != u64::MAX {
            at.store(from.saturating_add(self.draw(rate)), Relaxed);
        }
    }
}

/// Re-arms this thread's sample streams when the rate changed since they were armed (sampling
/// switched on or off). The linked allocator's slow path does it through [`Points::rust_point`];
/// the wrapping library's counting slow path (`super::foreign`) calls this.
#[cfg(not(feature = "jemalloc"))]
pub(crate) fn rearm_if_stale() {
    counters::with_local(|l: &Local| {
        l.sample
            .rearm_if_stale(l.counts.bytes_allocated.load(Relaxed))
    });
}

/// The natural logarithm of `u` in (0, 1], without libm: `f64::ln` is libm's `log`, and a
/// preloaded library that needs libm makes every short-lived process of a job load one more
/// shared object (docs/benchmarks.md, issue 35). `u = m·2^e` with `m` in [1, 2): `ln u = e·ln 2 +
/// 2·atanh((m − 1)/(m + 1))`, the series to 12 terms (|z| < 1/3: error below 1e-12).
fn ln(u: f64) -> f64 {
    let bits = u.to_bits();
    let e = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let m = f64::from_bits((bits & 0x000F_FFFF_FFFF_FFFF) | 0x3FF0_0000_0000_0000);
    let z = (m - 1.0) / (m + 1.0);
    let z2 = z * z;
    let (mut term, mut sum) = (z, 0.0);
    for k in 0..12 {
        sum += term / (2 * k + 1) as f64;
        term *= z2;
    }
    e as f64 * std::f64::consts::LN_2 + 2.0 * sum
}

/// After a failed Rust allocation on the slow path: the next sample point is drawn again from the
/// thread's allocated bytes (the failed request had moved it past bytes never allocated: a failed
/// `try_reserve` of a TiB would otherwise stop the thread's sampling).
#[cold]
pub(crate) fn rust_failed() {
    counters::with_local(|l: &Local| {
        let now = l.counts.bytes_allocated.load(Relaxed);
        l.sample.rearm_from(&l.sample.rust_at, now);
    });
}

/// After a failed C allocation of `size` bytes on the slow path: the bytes leave the C stream
/// again and the next point is drawn from there.
#[cold]
pub(crate) fn c_failed(size: usize) {
    counters::with_local(|l: &Local| {
        let p = &l.sample;
        let c = p.c_bytes.load(Relaxed).wrapping_sub(size as u64);
        p.c_bytes.store(c, Relaxed);
        p.rearm_from(&p.c_at, c);
    });
}

/// Whether a Rust allocation of `size` bytes on this thread is due a sample (its stream then
/// re-armed past it). Called on the allocator's slow path only, before the allocation.
#[inline]
pub(crate) fn rust_due(size: usize) -> bool {
    counters::with_local_or(false, |l: &Local| {
        l.sample
            .rust_due(l.counts.bytes_allocated.load(Relaxed), size)
    })
}

/// Whether a C call of `size` bytes that missed its fast path is due a sample (counted into the
/// C stream either way).
#[inline]
pub(crate) fn c_due(size: usize) -> bool {
    counters::with_local_or(false, |l: &Local| {
        l.sample.c_due(size, l.counts.bytes_allocated.load(Relaxed))
    })
}

/// Allocates a sampled block and records it with the caller's stack; null when the sampled arena
/// is full or missing (the caller then allocates as usual).
///
/// # Safety
/// `align` is a power of two.
#[cold]
#[inline(never)]
pub(crate) unsafe fn alloc(size: usize, align: usize, zero: bool) -> *mut u8 {
    let _busy = Busy::enter();
    let seq = sample_table::next_seq();
    let p = sample_heap::alloc(size, align, zero);
    if p.is_null() {
        LOST.fetch_add(1, Relaxed);
        return p;
    }
    let mut stack = Stack::new();
    stack.capture();
    sample_table::insert(p as usize, size, stack.frames(), seq);
    p
}

/// Frees a sampled block (one that [`sample_heap::contains`]) and drops its record.
///
/// # Safety
/// `p` is a live sampled block, freed once.
#[cold]
#[inline(never)]
pub(crate) unsafe fn free(p: *mut u8) {
    let record = sample_table::remove(p as usize);
    sample_heap::free(p);
    if let Some(r) = record {
        sample_table::freed(r);
    }
}

/// Reallocates a sampled block of `old` requested bytes to `new` bytes aligned to `align`: a new
/// sampled block that keeps the record's stack (the block was sampled when allocated: it stays so
/// while it lives). Null when the sampled arena is full: the caller then moves the block out.
///
/// # Safety
/// `p` is a live sampled block of at least `old` bytes; `align` is a power of two.
#[cold]
#[inline(never)]
pub(crate) unsafe fn realloc(p: *mut u8, old: usize, new: usize, align: usize) -> *mut u8 {
    let q = sample_heap::alloc(new, align, false);
    if q.is_null() {
        return q;
    }
    std::ptr::copy_nonoverlapping(p, q, old.min(new));
    sample_table::moved(p as usize, q as usize, new);
    sample_heap::free(p);
    q
}

/// The usable size of a sampled block.
///
/// # Safety
/// `p` is a live sampled block.
pub(crate) unsafe fn usable(p: *mut u8) -> usize {
    sample_heap::usable(p)
}

/// Marks this thread as inside the sampler while it lives.
struct Busy;

impl Busy {
    fn enter() -> Busy {
        counters::with_local(|l| l.sample.busy.store(true, Relaxed));
        Busy
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        counters::with_local(|l| l.sample.busy.store(false, Relaxed));
    }
}

/// A captured call stack (return addresses, innermost first), on the caller's stack.
struct Stack {
    frames: [usize; sample_table::MAX_FRAMES],
    len: usize,
}

extern "C" {
    fn _Unwind_Backtrace(
        trace: extern "C" fn(*mut c_void, *mut c_void) -> c_int,
        arg: *mut c_void,
    ) -> c_int;
    fn _Unwind_GetIP(ctx: *mut c_void) -> usize;
}

/// A walk shorter than this is taken again with libgcc's unwinder (it cannot have reached the
/// program's code through the allocator's and the sampler's own frames).
const MIN_WALK: usize = 8;

/// `_URC_NO_REASON`: go on.
const UNWIND_CONTINUE: c_int = 0;
/// `_URC_END_OF_STACK`: stop.
const UNWIND_STOP: c_int = 5;

extern "C" fn one_frame(ctx: *mut c_void, arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `Stack` that `capture` passed; `ctx` is libgcc's frame context.
    let s = unsafe { &mut *arg.cast::<Stack>() };
    let ip = unsafe { _Unwind_GetIP(ctx) };
    if ip == 0 || s.len == s.frames.len() {
        return UNWIND_STOP;
    }
    s.frames[s.len] = ip;
    s.len += 1;
    UNWIND_CONTINUE
}

impl Stack {
    fn new() -> Self {
        Stack {
            frames: [0; sample_table::MAX_FRAMES],
            len: 0,
        }
    }

    /// Walks this thread's stack: with the caching walker ([`unwind`]), or libgcc's unwinder when
    /// that stopped early (code without unwind tables, an object loaded since its last refresh).
    /// Both read the program's unwind tables: Rust's, C's and C++'s frames alike, with or without
    /// frame pointers.
    #[inline(never)]
    fn capture(&mut self) {
        let top = counters::with_local_or(0, |l: &Local| {
            let mut top = l.sample.stack_top.load(Relaxed);
            if top == 0 {
                top = match unwind::stack_top() {
                    0 => usize::MAX,
                    t => t,
                };
                l.sample.stack_top.store(top, Relaxed);
            }
            top
        });
        if top != 0 && top != usize::MAX {
            self.len = unwind::walk(&mut self.frames, top);
        }
        if self.len < MIN_WALK {
            self.len = 0;
            SLOW_WALKS.fetch_add(1, Relaxed);
            // SAFETY: `one_frame` only writes into `self`, which outlives the walk.
            unsafe { _Unwind_Backtrace(one_frame, (self as *mut Stack).cast()) };
        }
        // Python's frames where the interpreter ran them (nothing when Python frames are off).
        self.len = crate::pyframes::splice(&mut self.frames, self.len);
    }

    fn frames(&self) -> &[usize] {
        &self.frames[..self.len]
    }
}

/// Starts sampling when the program loads, as `MEMSIGHT_HEAP_SAMPLE` (`setting`: its value, `None`
/// when unset) says — from the executable's pre-initialiser (`super::interpose`), before the shared
/// libraries' initialisers, so their start-up allocations have sites too (grouped as library
/// start-up by the readers). A program without that pre-initialiser (memsight linked into a shared
/// library) starts at its first session.
pub(crate) fn start_at_load(setting: Option<&str>) {
    unwind::note_main_thread();
    // A value that is neither `off` nor a size samples at the default rate (the session says so
    // when it starts: nothing can be printed this early).
    let rate = match setting {
        None => Some(DEFAULT_RATE),
        Some(v) => parse_rate(v).unwrap_or(Some(DEFAULT_RATE)),
    };
    // Made ready even when off, so that the fork handlers are registered now: after jemalloc's
    // (its prepare step then runs after the sampler's) and before any shared library's.
    if enable(rate.unwrap_or(DEFAULT_RATE)).is_ok() && rate.is_none() {
        disable();
    }
}

/// `off` → `None`; a size → `Some(bytes)`.
fn parse_rate(v: &str) -> Result<Option<u64>, String> {
    if v.trim() == "off" {
        return Ok(None);
    }
    memsight_format::units::parse_size(v.trim())
        .ok()
        .filter(|b| *b >= 1)
        .map(Some)
        .ok_or_else(|| format!("MEMSIGHT_HEAP_SAMPLE={v:?} is neither `off` nor a size"))
}

/// The rate `MEMSIGHT_HEAP_SAMPLE` asks for: `Some(bytes)`, `None` for `off`, `default` when it
/// is unset — and `default` too, said once on stderr, for a value that is neither (a bad setting
/// never turns sampling off). Never `Err` (kept for callers that match on it).
pub fn rate_from_env(default: u64) -> Result<Option<u64>, String> {
    let Some(v) = std::env::var_os("MEMSIGHT_HEAP_SAMPLE") else {
        return Ok(Some(default));
    };
    match v.to_str().map(parse_rate) {
        Some(Ok(rate)) => Ok(rate),
        _ => {
            crate::sys::warn_env_once(
                "MEMSIGHT_HEAP_SAMPLE",
                &v,
                &format!(
                    "it is neither `off` nor a size (e.g. 512KiB); sampling one allocation per {} \
                     on average",
                    memsight_format::units::fmt_bytes(default)
                ),
            );
            Ok(Some(default))
        }
    }
}

/// Whether the sampler can run in this process (the sampled arena and tables exist).
pub fn available() -> bool {
    sample_heap::ready()
}

/// Starts sampling one allocation per `rate` bytes on average (creating the sampled arena and
/// tables on first use); `Err` says why the sampler cannot run.
pub fn enable(rate: u64) -> Result<(), String> {
    sample_table::init()?;
    let first = !sample_heap::ready();
    sample_heap::create()?;
    if first {
        static LOCKS: [&super::spin::SpinLock; 3] = [
            &sample_table::INTERN_LOCK,
            &sample_table::SHARED_LOCK,
            &unwind::LOCK,
        ];
        super::spin::SpinLock::hold_across_fork(&LOCKS);
    }
    unwind::refresh();
    RATE.store(rate.max(1), Relaxed);
    GENERATION.fetch_add(1, Relaxed);
    Ok(())
}

/// Brings the stack walker's list of loaded objects up to date (a library loaded since is walked
/// through from then on). Allocates: the session's sampler calls it, never an allocation path.
pub fn refresh_walker() {
    if sample_heap::ready() {
        unwind::refresh();
    }
}

/// An object is about to be unloaded: stack walks use libgcc's unwinder until the walker's next
/// refresh (the session's sampler brings it up to date).
pub(crate) fn objects_unloading() {
    unwind::invalidate();
}

/// Stops sampling (live sampled blocks stay recorded until they are freed).
pub fn disable() {
    RATE.store(0, Relaxed);
    GENERATION.fetch_add(1, Relaxed);
}

/// Mean bytes between samples now; `None` while sampling is off.
pub fn rate() -> Option<u64> {
    match RATE.load(Relaxed) {
        0 => None,
        r => Some(r),
    }
}

/// The sampler's counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Samples taken since the start.
    pub taken: u64,
    /// Samples lost to a full sampled arena or table.
    pub lost: u64,
    /// Live sampled blocks.
    pub live: usize,
    /// Samples whose stack libgcc's unwinder took (the caching walker stopped early).
    pub slow_walks: u64,
}

/// The sampler's counts now.
pub fn counts() -> Counts {
    Counts {
        taken: sample_table::samples(),
        lost: LOST.load(Relaxed) + sample_table::DROPPED.load(Relaxed),
        live: sample_table::live_count(),
        slow_walks: SLOW_WALKS.load(Relaxed),
    }
}

/// Writes the live sampled blocks — or, with `at_peak`, those live at the process heap's latest
/// peak of the running session (exact at the peak, whenever it is written) — as a heap profile in
/// jemalloc's `heap_v2` text (per stack: sampled objects and requested bytes), followed by the
/// Python frames of its stacks and this process's memory map. Streamed to `out` as it is made: a
/// step's profile is written on the job's thread, and a profile held whole (a torch job's memory
/// map alone is hundreds of KiB) would raise the heap peak it measures.
pub fn write_profile(
    out: &mut dyn std::io::Write,
    rate: u64,
    at_peak: bool,
) -> std::io::Result<()> {
    let mut blocks = Vec::new();
    if at_peak {
        sample_table::peak_blocks(&mut blocks);
    } else {
        sample_table::live_blocks(&mut blocks);
    }
    write_text(out, blocks, rate)
}

/// Sampled blocks who were live at the latest peak and that the peak's set misses (its list of
/// freed blocks was full).
pub fn peak_missed() -> u64 {
    sample_table::PEAK_MISSED.load(Relaxed)
}

/// The Python frames of a profile's stacks (tagged words, `crate::pyframes`), one per line after
/// `PYTHON_FRAMES:`: `word<TAB>line<TAB>function<TAB>file` — what a reader shows for them, as the
/// memory map after it tells what native addresses are.
fn python_section(out: &mut dyn std::io::Write, mut words: Vec<u64>) -> std::io::Result<()> {
    if words.is_empty() {
        return Ok(());
    }
    words.sort_unstable();
    words.dedup();
    out.write_all(b"\nPYTHON_FRAMES:\n")?;
    let clean = |s: &str| s.replace(['\t', '\n', '\r'], " ");
    for w in words {
        if let Some(f) = crate::pyframes::describe(w) {
            writeln!(
                out,
                "{w:#x}\t{}\t{}\t{}",
                f.line,
                clean(f.function),
                clean(f.file)
            )?;
        }
    }
    Ok(())
}

fn write_text(
    out: &mut dyn std::io::Write,
    mut blocks: Vec<(u32, usize)>,
    rate: u64,
) -> std::io::Result<()> {
    blocks.sort_unstable_by_key(|&(stack, _)| stack);
    let mut per_stack: Vec<(u32, u64, u64)> = Vec::new();
    for (stack, size) in blocks {
        match per_stack.last_mut() {
            Some((s, n, b)) if *s == stack => {
                *n += 1;
                *b += size as u64;
            }
            _ => per_stack.push((stack, 1, size as u64)),
        }
    }
    let objects: u64 = per_stack.iter().map(|s| s.1).sum();
    let bytes: u64 = per_stack.iter().map(|s| s.2).sum();
    writeln!(out, "heap_v2/{rate}\n  t*: {objects}: {bytes} [0: 0]")?;
    let mut python = Vec::new();
    for (stack, n, b) in per_stack {
        out.write_all(b"@")?;
        let frames = sample_table::frames_of(stack);
        if frames.is_empty() {
            // A sample whose stack did not fit: one unknown frame keeps its bytes in the total.
            out.write_all(b" 0x0")?;
        }
        for f in frames {
            write!(out, " {f:#x}")?;
            if crate::pyframes::is_python(*f) {
                python.push(*f);
            }
        }
        write!(out, "\n  t*: {n}: {b} [0: 0]\n")?;
    }
    python_section(out, python)?;
    out.write_all(b"\nMAPPED_LIBRARIES:\n")?;
    // Copied through a buffer on the stack; a map that cannot be read leaves the section empty.
    if let Ok(mut maps) = std::fs::File::open("/proc/self/maps") {
        std::io::copy(&mut maps, out)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_logarithm_without_libm_is_libms() {
        let mut u = 1.0f64;
        while u > 1e-16 {
            for f in [1.0, 0.999, 0.75, 0.5000001, 0.3, 0.1] {
                let x = u * f;
                assert!(
                    (super::ln(x) - x.ln()).abs() <= 1e-11 * x.ln().abs().max(1.0),
                    "{x}"
                );
            }
            u /= 3.0;
        }
        assert_eq!(super::ln(1.0), 0.0);
    }
}
