//! [`ConcurrencyLimiter`]: the public face of the concurrency limit, its builder and its
//! counters. The protocol is explained in the [module docs](super); the background task is in
//! `task.rs`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::holders::Op;
use super::permit::{Local, Permit};
use super::store::ConcurrencyStore;
use crate::error::{AcquireError, StoreError};
use crate::failure::{Circuit, FailurePolicy};
use crate::retry::Backoff;
use crate::store::RedisStore;
use crate::time::{self, micros};

#[cfg(doc)]
use super::builder::DEFAULT_HOLDER_TTL;
use super::builder::{ConcurrencyBuilder, ConcurrencyMode};
use super::metrics::{ConcurrencyMetrics, ConcurrencyPublished};
use super::stats::ConcurrencyStats;

/// First wait of a caller polling a full fleet (pure mode), and of a hybrid lease that found
/// the fleet full.
pub(crate) const MIN_POLL: Duration = Duration::from_millis(1);
/// Longest such wait: a slot freed elsewhere in the fleet is seen within about this long.
pub(crate) const MAX_POLL: Duration = Duration::from_millis(50);

/// A fleet-wide concurrency limit: at most `limit` permits held across every process sharing
/// a name, with the slots of a crashed process returned after a ttl.
///
/// Clones share one holder record and one background task.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), ratelease::Error> {
/// use ratelease::{ConcurrencyLimiter, MemoryStore};
///
/// // At most 8 exports running across the fleet.
/// let limiter = ConcurrencyLimiter::builder("exports", 8, MemoryStore::new()).build()?;
/// let permit = limiter.acquire(1).await?; // waits while the fleet is full
/// assert_eq!(limiter.in_use(), 1);
/// drop(permit); // the slot goes back
/// if let Some(_permit) = limiter.acquire_now(2).await? {
///     // run two jobs
/// }
/// # Ok(()) }
/// ```
pub struct ConcurrencyLimiter<S: ConcurrencyStore = RedisStore> {
    pub(super) handle: Arc<Handle<S>>,
}

impl<S: ConcurrencyStore> Clone for ConcurrencyLimiter<S> {
    fn clone(&self) -> Self {
        ConcurrencyLimiter {
            handle: self.handle.clone(),
        }
    }
}

impl<S: ConcurrencyStore> std::fmt::Debug for ConcurrencyLimiter<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.handle.shared;
        f.debug_struct("ConcurrencyLimiter")
            .field("name", &s.name)
            .field("limit", &s.limit)
            .field("mode", &s.mode())
            .field("in_use", &s.in_use())
            .finish_non_exhaustive()
    }
}

/// What the user holds; dropping the last one stops the task.
pub(super) struct Handle<S: ConcurrencyStore> {
    pub(super) shared: Arc<Shared<S>>,
    pub(super) task: Mutex<Option<JoinHandle<()>>>,
}

impl<S: ConcurrencyStore> Drop for Handle<S> {
    fn drop(&mut self) {
        self.shared.local.signal.close();
    }
}

