//! Hybrid mode: lease batches of tokens from the shared bucket, spend them locally.
//!
//! # Implementation details
//!
//! Each `HybridLimiter` owns a [`LocalBucket`] (one atomic word) and one background task on the
//! tokio runtime it was built on. The caller's path, [`HybridLimiter::try_acquire`], is a CAS
//! loop on the local word and nothing else: no lock, no allocation, no I/O, no clock read.
//!
//! When a caller leaves fewer tokens than the policy's low-water mark, or is denied, it raises
//! the single-flight [`RefillSignal`]; the task wakes, asks the [`LeasePolicy`] how much to lease,
//! makes the one store call, and adds what it was granted. With the low-water mark above one
//! round trip's worth of demand, the next batch arrives before the bucket runs dry.
//!
//! When the shared bucket cannot serve `min` tokens, the store says how long until it can. The
//! task then caches that answer: it sleeps until then (plus jitter, so a fleet does not retry in
//! step), while callers are denied locally with that `retry_after`. A node therefore makes at
//! most one store call per `retry_after` however hard it is pushed. Store errors back off
//! exponentially (10 ms to 1 s, jittered) in the same way.
//!
//! Waiting callers ([`acquire`](HybridLimiter::acquire)) park on a `Notify` that the task
//! signals after every store call; they never call the store themselves.
//!
//! When the last clone of a limiter is dropped (or [`shutdown`](HybridLimiter::shutdown) is
//! called), the task takes the local tokens and gives them back to the store.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::{Error, StoreError};
use crate::key;
use crate::limiter::{check_request, Decision, Limiter};
use crate::local::LocalBucket;
use crate::policy::{FixedLease, LeaseAsk, LeaseContext, LeasePolicy};
use crate::quota::Quota;
use crate::refill::RefillSignal;
use crate::store::{LeaseRequest, LeaseStore, RedisStore, ReleaseRequest};

/// Shortest wait after an over-limit reply.
const MIN_RETRY: Duration = Duration::from_micros(100);
/// First back-off after a store error.
const ERROR_BACKOFF_MIN: Duration = Duration::from_millis(10);
/// Longest back-off after store errors.
const ERROR_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Retry hint before any round trip was measured.
const DEFAULT_RTT: Duration = Duration::from_millis(1);

/// A limiter that leases batches of tokens from a shared store and spends them locally.
///
/// Clones share one local bucket and one background task.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), ratelease::Error> {
/// use ratelease::{HybridLimiter, MemoryStore, Quota};
///
/// let limiter = HybridLimiter::builder("api", Quota::per_second(1_000)?, MemoryStore::new())
///     .lease_size(100)
///     .build()?;
/// limiter.acquire(1).await?; // waits for the first lease
/// assert!(limiter.try_acquire(1)?.is_allowed()); // nanoseconds: a local atomic
/// # Ok(()) }
/// ```
pub struct HybridLimiter<S: LeaseStore = RedisStore> {
    handle: Arc<Handle<S>>,
}

impl<S: LeaseStore> Clone for HybridLimiter<S> {
    fn clone(&self) -> Self {
        HybridLimiter {
            handle: self.handle.clone(),
        }
    }
}

impl<S: LeaseStore> std::fmt::Debug for HybridLimiter<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.handle.shared;
        f.debug_struct("HybridLimiter")
            .field("name", &s.name)
            .field("quota", &s.quota)
            .field("local_tokens", &s.local.available())
            .finish_non_exhaustive()
    }
}

/// Counters of one limiter's store traffic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HybridStats {
    /// Lease calls made to the store (including failed ones).
    pub leases: u64,
    /// Tokens granted by those calls.
    pub tokens_leased: u64,
    /// Lease calls answered "not enough tokens".
    pub over_limit: u64,
    /// Release calls made to the store.
    pub releases: u64,
    /// Tokens given back.
    pub tokens_released: u64,
    /// Store calls that failed.
    pub store_errors: u64,
    /// Tokens in the local bucket now.
    pub local_tokens: u64,
}

impl HybridStats {
    /// Every call made to the store.
    pub fn store_calls(&self) -> u64 {
        self.leases + self.releases
    }
}

/// Configures a [`HybridLimiter`].
#[must_use]
pub struct HybridBuilder<S> {
    name: String,
    quota: Quota,
    store: S,
    policy: Box<dyn LeasePolicy>,
    prefetch: bool,
    seed: Option<u64>,
    runtime: Option<tokio::runtime::Handle>,
}

impl<S: LeaseStore> HybridBuilder<S> {
    /// Sizes leases with `policy` (default: [`FixedLease::for_quota`]).
    pub fn policy(mut self, policy: impl LeasePolicy) -> Self {
        self.policy = Box::new(policy);
        self
    }

