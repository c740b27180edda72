//! Steps and phases: `memsight::step(n)`, nestable `memsight::phase(name)` guards, per-phase and
//! per-step statistics, and the scoped monitor (seed 000's PerformanceMonitor).
//!
//! Each thread has a stack of phases of its own: a phase opened on a data-loading thread is not
//! nested under the training loop's. A guard closes its own phase and nothing else — phases opened
//! inside it and still open stay open, and a guard whose phase is already closed closes nothing.
//! Each phase's peak comes from its thread's peak window in the allocator counters
//! (`counters::PHASE_WINDOWS`, raised by every published heap change): entering a phase starts the
//! window over, leaving it folds the window back into the enclosing phase's, so nested peaks are
//! exact up to the allocator's flush bound. A phase's peak is the process heap's (memory is shared
//! by the threads), over the phase's own time.
//!
//! A session that finishes clears the statistics ([`reset`]), so a second session in the process
//! starts from none.

mod steps;

use crate::alloc::counters;
use crate::tensors;
pub use memsight_format::phase::PhaseStats;
use memsight_format::report::build;
use memsight_format::units::{fmt_bytes, fmt_signed_bytes};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};
pub use steps::{current_step, step, step_stats, StepStats};
pub(crate) use steps::{end_step, own_timeline_bytes};

/// Most distinct phase paths kept; later new paths are counted under `(other)`.
const MAX_PHASES: usize = 256;

struct Frame {
    id: u64,
    path: String,
    start: Instant,
    live_at_entry: u64,
    /// The thread window's value when this frame started it over: the enclosing phase's peak
    /// up to here.
    outer_window: i64,
    outer_tensor_window: i64,
}

/// One thread's open phases, innermost last, and the peak window they share.
struct Stack {
    thread: u64,
    window: usize,
    frames: Vec<Frame>,
}

pub(crate) struct State {
    stacks: Vec<Stack>,
    phases: Vec<PhaseStats>,
    steps: Vec<StepStats>,
    step_open: bool,
    /// Step numbers went backwards once already (said on stderr).
    said_backwards: bool,
    next_id: u64,
}

static STATE: Mutex<State> = Mutex::new(State {
    stacks: Vec::new(),
    phases: Vec::new(),
    steps: Vec::new(),
    step_open: false,
    said_backwards: false,
    next_id: 0,
});

fn state() -> MutexGuard<'static, State> {
    // A panic while holding the lock leaves consistent data (every update is a push or a field
    // write), so a poisoned lock is still usable.
    crate::sys::lock(&STATE)
}

fn live_now() -> u64 {
    counters::heap_live()
}

/// This thread's number (1, 2, …, in the order threads first open a phase; 0 once its storage is
/// gone).
fn thread_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static NUMBER: Cell<u64> = const { Cell::new(0) };
    }
    NUMBER
        .try_with(|n| {
            if n.get() == 0 {
                n.set(NEXT.fetch_add(1, Relaxed));
            }
            n.get()
        })
        .unwrap_or(0)
}

/// Clears the phase and step statistics and the step number (a session finished: the next one
/// starts from none). Phases still open stay open.
pub(crate) fn reset() {
    let mut st = state();
    st.phases.clear();
    st.steps.clear();
    st.step_open = false;
    st.said_backwards = false;
    steps::STEP.store(0, Relaxed);
    publish_place(&st);
}

/// The innermost open phase of the calling thread, if any.
pub fn current_phase() -> Option<String> {
    let me = thread_number();
    let st = state();
    let s = st.stacks.iter().find(|s| s.thread == me)?;
    s.frames.last().map(|f| f.path.clone())
}

/// The phase the process is in, for a snapshot or an event: the calling thread's innermost open
/// phase; on a thread without one (the sampler's), the innermost of the phase opened last.
pub(crate) fn process_phase() -> Option<String> {
    let me = thread_number();
    let st = state();
    if let Some(s) = st.stacks.iter().find(|s| s.thread == me) {
        return s.frames.last().map(|f| f.path.clone());
    }
    latest_phase(&st).map(str::to_owned)
}

/// The innermost frame of the phase opened last, on any thread.
fn latest_phase(st: &State) -> Option<&str> {
    st.stacks
        .iter()
        .filter_map(|s| s.frames.last())
        .max_by_key(|f| f.id)
        .map(|f| f.path.as_str())
}

