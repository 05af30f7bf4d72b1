//! Waiting after a failure, shared by every background task (hybrid, keyed, concurrency):
//! one exponential back-off, one jitter, one round-trip estimate.
//!
//! A fleet that fails together must not retry together, so every wait is jittered. The
//! back-off waits a uniformly random time in `[b/2, b]` and doubles `b` up to its cap ("equal
//! jitter": never less than half the step, so a fleet spreads out without anyone retrying at
//! once). After a timeout the step starts at twice the timeout: the store is queueing, and
//! retries that come sooner only lengthen the queue with calls nobody will wait for. The
//! round-trip estimate is an exponentially weighted average (weight 1/8, as TCP's
//! SRTT) kept in one atomic word, read by callers for their retry hint.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::StoreError;
use crate::time::nanos;

/// Shortest wait after an over-limit reply.
pub(crate) const MIN_RETRY: Duration = Duration::from_micros(100);
/// First back-off after a store error.
pub(crate) const ERROR_BACKOFF_MIN: Duration = Duration::from_millis(10);
/// Longest back-off after store errors (so leasing resumes within this long of recovery).
pub(crate) const ERROR_BACKOFF_MAX: Duration = Duration::from_millis(500);
/// How many of its timeouts a node waits (before jitter) after a store call timed out (see
/// [`Backoff::after`]).
pub(crate) const TIMEOUTS_WAITED: u32 = 2;

/// Retry hint before any round trip was measured.
pub(crate) const DEFAULT_RTT: Duration = Duration::from_millis(1);

/// A uniformly random duration in `[0, max]`.
pub(crate) fn jitter(rng: &mut fastrand::Rng, max: Duration) -> Duration {
    Duration::from_nanos(rng.u64(0..=nanos(max)))
}

/// Exponential back-off with equal jitter, from `min` doubling up to `max`.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    step: Duration,
    min: Duration,
    max: Duration,
}

impl Backoff {
    /// A back-off whose first wait is at most `min`.
    pub(crate) fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            step: min,
            min,
            max,
        }
    }

    /// The back-off after store errors: 10 ms doubling to 500 ms (see [`after`](Self::after)
    /// for timeouts).
    pub(crate) fn for_errors() -> Self {
        Backoff::new(ERROR_BACKOFF_MIN, ERROR_BACKOFF_MAX)
    }

    /// The next wait, in `[step/2, step]`; doubles the step (up to the cap).
    pub(crate) fn next(&mut self, rng: &mut fastrand::Rng) -> Duration {
        let wait = self.step / 2 + jitter(rng, self.step / 2);
        self.step = (self.step * 2).min(self.max);
        wait
    }

    /// The next wait after a failed store call: as [`next`](Self::next), but a timeout
    /// starts the step at [`TIMEOUTS_WAITED`] times that timeout. A call that timed out found
    /// the store queueing calls longer than the timeout; a fleet whose nodes all retry sooner
    /// keeps that queue full of calls nobody waits for (the store still runs each, and its
    /// grant is stranded) — congestion collapse. Other errors (a refused connection) start at
    /// the first step, so one lost call costs little.
    pub(crate) fn after(&mut self, error: &StoreError, rng: &mut fastrand::Rng) -> Duration {
        if let StoreError::Timeout(timeout) = error {
            self.step = self.step.max(*timeout * TIMEOUTS_WAITED).min(self.max);
        }
        self.next(rng)
    }

    /// Back to the first step (after a success).
    pub(crate) fn reset(&mut self) {
        self.step = self.min;
    }
}

/// A round trip under the estimate divided by this is a queue drained, not jitter: the
/// estimate falls halfway to it at once (see [`RttEstimate::observe`]). At a start of 10 000
/// nodes a node's first lease waits about 0.2 s in the store's queue; an estimate falling an
/// eighth a call after that held the largest shares' low-water marks (three round trips of
/// their share) above their leases for a dozen calls, and they called again as each reply
/// landed: 22 calls in their busiest second, 15 with this rule (SIMULATIONS.md, "A queue
/// drained is forgotten"). Round trips within half of the estimate move it by an eighth, so
/// symmetric jitter keeps it at their mean. Where they are skewed (mostly short, now and then
/// several times longer) it sits nearer the short ones than the mean; it sizes leads of three
/// round trips, and a lead is at least a quarter horizon, which is longer wherever the round
/// trip is a fraction of a millisecond.
const QUEUE_DRAINED: u64 = 2;

/// A smoothed round-trip time, in one atomic word (0 until the first sample).
#[derive(Debug, Default)]
pub(crate) struct RttEstimate(AtomicU64);

impl RttEstimate {
    /// The estimate, or [`DEFAULT_RTT`] before any sample.
    pub(crate) fn get(&self) -> Duration {
        // Relaxed: a hint; nothing else is published through it.
        match self.0.load(Ordering::Relaxed) {
            0 => DEFAULT_RTT,
            ns => Duration::from_nanos(ns),
        }
    }

