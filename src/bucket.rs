//! The token-bucket step: a pure function from (stored state, quota, operation, now) to
//! (new state, reply).
//!
//! This is the Rust twin of `lua/token_bucket.lua`, written to give the same reply for every
//! input, error messages included. [`MemoryStore`](crate::MemoryStore) runs it under a per-key
//! lock; the script runs it inside Redis. A differential property test holds the two together.
//!
//! # Fixed-point arithmetic
//!
//! A quota adds `rate` tokens every `period_us` microseconds. With `g = gcd(rate, period_us)`,
//! one token is `scale = period_us / g` units and each microsecond adds `inc = rate / g` units,
//! so a lazy refill is the exact integer `elapsed_us × inc`: no fraction of a token is ever lost
//! (the source articles' `floor(elapsed / interval)` drops one on every call). [`Quota`] keeps
//! `burst × scale ≤ 2^52`, so the script's doubles hold every value exactly.
//!
//! A bucket at capacity is not stored: absent means full. A stored bucket expires
//! [`SLACK_MS`] after it would be full again, so expiry never changes an answer.

use crate::quota::{Quota, MAX_VALUE};

/// Milliseconds a stored bucket outlives its time-to-full.
pub const SLACK_MS: u64 = 10_000;

/// Largest explicit `now` (µs) the script accepts: 2^53.
pub const MAX_TIME_US: u64 = 1 << 53;

/// A stored bucket: `level` in units of `1 / scale` token, last updated at `ts_us`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketState {
    /// Tokens × `scale`.
    pub level: u64,
    /// Units per token when this state was written.
    pub scale: u64,
    /// Time of the last update, µs on the store's clock.
    pub ts_us: u64,
}

/// What one script call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Take up to `want` tokens, but only if at least `min` are there.
    Lease {
        /// Most tokens to grant.
        want: u64,
        /// Fewest acceptable; below it nothing is taken.
        min: u64,
    },
    /// Give `tokens` back, never raising the bucket above capacity.
    Release {
        /// Tokens returned.
        tokens: u64,
    },
}

/// The script's reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepReply {
    /// Tokens taken by this call.
    pub granted: u64,
    /// Whole tokens left.
    pub remaining: u64,
    /// Microseconds until `min` tokens are available (0 if they are now, and for release).
    pub retry_after_us: u64,
    /// Microseconds until the bucket is full.
    pub reset_after_us: u64,
}

/// The outcome of a step: what to store (None = delete, the bucket is full) and the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// New state, or `None` when the bucket is full and the key is deleted.
    pub state: Option<BucketState>,
    /// Time to live of the stored state, in ms (meaningless when `state` is `None`).
    pub ttl_ms: u64,
    /// The reply.
    pub reply: StepReply,
}

/// Rejected arguments; the message is the same text the script returns after `RATELEASE `.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InvalidArgument(pub &'static str);

impl std::fmt::Display for InvalidArgument {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid argument {}", self.0)
    }
}

/// Runs one step. `quota` is already valid; the operation's arguments are checked as the
/// script checks them.
pub fn step(
    stored: Option<BucketState>,
    quota: &Quota,
    op: Op,
    now_us: u64,
) -> Result<Step, InvalidArgument> {
    let scale = u128::from(quota.scale());
    let inc = u128::from(quota.increment());
    let burst = u128::from(quota.burst());
    let cap = burst * scale;
    let max = u128::from(MAX_VALUE);
    match op {
        Op::Lease { want, min } => {
            if want == 0 || u128::from(want) > max {
                return Err(InvalidArgument("want"));
            }
            if min == 0 || min > want || u128::from(min) > burst {
                return Err(InvalidArgument("min"));
            }
        }
        Op::Release { tokens } => {
            if u128::from(tokens) > burst {
                return Err(InvalidArgument("tokens"));
            }
        }
    }
    if now_us > MAX_TIME_US {
        return Err(InvalidArgument("now_us"));
    }
    let now = u128::from(now_us);

    let (mut level, mut ts) = (cap, now);
    if let Some(s) = stored.filter(valid) {
        level = if u128::from(s.scale) == scale {
            u128::from(s.level)
        } else {
            // Whole tokens survive a quota change.
            u128::from(s.level / s.scale) * scale
        };
        level = level.min(cap);
        ts = u128::from(s.ts_us);
    }

    if now > ts {
        let need = cap - level;
        if need > 0 {
            let dt = now - ts;
            level = if dt >= need.div_ceil(inc) {
                cap
            } else {
                level + dt * inc
            };
        }
        ts = now;
    }

    let mut granted = 0;
    let mut retry = 0;
    match op {
        Op::Lease { want, min } => {
            let whole = level / scale;
            if whole >= u128::from(min) {
                granted = whole.min(u128::from(want));
                level -= granted * scale;
            }
            let need = u128::from(min) * scale;
            if need > level {
                retry = (need - level).div_ceil(inc);
            }
        }
        Op::Release { tokens } => {
            level = (level + u128::from(tokens) * scale).min(cap);
        }
    }

    let reset = (cap - level).div_ceil(inc);
    let (state, ttl_ms) = if level >= cap {
        (None, 0)
    } else {
        let state = BucketState {
            level: narrow(level),
            scale: narrow(scale),
            ts_us: narrow(ts),
        };
        (Some(state), narrow(reset.div_ceil(1000)) + SLACK_MS)
    };
    Ok(Step {
        state,
        ttl_ms,
        reply: StepReply {
            granted: narrow(granted),
            remaining: narrow(level / scale),
            retry_after_us: narrow(retry),
            reset_after_us: narrow(reset),
        },
    })
}

