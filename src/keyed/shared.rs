//! What callers and the worker share: the key map, the request queue to the worker,
//! counters; and the callers' slow paths (a new key, a denial, an answer from the worker).

use std::borrow::Borrow;
use std::fmt::Display;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::{AcquireError, StoreError};
use crate::failure::{Circuit, FailurePolicy, LocalRate};
use crate::lease::policy::LeasePolicy;
use crate::limiter::{check_tokens, Decision, KeyRef, Patience, RECENTLY_REFUSED};
use crate::quota::Quota;
use crate::retry::RttEstimate;
use crate::store::names::Registration;
use crate::store::LeaseStore;
use crate::telemetry::PUBLISH_INTERVAL;
use crate::time::Origin;

use super::map::{KeyMap, Ref};
use super::state::KeyState;
use super::worker::{Answer, Request};

use super::metrics::{KeyedMetrics, KeyedPublished};
use super::{KeyedStats, TICK};

#[derive(Default)]
pub(super) struct Counters {
    pub(super) keys_created: AtomicU64,
    pub(super) evicted_idle: AtomicU64,
    pub(super) evicted_at_cap: AtomicU64,
    pub(super) refused_at_cap: AtomicU64,
    pub(super) refused_busy: AtomicU64,
    pub(super) leases: AtomicU64,
    pub(super) tokens_leased: AtomicU64,
    pub(super) over_limit: AtomicU64,
    pub(super) releases: AtomicU64,
    pub(super) tokens_released: AtomicU64,
    pub(super) tokens_lost: AtomicU64,
    pub(super) store_errors: AtomicU64,
    pub(super) tokens_denied: AtomicU64,
    pub(super) admitted_degraded: AtomicU64,
    /// Leased tokens that went back to the store's way instead of to a caller: queued for
    /// release (whether the release then succeeds or not). Written by the worker only.
    pub(super) returned: AtomicU64,
}

/// Adds `n` to a statistics counter.
pub(super) fn count(counter: &AtomicU64, n: u64) {
    // Relaxed: statistics.
    counter.fetch_add(n, Ordering::Relaxed);
}

/// Publishes a keyed limiter's metrics from its worker's task, between the worker's polls (see
/// [`crate::telemetry`]); says whether the limiter is active.
///
/// Admitted tokens are derived, with no counter on the hot path: every token a lease brought
/// went to a waiting caller, into a key (where callers spend it) or back to the store, so
/// `admitted = leased − returned − held + degraded`, where `held` is the sum of every key's
/// tokens. That sum reads the whole map, so it is taken at most once per
/// [`PUBLISH_INTERVAL`] (and is 0 without keys, as after shutdown); admitted tokens and the
/// local tokens gauge are published with it. Between the worker's polls nothing adds tokens
/// to a key or moves them out, so only callers' spending can change the sum while it is
/// read, and it never reads below what the keys hold once it is done: the derived count
/// never runs ahead of what callers took.
pub(super) fn publisher<K, S, H>(s: Arc<Shared<K, S, H>>) -> impl FnMut() -> bool
where
    K: Hash + Eq + Clone + Display + Send + Sync + 'static,
    S: LeaseStore,
    H: BuildHasher + Clone + Send + Sync + 'static,
{
    let mut last = KeyedPublished::default();
    let mut summed_at: Option<Instant> = None;
    move || {
        let stats = s.stats();
        let now = Instant::now();
        let held = if stats.live_keys == 0 {
            Some(0)
        } else if summed_at.is_none_or(|at| now >= at + PUBLISH_INTERVAL) {
            summed_at = Some(now);
            Some(s.map.sum(KeyState::tokens))
        } else {
            None
        };
        let held = held.map(|held| {
            let returned = s.counters.returned.load(Ordering::Relaxed);
            let admitted = stats
                .tokens_leased
                .saturating_sub(returned)
                .saturating_sub(held)
                + stats.tokens_admitted_degraded;
            (admitted, held)
        });
        let grew = s.metrics.publish(&mut last, &stats, held);
        // Active while any key lives (the worker ticks then anyway) or the circuit is open;
        // and once more after anything changed, so a count made just after this publication
        // (a caller counts its denial after queueing the request that woke the worker) is
        // published within one interval.
        grew || stats.live_keys > 0 || stats.circuit_open
    }
}

