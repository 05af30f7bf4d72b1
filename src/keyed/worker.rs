//! The keyed limiter's one background worker: leases, releases, the coarse clock, sweeps and
//! evictions for every key.
//!
//! The worker loops over five events, in this order of priority: a wake-up for shutdown or
//! for room at the cap, a finished store call, a request from the queue of keys granted tokens
//! before, a request from the queue of first leases (both taken only while fewer than
//! `max_in_flight` calls are running, first leases only while fewer than
//! [`MAX_RELEASE_BACKLOG`] releases wait), and a tick of the coarse clock (only while there are
//! keys or tokens to give back). Refills of known keys thus never wait behind a flood of new
//! ones.
//! Store calls run as tasks of a `JoinSet`, so a `RedisStore` pipelines them on its
//! connection; everything else runs in the worker and never awaits while holding a reference
//! into the map. Releases wait in a queue of their own and start as slots free up.
//!
//! A waiting caller's request for a key whose lease is already queued or in flight (a sync
//! caller's [`QUEUED`] lease: a first lease or a refill; or another waiter's on a key the store
//! refused within the last second or with measured demand) is held back, in a map the worker
//! alone owns, until that lease is answered; then it is answered from what that lease brought
//! (or by the key's refusal, or, if that lease took the store's last token, with the wait for
//! the next), and only if none serves it does it lease for itself. So a key's waiters share
//! its one lease, and each is woken by its own key's answer alone. (A cold key's waiters, each
//! with its exact request, lease side by side: one round trip each.)
//! Callers set and clear `QUEUED` under the key's shard lock, as the worker reads it, but a
//! caller can clear it right after the worker looked: a request held back for a flag that a
//! caller cleared (its queue was full: no lease will come) is found at the next tick, which
//! resumes the requests held for it.

use std::collections::{HashMap, VecDeque};
use std::fmt::Display;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::task::{JoinError, JoinSet};
use tokio::time::Instant;

mod eviction;

use super::name::bucket_name;
use super::shared::{count, Shared};
use super::state::{KeyState, QUEUED};
use super::TICK;
use crate::error::StoreError;
use crate::lease::policy::{LeaseAsk, LeaseContext};
use crate::limiter::RECENTLY_REFUSED;
use crate::retry::{Backoff, MIN_RETRY};
use crate::store::{unwinding, LeaseReply, LeaseRequest, LeaseStore, ReleaseRequest};
use crate::time;

/// Releases waiting to start above which no new key is taken from the queue of first leases:
/// under a flood, evictions (each returning a key's tokens) then cannot outpace releases and
/// pile up.
const MAX_RELEASE_BACKLOG: usize = 4096;

/// The worker's two queues (see `Shared::queue_for`).
pub(super) struct Requests<K> {
    pub(super) known: mpsc::Receiver<Request<K>>,
    pub(super) fresh: mpsc::Receiver<Request<K>>,
}

/// A lease wanted for a key.
pub(super) struct Request<K> {
    pub(super) key: K,
    /// Tokens the caller needs (0: a refill below the low-water mark).
    pub(super) n: u64,
    /// An async caller waiting for `n` tokens; `None` for a sync caller's request (the grant
    /// goes to the key, and the key's [`QUEUED`] flag is cleared once it is answered).
    pub(super) reply: Option<oneshot::Sender<Answer>>,
}

/// The answer to a waiting caller.
pub(super) enum Answer {
    /// Its `n` tokens were taken from the grant.
    Granted,
    /// The key's bucket cannot serve for this long.
    Denied(Duration),
    /// The store failed (now or recently: the circuit is open).
    Failed(StoreError),
    /// The key's own central config has a burst below the request.
    TooLarge(u64),
    /// The limiter is shutting down.
    Closed,
}

/// A finished store call.
enum Done<K> {
    Lease {
        req: Request<K>,
        ask: LeaseAsk,
        sent: Instant,
        probe: bool,
        /// Whether the lease holds its key's `QUEUED` flag (cleared once it is answered).
        holds_queue: bool,
        result: Result<LeaseReply, StoreError>,
    },
    Release {
        tokens: u64,
        result: Result<LeaseReply, StoreError>,
    },
}

