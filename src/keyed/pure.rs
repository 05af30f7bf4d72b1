//! [`KeyedRedisLimiter`]: the pure-Redis keyed form, one store call per decision.
//!
//! A pure limiter keeps no local state, so a key is nothing but a bucket name: each call
//! builds the key's [`RedisLimiter`] (a name and a clone of the store) and asks it. No map, no
//! eviction, no cap — memory does not grow with the number of keys. The keys share one circuit
//! ([`crate::failure`]): while the store is failing, one call at a time probes it and the others
//! return its last error at once — or, with [`KeyedRedisLimiter::on_store_failure`], are
//! admitted ([`FailurePolicy::FailOpen`]) or denied ([`FailurePolicy::FailClosed`]); the
//! policies that enforce a local rate need per-key state, which this limiter does not keep.
//! It is the exact
//! reference for [`KeyedHybridLimiter`](crate::KeyedHybridLimiter), as [`RedisLimiter`] is
//! for [`HybridLimiter`](crate::HybridLimiter).

use std::borrow::Borrow;
use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{AcquireError, BuildError};
use crate::failure::FailurePolicy;
use crate::limiter::{Decision, KeyRef, KeyedLimiter};
use crate::pure::{Outage, RedisLimiter};
use crate::quota::Quota;
use crate::store::names::{self, Registration, Scope};
use crate::store::{LeaseStore, RedisStore};
use crate::telemetry::CallMetrics;

use super::name;

/// One budget per key, one store call per decision.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), ratelease::Error> {
/// use ratelease::{KeyedRedisLimiter, MemoryStore, Quota};
///
/// let per_user = KeyedRedisLimiter::new("api", Quota::per_second(2)?, MemoryStore::new())?;
/// assert!(per_user.acquire_now("alice", 2).await?.is_allowed());
/// assert!(!per_user.acquire_now("alice", 1).await?.is_allowed());
/// assert!(per_user.acquire_now("bob", 1).await?.is_allowed());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct KeyedRedisLimiter<S = RedisStore> {
    name: String,
    quota: Quota,
    store: S,
    /// One set of metric handles for every key, labelled `mode="keyed-pure"` and by this
    /// limiter's name, never by key (see [`crate::telemetry`]).
    metrics: Arc<CallMetrics>,
    /// One circuit for every key: while the store is failing, one call at a time probes it
    /// and the others return its error at once (or the policy's answer).
    outage: Arc<Outage>,
    /// What answers while the store is failing: none (the store's error), or a policy that
    /// needs no per-key state.
    failure: Option<FailurePolicy>,
    /// The limiter's name in the process's registry ([`crate::store::names`]), left with the
    /// last clone.
    _registration: Option<Arc<Registration>>,
}

impl<S: LeaseStore + Clone> KeyedRedisLimiter<S> {
    /// A keyed limiter `name` giving every key `quota` on `store`. Another keyed limiter of
    /// this process with the same name on the same store shares every key's bucket; if it was
    /// built with a different quota, this logs a warning (see [`crate::config`], "One name,
    /// one quota").
    ///
    /// # Errors
    /// [`BuildError::Config`] for a bad name (see
    /// [`KeyedHybridBuilder::build`](crate::KeyedHybridBuilder::build)).
    pub fn new(name: impl Into<String>, quota: Quota, store: S) -> Result<Self, BuildError> {
        let name = name.into();
        name::validate_keyed_name(&name)?;
        let metrics = Arc::new(CallMetrics::keyed_pure(&name));
        let registration = names::register(&store, &name, Scope::Keyed, quota).map(Arc::new);
        Ok(KeyedRedisLimiter {
            name,
            quota,
            store,
            metrics,
            outage: Arc::new(Outage::new(None)),
            failure: None,
            _registration: registration,
        })
    }

    /// What to answer while the store is failing (default: nothing — each call returns the
    /// store's error, at once while the circuit is open, which the HTTP layer sends as a 503).
    /// A pure keyed limiter keeps no per-key state, so it takes the policies that need none:
    /// [`FailurePolicy::FailOpen`] admits every call, [`FailurePolicy::FailClosed`] denies it
    /// (retry after the next probe; a 429 in the HTTP layer) — and a waiting call
    /// ([`acquire`](Self::acquire), [`try_acquire_for`](Self::try_acquire_for), so an HTTP
    /// layer that queues) returns the store's error instead of waiting out the outage.
    ///
    /// # Errors
    /// [`BuildError::Config`] for [`FailurePolicy::LocalFallback`] and
    /// [`FailurePolicy::LastKnownShare`]: a local rate per key needs the per-key state a
    /// [`KeyedHybridLimiter`](crate::KeyedHybridLimiter) keeps.
    pub fn on_store_failure(mut self, policy: FailurePolicy) -> Result<Self, BuildError> {
        if policy.fallback_nodes().is_some() {
            return Err(BuildError::Config(format!(
                "a pure keyed limiter keeps no per-key state for a local rate: {} needs one; \
                 use FailurePolicy::FailOpen or FailClosed, or a KeyedHybridLimiter",
                policy.name()
            )));
        }
        self.failure = Some(policy);
        Ok(self)
    }

