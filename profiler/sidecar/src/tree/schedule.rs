//! When the sidecar may read a process tree's PSS. `smaps_rollup` makes the kernel walk every page
//! table of a process (≈ 10 ms of CPU per GiB resident, under the process's memory-map lock), so
//! it is read under a CPU budget, and sooner when what is cheap to read says the PSS may have
//! moved:
//!
//! - **Budget**: each read's cost is measured (the sidecar thread's CPU time) and paid from a
//!   credit that grows by [`BUDGET`] of a second per second, kept up to [`BURST`] reads' worth:
//!   over any long stretch, PSS reads cost at most [`BUDGET`] of one core (plus one burst).
//!   `MEMSIGHT_TREE_BUDGET` (a share of one core, e.g. `0.05`) sets another.
//! - **Quiet**: while nothing changes, a read is due after 1 ÷ ([`QUIET_SHARE`] × budget) times
//!   its cost (a 30 ms read: every 12 s).
//! - **Change**: a read is due as soon as the credit allows when the tree's processes are not the
//!   ones last read, or when their RSS (`statm`, read every sample) rose since the last read by
//!   more than [`GROWTH`] of the PSS it found — summed over processes, rises only.
//!
//! What this bounds: a page a process newly maps adds to its RSS at least what it adds to its PSS,
//! so between two reads the tree's PSS exceeds the last read by at most [`GROWTH`] plus the time
//! a change read waits for credit (none after a quiet spell; at most cost ÷ [`BUDGET`] when reads
//! came back to back). Not seen by RSS: pages that change hands without being mapped or unmapped
//! in the tree — a copy-on-write break in a forked worker (its RSS stays, the tree's PSS grows by
//! the page), a process outside the tree unmapping a page it shared — found at the next quiet
//! read.

use std::time::{Duration, Instant};

/// Long-run share of one core that PSS reads may cost, unless `MEMSIGHT_TREE_BUDGET` says.
pub(crate) const BUDGET: f64 = 0.005;

/// The share of the budget PSS reads cost while nothing changes.
pub(crate) const QUIET_SHARE: f64 = 0.5;

/// The budget: `MEMSIGHT_TREE_BUDGET` (a share of one core, between 0.0001 and 1) or [`BUDGET`].
pub(crate) fn budget_from_env() -> f64 {
    std::env::var("MEMSIGHT_TREE_BUDGET")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|b| b.is_finite())
        .map_or(BUDGET, |b| b.clamp(0.0001, 1.0))
}

/// RSS rise, as a share of the last PSS read, past which the PSS is read again early.
pub(crate) const GROWTH: f64 = 0.05;

/// How many reads' worth of credit may be saved up (read back to back when the tree changes).
const BURST: f64 = 4.0;

/// What the last read found.
struct LastRead {
    at: Instant,
    /// CPU seconds it took.
    cost: f64,
    /// Each process's RSS then, by pid (sorted).
    rss: Vec<(u32, u64)>,
    /// The tree's PSS total it found (its RSS total where PSS was unreadable).
    pss: u64,
}

/// The schedule of one tree's PSS reads.
pub(crate) struct PssSchedule {
    /// Share of one core the reads may cost.
    budget: f64,
    /// CPU seconds that may be spent now (negative: a read cost more than was saved).
    credit: f64,
    refilled: Instant,
    last: Option<LastRead>,
}

impl PssSchedule {
    /// A schedule whose first read is due at once, its reads costing `budget` of one core.
    pub(crate) fn new(now: Instant, budget: f64) -> Self {
        PssSchedule {
            budget,
            credit: 0.0,
            refilled: now,
            last: None,
        }
    }

    /// Whether the credit allows a read at `now` (costing what the last one did): when it does
    /// not, nothing else need be read to decide.
    pub(crate) fn affordable(&mut self, now: Instant) -> bool {
        let Some(last) = &self.last else {
            return true;
        };
        let earned = now.saturating_duration_since(self.refilled).as_secs_f64() * self.budget;
        self.credit = (self.credit + earned).min(BURST * last.cost);
        self.refilled = now;
        self.credit >= last.cost
    }

