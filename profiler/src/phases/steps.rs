//! Training steps: `memsight::step(n)` closes the running step (its peak and end live bytes are
//! recorded) and opens step `n`. Step numbers that go backwards (a second epoch counting from 0, a
//! restarted loop) are kept as they are and said once on stderr; the report's leak slope reads
//! them as a new run of steps (`memsight_format::report::leak`).

use super::{live_now, publish_place, state, State};
use crate::alloc::counters::{self, Tracker};
use crate::tensors;
pub use memsight_format::phase::StepStats;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Most step records kept; beyond it pairs of old records merge (the higher peak survives).
const MAX_STEPS: usize = 4096;

pub(super) static STEP: AtomicU64 = AtomicU64::new(0);

/// The bytes of the session's timeline storage, held by its sampler while it adds a snapshot
/// (which may move the storage) and says the new size: a step's live bytes are read under it, so
/// that they never see the moved storage with the old size (a sampler preempted between the two,
/// on a busy machine, put a 1 MB jump into the steps).
static TIMELINE_BYTES: std::sync::Mutex<u64> = std::sync::Mutex::new(0);

/// Runs `grow` (adding to the running session's timeline), then takes the storage size it returns
/// as the bytes memsight's timeline holds in the process heap, with no step reading between.
pub(crate) fn own_timeline_bytes(grow: impl FnOnce() -> usize) {
    let mut bytes = TIMELINE_BYTES.lock().unwrap_or_else(|p| p.into_inner());
    *bytes = grow() as u64;
}

/// The live heap for the step records: the process's, less memsight's own records held in it
/// (the session's timeline and these step records, which grow by doubling as a run goes on:
/// counted, they read as a leak of the job — 136–492 bytes per step over 4,500 steps whose heap
/// glibc counted flat).
fn live_for_steps(st: &State) -> u64 {
    let timeline = TIMELINE_BYTES.lock().unwrap_or_else(|p| p.into_inner());
    let own = *timeline + (st.steps.capacity() * std::mem::size_of::<StepStats>()) as u64;
    live_now().saturating_sub(own)
}

/// Marks the start of training step `n`; the previous step's peak and end live bytes are recorded.
pub fn step(n: u64) {
    let mut st = state();
    let live = live_for_steps(&st);
    if st.step_open {
        let prev = STEP.load(Relaxed);
        close_running(&mut st, live);
        if n < prev && !st.said_backwards {
            st.said_backwards = true;
            eprintln!(
                "memsight: step {n} follows step {prev}: step numbers went backwards; the steps \
                 from here count as a new run (the leak slope reads them so)"
            );
        }
    } else {
        counters::swap_peak(Tracker::Step, live);
        tensors::swap_step_window();
    }
    st.step_open = true;
    STEP.store(n, Relaxed);
    publish_place(&st);
    drop(st);
    crate::heapprof::on_step(n);
}

/// Records the running step as ended at `live` bytes.
fn close_running(st: &mut State, live: u64) {
    let peak = counters::swap_peak(Tracker::Step, live);
    let tensor_peak = tensors::swap_step_window();
    push_step(
        &mut st.steps,
        StepStats {
            step: STEP.load(Relaxed),
            peak_bytes: peak,
            live_end_bytes: live,
            tensor_peak_bytes: tensors::enabled().then_some(tensor_peak),
        },
    );
}

/// Ends the running step (its peak and end live bytes are recorded) without starting another;
/// returns its number, or `None` when no step was running.
pub(crate) fn end_step() -> Option<u64> {
    let mut st = state();
    let live = live_for_steps(&st);
    if !st.step_open {
        return None;
    }
    close_running(&mut st, live);
    st.step_open = false;
    Some(STEP.load(Relaxed))
}

/// Appends a step's record. Past [`MAX_STEPS`] the older half merges pairwise (the record with
/// the higher peak stays, the later one on a tie), in place: the records' storage is not allocated
/// again.
fn push_step(steps: &mut Vec<StepStats>, s: StepStats) {
    if steps.len() >= MAX_STEPS {
        let half = steps.len() / 2;
        let pairs = half.div_ceil(2);
        for i in 0..pairs {
            // Pair i is records 2i and 2i+1 (the last pair may have one); writing record i never
            // touches a pair still to be read.
            let (a, b) = (2 * i, 2 * i + 1);
            let keep = if b < half && steps[b].peak_bytes >= steps[a].peak_bytes {
                b
            } else {
                a
            };
            steps[i] = steps[keep].clone();
        }
        steps.drain(pairs..half);
    }
    steps.push(s);
}

/// The current training step.
pub fn current_step() -> u64 {
    STEP.load(Relaxed)
}

/// Per-step statistics so far, plus the step still running (its peak so far).
pub fn step_stats() -> Vec<StepStats> {
    let st = state();
    let live = live_for_steps(&st);
    let mut v = st.steps.clone();
    if st.step_open {
        v.push(StepStats {
            step: STEP.load(Relaxed),
            peak_bytes: counters::peak(Tracker::Step, live),
            live_end_bytes: live,
            tensor_peak_bytes: tensors::enabled().then(tensors::step_window_peak),
        });
    }
    v
}
