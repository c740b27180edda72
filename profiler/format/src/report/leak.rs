//! Leak signal: a robust per-step slope of live heap bytes after warm-up (Theil–Sen), insensitive
//! to periodic spikes such as evaluation, with a confidence.

use crate::phase::StepStats;
use serde::{Deserialize, Serialize};

/// Most points used (evenly thinned): Theil–Sen is quadratic in the number of points.
const MAX_POINTS: usize = 400;
/// Fewest points after warm-up for an estimate.
const MIN_POINTS: usize = 5;

/// Growth of live heap bytes per step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LeakEstimate {
    /// Median of pairwise slopes of end-of-step live bytes, bytes per step.
    pub slope_bytes_per_step: f64,
    /// Share of pairwise slopes that agree in sign with the median (0.5 = noise, 1.0 = every pair).
    pub confidence: f64,
    /// Steps used for the fit.
    pub steps_used: usize,
    /// Steps skipped at the start as warm-up.
    pub warmup_steps: usize,
}

/// Estimates the leak slope from step records; `None` with fewer than 5 steps after warm-up.
/// Warm-up is the first 10% of steps (at least 2).
pub fn estimate(steps: &[StepStats]) -> Option<LeakEstimate> {
    let warmup = (steps.len() / 10).max(2);
    let rest = steps.get(warmup..)?;
    if rest.len() < MIN_POINTS {
        return None;
    }
    let stride = rest.len().div_ceil(MAX_POINTS);
    let xs = run_positions(steps);
    let pts: Vec<(f64, f64)> = rest
        .iter()
        .zip(&xs[warmup..])
        .step_by(stride)
        .map(|(s, &x)| (x, s.live_end_bytes as f64))
        .collect();
    let mut slopes = Vec::with_capacity(pts.len() * pts.len() / 2);
    for (i, a) in pts.iter().enumerate() {
        for b in &pts[i + 1..] {
            if b.0 != a.0 {
                slopes.push((b.1 - a.1) / (b.0 - a.0));
            }
        }
    }
    if slopes.is_empty() {
        return None;
    }
    slopes.sort_by(f64::total_cmp);
    let median = slopes[slopes.len() / 2];
    let agree = slopes
        .iter()
        .filter(|&&s| {
            if median > 0.0 {
                s > 0.0
            } else if median < 0.0 {
                s < 0.0
            } else {
                s == 0.0
            }
        })
        .count();
    Some(LeakEstimate {
        slope_bytes_per_step: median,
        confidence: agree as f64 / slopes.len() as f64,
        steps_used: pts.len(),
        warmup_steps: warmup,
    })
}

/// Each record's position on one axis of steps: its step number, shifted so that a step number
/// lower than the one before (a second epoch counting from 0, a restarted loop) starts a new run
/// right after the previous one instead of going back in time.
fn run_positions(steps: &[StepStats]) -> Vec<f64> {
    let mut offset = 0u64;
    let mut prev: Option<u64> = None;
    steps
        .iter()
        .map(|s| {
            if let Some(p) = prev.filter(|&p| s.step < p) {
                offset = offset.saturating_add(p + 1 - s.step);
            }
            prev = Some(s.step);
            s.step.saturating_add(offset) as f64
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(f: impl Fn(u64) -> u64) -> Vec<StepStats> {
        (0..100)
            .map(|i| StepStats {
                step: i,
                peak_bytes: f(i),
                live_end_bytes: f(i),
                tensor_peak_bytes: None,
            })
            .collect()
    }

    #[test]
    fn finds_slope_despite_eval_spikes() {
        let e = estimate(&steps(|i| {
            1_000_000 + i * 4096 + if i % 10 == 0 { 50_000_000 } else { 0 }
        }))
        .unwrap();
        assert!((e.slope_bytes_per_step - 4096.0).abs() < 1.0, "{e:?}");
        assert!(e.confidence > 0.7);
    }

    #[test]
    fn flat_is_zero() {
        let e = estimate(&steps(|i| 1_000_000 + (i % 3) * 10)).unwrap();
        assert!(e.slope_bytes_per_step.abs() < 10.0);
        assert!(estimate(&steps(|_| 5)[..6]).is_none());
    }

    #[test]
    fn step_numbers_that_go_backwards_keep_the_slope_of_a_leak() {
        // Three epochs counting steps from 0 again, 256 KiB kept every step throughout.
        let v: Vec<StepStats> = (0..150u64)
            .map(|i| StepStats {
                step: i % 50,
                peak_bytes: 0,
                live_end_bytes: (100 << 20) + i * (256 << 10),
                tensor_peak_bytes: None,
            })
            .collect();
        let e = estimate(&v).unwrap();
        assert!(
            (e.slope_bytes_per_step - (256 << 10) as f64).abs() < 1.0,
            "{e:?}"
        );
        assert!(e.confidence > 0.99, "{e:?}");
    }
}
