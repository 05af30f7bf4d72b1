//! Rate algorithms: the token bucket and three more, fixed window, sliding window and leaky
//! bucket.
//!
//! # Design
//!
//! Every algorithm is one atomic Lua script in `lua/` and its Rust twin here (a pure step
//! function from stored state, quota, operation and `now` to new state and reply), which
//! [`MemoryStore`](crate::MemoryStore) runs; a differential property test holds each pair to
//! identical replies. The algorithm travels in the request
//! ([`LeaseRequest::algorithm`](crate::LeaseRequest::algorithm)), so the existing limiters,
//! stores and failure policies serve all four: [`RedisLimiter`](crate::RedisLimiter) and
//! [`HybridLimiter`](crate::HybridLimiter) take it from their builders' `algorithm(…)`.
//!
//! One [`Quota`] describes each of them:
//!
//! | algorithm | quota | bound | hybrid |
//! | --- | --- | --- | --- |
//! | [`TokenBucket`](Algorithm::TokenBucket) | `burst` tokens, refilled at `rate` per `period` | `burst + rate × W / period` in any window `W` | yes, leasing on terms ([`crate::algorithm::token_bucket`]) |
//! | [`FixedWindow`](Algorithm::FixedWindow) | `rate` per window of `period` (`burst` must equal `rate`) | `rate` per window; `2 × rate` across a window edge | yes, anonymous batches dropped at the window's end |
//! | [`SlidingWindow`](Algorithm::SlidingWindow) | `rate` in any window of `period` (`burst` must equal `rate`) | `rate` in any window of `period` | no |
//! | [`LeakyBucket`](Algorithm::LeakyBucket) | a funnel of `burst` tokens leaking `rate` per `period` (GCRA) | as the token bucket; after a burst, grants spaced `period / rate` apart | no |
//!
//! The three window and leaky-bucket scripts share one protocol, and one head that reads it (`lua/prelude.lua`,
//! sent before each, after the helpers of `lua/helpers.lua` that every script but the lock's
//! starts with and the argument readers of `lua/arguments.lua`):
//! `KEYS` = the state keys; `ARGV` = `op` (`lease`, `release` or `peek`), `rate`, `period_us`,
//! `burst`, `want` or `tokens`, `min` or `at`, `now_us` (empty: the server's `TIME`); the reply
//! is `{granted, remaining, retry_after_us, reset_after_us, at_us}`, redis-cell's fields plus
//! `at`: where the grant was counted (the fixed window's start, the sliding window's log
//! time). A release carries the `at` of its lease and gives tokens back only there, so a late
//! release never raises a later window's budget. A peek (a release of 0 tokens, in Rust) reads
//! the budget without changing it. Denials and peeks of the fixed window and the leaky bucket
//! are read-only.
//!
//! Keys: an algorithm's key is the limiter's bucket key plus a suffix (`:fw`, `:sw`, `:lb`),
//! then the client suffix of [`Budget::PerClient`](crate::Budget::PerClient) (`:client:` and
//! 16 hex digits); the sliding window's running total is its log's key plus `:n`
//! (`<bucket>:sw:n`, or `<bucket>:sw:client:<hex>:n`). All are in the limiter's hash tag, so
//! different algorithms on one name never share state.
//!
//! Central configuration ([`ConfigStore`](crate::ConfigStore)) applies to the token bucket
//! only: the other scripts run under the caller's quota, and a limiter built with another
//! algorithm and an [`Unconfigured`] other than [`Unconfigured::UseQuota`] is an
//! [`BuildError::Config`].
//!
//! Explicit times (`now_us`, `at`) are limited to 2^52 µs (the year 2112) in those scripts, so
//! that a time plus a period stays an exact integer in a Lua double.
//!
//! # Example
//!
//! ```no_run
//! # async fn demo(store: ratelease::RedisStore) -> Result<(), ratelease::Error> {
//! use std::time::Duration;
//! use ratelease::{Algorithm, HybridLimiter, Quota, RedisLimiter};
//!
//! // Fixed window (a counter per window, INCRBY + EXPIRE): 1 000 calls per minute, leased in batches.
//! let api = HybridLimiter::builder("partner-api", Quota::per_minute(1_000)?, store.clone())
//!     .algorithm(Algorithm::FixedWindow)
//!     .build()?;
//!
//! // Sliding window (Redisson's log): at most 5 logins in any 15 minutes.
//! let logins = Quota::new(5, Duration::from_secs(900))?;
//! let login = RedisLimiter::builder("login:alice", logins, store.clone())
//!     .algorithm(Algorithm::SlidingWindow)
//!     .build()?;
//!
//! // Leaky bucket (a funnel, as GCRA): one SMS per 30 s per number, bursts of 3.
//! let sms = Quota::new(1, Duration::from_secs(30))?.with_burst(3)?;
//! let sms = RedisLimiter::builder("sms:+15550100", sms, store)
//!     .algorithm(Algorithm::LeakyBucket)
//!     .build()?;
//!
//! // Every pure limiter reports its budget, for X-RateLimit-* headers:
//! let verdict = login.check(1).await?; // limit, remaining, reset_after, retry_after()
//! let left = sms.available_permits().await?; // takes nothing
//! # let _ = (api, verdict, left);
//! # Ok(()) }
//! ```