/// Whole ticks in `d`, rounded up, at least one.
pub(super) fn ticks(d: Duration) -> u32 {
    let n = d.as_nanos().div_ceil(TICK.as_nanos()).max(1);
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// What the user holds; dropping the last one closes the limiter.
pub(super) struct Handle<K, S, H> {
    pub(super) shared: Arc<Shared<K, S, H>>,
    pub(super) task: Mutex<Option<JoinHandle<()>>>,
    /// The limiter's name in the process's registry ([`crate::store::names`]), left with the
    /// last clone.
    pub(super) _registration: Option<Registration>,
}

impl<K, S, H> Drop for Handle<K, S, H> {
    fn drop(&mut self) {
        self.shared.close();
    }
}

/// State shared by the callers and the worker.
pub(super) struct Shared<K, S, H> {
    pub(super) name: String,
    pub(super) quota: Quota,
    pub(super) store: S,
    pub(super) policy: Box<dyn LeasePolicy>,
    pub(super) map: KeyMap<K, KeyState, H>,
    /// The arrival-time word of [`FailurePolicy::LocalFallback`]'s rate, per key: used only
    /// while the store fails, so it is kept out of the key's state (created on a key's first
    /// miss under an open circuit, removed with the key).
    pub(super) fallback_words: KeyMap<K, AtomicU64, H>,
    /// Keys in `map`, reserved before each insert (so never above `max_keys`).
    pub(super) live: AtomicUsize,
    pub(super) max_keys: usize,
    /// The coarse clock: ticks since `origin`, advanced by the worker.
    pub(super) tick: AtomicU32,
    pub(super) origin: Origin,
    pub(super) ttl_ticks: u32,
    pub(super) give_back_ticks: u32,
    pub(super) sweep_every: Duration,
    pub(super) max_in_flight: usize,
    /// Leases for keys that were granted tokens before: served first.
    pub(super) known: mpsc::Sender<Request<K>>,
    /// First leases (new keys, and keys never granted yet).
    pub(super) fresh: mpsc::Sender<Request<K>>,
    pub(super) failure: FailurePolicy,
    /// The per-key rate of [`FailurePolicy::LocalFallback`] and
    /// [`FailurePolicy::LastKnownShare`] (each key has its own word).
    pub(super) fallback: Option<LocalRate>,
    pub(super) circuit: Circuit,
    /// Smoothed store round trip, ns.
    pub(super) round_trip: RttEstimate,
    pub(super) closed: AtomicBool,
    /// A new key was refused at the cap: the worker should make room.
    pub(super) pressure: AtomicBool,
    /// Wakes the worker for `closed` and `pressure`.
    pub(super) wake: Notify,
    pub(super) counters: Counters,
    /// Metric handles, published by the worker's task ([`publisher`]).
    pub(super) metrics: KeyedMetrics,
}

/// The outcome of a local check.
pub(super) enum Outcome {
    Allowed,
    Denied { retry_after: Duration, why: Why },
}

/// Why a local check denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Why {
    /// No tokens yet: a lease may bring some. `refused`: the store refused the key within
    /// [`RECENTLY_REFUSED`] — a key at its limit, whose misses between two small grants are
    /// refusals rather than "no answer yet".
    Pending { refused: bool },
    /// The store said when the key's bucket can serve again (or the circuit said when to
    /// probe): waiting is the answer.
    Blocked,
    /// The failure policy's local rate said to wait.
    Policy,
    /// The store is failing and the policy is to fail closed.
    Failing,
}

