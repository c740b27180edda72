//! Where the process is — its step and phase — kept ready as an encoded [`Record::FailedAt`] for
//! the allocator's failure path, which writes it into the ring when an allocation first fails.
//!
//! The failure path may not allocate, lock or format, so the record is encoded beforehand, each
//! time the step or phase changes ([`note_place`], called by the steps and phases code), into a
//! static buffer under a sequence word; [`copy`] takes a consistent copy of it onto the stack.
//! Read from the process at the failure, the place is where the request failed — not the last
//! sample's (a step behind, or already the job's shutdown), and kept by a job that aborts at once.

use crate::wire::Record;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes the encoded record may take: a step and a phase path of a few hundred bytes.
pub(super) const MAX_PLACE: usize = 512;
const WORDS: usize = MAX_PLACE / 8;

/// Even while the buffer is consistent, odd while [`note_place`] writes it.
static SEQ: AtomicU64 = AtomicU64::new(0);
/// The encoded record's length in bytes (0: no place noted yet).
static LEN: AtomicU64 = AtomicU64::new(0);
static BUF: [AtomicU64; WORDS] = [const { AtomicU64::new(0) }; WORDS];

/// Notes that the process is now at training step `step`, in phase `phase` (a nested path), for
/// a failed allocation to say. Not for the allocator path: it encodes (and so allocates). Callers
/// serialise their calls (the phases' lock): one writer at a time.
pub fn note_place(step: u64, phase: Option<&str>) {
    let mut phase = phase.map(str::to_owned);
    let bytes = loop {
        let record = Record::FailedAt {
            step,
            phase: phase.clone(),
        };
        let Ok(bytes) = serde_json::to_vec(&record) else {
            return;
        };
        match &mut phase {
            Some(p) if bytes.len() > MAX_PLACE => {
                // A path too long to keep: its outer part, cut at a character's boundary.
                let mut cut = p.len().saturating_sub(bytes.len() - MAX_PLACE + 3);
                while !p.is_char_boundary(cut) {
                    cut -= 1;
                }
                p.truncate(cut);
                p.push('…');
                if cut == 0 {
                    phase = None;
                }
            }
            _ => break bytes,
        }
    };
    if bytes.len() > MAX_PLACE {
        return;
    }
    let seq = SEQ.load(Ordering::Relaxed);
    SEQ.store(seq.wrapping_add(1) | 1, Ordering::Relaxed);
    std::sync::atomic::fence(Ordering::Release);
    for (word, chunk) in BUF.iter().zip(bytes.chunks(8)) {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        word.store(u64::from_le_bytes(w), Ordering::Relaxed);
    }
    LEN.store(bytes.len() as u64, Ordering::Relaxed);
    SEQ.store((seq | 1).wrapping_add(1), Ordering::Release);
}

/// Copies the noted place's encoded record into `out`; its length, or `None` when no place was
/// noted or a writer kept changing it. Async-signal-safe: no allocation, lock or wait.
pub(super) fn copy(out: &mut [u8; MAX_PLACE]) -> Option<usize> {
    for _ in 0..4 {
        let before = SEQ.load(Ordering::Acquire);
        if before & 1 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let len = (LEN.load(Ordering::Relaxed) as usize).min(MAX_PLACE);
        for (chunk, word) in out.chunks_mut(8).zip(BUF.iter()) {
            chunk.copy_from_slice(&word.load(Ordering::Relaxed).to_le_bytes());
        }
        std::sync::atomic::fence(Ordering::Acquire);
        if SEQ.load(Ordering::Relaxed) == before {
            return (len > 0).then_some(len);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noted() -> Option<Record> {
        let mut buf = [0u8; MAX_PLACE];
        let n = copy(&mut buf)?;
        serde_json::from_slice(&buf[..n]).ok()
    }

    #[test]
    fn the_place_noted_last_is_read_back_and_a_long_path_keeps_its_start() {
        note_place(3, Some("train/forward"));
        assert_eq!(
            noted(),
            Some(Record::FailedAt {
                step: 3,
                phase: Some("train/forward".into())
            })
        );
        note_place(4, None);
        assert_eq!(
            noted(),
            Some(Record::FailedAt {
                step: 4,
                phase: None
            })
        );
        let long = "é/".repeat(400);
        note_place(5, Some(&long));
        match noted() {
            Some(Record::FailedAt {
                step: 5,
                phase: Some(p),
            }) => {
                assert!(p.ends_with('…') && p.len() < MAX_PLACE, "{p}");
                assert!(long.starts_with(p.trim_end_matches('…')), "{p}");
            }
            other => panic!("{other:?}"),
        }
    }
}
