//! [`Verdict`]: a pure-mode decision with the budget it left, for rate-limit headers.

use std::time::Duration;

use crate::limiter::Decision;

/// The full answer of [`RedisLimiter::check`](crate::RedisLimiter::check): the decision and
/// the fields of redis-cell's reply, so middleware can set `X-RateLimit-Limit`,
/// `X-RateLimit-Remaining`, `X-RateLimit-Reset` and `Retry-After`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), ratelease::Error> {
/// use ratelease::{Algorithm, MemoryStore, Quota, RedisLimiter};
///
/// let limiter = RedisLimiter::builder("api", Quota::per_minute(100)?, MemoryStore::new())
///     .algorithm(Algorithm::FixedWindow)
///     .build()?;
/// let verdict = limiter.check(1).await?;
/// assert!(verdict.is_allowed());
/// assert_eq!((verdict.limit, verdict.remaining), (100, 99));
/// assert_eq!(verdict.reset_after.as_secs(), 60); // the window's end
/// # Ok(()) }
/// ```
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Allowed, or denied with the time to wait.
    pub decision: Decision,
    /// The most tokens that can be had at once: the burst of the quota the store ran under
    /// (`u64::MAX` for an unlimited name).
    pub limit: u64,
    /// Tokens that could be had right after this call (`u64::MAX` for an unlimited name).
    pub remaining: u64,
    /// How long until the whole budget is back (zero if it is).
    pub reset_after: Duration,
}

impl Verdict {
    /// The verdict for a name with no limit.
    pub(crate) const UNLIMITED: Verdict = Verdict {
        decision: Decision::Allowed,
        limit: u64::MAX,
        remaining: u64::MAX,
        reset_after: Duration::ZERO,
    };

    /// True if the tokens were taken.
    pub fn is_allowed(&self) -> bool {
        self.decision.is_allowed()
    }

    /// How long to wait before asking again (zero if allowed).
    pub fn retry_after(&self) -> Duration {
        match self.decision {
            Decision::Allowed => Duration::ZERO,
            Decision::Denied { retry_after } => retry_after,
        }
    }
}