/// State shared by callers and the background task.
pub(crate) struct Shared<S> {
    pub(crate) local: Arc<Local>,
    pub(crate) store: S,
    pub(crate) name: String,
    /// The holder id as stored (16 hex digits).
    pub(crate) holder: String,
    pub(crate) holder_id: u64,
    pub(crate) limit: u64,
    pub(crate) ttl: Duration,
    /// Hybrid: slots per lease (0 in pure mode).
    pub(crate) batch: u64,
    /// Hybrid: ask for a lease when the pool falls below this.
    pub(crate) low_water: u64,
    pub(crate) idle_return: Duration,
    pub(crate) failure: FailurePolicy,
    /// `LocalFallback`: degraded permits allowed at once.
    pub(super) fallback_share: u64,
    /// Whether the store is failing, with the last error for waiters (hybrid mode answers by
    /// the policy while it is open).
    pub(super) circuit: Circuit,
    /// Pure: slots this holder may be counted for — reserved for acquires in flight, in live
    /// permits, or dropped and not yet released. What a renewal reports, once no acquire is
    /// in flight.
    pub(crate) claimed: AtomicU64,
    /// Pure: the last acquire sequence number handed out.
    pub(crate) aseq: AtomicU64,
    /// Pure: the last release sequence number the task sent (new records start from it).
    pub(crate) rseq_sent: AtomicU64,
    /// Pure: closed while a renewal is counted and in flight; no acquire starts meanwhile.
    pub(crate) gate: AtomicBool,
    pub(crate) gate_open: Notify,
    /// Pure: acquire calls in flight; a renewal waits for them to end before counting.
    pub(crate) in_flight: AtomicU64,
    /// Pure: the last call in flight ended while the gate was closed.
    pub(crate) drained: Notify,
    /// A call's outcome is unknown (or the record was lost): the count may be wrong until the
    /// next renewal sets it.
    pub(crate) dirty: AtomicBool,
    /// Pure: an acquire was sent since the last renewal.
    pub(crate) touched: AtomicBool,
    /// Hybrid: slots leased (in the pool or in permits); written by the task only.
    pub(crate) leased: AtomicU64,
    pub(crate) counters: Counters,
    /// Metric handles, published by the background task ([`publisher`]), except the
    /// pure-mode acquire latency, recorded by the caller that made the call.
    pub(crate) metrics: ConcurrencyMetrics,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) acquires: AtomicU64,
    pub(crate) granted: AtomicU64,
    pub(crate) full: AtomicU64,
    pub(crate) releases: AtomicU64,
    pub(crate) syncs: AtomicU64,
    pub(crate) store_errors: AtomicU64,
    pub(crate) degraded: AtomicU64,
    /// Slots refused to callers that would not wait (longer): `try_acquire`,
    /// `acquire_now` and `try_acquire_for` answering `None`.
    pub(crate) denied: AtomicU64,
}

impl<S: ConcurrencyStore> ConcurrencyLimiter<S> {
    /// A builder for limit `limit` on name `name` in `store` (pure mode, ttl
    /// [`DEFAULT_HOLDER_TTL`]).
    pub fn builder(name: impl Into<String>, limit: u64, store: S) -> ConcurrencyBuilder<S> {
        ConcurrencyBuilder::new(name.into(), limit, store)
    }

    /// Takes `n` slots from the local pool, or answers `None` and asks the background task for
    /// a lease (hybrid mode). Synchronous: one CAS on one atomic word, no lock, no allocation,
    /// no I/O, never waits.
    ///
    /// A pure-mode limiter keeps no pool, so it cannot answer without the store: use
    /// [`acquire_now`](Self::acquire_now) (one store call), which works in both modes.
    ///
    /// # Errors
    /// [`AcquireError::ZeroTokens`], [`AcquireError::ExceedsLimit`], [`AcquireError::Closed`]
    /// after shutdown; [`AcquireError::Config`] in pure mode.
    #[inline]
    pub fn try_acquire(&self, n: u64) -> Result<Option<Permit>, AcquireError> {
        let s = &*self.handle.shared;
        s.check(n)?;
        if !s.local.hybrid {
            return Err(AcquireError::Config(
                "try_acquire needs hybrid mode (a local pool); use acquire_now".into(),
            ));
        }
        s.count_denial(n, s.try_local(n))
    }

    /// Takes `n` slots now if the fleet has them, without waiting for any to come back: one
    /// decision, in either mode.
    ///
    /// Pure mode: one store call. Hybrid mode: the local pool only (no I/O; the future is ready
    /// at once), as [`try_acquire`](Self::try_acquire).
    ///
    /// # Errors
    /// [`AcquireError::ZeroTokens`], [`AcquireError::ExceedsLimit`], [`AcquireError::Closed`]
    /// after shutdown, [`AcquireError::Store`] if the store fails and the policy is
    /// [`FailurePolicy::FailClosed`].
    ///
    /// # Cancel safety
    /// Cancelling a pure-mode call while its store call is in flight cannot leak a slot for
    /// long: if the call went through, the next renewal corrects the count.
    pub async fn acquire_now(&self, n: u64) -> Result<Option<Permit>, AcquireError> {
        let s = &*self.handle.shared;
        s.check(n)?;
        let attempt = match s.local.hybrid {
            true => s.try_local(n),
            false => s.try_store(n).await,
        };
        s.count_denial(n, attempt)
    }

    /// The old name of [`try_acquire`](Self::try_acquire).
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    #[deprecated(note = "use `try_acquire` (synchronous now, as on every limiter)")]
    pub fn try_acquire_now(&self, n: u64) -> Result<Option<Permit>, AcquireError> {
        self.try_acquire(n)
    }

