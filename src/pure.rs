//! Pure-Redis mode: one atomic script call per decision.
//!
//! This is the source articles' chosen design (document 000, option 4) and the reference every
//! other mode is measured against: exact, fair by construction, and one network round trip per
//! decision. It runs on any [`LeaseStore`], so the simulator can run it on a
//! [`MemoryStore`](crate::MemoryStore).

use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;
use crate::key;
use crate::limiter::{check_request, Decision, Limiter};
use crate::quota::Quota;
use crate::store::{LeaseRequest, LeaseStore, RedisStore};

/// A limiter that asks the store for every decision (`min = want = n`).
///
/// ```no_run
/// # async fn demo() -> Result<(), ratelease::Error> {
/// use ratelease::{Quota, RedisLimiter, RedisStore};
///
/// let store = RedisStore::connect("redis://127.0.0.1:6379/").await?;
/// let limiter = RedisLimiter::new("api", Quota::per_second(100)?, store)?;
/// if limiter.try_acquire(1).await?.is_allowed() {
///     // serve the request
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RedisLimiter<S = RedisStore> {
    name: Arc<str>,
    quota: Quota,
    store: S,
}

impl<S: Clone> Clone for RedisLimiter<S> {
    fn clone(&self) -> Self {
        RedisLimiter {
            name: self.name.clone(),
            quota: self.quota,
            store: self.store.clone(),
        }
    }
}

impl<S: LeaseStore> RedisLimiter<S> {
    /// A limiter for `name` with `quota` on `store`.
    ///
    /// # Errors
    /// [`Error::Config`] for an empty or overlong name.
    pub fn new(name: impl Into<String>, quota: Quota, store: S) -> Result<Self, Error> {
        let name = name.into();
        key::validate_name(&name)?;
        Ok(RedisLimiter {
            name: name.into(),
            quota,
            store,
        })
    }

    /// The limiter's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Takes `n` tokens now, or says when to retry. One store call.
    ///
    /// # Errors
    /// [`Error::ZeroTokens`], [`Error::ExceedsBurst`], or [`Error::Store`].
    pub async fn try_acquire(&self, n: u64) -> Result<Decision, Error> {
        check_request(&self.quota, n)?;
        let reply = self
            .store
            .lease(&self.name, &self.quota, &LeaseRequest::exact(n))
            .await?;
        Ok(if reply.granted >= n {
            Decision::Allowed
        } else {
            Decision::Denied {
                retry_after: reply.retry_after,
            }
        })
    }

    /// Waits until `n` tokens are taken, sleeping for each reply's `retry_after`.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn acquire(&self, n: u64) -> Result<(), Error> {
        loop {
            match self.try_acquire(n).await? {
                Decision::Allowed => return Ok(()),
                Decision::Denied { retry_after } => tokio::time::sleep(retry_after).await,
            }
        }
    }

    /// Waits at most `timeout` for `n` tokens; gives up at once if the store says the wait
    /// would be longer.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn try_acquire_for(&self, n: u64, timeout: Duration) -> Result<Decision, Error> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match self.try_acquire(n).await? {
                Decision::Allowed => return Ok(Decision::Allowed),
                Decision::Denied { retry_after } => {
                    if tokio::time::Instant::now() + retry_after > deadline {
                        return Ok(Decision::Denied { retry_after });
                    }
                    tokio::time::sleep(retry_after).await;
                }
            }
        }
    }
}

impl<S: LeaseStore> Limiter for RedisLimiter<S> {
    fn quota(&self) -> Quota {
        self.quota
    }

    async fn try_acquire(&self, n: u64) -> Result<Decision, Error> {
        RedisLimiter::try_acquire(self, n).await
    }

    async fn acquire(&self, n: u64) -> Result<(), Error> {
        RedisLimiter::acquire(self, n).await
    }

    async fn try_acquire_for(&self, n: u64, timeout: Duration) -> Result<Decision, Error> {
        RedisLimiter::try_acquire_for(self, n, timeout).await
    }
}
