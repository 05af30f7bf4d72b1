//! Lease sizing: how many tokens a node asks for, and when.
//!
//! The hybrid limiter asks its [`LeasePolicy`] two things: the low-water mark (refill when the
//! local bucket falls below it, so the next batch arrives before the bucket runs dry) and, at
//! each refill, how many tokens to ask for (`want`) and the fewest worth taking (`min`). The
//! policy is one replaceable piece so that sizing can evolve without touching the hot path.
//!
//! [`FixedLease`] is the documents' option 3 as written: a fixed batch.

use crate::quota::Quota;

/// What the node knows when it asks for a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseContext {
    /// The limiter's quota.
    pub quota: Quota,
    /// Tokens still in the local bucket.
    pub local: u64,
    /// Largest request denied locally since the previous lease (0 if none).
    pub denied: u64,
}

/// A lease request: up to `want` tokens, at least `min`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseAsk {
    /// Most tokens to take.
    pub want: u64,
    /// Fewest acceptable (all or nothing below it).
    pub min: u64,
}

/// Decides lease sizes for a [`HybridLimiter`](crate::HybridLimiter).
pub trait LeasePolicy: Send + Sync + 'static {
    /// Refill when the local bucket falls below this many tokens.
    fn low_water(&self, quota: &Quota) -> u64;

    /// The next lease to ask for. The limiter clamps the answer to `1 ≤ min ≤ want` and
    /// `min ≤ burst`.
    fn ask(&self, ctx: &LeaseContext) -> LeaseAsk;
}

/// A fixed batch size (the documents' option 3): each lease is all or nothing, `min = want =
/// size`. Taking a whole batch or none matters under overload: with `min = 1` a starved node
/// would wake for every single token the bucket earns (two store calls per token); with
/// `min = size` the store's `retry_after` is the time until a whole batch is there, so store
/// calls stay near `rate / size` however high the demand. A denied request larger than the
/// batch raises the next ask, so any request up to the burst can be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedLease {
    size: Option<u64>,
    low_water: Option<u64>,
}

/// Default target: a batch lasts about this long at the full rate.
const DEFAULT_BATCH_SECS: f64 = 0.05;

impl FixedLease {
    /// Batches of `size` tokens, refilled below half a batch.
    pub fn new(size: u64) -> Self {
        FixedLease {
            size: Some(size.max(1)),
            low_water: None,
        }
    }

    /// Batches of about 50 ms of the quota's rate (at least 1, at most the burst).
    pub fn for_quota() -> Self {
        FixedLease {
            size: None,
            low_water: None,
        }
    }

    /// Refill below `tokens` (default: half a batch).
    pub fn low_water(mut self, tokens: u64) -> Self {
        self.low_water = Some(tokens);
        self
    }

    /// The batch size for `quota`.
    pub fn size(&self, quota: &Quota) -> u64 {
        let size = self
            .size
            .unwrap_or_else(|| (quota.per_second_f64() * DEFAULT_BATCH_SECS).ceil() as u64);
        size.clamp(1, quota.burst())
    }
}

impl Default for FixedLease {
    fn default() -> Self {
        Self::for_quota()
    }
}

impl LeasePolicy for FixedLease {
    fn low_water(&self, quota: &Quota) -> u64 {
        self.low_water.unwrap_or(self.size(quota) / 2)
    }

    fn ask(&self, ctx: &LeaseContext) -> LeaseAsk {
        let size = self.size(&ctx.quota).max(ctx.denied);
        LeaseAsk {
            want: size,
            min: size,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn default_batch_is_fifty_ms_of_rate_within_burst() {
        let q = Quota::per_second(1_000).unwrap();
        assert_eq!(FixedLease::for_quota().size(&q), 50);
        assert_eq!(LeasePolicy::low_water(&FixedLease::for_quota(), &q), 25);
        let tiny = Quota::new(1, Duration::from_secs(60)).unwrap();
        assert_eq!(FixedLease::for_quota().size(&tiny), 1);
        assert_eq!(FixedLease::new(5_000).size(&q), 1_000, "clamped to burst");
    }

    #[test]
    fn batches_are_all_or_nothing() {
        let q = Quota::per_second(1_000).unwrap();
        let ctx = LeaseContext {
            quota: q,
            local: 3,
            denied: 1,
        };
        assert_eq!(
            FixedLease::new(50).ask(&ctx),
            LeaseAsk { want: 50, min: 50 }
        );
    }

    #[test]
    fn denied_requests_raise_the_ask() {
        let q = Quota::per_second(1_000).unwrap();
        let ctx = LeaseContext {
            quota: q,
            local: 0,
            denied: 80,
        };
        assert_eq!(
            FixedLease::new(50).ask(&ctx),
            LeaseAsk { want: 80, min: 80 }
        );
    }
}
