//! Hybrid mode: lease batches of tokens from the shared bucket, spend them locally.
//!
//! # Implementation details
//!
//! Each `HybridLimiter` owns a [`LocalBucket`] (per-thread slots of atomic words, see
//! [`crate::local`]) and one background task on the
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
//! Central configuration ([`crate::config`]): every lease reply carries the quota the store ran
//! under. The task owns the effective quota: when a reply brings a new one it re-derives the
//! lease terms (horizon, ttl), the policy's sizing and low-water mark, and the local fallback
//! rate, and publishes the new burst in one atomic word that the hot path checks requests
//! against. An unconfigured name under [`Unconfigured::Unlimited`] or
//! [`Unconfigured::Error`] is one more atomic flag, read on the (cold) denial path; the task
//! looks for a config again every [`Unconfigured::RECHECK`].
//!
//! When the last clone of a limiter is dropped (or [`shutdown`](HybridLimiter::shutdown) is
//! called), the task takes the local tokens and gives them back to the store.
//!
//! Under [`Algorithm::FixedWindow`] leases are anonymous batches sized by the policy's `ask`
//! (lease terms are the token bucket's), and local tokens belong to the window they were
//! leased in (the reply's `at`): the task drops them at the window's end, which it puts at
//! `sent + reset_after` less 0.1 % and 2 ms (`sent` precedes the store's clock reading; the
//! margin covers clock rates that differ by up to 1 000 ppm and a timer that fires late) —
//! also while a lease call is in flight or the task pauses after a denial — and a grant from
//! another window first drops the tokens of the old one. Idle and shutdown return unused
//! tokens to their own window. So a fleet never spends more than `rate` in one window,
//! provided the task's timer fires within that margin.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::algorithm::Algorithm;
use crate::bucket::QuotaSource;
use crate::config::{Budget, Unconfigured};
use crate::demand::DemandEstimator;
use crate::error::{Error, StoreError};
use crate::failure::{Circuit, FailurePolicy, LocalRate};
use crate::key;
use crate::limiter::{check_tokens, Decision, Limiter, LocalAnswer, RECENTLY_REFUSED};
use crate::local::LocalBucket;
use crate::policy::{AdaptiveLease, FixedLease, LeaseAsk, LeaseContext, LeasePolicy, LeaseTerms};
use crate::quota::{Quota, MAX_VALUE};
use crate::refill::{RefillSignal, Wake};
use crate::store::{
    LeaseReply, LeaseRequest, LeaseStore, NodeLease, NodeRelease, RedisStore, ReleaseRequest,
};
use crate::telemetry::{self, HybridMetrics, Published};

/// Shortest wait after an over-limit reply.
pub(crate) const MIN_RETRY: Duration = Duration::from_micros(100);
/// First back-off after a store error.
pub(crate) const ERROR_BACKOFF_MIN: Duration = Duration::from_millis(10);
/// Longest back-off after store errors.
/// Longest back-off after store errors (so leasing resumes within this long of recovery).
pub(crate) const ERROR_BACKOFF_MAX: Duration = Duration::from_millis(500);
/// Retry hint before any round trip was measured.
pub(crate) const DEFAULT_RTT: Duration = Duration::from_millis(1);
/// Most jitter after a fixed window's "come back when it ends": a window's start is the
/// same moment for every node, and a late node would waste the new window.
const WINDOW_JITTER: Duration = Duration::from_millis(5);
/// Fixed window: local tokens are dropped this long (plus 0.1 %) before their window ends,
/// so a timer that fires a little late (tokio's resolution is 1 ms) still drops them in time.
const WINDOW_MARGIN: Duration = Duration::from_millis(2);

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
            .field("quota", &*s.effective.lock())
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
    /// Tokens dropped unspent when their lease expired.
    pub tokens_expired: u64,
    /// Tokens denied to callers.
    pub tokens_denied: u64,
    /// Tokens admitted by the failure policy while the store was failing.
    pub tokens_admitted_degraded: u64,
    /// Whether the circuit is open: the last lease failed and the failure policy is in force.
    pub circuit_open: bool,
    /// Measured demand, millitokens per second (admitted and denied).
    pub demand_mtps: u64,
    /// Fair share last reported by the store, millitokens per second (0 if none).
    pub share_mtps: u64,
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
    node_id: Option<u64>,
    failure: FailurePolicy,
    runtime: Option<tokio::runtime::Handle>,
    budget: Budget,
    unconfigured: Unconfigured,
    algorithm: Algorithm,
}

impl<S: LeaseStore> HybridBuilder<S> {
    /// How to count (default [`Algorithm::TokenBucket`]). Batches are leased under the token
    /// bucket and the fixed window; the others are an [`Error::Config`] at build.
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// Sizes leases with `policy` (default: [`AdaptiveLease`]).
    pub fn policy(mut self, policy: impl LeasePolicy) -> Self {
        self.policy = Box::new(policy);
        self
    }

    /// Shorthand for `.policy(FixedLease::new(size))`.
    pub fn lease_size(self, size: u64) -> Self {
        self.policy(FixedLease::new(size))
    }

