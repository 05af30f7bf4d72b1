//! Hybrid mode: lease batches of tokens from the shared bucket, spend them locally.
//!
//! # Implementation details
//!
//! Each `HybridLimiter` owns a [`LocalBucket`] (per-thread slots of atomic words, see
//! [`crate::lease::local`]) and one background task on the
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
//! exponentially (10 ms to 500 ms, jittered) in the same way.
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
//!
//! # Where things are
//!
//! This file is the front (what callers call); `builder.rs` checks settings and starts the
//! task; `shared.rs` holds what callers and the task share, and the callers' slow path;
//! `task.rs` is the background task; `stats.rs` the counters users read.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::Algorithm;
#[cfg(doc)]
use crate::config::Unconfigured;
use crate::error::{AcquireError, BuildError};
#[cfg(doc)]
use crate::failure::FailurePolicy;
#[cfg(doc)]
use crate::lease::policy::AdaptiveLease;
use crate::limiter::{
    bounded, check_tokens, Decision, Limiter, LocalAnswer, Patience, RECENTLY_REFUSED,
};
use crate::quota::Quota;
use crate::retry::MIN_RETRY;
use crate::store::{LeaseStore, RedisStore};
use crate::time;

/// Most jitter after a fixed window's "come back when it ends": a window's start is the
/// same moment for every node, and a late node would waste the new window.
const WINDOW_JITTER: Duration = Duration::from_millis(5);
/// Fixed window: local tokens are dropped this long (plus 0.1 %) before their window ends,
/// so a timer that fires a little late (tokio's resolution is 1 ms) still drops them in time.
const WINDOW_MARGIN: Duration = Duration::from_millis(2);

mod builder;
mod metrics;
mod shared;
mod stats;
mod task;

pub use builder::HybridBuilder;
use shared::Handle;
pub use stats::HybridStats;

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

impl<S: LeaseStore> HybridLimiter<S> {
    /// A builder for limiter `name` with `quota`, leasing from `store`.
    pub fn builder(name: impl Into<String>, quota: Quota, store: S) -> HybridBuilder<S> {
        HybridBuilder::new(name.into(), quota, store)
    }

    /// A limiter with default settings, on the current tokio runtime.
    ///
    /// # Errors
    /// As [`HybridBuilder::build`].
    pub fn new(name: impl Into<String>, quota: Quota, store: S) -> Result<Self, BuildError> {
        Self::builder(name, quota, store).build()
    }

    /// Takes `n` tokens from the local bucket, or says when to retry. Never waits.
    ///
    /// This is the hot path: one CAS loop on this thread's slot of the local bucket. Falling below the low-water mark,
    /// or being denied, wakes the background task to lease more (at most one lease in flight).
    ///
    /// # Errors
    /// [`AcquireError::ZeroTokens`], [`AcquireError::ExceedsBurst`]; [`AcquireError::Closed`]
    /// after shutdown; [`AcquireError::Unconfigured`] for a name with no stored quota under
    /// [`Unconfigured::Error`].
    #[inline]
    pub fn try_acquire(&self, n: u64) -> Result<Decision, AcquireError> {
        if self.take_local(n)? {
            Ok(Decision::Allowed)
        } else {
            self.handle
                .shared
                .missed(n, &self.handle.shared.counters.sync_misses)
        }
    }