    /// Shorthand for `.policy(FixedLease::new(size))`.
    pub fn lease_size(self, size: u64) -> Self {
        self.policy(FixedLease::new(size))
    }

    /// Whether to lease the first batch at once, before the first call (default true), so a
    /// new process does not deny its first requests.
    pub fn prefetch(mut self, prefetch: bool) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// Seeds the jitter of retries (default: random). Set it for reproducible simulations.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Runs the background task on `runtime` (default: the runtime `build` is called on).
    pub fn runtime(mut self, runtime: tokio::runtime::Handle) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// Builds the limiter and starts its background task.
    ///
    /// # Errors
    /// [`Error::Config`] for a bad name, [`Error::NoRuntime`] outside a tokio runtime.
    pub fn build(self) -> Result<HybridLimiter<S>, Error> {
        key::validate_name(&self.name)?;
        let runtime = match self.runtime {
            Some(rt) => rt,
            None => tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?,
        };
        let low_water = self.policy.low_water(&self.quota).min(self.quota.burst());
        let shared = Arc::new(Shared {
            local: LocalBucket::default(),
            signal: RefillSignal::new(self.prefetch),
            low_water,
            quota: self.quota,
            name: self.name,
            store: self.store,
            policy: self.policy,
            origin: Instant::now(),
            blocked_until_ns: AtomicU64::new(0),
            rtt_ns: AtomicU64::new(0),
            finished: Notify::new(),
            error: Mutex::new(None),
            error_seq: AtomicU64::new(0),
            counters: Counters::default(),
        });
        let seed = self.seed.unwrap_or_else(|| fastrand::u64(..));
        let task = runtime.spawn(refill_loop(shared.clone(), seed));
        Ok(HybridLimiter {
            handle: Arc::new(Handle {
                shared,
                task: Mutex::new(Some(task)),
            }),
        })
    }
}

/// What the user holds; dropping the last one closes the limiter.
struct Handle<S: LeaseStore> {
    shared: Arc<Shared<S>>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl<S: LeaseStore> Drop for Handle<S> {
    fn drop(&mut self) {
        self.shared.signal.close();
    }
}

/// State shared by the callers and the background task.
struct Shared<S> {
    local: LocalBucket,
    signal: RefillSignal,
    low_water: u64,
    quota: Quota,
    name: String,
    store: S,
    policy: Box<dyn LeasePolicy>,
    /// Origin of the nanosecond timestamps below.
    origin: Instant,
    /// Over-limit (or error back-off) deadline, ns since `origin`; callers are denied until then.
    blocked_until_ns: AtomicU64,
    /// Smoothed store round trip, ns.
    rtt_ns: AtomicU64,
    /// Signalled after every store call.
    finished: Notify,
    error: Mutex<Option<StoreError>>,
    error_seq: AtomicU64,
    counters: Counters,
}

#[derive(Default)]
struct Counters {
    leases: AtomicU64,
    tokens_leased: AtomicU64,
    over_limit: AtomicU64,
    releases: AtomicU64,
    tokens_released: AtomicU64,
    store_errors: AtomicU64,
}

impl<S: LeaseStore> HybridLimiter<S> {
    /// A builder for limiter `name` with `quota`, leasing from `store`.
    pub fn builder(name: impl Into<String>, quota: Quota, store: S) -> HybridBuilder<S> {
        HybridBuilder {
            name: name.into(),
            quota,
            store,
            policy: Box::new(FixedLease::for_quota()),
            prefetch: true,
            seed: None,
            runtime: None,
        }
    }

    /// A limiter with default settings, on the current tokio runtime.
    ///
    /// # Errors
    /// As [`HybridBuilder::build`].
    pub fn new(name: impl Into<String>, quota: Quota, store: S) -> Result<Self, Error> {
        Self::builder(name, quota, store).build()
    }

    /// Takes `n` tokens from the local bucket, or says when to retry. Never waits.
    ///
    /// This is the hot path: one CAS loop on one atomic word. Falling below the low-water mark,
    /// or being denied, wakes the background task to lease more (at most one lease in flight).
    ///
    /// # Errors
    /// [`Error::ZeroTokens`], [`Error::ExceedsBurst`]; [`Error::Closed`] after shutdown.
    #[inline]
    pub fn try_acquire(&self, n: u64) -> Result<Decision, Error> {
        let s = &*self.handle.shared;
        check_request(&s.quota, n)?;
        match s.local.try_take(n) {
            Ok(left) => {
                if left < s.low_water {
                    s.signal.request();
                }
                Ok(Decision::Allowed)
            }
            Err(_) => s.denied(n),
        }
    }

