//! The background task of a [`ConcurrencyLimiter`](super::ConcurrencyLimiter): every store
//! call that is not a pure-mode acquire.
//!
//! **Pure mode.** Callers send their own acquires. The task sends one release for all the
//! permits dropped since the last one, and renews the holder's record every third of the ttl
//! with a *sync*: the count the holder really holds. Counting must not race an acquire in
//! flight, whose outcome is not known yet, so the task closes a gate (new acquires wait),
//! waits for the acquires in flight to end (within the response timeout), reads the last
//! acquire number `A` and the claimed count (permits held, plus dropped ones not yet
//! released), sends the sync, and opens the gate. Every acquire numbered up to `A` has ended,
//! so the count is exact; none numbered above `A` is sent before the sync is answered; and a
//! sync that arrives late anyway is refused by the store if an acquire numbered above `A` was
//! applied first. Releases numbered up to the sync's are ignored afterwards, so nothing is
//! subtracted twice. Slots of calls whose replies were lost (timeouts, dropped connections,
//! cancelled futures) are thus counted right again by the next sync; only a lost call that
//! reaches Redis after the sync (it was still queued) can leak, until the sync after that —
//! or, where the holder then holds nothing (no record, so no later sync), until its record
//! expires, one ttl later.
//!
//! **Hybrid mode.** The task makes every store call, one at a time, so its own tally of leased
//! slots is exact: it leases when callers ask (a denial, or the pool below a quarter batch),
//! gives back the pool above one batch (or what a reply showed above the limit, after lost
//! state was registered again) and the whole pool once nobody has held a permit for
//! the idle time, and syncs its tally every third of the ttl. If no renewal has succeeded for
//! 90 % of the ttl, the pool is marked stale (not handed out) until one does.
//!
//! Over-full fleets and store errors back off (1 ms to 50 ms, and 10 ms to 500 ms — from twice
//! the timeout after a timeout — jittered);
//! the failure policy answers as for the rate limiters (`crate::failure`). The circuit is
//! the hybrid mode's: in pure mode every caller makes its own call to a failing store (and
//! waits out its own timeout) — there is no one-probe-at-a-time gate as in a
//! [`RedisLimiter`](crate::RedisLimiter).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::holders::{Op, Reply};
use super::limiter::{Shared, MAX_POLL, MIN_POLL};
use super::store::ConcurrencyStore;
use crate::error::StoreError;
use crate::lease::refill::Wake;
use crate::retry::{Backoff, ERROR_BACKOFF_MIN};
use crate::store::unwinding;
use crate::time;
use crate::time::micros;

/// Runs until the limiter closes, then gives back what it can.
pub(crate) async fn run<S: ConcurrencyStore>(s: Arc<Shared<S>>) {
    let mut task = Task {
        renew_every: s.ttl / 3,
        next_sync: Instant::now() + s.ttl / 3,
        retry_at: Instant::now(),
        backoff: Backoff::for_errors(),
        full_backoff: Backoff::new(MIN_POLL, MAX_POLL),
        rseq: 0,
        aseq: 0,
        leased: 0,
        registered: false,
        renewed_at: None,
        idle_since: None,
        excess: 0,
        hold_for: 0,
        rng: fastrand::Rng::new(),
    };
    loop {
        let wake = s.local.signal.wait_until(Some(task.next_timer(&s))).await;
        if wake == Wake::Closed {
            break;
        }
        if s.local.hybrid {
            task.hybrid_step(&s).await;
        } else {
            task.pure_step(&s).await;
        }
    }
    // Closing: give back what no permit holds, and renew what permits still hold one last
    // time (a count of 0 deletes the record). A stale pool is never handed out again.
    s.local.stale.store(true, Ordering::SeqCst);
    if s.local.hybrid {
        let pooled = s.local.pool.swap(0, Ordering::SeqCst);
        task.give_back(&s, pooled).await;
    } else {
        task.release_pending(&s).await;
    }
    task.sync(&s).await;
}

