//! The Python functions the sampler has met: each code object's file and qualified name, copied
//! once (the object may die; its frames in recorded stacks must still read) into memory mapped for
//! the purpose — never the heap, as this runs inside `malloc`. A frame in a recorded stack is then a
//! tagged word naming an entry and a line ([`super::frame_word`]).
//!
//! Looked up without a lock (an entry is written, then published by its key); only a function never
//! met before takes the table's spin lock. When the table or its text arena is full, frames of new
//! functions read as unknown Python frames (counted).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// Entries of the table (a power of two).
const ENTRIES: usize = 1 << 15;
/// Bytes of text (files and names) kept.
const TEXT: usize = 4 << 20;
/// Longest file or name kept (longer ones are cut at a character boundary).
pub(crate) const MAX_TEXT: usize = 512;

/// One function.
#[repr(C)]
struct Entry {
    /// The code object's address (0: empty). Published last.
    code: AtomicU64,
    /// What else identifies it (an address can be reused by another function): its first line
    /// and its name's and file's string addresses, folded.
    check: AtomicU64,
    /// The file's text: offset into the arena, length.
    file: AtomicU64,
    /// The name's text: offset into the arena, length.
    name: AtomicU64,
}

struct Table {
    entries: *mut Entry,
    text: *mut u8,
}

static TABLE: AtomicUsize = AtomicUsize::new(0);
static USED_TEXT: AtomicUsize = AtomicUsize::new(0);
static LOCK: AtomicBool = AtomicBool::new(false);
/// Frames of functions met when the table was full.
pub(crate) static FULL: AtomicU64 = AtomicU64::new(0);

fn table() -> Option<&'static Table> {
    let t = TABLE.load(Ordering::Acquire);
    // SAFETY: set once by `map`, to a leaked `Table`.
    (t != 0).then(|| unsafe { &*(t as *const Table) })
}

/// Maps the table (once; outside any allocation path). False when the memory was refused.
pub(crate) fn map() -> bool {
    if table().is_some() {
        return true;
    }
    let bytes = ENTRIES * std::mem::size_of::<Entry>() + TEXT;
    // SAFETY: an anonymous private mapping; the kernel gives zeroed pages on first touch.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            bytes,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return false;
    }
    let entries = p.cast::<Entry>();
    // SAFETY: the text arena follows the entries inside the mapping.
    let text = unsafe { p.cast::<u8>().add(ENTRIES * std::mem::size_of::<Entry>()) };
    let t = Box::into_raw(Box::new(Table { entries, text }));
    if TABLE
        .compare_exchange(0, t as usize, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        // Another thread mapped it first: ours is released.
        // SAFETY: `t` came from Box::into_raw above and was never published; `p` is our mapping.
        unsafe {
            drop(Box::from_raw(t));
            libc::munmap(p, bytes);
        }
    }
    true
}

fn slot(t: &Table, i: usize) -> &Entry {
    // SAFETY: `i < ENTRIES`, inside the mapping; entries are only touched through atomics.
    unsafe { &*t.entries.add(i) }
}

fn hash(code: u64) -> usize {
    ((code >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as usize & (ENTRIES - 1)
}

/// The entry of a function, adding it when met for the first time; `None` when the table is full
/// or not mapped. `file` and `name` are read only when it is added.
pub(crate) fn intern(code: u64, check: u64, file: &[u8], name: &[u8]) -> Option<u32> {
    let t = table()?;
    let start = hash(code);
    for probe in 0..ENTRIES {
        let i = (start + probe) & (ENTRIES - 1);
        let e = slot(t, i);
        match e.code.load(Ordering::Acquire) {
            0 => return add(t, i, code, check, file, name),
            c if c == code && e.check.load(Ordering::Relaxed) == check => return Some(i as u32),
            _ => {}
        }
    }
    FULL.fetch_add(1, Ordering::Relaxed);
    None
}

/// Adds a function at the first free slot from `from` (under the lock: another thread may be
/// adding the same one, or taking the same slot).
#[cold]
fn add(t: &Table, from: usize, code: u64, check: u64, file: &[u8], name: &[u8]) -> Option<u32> {
    while LOCK
        .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        std::hint::spin_loop();
    }
    let found = (|| {
        for probe in 0..ENTRIES {
            let i = (from + probe) & (ENTRIES - 1);
            let e = slot(t, i);
            match e.code.load(Ordering::Acquire) {
                0 => {
                    let file = keep(t, file)?;
                    let name = keep(t, name)?;
                    e.check.store(check, Ordering::Relaxed);
                    e.file.store(file, Ordering::Relaxed);
                    e.name.store(name, Ordering::Relaxed);
                    e.code.store(code, Ordering::Release);
                    return Some(i as u32);
                }
                c if c == code && e.check.load(Ordering::Relaxed) == check => {
                    return Some(i as u32)
                }
                _ => {}
            }
        }
        None
    })();
    LOCK.store(false, Ordering::Release);
    if found.is_none() {
        FULL.fetch_add(1, Ordering::Relaxed);
    }
    found
}

/// Copies `s` into the arena: its offset and length, packed.
fn keep(t: &Table, s: &[u8]) -> Option<u64> {
    let at = USED_TEXT.load(Ordering::Relaxed);
    let end = at.checked_add(s.len()).filter(|&e| e <= TEXT)?;
    // SAFETY: [at, end) is inside the arena and not yet handed out (we hold the lock).
    unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), t.text.add(at), s.len()) };
    USED_TEXT.store(end, Ordering::Relaxed);
    Some(((at as u64) << 20) | s.len() as u64)
}

fn text(t: &Table, packed: u64) -> &'static str {
    let (at, len) = ((packed >> 20) as usize, (packed & 0xF_FFFF) as usize);
    // SAFETY: written once by `keep` before the entry was published, never changed after.
    let bytes = unsafe { std::slice::from_raw_parts(t.text.add(at), len) };
    std::str::from_utf8(bytes).unwrap_or("?")
}

/// The file and name of entry `i`, once published.
pub(crate) fn get(i: u32) -> Option<(&'static str, &'static str)> {
    let t = table()?;
    let i = i as usize;
    if i >= ENTRIES {
        return None;
    }
    let e = slot(t, i);
    if e.code.load(Ordering::Acquire) == 0 {
        return None;
    }
    Some((
        text(t, e.file.load(Ordering::Relaxed)),
        text(t, e.name.load(Ordering::Relaxed)),
    ))
}
