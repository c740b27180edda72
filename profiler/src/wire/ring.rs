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

use super::{Record, WireError, MAJOR, MINOR};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicPtr, AtomicU64, Ordering};

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
/// Slot payload kind: a JSON-encoded [`Record`].
const KIND_JSON: u16 = 1;

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
        // SAFETY: unmapping what `new` mapped.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Where the allocator records a failed allocation: the header words of the session's ring
/// (count, then size), or null when no ring is open. Set once per ring, never unmapped after.
static ALLOC_FAILURE_WORDS: AtomicPtr<AtomicU64> = AtomicPtr::new(std::ptr::null_mut());

/// Records a failed allocation of `size` bytes in the open ring's header, if any: the count, and
/// the size of the first failure — the request that started the end, not whatever the dying
/// process (its backtrace printer, say) failed to allocate afterwards. Called on the allocator's
/// failure path: it never allocates, locks or blocks.
pub(crate) fn note_alloc_failure(size: usize) {
    let p = ALLOC_FAILURE_WORDS.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: points at two consecutive header words of a mapping that is never unmapped.
        unsafe {
            let _ =
                (*p.add(1)).compare_exchange(0, size as u64, Ordering::Relaxed, Ordering::Relaxed);
            (*p).fetch_add(1, Ordering::Release);
        }
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
        let p = w.map.atomic(OFF_ALLOC_FAILURES) as *const AtomicU64 as *mut AtomicU64;
        ALLOC_FAILURE_WORDS.store(p, Ordering::Release);
        w
    }

    /// The ring file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends a record; never waits. Returns false when the record is larger than a slot.
    pub fn append(&self, record: &Record) -> bool {
        let Ok(payload) = serde_json::to_vec(record) else {
            return false;
        };
        if payload.len() > self.slot_size - SLOT_HEADER {
            self.oversize.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let n = self.map.atomic(OFF_NEXT).fetch_add(1, Ordering::AcqRel);
        let slot = HEADER_SIZE + (n as usize % self.slots) * self.slot_size;
        let seq = self.map.atomic(slot);
        seq.store(n.wrapping_mul(2).wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        self.map
            .write(slot + 8, &(payload.len() as u32).to_le_bytes());
        self.map.write(slot + 12, &KIND_JSON.to_le_bytes());
        self.map.write(slot + SLOT_HEADER, &payload);
        seq.store(n.wrapping_mul(2).wrapping_add(2), Ordering::Release);
        true
    }

    /// Failed allocations recorded in the header, and the size of the first one.
    pub fn alloc_failures(&self) -> (u64, u64) {
        self.map.alloc_failures()
    }

    /// Records dropped because they did not fit a slot.
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

/// A request to a running job through its ring's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeapRequest {
    /// Dump a heap profile now.
    Dump,
    /// Switch allocation sampling on or off.
    Sampling(bool),
}

/// Writes `req` into the header of the ring at `path`; the job acts on it at its next sample.
/// Returns the dump-request count after this request.
pub fn request_heap(path: &Path, req: HeapRequest) -> Result<u64, WireError> {
    let file = OpenOptions::new().read(true).write(true).open(path)?;
    let short = || WireError::NotARing(format!("{} is too short", path.display()));
    if read_at::<8>(&file, 0).ok_or_else(short)? != MAGIC {
        return Err(WireError::NotARing(format!(
            "{} has no ring magic",
            path.display()
        )));
    }
    // Copies, never a mapping: a ring truncated under this command reads or writes short instead
    // of faulting. The read-modify-write of the request words is serialised between requesters
    // by a lock on those header bytes (an open-file-description lock: it does not meet the
    // flock that the job and readers hold on the whole file). The job reads them through its
    // shared mapping, which sees these writes.
    let _lock = HeaderLock::take(&file)?;
    let count = u64_at(&file, OFF_HEAP_DUMP_REQUESTS).ok_or_else(short)?;
    let write = |off: usize, v: u64| {
        file.write_all_at(&v.to_le_bytes(), off as u64)
            .map_err(WireError::from)
    };
    Ok(match req {
        HeapRequest::Dump => {
            write(OFF_HEAP_DUMP_REQUESTS, count + 1)?;
            count + 1
        }
        HeapRequest::Sampling(on) => {
            write(OFF_HEAP_SAMPLING_REQUEST, if on { 1 } else { 2 })?;
            count
        }
    })
}

/// An exclusive open-file-description lock on the heap-request words of a ring's header, released
/// on drop.
struct HeaderLock<'a>(&'a File);