    /// Whether to lease the first batch at once, when the limiter is built (default true). The
    /// first calls still find the local bucket empty until that lease is answered, a round
    /// trip later: await [`HybridLimiter::ready`] before serving traffic for a warm start.
    pub fn prefetch(mut self, prefetch: bool) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// Seeds the jitter of retries and the node id (default: random). Set it for reproducible
    /// simulations.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// What to answer when local tokens are spent and the store is failing (default:
    /// [`FailurePolicy::LocalFallback`] with one expected node). See [`crate::failure`].
    pub fn on_store_failure(mut self, policy: FailurePolicy) -> Self {
        self.failure = policy;
        self
    }

    /// This node's id in the store's lease records (default: random). Ids must be unique among
    /// the instances sharing a limiter name; the id of a restarted process may be reused.
    pub fn node_id(mut self, id: u64) -> Self {
        self.node_id = Some(id);
        self
    }

    /// Whose budget to spend (default [`Budget::Overall`]). [`Budget::PerClient`] gives this
    /// instance a bucket of its own, keyed by its [`node_id`](Self::node_id).
    pub fn budget(mut self, budget: Budget) -> Self {
        self.budget = budget;
        self
    }

    /// What to do if the name has no quota stored centrally (default: use the builder's).
    pub fn if_unconfigured(mut self, what: Unconfigured) -> Self {
        self.unconfigured = what;
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
    /// [`Error::Config`] for a bad name, or an algorithm it cannot lease (see
    /// [`algorithm`](Self::algorithm)) or combine with the builder's settings (as
    /// [`RedisLimiterBuilder::build`](crate::RedisLimiterBuilder::build));
    /// [`Error::NoRuntime`] outside a tokio runtime.
    pub fn build(self) -> Result<HybridLimiter<S>, Error> {
        key::validate_name(&self.name)?;
        self.algorithm
            .check_hybrid(&self.quota, self.unconfigured)?;
        let runtime = match self.runtime {
            Some(rt) => rt,
            None => tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?,
        };
        let seed = self.seed.unwrap_or_else(|| fastrand::u64(..));
        let mut rng = fastrand::Rng::with_seed(seed);
        let node_id = self.node_id.unwrap_or_else(|| rng.u64(..));
        let low_water = self
            .policy
            .ask(&LeaseContext {
                quota: self.quota,
                local: 0,
                denied: 0,
                demand: 0.0,
                share: None,
                rtt: DEFAULT_RTT,
            })
            .low_water
            .min(self.quota.burst());
        let terms = self.policy.terms(&self.quota);
        let metrics = HybridMetrics::new(&self.name, self.failure.name());
        let shared = Arc::new(Shared {
            local: LocalBucket::default(),
            signal: RefillSignal::new(self.prefetch),
            low_water: AtomicU64::new(low_water),
            quota: self.quota,
            burst: AtomicU64::new(self.quota.burst()),
            effective: Mutex::new(self.quota),
            client: (self.budget == Budget::PerClient).then_some(node_id),
            unconfigured: self.unconfigured,
            algorithm: self.algorithm,
            absent: AtomicBool::new(false),
            name: self.name,
            store: self.store,
            policy: self.policy,
            node_id,
            denied_total: AtomicU64::new(0),
            failure: self.failure,
            fallback: match self.failure {
                FailurePolicy::LocalFallback { expected_nodes } => {
                    Some(LocalRate::share_of(&self.quota, expected_nodes))
                }
                _ => None,
            },
            circuit: Circuit::default(),
            origin: Instant::now(),
            blocked_until_ns: AtomicU64::new(0),
            rtt_ns: AtomicU64::new(0),
            finished: Notify::new(),
            answered: AtomicBool::new(false),
            counters: Counters::default(),
            metrics,
        });
        let task = runtime.spawn(telemetry::publishing(
            refill_loop(shared.clone(), rng, self.quota, terms),
            publisher(shared.clone()),
        ));
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
    /// Refill below this many local tokens; set by the policy after each lease.
    low_water: AtomicU64,
    /// The builder's quota: sent with every store call (the quota of an unconfigured name).
    quota: Quota,
    /// The burst of the effective quota, checked on the hot path; written by the task.
    burst: AtomicU64,
    /// The effective quota, for [`HybridLimiter::quota`]; written by the task (never locked
    /// on the hot path).
    effective: Mutex<Quota>,
    /// The client budget (`Some(node_id)` for [`Budget::PerClient`]).
    client: Option<u64>,
    unconfigured: Unconfigured,
    algorithm: Algorithm,
    /// The store said the name is unconfigured (and `unconfigured` is not `UseQuota`).
    absent: AtomicBool,
    name: String,
    store: S,
    policy: Box<dyn LeasePolicy>,
    node_id: u64,
    /// Tokens denied to callers, ever (demand that was not served).
    denied_total: AtomicU64,
    failure: FailurePolicy,
    /// The local bucket of [`FailurePolicy::LocalFallback`].
    fallback: Option<LocalRate>,
    /// Open from a failed lease until a lease succeeds.
    circuit: Circuit,
    /// Origin of the nanosecond timestamps below.
    origin: Instant,
    /// Over-limit (or error back-off) deadline, ns since `origin`; callers are denied until then.
    blocked_until_ns: AtomicU64,
    /// Smoothed store round trip, ns.
    rtt_ns: AtomicU64,
    /// Signalled after every store call, and when the task ends.
    finished: Notify,
    /// Whether a lease call has been answered (or failed): see [`HybridLimiter::ready`].
    answered: AtomicBool,
    counters: Counters,
    metrics: HybridMetrics,
}

#[derive(Default)]
struct Counters {
    leases: AtomicU64,
    tokens_leased: AtomicU64,
    over_limit: AtomicU64,
    releases: AtomicU64,
    tokens_released: AtomicU64,
    store_errors: AtomicU64,
    tokens_expired: AtomicU64,
    admitted_degraded: AtomicU64,
    demand_mtps: AtomicU64,
    share_mtps: AtomicU64,
    /// Tokens taken from the local bucket for a release still in flight.
    returning: AtomicU64,
}

impl<S: LeaseStore> HybridLimiter<S> {
    /// A builder for limiter `name` with `quota`, leasing from `store`.
    pub fn builder(name: impl Into<String>, quota: Quota, store: S) -> HybridBuilder<S> {
        HybridBuilder {
            name: name.into(),
            quota,
            store,
            policy: Box::new(AdaptiveLease::default()),
            prefetch: true,
            seed: None,
            node_id: None,
            failure: FailurePolicy::default(),
            runtime: None,
            budget: Budget::Overall,
            unconfigured: Unconfigured::UseQuota,
            algorithm: Algorithm::TokenBucket,
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
    /// This is the hot path: one CAS loop on this thread's slot of the local bucket. Falling below the low-water mark,
    /// or being denied, wakes the background task to lease more (at most one lease in flight).
    ///
    /// # Errors
    /// [`Error::ZeroTokens`], [`Error::ExceedsBurst`]; [`Error::Closed`] after shutdown.
    #[inline]
    pub fn try_acquire(&self, n: u64) -> Result<Decision, Error> {
        let s = &*self.handle.shared;
        // Relaxed: a plain value the task replaces after a central change; a caller that reads
        // the old one a moment late answers as just before the change.
        check_tokens(n, s.burst.load(Ordering::Relaxed))?;
        match s.local.try_take(n) {
            Ok(left) => {
                // Relaxed: a threshold, not a publication; a stale value only moves the refill
                // by one call.
                if left < s.low_water.load(Ordering::Relaxed) {
                    s.signal.request();
                }
                Ok(Decision::Allowed)
            }
            Err(_) => s.denied(n),
        }
    }

    /// Waits until the limiter has been answered by the store once: its first lease is in the
    /// local bucket (or the store said the fleet's bucket is empty, and denials are honest),
    /// so the first `try_acquire` after it does not deny for want of a lease still in flight.
    /// Call it once after building, before serving traffic (a warm start). Later calls return
    /// at once. With [`prefetch(false)`](HybridBuilder::prefetch) it starts the first lease.
    /// (A limiter that later stays idle gives its tokens back, see
    /// [`AdaptiveLease::idle_after`]: the first request after such a spell waits for a lease
    /// again.)
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), ratelease::Error> {
    /// use ratelease::{HybridLimiter, MemoryStore, Quota};
    ///
    /// let limiter = HybridLimiter::new("api", Quota::per_second(1_000)?, MemoryStore::new())?;
    /// limiter.ready().await?;
    /// assert!(limiter.try_acquire(1)?.is_allowed());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Store`] if the first lease failed, or, called while the store is failing, if
    /// the lease it asks for fails too (the limiter keeps running: its failure policy answers
    /// until the store does, so a service may also start anyway and call `ready` again
    /// later); [`Error::Closed`] if the limiter was shut down.
    pub async fn ready(&self) -> Result<(), Error> {
        let s = &*self.handle.shared;
        // Failures before this call are old news: only a lease answered meanwhile decides.
        let seen = s.circuit.failures();
        let mut probed = false;
        loop {
            let finished = s.finished.notified();
            let mut finished = std::pin::pin!(finished);
            finished.as_mut().enable();
            if s.signal.is_closed() {
                return Err(Error::Closed);
            }
            // Acquire: pairs with the task's Release store, after it added the granted tokens.
            let answered = s.answered.load(Ordering::Acquire);
            if answered && !s.circuit.is_open() {
                return Ok(());
            }
            if answered {
                // A lease failed while this call waited (the first one, typically): report it.
                if let Some(error) = s.circuit.error_since(seen) {
                    return Err(Error::Store(error));
                }
                if !probed {
                    // The store was failing before this call: ask for a lease now, as a denied
                    // caller would (the request outlasts the task's back-off), and report its
                    // outcome.
                    s.signal.denied(1);
                    probed = true;
                }
            } else {
                // Without prefetch nothing was asked yet (a no-op if a lease is under way).
                s.signal.request();
            }
            finished.await;
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
        check_tokens(n, s.burst.load(Ordering::Relaxed))?;
        let errors_seen = s.circuit.failures();
        loop {
            let finished = s.finished.notified();
            let mut finished = std::pin::pin!(finished);
            finished.as_mut().enable();
            let retry_after = match self.try_acquire(n)? {
                Decision::Allowed => return Ok(()),
                Decision::Denied { retry_after } => retry_after,
            };
            // Woken by the next store call's outcome, or when the answer said to retry.
            let _ = tokio::time::timeout(retry_after.max(MIN_RETRY), finished).await;
            if s.failure == FailurePolicy::FailClosed {
                if let Some(e) = s.circuit.error_since(errors_seen) {
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

    /// [`try_acquire`](Self::try_acquire) that tells a refusal by the store (or the failure
    /// policy), [`LocalAnswer::Denied`], from an empty local bucket with no word from the store
    /// yet, [`LocalAnswer::NeedsLease`] (the first lease, the first after an idle spell gave
    /// the tokens back, a refill late while demand grows). A limiter the store refused within
    /// the last second is at its limit: a miss then is `Denied`. Never waits; starts a lease
    /// as `try_acquire` does.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    pub fn try_acquire_local(&self, n: u64) -> Result<LocalAnswer, Error> {
        let retry_after = match self.try_acquire(n)? {
            Decision::Allowed => return Ok(LocalAnswer::Allowed),
            Decision::Denied { retry_after } => retry_after,
        };
        let s = &*self.handle.shared;
        // Relaxed: a hint, as in `blocked_for`.
        let refused_until = s.blocked_until_ns.load(Ordering::Relaxed);
        let window = u64::try_from(RECENTLY_REFUSED.as_nanos()).unwrap_or(u64::MAX);
        let refused_lately =
            refused_until != 0 && refused_until.saturating_add(window) > s.now_ns();
        Ok(if !refused_lately && !s.circuit.is_open() {
            LocalAnswer::NeedsLease { retry_after }
        } else {
            LocalAnswer::Denied { retry_after }
        })
    }

    /// Takes `n` tokens, waiting at most `lease_wait` while the local bucket is empty and the
    /// store has not said no (a lease in flight), but never for tokens the store said are not
    /// there: that is `Denied` at once. What a server that sheds load wants.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire_or_lease(
        &self,
        n: u64,
        lease_wait: Duration,
    ) -> Result<Decision, Error> {
        let s = &*self.handle.shared;
        let deadline = crate::deadline::from_now(lease_wait);
        let errors_seen = s.circuit.failures();
        loop {
            let finished = s.finished.notified();
            let mut finished = std::pin::pin!(finished);
            finished.as_mut().enable();
            let retry_after = match self.try_acquire_local(n)? {
                LocalAnswer::Allowed => return Ok(Decision::Allowed),
                LocalAnswer::Denied { retry_after } => {
                    if s.failure == FailurePolicy::FailClosed {
                        if let Some(e) = s.circuit.error_since(errors_seen) {
                            return Err(Error::Store(e));
                        }
                    }
                    return Ok(Decision::Denied { retry_after });
                }
                LocalAnswer::NeedsLease { retry_after } => retry_after,
            };
            // Woken by the outcome of the lease the check asked for.
            if tokio::time::timeout_at(deadline, finished).await.is_err() {
                return Ok(Decision::Denied { retry_after });
            }
        }
    }

    /// Tokens in the local bucket now.
    pub fn available(&self) -> u64 {
        self.handle.shared.local.available()
    }

    /// Counters of this limiter's store traffic.
    pub fn stats(&self) -> HybridStats {
        self.handle.shared.stats()
    }

    /// The limiter's name.
    pub fn name(&self) -> &str {
        &self.handle.shared.name
    }

    /// The quota in effect: the one the store last ran under (a central config, or the
    /// builder's).
    pub fn quota(&self) -> Quota {
        *self.handle.shared.effective.lock()
    }

    /// The low-water mark in effect.
    pub fn low_water(&self) -> u64 {
        self.handle.shared.low_water.load(Ordering::Relaxed)
    }

    /// How this limiter counts.
    pub fn algorithm(&self) -> Algorithm {
        self.handle.shared.algorithm
    }

    /// This node's id in the store's lease records.
    pub fn node_id(&self) -> u64 {
        self.handle.shared.node_id
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

impl<S> Shared<S> {
    fn stats(&self) -> HybridStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        HybridStats {
            leases: get(&c.leases),
            tokens_leased: get(&c.tokens_leased),
            over_limit: get(&c.over_limit),
            releases: get(&c.releases),
            tokens_released: get(&c.tokens_released),
            store_errors: get(&c.store_errors),
            tokens_expired: get(&c.tokens_expired),
            tokens_denied: get(&self.denied_total),
            tokens_admitted_degraded: get(&c.admitted_degraded),
            circuit_open: self.circuit.is_open(),
            demand_mtps: get(&c.demand_mtps),
            share_mtps: get(&c.share_mtps),
            local_tokens: self.local.available(),
        }
    }

    /// Tokens spent from leases while `held` are still held: everything leased, less what
    /// was returned (or is being returned) or dropped. Callers only ever take from the local
    /// bucket, so this needs no counter of its own on the hot path.
    fn spent(&self, held: u64) -> u64 {
        let c = &self.counters;
        let got = c.tokens_leased.load(Ordering::Relaxed);
        let gone = c.tokens_released.load(Ordering::Relaxed)
            + c.tokens_expired.load(Ordering::Relaxed)
            + c.returning.load(Ordering::Relaxed);
        got.saturating_sub(gone).saturating_sub(held)
    }
}

/// Publishes a limiter's metrics (see [`crate::telemetry`]); says whether it is active.
fn publisher<S: LeaseStore>(s: Arc<Shared<S>>) -> impl FnMut() -> bool {
    let mut last = Published::default();
    move || {
        let stats = s.stats();
        let admitted = s.spent(s.local.settled()) + stats.tokens_admitted_degraded;
        s.metrics.publish(&mut last, &stats, admitted);
        stats.local_tokens > 0 || stats.circuit_open || !s.blocked_for().is_zero()
    }
}

impl<S: LeaseStore> Shared<S> {
    /// The slow half of `try_acquire`: record the demand and say when to retry.
    #[cold]
    fn denied(&self, n: u64) -> Result<Decision, Error> {
        if self.signal.is_closed() {
            return Err(Error::Closed);
        }
        // Relaxed: a state flag; a caller that reads it a little late answers as before.
        if self.absent.load(Ordering::Relaxed) {
            // Keep the background task looking for a config.
            self.signal.request();
            return match self.unconfigured {
                Unconfigured::Error => Err(Error::Unconfigured(self.name.clone())),
                _ => Ok(Decision::Allowed),
            };
        }
        // The failure policy's answer while the circuit is open; `None` for "deny as usual".
        let mut policy_wait = None;
        if self.circuit.is_open() {
            let admit = match (self.failure, &self.fallback) {
                (FailurePolicy::FailOpen, _) => Ok(()),
                (FailurePolicy::LocalFallback { .. }, Some(local)) => local.try_take(n),
                _ => Err(Duration::ZERO),
            };
            match admit {
                Ok(()) => {
                    // Keep the background task probing the store.
                    self.signal.request();
                    self.counters
                        .admitted_degraded
                        .fetch_add(n, Ordering::Relaxed);
                    return Ok(Decision::Allowed);
                }
                Err(wait) => policy_wait = Some(wait).filter(|w| !w.is_zero()),
            }
        }
        // Relaxed: a statistic read by the background task to estimate demand.
        self.denied_total.fetch_add(n, Ordering::Relaxed);
        // Also raises the refill flag, so the task keeps leasing (or probing).
        self.signal.denied(n);
        Ok(Decision::Denied {
            retry_after: policy_wait.unwrap_or_else(|| self.retry_hint()),
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
            Duration::ZERO => self.rtt(),
            blocked => blocked,
        }
    }

    fn rtt(&self) -> Duration {
        match self.rtt_ns.load(Ordering::Relaxed) {
            0 => DEFAULT_RTT,
            ns => Duration::from_nanos(ns),
        }
    }

    /// A lease call took `rtt`.
    fn observe_rtt(&self, rtt: Duration) {
        self.metrics.lease_returned(rtt);
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
        self.circuit.fail(&self.name, self.failure, error);
        self.counters.store_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// A lease call succeeded: close the circuit.
    fn recovered(&self) {
        self.circuit.recovered(&self.name);
    }

    /// `1 ≤ min ≤ want`, and `min` within both the builder's burst (the store checks
    /// arguments against it) and the effective one.
    fn clamp(&self, ask: LeaseAsk, quota: &Quota) -> LeaseAsk {
        let min = ask.min.clamp(1, self.quota.burst().min(quota.burst()));
        LeaseAsk {
            want: ask.want.max(min),
            min,
            ..ask
        }
    }
}

/// The background task: one lease at a time, for as long as the limiter lives.
async fn refill_loop<S: LeaseStore>(
    s: Arc<Shared<S>>,
    rng: fastrand::Rng,
    quota: Quota,
    terms: Option<LeaseTerms>,
) {
    let mut task = Task {
        quota,
        terms,
        rng,
        backoff: ERROR_BACKOFF_MIN,
        demand: DemandEstimator::new(DEMAND_TAU, Instant::now()),
        share: None,
        release_seq: 0,
        expires: None,
        window: None,
        review_at: None,
        granted_at: None,
    };
    loop {
        match s.signal.wait_until(task.next_timer(&s)).await {
            Wake::Closed => break,
            Wake::Requested | Wake::Timer => {}
        }
        let now = Instant::now();
        task.observe(&s, now);
        task.expire(&s, now).await;
        task.trim(&s, now).await;
        if !s.signal.is_requested() {
            task.give_back_if_idle(&s, now).await;
            continue;
        }
        if spurious(&s) {
            continue;
        }
        if !task.lease(&s).await {
            break;
        }
    }
    task.give_back(&s, true).await;
    // Waiters in `ready` or `acquire` see the limiter closed.
    s.finished.notify_waiters();
}

/// Whether a refill request needs no lease: nobody was denied and the local bucket still holds
/// the low-water mark. Callers compare the mark with a hint that can read low (tokens parked in
/// another slot of the local bucket are not in it, see [`crate::local`]); leasing on such a
/// request asks for nothing (the policy's target is already held), and every token spent
/// would then cost a store call. The flag is lowered and the bucket looked at again (the
/// store-buffer pattern of [`crate::refill`]), so a caller that crosses the mark or is denied
/// meanwhile is not lost.
fn spurious<S>(s: &Shared<S>) -> bool {
    // Relaxed: a state flag; see `Shared::denied`.
    if s.circuit.is_open() || s.absent.load(Ordering::Relaxed) {
        return false;
    }
    let low_water = s.low_water.load(Ordering::Relaxed);
    let enough = || !s.signal.was_denied() && low_water > 0 && s.local.available() >= low_water;
    if !enough() {
        return false;
    }
    s.signal.done();
    if enough() {
        return true;
    }
    s.signal.request();
    false
}

/// Time constant of the demand estimate.
const DEMAND_TAU: Duration = Duration::from_millis(300);

/// The background task's own state.
struct Task {
    /// The effective quota (the task owns it; see the module docs).
    quota: Quota,
    /// The policy's terms for `quota`.
    terms: Option<LeaseTerms>,
    rng: fastrand::Rng,
    backoff: Duration,
    demand: DemandEstimator,
    /// Fair share the store last reported, tokens per second.
    share: Option<f64>,
    release_seq: u64,
    /// When the local tokens must be dropped (a little before the store forgets the lease,
    /// or before their window ends).
    expires: Option<Instant>,
    /// Fixed window: where the local tokens were counted (their lease reply's `at`).
    window: Option<Duration>,
    /// When to look again at what this node holds against its measured demand (see `trim`).
    review_at: Option<Instant>,
    /// When the last lease granted tokens.
    granted_at: Option<Instant>,
}

impl Task {
    /// Tokens spent so far (see [`Shared::spent`]).
    fn consumed<S>(s: &Shared<S>) -> u64 {
        s.spent(s.local.available())
    }

    fn observe<S>(&mut self, s: &Shared<S>, now: Instant) {
        let demanded = Self::consumed(s) + s.denied_total.load(Ordering::Relaxed);
        let rate = self.demand.observe(now, demanded);
        s.counters
            .demand_mtps
            .store((rate * 1_000.0) as u64, Ordering::Relaxed);
    }

    /// Give-back time for an idle node: `idle_after` without demand, and never sooner than four
    /// expected gaps between its requests; a lease just granted (a warm start before the first
    /// request, say) is kept at least `idle_after` too.
    fn idle_at(&self, terms: &LeaseTerms) -> Instant {
        let rate = self.demand.rate();
        let gaps = if rate > 0.0 {
            Duration::from_secs_f64((4.0 / rate).min(60.0))
        } else {
            Duration::ZERO
        };
        let since = self.granted_at.map_or(self.demand.last_change(), |g| {
            g.max(self.demand.last_change())
        });
        since + terms.idle_after.max(gaps)
    }

    fn next_timer<S>(&self, s: &Shared<S>) -> Option<Instant> {
        if s.local.available() == 0 {
            return None;
        }
        let idle = self.terms.as_ref().map(|t| self.idle_at(t));
        [self.expires, idle, self.review_at]
            .into_iter()
            .flatten()
            .min()
    }

    /// Gives the local tokens back once their lease has (nearly) expired: the store forgets
    /// them at expiry, so spending them later could exceed the fleet's bound. They are taken
    /// from the local bucket before the call, so none is spent meanwhile; if the call fails
    /// they count as expired.
    async fn expire<S: LeaseStore>(&mut self, s: &Shared<S>, now: Instant) {
        if self.expires.is_some_and(|at| now >= at) {
            if s.algorithm == Algorithm::FixedWindow {
                self.drop_window(s);
            } else {
                self.give_back(s, true).await;
            }
        }
    }

    /// The terms leases are made on: the policy's, under the token bucket only.
    fn node_terms<S>(&self, s: &Shared<S>) -> Option<LeaseTerms> {
        self.terms.filter(|_| s.algorithm == Algorithm::TokenBucket)
    }

    /// Fixed window: the local tokens' window has ended (or is about to): they are gone,
    /// with no store call (a release to an ended window gives nothing back).
    fn drop_window<S>(&mut self, s: &Shared<S>) {
        let tokens = s.local.take_all();
        s.counters
            .tokens_expired
            .fetch_add(tokens, Ordering::Relaxed);
        self.expires = None;
        self.window = None;
    }

    /// Sleeps until `deadline`. Under the fixed window, callers keep spending the local tokens
    /// meanwhile, so they are dropped on the way if their window ends first.
    async fn pause<S>(&mut self, s: &Shared<S>, deadline: Instant) {
        let windowed = s.algorithm == Algorithm::FixedWindow;
        if let Some(end) = self.expires.filter(|&end| windowed && end < deadline) {
            tokio::time::sleep_until(end).await;
            self.drop_window(s);
        }
        tokio::time::sleep_until(deadline).await;
    }

    /// Adds granted tokens to the local bucket. Under the fixed window they belong to the
    /// reply's window: the tokens of another window are dropped first, and these are dropped
    /// at once if their window (conservatively, `sent + reset_after` less the margin) has
    /// ended.
    fn keep<S>(&mut self, s: &Shared<S>, reply: &LeaseReply, sent: Instant) {
        if s.algorithm == Algorithm::FixedWindow {
            if self.window != reply.at {
                self.drop_window(s);
            }
            let margin = reply.reset_after / 1_000 + WINDOW_MARGIN;
            let end = sent + reply.reset_after.saturating_sub(margin);
            if end <= Instant::now() {
                s.counters
                    .tokens_expired
                    .fetch_add(reply.granted, Ordering::Relaxed);
                return;
            }
            self.window = reply.at;
            self.expires = Some(end);
        }
        s.local.add(reply.granted);
    }

    async fn give_back_if_idle<S: LeaseStore>(&mut self, s: &Shared<S>, now: Instant) {
        if let Some(terms) = self.terms {
            if now >= self.idle_at(&terms) && s.local.available() > 0 {
                self.give_back(s, true).await;
            }
        }
    }

    /// Returns the local tokens to the store; `leaving` also removes this node's record (and
    /// its demand) from the store.
    async fn give_back<S: LeaseStore>(&mut self, s: &Shared<S>, leaving: bool) {
        let tokens = s.local.take_all();
        let terms = self.node_terms(s);
        if tokens == 0 && (terms.is_none() || self.expires.is_none()) {
            return;
        }
        let window = self.window.take();
        self.expires = None;
        self.share = None;
        self.release(s, tokens, leaving, window).await;
    }

    /// Gives back what this node holds beyond what its policy says is worth holding (see
    /// [`LeasePolicy::most_worth_holding`]), down to one lease's worth: a first lease sized
    /// before any demand was measured, or a share that shrank while the node stayed busy,
    /// goes back to the fleet within one review instead of waiting for the lease to expire.
    async fn trim<S: LeaseStore>(&mut self, s: &Shared<S>, now: Instant) {
        if self.review_at.is_none_or(|at| now < at) {
            return;
        }
        self.review_at = None;
        if self.node_terms(s).is_none() {
            return;
        }
        let ctx = self.context(s, 0);
        let Some(most) = s.policy.most_worth_holding(&ctx) else {
            return;
        };
        if ctx.local <= most {
            return;
        }
        let excess = ctx.local - most / 2;
        if s.local.try_take(excess).is_ok() {
            self.release(s, excess, false, None).await;
        }
    }

    /// Gives `tokens`, already taken from the local bucket, back to the store (`window`: the
    /// fixed window they were leased in).
    async fn release<S: LeaseStore>(
        &mut self,
        s: &Shared<S>,
        tokens: u64,
        leaving: bool,
        window: Option<Duration>,
    ) {
        let terms = self.node_terms(s);
        let mut request = ReleaseRequest::new(tokens)
            .for_client(s.client)
            .algorithm(s.algorithm)
            .leased_at(window);
        if terms.is_some() {
            self.release_seq += 1;
            request = request.by(NodeRelease {
                id: s.node_id,
                seq: self.release_seq,
                leaving,
            });
        }
        s.counters.releases.fetch_add(1, Ordering::Relaxed);
        // Relaxed: read by the metrics publisher, which runs on this task (between its polls).
        s.counters.returning.store(tokens, Ordering::Relaxed);
        let result = s.store.release(&s.name, &s.quota, &request).await;
        s.counters.returning.store(0, Ordering::Relaxed);
        match result {
            Ok(_) => {
                s.counters
                    .tokens_released
                    .fetch_add(tokens, Ordering::Relaxed);
            }
            Err(error) => {
                // The tokens are lost to the fleet until the lease expires; never re-admitted.
                s.counters.store_errors.fetch_add(1, Ordering::Relaxed);
                s.counters
                    .tokens_expired
                    .fetch_add(tokens, Ordering::Relaxed);
                tracing::warn!(limiter = %s.name, %error, tokens, "could not return tokens");
            }
        }
        s.finished.notify_waiters();
    }

    fn context<S: LeaseStore>(&self, s: &Shared<S>, denied: u64) -> LeaseContext {
        LeaseContext {
            quota: self.quota,
            local: s.local.available(),
            denied,
            demand: self.demand.rate(),
            share: self.share,
            rtt: s.rtt(),
        }
    }

    /// Takes on the quota a reply ran under: terms, burst, fallback rate (the sizing follows
    /// from `self.quota` in the next context).
    fn adopt<S: LeaseStore>(&mut self, s: &Shared<S>, quota: Quota, source: QuotaSource) {
        // Relaxed: a state flag read on the denial path; see `denied`.
        s.absent
            .store(source == QuotaSource::Absent, Ordering::Relaxed);
        if source == QuotaSource::Absent || quota == self.quota {
            return;
        }
        tracing::info!(limiter = %s.name, ?quota, ?source, "quota changed");
        self.quota = quota;
        self.terms = s.policy.terms(&quota);
        s.burst.store(quota.burst(), Ordering::Relaxed);
        *s.effective.lock() = quota;
        if let (FailurePolicy::LocalFallback { expected_nodes }, Some(local)) =
            (s.failure, &s.fallback)
        {
            local.set_share_of(&quota, expected_nodes);
        }
    }

    /// One lease, and the pause after an empty or failed one. Returns false if the limiter
    /// closed meanwhile.
    async fn lease<S: LeaseStore>(&mut self, s: &Shared<S>) -> bool {
        let ctx = self.context(s, s.signal.take_denied());
        let ask = s.clamp(s.policy.ask(&ctx), &self.quota);
        let terms = self.node_terms(s);
        let mut request = LeaseRequest::new(ask.want, ask.min)
            .for_client(s.client)
            .configured_only(!s.unconfigured.falls_back())
            .algorithm(s.algorithm);
        if let Some(terms) = terms {
            request = request.by(NodeLease {
                id: s.node_id,
                held: ctx.local,
                demand_mtps: reported_demand(self.demand.rate(), ask.min, terms.horizon),
                horizon: terms.horizon,
                ttl: terms.ttl,
            });
        }
        let sent = Instant::now();
        let call = async {
            let reply = s.store.lease(&s.name, &s.quota, &request).await;
            reply.and_then(|r| r.within(&request))
        };
        let result = match self
            .expires
            .filter(|_| s.algorithm == Algorithm::FixedWindow)
        {
            // The local tokens' window may end while the call is in flight.
            Some(deadline) => {
                let mut call = std::pin::pin!(call);
                tokio::select! {
                    result = &mut call => result,
                    () = tokio::time::sleep_until(deadline) => {
                        self.drop_window(s);
                        call.await
                    }
                }
            }
            None => call.await,
        };
        s.observe_rtt(sent.elapsed());
        s.counters.leases.fetch_add(1, Ordering::Relaxed);
        if let Ok(reply) = &result {
            self.adopt(s, reply.quota, reply.source);
        }
        if let (Ok(reply), Some(terms)) = (&result, terms) {
            // The store extended this node's lease from when it ran the script, which was after
            // `sent`: expiring locally at 90 % of the ttl from `sent` stays ahead of it.
            self.expires = Some(sent + terms.ttl.mul_f64(0.9));
            if reply.granted > 0 {
                self.review_at = Some(Instant::now() + review_after(terms.horizon));
                self.granted_at = Some(Instant::now());
            }
            self.share = Some(reply.share_mtps as f64 / 1_000.0);
            s.counters
                .share_mtps
                .store(reply.share_mtps, Ordering::Relaxed);
        }
        let pause = match result {
            Ok(reply) if reply.source == QuotaSource::Absent => {
                s.recovered();
                Some(Instant::now() + Unconfigured::RECHECK)
            }
            Ok(reply) if reply.granted > 0 => {
                s.recovered();
                s.metrics.granted(reply.granted);
                self.keep(s, &reply, sent);
                s.counters
                    .tokens_leased
                    .fetch_add(reply.granted, Ordering::Relaxed);
                // Not blocked from now on; a block ended early reads as ending now (a refusal
                // stays recent for `try_acquire_local`).
                s.blocked_until_ns.fetch_min(s.now_ns(), Ordering::Relaxed);
                self.backoff = ERROR_BACKOFF_MIN;
                // On terms, the store says when this node's next batch will be ready (its
                // share refills its credit); asking sooner would only come back empty.
                (terms.is_some() && !reply.retry_after.is_zero())
                    .then(|| Instant::now() + reply.retry_after)
            }
            Ok(reply) => {
                s.recovered();
                s.counters.over_limit.fetch_add(1, Ordering::Relaxed);
                let wait = reply.retry_after.max(MIN_RETRY);
                let spread = match s.algorithm {
                    Algorithm::FixedWindow => (wait / 8).min(WINDOW_JITTER),
                    _ => wait / 8,
                };
                Some(Instant::now() + wait + jitter(&mut self.rng, spread))
            }
            Err(error) => {
                tracing::debug!(limiter = %s.name, %error, "lease failed; backing off");
                s.fail(error);
                let wait = self.backoff / 2 + jitter(&mut self.rng, self.backoff / 2);
                self.backoff = (self.backoff * 2).min(ERROR_BACKOFF_MAX);
                Some(Instant::now() + wait)
            }
        };
        let next = s.policy.ask(&self.context(s, 0));
        s.low_water
            .store(next.low_water.min(self.quota.burst()), Ordering::Relaxed);
        if let Some(deadline) = pause {
            s.block_until(deadline);
        }
        // Release: a caller of `ready` that sees it also sees the tokens added above.
        s.answered.store(true, Ordering::Release);
        s.finished.notify_waiters();
        let after = s.local.available();
        if let Some(deadline) = pause {
            let slept = s.signal.unless_closed(self.pause(s, deadline)).await;
            if slept.is_none() {
                return false;
            }
        }
        s.signal.done();
        // Demand that arrived while the flag was still up (see `refill`): a denial, or
        // consumption below the mark since the grant.
        let now = s.local.available();
        if s.signal.was_denied() || (now < s.low_water.load(Ordering::Relaxed) && now < after) {
            s.signal.request();
        }
        true
    }
}

/// How long after a grant a node looks at what it holds against its demand: a quarter of a
/// horizon, between 10 ms (a first demand sample needs a few) and 100 ms.
fn review_after(horizon: Duration) -> Duration {
    (horizon / 4).clamp(Duration::from_millis(10), Duration::from_millis(100))
}

/// The demand a node reports, millitokens per second: its estimate, but at least the request
/// in hand per horizon, so a node that has measured nothing yet (a new or quiet node) still
/// gets a share.
fn reported_demand(estimate: f64, min: u64, horizon: Duration) -> u64 {
    let floor = min as f64 / horizon.as_secs_f64();
    (estimate.max(floor) * 1_000.0).min(MAX_VALUE as f64) as u64
}

/// A uniformly random duration in `[0, max]`.
pub(crate) fn jitter(rng: &mut fastrand::Rng, max: Duration) -> Duration {
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

    fn try_acquire_now(&self, n: u64) -> Option<Result<Decision, Error>> {
        Some(HybridLimiter::try_acquire(self, n))
    }

    fn try_acquire_local(&self, n: u64) -> Option<Result<LocalAnswer, Error>> {
        Some(HybridLimiter::try_acquire_local(self, n))
    }

    async fn try_acquire_or_lease(&self, n: u64, lease_wait: Duration) -> Result<Decision, Error> {
        HybridLimiter::try_acquire_or_lease(self, n, lease_wait).await
    }
}