/// The task's own state.
struct Task {
    renew_every: Duration,
    next_sync: Instant,
    /// No store call before this after an error or a full fleet (hybrid leases, repairs).
    retry_at: Instant,
    backoff: Backoff,
    full_backoff: Backoff,
    /// The last release sequence number sent.
    rseq: u64,
    /// Hybrid: the last acquire sequence number sent.
    aseq: u64,
    /// Hybrid: slots leased, in the pool or in permits.
    leased: u64,
    /// The store may hold a record for this holder.
    registered: bool,
    /// Hybrid: when the last successful renewal (lease or sync) was sent.
    renewed_at: Option<Instant>,
    /// Hybrid: since when no permit has been held while slots sat in the pool.
    idle_since: Option<Instant>,
    /// Hybrid: slots held across the fleet above the limit, at the last reply (after lost
    /// state was registered again); given back from the pool first.
    excess: u64,
    /// The largest request the last lease was for: the pool keeps that many, not only one
    /// batch, until the caller has taken them (see `give_back_unused`).
    hold_for: u64,
    rng: fastrand::Rng,
}

impl Task {
    fn next_timer<S>(&self, s: &Shared<S>) -> Instant {
        let mut at = self.next_sync;
        if s.dirty.load(Ordering::SeqCst) {
            at = at.min(self.retry_at);
        }
        if s.local.hybrid {
            if s.local.pool.load(Ordering::SeqCst) > 0 {
                at = at.min(time::from_now(s.idle_return / 2));
            }
            if let Some(deadline) = self.stale_at(s) {
                // Once stale, failed renewals are retried through `dirty` and `retry_at`.
                if !s.local.stale.load(Ordering::SeqCst) {
                    at = at.min(deadline);
                }
            }
        }
        at
    }

    /// Hybrid: when the pool stops being handed out, unless renewed first.
    fn stale_at<S>(&self, s: &Shared<S>) -> Option<Instant> {
        match (self.leased, self.renewed_at) {
            (0, _) | (_, None) => None,
            (_, Some(at)) => Some(time::after(at, s.ttl.mul_f64(0.9))),
        }
    }

    fn due<S>(&self, s: &Shared<S>, now: Instant) -> bool {
        now >= self.next_sync || (s.dirty.load(Ordering::SeqCst) && now >= self.retry_at)
    }

    async fn pure_step<S: ConcurrencyStore>(&mut self, s: &Shared<S>) {
        // Lowered before `pending` is read: a drop after this wakes the task again.
        s.local.signal.done();
        self.release_pending(s).await;
        if self.due(s, Instant::now()) {
            self.sync(s).await;
        }
    }

    /// Pure: one release for every permit dropped since the last one.
    async fn release_pending<S: ConcurrencyStore>(&mut self, s: &Shared<S>) {
        let n = s.local.pending.swap(0, Ordering::SeqCst);
        if n == 0 {
            return;
        }
        // Not claimed any more: a sync counted from now on leaves them out, and the release
        // number below keeps this release from being applied after such a sync.
        s.claimed.fetch_sub(n, Ordering::SeqCst);
        self.release(s, n).await;
        s.local.wake.notify_waiters();
    }

    /// Gives `n` slots back to the store (pure: from dropped permits; hybrid: from the pool).
    async fn release<S: ConcurrencyStore>(&mut self, s: &Shared<S>, n: u64) {
        self.rseq += 1;
        // Relaxed: see `Shared::try_store`.
        s.rseq_sent.store(self.rseq, Ordering::Relaxed);
        let op = Op::Release {
            holder: &s.holder,
            n,
            rseq: self.rseq,
        };
        s.counters.releases.fetch_add(1, Ordering::Relaxed);
        if let Err(error) = self.call(s, &op).await {
            tracing::debug!(limiter = %s.name, %error, n, "release failed; the next sync repairs");
            s.suspect();
        }
    }

