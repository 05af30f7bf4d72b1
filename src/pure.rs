//! Pure-Redis mode: one atomic script call per decision.
//!
//! This is the classic design — one atomic script per decision — and the reference every
//! other mode is measured against: exact, fair by construction, and one network round trip per
//! decision. It runs on any [`LeaseStore`], so the simulator can run it on a
//! [`MemoryStore`](crate::MemoryStore).
//!
//! With central configuration ([`crate::config`]) every reply carries the quota the store ran
//! under; the limiter keeps the last one (for [`Limiter::quota`] and the burst check), behind
//! a mutex that is only touched next to a store call. An unconfigured name answered
//! [`QuotaSource::Absent`] is remembered for [`Unconfigured::RECHECK`] in one atomic word, so an
//! unlimited name costs no store calls in between.
//!
//! Every [`Algorithm`] runs in pure mode. [`RedisLimiter::check`] answers with the budget left
//! ([`Verdict`]), and [`RedisLimiter::available_permits`] reads it without taking anything (a
//! release of 0 tokens: the window and leaky-bucket scripts' `peek`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::algorithm::token_bucket::QuotaSource;
use crate::algorithm::Algorithm;
use crate::config::{Budget, Unconfigured};
use crate::error::Error;
use crate::key;
use crate::limiter::{check_request, Decision, Limiter};
use crate::quota::Quota;
use crate::store::{LeaseRequest, LeaseStore, RedisStore, ReleaseRequest};
use crate::telemetry::CallMetrics;
use crate::time;
use crate::time::Origin;
use crate::verdict::Verdict;

/// Configures a [`RedisLimiter`].
#[must_use]
#[derive(Debug)]
pub struct RedisLimiterBuilder<S> {
    name: String,
    quota: Quota,
    store: S,
    budget: Budget,
    client_id: Option<u64>,
    unconfigured: Unconfigured,
    algorithm: Algorithm,
    /// Handles to report to instead of the limiter's own (a keyed limiter's, shared by its
    /// keys).
    metrics: Option<Arc<CallMetrics>>,
}

impl<S: LeaseStore> RedisLimiterBuilder<S> {
    /// Reports to `metrics` instead of registering handles of the limiter's own.
    pub(crate) fn metrics(mut self, metrics: Arc<CallMetrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// How to count (default [`Algorithm::TokenBucket`]).
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// Whose budget to spend (default [`Budget::Overall`]).
    pub fn budget(mut self, budget: Budget) -> Self {
        self.budget = budget;
        self
    }

    /// This client's id for [`Budget::PerClient`] (default: random). Instances that should
    /// share one client budget use the same id.
    pub fn client_id(mut self, id: u64) -> Self {
        self.client_id = Some(id);
        self
    }

    /// What to do if the name has no quota stored centrally (default: use the builder's).
    pub fn if_unconfigured(mut self, what: Unconfigured) -> Self {
        self.unconfigured = what;
        self
    }

    /// Builds the limiter.
    ///
    /// # Errors
    /// [`Error::Config`] for an empty or overlong name; for a window whose burst is not its
    /// rate; for an algorithm other than the token bucket with an [`Unconfigured`] other than
    /// [`Unconfigured::UseQuota`] (central configuration is the token bucket's).
    pub fn build(self) -> Result<RedisLimiter<S>, Error> {
        key::validate_name(&self.name)?;
        self.algorithm.check(&self.quota, self.unconfigured)?;
        let client = match self.budget {
            Budget::Overall => None,
            Budget::PerClient => Some(self.client_id.unwrap_or_else(|| fastrand::u64(..))),
        };
        let metrics = match self.metrics {
            Some(metrics) => metrics,
            None => Arc::new(CallMetrics::pure(&self.name)),
        };
        Ok(RedisLimiter {
            name: self.name.into(),
            quota: self.quota,
            store: self.store,
            client,
            unconfigured: self.unconfigured,
            algorithm: self.algorithm,
            state: Arc::new(State {
                effective: Mutex::new(self.quota),
                origin: Origin::now(),
                absent_until_ns: AtomicU64::new(0),
                metrics,
            }),
        })
    }
}

/// What the clones of one limiter share.
#[derive(Debug)]
struct State {
    /// The quota of the last reply (the builder's until then).
    effective: Mutex<Quota>,
    origin: Origin,
    /// Until when (ns since `origin`) the name is known to be unconfigured.
    absent_until_ns: AtomicU64,
    /// Metric handles, updated after each store call ([`crate::telemetry`]).
    metrics: Arc<CallMetrics>,
}

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
    client: Option<u64>,
    unconfigured: Unconfigured,
    algorithm: Algorithm,
    state: Arc<State>,
}

