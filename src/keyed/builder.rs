//! The builder of a [`KeyedHybridLimiter`]: settings checked, the worker started.

use std::fmt::Display;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{mpsc, Notify};

use crate::builder_knobs::{knob_setters, CommonKnobs};
use crate::error::BuildError;
use crate::failure::Circuit;
#[cfg(doc)]
use crate::failure::FailurePolicy;
use crate::lease::policy::{AdaptiveLease, LeasePolicy};
use crate::quota::Quota;
use crate::retry::RttEstimate;
use crate::store::names::{self, Scope};
use crate::store::LeaseStore;
use crate::telemetry::{self};
use crate::time::Origin;

use super::map::KeyMap;
use super::metrics::KeyedMetrics;
use super::shared::{publisher, ticks, Counters, Handle, Shared};
use super::{KeyedHybridLimiter, MAX_QUEUE, MIN_IDLE_TTL, TICK};

/// Configures a [`KeyedHybridLimiter`].
#[must_use]
pub struct KeyedHybridBuilder<K, S, H = super::DefaultKeyHasher> {
    pub(super) name: String,
    pub(super) quota: Quota,
    pub(super) store: S,
    pub(super) policy: Box<dyn LeasePolicy>,
    pub(super) max_keys: usize,
    pub(super) idle_ttl: Option<Duration>,
    pub(super) give_back_after: Option<Duration>,
    pub(super) max_in_flight: usize,
    pub(super) knobs: CommonKnobs,
    pub(super) hasher: H,
    pub(super) _key: std::marker::PhantomData<fn(K)>,
}

/// Default [`KeyedHybridBuilder::max_keys`].
pub const DEFAULT_MAX_KEYS: usize = 100_000;

/// Default [`KeyedHybridBuilder::max_in_flight`].
pub const DEFAULT_MAX_IN_FLIGHT: usize = 32;

impl<K, S> KeyedHybridBuilder<K, S> {
    /// The builder [`KeyedHybridLimiter::builder`] returns: every setting at its default.
    pub(super) fn new(name: String, quota: Quota, store: S) -> Self {
        KeyedHybridBuilder {
            name,
            quota,
            store,
            policy: Box::new(AdaptiveLease::default()),
            max_keys: DEFAULT_MAX_KEYS,
            idle_ttl: None,
            give_back_after: None,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            knobs: CommonKnobs::default(),
            hasher: super::DefaultKeyHasher::default(),
            _key: std::marker::PhantomData,
        }
    }
}