    /// Waits until `n` tokens are taken. The background task does the store calls; this
    /// future only waits for their results.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire), plus [`Error::Store`] if a lease fails while
    /// waiting.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future takes no tokens.
    pub async fn acquire(&self, n: u64) -> Result<(), Error> {
        let s = &*self.handle.shared;
        check_request(&s.quota, n)?;
        // Acquire: pairs with the Release increment in `fail`, so the error slot is visible.
        let errors_seen = s.error_seq.load(Ordering::Acquire);
        loop {
            let finished = s.finished.notified();
            let mut finished = std::pin::pin!(finished);
            finished.as_mut().enable();
            if let Decision::Allowed = self.try_acquire(n)? {
                return Ok(());
            }
            finished.await;
            if s.error_seq.load(Ordering::Acquire) != errors_seen {
                if let Some(e) = s.error.lock().clone() {
                    return Err(Error::Store(e));
                }
            }
        }
    }

    /// Waits at most `timeout` for `n` tokens. Returns `Denied` at once if the store already
    /// said no tokens will come within the timeout.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire_for(&self, n: u64, timeout: Duration) -> Result<Decision, Error> {
        let denied = match self.try_acquire(n)? {
            Decision::Allowed => return Ok(Decision::Allowed),
            denied => denied,
        };
        let blocked = self.handle.shared.blocked_for();
        if blocked > timeout {
            return Ok(Decision::Denied {
                retry_after: blocked,
            });
        }
        match tokio::time::timeout(timeout, self.acquire(n)).await {
            Ok(result) => result.map(|()| Decision::Allowed),
            Err(_) => Ok(match self.handle.shared.retry_hint() {
                Duration::ZERO => denied,
                retry_after => Decision::Denied { retry_after },
            }),
        }
    }

    /// Tokens in the local bucket now.
    pub fn available(&self) -> u64 {
        self.handle.shared.local.available()
    }

    /// Counters of this limiter's store traffic.
    pub fn stats(&self) -> HybridStats {
        let c = &self.handle.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        HybridStats {
            leases: get(&c.leases),
            tokens_leased: get(&c.tokens_leased),
            over_limit: get(&c.over_limit),
            releases: get(&c.releases),
            tokens_released: get(&c.tokens_released),
            store_errors: get(&c.store_errors),
            local_tokens: self.available(),
        }
    }

    /// The limiter's name.
    pub fn name(&self) -> &str {
        &self.handle.shared.name
    }

    /// The limiter's quota.
    pub fn quota(&self) -> Quota {
        self.handle.shared.quota
    }

    /// The low-water mark in effect.
    pub fn low_water(&self) -> u64 {
        self.handle.shared.low_water
    }

    /// Stops the background task and gives the local tokens back to the store. Later calls
    /// return [`Error::Closed`]. Dropping the last clone does the same without waiting.
    pub async fn shutdown(&self) {
        self.handle.shared.signal.close();
        let task = self.handle.task.lock().take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    /// Stops the background task at once **without** giving tokens back, as a crashed process
    /// would: the tokens it held are lost to the fleet until the shared bucket refills. For
    /// failure tests and simulations; use [`shutdown`](Self::shutdown) otherwise.
    pub fn abort(&self) {
        self.handle.shared.signal.close();
        if let Some(task) = self.handle.task.lock().take() {
            task.abort();
        }
        self.handle.shared.local.take_all();
    }
}

impl<S: LeaseStore> Shared<S> {
    /// The slow half of `try_acquire`: record the demand and say when to retry.
    #[cold]
    fn denied(&self, n: u64) -> Result<Decision, Error> {
        if self.signal.is_closed() {
            return Err(Error::Closed);
        }
        self.signal.denied(n);
        Ok(Decision::Denied {
            retry_after: self.retry_hint(),
        })
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Time left of an over-limit or back-off period (zero if none).
    fn blocked_for(&self) -> Duration {
        // Relaxed: a hint; nothing else is published through it.
        let until = self.blocked_until_ns.load(Ordering::Relaxed);
        Duration::from_nanos(until.saturating_sub(self.now_ns()))
    }

    /// When a denied caller should try again: the end of a known block, else one round trip.
    fn retry_hint(&self) -> Duration {
        match self.blocked_for() {
            Duration::ZERO => match self.rtt_ns.load(Ordering::Relaxed) {
                0 => DEFAULT_RTT,
                ns => Duration::from_nanos(ns),
            },
            blocked => blocked,
        }
    }

    fn observe_rtt(&self, rtt: Duration) {
        let ns = u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX).max(1);
        let old = self.rtt_ns.load(Ordering::Relaxed);
        let new = if old == 0 { ns } else { (old * 7 + ns) / 8 };
        self.rtt_ns.store(new, Ordering::Relaxed);
    }

