//! What callers and the background task share (the local bucket, the refill signal, the
//! published quota and deadlines, counters), and the callers' slow path: a denial.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::algorithm::token_bucket::QuotaSource;
use crate::algorithm::Algorithm;
use crate::config::Unconfigured;
use crate::error::{AcquireError, StoreError};
use crate::failure::{Circuit, FailurePolicy, LocalRate};
use crate::lease::local::LocalBucket;
use crate::lease::policy::{LeaseAsk, LeasePolicy};
use crate::lease::refill::RefillSignal;
use crate::limiter::Decision;
use crate::quota::Quota;
use crate::retry::RttEstimate;
use crate::store::names::Registration;
use crate::store::LeaseRequest;
use crate::store::LeaseStore;
use crate::time::{self, Origin};

use super::metrics::{HybridMetrics, Published};
use super::HybridStats;

/// What the user holds; dropping the last one closes the limiter.
pub(super) struct Handle<S: LeaseStore> {
    pub(super) shared: Arc<Shared<S>>,
    pub(super) task: Mutex<Option<JoinHandle<()>>>,
    /// The limiter's name in the process's registry ([`crate::store::names`]), left with the
    /// last clone (not with the task, which may still be giving tokens back).
    pub(super) _registration: Option<Registration>,
}

impl<S: LeaseStore> Drop for Handle<S> {
    fn drop(&mut self) {
        self.shared.signal.close();
    }
}

/// State shared by the callers and the background task.
pub(super) struct Shared<S> {
    pub(super) local: LocalBucket,
    pub(super) signal: RefillSignal,
    /// Refill below this many local tokens; set by the policy after each lease.
    pub(super) low_water: AtomicU64,
    /// The builder's quota: sent with every store call (the quota of an unconfigured name).
    pub(super) quota: Quota,
    /// The burst of the effective quota, checked on the hot path; written by the task.
    pub(super) burst: AtomicU64,
    /// The effective quota, for [`HybridLimiter::quota`]; written by the task (never locked
    /// on the hot path).
    pub(super) effective: Mutex<Quota>,
    /// The client budget (`Some(node_id)` for [`Budget::PerClient`]).
    pub(super) client: Option<u64>,
    pub(super) unconfigured: Unconfigured,
    pub(super) algorithm: Algorithm,
    /// The store said the name is unconfigured (and `unconfigured` is not `UseQuota`).
    pub(super) absent: AtomicBool,
    pub(super) name: String,
    pub(super) store: S,
    pub(super) policy: Box<dyn LeasePolicy>,
    pub(super) node_id: u64,
    /// Tokens denied to callers, ever (demand that was not served).
    pub(super) denied_total: AtomicU64,
    pub(super) failure: FailurePolicy,
    /// The local bucket of [`FailurePolicy::LocalFallback`] and
    /// [`FailurePolicy::LastKnownShare`] (at the learnt share).
    pub(super) fallback: Option<LocalRate>,
    /// Open from a failed lease until a lease succeeds.
    pub(super) circuit: Circuit,
    /// Origin of the nanosecond timestamps below.
    pub(super) origin: Origin,
    /// Over-limit (or error back-off) deadline, ns since `origin`; callers are denied until then.
    pub(super) blocked_until_ns: AtomicU64,
    /// The block above holds only requests of more than this many tokens (0: all): after a
    /// decision in the store refused `n`, the bucket still had this many, which a smaller
    /// request may take (see [`blocked_for_n`](Self::blocked_for_n)).
    pub(super) blocked_above: AtomicU64,
    /// Until when (ns since `origin`) the store said no tokens would come: its over-limit
    /// answer, or the pacing it sent with a grant — never an error back-off. Ended early by a
    /// grant, it reads as ending then. See [`refused_within`](Self::refused_within).
    pub(super) refused_until_ns: AtomicU64,
    /// Smoothed store round trip.
    pub(super) round_trip: RttEstimate,
    /// Signalled after every store call, and when the task ends.
    pub(super) finished: Notify,
    /// Whether a lease call has been answered (or failed): see [`HybridLimiter::ready`].
    pub(super) answered: AtomicBool,
    /// Leasing buys nothing now (the task's reading of the policy's
    /// [`per_request`](LeasePolicy::per_request)): a miss in `acquire_now` is one decision in
    /// the store ([`Shared::decide`]).
    pub(super) per_request: AtomicBool,
    pub(super) counters: Counters,
    pub(super) metrics: HybridMetrics,
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) leases: AtomicU64,
    pub(super) tokens_leased: AtomicU64,
    pub(super) over_limit: AtomicU64,
    pub(super) releases: AtomicU64,
    pub(super) tokens_released: AtomicU64,
    pub(super) store_errors: AtomicU64,
    pub(super) tokens_expired: AtomicU64,
    pub(super) admitted_degraded: AtomicU64,
    pub(super) demand_mtps: AtomicU64,
    pub(super) share_mtps: AtomicU64,
    pub(super) rate_mtps: AtomicU64,
    pub(super) tokens_dripped: AtomicU64,
    /// Tokens taken from the local bucket for a release still in flight.
    pub(super) returning: AtomicU64,
    /// Misses of `try_acquire`, which cannot decide in the store (see
    /// `Task::sync_callers`).
    pub(super) sync_misses: AtomicU64,
    /// Misses of `acquire_now` outside the per-request regime (inside it, each is one of
    /// `decisions`).
    pub(super) async_misses: AtomicU64,
    /// Decisions made in the store for one request each (see [`Shared::decide`]).
    pub(super) decisions: AtomicU64,
    /// Tokens they admitted.
    pub(super) decided: AtomicU64,
}

