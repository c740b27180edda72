//! Reconnection delays after the sidecar goes away: exponential from 100 ms, capped at 5 s.

use std::time::Duration;

/// First delay.
const BASE_MS: u64 = 100;
/// Longest delay.
const CAP_MS: u64 = 5_000;

/// Attempts since the connection was last up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Backoff {
    attempts: u32,
}

impl Backoff {
    /// The delay before the next attempt, and counts it.
    pub fn next_delay(&mut self) -> Duration {
        let ms = BASE_MS
            .saturating_mul(1u64 << self.attempts.min(16))
            .min(CAP_MS);
        self.attempts = self.attempts.saturating_add(1);
        Duration::from_millis(ms)
    }

    /// A connection succeeded: start again from the first delay.
    pub fn reset(&mut self) {
        self.attempts = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_100ms_caps_at_5s_and_resets() {
        let mut b = Backoff::default();
        let ms: Vec<u128> = (0..9).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]);
        for _ in 0..100 {
            b.next_delay();
        }
        assert_eq!(b.next_delay().as_millis(), 5000);
        b.reset();
        assert_eq!(b.next_delay().as_millis(), 100);
    }
}