    /// The failure policy set with [`on_store_failure`](Self::on_store_failure), if any.
    pub fn failure_policy(&self) -> Option<FailurePolicy> {
        self.failure
    }

    /// The pure limiter of `key`'s bucket. It reports its calls to this keyed limiter's
    /// metrics (`mode="keyed-pure"`), not under the bucket's name.
    pub fn limiter<Q: Display + ?Sized>(&self, key: &Q) -> RedisLimiter<S> {
        let builder = RedisLimiter::builder(self.bucket_name(key), self.quota, self.store.clone())
            .metrics(self.metrics.clone())
            .outage(self.outage.clone());
        match self.failure {
            Some(policy) => builder.on_store_failure(policy),
            None => builder,
        }
        .build()
        .expect("a valid keyed name gives valid bucket names")
    }

    /// The name of `key`'s bucket in the store (see
    /// [`KeyedHybridLimiter::bucket_name`](crate::KeyedHybridLimiter::bucket_name)).
    pub fn bucket_name<Q: Display + ?Sized>(&self, key: &Q) -> String {
        name::bucket_name(&self.name, key)
    }

    /// The limiter's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The quota every key gets.
    pub fn quota(&self) -> Quota {
        self.quota
    }

    /// Takes `n` tokens of `key` now, or says when to retry. One store call: a pure limiter
    /// keeps no local state, so it has no synchronous `try_acquire`, and this is its one
    /// decision, under the name every keyed limiter gives it.
    ///
    /// # Errors
    /// [`AcquireError::ZeroTokens`], [`AcquireError::ExceedsBurst`], or [`AcquireError::Store`].
    pub async fn acquire_now<Q: Display + ?Sized>(
        &self,
        key: &Q,
        n: u64,
    ) -> Result<Decision, AcquireError> {
        self.limiter(key).acquire_now(n).await
    }

    /// The old name of [`acquire_now`](Self::acquire_now).
    ///
    /// # Errors
    /// As [`acquire_now`](Self::acquire_now).
    #[deprecated(
        note = "use `acquire_now` (the same store call): `try_acquire` names the synchronous \
                local check, which a pure limiter cannot make"
    )]
    pub async fn try_acquire<Q: Display + ?Sized>(
        &self,
        key: &Q,
        n: u64,
    ) -> Result<Decision, AcquireError> {
        self.acquire_now(key, n).await
    }

    /// As [`acquire_now`](Self::acquire_now): a pure limiter has no lease to wait for. Here so
    /// that code written for a [`KeyedHybridLimiter`](crate::KeyedHybridLimiter) runs
    /// unchanged.
    ///
    /// # Errors
    /// As [`acquire_now`](Self::acquire_now).
    pub async fn try_acquire_or_lease<Q: Display + ?Sized>(
        &self,
        key: &Q,
        n: u64,
        lease_wait: Duration,
    ) -> Result<Decision, AcquireError> {
        let _ = lease_wait;
        self.acquire_now(key, n).await
    }

    /// Waits until `n` tokens of `key` are taken, sleeping for each reply's `retry_after`.
    ///
    /// # Errors
    /// As [`acquire_now`](Self::acquire_now); under [`FailurePolicy::FailClosed`], the
    /// store's error while the circuit is open, instead of waiting out the outage.
    pub async fn acquire<Q: Display + ?Sized>(&self, key: &Q, n: u64) -> Result<(), AcquireError> {
        self.limiter(key).acquire(n).await
    }

    /// Waits at most `timeout` for `n` tokens of `key`; gives up at once if the store says
    /// the wait would be longer.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire_for<Q: Display + ?Sized>(
        &self,
        key: &Q,
        n: u64,
        timeout: Duration,
    ) -> Result<Decision, AcquireError> {
        self.limiter(key).try_acquire_for(n, timeout).await
    }
}

impl<K, S: LeaseStore + Clone> KeyedLimiter<K> for KeyedRedisLimiter<S> {
    fn quota(&self) -> Quota {
        self.quota
    }

    async fn acquire_now<Q>(&self, key: &Q, n: u64) -> Result<Decision, AcquireError>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        KeyedRedisLimiter::acquire_now(self, key, n).await
    }

    async fn acquire<Q>(&self, key: &Q, n: u64) -> Result<(), AcquireError>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        KeyedRedisLimiter::acquire(self, key, n).await
    }

    async fn try_acquire_for<Q>(
        &self,
        key: &Q,
        n: u64,
        timeout: Duration,
    ) -> Result<Decision, AcquireError>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        KeyedRedisLimiter::try_acquire_for(self, key, n, timeout).await
    }
}