    fn block_until(&self, deadline: Instant) {
        let ns = u64::try_from((deadline - self.origin).as_nanos()).unwrap_or(u64::MAX);
        self.blocked_until_ns.store(ns, Ordering::Relaxed);
    }

    fn fail(&self, error: StoreError) {
        *self.error.lock() = Some(error);
        // Release: publishes the error slot to waiters that see the new sequence number.
        self.error_seq.fetch_add(1, Ordering::Release);
        self.counters.store_errors.fetch_add(1, Ordering::Relaxed);
    }

    fn clamp(&self, ask: LeaseAsk) -> LeaseAsk {
        let min = ask.min.clamp(1, self.quota.burst());
        LeaseAsk {
            want: ask.want.max(min),
            min,
        }
    }
}

/// The background task: one lease at a time, for as long as the limiter lives.
async fn refill_loop<S: LeaseStore>(s: Arc<Shared<S>>, seed: u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut backoff = ERROR_BACKOFF_MIN;
    while s.signal.wait().await {
        let ctx = LeaseContext {
            quota: s.quota,
            local: s.local.available(),
            denied: s.signal.take_denied(),
        };
        let ask = s.clamp(s.policy.ask(&ctx));
        let started = Instant::now();
        let request = LeaseRequest::new(ask.want, ask.min);
        let result = s.store.lease(&s.name, &s.quota, &request).await;
        s.observe_rtt(started.elapsed());
        s.counters.leases.fetch_add(1, Ordering::Relaxed);
        let pause = match result {
            Ok(reply) if reply.granted > 0 => {
                s.local.add(reply.granted);
                s.counters
                    .tokens_leased
                    .fetch_add(reply.granted, Ordering::Relaxed);
                s.blocked_until_ns.store(0, Ordering::Relaxed);
                backoff = ERROR_BACKOFF_MIN;
                None
            }
            Ok(reply) => {
                s.counters.over_limit.fetch_add(1, Ordering::Relaxed);
                let wait = reply.retry_after.max(MIN_RETRY);
                Some(Instant::now() + wait + jitter(&mut rng, wait / 8))
            }
            Err(error) => {
                tracing::warn!(limiter = %s.name, %error, "lease failed; backing off");
                s.fail(error);
                let wait = backoff / 2 + jitter(&mut rng, backoff / 2);
                backoff = (backoff * 2).min(ERROR_BACKOFF_MAX);
                Some(Instant::now() + wait)
            }
        };
        if let Some(deadline) = pause {
            s.block_until(deadline);
        }
        s.finished.notify_waiters();
        let after = s.local.available();
        if let Some(deadline) = pause {
            if s.signal
                .unless_closed(tokio::time::sleep_until(deadline))
                .await
                .is_none()
            {
                break;
            }
        }
        s.signal.done();
        // Demand that arrived while the flag was still up (see `refill`): a denial, or
        // consumption below the mark since the grant.
        let now = s.local.available();
        if s.signal.was_denied() || (now < s.low_water && now < after) {
            s.signal.request();
        }
    }
    give_back(&s).await;
}

/// Returns the local tokens to the store when the limiter closes.
async fn give_back<S: LeaseStore>(s: &Shared<S>) {
    let tokens = s.local.take_all();
    if tokens == 0 {
        return;
    }
    s.counters.releases.fetch_add(1, Ordering::Relaxed);
    let request = ReleaseRequest::new(tokens);
    match s.store.release(&s.name, &s.quota, &request).await {
        Ok(_) => {
            s.counters
                .tokens_released
                .fetch_add(tokens, Ordering::Relaxed);
        }
        Err(error) => {
            s.counters.store_errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(limiter = %s.name, %error, tokens, "could not return tokens on shutdown");
        }
    }
    s.finished.notify_waiters();
}

/// A uniformly random duration in `[0, max]`.
fn jitter(rng: &mut fastrand::Rng, max: Duration) -> Duration {
    let ns = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rng.u64(0..=ns))
}

impl<S: LeaseStore> Limiter for HybridLimiter<S> {
    fn quota(&self) -> Quota {
        HybridLimiter::quota(self)
    }

    async fn try_acquire(&self, n: u64) -> Result<Decision, Error> {
        HybridLimiter::try_acquire(self, n)
    }

    async fn acquire(&self, n: u64) -> Result<(), Error> {
        HybridLimiter::acquire(self, n).await
    }

    async fn try_acquire_for(&self, n: u64, timeout: Duration) -> Result<Decision, Error> {
        HybridLimiter::try_acquire_for(self, n, timeout).await
    }
}
