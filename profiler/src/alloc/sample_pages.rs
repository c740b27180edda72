//! Where sampled allocations live in a process whose allocator is not memsight's jemalloc (the
//! preloaded library over glibc's `malloc`): each sampled block in a mapping of its own, placed
//! inside one address range reserved for sampled blocks, so that `free` recognises a sampled
//! pointer with one compare ([`contains`]), as in the jemalloc build (`sample_heap.rs`), whose
//! interface this module has. Every other block stays the program's allocator's.
//!
//! A block's header lies right before it in its mapping: the mapping's length, the record id the
//! sampler keeps for it ([`record_slot`]), where the block starts in the mapping, and its size. A sample is taken once
//! per 512 KiB allocated on average, so a mapping per sampled block costs two system calls per
//! 512 KiB and at most a page of memory per sampled block (≤ 0.8% of the live heap at the default
//! rate); the block's usable size, the figure the heap counts, is its size rounded to 16 bytes,
//! as small as glibc's would be. Mappings are placed at a cursor that moves through the range and
//! wraps; a place still taken (`MAP_FIXED_NOREPLACE` refuses it) is skipped.
//!
//! A training step allocates and frees the same large tensors again and again, nearly all of them
//! sampled (a block of several MiB is sampled with near certainty): a fresh mapping for each would
//! fault in every page every step, where glibc reuses its memory. So a freed mapping of at least
//! 1 MiB is kept (up to 16 mappings and 64 MiB, the most free memory glibc itself keeps at the top
//! of its heap: `M_TRIM_THRESHOLD` at its dynamic maximum), its pages given back to the kernel lazily
//! (`MADV_FREE`: reclaimed under memory pressure, never the reason for an OOM, and free to reuse
//! while still there), and a sampled block of a close size reuses it.
//!
//! Nothing here allocates, locks or panics: `mmap`, `madvise` and `munmap` only.

use super::counters;
use std::sync::atomic::{
    AtomicBool, AtomicU32, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release},
};

/// Where the range starts: the jemalloc build's range (far below the kernel's mappings and the
/// program's heap). A constant, so that [`contains`] loads nothing.
const BASE: usize = 64 << 40;
/// The range's length.
const RANGE: usize = 1 << 40;
const PAGE: usize = 4096;
/// The least offset of a block in its mapping: room for its [`Header`], and 16-byte alignment.
const HEADER: usize = 32;

/// What lies right before a sampled block, in its mapping.
#[repr(C)]
struct Header {
    /// The mapping's length.
    len: usize,
    /// The sampler's record id of the block ([`record_slot`]).
    record: AtomicU32,
    /// Where the block starts in the mapping.
    offset: u32,
    /// The size asked for.
    size: usize,
}

const _: () = assert!(std::mem::size_of::<Header>() <= HEADER);

/// The header of the sampled block at `p` (its fields are written once, with the block; the
/// record id is atomic).
///
/// # Safety
/// `p` is a block from [`alloc`], not yet unmapped.
unsafe fn header<'a>(p: *const u8) -> &'a Header {
    &*((p as usize - std::mem::size_of::<Header>()) as *const Header)
}
/// Freed mappings at least this long are kept for reuse ([`Kept`]); shorter ones are unmapped.
const KEEP_FROM: usize = 1 << 20;
/// Freed mappings kept at most, and their bytes at most.
const KEPT_SLOTS: usize = 16;
const KEPT_BYTES: usize = 64 << 20;
/// Places tried for one block before the sample is given up (the caller allocates as usual).
const TRIES: usize = 16;

/// Set once the range was found free.
static READY: AtomicBool = AtomicBool::new(false);
/// Where the next mapping goes, from [`BASE`].
static CURSOR: AtomicUsize = AtomicUsize::new(0);

/// Whether `p` is a sampled block: inside the range. One subtraction and one compare.
#[inline(always)]
pub(crate) fn contains(p: *const u8) -> bool {
    (p as usize).wrapping_sub(BASE) < RANGE
}

/// Whether sampled blocks can be placed.
pub(crate) fn ready() -> bool {
    READY.load(Relaxed)
}

/// Checks that the range is free (once; not on an allocation path). `Err` says why it is not.
pub(crate) fn create() -> Result<(), String> {
    if ready() {
        return Ok(());
    }
    // SAFETY: MAP_FIXED_NOREPLACE never replaces a mapping; the probe is unmapped at once.
    let p = unsafe { map_at(BASE, PAGE) };
    if p != BASE {
        return Err(format!(
            "the address range for sampled blocks ({BASE:#x}) is in use by another mapping"
        ));
    }
    // SAFETY: the page just mapped.
    unsafe { libc::munmap(p as *mut libc::c_void, PAGE) };
    READY.store(true, Relaxed);
    Ok(())
}

/// Maps `len` bytes at `at` without replacing anything: `at` on success, 0 otherwise.
unsafe fn map_at(at: usize, len: usize) -> usize {
    let p = libc::mmap(
        at as *mut libc::c_void,
        len,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED_NOREPLACE,
        -1,
        0,
    );
    if p == libc::MAP_FAILED {
        return 0;
    }
    if p as usize != at {
        // An old kernel took the address as a hint and mapped elsewhere.
        libc::munmap(p, len);
        return 0;
    }
    at
}

/// A place for a mapping of `len` bytes aligned to `align` (a power of two, at least a page),
/// from the cursor (wrapping at the range's end).
fn place(len: usize, align: usize) -> Option<usize> {
    let mut cur = CURSOR.load(Relaxed);
    loop {
        let start = cur.checked_next_multiple_of(align)?;
        let (start, end) = match start.checked_add(len) {
            Some(end) if end <= RANGE => (start, end),
            _ if len <= RANGE => (0, len),
            _ => return None,
        };
        match CURSOR.compare_exchange_weak(cur, end, Relaxed, Relaxed) {
            Ok(_) => return Some(BASE + start),
            Err(now) => cur = now,
        }
    }
}

