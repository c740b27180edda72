//! The flight recorder: a fixed-size ring of slots in a shared file (tmpfs), written by the job
//! without any lock it could wait on, read by the sidecar — also after the job died.
//!
//! Layout (little-endian; `docs/wire.md`): a 128-byte header, then `slot_count` slots of
//! `slot_size` bytes. A writer claims record number `n` with one atomic add on the header's
//! `next_record`, then writes slot `n % slot_count` under a per-slot sequence word (a seqlock):
//! `2n+1` while writing, `2n+2` when complete. A reader copies a slot and accepts it only when the
//! sequence word read before and after is the same even value for the record it expects; records
//! overwritten before it read them are counted as dropped. If nobody reads, nothing accumulates.
//!
//! Neither side can fault on the file: the writer reserves every block with `posix_fallocate`
//! before mapping it (on a full filesystem the ring is refused instead of raising SIGBUS at the
//! first touch), and readers never map it: they copy with `pread`, which sees a file truncated
//! under them as a short read.

mod guard;
mod place;
mod reader;
mod request;

pub use guard::ring_lost;
pub use place::note_place;

pub use reader::{RingInfo, RingReader};
pub use request::{request_heap, HeapRequest};

use super::{Record, WireError, MAJOR, MINOR};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicPtr, AtomicU32, AtomicU64, Ordering};

/// File magic.
pub const MAGIC: [u8; 8] = *b"MSIGHTRG";
/// Header bytes.
pub const HEADER_SIZE: usize = 128;
/// Default slot size: a snapshot's JSON is well under 2 KiB.
pub const DEFAULT_SLOT_SIZE: usize = 4096;
/// Default slot count: 256 × 4 KiB = 1 MiB, 25 s of history at 10 Hz for a reader that fell behind.
pub const DEFAULT_SLOTS: usize = 256;
/// Bytes before a slot's payload: sequence word (8), length (4), kind (2), reserved (2).
const SLOT_HEADER: usize = 16;
/// Header offsets.
const OFF_MAJOR: usize = 8;
const OFF_MINOR: usize = 10;
const OFF_HEADER_SIZE: usize = 12;
const OFF_SLOT_SIZE: usize = 16;
const OFF_SLOT_COUNT: usize = 20;
const OFF_PID: usize = 24;
const OFF_START: usize = 32;
const OFF_INTERVAL: usize = 40;
const OFF_NEXT: usize = 48;
const OFF_ALLOC_FAILURES: usize = 56;
const OFF_ALLOC_FAILED_BYTES: usize = 64;
/// Control words written by a requester (`memsight heap dump|sampling PID`), read by the job.
const OFF_HEAP_DUMP_REQUESTS: usize = 72;
const OFF_HEAP_SAMPLING_REQUEST: usize = 80;
/// Records the writer could not write at all (larger than a quarter of the ring; 1.5).
const OFF_UNWRITTEN: usize = 88;
/// The exit code the writer's process is exiting with (1.6): `EXIT_SAID | code as u8`, 0 while it
/// has said none. A process that ends without it was ended by a signal.
const OFF_EXIT: usize = 96;
/// The flag that marks [`OFF_EXIT`] as said.
const EXIT_SAID: u64 = 1 << 32;
/// The process's address-space limit at its first failed allocation (1.8): `RLIMIT_AS`'s soft
/// limit in bytes, 0 when it had none.
const OFF_FAILED_SPACE_LIMIT: usize = 104;
/// The process's virtual size (every mapping) just after its first failed allocation, under such
/// a limit (1.8): bytes, 0 when unread.
const OFF_FAILED_VIRTUAL: usize = 112;
/// Slot payload kind: a JSON-encoded [`Record`] whole in one slot.
const KIND_JSON: u16 = 1;
/// Slot payload kind (1.5): the first part of a JSON record spread over consecutive slots; the
/// slot header's last two bytes say how many slots it takes.
const KIND_JSON_FIRST: u16 = 2;
/// Slot payload kind (1.5): a later part of such a record; the last two bytes say which part.
const KIND_JSON_PART: u16 = 3;

/// Takes a shared `flock` on a ring file: held by its writer (and inherited by the writer's
/// children) and by its readers for as long as they have it open, so clean-up can tell a ring in
/// use — also by a process in another PID namespace — from a stale one ([`is_unused`]).
fn hold(file: &File) {
    // SAFETY: flock on a descriptor we own; a failure only weakens the clean-up's evidence.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
}

