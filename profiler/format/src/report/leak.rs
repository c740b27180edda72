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
    let pts: Vec<(f64, f64)> = rest
        .iter()
        .step_by(stride)
        .map(|s| (s.step as f64, s.live_end_bytes as f64))
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
}