/// Allocates a sampled block of `size` bytes aligned to `align` (zeroed when `zero`: a new mapping
/// is; a kept one is cleared); null when the range has no place for it.
///
/// # Safety
/// `align` is a power of two.
#[inline]
pub(crate) unsafe fn alloc(size: usize, align: usize, zero: bool) -> *mut u8 {
    if !ready() {
        return std::ptr::null_mut();
    }
    let offset = align.max(HEADER);
    let Some(len) = offset
        .checked_add(size.max(1))
        .and_then(|n| n.checked_next_multiple_of(PAGE))
    else {
        return std::ptr::null_mut();
    };
    let Ok(offset32) = u32::try_from(offset) else {
        return std::ptr::null_mut();
    };
    if offset <= PAGE {
        if let Some((at, kept_len)) = KEPT.take(len) {
            let p = at + offset;
            if zero {
                // Kept pages hold what their last block wrote (or zeros, where reclaimed).
                std::ptr::write_bytes(p as *mut u8, 0, size);
            }
            write_header(p, kept_len, offset32, size);
            return p as *mut u8;
        }
    }
    for _ in 0..TRIES {
        let Some(at) = place(len, offset.max(PAGE)) else {
            return std::ptr::null_mut();
        };
        if map_at(at, len) == 0 {
            continue;
        }
        let p = at + offset;
        write_header(p, len, offset32, size);
        return p as *mut u8;
    }
    std::ptr::null_mut()
}

/// Writes the header of the block at `p` (record id 0).
unsafe fn write_header(p: usize, len: usize, offset: u32, size: usize) {
    ((p - std::mem::size_of::<Header>()) as *mut Header).write(Header {
        len,
        record: AtomicU32::new(0),
        offset,
        size,
    });
}

/// Freed mappings kept for reuse: `(start, length)` pairs, each slot taken or filled whole by one
/// compare-and-swap of its start (0: empty) — no lock.
struct Kept {
    start: [AtomicUsize; KEPT_SLOTS],
    len: [AtomicUsize; KEPT_SLOTS],
    bytes: AtomicUsize,
}

static KEPT: Kept = Kept {
    start: [const { AtomicUsize::new(0) }; KEPT_SLOTS],
    len: [const { AtomicUsize::new(0) }; KEPT_SLOTS],
    bytes: AtomicUsize::new(0),
};

/// A slot's start while its owner fills or empties it.
const BUSY: usize = 1;

impl Kept {
    /// A kept mapping of at least `need` bytes and not much more (a quarter and 64 KiB): its start
    /// and length.
    fn take(&self, need: usize) -> Option<(usize, usize)> {
        if self.bytes.load(Relaxed) == 0 {
            return None;
        }
        let most = need + need / 4 + (64 << 10);
        for i in 0..KEPT_SLOTS {
            let start = self.start[i].load(Acquire);
            if start <= BUSY {
                continue;
            }
            let len = self.len[i].load(Relaxed);
            if len < need || len > most {
                continue;
            }
            if self.start[i]
                .compare_exchange(start, BUSY, Acquire, Relaxed)
                .is_err()
            {
                continue;
            }
            // The length read before the swap may be another mapping's: read it again, ours now.
            let len = self.len[i].load(Relaxed);
            self.start[i].store(0, Release);
            self.bytes.fetch_sub(len, Relaxed);
            if len >= need && len <= most {
                return Some((start, len));
            }
            // SAFETY: the kept mapping, taken from its slot: ours alone.
            unsafe { libc::munmap(start as *mut libc::c_void, len) };
        }
        None
    }

    /// Keeps a freed mapping when there is room; false: the caller unmaps it.
    fn keep(&self, start: usize, len: usize) -> bool {
        if len < KEEP_FROM || self.bytes.load(Relaxed) + len > KEPT_BYTES {
            return false;
        }
        for i in 0..KEPT_SLOTS {
            if self.start[i]
                .compare_exchange(0, BUSY, Acquire, Relaxed)
                .is_ok()
            {
                // SAFETY: the freed block's own mapping. The kernel may take its pages back at any
                // time; they read as zeros then.
                unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_FREE) };
                self.len[i].store(len, Relaxed);
                self.bytes.fetch_add(len, Relaxed);
                self.start[i].store(start, Release);
                return true;
            }
        }
        false
    }
}

/// Frees a sampled block: keeps its mapping for reuse, or unmaps it.
///
/// # Safety
/// `p` came from [`alloc`] and is freed once.
#[inline]
pub(crate) unsafe fn free(p: *mut u8) {
    let h = header(p);
    let (len, start) = (h.len, p as usize - h.offset as usize);
    if !KEPT.keep(start, len) {
        libc::munmap(start as *mut libc::c_void, len);
    }
}

/// Nothing kept per thread.
pub(crate) fn retire_thread(_: &counters::Local) {}

/// The record id word of the sampled block at `p` (in its header).
#[inline]
pub(crate) fn record_slot(p: *const u8) -> Option<&'static AtomicU32> {
    if !contains(p) {
        return None;
    }
    // SAFETY: a sampled block's header lies right before it in its mapping.
    Some(unsafe { &header(p).record })
}

/// The usable size of a sampled block: its size rounded up to 16 bytes.
///
/// # Safety
/// `p` is a live block from [`alloc`].
pub(crate) unsafe fn usable(p: *mut u8) -> usize {
    header(p).size.max(1).next_multiple_of(16)
}