/// Keeps the process's place (its step, the innermost of the phase opened last) ready for a
/// failed allocation to say where it happened (`memsight_format::wire::ring::note_place`). Called
/// under the state's lock at every change, so one writer at a time.
fn publish_place(st: &State) {
    memsight_format::wire::ring::note_place(steps::STEP.load(Relaxed), latest_phase(st));
}

/// What a phase measured when it closed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PhaseMeasurement {
    /// The phase's nested path.
    pub path: String,
    /// Wall time inside the phase.
    pub elapsed: Duration,
    /// Live bytes at exit − live bytes at entry.
    pub net_bytes: i64,
    /// Peak live bytes inside the phase − live bytes at entry.
    pub peak_rise_bytes: u64,
    /// Peak live bytes inside the phase.
    pub peak_bytes: u64,
    /// Peak live tensor bytes inside the phase (with a tensor backend installed).
    pub tensor_peak_bytes: Option<u64>,
}

impl std::fmt::Display for PhaseMeasurement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {:.3} s, net {}, peak {} (+{} above entry)",
            self.path,
            self.elapsed.as_secs_f64(),
            fmt_signed_bytes(self.net_bytes),
            fmt_bytes(self.peak_bytes),
            fmt_bytes(self.peak_rise_bytes)
        )
    }
}

/// An open phase; closes when dropped (or with [`PhaseGuard::finish`]). It may be dropped on
/// another thread than the one that opened it (an async task that moved): it still closes its own
/// phase, on the stack of the thread that opened it.
#[must_use = "a phase lasts as long as its guard: bind it, e.g. `let _g = memsight::phase(\"forward\");`"]
pub struct PhaseGuard {
    id: u64,
    print: bool,
    done: bool,
}

/// Opens a phase named `name` inside the calling thread's current one. Nestable; the path joins
/// names with `/`.
pub fn phase(name: &str) -> PhaseGuard {
    enter(name, false)
}

/// Opens a phase that prints its time and memory delta to stderr when it closes
/// (seed 000's scoped performance monitor). Use [`PhaseGuard::finish`] to get the numbers instead.
pub fn monitor(name: &str) -> PhaseGuard {
    enter(name, true)
}

fn enter(name: &str, print: bool) -> PhaseGuard {
    let me = thread_number();
    let live = live_now();
    // Raise every window to the exact live bytes first: the enclosing phase's peak includes now.
    counters::raise_peaks(live as i64);
    let tensor_live = tensors::live() as i64;
    tensors::PHASE_WINDOWS.raise(tensor_live);
    let mut st = state();
    st.next_id += 1;
    let id = st.next_id;
    let idx = match st.stacks.iter().position(|s| s.thread == me) {
        Some(i) => i,
        None => {
            let window = counters::PHASE_WINDOWS.claim();
            tensors::PHASE_WINDOWS.claim_at(window);
            st.stacks.push(Stack {
                thread: me,
                window,
                frames: Vec::new(),
            });
            st.stacks.len() - 1
        }
    };
    let stack = &mut st.stacks[idx];
    let path = match stack.frames.last() {
        Some(parent) => format!("{}/{name}", parent.path),
        None => name.to_string(),
    };
    let outer_window = counters::PHASE_WINDOWS.start(stack.window, live as i64);
    let outer_tensor_window = tensors::PHASE_WINDOWS.start(stack.window, tensor_live);
    stack.frames.push(Frame {
        id,
        path,
        start: Instant::now(),
        live_at_entry: live,
        outer_window,
        outer_tensor_window,
    });
    publish_place(&st);
    PhaseGuard {
        id,
        print,
        done: false,
    }
}

impl PhaseGuard {
    /// Closes the phase and returns what it measured (`None` when it was closed already).
    pub fn finish(mut self) -> Option<PhaseMeasurement> {
        self.done = true;
        close(self.id)
    }
}

impl Drop for PhaseGuard {
    fn drop(&mut self) {
        if !self.done {
            if let Some(m) = close(self.id) {
                if self.print {
                    eprintln!("memsight monitor · {m}");
                }
            }
        }
    }
}