    /// Renews the record with the holder's true count (0: unregisters). Pure mode closes the
    /// gate while counting (module docs).
    async fn sync<S: ConcurrencyStore>(&mut self, s: &Shared<S>) {
        let now = Instant::now();
        self.next_sync = now + self.renew_every;
        // Repairs (dirty syncs) at most every 10 ms.
        self.retry_at = self.retry_at.max(now + ERROR_BACKOFF_MIN);
        // Cleared before counting: whatever goes wrong from here on sets it again.
        let dirty = s.dirty.swap(false, Ordering::SeqCst);
        let (count, aseq) = if s.local.hybrid {
            (self.leased, self.aseq)
        } else {
            s.gate.store(true, Ordering::SeqCst);
            // Every acquire sent before the gate closed ends (within the response timeout);
            // then `claimed` is what the holder really holds.
            let drain = async {
                loop {
                    let drained = s.drained.notified();
                    if s.in_flight.load(Ordering::SeqCst) == 0 {
                        break;
                    }
                    drained.await;
                }
            };
            match tokio::time::timeout(s.ttl / 6, drain).await {
                Ok(()) => (
                    s.claimed.load(Ordering::SeqCst),
                    s.aseq.load(Ordering::SeqCst),
                ),
                Err(_) => {
                    // A call in flight that is never polled again: renew without counting (a
                    // record that saw any acquire refuses a sync numbered 0), repair later.
                    s.dirty.store(true, Ordering::SeqCst);
                    (s.claimed.load(Ordering::SeqCst), 0)
                }
            }
        };
        let touched = s.touched.swap(false, Ordering::SeqCst);
        if count == 0 && !touched && !dirty && !self.registered {
            self.open_gate(s);
            return;
        }
        let op = Op::Sync {
            holder: &s.holder,
            count,
            ttl_us: micros(s.ttl),
            aseq,
            rseq: self.rseq,
        };
        s.counters.syncs.fetch_add(1, Ordering::Relaxed);
        let result = self.call(s, &op).await;
        self.open_gate(s);
        match result {
            Ok(reply) if reply.granted == 1 => {
                self.registered = count > 0;
                self.renewed(s, now);
            }
            Ok(_) => {
                // Renewed, but an acquire the count missed got there first: count again soon.
                self.renewed(s, now);
                self.registered = true;
                s.suspect();
            }
            Err(_) => {
                self.registered = true;
                s.suspect();
            }
        }
    }

    fn open_gate<S>(&self, s: &Shared<S>) {
        if !s.local.hybrid {
            s.gate.store(false, Ordering::SeqCst);
            s.gate_open.notify_waiters();
        }
    }

    /// A renewal sent at `sent` succeeded.
    fn renewed<S>(&mut self, s: &Shared<S>, sent: Instant) {
        self.renewed_at = Some(sent);
        // A closing limiter's pool stays stale: it is never handed out again.
        if !s.local.signal.is_closed() && s.local.stale.swap(false, Ordering::SeqCst) {
            s.local.wake_waiters();
        }
    }

    /// One store call, with the circuit and the back-off after errors.
    async fn call<S: ConcurrencyStore>(
        &mut self,
        s: &Shared<S>,
        op: &Op<'_>,
    ) -> Result<Reply, StoreError> {
        let result = unwinding(s.store.concurrency(&s.name, op)).await;
        match &result {
            Ok(reply) => {
                self.excess = reply.in_use.saturating_sub(s.limit);
                s.recovered();
                self.backoff.reset();
            }
            Err(error) => {
                s.fail(error.clone());
                let wait = self.backoff.after(error, &mut self.rng);
                self.retry_at = Instant::now() + wait;
            }
        }
        result
    }

    async fn hybrid_step<S: ConcurrencyStore>(&mut self, s: &Shared<S>) {
        let now = Instant::now();
        if self.stale_at(s).is_some_and(|at| now >= at) && !s.local.stale.load(Ordering::SeqCst) {
            tracing::warn!(limiter = %s.name, "no renewal for 90 % of the ttl: pool not handed out");
            s.local.stale.store(true, Ordering::SeqCst);
        }
        if s.local.signal.is_requested() {
            if now >= self.retry_at {
                self.lease(s).await;
            } else {
                // Backing off: wait, then look again (a drop may have refilled the pool), but
                // not past the moment the pool goes stale.
                let mut until = self.retry_at;
                if let Some(stale_at) = self.stale_at(s) {
                    if !s.local.stale.load(Ordering::SeqCst) {
                        until = until.min(stale_at);
                    }
                }
                let _ = s
                    .local
                    .signal
                    .unless_closed(tokio::time::sleep_until(until))
                    .await;
            }
        }
        if self.due(s, Instant::now())
            || (s.local.stale.load(Ordering::SeqCst) && now >= self.retry_at)
        {
            self.sync(s).await;
        }
        self.give_back_unused(s, Instant::now()).await;
    }