impl<S> Shared<S> {
    pub(super) fn stats(&self) -> HybridStats {
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
            rate_mtps: get(&c.rate_mtps),
            tokens_dripped: get(&c.tokens_dripped),
            local_tokens: self.local.available(),
            decisions: get(&c.decisions),
            tokens_decided: get(&c.decided),
            // Relaxed: a state flag, read as a statistic.
            per_request: self.per_request.load(Ordering::Relaxed),
        }
    }

    /// Tokens spent from leases while `held` are still held: everything leased, less what
    /// was returned (or is being returned) or dropped. Callers only ever take from the local
    /// bucket, so this needs no counter of its own on the hot path.
    pub(super) fn spent(&self, held: u64) -> u64 {
        let c = &self.counters;
        let got = c.tokens_leased.load(Ordering::Relaxed);
        let gone = c.tokens_released.load(Ordering::Relaxed)
            + c.tokens_expired.load(Ordering::Relaxed)
            + c.returning.load(Ordering::Relaxed);
        got.saturating_sub(gone).saturating_sub(held)
    }
}

/// Publishes a limiter's metrics (see [`crate::telemetry`]); says whether it is active.
pub(super) fn publisher<S: LeaseStore>(s: Arc<Shared<S>>) -> impl FnMut() -> bool {
    let mut last = Published::default();
    move || {
        let stats = s.stats();
        let admitted =
            s.spent(s.local.settled()) + stats.tokens_admitted_degraded + stats.tokens_decided;
        s.metrics.publish(&mut last, &stats, admitted);
        stats.local_tokens > 0 || stats.circuit_open || !s.blocked_for().is_zero()
    }
}

impl<S: LeaseStore> Shared<S> {
    /// A miss of `try_acquire` or `acquire_now` (which `counter` counts, for the task to tell
    /// its callers apart: see `Task::sync_callers`), answered as [`denied`](Self::denied).
    #[cold]
    pub(super) fn missed(&self, n: u64, counter: &AtomicU64) -> Result<Decision, AcquireError> {
        // Relaxed: a statistic the task reads at its next review.
        counter.fetch_add(1, Ordering::Relaxed);
        self.denied(n)
    }

