//! The reading side of the flight recorder: the header as read, and a reader that copies slots
//! with `pread` (never through a mapping) and counts the records overwritten before it read them.

use super::*;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The largest slot a reader accepts (16 MiB; memsight writes 4 KiB slots).
pub const MAX_SLOT_SIZE: usize = 16 << 20;
/// The largest ring a reader accepts, all slots together (256 MiB; memsight writes 1 MiB). What a
/// reader holds of one record is at most a ring's slots, so a crafted header (a sparse file
/// claiming gigabytes) cannot make it allocate more than this.
pub const MAX_RING_BYTES: usize = 256 << 20;

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
}

/// `N` bytes at `off`, or `None` when the file is shorter (truncated) or unreadable.
pub(super) fn read_at<const N: usize>(file: &File, off: usize) -> Option<[u8; N]> {
    let mut b = [0u8; N];
    file.read_exact_at(&mut b, off as u64).ok().map(|()| b)
}

pub(super) fn u64_at(file: &File, off: usize) -> Option<u64> {
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
        let name = path.display();
        if info.slot_size > MAX_SLOT_SIZE
            || info.slots.saturating_mul(info.slot_size) > MAX_RING_BYTES
        {
            return Err(WireError::NotARing(format!(
                "{name}: header says {} slots of {} bytes, over what a ring may have (slots of at \
                 most {MAX_SLOT_SIZE} bytes, {MAX_RING_BYTES} bytes in all)",
                info.slots, info.slot_size
            )));
        }
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
                "{name}: header says {} slots of {} bytes ({}-byte header) but the file is {len} bytes",
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
        })
    }

    /// The header.
    pub fn info(&self) -> RingInfo {
        self.info
    }

    /// The exit code the writer's process said it was exiting with (wire 1.6); `None` while it
    /// has said none (it runs, or a signal ended it).
    pub fn exit_code(&self) -> Option<i32> {
        let w = u64_at(&self.file, OFF_EXIT)?;
        (w & EXIT_SAID != 0).then_some((w & 0xff) as i32)
    }

    /// Failed allocations the job recorded, and the size of the first one (read any time, also
    /// after the job died; zeros when the file was cut short).
    pub fn alloc_failures(&self) -> (u64, u64) {
        (
            u64_at(&self.file, OFF_ALLOC_FAILURES).unwrap_or(0),
            u64_at(&self.file, OFF_ALLOC_FAILED_BYTES).unwrap_or(0),
        )
    }

    /// The address-space limit the job's first failed allocation met (wire 1.8; any time, also
    /// after the job died): `None` when it had no such limit, or none failed.
    pub fn failed_address_space(&self) -> Option<FailedAddressSpace> {
        FailedAddressSpace::from_words(
            u64_at(&self.file, OFF_FAILED_SPACE_LIMIT).unwrap_or(0),
            u64_at(&self.file, OFF_FAILED_VIRTUAL).unwrap_or(0),
        )
    }

    /// Records lost so far: overwritten before this reader got to them, torn or unreadable, and
    /// those the writer could not write at all (too large for the ring, counted in its header).
    pub fn dropped(&self) -> u64 {
        self.dropped
            .saturating_add(u64_at(&self.file, OFF_UNWRITTEN).unwrap_or(0))
    }

    /// Whether no process writes the ring any more while this reader holds it: its writer (and
    /// every child that inherited the writer's descriptor) closed it — it ended, or `exec`'d a
    /// program without the session. Asked with the lock every holder takes: this reader lets go of
    /// its own for the moment of an exclusive try on a fresh descriptor. Another reader (an
    /// `attach`) holding it makes the answer "no".
    pub fn writer_gone(&self, path: &Path) -> bool {
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor this reader owns.
        unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_UN) };
        let gone = is_unused(path);
        hold(&self.file);
        gone
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
                Slot::Ready(KIND_JSON, _, bytes) => {
                    self.take(&bytes, &mut out);
                    self.next += 1;
                }
                Slot::Ready(KIND_JSON_FIRST, parts, mut bytes) => {
                    let parts = u64::from(parts.max(1));
                    if n.saturating_add(parts) > written {
                        // A header that claims more parts than were claimed: corrupt.
                        self.lose(1);
                        continue;
                    }
                    match self.read_parts(n, parts, &mut bytes, writer_gone) {
                        Parts::Complete => {
                            self.take(&bytes, &mut out);
                            self.next += parts;
                        }
                        Parts::Wait => break,
                        Parts::Lost => {
                            self.dropped = self.dropped.saturating_add(1);
                            self.next += parts;
                        }
                        Parts::Gone => break,
                    }
                }
                // A later part whose first part was overwritten before it was read (already
                // counted among the records overwritten).
                Slot::Ready(KIND_JSON_PART, _, _) => self.next += 1,
                Slot::Ready(..) => self.lose(1),
                // Claimed but not yet complete: look again next time.
                Slot::InProgress if !writer_gone => break,
                Slot::InProgress | Slot::Lost => self.lose(1),
                // The file was cut short under us: nothing more can be read.
                Slot::Gone => break,
            }
        }
        out
    }

    /// Counts `k` records lost and moves past them.
    fn lose(&mut self, k: u64) {
        self.dropped = self.dropped.saturating_add(k);
        self.next += k;
    }

    /// Decodes one record's bytes into `out`, or counts it lost.
    fn take(&mut self, bytes: &[u8], out: &mut Vec<Record>) {
        match serde_json::from_slice::<Record>(bytes) {
            Ok(r) => out.push(r),
            Err(_) => self.dropped = self.dropped.saturating_add(1),
        }
    }

    /// Appends parts 1.. of the record that starts at slot `n` to `bytes`.
    fn read_parts(&mut self, n: u64, parts: u64, bytes: &mut Vec<u8>, writer_gone: bool) -> Parts {
        for i in 1..parts {
            match self.read_slot(n + i) {
                Slot::Ready(KIND_JSON_PART, k, more) if u64::from(k) == i => {
                    bytes.extend_from_slice(&more)
                }
                Slot::InProgress if !writer_gone => return Parts::Wait,
                Slot::Gone => return Parts::Gone,
                _ => return Parts::Lost,
            }
        }
        Parts::Complete
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
        let aux = word(14, 2) as u16;
        if len > self.info.slot_size - SLOT_HEADER {
            return Slot::Lost;
        }
        let mut buf = vec![0u8; len];
        let copied = self
            .file
            .read_exact_at(&mut buf, (slot + SLOT_HEADER) as u64)
            .is_ok();
        fence(Ordering::Acquire);
        let after = u64_at(&self.file, slot);
        if !copied || after.is_none() {
            Slot::Gone
        } else if after != Some(before) {
            Slot::Lost
        } else {
            Slot::Ready(kind, aux, buf)
        }
    }
}

/// A slot as read.
enum Slot {
    /// Complete: its kind, the header's last two bytes, and its payload.
    Ready(u16, u16, Vec<u8>),
    InProgress,
    Lost,
    /// Past the end of a file truncated under the reader.
    Gone,
}

/// The later parts of a record spread over slots, as read.
enum Parts {
    Complete,
    /// One is still being written.
    Wait,
    Lost,
    Gone,
}
