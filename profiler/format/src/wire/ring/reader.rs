//! The reading side of the flight recorder: the header as read, and a reader that copies slots
//! with `pread` (never through a mapping) and counts the records overwritten before it read them.

use super::*;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

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