    /// The slow half of `try_acquire`: record the demand and say when to retry.
    #[cold]
    pub(super) fn denied(&self, n: u64) -> Result<Decision, AcquireError> {
        if self.signal.is_closed() {
            return Err(AcquireError::Closed);
        }
        // Relaxed: a state flag; a caller that reads it a little late answers as before.
        if self.absent.load(Ordering::Relaxed) {
            // Keep the background task looking for a config.
            self.signal.request();
            return match self.unconfigured {
                Unconfigured::Error => Err(AcquireError::Unconfigured(self.name.clone())),
                _ => Ok(Decision::Allowed),
            };
        }
        // The failure policy's answer while the circuit is open; `None` for "deny as usual".
        let mut policy_wait = None;
        if self.circuit.is_open() {
            let admit = match (self.failure, &self.fallback) {
                (FailurePolicy::FailOpen, _) => Ok(()),
                // More than the local rate's burst is denied as usual (until the store
                // answers: the retry hint of the back-off), not told a wait that never ends.
                (
                    FailurePolicy::LocalFallback { .. } | FailurePolicy::LastKnownShare { .. },
                    Some(local),
                ) if local.fits(n) => local.try_take(n),
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

    /// Whether a miss is a decision in the store now: leasing buys nothing, and the store
    /// answers (neither the failure policy nor an unconfigured name's answer is in force).
    pub(super) fn decides_per_request(&self) -> bool {
        // Relaxed: state flags the task sets; a caller that reads one a moment late decides
        // as just before.
        self.per_request.load(Ordering::Relaxed)
            && !self.absent.load(Ordering::Relaxed)
            && !self.circuit.is_open()
            && !self.signal.is_closed()
    }

    /// A miss of `acquire_now` while leasing buys nothing: one decision in the store for
    /// this request, as a [`RedisLimiter`](crate::RedisLimiter) makes — an exact take of `n`
    /// tokens that the store does not count as held, since they are spent at once. A known
    /// refusal (the store's last "not before", for requests larger than the bucket then
    /// held: see `blocked_above`) answers without a call. Callers make it only
    /// while [`decides_per_request`](Self::decides_per_request) (so not while the failure
    /// policy answers).
    #[cold]
    pub(super) async fn decide(&self, n: u64) -> Result<Decision, AcquireError> {
        let blocked = self.blocked_for_n(n);
        if !blocked.is_zero() {
            // Relaxed: a statistic, as in `denied`.
            self.denied_total.fetch_add(n, Ordering::Relaxed);
            return Ok(Decision::Denied {
                retry_after: blocked,
            });
        }
        if n > self.quota.burst() {
            // The store checks a request against the caller's quota: more than the builder's
            // burst (within a larger stored one) is no exact take it would run, and its
            // refusal would read as the store failing. A miss the task leases for, in
            // batches within the builder's burst, as `try_acquire`'s.
            return self.denied(n);
        }
        let request = LeaseRequest::exact(n).with_limiter_settings(
            self.client,
            self.unconfigured,
            self.algorithm,
        );
        let sent = Instant::now();
        let reply = self.store.lease(&self.name, &self.quota, &request).await;
        self.observe_rtt(sent.elapsed(), reply.is_ok());
        // Relaxed: statistics.
        self.counters.decisions.fetch_add(1, Ordering::Relaxed);
        // The task looks at the demand again (it is not woken by these misses otherwise): a
        // burst ends the regime within a few decisions, not at the next review.
        self.signal.request();
        match reply.and_then(|r| r.within(&request)) {
            Ok(r) if r.source == QuotaSource::Absent => self.denied(n),
            Ok(r) if r.granted >= n => {
                self.recovered();
                self.counters.decided.fetch_add(n, Ordering::Relaxed);
                Ok(Decision::Allowed)
            }
            Ok(r) if r.quota.burst() < n => {
                // A stored config's burst below the request, not adopted yet (the task leases
                // rarely in this regime): no wait would help, and the store's "retry at once"
                // had a waiter ask it ten thousand times a second.
                self.recovered();
                Err(AcquireError::ExceedsBurst {
                    requested: n,
                    burst: r.quota.burst(),
                })
            }
            Ok(r) => {
                self.recovered();
                self.denied_total.fetch_add(n, Ordering::Relaxed);
                // The bucket holds fewer than `n` until then, whoever asks; a request for
                // no more than it holds now (`remaining`) is still the store's to decide —
                // unless `n` was refused with as many there (the tokens leasers are owed).
                if !r.retry_after.is_zero() {
                    let fits = if r.remaining < n { r.remaining } else { 0 };
                    self.block_above(time::from_now(r.retry_after), fits);
                }
                Ok(Decision::Denied {
                    retry_after: r.retry_after,
                })
            }
            Err(error) => {
                self.fail(error.clone());
                if !error.is_outage() {
                    // The store answered, as pure mode hears it (see `Circuit::fail`).
                    return Err(AcquireError::Store(error));
                }
                self.denied(n)
            }
        }
    }

    pub(super) fn now_ns(&self) -> u64 {
        self.origin.elapsed_ns()
    }

    /// Time left of an over-limit or back-off period (zero if none).
    pub(super) fn blocked_for(&self) -> Duration {
        // Relaxed: a hint; nothing else is published through it.
        let until = self.blocked_until_ns.load(Ordering::Relaxed);
        Duration::from_nanos(until.saturating_sub(self.now_ns()))
    }

    /// Time left of the block for a request of `n` tokens: [`blocked_for`](Self::blocked_for),
    /// unless the block was a refusal of a larger request (see `blocked_above`).
    pub(super) fn blocked_for_n(&self, n: u64) -> Duration {
        // Relaxed: a hint, as in `blocked_for`. Read apart from the deadline, a size of
        // another block can only send a request to the store (which decides exactly) or
        // deny it until a deadline the store set.
        if n <= self.blocked_above.load(Ordering::Relaxed) {
            return Duration::ZERO;
        }
        self.blocked_for()
    }

    /// When a denied caller should try again: the end of a known block, else one round trip.
    pub(super) fn retry_hint(&self) -> Duration {
        match self.blocked_for() {
            Duration::ZERO => self.rtt(),
            blocked => blocked,
        }
    }

    pub(super) fn rtt(&self) -> Duration {
        self.round_trip.get()
    }

    /// A store call returned after `took` (`answered`: see [`RttEstimate::observe`]).
    pub(super) fn observe_rtt(&self, took: Duration, answered: bool) {
        self.metrics.lease_returned(took);
        self.round_trip.observe(took, answered);
    }

    /// Denies callers until `deadline`; `refused`: because the store said so (not a back-off
    /// after an error).
    pub(super) fn block_until(&self, deadline: Instant, refused: bool) {
        let ns = self.origin.ns_at(deadline);
        // Relaxed: hints, as in `blocked_for`; each word stands alone.
        self.blocked_above.store(0, Ordering::Relaxed);
        self.blocked_until_ns.store(ns, Ordering::Relaxed);
        if refused {
            self.refused_until_ns.store(ns, Ordering::Relaxed);
        }
    }

    /// Denies requests of more than `fits` tokens until `deadline`, because the store refused
    /// one (a decision per request): the bucket held `fits`.
    fn block_above(&self, deadline: Instant, fits: u64) {
        self.block_until(deadline, true);
        // Relaxed: a hint, as in `blocked_for_n`; read before it, the block holds every
        // request (the safe side) for that moment.
        self.blocked_above.store(fits, Ordering::Relaxed);
    }

    /// Callers need not wait from now on: a grant ends any block early, and a refusal so ended
    /// reads as ending now (it stays recent for [`refused_within`](Self::refused_within)).
    pub(super) fn unblock(&self) {
        let now = self.now_ns();
        // Relaxed: hints, as in `blocked_for`.
        self.blocked_until_ns.fetch_min(now, Ordering::Relaxed);
        self.refused_until_ns.fetch_min(now, Ordering::Relaxed);
    }

    /// Whether the store refused this limiter (or paced its grants) until less than `window`
    /// ago, or still does: a limiter at its limit, whose misses are refusals rather than "no
    /// answer yet". A back-off after a store error is no refusal.
    pub(super) fn refused_within(&self, window: Duration) -> bool {
        // Relaxed: a hint, as in `blocked_for`.
        let until = self.refused_until_ns.load(Ordering::Relaxed);
        time::ended_within(until, window, self.now_ns())
    }

    pub(super) fn fail(&self, error: StoreError) {
        self.circuit.fail(&self.name, self.failure, error);
        self.counters.store_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// A lease call succeeded: close the circuit.
    pub(super) fn recovered(&self) {
        self.circuit.recovered(&self.name);
    }

    /// `1 ≤ min ≤ want`, and `min` within both the builder's burst (the store checks
    /// arguments against it) and the effective one.
    pub(super) fn clamp(&self, ask: LeaseAsk, quota: &Quota) -> LeaseAsk {
        let min = ask.min.clamp(1, self.quota.burst().min(quota.burst()));
        LeaseAsk {
            want: ask.want.max(min),
            min,
            ..ask
        }
    }
}

/// Whether a refill request needs no lease: nobody was denied and the local bucket still holds
/// the low-water mark. Callers compare the mark with a hint that can read low (tokens parked in
/// another slot of the local bucket are not in it, see [`crate::lease::local`]); leasing on such a
/// request asks for nothing (the policy's target is already held), and every token spent
/// would then cost a store call. The flag is lowered and the bucket looked at again (the
/// store-buffer pattern of [`crate::lease::refill`]), so a caller that crosses the mark or is denied
/// meanwhile is not lost.
pub(super) fn spurious<S>(s: &Shared<S>) -> bool {
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

/// Whether a refill request is to be dropped because leasing buys nothing now (see
/// [`Shared::per_request`]) and nobody was denied by `try_acquire`: a low-water crossing
/// then asks for nothing. The flag is lowered and the denial looked at again, as in
/// [`spurious`].
pub(super) fn not_denied_per_request<S>(s: &Shared<S>) -> bool {
    // Relaxed: state flags; see `Shared::denied`.
    if !s.per_request.load(Ordering::Relaxed)
        || s.circuit.is_open()
        || s.absent.load(Ordering::Relaxed)
        || s.signal.was_denied()
    {
        return false;
    }
    s.signal.done();
    if !s.signal.was_denied() {
        return true;
    }
    s.signal.request();
    false
}
