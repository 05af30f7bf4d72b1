//! The limiters a file builds ([`Limiters`]), and the enums that hold either mode
//! ([`AnyLimiter`], [`AnyKeyedLimiter`]) behind one type.

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::fmt::Display;
use std::hash::Hash;
use std::time::Duration;

use crate::concurrency::{ConcurrencyLimiter, ConcurrencyStore};
use crate::error::AcquireError;
use crate::hybrid::HybridLimiter;
use crate::keyed::{KeyedHybridLimiter, KeyedRedisLimiter};
use crate::limiter::{Decision, KeyRef, KeyedLimiter, Limiter, LocalAnswer};
use crate::pure::RedisLimiter;
use crate::quota::Quota;
use crate::store::LeaseStore;

/// A limiter in either mode.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum AnyLimiter<S: LeaseStore> {
    /// Leasing batches.
    Hybrid(HybridLimiter<S>),
    /// One store call per decision.
    Pure(RedisLimiter<S>),
}

impl<S: LeaseStore + Clone> Limiter for AnyLimiter<S> {
    // Every call is the limiter's own `Limiter` answer, so a limiter built from a file does
    // what one built in code does (where leasing buys nothing, a hybrid limiter's miss is a
    // decision in the store, and it has no local answer).

    fn quota(&self) -> Quota {
        match self {
            AnyLimiter::Hybrid(l) => Limiter::quota(l),
            AnyLimiter::Pure(l) => Limiter::quota(l),
        }
    }

    async fn ready(&self) -> Result<(), AcquireError> {
        AnyLimiter::ready(self).await
    }

    async fn acquire_now(&self, n: u64) -> Result<Decision, AcquireError> {
        match self {
            AnyLimiter::Hybrid(l) => Limiter::acquire_now(l, n).await,
            AnyLimiter::Pure(l) => Limiter::acquire_now(l, n).await,
        }
    }

    async fn acquire(&self, n: u64) -> Result<(), AcquireError> {
        match self {
            AnyLimiter::Hybrid(l) => Limiter::acquire(l, n).await,
            AnyLimiter::Pure(l) => Limiter::acquire(l, n).await,
        }
    }

    async fn try_acquire_for(&self, n: u64, timeout: Duration) -> Result<Decision, AcquireError> {
        match self {
            AnyLimiter::Hybrid(l) => Limiter::try_acquire_for(l, n, timeout).await,
            AnyLimiter::Pure(l) => Limiter::try_acquire_for(l, n, timeout).await,
        }
    }

    fn local_answer(&self, n: u64) -> Option<Result<LocalAnswer, AcquireError>> {
        match self {
            AnyLimiter::Hybrid(l) => Limiter::local_answer(l, n),
            AnyLimiter::Pure(l) => Limiter::local_answer(l, n),
        }
    }

    async fn try_acquire_or_lease(
        &self,
        n: u64,
        lease_wait: Duration,
    ) -> Result<Decision, AcquireError> {
        match self {
            AnyLimiter::Hybrid(l) => Limiter::try_acquire_or_lease(l, n, lease_wait).await,
            AnyLimiter::Pure(l) => Limiter::try_acquire_or_lease(l, n, lease_wait).await,
        }
    }
}

impl<S: LeaseStore> AnyLimiter<S> {
    /// Waits until the limiter has heard from the store once: [`HybridLimiter::ready`] (its
    /// first lease) for a hybrid one, [`RedisLimiter::ready`] (one call that takes nothing)
    /// for a pure one.
    ///
    /// # Errors
    /// As [`HybridLimiter::ready`] and [`RedisLimiter::ready`].
    pub async fn ready(&self) -> Result<(), AcquireError> {
        match self {
            AnyLimiter::Hybrid(l) => l.ready().await,
            AnyLimiter::Pure(l) => l.ready().await,
        }
    }
}

/// A keyed limiter in either mode, keyed by `K`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum AnyKeyedLimiter<K, S: LeaseStore> {
    /// Leasing batches per key.
    Hybrid(KeyedHybridLimiter<K, S>),
    /// One store call per decision.
    Pure(KeyedRedisLimiter<S>),
}

impl<K, S> AnyKeyedLimiter<K, S>
where
    K: Hash + Eq + Clone + Display + Send + Sync + 'static,
    S: LeaseStore + Clone,
{
    /// The limiter's name.
    pub fn name(&self) -> &str {
        match self {
            AnyKeyedLimiter::Hybrid(l) => l.name(),
            AnyKeyedLimiter::Pure(l) => l.name(),
        }
    }

    /// The name of `key`'s bucket in the store.
    pub fn bucket_name<Q: Display + ?Sized>(&self, key: &Q) -> String {
        match self {
            AnyKeyedLimiter::Hybrid(l) => l.bucket_name(key),
            AnyKeyedLimiter::Pure(l) => l.bucket_name(key),
        }
    }

    /// Shuts a hybrid keyed limiter down, giving every key's tokens back; nothing to do for
    /// a pure one.
    pub async fn shutdown(&self) {
        if let AnyKeyedLimiter::Hybrid(l) = self {
            l.shutdown().await;
        }
    }
}