impl<S: Clone> Clone for RedisLimiter<S> {
    fn clone(&self) -> Self {
        RedisLimiter {
            name: self.name.clone(),
            quota: self.quota,
            store: self.store.clone(),
            client: self.client,
            unconfigured: self.unconfigured,
            algorithm: self.algorithm,
            state: self.state.clone(),
        }
    }
}

impl<S: LeaseStore> RedisLimiter<S> {
    /// A limiter for `name` with `quota` on `store`.
    ///
    /// # Errors
    /// [`Error::Config`] for an empty or overlong name.
    pub fn new(name: impl Into<String>, quota: Quota, store: S) -> Result<Self, Error> {
        Self::builder(name, quota, store).build()
    }

    /// A builder for limiter `name` with `quota` on `store`.
    pub fn builder(name: impl Into<String>, quota: Quota, store: S) -> RedisLimiterBuilder<S> {
        RedisLimiterBuilder {
            name: name.into(),
            quota,
            store,
            budget: Budget::Overall,
            client_id: None,
            unconfigured: Unconfigured::UseQuota,
            algorithm: Algorithm::TokenBucket,
            metrics: None,
        }
    }

    /// The quota in effect: from the last store reply (a central config, or the builder's).
    pub fn quota(&self) -> Quota {
        *self.state.effective.lock()
    }

    /// How this limiter counts.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// This limiter's client id for [`Budget::PerClient`] (`None` for the fleet budget).
    pub fn client_id(&self) -> Option<u64> {
        self.client
    }

    fn now_ns(&self) -> u64 {
        self.state.origin.elapsed_ns()
    }

    /// The answer for a name known to be unconfigured, without a store call.
    fn absent(&self) -> Result<Verdict, Error> {
        match self.unconfigured {
            Unconfigured::Error => Err(Error::Unconfigured(self.name.to_string())),
            _ => Ok(Verdict::UNLIMITED),
        }
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
        Ok(self.check(n).await?.decision)
    }

    /// Takes `n` tokens now, or says when to retry, and reports the budget left (for
    /// `X-RateLimit-*` headers). One store call.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn check(&self, n: u64) -> Result<Verdict, Error> {
        check_request(&self.quota, n)?;
        // Relaxed: a cache of the store's answer; nothing else is published through it.
        if self.now_ns() < self.state.absent_until_ns.load(Ordering::Relaxed) {
            return self.absent();
        }
        let request = LeaseRequest::exact(n)
            .for_client(self.client)
            .configured_only(!self.unconfigured.falls_back())
            .algorithm(self.algorithm);
        let sent = Instant::now();
        let reply = self.store.lease(&self.name, &self.quota, &request).await;
        self.state.metrics.lease_call(sent.elapsed(), reply.is_ok());
        let reply = reply?;
        if reply.source == QuotaSource::Absent {
            let until = self
                .now_ns()
                .saturating_add(time::nanos(Unconfigured::RECHECK));
            self.state.absent_until_ns.store(until, Ordering::Relaxed);
            return self.absent();
        }
        *self.state.effective.lock() = reply.quota;
        check_request(&reply.quota, n)?;
        self.state.metrics.decided(n, reply.granted >= n);
        let decision = if reply.granted >= n {
            Decision::Allowed
        } else {
            Decision::Denied {
                retry_after: reply.retry_after,
            }
        };
        Ok(Verdict {
            decision,
            limit: reply.quota.burst(),
            remaining: reply.remaining,
            reset_after: reply.reset_after,
        })
    }

    /// Tokens that could be taken now, without taking any (a release of 0 tokens). For the
    /// token bucket, under the name's stored quota if it has one, else the builder's.
    ///
    /// # Errors
    /// [`Error::Store`].
    pub async fn available_permits(&self) -> Result<u64, Error> {
        let request = ReleaseRequest::new(0)
            .for_client(self.client)
            .algorithm(self.algorithm);
        let reply = self
            .store
            .release(&self.name, &self.quota, &request)
            .await?;
        Ok(reply.remaining)
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
        let deadline = time::from_now(timeout);
        loop {
            match self.try_acquire(n).await? {
                Decision::Allowed => return Ok(Decision::Allowed),
                Decision::Denied { retry_after } => {
                    if time::from_now(retry_after) > deadline {
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
        RedisLimiter::quota(self)
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