impl<K, S, H> Shared<K, S, H> {
    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }

    pub(super) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    pub(super) fn tick(&self) -> u32 {
        // Relaxed: a coarse clock; a stale tick only makes a key look a tick older.
        self.tick.load(Ordering::Relaxed)
    }

    /// The coarse clock brought up to the time since the origin, and returned. The worker
    /// keeps time only while keys are live, so a key created after an idle spell reads this,
    /// not `tick` (which could be the idle spell old and get the new key evicted at once).
    pub(super) fn fresh_tick(&self) -> u32 {
        let ticks = self.origin.instant().elapsed().as_nanos() / TICK.as_nanos();
        let now = u32::try_from(ticks).unwrap_or(u32::MAX);
        // Relaxed: see `tick`; `fetch_max`, so concurrent updates never move it back.
        self.tick.fetch_max(now, Ordering::Relaxed).max(now)
    }

    pub(super) fn now_ns(&self) -> u64 {
        self.origin.elapsed_ns()
    }

    pub(super) fn rtt(&self) -> Duration {
        self.round_trip.get()
    }

    /// Counters of this limiter (`Relaxed` loads: statistics, each read on its own).
    pub(super) fn stats(&self) -> KeyedStats {
        let s = self;
        let c = &s.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        KeyedStats {
            live_keys: s.live.load(Ordering::Relaxed) as u64,
            keys_created: get(&c.keys_created),
            evicted_idle: get(&c.evicted_idle),
            evicted_at_cap: get(&c.evicted_at_cap),
            refused_at_cap: get(&c.refused_at_cap),
            refused_busy: get(&c.refused_busy),
            leases: get(&c.leases),
            tokens_leased: get(&c.tokens_leased),
            over_limit: get(&c.over_limit),
            releases: get(&c.releases),
            tokens_released: get(&c.tokens_released),
            tokens_lost: get(&c.tokens_lost),
            store_errors: get(&c.store_errors),
            tokens_denied: get(&c.tokens_denied),
            tokens_admitted_degraded: get(&c.admitted_degraded),
            circuit_open: s.circuit.is_open(),
        }
    }
}