    /// Hybrid: leases slots for the callers that asked, unless the pool can serve them (or
    /// this holder has the whole limit already).
    async fn lease<S: ConcurrencyStore>(&mut self, s: &Shared<S>) {
        let l = &s.local;
        let denied = l.signal.take_denied();
        self.hold_for = denied;
        let pooled = l.pool.load(Ordering::SeqCst);
        let stale = l.stale.load(Ordering::SeqCst);
        if stale {
            // Renew first: a stale pool is useless until the store counts it again.
            self.sync(s).await;
        } else if pooled < denied.max(s.low_water.max(1)) && self.leased < s.limit {
            // The pooled slots count in this holder's total already: a caller denied `denied`
            // needs the rest (asking for all of them again was refused while the store had
            // the rest to give: one permit out of a batch of 8 on a limit of 10, a caller of 8
            // waited forever).
            let min = denied.saturating_sub(pooled).max(1);
            let want = s.batch.saturating_sub(pooled).max(min);
            self.aseq += 1;
            let op = Op::Acquire {
                holder: &s.holder,
                want,
                min,
                limit: s.limit,
                ttl_us: micros(s.ttl),
                aseq: self.aseq,
                rseq: self.rseq,
            };
            s.counters.acquires.fetch_add(1, Ordering::Relaxed);
            let sent = Instant::now();
            match self.call(s, &op).await {
                Ok(reply) => {
                    let lost = !reply.existed && self.leased > 0;
                    self.registered = true;
                    if lost {
                        // The record that counted the earlier slots is gone: count them again
                        // (the sync below) before handing anything more out.
                        l.stale.store(true, Ordering::SeqCst);
                    }
                    if reply.granted > 0 {
                        s.counters
                            .granted
                            .fetch_add(reply.granted, Ordering::Relaxed);
                        self.leased += reply.granted;
                        s.leased.store(self.leased, Ordering::Relaxed);
                        l.pool.fetch_add(reply.granted, Ordering::SeqCst);
                        l.wake.notify_waiters();
                        self.full_backoff.reset();
                    } else {
                        s.counters.full.fetch_add(1, Ordering::Relaxed);
                        let wait = self.full_backoff.next(&mut self.rng);
                        self.retry_at = Instant::now() + wait;
                    }
                    if lost {
                        self.sync(s).await;
                    } else if self.leased > 0 {
                        self.renewed(s, sent);
                    }
                }
                Err(_) => {
                    s.suspect();
                    // Waiters under `FailClosed` answer with the error.
                    l.wake.notify_waiters();
                }
            }
        }
        l.signal.done();
        // A denial after `take_denied` above, seen once the flag is down (as in `crate::lease::refill`).
        if l.signal.was_denied() {
            l.signal.request();
        }
    }

    /// Hybrid: the pool above one batch, or above the request the last lease was for if larger
    /// (or above what the fleet holds beyond the limit, after lost state), goes back at once;
    /// the whole pool once no permit has been held for the idle time. (Trimmed to one batch
    /// before its caller ran, a lease for a request of more than a batch went back at once,
    /// and the caller, denied again, had it leased again: a store call each way, until a
    /// renewal let the caller in.)
    async fn give_back_unused<S: ConcurrencyStore>(&mut self, s: &Shared<S>, now: Instant) {
        let l = &s.local;
        let pooled = l.pool.load(Ordering::SeqCst);
        let keep = s.batch.max(self.hold_for);
        let above = (pooled.saturating_sub(keep)).max(self.excess.min(pooled));
        if above > 0 {
            self.excess = 0;
            let n = l.take_up_to(above);
            self.give_back(s, n).await;
            return;
        }
        if pooled == 0 || self.leased > pooled {
            self.idle_since = None;
            return;
        }
        match self.idle_since {
            None => self.idle_since = Some(now),
            Some(since) if now >= time::after(since, s.idle_return) => {
                self.idle_since = None;
                let n = l.take_up_to(pooled);
                self.give_back(s, n).await;
            }
            Some(_) => {}
        }
    }

    /// Hybrid: returns `n` slots taken from the pool.
    async fn give_back<S: ConcurrencyStore>(&mut self, s: &Shared<S>, n: u64) {
        if n == 0 {
            return;
        }
        // Gone from the tally whatever the outcome: if the release is lost, the store counts
        // them until the next sync sets the count.
        self.leased -= n;
        s.leased.store(self.leased, Ordering::Relaxed);
        self.release(s, n).await;
        if self.leased == 0 && !s.dirty.load(Ordering::SeqCst) {
            // A record at 0 is deleted by the release.
            self.registered = false;
        }
    }
}