impl<'a> HeaderLock<'a> {
    fn lock(file: &File, kind: libc::c_int, cmd: libc::c_int) -> std::io::Result<()> {
        // SAFETY: an all-zero flock is a valid value to fill in.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = kind as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        fl.l_start = OFF_HEAP_DUMP_REQUESTS as libc::off_t;
        fl.l_len = 16;
        use std::os::fd::AsRawFd;
        // SAFETY: a valid descriptor and a pointer to a live flock.
        if unsafe { libc::fcntl(file.as_raw_fd(), cmd, &fl) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    fn take(file: &'a File) -> Result<Self, WireError> {
        Self::lock(file, libc::F_WRLCK, libc::F_OFD_SETLKW)?;
        Ok(HeaderLock(file))
    }
}

impl Drop for HeaderLock<'_> {
    fn drop(&mut self) {
        let _ = Self::lock(self.0, libc::F_UNLCK, libc::F_OFD_SETLK);
    }
}

/// The header of a ring, as read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingInfo {
    /// Format version.
    pub major: u16,
    /// Format minor version.
    pub minor: u16,
    /// Slot size in bytes.
    pub slot_size: usize,
    /// Number of slots.
    pub slots: usize,
    /// The writing process.
    pub pid: u32,
    /// Session start, Unix milliseconds.
    pub start_unix_ms: u64,
    /// Sampling interval.
    pub interval_ms: u64,
}

/// The sidecar's side: reads records in order, counting what was overwritten before it looked.
/// It reads with `pread`, never through a mapping, so a file truncated under it cannot fault it.
pub struct RingReader {
    file: File,
    info: RingInfo,
    next: u64,
    dropped: u64,
    buf: Vec<u8>,
}

/// `N` bytes at `off`, or `None` when the file is shorter (truncated) or unreadable.
fn read_at<const N: usize>(file: &File, off: usize) -> Option<[u8; N]> {
    let mut b = [0u8; N];
    file.read_exact_at(&mut b, off as u64).ok().map(|()| b)
}

fn u64_at(file: &File, off: usize) -> Option<u64> {
    read_at(file, off).map(u64::from_le_bytes)
}

impl RingReader {
    /// Opens and validates a ring file.
    pub fn open(path: &Path) -> Result<Self, WireError> {
        let file = File::open(path)?;
        hold(&file);
        let len = file.metadata()?.len() as usize;
        let short = || {
            WireError::NotARing(format!(
                "{} is {len} bytes, shorter than the {HEADER_SIZE}-byte header",
                path.display()
            ))
        };
        let header: [u8; HEADER_SIZE] = read_at(&file, 0).ok_or_else(short)?;
        if header[..8] != MAGIC {
            return Err(WireError::NotARing(format!(
                "{} has no ring magic",
                path.display()
            )));
        }
        let field = |o: usize, n: usize| {
            let mut b = [0u8; 8];
            b[..n].copy_from_slice(&header[o..o + n]);
            u64::from_le_bytes(b)
        };
        let major = field(OFF_MAJOR, 2) as u16;
        if major != MAJOR {
            return Err(WireError::Version { found: major });
        }
        let info = RingInfo {
            major,
            minor: field(OFF_MINOR, 2) as u16,
            slot_size: field(OFF_SLOT_SIZE, 4) as usize,
            slots: field(OFF_SLOT_COUNT, 4) as usize,
            pid: field(OFF_PID, 4) as u32,
            start_unix_ms: field(OFF_START, 8),
            interval_ms: field(OFF_INTERVAL, 8),
        };
        let header_size = field(OFF_HEADER_SIZE, 4) as usize;
        let need = info
            .slot_size
            .checked_mul(info.slots)
            .and_then(|s| s.checked_add(HEADER_SIZE));
        if header_size != HEADER_SIZE
            || info.slot_size < 64
            || !info.slot_size.is_multiple_of(8)
            || info.slots == 0
            || need.is_none_or(|n| n > len)
        {
            return Err(WireError::NotARing(format!(
                "{}: header says {} slots of {} bytes ({}-byte header) but the file is {len} bytes",
                path.display(),
                info.slots,
                info.slot_size,
                header_size
            )));
        }
        Ok(RingReader {
            file,
            info,
            next: 0,
            dropped: 0,
            buf: Vec::new(),
        })
    }

