//! What a hybrid limiter does when the store cannot be reached.
//!
//! A limiter that stalls when Redis stalls takes its service down with it. A [`HybridLimiter`]
//! never waits for the store on the caller's thread, so the only question is what to answer
//! once the tokens it already holds are spent while the store is failing — the circuit is
//! **open** from the first failed lease until a lease succeeds again. While it is open the
//! background task probes the store with jittered exponential back-off (10 ms to 500 ms), and
//! callers are answered by the [`FailurePolicy`]:
//!
//! - [`FailurePolicy::FailOpen`]: admit. The service stays up; the limit is not enforced.
//! - [`FailurePolicy::FailClosed`]: deny. The limit holds; the service is limited to zero.
//! - [`FailurePolicy::LocalFallback`] (the default): each node enforces its own share of the
//!   quota, `rate / expected_nodes` with a burst of `burst / expected_nodes` (at least 1), with
//!   a local GCRA bucket (one atomic word) — Doorman's "safe capacity". With `expected_nodes` set
//!   to the fleet size the fleet stays near the limit; the default of 1 lets every node use the
//!   whole quota, which favours availability over the limit. Set it.
//!
//! Tokens leased before the failure are always spent first. [`HybridLimiter`]'s stats, a
//! `tracing` event on each change, and the `metrics` gauge `ratelease_circuit_open` (labelled
//! with the policy) show the state; `ratelease_store_errors_total` counts failed calls and
//! `ratelease_degraded_tokens_total` what the policy admitted (see [`crate::telemetry`]).
//!
//! [`HybridLimiter`]: crate::HybridLimiter

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::error::StoreError;
use crate::quota::Quota;
use crate::time::Origin;

/// What to answer when local tokens are spent and the store is failing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Admit every request while the store is failing.
    FailOpen,
    /// Deny every request (beyond the tokens already leased) while the store is failing.
    FailClosed,
    /// Enforce `rate / expected_nodes` locally while the store is failing.
    LocalFallback {
        /// How many nodes share the limit.
        expected_nodes: NonZeroU32,
    },
}

impl Default for FailurePolicy {
    fn default() -> Self {
        FailurePolicy::LocalFallback {
            expected_nodes: NonZeroU32::MIN,
        }
    }
}

impl FailurePolicy {
    /// A local fallback for a fleet of `nodes` (0 is read as 1).
    pub fn local_fallback(nodes: u32) -> Self {
        FailurePolicy::LocalFallback {
            expected_nodes: NonZeroU32::new(nodes).unwrap_or(NonZeroU32::MIN),
        }
    }

    /// The policy's name, as used in metrics and logs.
    pub fn name(&self) -> &'static str {
        match self {
            FailurePolicy::FailOpen => "fail_open",
            FailurePolicy::FailClosed => "fail_closed",
            FailurePolicy::LocalFallback { .. } => "local_fallback",
        }
    }
}

/// A lock-free local GCRA bucket: one atomic word, the theoretical arrival time.
#[derive(Debug)]
pub(crate) struct LocalRate {
    origin: Origin,
    /// Nanoseconds per token.
    emission_ns: AtomicU64,
    /// How far ahead of now the arrival time may run: the burst, in nanoseconds.
    tolerance_ns: AtomicU64,
    /// Theoretical arrival time, ns since `origin`.
    tat: AtomicU64,
}

impl LocalRate {
    /// This node's share of `quota` among `nodes`.
    pub(crate) fn share_of(quota: &Quota, nodes: NonZeroU32) -> Self {
        let rate = LocalRate {
            origin: Origin::now(),
            emission_ns: AtomicU64::new(0),
            tolerance_ns: AtomicU64::new(0),
            tat: AtomicU64::new(0),
        };
        rate.set_share_of(quota, nodes);
        rate
    }

    /// Switches to this node's share of `quota` (a quota changed centrally). Callers racing
    /// the switch may pair the old emission with the new tolerance for one decision.
    pub(crate) fn set_share_of(&self, quota: &Quota, nodes: NonZeroU32) {
        let nodes = u64::from(nodes.get());
        let period_ns = u128::from(quota.period_us()) * 1_000;
        let emission = (period_ns * u128::from(nodes) / u128::from(quota.rate())).max(1);
        let emission_ns = u64::try_from(emission).unwrap_or(u64::MAX);
        let burst = (quota.burst() / nodes).max(1);
        // Relaxed: two independent parameters; see above.
        self.emission_ns.store(emission_ns, Ordering::Relaxed);
        self.tolerance_ns
            .store(emission_ns.saturating_mul(burst), Ordering::Relaxed);
    }