struct Worker<K, S, H> {
    s: Arc<Shared<K, S, H>>,
    jobs: JoinSet<Done<K>>,
    /// Tokens waiting to be given back: (bucket name, tokens).
    releases: VecDeque<(String, u64)>,
    /// Release calls in flight: at most half of `max_in_flight` (at least one), so evictions
    /// under a flood cannot starve leases.
    releasing: usize,
    rng: fastrand::Rng,
    backoff: Backoff,
    /// While the circuit is open: when to probe the store next.
    probe_at: Option<Instant>,
    /// A probe is in flight.
    probing: bool,
    next_sweep: Instant,
    /// Waiting callers' requests held back until their key's queued lease is answered (see
    /// the module docs).
    parked: HashMap<K, Vec<Request<K>>, H>,
}

/// The worker: runs until the limiter closes, then gives every token back.
pub(super) async fn run<K, S, H>(s: Arc<Shared<K, S, H>>, mut requests: Requests<K>, seed: u64)
where
    K: Hash + Eq + Clone + Display + Send + Sync + 'static,
    S: LeaseStore,
    H: BuildHasher + Clone + Send + Sync + 'static,
{
    let mut w = Worker {
        next_sweep: Instant::now() + s.sweep_every,
        parked: HashMap::with_hasher(s.map.hasher().clone()),
        s,
        jobs: JoinSet::new(),
        releases: VecDeque::new(),
        releasing: 0,
        rng: fastrand::Rng::with_seed(seed),
        backoff: Backoff::for_errors(),
        probe_at: None,
        probing: false,
    };
    loop {
        w.advance_clock();
        if w.s.is_closed() {
            break;
        }
        if w.s.pressure.swap(false, Ordering::Relaxed) {
            w.make_room();
        }
        w.start_releases();
        let tick = w.next_tick();
        let can_start = w.jobs.len() < w.s.max_in_flight;
        let can_create = can_start && w.releases.len() < MAX_RELEASE_BACKLOG;
        tokio::select! {
            biased;
            () = w.s.wake.notified() => {}
            Some(done) = w.jobs.join_next(), if !w.jobs.is_empty() => w.finish(done),
            Some(request) = requests.known.recv(), if can_start => w.start(request),
            Some(request) = requests.fresh.recv(), if can_create => w.start(request),
            () = tokio::time::sleep_until(tick.unwrap_or_else(Instant::now)), if tick.is_some() => {
                w.advance_clock();
                w.recheck_parked();
                if Instant::now() >= w.next_sweep {
                    w.sweep();
                    w.next_sweep = Instant::now() + w.s.sweep_every;
                }
            }
        }
    }
    w.close(requests).await;
}