    /// A call returned after `took`; `answered`: the store answered it. Only an answered call
    /// is a round trip: a timeout (or a lost connection) says how long the caller waited, and
    /// counted, a store outage's timeouts sized every lease (and its low-water mark) for a
    /// round trip of the timeout after the store was back. Load-then-store may lose a
    /// sample when two callers write at once, which an average of many does not miss.
    ///
    /// Each sample moves the estimate an eighth of the way to it, but one under half the
    /// estimate moves it halfway: a queue in the store that has drained (see
    /// [`QUEUE_DRAINED`]).
    pub(crate) fn observe(&self, took: Duration, answered: bool) {
        if !answered {
            return;
        }
        let ns = nanos(took).max(1);
        let old = self.0.load(Ordering::Relaxed);
        let new = match old {
            0 => ns,
            _ if ns < old / QUEUE_DRAINED => (old + ns) / 2,
            _ => (old * 7 + ns) / 8,
        };
        self.0.store(new, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_waits_between_half_and_the_whole_step_and_doubles_to_its_cap() {
        let mut rng = fastrand::Rng::with_seed(7);
        let mut b = Backoff::new(Duration::from_millis(10), Duration::from_millis(40));
        let steps = [10, 20, 40, 40];
        for step in steps {
            let wait = b.next(&mut rng);
            let step = Duration::from_millis(step);
            assert!(
                wait >= step / 2 && wait <= step,
                "{wait:?} for a step of {step:?}"
            );
        }
        b.reset();
        assert!(b.next(&mut rng) <= Duration::from_millis(10));
        let waits: Vec<_> = (0..64)
            .map(|_| {
                b.reset();
                b.next(&mut rng)
            })
            .collect();
        assert!(waits.iter().any(|w| *w != waits[0]), "jittered");
    }

    #[test]
    fn a_timeout_starts_the_backoff_at_twice_the_timeout() {
        let mut rng = fastrand::Rng::with_seed(7);
        let in_step = |wait: Duration, ms: u64| {
            let step = Duration::from_millis(ms);
            wait >= step / 2 && wait <= step
        };
        // A refused connection: the first step (10 ms), as `next`.
        let mut b = Backoff::for_errors();
        let refused = StoreError::Redis(crate::error::RedisFailure::new(
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into(),
        ));
        assert!(in_step(b.after(&refused, &mut rng), 10));
        // A 50 ms timeout: 100 ms, then doubling to the cap; a longer step is kept.
        let mut b = Backoff::for_errors();
        let timeout = StoreError::Timeout(Duration::from_millis(50));
        assert!(in_step(b.after(&timeout, &mut rng), 100));
        assert!(in_step(b.after(&timeout, &mut rng), 200));
        assert!(in_step(b.after(&timeout, &mut rng), 400));
        assert!(in_step(b.after(&timeout, &mut rng), 500));
        // A timeout longer than the cap waits the cap.
        let mut b = Backoff::for_errors();
        let long = StoreError::Timeout(Duration::from_secs(5));
        assert!(in_step(b.after(&long, &mut rng), 500));
    }

    #[test]
    fn rtt_starts_at_the_default_then_follows_samples() {
        let rtt = RttEstimate::default();
        assert_eq!(rtt.get(), DEFAULT_RTT);
        rtt.observe(Duration::from_micros(800), true);
        assert_eq!(rtt.get(), Duration::from_micros(800));
        rtt.observe(Duration::from_micros(1_600), true);
        assert_eq!(rtt.get(), Duration::from_micros(900));
        // A call that was not answered (a timeout) is no sample.
        rtt.observe(Duration::from_millis(100), false);
        assert_eq!(rtt.get(), Duration::from_micros(900));
    }

    #[test]
    fn rtt_forgets_a_drained_queue_within_a_few_calls_but_not_its_jitter() {
        // A first call that waited 200 ms in the store's queue, then 1 ms round trips: five
        // calls bring the estimate under 10 ms (an eighth a call took 24).
        let rtt = RttEstimate::default();
        rtt.observe(Duration::from_millis(200), true);
        let mut calls = 0;
        while rtt.get() >= Duration::from_millis(10) {
            rtt.observe(Duration::from_millis(1), true);
            calls += 1;
        }
        assert_eq!(calls, 5);
        // Round trips spread between 0.6 and 1.4 ms around 1 ms: each sample is within half
        // the estimate, which moves by an eighth and stays near their mean.
        let rtt = RttEstimate::default();
        rtt.observe(Duration::from_millis(1), true);
        for _ in 0..100 {
            rtt.observe(Duration::from_micros(600), true);
            rtt.observe(Duration::from_micros(1_400), true);
        }
        let us = rtt.get().as_micros();
        assert!((950..=1_050).contains(&us), "{us} µs");
    }
}