    /// Whether a read is due at `now`, the tree's processes having RSS `rss` (by pid, sorted).
    pub(crate) fn due(&mut self, now: Instant, rss: &[(u32, u64)]) -> bool {
        if !self.affordable(now) {
            return false;
        }
        let Some(last) = &self.last else {
            return true;
        };
        let quiet = last.cost / (QUIET_SHARE * self.budget);
        if now.saturating_duration_since(last.at).as_secs_f64() >= quiet {
            return true;
        }
        let same_set =
            rss.len() == last.rss.len() && rss.iter().zip(&last.rss).all(|(a, b)| a.0 == b.0);
        if !same_set {
            return true;
        }
        let rise: u64 = rss
            .iter()
            .zip(&last.rss)
            .map(|(now, then)| now.1.saturating_sub(then.1))
            .sum();
        rise as f64 > GROWTH * last.pss as f64
    }

    /// Notes a read made at `now` that cost `cost` of CPU and found PSS total `pss` with the
    /// processes' RSS `rss` (by pid, sorted).
    pub(crate) fn done(&mut self, now: Instant, cost: Duration, rss: Vec<(u32, u64)>, pss: u64) {
        let cost = cost.as_secs_f64();
        if self.last.is_none() {
            // The first read finds the credit full: the job's first moments (workers starting,
            // memory growing) are read as they change.
            self.credit = BURST * cost;
        }
        self.credit -= cost;
        self.last = Some(LastRead {
            at: now,
            cost,
            rss,
            pss,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn at(t0: Instant, s: f64) -> Instant {
        t0 + Duration::from_secs_f64(s)
    }

    #[test]
    fn a_quiet_tree_is_read_at_the_quiet_share_of_a_core() {
        let t0 = Instant::now();
        let mut s = PssSchedule::new(t0, BUDGET);
        let rss = vec![(10, 4096 * MIB), (11, 4096 * MIB)];
        assert!(s.due(t0, &rss), "the first read is due at once");
        s.done(t0, Duration::from_millis(30), rss.clone(), 4200 * MIB);
        // 30 ms of CPU at 0.25% of a core: the next quiet read 12 s later.
        assert!(!s.due(at(t0, 11.9), &rss));
        assert!(s.due(at(t0, 12.0), &rss));
    }

    #[test]
    fn growth_and_new_processes_are_read_as_soon_as_credit_allows() {
        let t0 = Instant::now();
        let mut s = PssSchedule::new(t0, BUDGET);
        let rss = vec![(10, 1000 * MIB)];
        let cost = Duration::from_millis(10);
        s.done(t0, cost, rss.clone(), 1000 * MIB);
        let grown = vec![(10, 1100 * MIB)];
        assert!(s.due(at(t0, 0.1), &grown), "a 10% rise");
        let little = vec![(10, 1040 * MIB)];
        assert!(
            !s.due(at(t0, 0.1), &little),
            "a 4% rise waits for the quiet read"
        );
        assert!(
            s.due(at(t0, 0.1), &[(10, 1000 * MIB), (12, MIB)]),
            "a new worker"
        );
        assert!(
            !s.due(at(t0, 0.1), &[(10, 500 * MIB)]),
            "a fall is no reason"
        );
        // Three more reads back to back spend the credit saved; the next waits for 10 ms of
        // credit at 0.5% of a core: 2 s.
        for i in 1..=3u32 {
            let now = at(t0, 0.1 * f64::from(i));
            let rss = vec![(10, (1000 + 100 * u64::from(i)) * MIB)];
            assert!(s.due(now, &rss), "read {i}");
            s.done(now, cost, rss, (1000 + 100 * u64::from(i)) * MIB);
        }
        let grown = vec![(10, 2000 * MIB)];
        assert!(!s.due(at(t0, 1.0), &grown));
        assert!(s.due(at(t0, 2.4), &grown));
    }

    #[test]
    fn reads_never_cost_more_than_the_budget() {
        let t0 = Instant::now();
        let mut s = PssSchedule::new(t0, BUDGET);
        let cost = Duration::from_millis(20);
        let mut spent = 0.0;
        // A tree whose processes change at every 100 ms sample for ten minutes.
        for i in 0..6000u32 {
            let now = at(t0, f64::from(i) * 0.1);
            let rss = vec![(i, MIB)];
            if s.due(now, &rss) {
                s.done(now, cost, rss, MIB);
                spent += cost.as_secs_f64();
            }
        }
        // 600 s at 0.5% of a core, plus the first read and a burst.
        assert!(spent <= 600.0 * BUDGET + 5.0 * 0.02 + 1e-9, "{spent}");
        assert!(spent >= 600.0 * BUDGET * 0.9, "{spent}: the budget is used");
    }
}