/// Closes the frame `id` (only it) and returns its measurement; `None` when no such frame is open.
fn close(id: u64) -> Option<PhaseMeasurement> {
    let live = live_now();
    counters::raise_peaks(live as i64);
    tensors::PHASE_WINDOWS.raise(tensors::live() as i64);
    let mut st = state();
    let (s, i) = st.stacks.iter().enumerate().find_map(|(s, stack)| {
        let i = stack.frames.iter().position(|f| f.id == id)?;
        Some((s, i))
    })?;
    let stack = &mut st.stacks[s];
    let w = stack.window;
    // The frame's window: the thread window since the innermost frame started it, and what each
    // frame opened inside this one saved of it when it started it over.
    let inner = &stack.frames[i + 1..];
    let window = inner
        .iter()
        .map(|f| f.outer_window)
        .fold(counters::PHASE_WINDOWS.read(w), i64::max)
        .max(0) as u64;
    let tensor_window = inner
        .iter()
        .map(|f| f.outer_tensor_window)
        .fold(tensors::PHASE_WINDOWS.read(w), i64::max)
        .max(0) as u64;
    let frame = stack.frames.remove(i);
    // Fold this frame's window into the enclosing one's: through the thread window when it was
    // innermost, else through the saved value of the frame opened inside it.
    match stack.frames.get_mut(i) {
        None => {
            counters::PHASE_WINDOWS.start(w, frame.outer_window.max(window as i64));
            tensors::PHASE_WINDOWS.start(w, frame.outer_tensor_window.max(tensor_window as i64));
        }
        Some(next) => {
            next.outer_window = next.outer_window.max(frame.outer_window);
            next.outer_tensor_window = next.outer_tensor_window.max(frame.outer_tensor_window);
        }
    }
    if stack.frames.is_empty() {
        counters::PHASE_WINDOWS.release(w);
        tensors::PHASE_WINDOWS.release(w);
        st.stacks.swap_remove(s);
    }
    publish_place(&st);
    let m = PhaseMeasurement {
        path: frame.path,
        elapsed: frame.start.elapsed(),
        net_bytes: live as i64 - frame.live_at_entry as i64,
        peak_rise_bytes: window.saturating_sub(frame.live_at_entry),
        peak_bytes: window,
        tensor_peak_bytes: tensors::enabled().then_some(tensor_window),
    };
    record(&mut st.phases, &m);
    Some(m)
}

fn record(phases: &mut Vec<PhaseStats>, m: &PhaseMeasurement) {
    let idx = match phases.iter().position(|p| p.path == m.path) {
        Some(i) => i,
        None if phases.len() < MAX_PHASES => {
            phases.push(PhaseStats {
                path: m.path.clone(),
                ..Default::default()
            });
            phases.len() - 1
        }
        None => match phases.iter().position(|p| p.path == "(other)") {
            Some(i) => i,
            None => {
                phases.push(PhaseStats {
                    path: "(other)".into(),
                    ..Default::default()
                });
                phases.len() - 1
            }
        },
    };
    let p = &mut phases[idx];
    p.count += 1;
    p.total_ms += m.elapsed.as_secs_f64() * 1000.0;
    if m.peak_bytes > p.peak_bytes || p.count == 1 {
        p.peak_bytes = m.peak_bytes;
    }
    // Where the phase first came within `build::PEAK_REACHED_WITHIN` of its peak: the run's headline
    // places its peak by the same rule, so the two say the same step.
    let reached = build::reached(p.peak_bytes);
    if p.count == 1 || (p.peak_step_bytes < reached && m.peak_bytes >= reached) {
        p.peak_step = current_step();
        p.peak_step_bytes = m.peak_bytes;
    }
    if let Some(t) = m.tensor_peak_bytes {
        p.tensor_peak_bytes = Some(p.tensor_peak_bytes.unwrap_or(0).max(t));
    }
    p.net_bytes += m.net_bytes;
    p.max_rise_bytes = p.max_rise_bytes.max(m.peak_rise_bytes);
}

/// Per-phase statistics so far.
pub fn phase_stats() -> Vec<PhaseStats> {
    let mut v = state().phases.clone();
    // In-process bookkeeping that reports do not carry: a report reads back as it was built.
    for p in &mut v {
        p.peak_step_bytes = 0;
    }
    v
}