impl<K, S> KeyedLimiter<K> for AnyKeyedLimiter<K, S>
where
    K: Hash + Eq + Clone + Display + Send + Sync + 'static,
    S: LeaseStore + Clone,
{
    // Every call is the limiter's own `KeyedLimiter` answer, as for `AnyLimiter`.

    fn quota(&self) -> Quota {
        match self {
            AnyKeyedLimiter::Hybrid(l) => KeyedLimiter::<K>::quota(l),
            AnyKeyedLimiter::Pure(l) => KeyedLimiter::<K>::quota(l),
        }
    }

    async fn acquire_now<Q>(&self, key: &Q, n: u64) -> Result<Decision, AcquireError>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        match self {
            AnyKeyedLimiter::Hybrid(l) => KeyedLimiter::<K>::acquire_now(l, key, n).await,
            AnyKeyedLimiter::Pure(l) => KeyedLimiter::<K>::acquire_now(l, key, n).await,
        }
    }

    async fn acquire<Q>(&self, key: &Q, n: u64) -> Result<(), AcquireError>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        match self {
            AnyKeyedLimiter::Hybrid(l) => KeyedLimiter::<K>::acquire(l, key, n).await,
            AnyKeyedLimiter::Pure(l) => KeyedLimiter::<K>::acquire(l, key, n).await,
        }
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
        match self {
            AnyKeyedLimiter::Hybrid(l) => {
                KeyedLimiter::<K>::try_acquire_for(l, key, n, timeout).await
            }
            AnyKeyedLimiter::Pure(l) => {
                KeyedLimiter::<K>::try_acquire_for(l, key, n, timeout).await
            }
        }
    }

    fn local_answer<Q>(&self, key: &Q, n: u64) -> Option<Result<LocalAnswer, AcquireError>>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        match self {
            AnyKeyedLimiter::Hybrid(l) => KeyedLimiter::<K>::local_answer(l, key, n),
            AnyKeyedLimiter::Pure(l) => KeyedLimiter::<K>::local_answer(l, key, n),
        }
    }

    async fn try_acquire_or_lease<Q>(
        &self,
        key: &Q,
        n: u64,
        lease_wait: Duration,
    ) -> Result<Decision, AcquireError>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        match self {
            AnyKeyedLimiter::Hybrid(l) => {
                KeyedLimiter::<K>::try_acquire_or_lease(l, key, n, lease_wait).await
            }
            AnyKeyedLimiter::Pure(l) => {
                KeyedLimiter::<K>::try_acquire_or_lease(l, key, n, lease_wait).await
            }
        }
    }
}

/// The limiters of a file, running, by name; keyed ones keyed by `K`.
#[derive(Debug, Clone)]
pub struct Limiters<S: LeaseStore + ConcurrencyStore, K = String> {
    pub(super) limiters: BTreeMap<String, AnyLimiter<S>>,
    pub(super) keyed: BTreeMap<String, AnyKeyedLimiter<K, S>>,
    pub(super) concurrency: BTreeMap<String, ConcurrencyLimiter<S>>,
}

impl<S: LeaseStore + ConcurrencyStore, K> Limiters<S, K> {
    /// The limiter called `name` (from `[limiters.<name>]`).
    pub fn get(&self, name: &str) -> Option<&AnyLimiter<S>> {
        self.limiters.get(name)
    }

    /// Every `[limiters.*]` limiter with its name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &AnyLimiter<S>)> {
        self.limiters.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The keyed limiter called `name` (from `[keyed.<name>]`).
    pub fn keyed(&self, name: &str) -> Option<&AnyKeyedLimiter<K, S>> {
        self.keyed.get(name)
    }

    /// Every keyed limiter with its name.
    pub fn iter_keyed(&self) -> impl Iterator<Item = (&str, &AnyKeyedLimiter<K, S>)> {
        self.keyed.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The concurrency limiter called `name` (from `[concurrency.<name>]`).
    pub fn concurrency(&self, name: &str) -> Option<&ConcurrencyLimiter<S>> {
        self.concurrency.get(name)
    }

    /// Every concurrency limiter with its name.
    pub fn iter_concurrency(&self) -> impl Iterator<Item = (&str, &ConcurrencyLimiter<S>)> {
        self.concurrency.iter().map(|(k, v)| (k.as_str(), v))
    }
}

impl<S, K> Limiters<S, K>
where
    S: LeaseStore + ConcurrencyStore + Clone,
    K: Hash + Eq + Clone + Display + Send + Sync + 'static,
{
    /// Waits until every `[limiters.*]` limiter is ready (see [`AnyLimiter::ready`]): a warm
    /// start, before serving traffic. Their first leases (asked for when they were built, or
    /// here for those with `prefetch = false`) and the pure ones' calls are all in flight
    /// together, so this waits about one round trip, not one per limiter. (Keyed limiters
    /// lease per key, when a key is first seen.)
    ///
    /// # Errors
    /// The first error: [`AcquireError::Store`] if a first lease or a pure limiter's call
    /// failed (the limiters keep running under their failure policies).
    pub async fn ready(&self) -> Result<(), AcquireError> {
        // Polled together, every limiter's first lease or call is in flight at once.
        let each = futures_util::future::join_all(self.limiters.values().map(AnyLimiter::ready));
        each.await.into_iter().collect()
    }

    /// Shuts every limiter down: hybrid ones give unused tokens back, concurrency limiters
    /// give back what no permit holds.
    pub async fn shutdown(&self) {
        for limiter in self.limiters.values() {
            if let AnyLimiter::Hybrid(l) = limiter {
                l.shutdown().await;
            }
        }
        for limiter in self.keyed.values() {
            limiter.shutdown().await;
        }
        for limiter in self.concurrency.values() {
            limiter.shutdown().await;
        }
    }
}