    /// The header.
    pub fn info(&self) -> RingInfo {
        self.info
    }

    /// Failed allocations the job recorded, and the size of the first one (read any time, also
    /// after the job died; zeros when the file was cut short).
    pub fn alloc_failures(&self) -> (u64, u64) {
        (
            u64_at(&self.file, OFF_ALLOC_FAILURES).unwrap_or(0),
            u64_at(&self.file, OFF_ALLOC_FAILED_BYTES).unwrap_or(0),
        )
    }

    /// Records lost so far: overwritten before this reader got to them, torn or unreadable.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Every complete record written since the last call, oldest first.
    pub fn poll(&mut self) -> Vec<Record> {
        self.poll_inner(false)
    }

    /// Like [`RingReader::poll`], once the writer is gone: a record it was still writing when it
    /// died is counted as dropped instead of waited for.
    pub fn poll_final(&mut self) -> Vec<Record> {
        self.poll_inner(true)
    }

    fn poll_inner(&mut self, writer_gone: bool) -> Vec<Record> {
        let Some(written) = u64_at(&self.file, OFF_NEXT) else {
            return Vec::new();
        };
        let oldest = written.saturating_sub(self.info.slots as u64);
        if self.next < oldest {
            self.dropped = self.dropped.saturating_add(oldest - self.next);
            self.next = oldest;
        }
        let mut out = Vec::new();
        while self.next < written {
            let n = self.next;
            match self.read_slot(n) {
                Slot::Ready(r) => {
                    out.push(r);
                    self.next += 1;
                }
                // Claimed but not yet complete: look again next time.
                Slot::InProgress if !writer_gone => break,
                Slot::InProgress | Slot::Lost => {
                    self.dropped = self.dropped.saturating_add(1);
                    self.next += 1;
                }
                // The file was cut short under us: nothing more can be read.
                Slot::Gone => break,
            }
        }
        out
    }

    fn read_slot(&mut self, n: u64) -> Slot {
        let slot = HEADER_SIZE + (n as usize % self.info.slots) * self.info.slot_size;
        let Some(head) = read_at::<SLOT_HEADER>(&self.file, slot) else {
            return Slot::Gone;
        };
        let word = |o: usize, k: usize| {
            let mut b = [0u8; 8];
            b[..k].copy_from_slice(&head[o..o + k]);
            u64::from_le_bytes(b)
        };
        let before = word(0, 8);
        // The writer's sequence words for record `n` (wrapping, as a corrupt header may claim any
        // record count).
        let (writing, done) = (
            n.wrapping_mul(2).wrapping_add(1),
            n.wrapping_mul(2).wrapping_add(2),
        );
        if before <= writing {
            return Slot::InProgress;
        }
        if before != done {
            return Slot::Lost;
        }
        let len = word(8, 4) as usize;
        let kind = word(12, 2) as u16;
        if len > self.info.slot_size - SLOT_HEADER {
            return Slot::Lost;
        }
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        buf.resize(len, 0);
        let copied = self
            .file
            .read_exact_at(&mut buf, (slot + SLOT_HEADER) as u64)
            .is_ok();
        fence(Ordering::Acquire);
        let after = u64_at(&self.file, slot);
        let result = if !copied || after.is_none() {
            Slot::Gone
        } else if after != Some(before) || kind != KIND_JSON {
            Slot::Lost
        } else {
            match serde_json::from_slice::<Record>(&buf) {
                Ok(r) => Slot::Ready(r),
                Err(_) => Slot::Lost,
            }
        };
        self.buf = buf;
        result
    }
}

enum Slot {
    Ready(Record),
    InProgress,
    Lost,
    /// Past the end of a file truncated under the reader.
    Gone,
}