/// Whether nobody holds the ring at `path` open (no writer, no reader): clean-up may remove it.
/// Asks with a non-blocking exclusive `flock`, which fails while any holder's shared lock stands.
pub fn is_unused(path: &Path) -> bool {
    let Ok(file) = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    else {
        return false;
    };
    // SAFETY: flock on a descriptor we own; it is released when `file` closes.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// A shared mapping of a ring file.
struct Map {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; every concurrent access goes through atomics or
// is validated by the seqlock.
unsafe impl Send for Map {}
unsafe impl Sync for Map {}

impl Map {
    fn new(file: &File, len: usize, writable: bool) -> Result<Self, WireError> {
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: mapping a file we hold open, with its checked length.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(WireError::Io(std::io::Error::last_os_error()));
        }
        if writable {
            // A file cut short under the writer must not end its process (guard.rs).
            guard::watch(ptr.cast(), len);
        }
        Ok(Map {
            ptr: ptr.cast(),
            len,
        })
    }

    fn atomic(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off.is_multiple_of(8) && off + 8 <= self.len);
        // SAFETY: in bounds and 8-aligned (the mapping is page-aligned, offsets are multiples of 8).
        unsafe { &*(self.ptr.add(off) as *const AtomicU64) }
    }

    /// The header's failed-allocation count and first failed size.
    fn alloc_failures(&self) -> (u64, u64) {
        (
            self.atomic(OFF_ALLOC_FAILURES).load(Ordering::Acquire),
            self.atomic(OFF_ALLOC_FAILED_BYTES).load(Ordering::Relaxed),
        )
    }

    fn write(&self, off: usize, bytes: &[u8]) {
        // SAFETY: callers pass ranges inside a writable mapping.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(off), bytes.len()) };
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        guard::unwatch(self.ptr);
        // SAFETY: unmapping what `new` mapped.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Where the allocator records a failed allocation: the header words of the session's ring
/// (count, then size), or null when no ring is open. Set once per ring, never unmapped after.
static ALLOC_FAILURE_WORDS: AtomicPtr<AtomicU64> = AtomicPtr::new(std::ptr::null_mut());

/// The session's ring, for the failure path's record of where the first failure happened; null
/// when no ring is open.
static FAILURE_RING: AtomicPtr<RingWriter> = AtomicPtr::new(std::ptr::null_mut());

/// Where the process says its exit code: the header word of the session's ring, or null.
static EXIT_WORD: AtomicPtr<AtomicU64> = AtomicPtr::new(std::ptr::null_mut());
/// The process that installed the header words above: a forked child that has not yet forgotten
/// them (it forgets them when it first needs its own state, not at the fork) writes none.
static WORDS_OWNER: AtomicU32 = AtomicU32::new(0);

/// What `word` points at (a header word, or the leaked writer), when this process installed it.
fn own_word<T>(word: &AtomicPtr<T>) -> Option<&'static T> {
    let p = word.load(Ordering::Acquire);
    // SAFETY: getpid has no preconditions (async-signal-safe).
    let me = unsafe { libc::getpid() } as u32;
    if p.is_null() || WORDS_OWNER.load(Ordering::Relaxed) != me {
        return None;
    }
    // SAFETY: a header word of a mapping that is never unmapped, or the writer
    // `install_alloc_failure_words` leaked: neither is ever freed.
    Some(unsafe { &*p })
}

/// Says in the open ring's header that this process is exiting with `code` (an `exit` or `_exit`
/// call). Async-signal-safe: one atomic store, no allocation, lock or wait.
pub fn note_exit(code: i32) {
    if let Some(w) = own_word(&EXIT_WORD) {
        w.store(EXIT_SAID | u64::from(code as u8), Ordering::Release);
    }
}

/// In a forked child: the ring the parent opened is the parent's. Its header words are no longer
/// this process's to write, and its descriptor is closed here (the file lock the parent's
/// descriptor holds stays the parent's: the lock belongs to the open file, closed only with the
/// last descriptor). Async-signal-safe.
pub fn forget_in_forked_child(ring: Option<&RingWriter>) {
    ALLOC_FAILURE_WORDS.store(std::ptr::null_mut(), Ordering::Release);
    EXIT_WORD.store(std::ptr::null_mut(), Ordering::Release);
    FAILURE_RING.store(std::ptr::null_mut(), Ordering::Release);
    if let Some(r) = ring {
        // SAFETY: closes the child's copy of a descriptor the leaked writer owns; the writer is
        // never dropped (it is `'static`), so the number is never closed twice through it.
        unsafe { libc::close(r._file.as_raw_fd()) };
    }
}

/// Records a failed allocation of `size` bytes in the open ring's header, if any: the count, and
/// the size of the first failure — the request that started the end, not whatever the dying
/// process (its backtrace printer, say) failed to allocate afterwards — with the address space
/// the process had then: its `RLIMIT_AS` and, under one, its virtual size (the limit, not the
/// machine's memory, refuses a request that would take the process past it) — and where the
/// process was, as a [`Record::FailedAt`] in the ring ([`note_place`]). Called on the allocator's
/// failure path: it never allocates, locks or blocks (two system calls, a read of
/// `/proc/self/statm` into the stack and one record copied into the ring, on the first failure
/// only).
pub fn note_alloc_failure(size: usize) {
    if let Some(count) = own_word(&ALLOC_FAILURE_WORDS) {
        let p: *const AtomicU64 = count;
        // SAFETY: the count is followed by the first failure's size, the next header word.
        let first = unsafe { &*p.add(1) };
        let is_first = first
            .compare_exchange(0, size as u64, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok();
        if is_first {
            write_failure_place();
            if let Some(limit) = address_space_limit() {
                // SAFETY: header words of the same mapping, at their documented offsets from the
                // count (OFF_ALLOC_FAILURES).
                let (l, v) = unsafe {
                    (
                        &*p.add((OFF_FAILED_SPACE_LIMIT - OFF_ALLOC_FAILURES) / 8),
                        &*p.add((OFF_FAILED_VIRTUAL - OFF_ALLOC_FAILURES) / 8),
                    )
                };
                v.store(virtual_size().unwrap_or(0), Ordering::Relaxed);
                l.store(limit, Ordering::Relaxed);
            }
        }
        count.fetch_add(1, Ordering::Release);
    }
}

/// Writes the noted place ([`note_place`]) into this process's ring, if it has one. No allocation,
/// lock or wait: a copy onto the stack, one atomic add and a slot's bytes.
fn write_failure_place() {
    let Some(ring) = own_word(&FAILURE_RING) else {
        return;
    };
    let mut buf = [0u8; place::MAX_PLACE];
    if let Some(n) = place::copy(&mut buf) {
        if n <= ring.slot_size - SLOT_HEADER {
            let at = ring.map.atomic(OFF_NEXT).fetch_add(1, Ordering::AcqRel);
            ring.write_slot(at, KIND_JSON, 0, &buf[..n]);
        }
    }
}

/// This process's address-space limit (`RLIMIT_AS`'s soft limit, as `ulimit -v` and `prlimit
/// --as` set it), when it has one. Async-signal-safe: one system call.
fn address_space_limit() -> Option<u64> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we pass; no allocation.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut rl) } == 0;
    (ok && rl.rlim_cur != libc::RLIM_INFINITY).then_some(rl.rlim_cur)
}

