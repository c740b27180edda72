//! The signals this process sent to other processes (`kill`), kept until its session writes them
//! to its flight recorder: the sidecar then tells a process the job stopped itself (a pool
//! terminating its workers at its end) from one that failed.

use memsight_format::wire::Record;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Signals kept between two samples; older unwritten ones are overwritten beyond it.
const ROOM: usize = 256;

/// Each note: the target pid (high 32 bits) and the signal (low 32).
static NOTES: [AtomicU64; ROOM] = [const { AtomicU64::new(0) }; ROOM];
/// When each note was taken, in Unix milliseconds.
static TIMES: [AtomicU64; ROOM] = [const { AtomicU64::new(0) }; ROOM];
/// Which note each slot holds: its number + 1, stored once the note is written (0: none).
static SEQ: [AtomicUsize; ROOM] = [const { AtomicUsize::new(0) }; ROOM];
/// Notes taken.
static TAKEN: AtomicUsize = AtomicUsize::new(0);
/// Notes written to the ring (or passed over) so far.
static WRITTEN: AtomicUsize = AtomicUsize::new(0);

/// Notes that this process sends signal `signal` to process `pid` (the preloaded library's
/// `kill`). Only a signal to one process (not a group) that ends it unless handled is kept: not 0,
/// which only asks whether it lives, nor one whose default action is to continue, stop or be
/// ignored (`timeout` sends SIGCONT after its SIGTERM). Async-signal-safe: no lock, no allocation.
pub fn sent(pid: i32, signal: i32) {
    if pid <= 0 || signal <= 0 || !ends_by_default(signal) {
        return;
    }
    let n = TAKEN.fetch_add(1, Ordering::Relaxed);
    let slot = n % ROOM;
    TIMES[slot].store(unix_ms(), Ordering::Relaxed);
    NOTES[slot].store(
        (u64::from(pid as u32) << 32) | u64::from(signal as u32),
        Ordering::Relaxed,
    );
    SEQ[slot].store(n + 1, Ordering::Release);
}

/// Whether this process sent a signal it has not written yet.
pub fn pending() -> bool {
    TAKEN.load(Ordering::Relaxed) > WRITTEN.load(Ordering::Relaxed)
}

/// In a forked child: the signals its parent sent are the parent's to write.
pub(crate) fn forget_inherited() {
    WRITTEN.store(TAKEN.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// The notes taken since the last call, as records: the latest to each process, in the order
/// taken (one being written as this runs waits for the next call), so a program that signals one
/// process often costs its ring one record per sample. Called by the session's sampler and at its
/// finish.
pub(crate) fn drain() -> Vec<Record> {
    let end = TAKEN.load(Ordering::Acquire);
    let mut n = WRITTEN
        .load(Ordering::Relaxed)
        .max(end.saturating_sub(ROOM));
    let mut latest: Vec<(u32, i32, u64)> = Vec::new();
    while n < end {
        let slot = n % ROOM;
        if SEQ[slot].load(Ordering::Acquire) != n + 1 {
            break;
        }
        let note = NOTES[slot].load(Ordering::Relaxed);
        let pid = (note >> 32) as u32;
        latest.retain(|&(p, _, _)| p != pid);
        latest.push((pid, note as u32 as i32, TIMES[slot].load(Ordering::Relaxed)));
        n += 1;
    }
    WRITTEN.store(n, Ordering::Relaxed);
    latest
        .into_iter()
        .map(|(pid, signal, unix_ms)| Record::SignalSent {
            pid,
            signal,
            unix_ms,
        })
        .collect()
}

/// Whether `signal`'s default action ends the process (signal(7)): all but those that continue,
/// stop or are ignored.
fn ends_by_default(signal: i32) -> bool {
    !matches!(
        signal,
        libc::SIGCHLD
            | libc::SIGCONT
            | libc::SIGSTOP
            | libc::SIGTSTP
            | libc::SIGTTIN
            | libc::SIGTTOU
            | libc::SIGURG
            | libc::SIGWINCH
    )
}

/// The time of day in Unix milliseconds (the vDSO's clock: async-signal-safe).
fn unix_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes `ts` only.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1000)
        .saturating_add(ts.tv_nsec as u64 / 1_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn targets(records: &[Record]) -> Vec<(u32, i32)> {
        records
            .iter()
            .filter_map(|r| match r {
                Record::SignalSent { pid, signal, .. } => Some((*pid, *signal)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn signals_that_end_a_process_are_kept_once_the_latest_per_process_the_oldest_giving_way() {
        sent(4242, libc::SIGTERM);
        sent(4242, libc::SIGCONT);
        sent(0, libc::SIGKILL);
        sent(-7, libc::SIGKILL);
        sent(4243, 0);
        sent(4243, libc::SIGKILL);
        assert!(pending());
        assert_eq!(
            targets(&drain()),
            [(4242, libc::SIGTERM), (4243, libc::SIGKILL)]
        );
        // Many to one process between two samples: its latest alone.
        for _ in 0..100 {
            sent(4244, libc::SIGUSR1);
        }
        sent(4245, libc::SIGTERM);
        sent(4244, libc::SIGTERM);
        assert_eq!(
            targets(&drain()),
            [(4245, libc::SIGTERM), (4244, libc::SIGTERM)]
        );
        assert!(!pending());
        assert!(drain().is_empty());
        for i in 0..(ROOM as i32 + 10) {
            sent(10_000 + i, libc::SIGTERM);
        }
        let kept = targets(&drain());
        assert_eq!(kept.len(), ROOM);
        assert_eq!(kept.first(), Some(&(10_010, libc::SIGTERM)));
        assert_eq!(
            kept.last(),
            Some(&(10_000 + ROOM as u32 + 9, libc::SIGTERM))
        );
    }
}