pub mod fixed_window;
pub mod holders;
pub mod leaky_bucket;
pub mod sliding_window;
pub mod token_bucket;

use crate::algorithm::token_bucket::InvalidArgument;
use crate::config::Unconfigured;
use crate::error::BuildError;
use crate::quota::{Quota, MAX_VALUE};

/// The complete token-bucket script, ready for `EVAL`: `lua/helpers.lua` followed by
/// `lua/token_bucket.lua`. Other languages can run it against the same keys (see the latter's
/// header for the argument protocol), or concatenate the two files the same way.
pub const TOKEN_BUCKET_LUA: &str = lua_script!("token_bucket.lua");

/// The complete fixed-window script, ready for `EVAL`: `lua/helpers.lua`, `lua/arguments.lua`,
/// `lua/prelude.lua` and `lua/fixed_window.lua`, concatenated in that order.
pub const FIXED_WINDOW_LUA: &str = lua_script!("arguments.lua", "prelude.lua", "fixed_window.lua");
/// The complete sliding-window script, ready for `EVAL`: `lua/helpers.lua`, `lua/arguments.lua`,
/// `lua/prelude.lua` and `lua/sliding_window.lua`, concatenated in that order.
pub const SLIDING_WINDOW_LUA: &str =
    lua_script!("arguments.lua", "prelude.lua", "sliding_window.lua");
/// The complete leaky-bucket (GCRA) script, ready for `EVAL`: `lua/helpers.lua`, `lua/arguments.lua`,
/// `lua/prelude.lua` and `lua/leaky_bucket.lua`, concatenated in that order.
pub const LEAKY_BUCKET_LUA: &str = lua_script!("arguments.lua", "prelude.lua", "leaky_bucket.lua");

/// Largest explicit time (µs) the window and leaky-bucket scripts accept: 2^52.
pub const MAX_NOW_US: u64 = MAX_VALUE;

/// Milliseconds stored state outlives the time it could matter (a funnel's usual `+ 10 s`):
/// the same slack for every algorithm.
pub use token_bucket::SLACK_MS;

/// How a limiter counts.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), ratelease::Error> {
/// use ratelease::{Algorithm, MemoryStore, Quota, RedisLimiter};
///
/// // At most 3 requests in any 10 seconds.
/// let quota = Quota::new(3, std::time::Duration::from_secs(10))?;
/// let limiter = RedisLimiter::builder("login", quota, MemoryStore::new())
///     .algorithm(Algorithm::SlidingWindow)
///     .build()?;
/// for _ in 0..3 {
///     assert!(limiter.acquire_now(1).await?.is_allowed());
/// }
/// let verdict = limiter.check(1).await?;
/// assert!(!verdict.is_allowed());
/// assert_eq!(verdict.remaining, 0);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// A token bucket (`lua/token_bucket.lua`): leasing on terms, central configuration.
    #[default]
    TokenBucket,
    /// At most `rate` tokens per window of `period`; a window opens with the first lease
    /// after the previous one ended (`lua/fixed_window.lua`).
    FixedWindow,
    /// At most `rate` tokens in any window of `period`: a log of grants
    /// (`lua/sliding_window.lua`). Its memory grows with the rate: the log holds up to
    /// `min(rate, period in µs)` entries (about 60 bytes each in Redis), so 1 000 000 an hour
    /// is tens of MB per key. A call costs O(log N) plus the entries it drops, but a log whose
    /// running total was lost (evicted on its own) is recounted whole, in one script call.
    SlidingWindow,
    /// A funnel of `burst` tokens leaking `rate` per `period`, as GCRA
    /// (`lua/leaky_bucket.lua`).
    LeakyBucket,
}

impl std::str::FromStr for Algorithm {
    type Err = BuildError;

    fn from_str(name: &str) -> Result<Self, BuildError> {
        Algorithm::from_name(name)
    }
}

impl Algorithm {
    /// Every algorithm.
    pub const ALL: [Algorithm; 4] = [
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::LeakyBucket,
    ];