/// This process's virtual size in bytes (the first field of `/proc/self/statm`, in pages), read
/// into a buffer on the stack: no allocation, lock or wait (async-signal-safe calls only).
fn virtual_size() -> Option<u64> {
    let mut buf = [0u8; 96];
    // SAFETY: a NUL-terminated path; the descriptor is ours and closed below.
    let fd = unsafe {
        libc::open(
            c"/proc/self/statm".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: reads at most the buffer's length into it.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    // SAFETY: closes the descriptor opened above.
    unsafe { libc::close(fd) };
    let text = buf.get(..usize::try_from(n).ok()?)?;
    let pages = text
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .try_fold(0u64, |acc, b| {
            acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        })?;
    // SAFETY: sysconf has no preconditions (the page size comes from the auxiliary vector).
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages.checked_mul(u64::try_from(page).ok()?)
}

/// The address space of a process whose allocation failed under an address-space limit (wire
/// 1.8): what the ring's header says of its first failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailedAddressSpace {
    /// Its `RLIMIT_AS` (soft limit) then, in bytes.
    pub limit_bytes: u64,
    /// Its virtual size just after the failure, when it could be read.
    pub virtual_bytes: Option<u64>,
}

impl FailedAddressSpace {
    /// Whether this limit is what refused a request of `bytes`: the process's virtual size (when
    /// read) left no room for it under the limit. An allocator maps a little more than it was
    /// asked (headers, alignment), so a request that fits only just is taken as refused too.
    pub fn refuses(&self, bytes: u64) -> bool {
        const SLACK: u64 = 1 << 20;
        self.virtual_bytes
            .is_none_or(|v| v.saturating_add(bytes).saturating_add(SLACK) > self.limit_bytes)
    }

    /// From the header's two words: none when the process had no such limit (or wrote an older
    /// header).
    fn from_words(limit: u64, virtual_bytes: u64) -> Option<Self> {
        (limit > 0).then_some(FailedAddressSpace {
            limit_bytes: limit,
            virtual_bytes: (virtual_bytes > 0).then_some(virtual_bytes),
        })
    }
}

/// The job's side: appends records.
pub struct RingWriter {
    map: Map,
    /// Held open for the life of the writer.
    _file: File,
    path: PathBuf,
    slot_size: usize,
    slots: usize,
    /// Records too large for a slot (never written).
    oversize: AtomicU64,
}

impl RingWriter {
    /// Creates the ring file at `path` (mode 0600; it must not exist) with the default geometry.
    pub fn create(
        path: &Path,
        pid: u32,
        start_unix_ms: u64,
        interval_ms: u64,
    ) -> Result<Self, WireError> {
        Self::create_with(
            path,
            pid,
            start_unix_ms,
            interval_ms,
            DEFAULT_SLOT_SIZE,
            DEFAULT_SLOTS,
        )
    }

    /// Creates a ring with `slots` slots of `slot_size` bytes (a multiple of 8, at least 64).
    pub fn create_with(
        path: &Path,
        pid: u32,
        start_unix_ms: u64,
        interval_ms: u64,
        slot_size: usize,
        slots: usize,
    ) -> Result<Self, WireError> {
        if slot_size < 64 || !slot_size.is_multiple_of(8) || slots == 0 {
            return Err(WireError::NotARing(format!(
                "bad geometry {slots} × {slot_size}"
            )));
        }
        let len = HEADER_SIZE + slot_size * slots;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)?;
        hold(&file);
        // Reserve every block now: a sparse file on a full tmpfs raises SIGBUS at the first touch.
        // SAFETY: fallocate on a file we hold open.
        let err = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
        if err != 0 {
            let _ = std::fs::remove_file(path);
            let e = std::io::Error::from_raw_os_error(err);
            return Err(WireError::Io(std::io::Error::new(
                e.kind(),
                format!("cannot reserve {len} bytes for it: {e}"),
            )));
        }
        let map = Map::new(&file, len, true)?;
        map.write(OFF_MAJOR, &MAJOR.to_le_bytes());
        map.write(OFF_MINOR, &MINOR.to_le_bytes());
        map.write(OFF_HEADER_SIZE, &(HEADER_SIZE as u32).to_le_bytes());
        map.write(OFF_SLOT_SIZE, &(slot_size as u32).to_le_bytes());
        map.write(OFF_SLOT_COUNT, &(slots as u32).to_le_bytes());
        map.write(OFF_PID, &pid.to_le_bytes());
        map.write(OFF_START, &start_unix_ms.to_le_bytes());
        map.write(OFF_INTERVAL, &interval_ms.to_le_bytes());
        // The magic last: a reader never sees a half-written header as valid.
        fence(Ordering::Release);
        map.write(0, &MAGIC);
        fence(Ordering::Release);
        Ok(RingWriter {
            map,
            _file: file,
            path: path.to_path_buf(),
            slot_size,
            slots,
            oversize: AtomicU64::new(0),
        })
    }

    /// Makes this ring the one the allocator reports failed allocations to. The mapping then stays
    /// mapped for the rest of the process, even after the writer is dropped.
    pub fn install_alloc_failure_words(self) -> &'static RingWriter {
        let w: &'static RingWriter = Box::leak(Box::new(self));
        // SAFETY: getpid has no preconditions.
        WORDS_OWNER.store(unsafe { libc::getpid() } as u32, Ordering::Relaxed);
        let p = w.map.atomic(OFF_ALLOC_FAILURES) as *const AtomicU64 as *mut AtomicU64;
        ALLOC_FAILURE_WORDS.store(p, Ordering::Release);
        let e = w.map.atomic(OFF_EXIT) as *const AtomicU64 as *mut AtomicU64;
        EXIT_WORD.store(e, Ordering::Release);
        FAILURE_RING.store(w as *const RingWriter as *mut RingWriter, Ordering::Release);
        w
    }

    /// The ring file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends a record; never waits. A record larger than a slot is spread over consecutive
    /// slots claimed with the same one atomic add; one larger than a quarter of the ring (or not
    /// encodable) is not written and is counted in the header, where readers add it to their
    /// dropped records. Returns whether it was written.
    pub fn append(&self, record: &Record) -> bool {
        let written = self.try_append(record);
        if !written {
            self.unwritten();
        }
        written
    }

    /// As [`RingWriter::append`], without counting a record that does not fit: for a writer that
    /// makes it smaller and tries again (and counts it with [`RingWriter::count_unwritten`] if it
    /// gives up).
    pub fn try_append(&self, record: &Record) -> bool {
        let Ok(payload) = serde_json::to_vec(record) else {
            return false;
        };
        let room = self.slot_size - SLOT_HEADER;
        let parts = payload.len().div_ceil(room).max(1);
        if parts > (self.slots / 4).max(1) || parts > u16::MAX as usize {
            return false;
        }
        let first = self
            .map
            .atomic(OFF_NEXT)
            .fetch_add(parts as u64, Ordering::AcqRel);
        for (i, chunk) in payload.chunks(room).enumerate() {
            let (kind, aux) = match (parts, i) {
                (1, _) => (KIND_JSON, 0),
                (_, 0) => (KIND_JSON_FIRST, parts as u16),
                _ => (KIND_JSON_PART, i as u16),
            };
            self.write_slot(first.wrapping_add(i as u64), kind, aux, chunk);
        }
        if payload.is_empty() {
            self.write_slot(first, KIND_JSON, 0, &[]);
        }
        true
    }

    /// Writes record number `n`'s slot under its sequence word.
    fn write_slot(&self, n: u64, kind: u16, aux: u16, payload: &[u8]) {
        let slot = HEADER_SIZE + (n as usize % self.slots) * self.slot_size;
        let seq = self.map.atomic(slot);
        seq.store(n.wrapping_mul(2).wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        self.map
            .write(slot + 8, &(payload.len() as u32).to_le_bytes());
        self.map.write(slot + 12, &kind.to_le_bytes());
        self.map.write(slot + 14, &aux.to_le_bytes());
        self.map.write(slot + SLOT_HEADER, payload);
        seq.store(n.wrapping_mul(2).wrapping_add(2), Ordering::Release);
    }

    /// Counts a record given up on (see [`RingWriter::try_append`]).
    pub fn count_unwritten(&self) {
        self.unwritten();
    }

    fn unwritten(&self) {
        self.oversize.fetch_add(1, Ordering::Relaxed);
        self.map
            .atomic(OFF_UNWRITTEN)
            .fetch_add(1, Ordering::AcqRel);
    }

    /// Failed allocations recorded in the header, and the size of the first one.
    pub fn alloc_failures(&self) -> (u64, u64) {
        self.map.alloc_failures()
    }

    /// The address-space limit the first failed allocation met, if the process had one.
    pub fn failed_address_space(&self) -> Option<FailedAddressSpace> {
        FailedAddressSpace::from_words(
            self.map
                .atomic(OFF_FAILED_SPACE_LIMIT)
                .load(Ordering::Acquire),
            self.map.atomic(OFF_FAILED_VIRTUAL).load(Ordering::Acquire),
        )
    }

    /// Records not written because they did not fit the ring.
    pub fn oversize(&self) -> u64 {
        self.oversize.load(Ordering::Relaxed)
    }

    /// Heap-profile dumps requested so far (a counter; the job dumps when it grew).
    pub fn heap_dump_requests(&self) -> u64 {
        self.map
            .atomic(OFF_HEAP_DUMP_REQUESTS)
            .load(Ordering::Acquire)
    }

    /// The heap-profile sampling state last requested: 0 none, 1 on, 2 off.
    pub fn heap_sampling_request(&self) -> u64 {
        self.map
            .atomic(OFF_HEAP_SAMPLING_REQUEST)
            .load(Ordering::Acquire)
    }
}