    /// Waits until `n` slots are taken.
    ///
    /// Woken when a permit of this process is dropped (hybrid) or released (pure), or when a
    /// lease finishes; while the fleet is full it polls the store, backing off from 1 ms to
    /// 50 ms (pure), or the background task does (hybrid).
    ///
    /// # Errors
    /// As [`acquire_now`](Self::acquire_now); with [`FailurePolicy::FailClosed`] a store
    /// failure ends the wait.
    ///
    /// # Cancel safety
    /// As [`acquire_now`](Self::acquire_now).
    pub async fn acquire(&self, n: u64) -> Result<Permit, AcquireError> {
        loop {
            // Without a deadline it only returns with a permit or an error.
            if let Some(permit) = self.acquire_until(n, None).await? {
                return Ok(permit);
            }
        }
    }

    /// Waits at most `timeout` for `n` slots; `None` if they did not come in time. A store
    /// call in flight at the deadline is finished, not cancelled.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire_for(
        &self,
        n: u64,
        timeout: Duration,
    ) -> Result<Option<Permit>, AcquireError> {
        let attempt = self.acquire_until(n, Some(time::from_now(timeout))).await;
        self.handle.shared.count_denial(n, attempt)
    }

    async fn acquire_until(
        &self,
        n: u64,
        deadline: Option<Instant>,
    ) -> Result<Option<Permit>, AcquireError> {
        let s = &*self.handle.shared;
        s.check(n)?;
        let errors_seen = s.circuit.failures();
        // Pure mode polls the store with the shared back-off (jittered, 1 ms doubling to 50 ms).
        let mut poll = Backoff::new(MIN_POLL, MAX_POLL);
        let mut rng = fastrand::Rng::new();
        loop {
            let _parked = Parked::new(&s.local);
            let woken = s.local.wake.notified();
            let attempt = match s.local.hybrid {
                true => s.try_local(n),
                false => s.try_store(n).await,
            };
            if let Some(permit) = attempt? {
                return Ok(Some(permit));
            }
            if let Some(e) = s.circuit.error_ending_wait(errors_seen, s.failure) {
                return Err(AcquireError::Store(e));
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            let mut wait = match s.local.hybrid {
                true => MAX_POLL,
                false => poll.next(&mut rng),
            };
            if let Some(d) = deadline {
                wait = wait.min(d - now);
            }
            let _ = tokio::time::timeout(wait, woken).await;
        }
    }

    /// Free slots as the fleet sees them now (the limit less the slots held, after reclaiming
    /// expired holders), plus this process's pooled slots in hybrid mode. One store call.
    ///
    /// # Errors
    /// [`AcquireError::Store`] if the store fails.
    pub async fn available_permits(&self) -> Result<u64, AcquireError> {
        let s = &*self.handle.shared;
        let reply = s
            .store
            .concurrency(&s.name, &Op::Peek { holder: &s.holder })
            .await?;
        let pooled = s.local.pool.load(Ordering::Relaxed);
        Ok(s.limit.saturating_sub(reply.in_use) + pooled)
    }

    /// Slots held by this process's live permits.
    pub fn in_use(&self) -> u64 {
        self.handle.shared.in_use()
    }

    /// The limit.
    pub fn limit(&self) -> u64 {
        self.handle.shared.limit
    }

    /// The limiter's name.
    pub fn name(&self) -> &str {
        &self.handle.shared.name
    }

    /// The mode.
    pub fn mode(&self) -> ConcurrencyMode {
        self.handle.shared.mode()
    }

    /// This process's holder id in the store.
    pub fn holder_id(&self) -> u64 {
        self.handle.shared.holder_id
    }

    /// Counters of store traffic and local state.
    pub fn stats(&self) -> ConcurrencyStats {
        self.handle.shared.stats()
    }

    /// Stops the background task after giving back what no permit holds (pure: the slots of
    /// dropped permits; hybrid: the pool) and renewing what permits still hold one last time.
    /// Later calls return [`AcquireError::Closed`]. Dropping the last clone does the same without
    /// waiting.
    pub async fn shutdown(&self) {
        self.handle.shared.local.stale.store(true, Ordering::SeqCst);
        self.handle.shared.local.signal.close();
        let task = self.handle.task.lock().take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    /// Stops at once **without** telling the store anything, as a crashed process would: its
    /// slots stay taken until its record expires, one ttl after its last renewal. For failure
    /// tests; use [`shutdown`](Self::shutdown) otherwise.
    pub fn abort(&self) {
        let s = &self.handle.shared;
        s.local.stale.store(true, Ordering::SeqCst);
        s.local.signal.close();
        if let Some(task) = self.handle.task.lock().take() {
            task.abort();
        }
        s.local.pool.swap(0, Ordering::SeqCst);
        // A renewal stopped while it counted leaves the gate closed: callers parked at it
        // would wait for good. Opened, they see the limiter closed.
        s.gate.store(false, Ordering::SeqCst);
        s.gate_open.notify_waiters();
    }
}

/// Counts a caller as parked in `acquire` for as long as it lives.
struct Parked<'a>(&'a Local);

