//! What every limiter mode offers, so callers, the simulator and middleware can swap modes.

use std::future::Future;
use std::time::Duration;

use crate::error::Error;
use crate::quota::Quota;

/// The outcome of a check. Being limited is an outcome, not an error.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The tokens were taken.
    Allowed,
    /// Not now; try again after about `retry_after`.
    Denied {
        /// Estimated time until the request could succeed.
        retry_after: Duration,
    },
}

impl Decision {
    /// True for [`Decision::Allowed`].
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allowed)
    }
}

/// A rate limiter shared by a fleet, in any mode.
///
/// [`HybridLimiter`](crate::HybridLimiter) answers `try_acquire` without awaiting anything (its
/// inherent `try_acquire` is synchronous); [`RedisLimiter`](crate::RedisLimiter) makes one
/// store call per decision.
pub trait Limiter: Send + Sync {
    /// The limiter's quota.
    fn quota(&self) -> Quota;

    /// Takes `n` tokens now, or says when to retry.
    ///
    /// # Errors
    /// [`Error::ZeroTokens`], [`Error::ExceedsBurst`], or a store failure.
    fn try_acquire(&self, n: u64) -> impl Future<Output = Result<Decision, Error>> + Send;

    /// Waits until `n` tokens are taken.
    ///
    /// # Errors
    /// As [`try_acquire`](Limiter::try_acquire).
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future takes no tokens.
    fn acquire(&self, n: u64) -> impl Future<Output = Result<(), Error>> + Send;

    /// Waits at most `timeout` for `n` tokens. Returns `Denied` at once when the earliest
    /// possible grant is known to lie beyond the timeout.
    ///
    /// # Errors
    /// As [`try_acquire`](Limiter::try_acquire).
    fn try_acquire_for(
        &self,
        n: u64,
        timeout: Duration,
    ) -> impl Future<Output = Result<Decision, Error>> + Send;

    /// [`try_acquire`](Limiter::try_acquire) answered without awaiting, if this limiter can
    /// (a [`HybridLimiter`](crate::HybridLimiter) always can); `None` if it must await.
    /// Middleware uses it to admit without allocating a future.
    fn try_acquire_now(&self, n: u64) -> Option<Result<Decision, Error>> {
        let _ = n;
        None
    }
}

/// A limiter with one budget per key (user, API key, client address), in any mode.
///
/// The keyed twin of [`Limiter`]: the same outcomes and errors, for `key`'s budget.
pub trait KeyedLimiter<K: ?Sized>: Send + Sync {
    /// Takes `n` tokens from `key`'s budget now, or says when to retry.
    ///
    /// # Errors
    /// As [`Limiter::try_acquire`].
    fn try_acquire(&self, key: &K, n: u64) -> impl Future<Output = Result<Decision, Error>> + Send;

    /// Waits until `n` tokens are taken from `key`'s budget.
    ///
    /// # Errors
    /// As [`Limiter::acquire`].
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future takes no tokens.
    fn acquire(&self, key: &K, n: u64) -> impl Future<Output = Result<(), Error>> + Send;

    /// Waits at most `timeout` for `n` tokens from `key`'s budget.
    ///
    /// # Errors
    /// As [`Limiter::try_acquire_for`].
    fn try_acquire_for(
        &self,
        key: &K,
        n: u64,
        timeout: Duration,
    ) -> impl Future<Output = Result<Decision, Error>> + Send;

    /// [`try_acquire`](KeyedLimiter::try_acquire) answered without awaiting, if this limiter
    /// can; `None` if it must await.
    fn try_acquire_now(&self, key: &K, n: u64) -> Option<Result<Decision, Error>> {
        let _ = (key, n);
        None
    }
}

/// Rejects requests that can never succeed.
#[inline]
pub(crate) fn check_request(quota: &Quota, n: u64) -> Result<(), Error> {
    check_tokens(n, quota.burst())
}

/// Rejects requests that can never succeed against a bucket of `burst`.
#[inline]
pub(crate) fn check_tokens(n: u64, burst: u64) -> Result<(), Error> {
    if n == 0 {
        return Err(Error::ZeroTokens);
    }
    if n > burst {
        return Err(Error::ExceedsBurst {
            requested: n,
            burst,
        });
    }
    Ok(())
}