impl<K, S, H> Shared<K, S, H>
where
    K: Hash + Eq + Clone + Display + Send + Sync + 'static,
    S: LeaseStore,
    H: BuildHasher + Clone + Send + Sync + 'static,
{
    /// Takes `n` tokens of `key` locally; on a miss, applies the failure policy, (if `queue`)
    /// queues a lease, and counts the denied tokens. Never waits.
    #[inline]
    pub(super) fn take<Q>(&self, key: &Q, n: u64, queue: bool) -> Result<Outcome, AcquireError>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        let outcome = self.check(key, n, queue)?;
        if let Outcome::Denied { .. } = outcome {
            count(&self.counters.tokens_denied, n);
        }
        Ok(outcome)
    }

    /// [`take`](Self::take) without counting a denial: for a wait's checks after its first,
    /// which was counted.
    #[inline]
    pub(super) fn check<Q>(&self, key: &Q, n: u64, queue: bool) -> Result<Outcome, AcquireError>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        check_tokens(n, self.quota.burst())?;
        let Some(mut state) = self.map.get(key) else {
            return self.miss(key, None, n, queue);
        };
        let Some(left) = self.take_held(&mut state, n) else {
            return self.miss(key, Some(state), n, queue);
        };
        if state.below_low_water(left) {
            self.refill(key, state);
        }
        Ok(Outcome::Allowed)
    }

    /// A hit left `key` below its low-water mark: queue its next lease, unless one is queued.
    /// Out of line, so that the hit path stays small enough to inline.
    #[cold]
    #[inline(never)]
    fn refill<Q>(&self, key: &Q, mut state: Ref<'_, KeyState>)
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        if let Some(queue) = self.claim_request(&mut state) {
            drop(state);
            self.send_request(key, queue, 0);
        }
    }

    /// Takes `n` of `key`'s local tokens if it holds them; no lease, no denial counted.
    pub(super) fn take_local<Q>(&self, key: &Q, n: u64) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map
            .get(key)
            .is_some_and(|mut state| self.take_held(&mut state, n).is_some())
    }

    /// Takes `n` of the tokens `state` holds and marks it used; returns what is left.
    #[inline]
    pub(super) fn take_held(&self, state: &mut KeyState, n: u64) -> Option<u64> {
        let left = state.take(n)?;
        state.touch(self.tick());
        Some(left)
    }

    /// The slow half of `take`: `state` is the key's (held under its shard's lock, let go of
    /// before queueing anything), or `None` if the key has no state.
    #[cold]
    #[inline(never)]
    pub(super) fn miss<Q>(
        &self,
        key: &Q,
        mut state: Option<Ref<'_, KeyState>>,
        n: u64,
        queue: bool,
    ) -> Result<Outcome, AcquireError>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        if self.is_closed() {
            return Err(AcquireError::Closed);
        }
        if let Some(state) = &mut state {
            state.seen(self.tick());
        }
        // One clock reading for the block and the recent refusal. With the circuit closed,
        // only the store's answer keeps a key waiting (`KeyState::refused_for`).
        let circuit_open = self.circuit.is_open();
        let (blocked, refused) = match &state {
            Some(s) => {
                let now = self.now_ns();
                let blocked = if circuit_open {
                    s.blocked_for(now)
                } else {
                    s.refused_for(now)
                };
                (blocked, s.refused_within(RECENTLY_REFUSED, now))
            }
            None => (Duration::ZERO, false),
        };
        let mut outcome = None;
        // A key new to this process under an open circuit: its fallback rate answers once the
        // key has state (created below, within the key cap), as for a key seen before.
        let mut fallback_new = None;
        if circuit_open {
            let admit = match (self.failure, &self.fallback, &state) {
                (FailurePolicy::FailOpen, _, _) => Ok(()),
                (
                    FailurePolicy::LocalFallback { .. } | FailurePolicy::LastKnownShare { .. },
                    Some(rate),
                    Some(_),
                ) => self.fallback_take(key, rate, n),
                (
                    FailurePolicy::LocalFallback { .. } | FailurePolicy::LastKnownShare { .. },
                    Some(rate),
                    None,
                ) if queue => {
                    fallback_new = Some(rate);
                    Err((self.rtt(), Why::Policy))
                }
                (
                    FailurePolicy::LocalFallback { .. } | FailurePolicy::LastKnownShare { .. },
                    _,
                    _,
                ) => Err((self.rtt(), Why::Policy)),
                _ => Err((blocked.max(self.rtt()), Why::Failing)),
            };
            outcome = Some(self.by_policy(admit, n));
        } else if !blocked.is_zero() {
            outcome = Some(Outcome::Denied {
                retry_after: blocked,
                why: Why::Blocked,
            });
        }
        // Ask for a lease (under an open circuit: a probe) unless the key is known to wait.
        if queue && blocked.is_zero() {
            match state {
                Some(mut s) => {
                    s.note_denied(n);
                    if let Some(queue) = self.claim_request(&mut s) {
                        drop(s);
                        self.send_request(key, queue, n);
                    }
                }
                None => self.admit(key, n),
            }
        }
        if let Some(rate) = fallback_new {
            // Under the key's shard lock, as for a key seen before: an eviction (which removes
            // the key's fallback word) cannot come between the check and the word's creation.
            if let Some(_held) = self.map.get(key) {
                outcome = Some(self.by_policy(self.fallback_take(key, rate, n), n));
            }
        }
        Ok(outcome.unwrap_or(Outcome::Denied {
            retry_after: self.rtt(),
            why: Why::Pending { refused },
        }))
    }

    /// The failure policy's answer for `n` tokens: admitted (and counted as such), or denied
    /// for as long as `admit` says and why.
    fn by_policy(&self, admit: Result<(), (Duration, Why)>, n: u64) -> Outcome {
        match admit {
            Ok(()) => {
                count(&self.counters.admitted_degraded, n);
                Outcome::Allowed
            }
            Err((retry_after, why)) => Outcome::Denied { retry_after, why },
        }
    }

    /// Takes `n` tokens of `key`'s fallback rate (creating its word on the first call), or
    /// says how long until it could (a refusal by the policy). Called with the key's state
    /// held, so that its eviction cannot leave a word behind.
    #[cold]
    fn fallback_take<Q>(&self, key: &Q, rate: &LocalRate, n: u64) -> Result<(), (Duration, Why)>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        if !rate.fits(n) {
            // More than the local rate's burst: never locally, so no wait of its to tell; the
            // store's failure is the answer (a waiter gets its error under a policy that
            // answers for it, a `try_acquire` a denial) until the store answers again.
            return Err((self.rtt(), Why::Failing));
        }
        let taken = match self.fallback_words.get(key) {
            Some(word) => rate.try_take_at(&word, n),
            None => {
                self.fallback_words
                    .insert_new(key.to_owned(), || AtomicU64::new(0));
                match self.fallback_words.get(key) {
                    Some(word) => rate.try_take_at(&word, n),
                    // Removed with its key meanwhile: the key is gone, so is its rate.
                    None => Err(self.rtt()),
                }
            }
        };
        taken.map_err(|wait| (wait, Why::Policy))
    }

    /// Marks a lease of the key in `state` as queued, unless one is already; if this call
    /// did, returns the queue to send it to with [`send_request`](Self::send_request), once the
    /// shard's lock is let go of.
    fn claim_request(&self, state: &mut KeyState) -> Option<&mpsc::Sender<Request<K>>> {
        state.mark_queued().then(|| self.queue_for(Some(state)))
    }

    /// Queues a lease of `n` tokens for `key`, claimed by
    /// [`claim_request`](Self::claim_request). Called without holding the key's shard: sending
    /// may wake the worker.
    fn send_request<Q>(&self, key: &Q, queue: &mpsc::Sender<Request<K>>, n: u64)
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        match queue.try_reserve() {
            Ok(permit) => permit.send(Request {
                key: key.to_owned(),
                n,
                reply: None,
            }),
            // The queue is full (or closed): a later call asks again. The key is still there:
            // a key with a lease queued is never evicted.
            Err(_) => {
                if let Some(mut state) = self.map.get(key) {
                    state.unqueue();
                }
            }
        }
    }

    /// The queue for a lease of a key in `state`: keys that were granted tokens before have a
    /// queue of their own, served first, so a flood of new keys cannot delay their refills.
    pub(super) fn queue_for(&self, state: Option<&KeyState>) -> &mpsc::Sender<Request<K>> {
        match state {
            Some(state) if state.flags() & super::state::GRANTED != 0 => &self.known,
            _ => &self.fresh,
        }
    }

    /// Creates the state of a new key and queues its first lease, if the cap and the queue
    /// allow.
    pub(super) fn admit<Q>(&self, key: &Q, n: u64)
    where
        Q: ToOwned<Owned = K> + ?Sized,
    {
        let Ok(permit) = self.fresh.try_reserve() else {
            count(&self.counters.refused_busy, 1);
            return;
        };
        if !self.reserve_slot() {
            return;
        }
        let key = key.to_owned();
        let state = || KeyState::new(self.fresh_tick(), super::state::QUEUED);
        if self.map.insert_new(key.clone(), state) {
            count(&self.counters.keys_created, 1);
            permit.send(Request {
                key,
                n,
                reply: None,
            });
        } else {
            // Another caller created it meanwhile.
            self.live.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Creates `key`'s state if it has none and the cap allows (for async callers).
    pub(super) fn ensure_state<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        if self.map.contains_key(key) || !self.reserve_slot() {
            return;
        }
        if self
            .map
            .insert_new(key.to_owned(), || KeyState::new(self.fresh_tick(), 0))
        {
            count(&self.counters.keys_created, 1);
        } else {
            self.live.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Reserves room for one more key; at the cap, counts the refusal and asks the worker to
    /// make room.
    pub(super) fn reserve_slot(&self) -> bool {
        // Relaxed: a counter; a CAS, so it never reads above the cap even for a moment.
        let reserved = self
            .live
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |live| {
                (live < self.max_keys).then_some(live + 1)
            })
            .is_ok();
        if !reserved {
            count(&self.counters.refused_at_cap, 1);
            if !self.pressure.swap(true, Ordering::Relaxed) {
                self.wake.notify_one();
            }
        }
        reserved
    }

    /// Asks the worker for `n` tokens of `key` and waits for its answer.
    pub(super) async fn ask<Q>(&self, key: &Q, n: u64) -> Result<Answer, AcquireError>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        let (reply, answer) = oneshot::channel();
        let request = Request {
            key: key.to_owned(),
            n,
            reply: Some(reply),
        };
        let queue = self.queue_for(self.map.get(key).as_deref());
        queue
            .send(request)
            .await
            .map_err(|_| AcquireError::Closed)?;
        answer.await.map_err(|_| AcquireError::Closed)
    }

    /// Waits for `n` tokens of `key`; a refusal (by the store, or by the failure policy) is
    /// waited out or returned as `patience` says. While the key has no answer yet, the call
    /// asks the worker for a lease and waits for its reply: if a lease of the key is already
    /// queued or in flight, the worker holds the request back and answers it once that lease
    /// is answered (`worker.rs`), so a waiter wakes for its own key's answer and nothing else.
    /// The call's tokens are counted as denied once, at its first miss, however often it
    /// looks again.
    pub(super) async fn wait<Q>(
        &self,
        key: &Q,
        n: u64,
        patience: Patience,
    ) -> Result<Decision, AcquireError>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        let mut first = true;
        loop {
            // While the store is failing, a miss also queues a lease, as `try_acquire` does:
            // that is the probe that closes the circuit again (the worker sends it when the
            // back-off allows), else callers that only wait would never probe.
            let probe = self.circuit.is_open();
            let outcome = if std::mem::take(&mut first) {
                self.take(key, n, probe)?
            } else {
                self.check(key, n, probe)?
            };
            let (retry_after, why) = match outcome {
                Outcome::Allowed => return Ok(Decision::Allowed),
                Outcome::Denied { retry_after, why } => (retry_after, why),
            };
            let wait = match why {
                Why::Blocked | Why::Policy => retry_after,
                Why::Failing => match self.circuit.last_error() {
                    Some(e) => return Err(AcquireError::Store(e)),
                    None => retry_after,
                },
                Why::Pending { .. } => {
                    self.ensure_state(key);
                    match self.ask(key, n).await? {
                        Answer::Granted => return Ok(Decision::Allowed),
                        // Another lease of this key (a refill) may have brought tokens while
                        // this one was refused: take them rather than wait out the refusal.
                        Answer::Denied(wait) if !self.take_local(key, n) => wait,
                        Answer::Denied(_) => return Ok(Decision::Allowed),
                        Answer::Failed(e) if self.failure.ends_wait(&e) => {
                            return Err(AcquireError::Store(e))
                        }
                        // The circuit is open now: the next check answers by the policy.
                        Answer::Failed(_) => continue,
                        Answer::TooLarge(burst) => {
                            return Err(AcquireError::ExceedsBurst {
                                requested: n,
                                burst,
                            })
                        }
                        Answer::Closed => return Err(AcquireError::Closed),
                    }
                }
            };
            if patience.sheds(wait) {
                return Ok(Decision::Denied { retry_after: wait });
            }
            tokio::time::sleep(wait).await;
        }
    }

    pub(super) fn fail(&self, error: StoreError) {
        self.circuit.fail(&self.name, self.failure, error);
        count(&self.counters.store_errors, 1);
    }

    /// A store call returned after `took` (`answered`: see [`RttEstimate::observe`]).
    pub(super) fn observe_rtt(&self, took: Duration, answered: bool) {
        self.round_trip.observe(took, answered);
    }
}
