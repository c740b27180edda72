//! The running session's flight recorder as the rest of the job sees it: the ring records go to and
//! the session's clock. The session installs it when it starts and removes it when it finishes, so
//! writers that are not the session (device OOMs from a backend's observer) need not know it.

use crate::sys::lock;
use memsight_format::process::RankEnv;
use memsight_format::wire::ring::RingWriter;
use memsight_format::wire::Record;
use std::sync::Mutex;
use std::time::Instant;

struct Flight {
    ring: Option<&'static RingWriter>,
    started: Instant,
    /// The greeting the ring starts with (`Record::Hello`), said again when the process's place
    /// in the job changes ([`rank_now`]).
    hello: Option<Record>,
}

static FLIGHT: Mutex<Option<Flight>> = Mutex::new(None);

/// Called by the session as it starts: records now go to `ring` (none when the ring is off), and
/// times count from `started`.
pub(crate) fn install(ring: Option<&'static RingWriter>, started: Instant, hello: Option<Record>) {
    *lock(&FLIGHT) = Some(Flight {
        ring,
        started,
        hello,
    });
}

/// Called by the session as it finishes.
pub(crate) fn remove() {
    *lock(&FLIGHT) = None;
}

/// In a forked child: forgets the parent's flight recorder without waiting for a lock another
/// thread of the parent held at the fork (it then stays, unused). Returns the ring, for the
/// caller to let go of.
pub(crate) fn forget_in_child() -> Option<&'static RingWriter> {
    let mut f = FLIGHT.try_lock().ok()?;
    f.take().and_then(|f| f.ring)
}

/// Milliseconds since the running session started; `None` without a session.
pub(crate) fn session_ms() -> Option<u64> {
    lock(&FLIGHT)
        .as_ref()
        .map(|f| f.started.elapsed().as_millis() as u64)
}

/// Greets again with `rank` when the running session's greeting said another: a process that made
/// itself a rank after it started (Lightning's first rank sets `LOCAL_RANK`, `NODE_RANK` and
/// `WORLD_SIZE` in its own environment before it starts the others) is then told apart from a
/// launcher. Readers take the latest greeting.
pub(crate) fn rank_now(rank: impl FnOnce() -> Option<RankEnv>) {
    let mut flight = lock(&FLIGHT);
    let Some(f) = flight.as_mut() else {
        return;
    };
    let (Some(ring), Some(Record::Hello { process, .. })) = (f.ring, f.hello.as_mut()) else {
        return;
    };
    let rank = rank();
    if process.rank == rank {
        return;
    }
    process.rank = rank;
    if let Some(hello) = &f.hello {
        ring.append(hello);
    }
}

/// Appends `record` to the running session's ring, if it has one.
pub(crate) fn append(record: &Record) {
    if let Some(ring) = lock(&FLIGHT).as_ref().and_then(|f| f.ring) {
        ring.append(record);
    }
}
