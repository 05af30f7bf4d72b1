//! The background task: one lease at a time, and what the node does with each reply.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::algorithm::token_bucket::QuotaSource;
use crate::algorithm::Algorithm;
use crate::config::Unconfigured;
use crate::lease::demand::{DemandEstimator, RecentRate};
use crate::lease::drip::Drip;
use crate::lease::policy::{tight, CallContext, LeaseContext, LeaseTerms};
use crate::lease::rate_ask::rate_ask;
use crate::lease::refill::Wake;
use crate::quota::{Quota, MAX_VALUE};
use crate::retry::{jitter, Backoff, MIN_RETRY};
use crate::store::{
    unwinding, LeaseReply, LeaseRequest, LeaseStore, NodeLease, NodeRelease, ReleaseRequest,
};
use crate::time;

use super::shared::{not_denied_per_request, spurious, Shared};
use super::{WINDOW_JITTER, WINDOW_MARGIN};

mod rate_lease;

/// The background task: one lease at a time, for as long as the limiter lives.
pub(super) async fn refill_loop<S: LeaseStore>(
    s: Arc<Shared<S>>,
    rng: fastrand::Rng,
    quota: Quota,
    terms: Option<LeaseTerms>,
) {
    let mut task = Task {
        quota,
        terms,
        rng,
        backoff: Backoff::for_errors(),
        demand: DemandEstimator::new(DEMAND_TAU, Instant::now()),
        slow_demand: DemandEstimator::new(PER_REQUEST_TAU, Instant::now()),
        recent: RecentRate::new(),
        share: None,
        leasers: 0,
        fleet: 0,
        fallback_share_mtps: 0,
        release_seq: 0,
        expires: None,
        window: None,
        review_at: None,
        granted_at: None,
        drip: Drip::default(),
        counted: 0,
        sent_at: None,
        early_gap: Duration::ZERO,
        started: Instant::now(),
        per_request_review: None,
        misses_seen: (0, 0),
        sync_callers: false,
    };
    loop {
        match s.signal.wait_until(task.next_timer(&s)).await {
            Wake::Closed => break,
            Wake::Requested | Wake::Timer => {}
        }
        let now = Instant::now();
        task.observe(&s, now);
        task.review_per_request(&s, now);
        if task.counted_but_spent(&s, now) {
            // Every token the store counts lowers the bucket's ceiling: ten nodes sharing a
            // burst of 10, nine deciding per request with their spent first lease still
            // counted, admitted a tenth of their first second.
            task.give_back(&s, true).await;
        }
        task.expire(&s, now).await;
        task.trim(&s, now).await;
        task.add_drip(&s, now);
        let renew = task.rate_call_due().is_some_and(|at| now >= at);
        if !s.signal.is_requested() && !renew {
            task.give_back_if_idle(&s, now).await;
            continue;
        }
        if !renew && (spurious(&s) || not_denied_per_request(&s)) {
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

/// A pause on the store's answer ends once callers, some of them denied, ask at more than
/// this many times the rate it was for (see `Task::pause`): a node told, at a share of a token
/// a second, to come back in a second for its next token was blind through the second its
/// demand rose to 4 000 a second (1 000 nodes each busy one second in twenty, under a tight
/// burst: the worst nodes admitted 0.2 % of their requests with horizons stretched for small
/// shares; bursty-fleet: Jain 0.9867 → 0.9994). The rate an answer was for follows the demand
/// estimate (a 300 ms time constant), so a step of demand makes a few early calls (until the
/// estimate reaches a quarter of it, about 90 ms) and a steady demand none.
const SURGE: f64 = 4.0;

/// How often a pause on the store's answer looks for a surge (see [`SURGE`]).
const SURGE_LOOK: Duration = Duration::from_millis(20);

/// Time constant of the demand estimate.
const DEMAND_TAU: Duration = Duration::from_millis(300);
/// Time constant of the demand whether leasing pays is decided on.
const PER_REQUEST_TAU: Duration = Duration::from_secs(1);
/// The last interval's demand counts for sizing for two horizons after it was measured, and
/// at least this long.
const RECENT_MAX_AGE: Duration = Duration::from_millis(20);

/// The background task's own state.
struct Task {
    /// The effective quota (the task owns it; see the module docs).
    quota: Quota,
    /// The policy's terms for `quota`.
    terms: Option<LeaseTerms>,
    rng: fastrand::Rng,
    backoff: Backoff,
    demand: DemandEstimator,
    /// The demand over a longer time constant: whether leasing pays is decided on it (a few
    /// tokens a second are mostly noise over `DEMAND_TAU`).
    slow_demand: DemandEstimator,
    /// Demand between the last two leases: follows a ramp within a lease, where `demand` lags
    /// by its time constant (see `sizing_demand`).
    recent: RecentRate,
    /// Fair share the store last reported, tokens per second.
    share: Option<f64>,
    /// Claimants of the bucket (nodes holding a lease, and the anonymous callers as one), as
    /// the store last reported (0: not known).
    leasers: u64,
    /// The most claimants the store has reported (see `LeaseContext::fleet`). It never
    /// falls: nodes that decide per request count as one claimant together, so a count that
    /// fell would let them leave the regime a few at a time. A fleet that shrank (or doubled for
    /// a rolling restart's overlap) keeps deciding per request where its old size would
    /// have: exact decisions, the safe side.
    fleet: u64,
    /// The last non-zero share, millitokens per second, that the fallback of
    /// [`LastKnownShare`](crate::FailurePolicy::LastKnownShare) enforces (0 until one is known).
    fallback_share_mtps: u64,
    /// The seq of the last release sent (0: none): the next release's is one more, and every
    /// lease carries it (`NodeLease::release_seq`), so a release the store runs after that
    /// lease is ignored — its tokens left `held` before it was sent.
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
    /// The rate lease's drip (see `lease/drip.rs`).
    drip: Drip,
    /// Tokens the store counts for this node (what it reported holding at its last call plus
    /// the grant, less what it returned since): while it holds a rate, its own bucket, which
    /// the drip fills up to this less the slack (see `lease/drip.rs`).
    counted: u64,
    /// When the last lease call was sent.
    sent_at: Option<Instant>,
    /// How long after a call an early renewal comes (see `renew_due`): a quarter horizon, and
    /// twice as long after each early renewal that did not raise the rate (the store had no
    /// more to give), up to the regular renewal.
    early_gap: Duration,
    /// When the task started: the regime is decided on a demand measured for a while.
    started: Instant,
    /// While a miss is a decision in the store: when to look at the demand again (the task
    /// is not woken by those misses).
    per_request_review: Option<Instant>,
    /// Misses of `try_acquire`, and of the calls that can decide in the store, as of the last
    /// review of the regime.
    misses_seen: (u64, u64),
    /// Whether most misses since the regime was last reviewed with any were `try_acquire`'s.
    /// Those cannot decide in the store: deciding per request, such a node leases on each
    /// denial and spends what one lease brings, and its callers got less than leasing gives
    /// them (ten nodes sharing 2 000/s with a burst of 10, asked evenly at 2× it with
    /// `try_acquire`: 0.60 of the budget deciding per request, 0.69 leasing; twenty sharing
    /// 20/s: 0.85 and 0.90; the simulator's tiny-burst and low-rate, SIMULATIONS.md "Asked with
    /// `try_acquire`": 0.42 → 0.45 and 0.85 → 0.88). So such a node does not decide per
    /// request.
    sync_callers: bool,
}

impl Task {
    /// Tokens spent so far (see [`Shared::spent`]).
    fn consumed<S>(s: &Shared<S>) -> u64 {
        s.spent(s.local.available())
    }

    /// Tokens asked for so far, admitted or denied: the running total demand is measured on.
    fn demanded<S>(s: &Shared<S>) -> u64 {
        // Relaxed: statistics (see `Shared::denied`).
        Self::consumed(s)
            + s.denied_total.load(Ordering::Relaxed)
            + s.counters.decided.load(Ordering::Relaxed)
    }

    fn observe<S>(&mut self, s: &Shared<S>, now: Instant) {
        let demanded = Self::demanded(s);
        let rate = self.demand.observe(now, demanded);
        self.slow_demand.observe(now, demanded);
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
        time::after(since, terms.idle_after.max(gaps))
    }

    fn next_timer<S>(&self, s: &Shared<S>) -> Option<Instant> {
        let local = s.local.available();
        // The rate lease's drips, full bucket or not (callers spend it without waking the
        // task, and a drip covers one step at most), and its renewal; the next look at the
        // demand while misses are decisions in the store.
        let rate = [
            self.drip.due(),
            self.rate_call_due(),
            self.per_request_review,
        ]
        .into_iter()
        .flatten()
        .min();
        if local == 0 {
            // Nothing to expire or give back; a caller's denial wakes the task too.
            return rate;
        }
        let idle = self.terms.as_ref().map(|t| self.idle_at(t));
        [self.expires, idle, self.review_at, rate]
            .into_iter()
            .flatten()
            .min()
    }

    /// Decides whether leasing buys nothing now (the policy's
    /// [`per_request`](crate::LeasePolicy::per_request)) on the slow demand estimate — or,
    /// until that has run for its time constant, on nothing measured (the policy then goes by
    /// the share alone); it leaves on either estimate (the fast one discounted) — before that,
    /// on what it was asked so far over the whole time constant. While it decides per request,
    /// misses in `acquire_now` are decisions in the store and the task leases only on a
    /// denial of `try_acquire`. Leaving, it leases at once.
    fn review_per_request<S: LeaseStore>(&mut self, s: &Shared<S>, now: Instant) {
        // Relaxed: a state flag only the task writes; callers read it as a hint.
        let was = s.per_request.load(Ordering::Relaxed);
        let mut ctx = self.context(s, 0);
        let young = now < self.started + PER_REQUEST_TAU;
        ctx.demand = if was && young {
            // Until the slow estimate has run its time constant it is its first samples (a
            // request or two in a few milliseconds read as a hundred a second): the node
            // leaves on what it was asked so far over the whole constant. Leaving on them,
            // nodes of 20 sharing 20/s flapped through their first seconds, leasing with
            // seconds-long waits for credit (seed 5: 0.9754 of the budget, pure-Redis 0.9992).
            Self::demanded(s) as f64 / PER_REQUEST_TAU.as_secs_f64()
        } else if was {
            // Leaving on the slow estimate, or on a quarter of the fast one: noisy at a few
            // tokens a second, it shows a burst within tens of milliseconds.
            self.slow_demand.rate().max(self.demand.rate() / 4.0)
        } else if !young {
            self.slow_demand.rate()
        } else {
            0.0
        };
        // Relaxed: statistics; a miss read late is counted at the next review.
        let c = &s.counters;
        let seen = (
            c.sync_misses.load(Ordering::Relaxed),
            c.async_misses.load(Ordering::Relaxed) + c.decisions.load(Ordering::Relaxed),
        );
        let (sync, other) = (seen.0 - self.misses_seen.0, seen.1 - self.misses_seen.1);
        self.misses_seen = seen;
        if sync + other > 0 {
            self.sync_callers = sync > other;
        }
        let is = !self.sync_callers && s.policy.per_request(&ctx, was);
        if is != was {
            s.per_request.store(is, Ordering::Relaxed);
            if is {
                // No lease comes now, the first included: a caller of `ready` (which checks
                // the flag after it starts waiting) waits for none.
                s.finished.notify_waiters();
            } else {
                s.signal.request();
            }
        }
        self.per_request_review = is.then(|| now + self.per_request_look());
    }

    /// How often a node deciding per request looks at its demand again.
    fn per_request_look(&self) -> Duration {
        self.terms
            .map_or(RECENT_MAX_AGE, |t| review_after(t.horizon))
    }

    /// Whether the store counts tokens for this node that it no longer holds while it decides
    /// per request: it calls the store for no lease then (a denial of `try_acquire` aside), so
    /// what it spent would stay counted until the lease expired. Not while it holds a rate
    /// (its bucket is kept a step below what is counted), nor within a look of its last call
    /// (a node that leases on `try_acquire`'s denials would otherwise give back after every
    /// lease, two calls for one).
    fn counted_but_spent<S: LeaseStore>(&self, s: &Shared<S>, now: Instant) -> bool {
        s.decides_per_request()
            && self.drip.rate_mtps() == 0
            && self.expires.is_some()
            && self
                .sent_at
                .is_none_or(|at| now >= at + self.per_request_look())
            && self.counted > s.local.settled()
    }

    /// Gives the local tokens back once their lease has (nearly) expired: the store forgets
    /// them at expiry, so spending them later could exceed the fleet's bound. They are taken
    /// from the local bucket before the call, so none is spent meanwhile; if the call fails
    /// they count as expired.
    async fn expire<S: LeaseStore>(&mut self, s: &Shared<S>, now: Instant) {
        if self.expires.is_some_and(|at| now >= at) {
            if s.algorithm == Algorithm::FixedWindow {
                self.lapse(s);
            } else {
                self.give_back(s, true).await;
            }
        }
    }

    /// The terms leases are made on: the policy's, under the token bucket only.
    fn node_terms<S>(&self, s: &Shared<S>) -> Option<LeaseTerms> {
        self.terms.filter(|_| s.algorithm == Algorithm::TokenBucket)
    }

    /// The terms of the next call: [`node_terms`](Self::node_terms) as the policy adjusts them
    /// for the share the store last reported (a small share leases for longer; nothing before
    /// the first reply).
    fn call_terms<S>(&self, s: &Shared<S>) -> Option<LeaseTerms> {
        let call = CallContext::new(self.quota, self.share)
            .with_leasers(self.leasers)
            .with_fleet(self.fleet)
            .with_demand(self.demand.rate());
        self.node_terms(s)
            .map(|t| s.policy.terms_at(t, &call).sendable())
    }

    /// The local tokens' lease has reached its local expiry (under the fixed window, their
    /// window has ended or is about to) where no release can go: they are gone, with no store
    /// call, and a rate held ends with them. Under the fixed window a release to an ended
    /// window gives nothing back; while a lease call is in flight, the store may run it after
    /// its own expiry of the lease, so the tokens the call reports held may already be back in
    /// the shared bucket (if it runs sooner, they stay counted for this node until its next
    /// call reports them gone: the safe side).
    fn lapse<S>(&mut self, s: &Shared<S>) {
        let tokens = s.local.take_all();
        s.counters
            .tokens_expired
            .fetch_add(tokens, Ordering::Relaxed);
        self.end_rate(s);
        self.counted = 0;
        self.expires = None;
        self.window = None;
    }

    /// Sleeps until `deadline`. Callers keep spending the local tokens meanwhile, so they go on
    /// the way if they expire first (see [`expire`](Self::expire): dropped with their window
    /// under the fixed window, given back otherwise); a rate lease keeps dripping.
    ///
    /// A pause on the store's own answer (`surge_above`: the larger of the share it told and
    /// this node's demand estimate, tokens per second) ends early once callers, some of them
    /// denied, ask at more than [`SURGE`] times that (over the interval under way, see
    /// `RecentRate::peek`): the answer was for a demand that is gone. A rated node's wait for
    /// its renewal ends so too.
    async fn pause<S: LeaseStore>(
        &mut self,
        s: &Shared<S>,
        deadline: Instant,
        surge_above: Option<f64>,
    ) {
        let mut look = surge_above.map(|_| Instant::now() + SURGE_LOOK);
        loop {
            let drip = self.drip.due().filter(|&due| due < deadline);
            // The local tokens go at their expiry, paused or not (see `expire`): a pause on a
            // refusal can last seconds, and the store forgets them at their ttl.
            let expiry = self.expires.filter(|&end| end < deadline);
            let Some(next) = [drip, look.filter(|&at| at < deadline), expiry]
                .into_iter()
                .flatten()
                .min()
            else {
                break;
            };
            tokio::time::sleep_until(next).await;
            let now = Instant::now();
            if expiry.is_some_and(|end| now >= end) {
                self.expire(s, now).await;
            }
            if let (Some(above), Some(at)) = (surge_above, look) {
                if now >= at {
                    look = Some(now + SURGE_LOOK);
                    let rate = self.recent.peek(now, Self::demanded(s));
                    if s.signal.was_denied() && rate > above * SURGE {
                        return;
                    }
                }
            }
            if drip.is_none_or(|due| now < due) {
                continue;
            }
            self.add_drip(s, now);
            // A node gone quiet ends its rate now, not at the renewal (see `quiet_at`). (Looked
            // for without a sample: the estimate is sampled where it always was.)
            self.demand.note(now, Self::demanded(s));
            if self.quiet_due().is_some_and(|at| now >= at) {
                return;
            }
        }
        tokio::time::sleep_until(deadline).await;
        self.add_drip(s, Instant::now());
    }

    /// Adds granted tokens to the local bucket. Under the fixed window they belong to the
    /// reply's window: the tokens of another window are dropped first, and these are dropped
    /// at once if their window (conservatively, `sent + reset_after` less the margin) has
    /// ended.
    fn keep<S>(&mut self, s: &Shared<S>, reply: &LeaseReply, sent: Instant) {
        if s.algorithm == Algorithm::FixedWindow {
            if self.window != reply.at {
                self.lapse(s);
            }
            let margin = reply.reset_after / 1_000 + WINDOW_MARGIN;
            let end = time::after(sent, reply.reset_after.saturating_sub(margin));
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
                // Its estimate decays while idle and warms up again from its next demand; so
                // do the shares a rate would be granted on (see `rate_ask::renew_after`).
                self.demand.restart_warm_up();
            }
        }
    }

    /// Returns the local tokens to the store; `leaving` also removes this node's record (and
    /// its demand) from the store.
    async fn give_back<S: LeaseStore>(&mut self, s: &Shared<S>, leaving: bool) {
        let tokens = s.local.take_all();
        let terms = self.node_terms(s);
        // The rate lease ends with the lease: its tokens are gone with the rest.
        self.end_rate(s);
        self.counted = 0;
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
        // Judged by the demand since the last lease too: a review early in a ramp (the first
        // one, say, after a warm start) must not give back what the next round trip needs.
        let demanded = Self::demanded(s);
        let ctx = LeaseContext {
            demand: self.sizing_demand(Some(demanded)),
            ..self.context(s, 0)
        };
        let Some(most) = s.policy.most_worth_holding(&ctx) else {
            // Nothing measured yet (a blind lease, a node whose requests are seconds apart):
            // look again once there may be, while it holds enough to be worth giving back.
            if ctx.local > TRIM_AT_LEAST {
                self.review_at = self.call_terms(s).map(|t| now + review_after(t.horizon));
            }
            return;
        };
        if ctx.local <= most {
            return;
        }
        // Never more than the store counts for it: tokens a rate lease brought are returned
        // (counted) at the next call.
        let excess = (ctx.local - most / 2).min(self.counted);
        if excess > 0 && s.local.try_take(excess).is_ok() {
            self.counted -= excess;
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
        let result = unwinding(s.store.release(&s.name, &s.quota, &request)).await;
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

    /// The demand leases and the low-water mark are sized for: the larger of the estimate and
    /// the last interval's rate, so that while demand ramps up (or steps up after a quiet
    /// spell) the next batch still lands before the local bucket runs dry — the estimate alone
    /// lags by its time constant, and sized a node at 145 000/s for a few thousand a second.
    /// Sizing only: the store is told the estimate (fair shares stay unbiased), and the share
    /// it reports still caps the lease.
    /// `demanded`: the running total, to count the interval under way too (see `trim`).
    fn sizing_demand(&self, demanded: Option<u64>) -> f64 {
        let now = Instant::now();
        let max_age = self
            .terms
            .map_or(DEMAND_TAU, |t| (t.horizon * 2).max(RECENT_MAX_AGE));
        let recent = self.recent.rate(now, max_age);
        let under_way = demanded.map_or(0.0, |count| self.recent.peek(now, count));
        self.demand.rate().max(recent).max(under_way)
    }

    fn context<S: LeaseStore>(&self, s: &Shared<S>, denied: u64) -> LeaseContext {
        LeaseContext {
            quota: self.quota,
            // Settled: a chunk in transit must not read as spent (the store is told this).
            local: s.local.settled(),
            denied,
            // Fixed windows: the smoothed estimate alone. Tokens left at a window's end are
            // lost to the fleet, so a lease sized up for a ramp wastes the window's budget.
            demand: match self.node_terms(s) {
                Some(_) => self.sizing_demand(None),
                None => self.demand.rate(),
            },
            share: self.share,
            rtt: s.rtt(),
            rate_held: self.drip.per_second(),
            horizon: self.call_terms(s).map(|t| t.horizon),
            leasers: self.leasers,
            fleet: self.fleet,
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
        self.terms = s.policy.terms(&quota).map(LeaseTerms::sendable);
        s.burst.store(quota.burst(), Ordering::Relaxed);
        *s.effective.lock() = quota;
        if let Some(local) = &s.fallback {
            local.follow(s.failure, &quota, self.fallback_share_mtps);
        }
    }

    /// One lease, and the pause after an empty or failed one. Returns false if the limiter
    /// closed meanwhile.
    async fn lease<S: LeaseStore>(&mut self, s: &Shared<S>) -> bool {
        let demanded = Self::demanded(s);
        self.recent.look(Instant::now(), demanded);
        // The rate lease drips up to the call and not while it is in flight: the store ends
        // the rate it holds when it runs the call, and its reply starts the next one (and pays
        // the flight at the lesser of the two rates: see `lease/drip.rs`).
        let paused = Instant::now();
        self.add_drip(s, paused);
        let held_before = self.drip.rate_mtps();
        let rated = held_before > 0;
        self.drip.suspend(paused);
        let ctx = self.context(s, s.signal.take_denied());
        let at_send = ctx.local;
        let mut ask = s.policy.ask(&ctx);
        let terms = self.call_terms(s);
        // A rated node gone quiet asks for no rate (see `quiet_at`).
        // (Rated as held before the call: the drip is suspended by now.)
        let quiet = rated && self.quiet_at().is_some_and(|at| paused >= at);
        // Where the burst is tight a quiet node's demand is gone (see `quiet_at`).
        let gone = quiet && tight(&self.quota);
        if gone {
            self.demand.forget();
        }
        // Nor does a node deciding per request (it leases on a denial of `try_acquire` only).
        let rate = terms
            .filter(|t| t.rate_leases && !quiet && !s.decides_per_request())
            .and_then(|t| rate_ask(&self.quota, &t, &ctx, rated));
        let (rate_ask, capacity) = match rate {
            Some(r) => {
                ask = r.shape(ask, if rated { self.counted } else { ctx.local }, rated);
                (r.rate_mtps, r.capacity)
            }
            None => (0, 0),
        };
        let ask = s.clamp(ask, &self.quota);
        // While it holds a rate its counted tokens are its own bucket, and it reports as many
        // of them as it keeps for the rate it asks for (what it spent the rate refills; the
        // rest goes back to the fleet), never fewer than it holds; without one, what it holds.
        let held = if rated {
            ctx.local.max(self.counted.min(capacity))
        } else {
            ctx.local
        };
        let mut request = LeaseRequest::new(ask.want, ask.min).with_limiter_settings(
            s.client,
            s.unconfigured,
            s.algorithm,
        );
        if let Some(terms) = terms {
            request = request.by(NodeLease {
                id: s.node_id,
                held,
                demand_mtps: if gone {
                    0
                } else {
                    reported_demand(self.demand.rate(), ask.min, terms.horizon)
                },
                horizon: terms.horizon,
                ttl: terms.ttl,
                rate_mtps: rate_ask,
                // Every release it sent took its tokens out of `held` first.
                release_seq: self.release_seq,
            });
        }
        let sent = Instant::now();
        let call = async {
            let reply = unwinding(s.store.lease(&s.name, &s.quota, &request)).await;
            reply.and_then(|r| r.within(&request))
        };
        // The local tokens' lease (or window) may reach its expiry while the call is in
        // flight: they go then (see `lapse`), and only the reply's grant is counted after it.
        let mut lapsed = false;
        let result = match self.expires {
            Some(deadline) => {
                let mut call = std::pin::pin!(call);
                tokio::select! {
                    result = &mut call => result,
                    () = tokio::time::sleep_until(deadline) => {
                        self.lapse(s);
                        lapsed = true;
                        call.await
                    }
                }
            }
            None => call.await,
        };
        let arrived = Instant::now();
        s.observe_rtt(arrived - sent, result.is_ok());
        s.counters.leases.fetch_add(1, Ordering::Relaxed);
        if let Ok(reply) = &result {
            self.adopt(s, reply.quota, reply.source);
        }
        // A minimum above the burst the store ran under (a stored config's, smaller than the
        // one this node knew) is refused before the node's record is touched: no renewal, its
        // held tokens and rate as they were, so nothing here may read the reply as one (the
        // next call, its minimum within the adopted burst, renews).
        // Nor does an answer that the name has no config: the store wrote nothing.
        let renewed = matches!(&result, Ok(reply)
            if request.min <= reply.quota.burst() && reply.source != QuotaSource::Absent);
        if result.is_ok() && !renewed {
            // The rate it held is still its own in the store, to the lease's expiry.
            self.drip.resume(arrived);
        }
        if let (Ok(reply), Some(terms), true) = (&result, terms, renewed) {
            // The store extended this node's lease from when it ran the script, which was after
            // `sent`: expiring locally at 90 % of the ttl from `sent` stays ahead of it.
            let expires = sent + terms.ttl.mul_f64(0.9);
            self.expires = Some(expires);
            self.counted = if lapsed { 0 } else { held } + reply.granted;
            self.drip
                .start(reply.rate_mtps, terms.horizon, arrived, expires);
            s.counters
                .rate_mtps
                .store(reply.rate_mtps, Ordering::Relaxed);
            // A renewal that did not raise the rate much: the store had no more to give, so
            // the next early one waits twice as long.
            self.early_gap = if rated && reply.rate_mtps <= held_before + held_before / 4 {
                (self.early_gap * 2)
                    .max(review_after(terms.horizon))
                    .min(terms.ttl / 2)
            } else {
                Duration::ZERO
            };
            self.sent_at = Some(sent);
            if reply.granted > 0 {
                self.review_at = Some(Instant::now() + review_after(terms.horizon));
                self.granted_at = Some(Instant::now());
            }
            self.share = Some(reply.share_mtps as f64 / 1_000.0);
            self.leasers = reply.leasers;
            self.fleet = self.fleet.max(reply.leasers);
            if let (true, Some(local)) = (s.failure.learns_share(), &s.fallback) {
                // The fallback follows the last non-zero share (0: no demand reported, nothing
                // learnt).
                if reply.share_mtps > 0 && reply.share_mtps != self.fallback_share_mtps {
                    self.fallback_share_mtps = reply.share_mtps;
                    local.set_share_mtps(&self.quota, reply.share_mtps);
                }
            }
            s.counters
                .share_mtps
                .store(reply.share_mtps, Ordering::Relaxed);
        }
        if result.is_err() {
            // Whether the store ran the call is unknown: the rate it held may have ended.
            self.end_rate(s);
        }
        // A pause on the store's own answer (over the limit, or a grant's pacing) is a refusal;
        // a back-off after an error, or an unconfigured name's recheck, is not.
        let refused = matches!(&result, Ok(reply) if reply.source != QuotaSource::Absent);
        // Whether the store had a whole batch for it (a rated node's asks are for a horizon of
        // its rate at least: see `RateAsk::shape`).
        let whole_batch =
            matches!(&result, Ok(reply) if reply.granted > 0 && reply.granted >= request.min);
        // What the store's answer was for (see `pause`): the share it told, the demand reported.
        let answered_for = match &result {
            Ok(reply) => (reply.share_mtps as f64 / 1_000.0).max(self.demand.rate()),
            Err(_) => 0.0,
        };
        let pause = match result {
            Ok(reply) if reply.source == QuotaSource::Absent => {
                s.recovered();
                Some(Instant::now() + Unconfigured::RECHECK)
            }
            Ok(reply) if quiet && reply.granted == 0 => {
                // The call that ended a quiet node's rate, with no tokens: not a refusal.
                // Nothing waits on it, and the node's next demand leases at once.
                s.recovered();
                self.backoff.reset();
                None
            }
            Ok(reply) if reply.granted > 0 || reply.rate_mtps > 0 => {
                s.recovered();
                s.metrics.granted(reply.granted);
                if reply.granted > 0 {
                    self.keep(s, &reply, sent);
                }
                self.keep_back_slack(s);
                // What the rate earned in flight (see `Drip::start`), into room the bucket had
                // at the send: what callers spent meanwhile was reported held, so it is still
                // counted, and its room is refilled only as time passes.
                self.pay_flight(s, at_send + reply.granted);
                s.counters
                    .tokens_leased
                    .fetch_add(reply.granted, Ordering::Relaxed);
                s.unblock();
                self.backoff.reset();
                // On terms, the store says when this node's next batch will be ready (its
                // share refills its credit); asking sooner would only come back empty.
                (terms.is_some() && !reply.retry_after.is_zero())
                    .then(|| time::from_now(reply.retry_after))
            }
            Ok(reply) => {
                s.recovered();
                s.counters.over_limit.fetch_add(1, Ordering::Relaxed);
                let wait = reply.retry_after.max(MIN_RETRY);
                let spread = match s.algorithm {
                    Algorithm::FixedWindow => (wait / 8).min(WINDOW_JITTER),
                    _ => wait / 8,
                };
                Some(time::from_now(
                    wait.saturating_add(jitter(&mut self.rng, spread)),
                ))
            }
            Err(error) => {
                tracing::debug!(limiter = %s.name, %error, "lease failed; backing off");
                let wait = self.backoff.after(&error, &mut self.rng);
                s.fail(error);
                Some(Instant::now() + wait)
            }
        };
        // A node holding a rate asks again at its rate's renewal (early if its demand moved
        // away from it, or surged: see `pause`), whatever its callers are denied meanwhile —
        // the rate is its share —
        // unless the store just had a whole batch of tokens beyond the rate for it: tokens are
        // plentiful, and it asks again when its callers need them (or when the store said).
        // Chasing the few tokens the refill leaves beside the rates cost a call per token or
        // two. Callers may retry when its next drip lands.
        let pause = match self.renew_due() {
            Some(renew) if whole_batch => pause.map(|at| at.min(renew)),
            Some(renew) => Some(renew),
            None => pause,
        };
        let next = s.policy.ask(&self.context(s, 0));
        s.low_water
            .store(next.low_water.min(self.quota.burst()), Ordering::Relaxed);
        if let Some(deadline) = pause {
            let hint = self.drip.due().map_or(deadline, |due| due.min(deadline));
            s.block_until(hint, refused);
        }
        // Release: a caller of `ready` that sees it also sees the tokens added above.
        s.answered.store(true, Ordering::Release);
        s.finished.notify_waiters();
        let after = s.local.available();
        if let Some(deadline) = pause {
            let surge_above = (refused && terms.is_some()).then_some(answered_for);
            let slept = s
                .signal
                .unless_closed(self.pause(s, deadline, surge_above))
                .await;
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

/// Fewest tokens a review keeps looking at while nothing is measured: a release call for a
/// token or two costs the store more than the tokens are worth to the fleet.
const TRIM_AT_LEAST: u64 = 3;

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