/// The script's check of stored fields (it reads anything else as a full bucket).
fn valid(s: &BucketState) -> bool {
    s.scale >= 1 && s.level <= MAX_VALUE && s.scale <= MAX_VALUE && s.ts_us <= MAX_TIME_US
}

/// Every value here is bounded by 2^53 (see the module docs).
fn narrow(v: u128) -> u64 {
    u64::try_from(v).expect("bucket arithmetic stays below 2^53")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn lease(stored: Option<BucketState>, q: &Quota, want: u64, min: u64, now: u64) -> Step {
        step(stored, q, Op::Lease { want, min }, now).unwrap()
    }

    #[test]
    fn new_bucket_is_full_and_grants_up_to_want() {
        let q = Quota::per_second(10).unwrap();
        let s = lease(None, &q, 4, 1, 0);
        assert_eq!(s.reply.granted, 4);
        assert_eq!(s.reply.remaining, 6);
        assert_eq!(s.reply.retry_after_us, 0);
        assert_eq!(s.reply.reset_after_us, 400_000);
    }

    #[test]
    fn all_or_nothing_below_min() {
        let q = Quota::per_second(10).unwrap();
        let s = lease(None, &q, 10, 10, 0);
        let s = lease(s.state, &q, 3, 3, 150_000); // 1.5 tokens refilled
        assert_eq!(s.reply.granted, 0);
        assert_eq!(s.reply.remaining, 1);
        assert_eq!(s.reply.retry_after_us, 150_000); // 1.5 more tokens at 100 ms each
    }

    #[test]
    fn refill_keeps_fractions_across_calls() {
        // 3 tokens per 10 ms: one token every 3.33 ms. Ten calls 1 ms apart must refill exactly
        // 3 tokens in total, where per-call flooring would refill none.
        let q = Quota::with_parts(3, Duration::from_millis(10), 3).unwrap();
        let mut s = lease(None, &q, 3, 3, 0);
        for t in 1..=10u64 {
            s = step(s.state, &q, Op::Release { tokens: 0 }, t * 1_000).unwrap();
        }
        assert_eq!(s.reply.remaining, 3);
        assert!(s.state.is_none(), "a full bucket is deleted");
    }

    #[test]
    fn release_never_exceeds_capacity() {
        let q = Quota::per_second(10).unwrap();
        let s = lease(None, &q, 2, 1, 0);
        let s = step(s.state, &q, Op::Release { tokens: 10 }, 0).unwrap();
        assert_eq!(s.reply.remaining, 10);
        assert!(s.state.is_none());
    }

    #[test]
    fn clock_going_back_refills_nothing_and_keeps_ts() {
        let q = Quota::per_second(10).unwrap();
        let s = lease(None, &q, 10, 1, 1_000_000);
        let back = lease(s.state, &q, 1, 1, 500_000);
        assert_eq!(back.reply.granted, 0);
        assert_eq!(back.state.unwrap().ts_us, 1_000_000);
    }

    #[test]
    fn corrupt_state_reads_as_full() {
        let q = Quota::per_second(10).unwrap();
        let bad = BucketState {
            level: 5,
            scale: 0,
            ts_us: 0,
        };
        assert_eq!(lease(Some(bad), &q, 10, 1, 0).reply.granted, 10);
    }

    #[test]
    fn rejects_bad_arguments() {
        let q = Quota::per_second(10).unwrap();
        let e = |op| step(None, &q, op, 0).unwrap_err().0;
        assert_eq!(e(Op::Lease { want: 0, min: 0 }), "want");
        assert_eq!(e(Op::Lease { want: 5, min: 6 }), "min");
        assert_eq!(e(Op::Lease { want: 20, min: 11 }), "min");
        assert_eq!(e(Op::Release { tokens: 11 }), "tokens");
        assert_eq!(
            step(None, &q, Op::Release { tokens: 1 }, MAX_TIME_US + 1)
                .unwrap_err()
                .0,
            "now_us"
        );
    }

    #[test]
    fn ttl_outlives_time_to_full() {
        let q = Quota::per_second(10).unwrap();
        let s = lease(None, &q, 10, 1, 0);
        assert_eq!(s.ttl_ms, 1_000 + SLACK_MS);
    }
}