impl<'a> Parked<'a> {
    fn new(local: &'a Local) -> Self {
        // SeqCst: see `permit` (the waiter's side of the Dekker pattern with a drop).
        local.waiters.fetch_add(1, Ordering::SeqCst);
        Parked(local)
    }
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        self.0.waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Publishes a concurrency limiter's metrics from its background task (see
/// [`crate::telemetry`]); says whether the limiter is active.
pub(super) fn publisher<S: ConcurrencyStore>(s: Arc<Shared<S>>) -> impl FnMut() -> bool {
    let mut last = ConcurrencyPublished::default();
    move || {
        let stats = s.stats();
        let c = &s.counters;
        // Relaxed: statistics (see `stats`).
        let granted = match s.local.hybrid {
            true => s.local.pool.taken.load(Ordering::Relaxed),
            false => stats.granted,
        };
        let denied = c.denied.load(Ordering::Relaxed);
        let grew = s
            .metrics
            .publish(&mut last, &stats, granted + stats.degraded, denied);
        // Active while slots are held or pooled or the store fails; and once more after
        // anything changed, so a count made just after this publication (a denial is counted
        // after the attempt that woke the task) is published within one interval.
        grew || stats.in_use > 0 || stats.pooled > 0 || stats.circuit_open
    }
}

impl<S: ConcurrencyStore> Shared<S> {
    /// Counters of store traffic and local state (`Relaxed` loads: statistics).
    fn stats(&self) -> ConcurrencyStats {
        let s = self;
        let c = &s.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ConcurrencyStats {
            acquires: get(&c.acquires),
            granted: get(&c.granted),
            full: get(&c.full),
            releases: get(&c.releases),
            syncs: get(&c.syncs),
            store_errors: get(&c.store_errors),
            degraded: get(&c.degraded),
            circuit_open: s.circuit.is_open(),
            in_use: s.in_use(),
            pooled: get(&s.local.pool),
        }
    }

    /// Counts a refusal (`attempt` answered no permit) of `n` slots to a caller that would not
    /// wait (longer), and passes `attempt` on.
    #[inline]
    fn count_denial(
        &self,
        n: u64,
        attempt: Result<Option<Permit>, AcquireError>,
    ) -> Result<Option<Permit>, AcquireError> {
        if matches!(attempt, Ok(None)) {
            // Relaxed: a statistic, published by the background task. The denial path only.
            self.counters.denied.fetch_add(n, Ordering::Relaxed);
        }
        attempt
    }

    fn mode(&self) -> ConcurrencyMode {
        match self.batch {
            0 => ConcurrencyMode::Pure,
            batch => ConcurrencyMode::Hybrid { batch },
        }
    }

    fn in_use(&self) -> u64 {
        let l = &self.local;
        let granted = match l.hybrid {
            true => self
                .leased
                .load(Ordering::Relaxed)
                .saturating_sub(l.pool.load(Ordering::Relaxed)),
            false => l.in_use.load(Ordering::Relaxed),
        };
        granted + l.degraded.load(Ordering::Relaxed)
    }

    /// Rejects requests that can never succeed.
    #[inline]
    fn check(&self, n: u64) -> Result<(), AcquireError> {
        if n == 0 {
            return Err(AcquireError::ZeroTokens);
        }
        if n > self.limit {
            return Err(AcquireError::ExceedsLimit {
                requested: n,
                limit: self.limit,
            });
        }
        Ok(())
    }