    /// The hot path of every check: `n` tokens from the local bucket (`false`: too few), the
    /// task woken below the low-water mark.
    #[inline]
    fn take_local(&self, n: u64) -> Result<bool, AcquireError> {
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
                Ok(true)
            }
            Err(_) => Ok(false),
        }
    }

    /// One decision, the call every limiter has (a [`RedisLimiter`](crate::RedisLimiter)
    /// makes a store call for it), so code moving between modes needs no edit. Answered from
    /// the local bucket as [`try_acquire`](Self::try_acquire) is, ready at once — except where
    /// leasing buys nothing (a node whose demand is below a token or so per lease horizon, see
    /// [`AdaptiveLease::per_request_below`](crate::AdaptiveLease::per_request_below)): there
    /// a miss is one decision in the store, as in pure-Redis mode, rather than a denial while
    /// the fleet has tokens. Never waits for a lease (see
    /// [`try_acquire_or_lease`](Self::try_acquire_or_lease) to wait for it).
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn acquire_now(&self, n: u64) -> Result<Decision, AcquireError> {
        if self.take_local(n)? {
            return Ok(Decision::Allowed);
        }
        let s = &*self.handle.shared;
        if s.decides_per_request() {
            s.decide(n).await
        } else {
            s.missed(n, &s.counters.async_misses)
        }
    }

    /// Waits until the limiter has been answered by the store once: its first lease is in the
    /// local bucket (or the store said the fleet's bucket is empty, and denials are honest),
    /// so the first `try_acquire` after it does not deny for want of a lease still in flight.
    /// Call it once after building, before serving traffic (a warm start). Later calls return
    /// at once. With [`prefetch(false)`](HybridBuilder::prefetch) it starts the first lease. A
    /// node that decides per request ([`LeasePolicy::per_request`](crate::LeasePolicy::per_request))
    /// before any lease leases nothing, so it returns as soon as the node decides so, without
    /// a store call: a miss of [`acquire_now`](Self::acquire_now) (or `acquire`) is then one
    /// decision in the store, while `try_acquire`, which cannot wait for one, still denies
    /// until a lease comes.
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
    /// [`AcquireError::Store`] if the first lease failed, or, called while the store is failing, if
    /// the lease it asks for fails too (the limiter keeps running: its failure policy answers
    /// until the store does, so a service may also start anyway and call `ready` again
    /// later); [`AcquireError::Closed`] if the limiter was shut down.
    pub async fn ready(&self) -> Result<(), AcquireError> {
        let s = &*self.handle.shared;
        // Failures before this call are old news: only a lease answered meanwhile decides.
        let seen = s.circuit.failures();
        let mut probed = false;
        loop {
            let finished = s.finished.notified();
            let mut finished = std::pin::pin!(finished);
            finished.as_mut().enable();
            if s.signal.is_closed() {
                return Err(AcquireError::Closed);
            }
            // A node deciding per request (a policy that says so before any lease) leases
            // nothing to wait for: each miss of `acquire_now` is one decision in the store.
            if s.decides_per_request() {
                return Ok(());
            }
            // Acquire: pairs with the task's Release store, after it added the granted tokens.
            let answered = s.answered.load(Ordering::Acquire);
            // A lease failed while this call waited (the first one, typically): report it —
            // an outage while the circuit is open, an error no failure policy answers
            // whether or not (see `Circuit::fail`).
            let failed = s
                .circuit
                .error_since(seen)
                .filter(|e| s.circuit.is_open() || !e.is_outage());
            if let (true, Some(error)) = (answered, failed) {
                return Err(AcquireError::Store(error));
            }
            if answered && !s.circuit.is_open() {
                return Ok(());
            }
            if answered {
                if !probed {
                    // The store was failing before this call: ask for a lease now, as a denied
                    // caller would (the request outlasts the task's back-off), and report its
                    // outcome.
                    s.signal.denied(1);
                    probed = true;
                }
            } else {
                self.start_first_lease();
            }
            finished.await;
        }
    }

    /// Starts the first lease unless the store has answered one (without prefetch nothing
    /// was asked yet; a no-op if a lease is under way), without waiting for it.
    fn start_first_lease(&self) {
        let s = &*self.handle.shared;
        // Relaxed: a hint that only spares a request once a lease was answered; nothing is
        // read after it (`ready` makes its own Acquire load).
        if !s.answered.load(Ordering::Relaxed) {
            s.signal.request();
        }
    }

    /// Waits until `n` tokens are taken. The background task does the store calls; this
    /// future only waits for their results — except where leasing buys nothing (see
    /// [`acquire_now`](Self::acquire_now)): there no lease comes, and each try is one decision
    /// in the store.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire), plus [`AcquireError::Store`] if a lease fails while
    /// waiting under [`FailurePolicy::FailClosed`](crate::FailurePolicy::FailClosed); the other
    /// policies answer from their fallback meanwhile (a request larger than the fallback's
    /// burst waits for the store).
    ///
    /// # Cancel safety
    /// Cancel safe in the sense that a dropped future never admits: no tokens are handed to
    /// it. A decision already sent to the store (pure mode, or where leasing buys nothing)
    /// still runs there and may take its tokens — the fleet then admits fewer, never more.
    pub async fn acquire(&self, n: u64) -> Result<(), AcquireError> {
        self.wait(n, Patience::Until(None)).await.map(|_| ())
    }

    /// Takes `n` tokens, after each denial waiting for the outcome of the task's next store
    /// call (or, unless only a lease is waited for, the `retry_after` it gave); a refusal is
    /// waited out or returned as `patience` says. Under [`FailurePolicy::FailClosed`], a store
    /// failure since the call began is its error.
    async fn wait(&self, n: u64, patience: Patience) -> Result<Decision, AcquireError> {
        let s = &*self.handle.shared;
        let errors_seen = s.circuit.failures();
        let failed = || s.circuit.error_ending_wait(errors_seen, s.failure);
        loop {
            let finished = s.finished.notified();
            let mut finished = std::pin::pin!(finished);
            finished.as_mut().enable();
            let retry_after = match self.answer(n).await? {
                LocalAnswer::Allowed => return Ok(Decision::Allowed),
                LocalAnswer::Denied { retry_after } if patience.sheds(retry_after) => {
                    return match failed() {
                        Some(e) => Err(AcquireError::Store(e)),
                        None => Ok(Decision::Denied { retry_after }),
                    };
                }
                LocalAnswer::Denied { retry_after } | LocalAnswer::NeedsLease { retry_after } => {
                    retry_after
                }
            };
            // Woken by the next store call's outcome, or when the answer said to retry; a
            // wait for a lease only by its outcome.
            if patience == Patience::LeaseOnly {
                finished.await;
            } else {
                let _ = tokio::time::timeout(retry_after.max(MIN_RETRY), finished).await;
            }
            if let Some(e) = failed() {
                return Err(AcquireError::Store(e));
            }
        }
    }

    /// Each turn of a wait: [`try_acquire_local`](Self::try_acquire_local), or where leasing
    /// buys nothing (no lease will come) a decision in the store for this miss, as
    /// [`acquire_now`](Self::acquire_now) makes.
    async fn answer(&self, n: u64) -> Result<LocalAnswer, AcquireError> {
        let s = &*self.handle.shared;
        match self.try_acquire_local(n)? {
            LocalAnswer::NeedsLease { .. } if s.decides_per_request() => {
                s.decide(n).await.map(LocalAnswer::from)
            }
            answer => Ok(answer),
        }
    }

    /// Waits at most `timeout` for `n` tokens. Returns `Denied` at once if no tokens can come
    /// within the timeout: the store said so, or the limiter backs off after a store error
    /// until after it.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire_for(
        &self,
        n: u64,
        timeout: Duration,
    ) -> Result<Decision, AcquireError> {
        let denied_for = match self.acquire_now(n).await? {
            Decision::Allowed => return Ok(Decision::Allowed),
            Decision::Denied { retry_after } => retry_after,
        };
        let blocked = self.handle.shared.blocked_for_n(n);
        if blocked > timeout {
            return Ok(Decision::Denied {
                retry_after: blocked,
            });
        }
        // A refusal known to end after the deadline is returned at once (see `Patience`).
        let deadline = time::from_now(timeout);
        let wait = self.wait(n, Patience::Until(Some(deadline)));
        bounded(deadline, wait, || match self.handle.shared.retry_hint() {
            Duration::ZERO => denied_for,
            retry_after => retry_after,
        })
        .await
    }

    /// [`try_acquire`](Self::try_acquire) that tells a refusal by the store (or the failure
    /// policy), [`LocalAnswer::Denied`], from an empty local bucket with no word from the store
    /// yet, [`LocalAnswer::NeedsLease`] (the first lease, the first after an idle spell gave
    /// the tokens back, a refill late while demand grows). A limiter the store refused within
    /// the last second (over the limit, or pacing its grants) is at its limit: a miss then is
    /// `Denied`; a back-off after store errors is no refusal. Never waits; starts a lease as
    /// `try_acquire` does — except where leasing buys nothing (see
    /// [`acquire_now`](Self::acquire_now)): there a miss is `NeedsLease` (the answer is one
    /// decision in the store, which [`try_acquire_or_lease`](Self::try_acquire_or_lease) and
    /// the waiting calls make) or, while the store's last refusal stands for a request this
    /// large, `Denied`, and no lease is started.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    pub fn try_acquire_local(&self, n: u64) -> Result<LocalAnswer, AcquireError> {
        if self.take_local(n)? {
            return Ok(LocalAnswer::Allowed);
        }
        let s = &*self.handle.shared;
        // Where leasing buys nothing, the answer is a decision in the store: no word yet,
        // unless the store's last refusal still stands.
        if s.decides_per_request() {
            let blocked = s.blocked_for_n(n);
            return Ok(if blocked.is_zero() {
                LocalAnswer::NeedsLease {
                    retry_after: s.rtt(),
                }
            } else {
                LocalAnswer::Denied {
                    retry_after: blocked,
                }
            });
        }
        let retry_after = match s.denied(n)? {
            Decision::Allowed => return Ok(LocalAnswer::Allowed),
            Decision::Denied { retry_after } => retry_after,
        };
        Ok(
            if !s.refused_within(RECENTLY_REFUSED) && !s.circuit.is_open() {
                LocalAnswer::NeedsLease { retry_after }
            } else {
                LocalAnswer::Denied { retry_after }
            },
        )
    }

    /// Takes `n` tokens, waiting at most `lease_wait` while the local bucket is empty and the
    /// store has not said no (a lease in flight), but never for tokens the store said are not
    /// there: that is `Denied` at once. What a server that sheds load wants. Where leasing
    /// buys nothing, a miss is one decision in the store, as in
    /// [`acquire_now`](Self::acquire_now).
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire_or_lease(
        &self,
        n: u64,
        lease_wait: Duration,
    ) -> Result<Decision, AcquireError> {
        if self.take_local(n)? {
            return Ok(Decision::Allowed);
        }
        if self.handle.shared.decides_per_request() {
            return self.handle.shared.decide(n).await;
        }
        let wait = self.wait(n, Patience::LeaseOnly);
        bounded(time::from_now(lease_wait), wait, || {
            self.handle.shared.rtt()
        })
        .await
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
    /// return [`AcquireError::Closed`]. Dropping the last clone does the same without waiting.
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

impl<S: LeaseStore> Limiter for HybridLimiter<S> {
    fn quota(&self) -> Quota {
        HybridLimiter::quota(self)
    }

    async fn ready(&self) -> Result<(), AcquireError> {
        HybridLimiter::ready(self).await
    }

    async fn acquire_now(&self, n: u64) -> Result<Decision, AcquireError> {
        HybridLimiter::acquire_now(self, n).await
    }

    async fn acquire(&self, n: u64) -> Result<(), AcquireError> {
        HybridLimiter::acquire(self, n).await
    }

    async fn try_acquire_for(&self, n: u64, timeout: Duration) -> Result<Decision, AcquireError> {
        HybridLimiter::try_acquire_for(self, n, timeout).await
    }

    fn local_answer(&self, n: u64) -> Option<Result<LocalAnswer, AcquireError>> {
        match HybridLimiter::try_acquire_local(self, n) {
            // Where leasing buys nothing, a miss is a decision in the store: one to await.
            Ok(LocalAnswer::NeedsLease { .. }) if self.handle.shared.decides_per_request() => None,
            answer => Some(answer),
        }
    }

    async fn try_acquire_or_lease(
        &self,
        n: u64,
        lease_wait: Duration,
    ) -> Result<Decision, AcquireError> {
        HybridLimiter::try_acquire_or_lease(self, n, lease_wait).await
    }
}