impl<K, S, H> Worker<K, S, H>
where
    K: Hash + Eq + Clone + Display + Send + Sync + 'static,
    S: LeaseStore,
    H: BuildHasher + Clone + Send + Sync + 'static,
{
    /// Sets the coarse clock from the time since the limiter's origin.
    fn advance_clock(&self) {
        self.s.fresh_tick();
    }

    /// The next tick, if there is anything to keep time for.
    fn next_tick(&self) -> Option<Instant> {
        let busy = self.s.live.load(Ordering::Relaxed) > 0
            || !self.releases.is_empty()
            || !self.parked.is_empty();
        busy.then(|| self.s.origin.instant() + TICK * (self.s.tick() + 1))
    }

    fn now_ms(&self) -> u32 {
        // Truncated on purpose: a wrapping millisecond clock (see `KeyState::demand`).
        self.s.origin.instant().elapsed().as_millis() as u32
    }

    /// Starts the lease `request` asks for (or answers it at once).
    fn start(&mut self, request: Request<K>) {
        let now = Instant::now();
        if self.s.circuit.is_open() && (self.probing || self.probe_at.is_some_and(|at| now < at)) {
            self.answer_failing(request, now);
            return;
        }
        let mut state = self.s.map.get(&request.key);
        // A waiting caller's key with a lease queued or in flight: that lease answers it.
        let queued = state.as_deref().is_some_and(|s| s.flags() & QUEUED != 0);
        if request.reply.is_some() && queued {
            drop(state);
            self.park(request);
            return;
        }
        // The lease holds the key's `QUEUED` flag — the key's other waiters are held back for
        // its answer — if a sync caller queued it, or if it is a waiter's on a key the store
        // refused lately or with measured demand: ten waiters woken by the end of one refusal
        // made ten store calls (and a hot key's as many batches), where one answers them all.
        // A cold key's waiters lease side by side (each its exact request, one round trip).
        let holds_queue = match (&request.reply, state.as_deref_mut()) {
            (None, _) => true,
            (Some(_), Some(key)) => {
                let (now_ms, now_ns) = (self.now_ms(), self.ns_at(now));
                (key.refused_within(RECENTLY_REFUSED, now_ns) || key.demand(now_ms) > 0.0)
                    && key.mark_queued()
            }
            (Some(_), None) => false,
        };
        let Some(ask) = self.size(state.as_deref_mut(), &request) else {
            // Served meanwhile (a grant landed since the caller asked).
            if let Some(state) = &mut state {
                state.unqueue();
            }
            drop(state);
            self.resume_parked(&request.key, 1, None);
            return;
        };
        drop(state);
        let probe = self.s.circuit.is_open();
        self.probing |= probe;
        let name = bucket_name(&self.s.name, &request.key);
        let s = self.s.clone();
        self.jobs.spawn(async move {
            let lease = LeaseRequest::new(ask.want, ask.min);
            let sent = Instant::now();
            let result = unwinding(s.store.lease(&name, &s.quota, &lease)).await;
            let result = result.and_then(|reply| reply.within(&lease));
            Done::Lease {
                req: request,
                ask,
                sent,
                probe,
                holds_queue,
                result,
            }
        });
    }

    /// The lease to ask for, or `None` if a sync request was served meanwhile. Exact until the
    /// key has measured demand, then sized by the policy (see the module docs).
    fn size(&self, state: Option<&mut KeyState>, request: &Request<K>) -> Option<LeaseAsk> {
        let quota = &self.s.quota;
        let burst = quota.burst();
        // At least a waiter's own tokens (`min`), and for a refill (a denied `try_acquire`'s
        // or a low-water mark's) any: beyond that the lease is for the request and the largest
        // one denied meanwhile, whose retry needs them at once. A store with fewer serves the
        // smaller requests, as pure mode does, rather than refusing the key until the largest
        // fits — or, under a stored config whose burst it exceeds, answering a waiter
        // `ExceedsBurst` for another caller's request.
        let min = match request.reply {
            Some(_) => request.n.clamp(1, burst),
            None => 1,
        };
        let exact = |want: u64| LeaseAsk {
            want,
            min,
            low_water: 0,
        };
        let Some(state) = state else {
            return Some(exact(request.n.clamp(1, burst)));
        };
        let need = request.n.max(state.take_denied()).clamp(min, burst);
        let held = state.tokens();
        if request.reply.is_none() && held >= need && !state.below_low_water(held) {
            return None;
        }
        let demand = state.demand(self.now_ms());
        if demand <= 0.0 {
            return Some(exact(need));
        }
        let ask = self.s.policy.ask(&LeaseContext {
            quota: *quota,
            local: held,
            denied: need,
            demand,
            share: Some(quota.per_second_f64()),
            rtt: self.s.rtt(),
            rate_held: 0.0,
            horizon: None,
            leasers: 0,
            fleet: 0,
        });
        let want = ask.want.clamp(need, burst);
        Some(LeaseAsk {
            want,
            min,
            low_water: if want > need {
                ask.low_water.min(burst)
            } else {
                0
            },
        })
    }

    /// Answers `request` without a store call while the circuit is open: the key waits for
    /// the next probe, a waiting caller gets the last error.
    fn answer_failing(&mut self, request: Request<K>, now: Instant) {
        let until = self.probe_at.unwrap_or(now).max(now);
        if let Some(mut state) = self.s.map.get(&request.key) {
            state.block_until(self.ns_at(until), self.ns_at(now));
            if request.reply.is_none() {
                state.unqueue();
            }
        }
        match request.reply {
            Some(reply) => {
                let answer = match self.s.circuit.last_error() {
                    Some(e) => Answer::Failed(e),
                    None => Answer::Denied((until - now).max(MIN_RETRY)),
                };
                let _ = reply.send(answer);
            }
            None => self.resume_parked(&request.key, 1, None),
        }
    }

    /// Holds back a waiting caller's `request` until its key's queued lease is answered.
    fn park(&mut self, request: Request<K>) {
        self.parked
            .entry(request.key.clone())
            .or_default()
            .push(request);
    }

    /// `key`'s queued lease (of `min` tokens at least) was answered (its `QUEUED` flag
    /// cleared): answers the requests held back for it (`next_token`: when the store's next
    /// token comes, if that lease took its last).
    fn resume_parked(&mut self, key: &K, min: u64, next_token: Option<Duration>) {
        if self.parked.is_empty() {
            return;
        }
        for request in self.parked.remove(key).unwrap_or_default() {
            self.resume(request, min, next_token);
        }
    }

    /// Answers a request held back for its key's lease (of `min` tokens at least): from the
    /// key's tokens if it now holds enough, with the key's refusal if the store refused it (a
    /// request of `min` or more: the store may have fewer tokens, not none), with
    /// `next_token` (the wait for the store's next token) if that lease took the last, else
    /// by starting it (a lease of its own, or the failing store's answer).
    fn resume(&mut self, request: Request<K>, min: u64, next_token: Option<Duration>) {
        // The caller gave up meanwhile: nothing to answer, and nothing to lease for it.
        if request.reply.as_ref().is_none_or(|reply| reply.is_closed()) {
            return;
        }
        // The shard's lock is let go of before the caller is woken.
        let (took, refused) = match self.s.map.get(&request.key) {
            Some(mut state) => {
                if self.s.take_held(&mut state, request.n).is_some() {
                    (true, None)
                } else {
                    // The store's answer, not a back-off left by a failure (as in `miss`).
                    let refused = state.refused_for(self.s.now_ns());
                    let applies =
                        !refused.is_zero() && !self.s.circuit.is_open() && request.n >= min;
                    (false, applies.then_some(refused))
                }
            }
            None => (false, None),
        };
        if took {
            let told = request
                .reply
                .is_some_and(|reply| reply.send(Answer::Granted).is_ok());
            if !told {
                // It left after all: the tokens stay with the key (or go back if it is gone).
                let kept = self
                    .s
                    .map
                    .get(&request.key)
                    .map(|mut state| state.add(request.n));
                if kept.is_none() {
                    self.give_back(bucket_name(&self.s.name, &request.key), request.n);
                }
            }
            return;
        }
        match (refused.or(next_token), request.reply) {
            (Some(wait), Some(reply)) => {
                let _ = reply.send(Answer::Denied(wait));
            }
            (_, reply) => self.start(Request { reply, ..request }),
        }
    }

    /// Resumes held-back requests whose key has no lease queued any more without the worker
    /// having answered one (a caller whose queue was full clears the flag itself), and drops
    /// those whose caller gave up. Runs on every tick.
    fn recheck_parked(&mut self) {
        if self.parked.is_empty() {
            return;
        }
        let s = &self.s;
        let mut free = Vec::new();
        self.parked.retain(|key, requests| {
            requests.retain(|r| r.reply.as_ref().is_some_and(|reply| !reply.is_closed()));
            let queued = s
                .map
                .get(key)
                .is_some_and(|state| state.flags() & QUEUED != 0);
            if !requests.is_empty() && !queued {
                free.push(key.clone());
            }
            !requests.is_empty()
        });
        for key in free {
            self.resume_parked(&key, 1, None);
        }
    }

    fn ns_at(&self, at: Instant) -> u64 {
        self.s.origin.ns_at(at)
    }

    fn finish(&mut self, joined: Result<Done<K>, JoinError>) {
        // A job that panicked outside its store call (a store call's panic is its error, see
        // `unwinding`) is lost; so is its key's request flag, which keeps the key from
        // leasing or being evicted. The worker's own code does not panic.
        let Ok(done) = joined else {
            return;
        };
        let c = &self.s.counters;
        match done {
            Done::Release { tokens, result } => {
                self.releasing -= 1;
                match result {
                    Ok(_) => count(&c.tokens_released, tokens),
                    Err(error) => {
                        count(&c.store_errors, 1);
                        count(&c.tokens_lost, tokens);
                        let limiter = &self.s.name;
                        tracing::warn!(limiter, %error, tokens, "could not return tokens");
                    }
                }
            }
            Done::Lease {
                req,
                ask,
                sent,
                probe,
                holds_queue,
                result,
            } => self.leased(req, ask, sent, probe, holds_queue, result),
        }
    }

    /// Hands out what a lease brought: to the waiting caller first, the rest to the key (or
    /// back to the store if the key is gone).
    fn leased(
        &mut self,
        mut request: Request<K>,
        ask: LeaseAsk,
        sent: Instant,
        probe: bool,
        holds_queue: bool,
        result: Result<LeaseReply, StoreError>,
    ) {
        let s = self.s.clone();
        let c = &s.counters;
        let now = Instant::now();
        s.observe_rtt(now - sent, result.is_ok());
        s.metrics.lease_returned(now - sent);
        count(&c.leases, 1);
        if probe {
            self.probing = false;
        }
        // The key's state is looked up for each use rather than held: its shard's lock must
        // not be held while a waiter is woken. Only this worker evicts, so a key present at
        // one look is present at the next.
        // `(answer, block)`; a block on the store's own answer is a refusal (`refused`).
        let mut refused = false;
        let mut next_token = None;
        let (answer, block) = match result {
            Ok(reply) if reply.granted > 0 => {
                self.recovered();
                count(&c.tokens_leased, reply.granted);
                s.metrics.granted(reply.granted);
                // The waiter's share first (the grant is at least `min`, which is at least
                // its `n`); the rest is in the key before the waiter is told, so a caller
                // woken by the answer finds it.
                let waiting = request.reply.as_ref().is_some_and(|w| !w.is_closed());
                let to_waiter = if waiting {
                    request.n.min(reply.granted)
                } else {
                    0
                };
                let rest = reply.granted - to_waiter;
                let (now_ms, now_ns) = (self.now_ms(), self.ns_at(now));
                let kept = s
                    .map
                    .get(&request.key)
                    .map(|mut state| state.grant(rest, to_waiter, ask.low_water, now_ms, now_ns))
                    .is_some();
                if !kept && rest > 0 {
                    self.give_back(bucket_name(&s.name, &request.key), rest);
                }
                let told = request
                    .reply
                    .take()
                    .is_some_and(|w| w.send(Answer::Granted).is_ok());
                if to_waiter > 0 && !told {
                    // The waiter left meanwhile: its tokens stay with the key (or go back).
                    let kept = s
                        .map
                        .get(&request.key)
                        .map(|mut state| state.add(to_waiter));
                    if kept.is_none() {
                        self.give_back(bucket_name(&s.name, &request.key), to_waiter);
                    }
                }
                // A grant of a one-token minimum that emptied the bucket says when the next
                // token comes: the key's waiters held back for this lease are told so, not
                // sent to the store, which would refuse each of them. (A larger minimum's
                // wait would hold smaller requests back longer than the store would; and the
                // key itself is not blocked: a batch that emptied the bucket is no sign that
                // the key is at its limit.)
                next_token =
                    (ask.min == 1 && !reply.retry_after.is_zero()).then_some(reply.retry_after);
                (None, None)
            }
            Ok(reply) => {
                self.recovered();
                count(&c.over_limit, 1);
                refused = true;
                if reply.retry_after.is_zero() && ask.min > reply.quota.burst() {
                    // A waiter's own request beyond a stored config's burst: its error, and
                    // nothing the key's other callers wait for.
                    (Some(Answer::TooLarge(reply.quota.burst())), None)
                } else {
                    let wait = reply.retry_after.max(MIN_RETRY);
                    (Some(Answer::Denied(wait)), Some(time::after(now, wait)))
                }
            }
            Err(error) => {
                tracing::debug!(limiter = %s.name, %error, "lease failed; backing off");
                s.fail(error.clone());
                let wait = self.backoff.after(&error, &mut self.rng);
                self.probe_at = Some(now + wait);
                // An error that is no outage (an ACL denial, a bad reply) is the store's own
                // answer and leaves the circuit closed: its back-off is kept as a refusal, or
                // the key's callers would ask again at once (see `Shared::miss`).
                refused = !error.is_outage();
                (Some(Answer::Failed(error)), Some(now + wait))
            }
        };
        if block.is_some() || holds_queue {
            if let Some(mut state) = s.map.get(&request.key) {
                let now_ns = self.ns_at(now);
                match block {
                    Some(until) if refused => state.refuse_until(self.ns_at(until), now_ns),
                    Some(until) => state.block_until(self.ns_at(until), now_ns),
                    None => {}
                }
                if holds_queue {
                    state.unqueue();
                }
            }
        }
        if let (Some(answer), Some(waiter)) = (answer, request.reply) {
            let _ = waiter.send(answer);
        }
        if holds_queue {
            self.resume_parked(&request.key, ask.min, next_token);
        }
    }

    /// A lease call succeeded: close the circuit, reset the back-off.
    fn recovered(&mut self) {
        self.s.circuit.recovered(&self.s.name);
        self.backoff.reset();
        self.probe_at = None;
    }

    /// Queues `tokens` of bucket `name` for release: leased tokens that no caller got.
    fn give_back(&mut self, name: String, tokens: u64) {
        // Relaxed: a statistic, written by this task only and read by its metrics publisher
        // between the worker's polls.
        count(&self.s.counters.returned, tokens);
        self.releases.push_back((name, tokens));
    }

    /// Starts queued releases while there is room.
    fn start_releases(&mut self) {
        let most = (self.s.max_in_flight / 2).max(1);
        while self.releasing < most && self.jobs.len() < self.s.max_in_flight {
            let Some((name, tokens)) = self.releases.pop_front() else {
                // Drained: a sweep that evicted a flood of keys queued a release for each, and
                // the queue would keep room for them all.
                if self.releases.capacity() > MAX_RELEASE_BACKLOG {
                    self.releases.shrink_to(MAX_RELEASE_BACKLOG);
                }
                return;
            };
            count(&self.s.counters.releases, 1);
            self.releasing += 1;
            let s = self.s.clone();
            self.jobs.spawn(async move {
                let release = ReleaseRequest::new(tokens);
                let result = unwinding(s.store.release(&name, &s.quota, &release)).await;
                Done::Release { tokens, result }
            });
        }
    }

    /// Shutdown: answer what is held back or queued, finish what is in flight, give every
    /// token back.
    async fn close(mut self, requests: Requests<K>) {
        for (_, held) in self.parked.drain() {
            for request in held {
                if let Some(reply) = request.reply {
                    let _ = reply.send(Answer::Closed);
                }
            }
        }
        for mut queue in [requests.known, requests.fresh] {
            queue.close();
            while let Some(request) = queue.recv().await {
                if let Some(reply) = request.reply {
                    let _ = reply.send(Answer::Closed);
                }
            }
        }
        while let Some(done) = self.jobs.join_next().await {
            self.finish(done);
        }
        let mut held = Vec::new();
        self.s.map.for_each(|key, state| {
            let tokens = state.take_all();
            if tokens > 0 {
                held.push((bucket_name(&self.s.name, key), tokens));
            }
        });
        for (name, tokens) in held {
            self.give_back(name, tokens);
        }
        self.s.map.clear();
        self.s.fallback_words.clear();
        self.s.live.store(0, Ordering::Relaxed);
        loop {
            self.start_releases();
            match self.jobs.join_next().await {
                Some(done) => self.finish(done),
                None => break,
            }
        }
    }
}
