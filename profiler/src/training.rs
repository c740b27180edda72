//! The end of training: [`end_training`] records the exact peaks up to that instant (the report's
//! training window), closes the step that was running and opens the `shutdown` phase, which the
//! session closes when it finishes. A Python job under `memsight run` calls it as its interpreter
//! starts to exit; a Rust program may call it after its last step.

use crate::sys::unix_ms;
use crate::{alloc, collect, phases, tensors};
pub use memsight_format::report::{TrainingWindow, SHUTDOWN_PHASE};
use std::sync::Mutex;

struct Ended {
    window: TrainingWindow,
    shutdown: Option<phases::PhaseGuard>,
}

static ENDED: Mutex<Option<Ended>> = Mutex::new(None);

/// Marks the end of training, after the last step (once; later calls return false): the heap,
/// RSS and tensor peaks so far become the report's training window (which `memsight check` gates
/// by default), the running step ends, and what follows is the `shutdown` phase.
pub fn end_training() -> bool {
    end_training_by("end_training")
}

/// [`end_training`], saying what ended it (the preloaded library: `interpreter exit`).
#[doc(hidden)]
pub fn end_training_by(by: &str) -> bool {
    let mut ended = crate::sys::lock(&ENDED);
    if ended.is_some() {
        return false;
    }
    let heap = alloc::stats();
    let rss_peak_bytes = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|t| collect::procfs::parse_status(&t).ok())
        .map(|m| m.hwm)
        .filter(|&b| b > 0);
    let last_step = phases::end_step();
    let window = TrainingWindow {
        end_unix_ms: unix_ms(),
        ended_by: by.to_string(),
        last_step,
        heap_peak_bytes: heap.run_peak_bytes.max(heap.peak_bytes),
        rss_peak_bytes,
        tensor_peak_bytes: tensors::stats().map(|t| t.peak_bytes),
        job_heap_peak: None,
    };
    *ended = Some(Ended {
        window,
        shutdown: Some(phases::phase(SHUTDOWN_PHASE)),
    });
    true
}

/// Ends the `shutdown` phase (the session is finishing) and returns the training window, if
/// training ended; a later session in the process starts with none.
pub(crate) fn close() -> Option<TrainingWindow> {
    let mut e = crate::sys::lock(&ENDED).take()?;
    drop(e.shutdown.take());
    Some(e.window)
}