    /// Takes `n` tokens, or says how long until it could.
    pub(crate) fn try_take(&self, n: u64) -> Result<(), Duration> {
        self.try_take_at(&self.tat, n)
    }

    /// [`try_take`](Self::try_take) at this rate on another arrival-time word: a keyed limiter
    /// keeps one word per key and shares the rate (`tat` starts at 0).
    pub(crate) fn try_take_at(&self, tat_word: &AtomicU64, n: u64) -> Result<(), Duration> {
        let now = self.origin.elapsed_ns();
        let cost = n.saturating_mul(self.emission_ns.load(Ordering::Relaxed));
        let tolerance = self.tolerance_ns.load(Ordering::Relaxed);
        // Relaxed: the word publishes nothing else; the CAS orders the updates among callers.
        let mut tat = tat_word.load(Ordering::Relaxed);
        loop {
            let new = tat.max(now).saturating_add(cost);
            let ahead = new - now;
            if ahead > tolerance {
                return Err(Duration::from_nanos(ahead - tolerance));
            }
            match tat_word.compare_exchange_weak(tat, new, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(actual) => tat = actual,
            }
        }
    }
}

/// Whether a limiter's store is failing: open from a failed lease until a lease succeeds, with
/// the last error for waiters. Each change is a `tracing` event (the metrics are
/// [`telemetry`](crate::telemetry)'s).
#[derive(Debug, Default)]
pub(crate) struct Circuit {
    open: AtomicBool,
    error: Mutex<Option<StoreError>>,
    /// Failures so far; bumped after `error` is written.
    seq: AtomicU64,
}

impl Circuit {
    /// Whether the circuit is open.
    pub(crate) fn is_open(&self) -> bool {
        // Relaxed: a state flag; a caller that reads it a little late answers as before.
        self.open.load(Ordering::Relaxed)
    }

    /// A store call of `limiter` (answering by `policy`) failed: open the circuit.
    pub(crate) fn fail(&self, limiter: &str, policy: FailurePolicy, error: StoreError) {
        let policy = policy.name();
        if !self.open.swap(true, Ordering::Relaxed) {
            tracing::warn!(limiter = %limiter, %error, policy, "store failing: circuit open");
        }
        *self.error.lock() = Some(error);
        // Release: publishes the error slot to waiters that see the new sequence number.
        self.seq.fetch_add(1, Ordering::Release);
    }

    /// A lease call succeeded: close the circuit.
    pub(crate) fn recovered(&self, limiter: &str) {
        if self.open.swap(false, Ordering::Relaxed) {
            tracing::info!(limiter = %limiter, "store answering again: circuit closed");
        }
    }

    /// Failures so far, to compare with later in [`error_since`](Self::error_since).
    pub(crate) fn failures(&self) -> u64 {
        // Acquire: pairs with the Release increment in `fail`, so the error slot is visible.
        self.seq.load(Ordering::Acquire)
    }

    /// The last error, if any.
    pub(crate) fn last_error(&self) -> Option<StoreError> {
        self.error.lock().clone()
    }

    /// The last error, if a failure happened since [`failures`](Self::failures) said `seen`.
    pub(crate) fn error_since(&self, seen: u64) -> Option<StoreError> {
        if self.failures() == seen {
            return None;
        }
        self.error.lock().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_fallback_enforces_its_share() {
        // 1 000/s over 4 nodes: 250/s each, burst 25.
        let q = Quota::per_second(1_000).unwrap().with_burst(100).unwrap();
        let local = LocalRate::share_of(&q, NonZeroU32::new(4).unwrap());
        let burst = (0..100).filter(|_| local.try_take(1).is_ok()).count();
        assert_eq!(burst, 25);
        let wait = local.try_take(1).unwrap_err();
        assert_eq!(wait, Duration::from_millis(4));
        let mut admitted = 0;
        for _ in 0..1_000 {
            tokio::time::advance(Duration::from_millis(1)).await;
            admitted += (0..10).filter(|_| local.try_take(1).is_ok()).count();
        }
        assert_eq!(admitted, 250, "one second at 250/s");
    }

    #[test]
    fn default_is_a_local_fallback_of_the_whole_quota() {
        assert_eq!(FailurePolicy::default(), FailurePolicy::local_fallback(1));
        assert_eq!(
            FailurePolicy::local_fallback(0),
            FailurePolicy::local_fallback(1)
        );
        assert_eq!(FailurePolicy::FailClosed.name(), "fail_closed");
    }
}