    /// A short name (`token-bucket`, `fixed-window`, `sliding-window`, `leaky-bucket`).
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token-bucket",
            Algorithm::FixedWindow => "fixed-window",
            Algorithm::SlidingWindow => "sliding-window",
            Algorithm::LeakyBucket => "leaky-bucket",
        }
    }

    /// The algorithm called `name` (one of the [`name`](Self::name)s).
    ///
    /// # Errors
    /// [`BuildError::Config`] naming the known algorithms.
    pub fn from_name(name: &str) -> Result<Self, BuildError> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == name)
            .ok_or_else(|| {
                let known: Vec<_> = Algorithm::ALL.iter().map(|a| a.name()).collect();
                BuildError::Config(format!("unknown algorithm {name:?}; one of {known:?}"))
            })
    }

    /// Whether a [`HybridLimiter`](crate::HybridLimiter) can lease batches under it: the token
    /// bucket and the fixed window.
    pub fn leases_in_batches(self) -> bool {
        matches!(self, Algorithm::TokenBucket | Algorithm::FixedWindow)
    }

    /// The Lua script of the algorithm.
    pub fn script(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => TOKEN_BUCKET_LUA,
            Algorithm::FixedWindow => FIXED_WINDOW_LUA,
            Algorithm::SlidingWindow => SLIDING_WINDOW_LUA,
            Algorithm::LeakyBucket => LEAKY_BUCKET_LUA,
        }
    }

    /// The suffix of the algorithm's keys after the limiter's bucket key.
    pub(crate) fn key_suffix(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "",
            Algorithm::FixedWindow => ":fw",
            Algorithm::SlidingWindow => ":sw",
            Algorithm::LeakyBucket => ":lb",
        }
    }

    /// Whether the quota's budget is per window (`burst` must equal `rate`).
    fn windowed(self) -> bool {
        matches!(self, Algorithm::FixedWindow | Algorithm::SlidingWindow)
    }

    /// Checks a limiter's settings: a window's `burst` must equal its `rate`, and only the
    /// token bucket reads central configuration.
    pub(crate) fn check(self, quota: &Quota, unconfigured: Unconfigured) -> Result<(), BuildError> {
        if self.windowed() && quota.burst() != quota.rate() {
            return Err(BuildError::Config(format!(
                "{}: the burst ({}) must equal the rate ({}): a window's budget is its rate",
                self.name(),
                quota.burst(),
                quota.rate()
            )));
        }
        if self != Algorithm::TokenBucket && unconfigured != Unconfigured::UseQuota {
            return Err(BuildError::Config(format!(
                "{}: central configuration is for the token bucket only; use \
                 Unconfigured::UseQuota",
                self.name()
            )));
        }
        Ok(())
    }

    /// Checks a hybrid limiter's settings: [`check`](Self::check), and batches only where
    /// they are exact.
    pub(crate) fn check_hybrid(
        self,
        quota: &Quota,
        unconfigured: Unconfigured,
    ) -> Result<(), BuildError> {
        self.check(quota, unconfigured)?;
        if !self.leases_in_batches() {
            return Err(BuildError::Config(format!(
                "{}: a hybrid limiter cannot lease batches of it (tokens spent from a batch \
                 would escape its window or its spacing); use RedisLimiter",
                self.name()
            )));
        }
        Ok(())
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What one call of a window or leaky-bucket script does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Take up to `want` tokens, but only if at least `min` can be had.
    Lease {
        /// Most tokens to grant.
        want: u64,
        /// Fewest acceptable; below it nothing is taken.
        min: u64,
    },
    /// Give `tokens` back to where the lease that got them was counted (`at` of its reply).
    Release {
        /// Tokens returned.
        tokens: u64,
        /// The lease's `at`, µs (required by the windows when `tokens > 0`).
        at: Option<u64>,
    },
    /// Report the budget; change nothing (the sliding window drops entries that left).
    Peek,
}

impl Op {
    /// The script's `op` argument.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Lease { .. } => "lease",
            Op::Release { .. } => "release",
            Op::Peek => "peek",
        }
    }
}

/// A window or leaky-bucket script's reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    /// Tokens taken by this call.
    pub granted: u64,
    /// Tokens that could be taken now.
    pub remaining: u64,
    /// Microseconds until a lease like this one could succeed (0 if now, and for releases).
    pub retry_after_us: u64,
    /// Microseconds until the whole budget is back.
    pub reset_after_us: u64,
    /// Where a grant is counted, µs on the store's clock (see [`Op::Release`]).
    pub at_us: u64,
}

/// What a step did to the stored state, so a store can mirror Redis's key expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persist {
    /// Nothing was written: the state and its expiry stay as they were.
    Unchanged,
    /// The state was written and expires in `ms` milliseconds.
    Keep {
        /// Time to live, ms.
        ms: u64,
    },
    /// The state was deleted.
    Delete,
}

/// A time to live in ms: `us` rounded up, plus [`SLACK_MS`].
fn keep_for(us: u64) -> Persist {
    Persist::Keep {
        ms: us.div_ceil(1_000) + SLACK_MS,
    }
}

