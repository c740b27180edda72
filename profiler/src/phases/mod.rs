//! Steps and phases: `memsight::step(n)`, nestable `memsight::phase(name)` guards, per-phase and
//! per-step statistics, and the scoped monitor (seed 000's PerformanceMonitor).
//!
//! Phases form one process-wide stack (a training loop drives them from one thread); a guard
//! dropped out of order closes every phase opened after it. Each phase's peak comes from a peak
//! window in the allocator counters: entering a phase opens a new window, leaving it folds the
//! window back into the enclosing one, so nested peaks are exact up to the allocator's flush bound.

use crate::alloc::counters::{self, Tracker};
use crate::tensors::{self, Window};
pub use memsight_format::phase::{PhaseStats, StepStats};
use memsight_format::units::{fmt_bytes, fmt_signed_bytes};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Most distinct phase paths kept; later new paths are counted under `(other)`.
const MAX_PHASES: usize = 256;
/// Most step records kept; beyond it pairs of old records merge (the higher peak survives).
const MAX_STEPS: usize = 4096;

struct Frame {
    path: String,
    start: Instant,
    live_at_entry: u64,
    outer_window: u64,
    outer_tensor_window: u64,
}

struct State {
    stack: Vec<Frame>,
    phases: Vec<PhaseStats>,
    steps: Vec<StepStats>,
    step_open: bool,
}

static STATE: Mutex<State> = Mutex::new(State {
    stack: Vec::new(),
    phases: Vec::new(),
    steps: Vec::new(),
    step_open: false,
});
static STEP: AtomicU64 = AtomicU64::new(0);

fn state() -> MutexGuard<'static, State> {
    // A panic while holding the lock leaves consistent data (every update is a push or a field
    // write), so a poisoned lock is still usable.
    crate::sys::lock(&STATE)
}

fn live_now() -> u64 {
    counters::heap_live()
}

/// Marks the start of training step `n`; the previous step's peak and end live bytes are recorded.
pub fn step(n: u64) {
    let live = live_now();
    let mut st = state();
    if st.step_open {
        let peak = counters::swap_peak(Tracker::Step, live);
        let tensor_peak = tensors::swap_window(Window::Step, 0);
        let prev = STEP.load(Relaxed);
        push_step(
            &mut st.steps,
            StepStats {
                step: prev,
                peak_bytes: peak,
                live_end_bytes: live,
                tensor_peak_bytes: tensors::enabled().then_some(tensor_peak),
            },
        );
    } else {
        counters::swap_peak(Tracker::Step, live);
        tensors::swap_window(Window::Step, 0);
        st.step_open = true;
    }
    STEP.store(n, Relaxed);
    drop(st);
    crate::heapprof::on_step(n);
}

fn push_step(steps: &mut Vec<StepStats>, s: StepStats) {
    if steps.len() >= MAX_STEPS {
        // Merge the older half pairwise; keep the record with the higher peak.
        let half = steps.len() / 2;
        let mut merged: Vec<StepStats> = steps[..half]
            .chunks(2)
            .map(|c| {
                c.iter()
                    .max_by_key(|s| s.peak_bytes)
                    .cloned()
                    .unwrap_or_default()
            })
            .collect();
        merged.extend_from_slice(&steps[half..]);
        *steps = merged;
    }
    steps.push(s);
}

/// The current training step.
pub fn current_step() -> u64 {
    STEP.load(Relaxed)
}

/// The innermost open phase path, if any.
pub fn current_phase() -> Option<String> {
    state().stack.last().map(|f| f.path.clone())
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

/// An open phase; closes when dropped (or with [`PhaseGuard::finish`]).
#[must_use = "a phase lasts as long as its guard: bind it, e.g. `let _g = memsight::phase(\"forward\");`"]
pub struct PhaseGuard {
    depth: usize,
    print: bool,
    done: bool,
}

/// Opens a phase named `name` inside the current one. Nestable; the path joins names with `/`.
pub fn phase(name: &str) -> PhaseGuard {
    enter(name, false)
}

/// Opens a phase that prints its time and memory delta to stderr when it closes
/// (seed 000's scoped performance monitor). Use [`PhaseGuard::finish`] to get the numbers instead.
pub fn monitor(name: &str) -> PhaseGuard {
    enter(name, true)
}

fn enter(name: &str, print: bool) -> PhaseGuard {
    let live = live_now();
    let mut st = state();
    let path = match st.stack.last() {
        Some(parent) => format!("{}/{name}", parent.path),
        None => name.to_string(),
    };
    let outer_window = counters::swap_peak(Tracker::Phase, live);
    let outer_tensor_window = tensors::swap_window(Window::Phase, 0);
    st.stack.push(Frame {
        path,
        start: Instant::now(),
        live_at_entry: live,
        outer_window,
        outer_tensor_window,
    });
    PhaseGuard {
        depth: st.stack.len(),
        print,
        done: false,
    }
}

impl PhaseGuard {
    /// Closes the phase (and any phase opened inside it) and returns what it measured.
    pub fn finish(mut self) -> Option<PhaseMeasurement> {
        self.done = true;
        close(self.depth)
    }
}

impl Drop for PhaseGuard {
    fn drop(&mut self) {
        if !self.done {
            if let Some(m) = close(self.depth) {
                if self.print {
                    eprintln!("memsight monitor · {m}");
                }
            }
        }
    }
}

/// Closes frames down to `depth - 1`; returns the measurement of the frame at `depth`.
fn close(depth: usize) -> Option<PhaseMeasurement> {
    let mut st = state();
    let mut result = None;
    while st.stack.len() >= depth && depth > 0 {
        let frame = st.stack.pop()?;
        let live = live_now();
        let window = counters::peak(Tracker::Phase, live);
        // Fold this window into the enclosing one.
        counters::swap_peak(Tracker::Phase, frame.outer_window.max(window));
        let tensor_window = tensors::window_peak(Window::Phase);
        tensors::swap_window(Window::Phase, frame.outer_tensor_window.max(tensor_window));
        let m = PhaseMeasurement {
            path: frame.path,
            elapsed: frame.start.elapsed(),
            net_bytes: live as i64 - frame.live_at_entry as i64,
            peak_rise_bytes: window.saturating_sub(frame.live_at_entry),
            peak_bytes: window,
            tensor_peak_bytes: tensors::enabled().then_some(tensor_window),
        };
        record(&mut st.phases, &m);
        result = Some(m);
    }
    result
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
        p.peak_step = STEP.load(Relaxed);
    }
    if let Some(t) = m.tensor_peak_bytes {
        p.tensor_peak_bytes = Some(p.tensor_peak_bytes.unwrap_or(0).max(t));
    }
    p.net_bytes += m.net_bytes;
    p.max_rise_bytes = p.max_rise_bytes.max(m.peak_rise_bytes);
}

/// Per-phase statistics so far.
pub fn phase_stats() -> Vec<PhaseStats> {
    state().phases.clone()
}

/// Per-step statistics so far, plus the step still running (its peak so far).
pub fn step_stats() -> Vec<StepStats> {
    let live = live_now();
    let st = state();
    let mut v = st.steps.clone();
    if st.step_open {
        v.push(StepStats {
            step: STEP.load(Relaxed),
            peak_bytes: counters::peak(Tracker::Step, live),
            live_end_bytes: live,
            tensor_peak_bytes: tensors::enabled().then(|| tensors::window_peak(Window::Step)),
        });
    }
    v
}
