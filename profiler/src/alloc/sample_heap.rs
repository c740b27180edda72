//! Where sampled allocations live: a jemalloc arena of their own whose memory comes from one
//! address range reserved for it, so that a free recognises a sampled pointer with one compare
//! ([`contains`]) and no lookup.
//!
//! The arena's extent hooks hand jemalloc pieces of the range, each mapped when jemalloc asks for
//! it (`MAP_FIXED_NOREPLACE` at the range's next address); jemalloc then manages them as it does
//! any memory — reuse, splitting, merging, purging (`madvise`) — so a sampled block costs what a
//! jemalloc block costs, and jemalloc's per-thread counters count it like every other (the process
//! heap stays exact).
//!
//! Sampled blocks are allocated and freed through a jemalloc thread cache of the calling thread's
//! own (an explicit `tcache.create`, made at the thread's first sample and destroyed when it
//! exits; a thread without a registry entry goes to the arena uncached), never the threads'
//! ordinary caches, so no sampled block is ever handed to an unsampled allocation, and no lock is
//! shared between threads that sample at once.
//!
//! Beside the range lies its address map: one `u32` per 16 bytes of the range (sampled blocks are
//! at least 16 bytes, so at least 16 bytes apart), where the sampler keeps the id of a block's
//! record ([`record_slot`]); it is mapped in pieces together with the pieces of the range.
//!
//! Nothing is reserved up front: the range (1 TiB of addresses) starts at a fixed address far
//! below where the kernel places mappings and programs (64 TiB; when something else is mapped
//! there, the process has no sampler), and only what jemalloc asked for is mapped — so the process's address-space size and an
//! `RLIMIT_AS` see sampled blocks as they see any other. Were something else mapped at the next
//! address, or the range full, allocations that would have been sampled are served as usual and
//! counted as lost samples ([`crate::alloc::sampling`]). A pointer of something else mapped inside
//! the range is still a jemalloc block: freeing it as a sampled one frees it correctly.

use super::counters::{self, state};
use std::ffi::{c_uint, c_void};
use std::sync::atomic::{
    AtomicBool, AtomicU32, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release},
};
use tikv_jemalloc_sys as je;

/// Bytes of the range handed to jemalloc so far.
static USED: AtomicUsize = AtomicUsize::new(0);
/// The `mallocx` flags of a sampled block's arena; 0 until created.
static FLAGS: AtomicUsize = AtomicUsize::new(0);

/// Where the range starts: far below the kernel's mappings (top-down from below the stack,
/// 128 TiB) and the program and its `brk` heap (from 85 TiB for position-independent programs).
/// A constant, so that [`contains`] loads nothing.
const BASE: usize = 64 << 40;
/// The range's length.
const RANGE: usize = 1 << 40;
/// The address map: one `u32` per `1 << MAP_SHIFT` bytes of the range, right after it.
const MAP_BASE: usize = BASE + RANGE;
const MAP_SHIFT: u32 = 4;
/// The map is mapped in granules, each covering `1 << GRANULE_BITS` bytes of the range.
const GRANULE_BITS: u32 = 26;
const GRANULE_MAP_BYTES: usize = ((1 << GRANULE_BITS) >> MAP_SHIFT) * 4;
/// Which granules of the map are mapped.
static MAPPED: [AtomicBool; RANGE >> GRANULE_BITS] =
    [const { AtomicBool::new(false) }; RANGE >> GRANULE_BITS];

/// How long the sampled arena keeps freed pages before giving them back, in milliseconds (see
/// [`create`]).
const SAMPLED_DECAY_MS: isize = 1000;

/// Whether `p` is a sampled block: inside the range. One subtraction and one compare against
/// constants. (Before the arena exists nothing of the allocator's is there: the kernel places
/// mappings from the top down, 64 TiB away.)
#[inline(always)]
pub(crate) fn contains(p: *const u8) -> bool {
    (p as usize).wrapping_sub(BASE) < RANGE
}

/// Whether the arena exists.
pub(crate) fn ready() -> bool {
    FLAGS.load(Relaxed) != 0
}