/// `lua/prelude.lua`'s argument checks, in its order. A [`Quota`] guarantees the quota's own
/// ranges, the capacity's included.
fn validate(quota: &Quota, op: &Op, now_us: u64, windowed: bool) -> Result<(), InvalidArgument> {
    if windowed && quota.burst() != quota.rate() {
        return Err(InvalidArgument("burst"));
    }
    match *op {
        Op::Lease { want, min } => {
            if want == 0 || want > MAX_VALUE {
                return Err(InvalidArgument("want"));
            }
            if min == 0 || min > want || min > quota.burst() {
                return Err(InvalidArgument("min"));
            }
        }
        Op::Release { tokens, at } => {
            if tokens > MAX_VALUE {
                return Err(InvalidArgument("tokens"));
            }
            let at_ok = match at {
                None => tokens == 0,
                Some(at) => at <= MAX_NOW_US,
            };
            if windowed && !at_ok {
                return Err(InvalidArgument("at"));
            }
        }
        Op::Peek => {}
    }
    if now_us > MAX_NOW_US {
        return Err(InvalidArgument("now_us"));
    }
    Ok(())
}

/// The stored state of any of the new algorithms (what a [`MemoryStore`](crate::MemoryStore)
/// keeps per key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// [`fixed_window::State`].
    Fixed(fixed_window::State),
    /// [`sliding_window::State`].
    Sliding(sliding_window::State),
    /// [`leaky_bucket::State`].
    Leaky(leaky_bucket::State),
}

/// Runs one step of `algorithm` on `state` (absent: nothing stored). On error nothing changes.
///
/// # Errors
/// The script's argument errors; `algorithm` for the token bucket, which has its own step
/// ([`crate::algorithm::token_bucket::step`]).
pub fn step(
    algorithm: Algorithm,
    state: &mut Option<State>,
    quota: &Quota,
    op: Op,
    now_us: u64,
) -> Result<(Reply, Persist), InvalidArgument> {
    // Each arm lends the typed state to its step and puts it back (a step changes nothing
    // when it fails).
    macro_rules! run {
        ($module:ident, $variant:ident) => {{
            let mut typed = match state.take() {
                Some(State::$variant(s)) => Some(s),
                _ => None,
            };
            let result = $module::step(&mut typed, quota, op, now_us);
            *state = typed.map(State::$variant);
            result
        }};
    }
    match algorithm {
        Algorithm::TokenBucket => Err(InvalidArgument("algorithm")),
        Algorithm::FixedWindow => run!(fixed_window, Fixed),
        Algorithm::SlidingWindow => run!(sliding_window, Sliding),
        Algorithm::LeakyBucket => run!(leaky_bucket, Leaky),
    }
}

/// A test's lease of between `min` and `want` tokens at `now` through one algorithm's `step`.
#[cfg(test)]
#[allow(clippy::type_complexity)]
fn lease_with<T>(
    step: fn(&mut Option<T>, &Quota, Op, u64) -> Result<(Reply, Persist), InvalidArgument>,
    state: &mut Option<T>,
    quota: &Quota,
    want: u64,
    min: u64,
    now_us: u64,
) -> Reply {
    step(state, quota, Op::Lease { want, min }, now_us)
        .unwrap()
        .0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_need_burst_equal_to_rate_and_no_central_config() {
        let q = Quota::per_second(10).unwrap();
        let bursty = q.with_burst(20).unwrap();
        for a in Algorithm::ALL {
            assert!(a.check(&q, Unconfigured::UseQuota).is_ok());
            assert_eq!(
                a.check(&bursty, Unconfigured::UseQuota).is_ok(),
                !a.windowed()
            );
            assert_eq!(
                a.check(&q, Unconfigured::Unlimited).is_ok(),
                a == Algorithm::TokenBucket
            );
            assert_eq!(
                a.check_hybrid(&q, Unconfigured::UseQuota).is_ok(),
                a.leases_in_batches()
            );
        }
    }

    #[test]
    fn the_dispatch_keeps_state_per_algorithm() {
        let q = Quota::per_second(10).unwrap();
        let mut st = None;
        let lease = Op::Lease { want: 4, min: 1 };
        let (r, _) = step(Algorithm::FixedWindow, &mut st, &q, lease, 0).unwrap();
        assert_eq!((r.granted, r.remaining), (4, 6));
        assert!(matches!(st, Some(State::Fixed(_))));
        // Another algorithm's state under the same key reads as absent.
        let (r, _) = step(Algorithm::LeakyBucket, &mut st, &q, lease, 0).unwrap();
        assert_eq!((r.granted, r.remaining), (4, 6));
        assert!(matches!(st, Some(State::Leaky(_))));
        assert_eq!(
            step(Algorithm::TokenBucket, &mut st, &q, lease, 0).unwrap_err(),
            InvalidArgument("algorithm")
        );
    }
}