    /// Hybrid: from the pool, else the denial path.
    #[inline]
    fn try_local(&self, n: u64) -> Result<Option<Permit>, AcquireError> {
        let l = &self.local;
        // Relaxed: the task raises `stale` a tenth of a ttl before the store could forget this
        // holder's slots; a caller that sees it a moment late is still inside that margin.
        if !l.stale.load(Ordering::Relaxed) {
            if let Ok(left) = l.take(n) {
                if left < self.low_water {
                    l.signal.request();
                }
                return Ok(Some(Permit::new(l.clone(), n, false)));
            }
        }
        self.denied(n)
    }

    /// Hybrid: the pool could not serve `n`.
    #[cold]
    fn denied(&self, n: u64) -> Result<Option<Permit>, AcquireError> {
        if self.local.signal.is_closed() {
            return Err(AcquireError::Closed);
        }
        // Also raises the refill flag, so the task keeps leasing (or probing a failing store).
        self.local.signal.denied(n);
        if self.circuit.is_open() {
            return self.degraded(n, None);
        }
        Ok(None)
    }

    /// The failure policy's answer while the store is failing with `error` (or, in hybrid
    /// mode, the circuit is open).
    fn degraded(&self, n: u64, error: Option<StoreError>) -> Result<Option<Permit>, AcquireError> {
        let admit = match self.failure {
            FailurePolicy::FailOpen => {
                self.local.degraded.fetch_add(n, Ordering::SeqCst);
                true
            }
            FailurePolicy::LocalFallback { .. } | FailurePolicy::LastKnownShare { .. } => self
                .local
                .degraded
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |d| {
                    (d + n <= self.fallback_share).then_some(d + n)
                })
                .is_ok(),
            _ => match error {
                Some(e) => return Err(AcquireError::Store(e)),
                None => false,
            },
        };
        if !admit {
            return Ok(None);
        }
        self.counters.degraded.fetch_add(n, Ordering::Relaxed);
        Ok(Some(Permit::new(self.local.clone(), n, true)))
    }

    /// Pure: one store call for `n` slots.
    async fn try_store(&self, n: u64) -> Result<Option<Permit>, AcquireError> {
        if self.local.signal.is_closed() {
            return Err(AcquireError::Closed);
        }
        let Some(reservation) = self.reserve(n).await else {
            return Err(AcquireError::Closed);
        };
        let op = Op::Acquire {
            holder: &self.holder,
            want: n,
            min: n,
            limit: self.limit,
            ttl_us: micros(self.ttl),
            aseq: reservation.seq,
            // Relaxed: any release number the task has used will do (see `task`).
            rseq: self.rseq_sent.load(Ordering::Relaxed),
        };
        self.counters.acquires.fetch_add(1, Ordering::Relaxed);
        let sent = Instant::now();
        let result = self.store.concurrency(&self.name, &op).await;
        // The caller made a store call anyway: its latency is recorded here, per call, and the
        // background task is woken to publish the counters this call changes.
        self.metrics.acquire_returned(sent.elapsed());
        let _publish = Nudge(&self.local);
        let reservation = reservation.settle();
        let held_before = reservation.held_before;
        // The call has ended: a renewal may count now (`claimed` is settled below, before
        // the renewal can read it: the task reads it only after `in_flight` drains, and this
        // reservation is dropped at the end of this function).
        match result {
            Ok(reply) => {
                self.recovered();
                if !reply.existed && held_before > 0 {
                    // The record this holder was counted in is gone (expired or flushed):
                    // renew now, so the slots still held are counted again.
                    self.suspect();
                }
                if reply.granted == n {
                    self.counters.granted.fetch_add(n, Ordering::Relaxed);
                    self.local.in_use.fetch_add(n, Ordering::Relaxed);
                    return Ok(Some(Permit::new(self.local.clone(), n, false)));
                }
                self.counters.full.fetch_add(1, Ordering::Relaxed);
                self.claimed.fetch_sub(n, Ordering::SeqCst);
                Ok(None)
            }
            Err(error) => {
                self.claimed.fetch_sub(n, Ordering::SeqCst);
                if !matches!(error, StoreError::Rejected(_)) {
                    // The call may have been applied: the next renewal sets the count.
                    self.suspect();
                }
                self.fail(error.clone());
                if !error.is_outage() {
                    // The store answered: no failure policy answers for it (see
                    // `StoreError::is_outage`).
                    return Err(AcquireError::Store(error));
                }
                self.degraded(n, Some(error))
            }
        }
    }