impl<K, S, H> KeyedHybridBuilder<K, S, H>
where
    K: Hash + Eq + Clone + Display + Send + Sync + 'static,
    S: LeaseStore,
    H: BuildHasher + Clone + Send + Sync + 'static,
{
    knob_setters! {
        /// It sizes the leases of keys with measured demand: its `want` and low-water mark
        /// are used, `min` is the request in hand, and its terms are ignored: keyed leases are
        /// anonymous (see the module docs).
        policy,
        /// Keys with measured demand lease batches of `size`.
        lease_size,
        /// It answers once a key's tokens are spent (default: [`FailurePolicy::LastKnownShare`],
        /// which for a keyed limiter is `rate / nodes_if_unknown` per key: its keys share one
        /// fallback rate, so no key's share is learnt).
        on_store_failure,
        /// It draws the jitter of retries.
        seed,
        /// That task is the worker of every key.
        runtime,
    }

    /// Most keys with local state (default [`DEFAULT_MAX_KEYS`], at least 1; `usize::MAX` for
    /// no cap). Memory is about this many times the per-key size (see `BENCHMARKS.md`); at
    /// the cap the least recently used keys are evicted.
    pub fn max_keys(mut self, max: usize) -> Self {
        self.max_keys = max.max(1);
        self
    }

    /// Evict a key after this long without use (default: the time the bucket takes to fill,
    /// plus 10 s; at least 200 ms). Shorter is safe — the truth is in the store — but a
    /// key's next call after eviction starts cold.
    pub fn idle_ttl(mut self, ttl: Duration) -> Self {
        self.idle_ttl = Some(ttl.max(MIN_IDLE_TTL));
        self
    }

    /// Give a key's tokens back to the store after this long without use (default: the
    /// policy's `idle_after`, else 500 ms), so tokens do not sit where nobody spends them.
    pub fn give_back_after(mut self, after: Duration) -> Self {
        self.give_back_after = Some(after);
        self
    }

    /// Most store calls in flight at once (default [`DEFAULT_MAX_IN_FLIGHT`], at least 1).
    /// A `RedisStore` pipelines them on one connection.
    pub fn max_in_flight(mut self, max: usize) -> Self {
        self.max_in_flight = max.max(1);
        self
    }

    /// Hashes keys with `hasher` (default: [`DefaultKeyHasher`](super::DefaultKeyHasher),
    /// foldhash with a random seed per limiter). Any hasher must be seeded at random where
    /// keys come from outside: an unseeded one lets crafted keys collide in one shard.
    pub fn hasher<H2>(self, hasher: H2) -> KeyedHybridBuilder<K, S, H2> {
        KeyedHybridBuilder {
            name: self.name,
            quota: self.quota,
            store: self.store,
            policy: self.policy,
            max_keys: self.max_keys,
            idle_ttl: self.idle_ttl,
            give_back_after: self.give_back_after,
            max_in_flight: self.max_in_flight,
            knobs: self.knobs,
            hasher,
            _key: std::marker::PhantomData,
        }
    }

    /// Builds the limiter and starts its worker.
    ///
    /// Another keyed limiter of this process with the same name on the same store shares
    /// every key's bucket; if it was built with a different quota, this logs a warning (see
    /// [`crate::config`], "One name, one quota").
    ///
    /// # Errors
    /// [`BuildError::Config`] for a bad name (at most [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) −
    /// [`MAX_KEY_BYTES`](crate::MAX_KEY_BYTES) − 1 bytes), [`BuildError::NoRuntime`] outside a
    /// tokio runtime.
    pub fn build(self) -> Result<KeyedHybridLimiter<K, S, H>, BuildError> {
        super::name::validate_keyed_name(&self.name)?;
        let runtime = self.knobs.runtime_or_current()?;
        let failure = self.knobs.failure_or_default();
        let terms = self.policy.terms(&self.quota);
        let registration = names::register(&self.store, &self.name, Scope::Keyed, self.quota);
        let idle_ttl = self
            .idle_ttl
            .unwrap_or_else(|| self.quota.time_for(self.quota.burst()) + Duration::from_secs(10));
        let give_back_after = self
            .give_back_after
            .or(terms.map(|t| t.idle_after))
            .unwrap_or(Duration::from_millis(500));
        // New keys wait for their first lease with the request flag set, which keeps them
        // from being evicted: a quarter of the cap at most, so there is always room to make.
        let (known, known_requests) = mpsc::channel(self.max_keys.min(MAX_QUEUE));
        let (fresh, fresh_requests) = mpsc::channel((self.max_keys / 4).clamp(1, MAX_QUEUE));
        let shared = Arc::new(Shared {
            map: KeyMap::new(self.hasher.clone(), self.max_keys),
            fallback_words: KeyMap::new(self.hasher, self.max_keys),
            live: AtomicUsize::new(0),
            tick: AtomicU32::new(0),
            origin: Origin::now(),
            max_keys: self.max_keys,
            ttl_ticks: ticks(idle_ttl),
            give_back_ticks: ticks(give_back_after),
            sweep_every: (idle_ttl.min(give_back_after) / 2).clamp(TICK, Duration::from_secs(1)),
            max_in_flight: self.max_in_flight,
            known,
            fresh,
            fallback: failure.local_rate(&self.quota),
            failure,
            circuit: Circuit::default(),
            round_trip: RttEstimate::default(),
            closed: AtomicBool::new(false),
            pressure: AtomicBool::new(false),
            wake: Notify::new(),
            counters: Counters::default(),
            metrics: KeyedMetrics::new(&self.name, failure.name()),
            name: self.name,
            quota: self.quota,
            store: self.store,
            policy: self.policy,
        });
        let seed = self.knobs.seed_or_random();
        let requests = super::worker::Requests {
            known: known_requests,
            fresh: fresh_requests,
        };
        let task = runtime.spawn(telemetry::publishing(
            super::worker::run(shared.clone(), requests, seed),
            publisher(shared.clone()),
        ));
        Ok(KeyedHybridLimiter {
            handle: Arc::new(Handle {
                shared,
                task: Mutex::new(Some(task)),
                _registration: registration,
            }),
        })
    }
}
