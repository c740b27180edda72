//! Steps and phases as the report and the flight recorder carry them: per-phase and per-step
//! memory statistics. The in-process side (`memsight::step`, `memsight::phase`) fills them.

use serde::{Deserialize, Serialize};

/// Aggregated statistics of one phase path.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PhaseStats {
    /// Nested path, outermost first: `train/forward`.
    pub path: String,
    /// Times the phase was entered.
    pub count: u64,
    /// Total wall time inside the phase, in milliseconds.
    pub total_ms: f64,
    /// Highest live heap bytes reached inside the phase.
    pub peak_bytes: u64,
    /// The first step during which the phase came within 0.5% of that peak
    /// (`report::build::PEAK_REACHED_WITHIN`): where it was first reached, as the report's
    /// headline says of the run's peak.
    pub peak_step: u64,
    /// The phase's peak when `peak_step` was set (kept in-process only, to move `peak_step` when
    /// a later occurrence rises past it by more than 0.5%).
    #[serde(skip)]
    pub peak_step_bytes: u64,
    /// Sum over occurrences of (live at exit − live at entry): memory the phase kept (leak signal).
    pub net_bytes: i64,
    /// Largest single-occurrence peak growth above the live bytes at entry.
    pub max_rise_bytes: u64,
    /// Highest live tensor bytes reached inside the phase (with a tensor backend installed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_peak_bytes: Option<u64>,
}

/// One training step's memory.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StepStats {
    /// The step number given to `memsight::step`.
    pub step: u64,
    /// Highest live heap bytes during the step.
    pub peak_bytes: u64,
    /// Live heap bytes when the step ended.
    pub live_end_bytes: u64,
    /// Highest live tensor bytes during the step (with a tensor backend installed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor_peak_bytes: Option<u64>,
}