/// Picks the range and creates the arena (once; not on an allocation path: `arenas.create`
/// takes jemalloc's locks). `Err` says why there is none.
pub(crate) fn create() -> Result<(), String> {
    if ready() {
        return Ok(());
    }
    if !unmapped(BASE) || !unmapped(MAP_BASE) {
        return Err(format!(
            "the address range for sampled blocks ({BASE:#x}) is in use by another mapping"
        ));
    }
    let mut arena: c_uint = 0;
    let mut len_out = std::mem::size_of::<c_uint>();
    let mut hooks: *mut je::extent_hooks_t = (&raw const HOOKS).cast_mut();
    // SAFETY: `arenas.create` writes an unsigned arena index and takes an extent-hooks pointer,
    // which points at a static that outlives the process.
    let rc = unsafe {
        je::mallctl(
            c"arenas.create".as_ptr(),
            (&raw mut arena).cast(),
            &mut len_out,
            (&raw mut hooks).cast(),
            std::mem::size_of::<*mut je::extent_hooks_t>(),
        )
    };
    if rc != 0 {
        return Err(format!(
            "jemalloc could not create the sampled arena (error {rc})"
        ));
    }
    // Freed sampled pages go back to the kernel after a second (jemalloc's default is 10 s). The
    // job's own arenas cannot reuse this one's pages, so with the default a sampled job held both
    // (the reference job's max RSS 1.12x unsampled, 1.05x in a later measurement); at once (0 ms,
    // a purge at every free) every large block a job freed and allocated again came back as fresh
    // pages, and almost every block of a few MiB is sampled: 8.4x the page faults and 5.8x the time
    // of the unsampled job in `exit_rss`, 2.7x the faults of the reference job. At 1 s both are at
    // parity: max RSS 0.99x (reference job) and 1.01x (`exit_rss`), faults 1.0x (docs/benchmarks.md).
    // A job that asked jemalloc for a shorter decay (`MALLOC_CONF=dirty_decay_ms:…`) gets it here too.
    let mut decay: isize = SAMPLED_DECAY_MS;
    let mut asked: isize = -1;
    let mut len = std::mem::size_of::<isize>();
    // SAFETY: `opt.dirty_decay_ms` is an `ssize_t` option, read into one.
    let rc = unsafe {
        je::mallctl(
            c"opt.dirty_decay_ms".as_ptr(),
            (&raw mut asked).cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    if rc == 0 && (0..SAMPLED_DECAY_MS).contains(&asked) {
        decay = asked;
    }
    let name = format!("arena.{arena}.dirty_decay_ms\0");
    // SAFETY: the control takes an `ssize_t`; `name` is NUL-terminated. A refusal leaves the
    // default decay (the arena works either way).
    unsafe {
        je::mallctl(
            name.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            (&raw mut decay).cast(),
            std::mem::size_of::<isize>(),
        )
    };
    FLAGS.store(je::MALLOCX_ARENA(arena as usize) as usize, Relaxed);
    Ok(())
}

/// Whether nothing is mapped at `at` (one page mapped there and unmapped again).
fn unmapped(at: usize) -> bool {
    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; the probe page is unmapped
    // before anything can use it.
    unsafe {
        let p = libc::mmap(
            at as *mut c_void,
            4096,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return false;
        }
        libc::munmap(p, 4096);
        p as usize == at
    }
}

/// Allocates a sampled block of `size` bytes (at least 16) aligned to `align` (zeroed when
/// `zero`); null when the arena is missing or full.
///
/// # Safety
/// `align` is a power of two.
#[inline]
pub(crate) unsafe fn alloc(size: usize, align: usize, zero: bool) -> *mut u8 {
    let arena = FLAGS.load(Relaxed) as i32;
    if arena == 0 {
        return std::ptr::null_mut();
    }
    // The thread's own cache (jemalloc serves sizes above what caches hold from the arena).
    let mut flags = arena | je::MALLOCX_ALIGN(align.max(1)) | thread_cache();
    if zero {
        flags |= je::MALLOCX_ZERO;
    }
    je::mallocx(size.max(1 << MAP_SHIFT), flags).cast()
}

/// Frees a sampled block (into this thread's cache of sampled blocks, for the sizes it caches).
///
/// # Safety
/// `p` came from [`alloc`] and is freed once.
#[inline]
pub(crate) unsafe fn free(p: *mut u8) {
    // A block of the range freed before the arena existed: no cache of its arena.
    let cache = if ready() {
        thread_cache()
    } else {
        je::MALLOCX_TCACHE_NONE
    };
    je::dallocx(p.cast(), cache);
}

/// This thread's cache of sampled blocks, as `mallocx` flags: made at its first use by a
/// registered thread (whose exit destroys it, [`retire_thread`]); none for other threads, or when
/// jemalloc has no more explicit caches to give.
#[inline]
fn thread_cache() -> i32 {
    counters::with_local_or(je::MALLOCX_TCACHE_NONE, |l| {
        if l.state.load(Relaxed) != state::REGISTERED {
            return je::MALLOCX_TCACHE_NONE;
        }
        let c = &l.sample.tcache;
        let mut t = c.load(Relaxed);
        if t == 0 {
            t = new_cache();
            c.store(t, Relaxed);
        }
        match t {
            u32::MAX => je::MALLOCX_TCACHE_NONE,
            t => je::MALLOCX_TCACHE(t as usize - 1),
        }
    })
}

/// A new explicit jemalloc cache (its index + 1), or `u32::MAX` when jemalloc refuses one.
#[cold]
fn new_cache() -> u32 {
    let mut tcache: c_uint = 0;
    let mut len = std::mem::size_of::<c_uint>();
    // SAFETY: `tcache.create` writes an unsigned cache index.
    let rc = unsafe {
        je::mallctl(
            c"tcache.create".as_ptr(),
            (&raw mut tcache).cast(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    if rc == 0 && tcache < u32::MAX - 1 {
        tcache + 1
    } else {
        u32::MAX
    }
}

/// The thread of `l` is exiting: its cache of sampled blocks goes back to the arena (called once
/// the thread no longer counts as registered, so its later samples are uncached).
pub(crate) fn retire_thread(l: &counters::Local) {
    let t = l.sample.tcache.swap(u32::MAX, Relaxed);
    if t == 0 || t == u32::MAX {
        return;
    }
    let mut index: c_uint = t - 1;
    // SAFETY: `tcache.destroy` reads an unsigned cache index that `tcache.create` made.
    unsafe {
        je::mallctl(
            c"tcache.destroy".as_ptr(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            (&raw mut index).cast(),
            std::mem::size_of::<c_uint>(),
        );
    }
}

/// The word of the address map that belongs to the sampled block at `p`: where the sampler keeps
/// the id of its record. `None` outside the range or where the map is not mapped (nothing of the
/// sampled arena's is there).
#[inline]
pub(crate) fn record_slot(p: *const u8) -> Option<&'static AtomicU32> {
    let off = (p as usize).wrapping_sub(BASE);
    if off >= RANGE || !MAPPED[off >> GRANULE_BITS].load(Acquire) {
        return None;
    }
    // SAFETY: inside a mapped granule of the map; `u32`-aligned.
    Some(unsafe { &*((MAP_BASE + (off >> MAP_SHIFT) * 4) as *const AtomicU32) })
}

/// Maps the address map's granules for the range's bytes `[start, end)`; `false` when the kernel
/// refused one.
fn map_for(start: usize, end: usize) -> bool {
    let first = (start - BASE) >> GRANULE_BITS;
    let last = (end - 1 - BASE) >> GRANULE_BITS;
    for (g, mapped) in MAPPED.iter().enumerate().take(last + 1).skip(first) {
        if mapped.load(Acquire) {
            continue;
        }
        let at = MAP_BASE + g * GRANULE_MAP_BYTES;
        // SAFETY: MAP_FIXED_NOREPLACE never replaces a mapping; the map's addresses are the
        // sampler's (checked free when the arena was created).
        let p = unsafe {
            libc::mmap(
                at as *mut c_void,
                GRANULE_MAP_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE
                    | libc::MAP_ANONYMOUS
                    | libc::MAP_NORESERVE
                    | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        // EEXIST: another thread carving at once mapped it first.
        // SAFETY: the calling thread's errno.
        let ours = p as usize == at
            || (p == libc::MAP_FAILED && unsafe { *libc::__errno_location() } == libc::EEXIST);
        if !ours {
            if p != libc::MAP_FAILED {
                // SAFETY: the mapping just made elsewhere (an old kernel took the address as a
                // hint).
                unsafe { libc::munmap(p, GRANULE_MAP_BYTES) };
            }
            return false;
        }
        mapped.store(true, Release);
    }
    true
}

/// The usable size of a sampled block.
///
/// # Safety
/// `p` is a live block from [`alloc`].
pub(crate) unsafe fn usable(p: *mut u8) -> usize {
    je::malloc_usable_size(p.cast())
}

/// The arena's extent hooks: pieces of the range; splitting and merging always succeed (the pieces
/// are contiguous anonymous memory); purging is `madvise(MADV_DONTNEED)`; deallocation, decommit
/// and lazy purging are declined (jemalloc retains the addresses, as it does by default on 64-bit
/// Linux, and keeps them committed, so it never asks to commit them again).
static HOOKS: je::extent_hooks_t = je::extent_hooks_t {
    alloc: Some(extent_alloc),
    dalloc: None,
    destroy: None,
    commit: None,
    decommit: None,
    purge_lazy: None,
    purge_forced: Some(extent_purge_forced),
    split: Some(extent_split),
    merge: Some(extent_merge),
};

unsafe extern "C" fn extent_alloc(
    _: *mut je::extent_hooks_t,
    new_addr: *mut c_void,
    size: usize,
    alignment: usize,
    zero: *mut bool,
    commit: *mut bool,
    _: c_uint,
) -> *mut c_void {
    // A refused mapping sets errno; the allocation it serves may still succeed (keep the caller's).
    let errno = *libc::__errno_location();
    let p = carve(new_addr, size, alignment, zero, commit);
    *libc::__errno_location() = errno;
    p
}

/// [`extent_alloc`]'s work: the next piece of the range, mapped.
unsafe fn carve(
    new_addr: *mut c_void,
    size: usize,
    alignment: usize,
    zero: *mut bool,
    commit: *mut bool,
) -> *mut c_void {
    let (base, len) = (BASE, RANGE);
    let mut used = USED.load(Relaxed);
    loop {
        let start = (base + used).next_multiple_of(alignment.max(1));
        if !new_addr.is_null() && new_addr as usize != start {
            return std::ptr::null_mut();
        }
        let end = match start.checked_add(size) {
            Some(e) if e <= base + len => e,
            _ => return std::ptr::null_mut(),
        };
        match USED.compare_exchange_weak(used, end - base, Relaxed, Relaxed) {
            Ok(_) => {
                if !map_for(start, end) {
                    return std::ptr::null_mut();
                }
                let p = libc::mmap(
                    start as *mut c_void,
                    size,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                    -1,
                    0,
                );
                if p == libc::MAP_FAILED {
                    return std::ptr::null_mut();
                }
                if p as usize != start {
                    // A kernel without MAP_FIXED_NOREPLACE took the address as a hint.
                    libc::munmap(p, size);
                    return std::ptr::null_mut();
                }
                // Fresh anonymous pages: zeroed and committed.
                *zero = true;
                *commit = true;
                return p;
            }
            Err(now) => used = now,
        }
    }
}

unsafe extern "C" fn extent_purge_forced(
    _: *mut je::extent_hooks_t,
    addr: *mut c_void,
    _size: usize,
    offset: usize,
    length: usize,
    _: c_uint,
) -> bool {
    libc::madvise(
        (addr as usize + offset) as *mut c_void,
        length,
        libc::MADV_DONTNEED,
    ) != 0
}

unsafe extern "C" fn extent_split(
    _: *mut je::extent_hooks_t,
    _: *mut c_void,
    _: usize,
    _: usize,
    _: usize,
    _: bool,
    _: c_uint,
) -> bool {
    false
}

unsafe extern "C" fn extent_merge(
    _: *mut je::extent_hooks_t,
    _: *mut c_void,
    _: usize,
    _: *mut c_void,
    _: usize,
    _: bool,
    _: c_uint,
) -> bool {
    false
}