    /// Pure: counts `n` slots as claimed and the call as in flight, and draws an acquire
    /// sequence number, waiting while a renewal is being counted (see `task`). `None` if the
    /// limiter closed meanwhile: a call sent once its task has gone would hold slots that no
    /// renewal keeps and no release frees until its record expires.
    async fn reserve(&self, n: u64) -> Option<Reservation<'_, S>> {
        loop {
            let opened = self.gate_open.notified();
            if self.local.signal.is_closed() {
                return None;
            }
            // SeqCst throughout: the task closes the gate, then waits for `in_flight` to drain,
            // then reads `aseq` and `claimed`; a caller increments `in_flight`, `claimed` and
            // `aseq`, then reads the gate. Either the task's read of `in_flight` comes after
            // this caller's increment (and the task waits for this call to end), or this
            // caller sees the gate closed and backs out.
            if !self.gate.load(Ordering::SeqCst) {
                self.in_flight.fetch_add(1, Ordering::SeqCst);
                self.claimed.fetch_add(n, Ordering::SeqCst);
                let seq = self.aseq.fetch_add(1, Ordering::SeqCst) + 1;
                let mut reservation = Reservation {
                    shared: self,
                    n,
                    seq,
                    // Slots granted (in permits, or dropped and not yet released) before this
                    // call: the store must have a record for them.
                    held_before: self.local.in_use.load(Ordering::SeqCst)
                        + self.local.pending.load(Ordering::SeqCst),
                    settled: false,
                };
                // Closed since the check above: the task's last renewal may have read
                // `in_flight` before this caller's increment (and will not wait for this
                // call), so the call must not be sent. If it read it after, the close came
                // first in the SeqCst order, and this load sees it.
                let closed = self.local.signal.is_closed();
                if !closed && !self.gate.load(Ordering::SeqCst) {
                    self.touched.store(true, Ordering::SeqCst);
                    return Some(reservation);
                }
                // Backing out: nothing was sent.
                self.claimed.fetch_sub(n, Ordering::SeqCst);
                reservation.settled = true;
                drop(reservation);
                if closed {
                    return None;
                }
            }
            opened.await;
        }
    }

    /// Pure: an acquire call ended (or was never sent); wakes a renewal waiting for the calls
    /// in flight to end.
    fn call_ended(&self) {
        if self.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 && self.gate.load(Ordering::SeqCst) {
            self.drained.notify_one();
        }
    }

    /// The count in the store may be wrong: ask the task for a renewal.
    pub(crate) fn suspect(&self) {
        self.dirty.store(true, Ordering::SeqCst);
        self.local.signal.request();
    }

    pub(crate) fn fail(&self, error: StoreError) {
        self.circuit.fail(&self.name, self.failure, error);
        self.counters.store_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn recovered(&self) {
        self.circuit.recovered(&self.name);
    }
}

/// Pure: wakes the background task when dropped (at the end of an acquire, after its counters
/// changed), so it publishes them at once.
struct Nudge<'a>(&'a Local);

impl Drop for Nudge<'_> {
    fn drop(&mut self) {
        self.0.signal.request();
    }
}

/// Pure: `n` slots counted in `claimed` for an acquire in flight. Dropped before
/// [`settle`](Self::settle) (the caller's future was cancelled), it un-claims them and flags
/// the count for repair, since the call may have gone through.
struct Reservation<'a, S: ConcurrencyStore> {
    shared: &'a Shared<S>,
    n: u64,
    seq: u64,
    held_before: u64,
    settled: bool,
}

impl<S: ConcurrencyStore> Reservation<'_, S> {
    /// The call returned; the caller settles `claimed` itself.
    fn settle(mut self) -> Self {
        self.settled = true;
        self
    }
}

impl<S: ConcurrencyStore> Drop for Reservation<'_, S> {
    fn drop(&mut self) {
        if !self.settled {
            self.shared.claimed.fetch_sub(self.n, Ordering::SeqCst);
            self.shared.suspect();
        }
        self.shared.call_ended();
    }
}
