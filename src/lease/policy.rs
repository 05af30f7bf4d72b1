//! Lease policies: how many tokens a node asks for, when, and on what terms.
//!
//! The hybrid limiter's background task asks its [`LeasePolicy`], at each refill, how many
//! tokens to ask for (`want`), the fewest worth taking (`min`), and the low-water mark to refill
//! at next (so the next batch arrives before the local bucket runs dry). The policy also says
//! whether leases are made on **terms** ([`LeaseTerms`]): a node that leases on terms tells the
//! store who it is, what it holds and what it needs, and the store then keeps its tokens counted
//! as outstanding (conservation) and sizes grants by fair share. The policy is one replaceable
//! piece so that sizing can evolve without touching the hot path.
//!
//! - [`AdaptiveLease`] (the default): leases on terms, sized to the node's measured demand over
//!   a target horizon, capped by the fair share the store reports.
//! - [`FixedLease`]: a fixed batch lease as usually proposed — fixed, anonymous batches,
//!   first come first served. Kept as the baseline the simulator compares against.

use std::time::Duration;

use crate::quota::{Quota, MAX_VALUE};

/// What the node knows when it asks for a lease.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct LeaseContext {
    /// The limiter's quota.
    pub quota: Quota,
    /// Tokens still in the local bucket.
    pub local: u64,
    /// Largest request denied locally since the previous lease (0 if none).
    pub denied: u64,
    /// Measured demand, tokens per second (admitted and denied requests).
    pub demand: f64,
    /// The fair share the store last reported, tokens per second (`None` before the first
    /// reply, and for anonymous leases).
    pub share: Option<f64>,
    /// Smoothed store round trip.
    pub rtt: Duration,
    /// The rate the node's rate lease adds to its local bucket, tokens per second (0 if none).
    pub rate_held: f64,
    /// The horizon of the terms this lease is made on, if it is made on terms: the policy's
    /// own, or longer for a node with a small share (see [`LeasePolicy::terms_at`]). `None`:
    /// the policy's own.
    pub horizon: Option<Duration>,
    /// Claimants of the bucket, as the store last reported: the nodes holding a lease, and
    /// the anonymous callers beside them as one more while they ask
    /// ([`LeaseReply::leasers`](crate::LeaseReply::leasers); 0: not known).
    pub leasers: u64,
    /// The most claimants the store has reported since this node started (0: none yet): the
    /// fleet's size, as near as a node can tell. The store's count takes the nodes that
    /// decide per request, which keep no lease, for one claimant, however many they are.
    pub fleet: u64,
}

/// What the node knows when it sets the terms of one lease call
/// ([`LeasePolicy::terms_at`]).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct CallContext {
    /// The limiter's quota.
    pub quota: Quota,
    /// The fair share the store last reported, tokens per second (`None` before the first
    /// reply).
    pub share: Option<f64>,
    /// Claimants of the bucket, as the store last reported (see [`LeaseContext::leasers`]).
    pub leasers: u64,
    /// The most claimants the store has reported since this node started (0: none yet; see
    /// [`LeaseContext::fleet`]).
    pub fleet: u64,
    /// The node's demand estimate, tokens per second: the smoothed one (a 300 ms time
    /// constant), not [`LeaseContext::demand`]'s sizing demand; it decays while the node is
    /// quiet. 0 (or a value that is not a positive number): not known.
    pub demand: f64,
}

impl CallContext {
    /// The context of a call under `quota`, with `share` last reported.
    pub fn new(quota: Quota, share: Option<f64>) -> Self {
        CallContext {
            quota,
            share,
            leasers: 0,
            fleet: 0,
            demand: 0.0,
        }
    }

    /// The same context, with the node's demand estimate, tokens per second (see
    /// [`CallContext::demand`]).
    pub fn with_demand(mut self, demand: f64) -> Self {
        self.demand = demand;
        self
    }

    /// The same context, with `leasers` claimants as the store last reported (see
    /// [`LeaseContext::leasers`]).
    pub fn with_leasers(mut self, leasers: u64) -> Self {
        self.leasers = leasers;
        self.fleet = self.fleet.max(leasers);
        self
    }

    /// The same context, with a fleet of `fleet` nodes: the most claimants the store has
    /// reported (never below `leasers`).
    pub fn with_fleet(mut self, fleet: u64) -> Self {
        self.fleet = fleet.max(self.leasers);
        self
    }
}

/// A lease request and the low-water mark to use next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseAsk {
    /// Most tokens to take.
    pub want: u64,
    /// Fewest acceptable (all or nothing below it).
    pub min: u64,
    /// Refill when the local bucket falls below this many tokens.
    pub low_water: u64,
}

/// The terms of a lease made on a node's behalf.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTerms {
    /// How long one lease should last; the store grants about a horizon of the node's share
    /// and keeps a reserve of half a horizon of the fleet rate (at most a quarter of the
    /// burst) for fair sharing.
    pub horizon: Duration,
    /// How long a lease is valid. The node stops spending its tokens before then (at 90 %);
    /// the store forgets them at expiry, so a crashed node's tokens are never re-admitted.
    pub ttl: Duration,
    /// Give all tokens back after this long without demand.
    pub idle_after: Duration,
    /// Whether each lease also asks to hold a rate (a *rate lease*: the store carves the
    /// node's share out of the shared bucket's refill and the node adds what it earns to its
    /// local bucket itself, renewing it every half ttl — sooner while its demand has been
    /// measured for less than that, and asking for no rate once its requests stop), so a node
    /// needs a store call per half ttl rather than per batch of tokens. A policy may decide it per call ([`LeasePolicy::terms_at`]), as
    /// [`AdaptiveLease`] does by default.
    pub rate_leases: bool,
}

impl LeaseTerms {
    /// These terms as a store takes them: a horizon and a ttl of 1 µs to
    /// [`MAX_VALUE`](crate::MAX_VALUE) µs (a policy's "never expire", `Duration::MAX`, is 142
    /// years). The store refuses a node's lease outside that range, so terms taken as they are
    /// failed every lease, and the failure policy answered for good.
    pub(crate) fn sendable(self) -> Self {
        let within =
            |d: Duration| d.clamp(Duration::from_micros(1), Duration::from_micros(MAX_VALUE));
        LeaseTerms {
            horizon: within(self.horizon),
            ttl: within(self.ttl),
            ..self
        }
    }
}

/// Decides lease sizes for a [`HybridLimiter`](crate::HybridLimiter).
pub trait LeasePolicy: Send + Sync + 'static {
    /// The next lease to ask for. The limiter clamps the answer to `1 ≤ min ≤ want` and
    /// `min ≤ burst`.
    fn ask(&self, ctx: &LeaseContext) -> LeaseAsk;

    /// Lease terms, or `None` for anonymous leases (no conservation, no fair share).
    fn terms(&self, quota: &Quota) -> Option<LeaseTerms>;

    /// The most tokens worth holding now, on terms: a node that holds more (its first lease
    /// was sized before its demand was known, or its share shrank while it stayed busy) gives
    /// the excess back, down to half of this, instead of keeping it from the fleet until its
    /// lease expires. `None` (the default): never give back early.
    fn most_worth_holding(&self, ctx: &LeaseContext) -> Option<u64> {
        let _ = ctx;
        None
    }

    /// The terms of one lease call, given the share the store last reported: the policy may
    /// lengthen the horizon, as [`AdaptiveLease`] does for a node with a small part of the
    /// rate (default: `terms` as they are). (The round trip is in [`LeaseContext::rtt`]: a
    /// lease's size covers it.)
    fn terms_at(&self, terms: LeaseTerms, call: &CallContext) -> LeaseTerms {
        let _ = call;
        terms
    }

    /// Whether leasing buys nothing for this node now, so that a miss of the local bucket in
    /// [`acquire_now`](crate::HybridLimiter::acquire_now) should be one decision in the store,
    /// as in pure-Redis mode, and the task should not lease ahead of demand (`deciding`:
    /// whether the node decides so already, for hysteresis). The default: never.
    fn per_request(&self, ctx: &LeaseContext, deciding: bool) -> bool {
        let _ = (ctx, deciding);
        false
    }
}

/// Shortest lead of [`AdaptiveLease`]'s low-water mark: a refill also waits for the background
/// task to be scheduled, which a busy runtime can delay by a millisecond or two whatever the
/// store's round trip.
const MIN_LEAD: Duration = Duration::from_millis(2);

/// [`AdaptiveLease`] sizes a *blind* lease — one asked before the node has measured any
/// demand, as the lease a limiter takes when it is built — as for one node of a fleet this
/// large: a horizon of the rate over this many. A node with traffic sizes its next lease on
/// the rate it has seen since (within a round trip or two), so a small blind lease costs a
/// small fleet a call or two; a large one, at a fleet start, gave the whole burst to the
/// first nodes to start, most of which needed a few tokens (with a tenth of the rate, 1 000
/// nodes admitted 0.77 of the first second's budget, 0.82 with this; SIMULATIONS.md, "A small
/// blind lease").
const BLIND_FLEET: f64 = 1_000.0;

/// [`AdaptiveLease`]'s automatic horizon is the bucket's fill time (`burst / rate`) over this.
/// Tokens in flight (about `rate × horizon` across the fleet) count against the burst, so it is
/// a part of it; with a burst under a second of the rate (the horizon below its 250 ms cap)
/// a third rather than a quarter made 18–25 % fewer store calls at the same utilization and
/// first second (tight-burst, skewed-small-burst; a half made 40–52 % fewer, but cost the
/// first second 0.03–0.07; SIMULATIONS.md, "A third of the fill time").
const FILL_PARTS: f64 = 3.0;

/// A horizon set on [`AdaptiveLease`] is at most the fill time over this (and never below
/// [`MIN_AUTO_HORIZON`]): see [`AdaptiveLease::horizon`]. A half keeps the whole rate (with a
/// horizon of the whole fill time and no shortening for large shares, the busiest node of
/// 1 000 sharing a burst of 50 ms admitted nothing).
const MIN_FILL_PARTS: f64 = 2.0;

/// Shortest automatic horizon of [`AdaptiveLease`].
pub const MIN_AUTO_HORIZON: Duration = Duration::from_millis(10);
/// Longest automatic horizon of [`AdaptiveLease`].
pub const MAX_AUTO_HORIZON: Duration = Duration::from_millis(250);

/// Demand-aware leasing with conservation and fair shares (the default policy).
///
/// Each node measures its demand `d` (admitted and denied tokens per second, see `demand.rs`). It
/// asks for `rate × horizon × headroom − held` tokens, where `rate` is `d`, or the store's fair
/// share if that is smaller (asking beyond the share is pointless: the store caps grants at it).
/// Before any demand is measured — the lease a limiter takes when it is built — `rate` is a
/// thousandth of the quota's: a blind lease sized for one node of a large fleet, so a fleet that
/// starts together does not hand its burst to its first nodes. It refills below
/// `rate × max(3 × rtt, horizon / 4, 2 ms)`, so the next batch lands before the bucket runs dry:
/// the refill takes a round trip plus the time the background task takes to wake (which a busy
/// runtime stretches), and demand may still be growing meanwhile. (`d` here is the limiter's sizing
/// demand: the larger of its smoothed estimate and the rate between its last two leases, so a ramp
/// is followed within a lease.) Leases are made on [`LeaseTerms`], so the store counts held tokens
/// as outstanding and splits the rate in proportion to demand — which gives every node the
/// acceptance ratio of one shared bucket, as pure-Redis mode does.
///
/// Knobs (all have defaults that meet the simulator's targets, see `SIMULATIONS.md`):
/// - `horizon` (automatic): how long a lease lasts. Store calls per busy node ≈ 1 / horizon.
///   Longer means fewer calls but more tokens in flight, and tokens in flight (about
///   `rate × horizon` across the fleet) count against the burst: while they are out, the
///   shared bucket refills only up to `burst − outstanding`. The automatic horizon is a third
///   of the time the bucket takes to fill (`burst / rate / 3`), between 10 ms and 250 ms: with
///   `burst = rate` (one second of burst), 250 ms. Each call stretches it for a node whose fair
///   share is below a thousandth of the rate (one of thousands of nodes) by the square root of
///   how far below — the economic order quantity, fewest calls for the tokens held — at most
///   half the ttl, and no further than a fleet of nodes with its share could carry (their
///   tokens in flight within half the burst, up to 1.5 times that while the fleet asks for
///   more than the rate); in a fleet of 32 nodes or more (the store reports how many hold leases;
///   fully from 1 000) the largest shares lease for shorter by the same rule, at most by half,
///   so the fleet's tokens in flight stay near a horizon of the rate (not under rate leases). A slow
///   store does not stretch it: the lease and its low-water mark cover the round trip.
/// - `ttl` (10 × horizon, at least 1 s): lease validity. Tokens of a crashed node are lost
///   for at most this long.
/// - `idle_after` (500 ms): give everything back after this long without demand (but never
///   sooner than four expected gaps between requests). Tokens still held when a lease is
///   about to expire are given back then too.
/// - `headroom` (1.25): how much more than a horizon of demand to ask for.
///
/// Whatever the share, a node on terms asks to hold at least 0.35 of the policy's own horizon
/// of its demand (at most the rate), so a node whose share lags its demand (back from idle, or one of the largest
/// shares of a large fleet start) does not refill many times a horizon while the store has
/// tokens above its reserve to give.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveLease {
    horizon: Option<Duration>,
    ttl: Option<Duration>,
    idle_after: Duration,
    headroom: f64,
    /// `None`: automatic (see [`AdaptiveLease::rate_leases`]).
    rate_leases: Option<bool>,
    per_request_below: f64,
}

impl Default for AdaptiveLease {
    fn default() -> Self {
        AdaptiveLease {
            horizon: None,
            ttl: None,
            idle_after: Duration::from_millis(500),
            headroom: 1.25,
            rate_leases: None,
            per_request_below: 3.0,
        }
    }
}

impl AdaptiveLease {
    /// The default policy.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long one lease should last (default: automatic, see above; at least 1 ms).
    ///
    /// At most half the bucket's fill time (`burst / rate`, but never below 10 ms) is used:
    /// the tokens a node leases count against the burst until its next call, about a horizon
    /// later, so the fleet can be granted at most `burst / horizon` tokens a second — a horizon
    /// of the whole fill time or more keeps the bucket from refilling while the tokens are out
    /// and the busiest nodes, whose steps the bucket then never holds, get nothing. (1 000
    /// nodes sharing a burst of 50 ms of the rate, a horizon of 100 ms: utilization 0.54, the
    /// busiest nodes admitting none; shortened, 0.997. SIMULATIONS.md, "A horizon the burst
    /// can carry".) A small share's horizon is still stretched past it call by call (see
    /// [`LeasePolicy::terms_at`]), as far as a fleet of nodes with its share could carry: a
    /// small share of a skewed fleet leases a few tokens, not a large part of the burst, while
    /// a thousand equal shares each stretched would hold all of it.
    pub fn horizon(mut self, horizon: Duration) -> Self {
        self.horizon = Some(horizon.max(Duration::from_millis(1)));
        self
    }

    /// The lease validity used for `quota` (see [`ttl`](Self::ttl)).
    fn ttl_for(&self, quota: &Quota) -> Duration {
        let horizon = self.horizon_for(quota);
        self.ttl
            .unwrap_or((horizon * 10).max(Duration::from_secs(1)))
            .max(horizon * 2)
    }

    /// The horizon a lease is sized for: its terms' (see [`LeaseContext::horizon`]), else
    /// [`horizon_for`](Self::horizon_for).
    fn horizon_of(&self, ctx: &LeaseContext) -> Duration {
        ctx.horizon.unwrap_or_else(|| self.horizon_for(&ctx.quota))
    }

    /// The horizon used for `quota`.
    pub fn horizon_for(&self, quota: &Quota) -> Duration {
        let fill = fill_s(quota);
        match self.horizon {
            // The longest a burst carries (see `horizon`).
            Some(set) => set.min(
                Duration::try_from_secs_f64(fill / MIN_FILL_PARTS)
                    .unwrap_or(Duration::MAX)
                    .max(MIN_AUTO_HORIZON),
            ),
            None => {
                Duration::from_secs_f64(fill / FILL_PARTS).clamp(MIN_AUTO_HORIZON, MAX_AUTO_HORIZON)
            }
        }
    }

    /// Lease validity (default 10 × horizon, at least 1 s; never below 2 × horizon).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Give tokens back after this long without demand (default 500 ms).
    pub fn idle_after(mut self, idle: Duration) -> Self {
        self.idle_after = idle;
        self
    }

    /// Whether leases may also ask to hold a rate (see [`LeaseTerms::rate_leases`]). On, a
    /// node asks for one where token leases would be small (a tight burst, a small share) or
    /// frequent (a horizon under 50 ms) and its room in the burst can carry it (its part, or
    /// in a fleet of at most 1 000 what the burst has for every leaser; beyond 100 leasers the
    /// room a rate needs is a token less); `SIMULATIONS.md`
    /// ("Rate leases") has where that pays and where it costs. Where it costs most: in a
    /// fleet of hundreds under a tight burst, the small shares' rooms hold most of the burst,
    /// and a node whose share grows later (a hot spot that moves) cannot take its part back —
    /// 1 000 nodes, a hot spot moving every 5 s, admitted 0.86 of the budget with rate leases,
    /// 0.997 with token leases (SIMULATIONS.md, "moving-hotspot-fleet"). Clients of the same
    /// bucket that decide per request (pure mode, another
    /// language's client of the script) report no demand; the store counts what they ask for
    /// (retries included) in the shares of the rate, from the first rate held on (the first
    /// rates may take all until their renewal).
    ///
    /// Default: automatic — on where the burst is **tight** (it fills in under a quarter of a
    /// second of the rate, so token leases would last under 83 ms) in a fleet of at most 100
    /// nodes (the most the store has reported holding leases: [`CallContext::fleet`]); off
    /// otherwise. There rate leases cost a quarter of a point of utilization or less for 2–30
    /// times fewer store calls (a burst of rate / 20 shared by 10 nodes: 0.6 % of pure mode's
    /// calls where token leases make 18 %); with a burst of a second they save little (10
    /// nodes: even), and in a larger fleet they cost more than they save (1 000 nodes: 0.6 of
    /// a point of utilization, and where demand comes and goes 0.12 of the first second, for
    /// 35–55 % fewer calls; SIMULATIONS.md, "Rate leases for short horizons, one horizon of
    /// room"). The fleet is the most
    /// leasers a node has heard of since it started: one that saw more than 100 (a surge, a
    /// rolling restart's overlap) leases tokens from then on. (The store counts only nodes
    /// holding a lease, and anonymous callers as one, so a recent count reads a large fleet
    /// of mostly idle nodes as small; rate leases there admit 0.996 of the budget as token
    /// leases do, with a seventh of their calls, but 0.87 of the first second where they admit
    /// 0.95: SIMULATIONS.md, "sparse-tight-fleet".) A
    /// rate ends when its node goes quiet (no request for twenty expected gaps, and for at
    /// least a quarter horizon held between 10 and 100 ms) as well as at its lease's end. Like every lease on terms, they need the
    /// token bucket.
    ///
    /// What a rated node does not call for, it learns late: a change of the stored config
    /// reaches it at its renewal, at most half a ttl away (its old rate is its own until
    /// then), and a store outage at its next call — until then, even failing closed, it
    /// spends the rate the store granted it, as a token-leasing node spends the tokens it
    /// holds. Set `rate_leases(false)` where a node must follow a config change, or stop
    /// admitting in an outage, within one horizon.
    pub fn rate_leases(mut self, on: bool) -> Self {
        self.rate_leases = Some(on);
        self
    }

    /// Whether a call in `call`'s context, on terms that ask for a rate or not (`asked`),
    /// asks for one (see [`rate_leases`](Self::rate_leases)): as set, else if the terms ask or
    /// the burst is tight and the fleet small.
    fn rate_leases_at(&self, asked: bool, call: &CallContext) -> bool {
        self.rate_leases.unwrap_or_else(|| {
            asked || tight(&call.quota) && (1..=AUTO_RATE_MAX_FLEET).contains(&call.fleet)
        })
    }

    /// Below this many tokens of its part of the burst (`burst × demand / rate`, default 3;
    /// twice as many to leave), leasing buys a node nothing: a token it holds for its next
    /// request counts against the fleet's burst until its next call, and a node that small
    /// holds one most of the time — a fleet of such nodes keeps its bucket near empty. A miss
    /// in [`acquire_now`](crate::HybridLimiter::acquire_now) is then one decision in the
    /// store, as in pure-Redis mode (`try_acquire` still answers from the local bucket and
    /// leases on a denial; a node whose misses are mostly `try_acquire`'s does not decide per
    /// request, since leasing serves those callers better). A node whose leases last longer than the horizon (a small share of
    /// a large fleet's rate) counts its part as that many times larger: each
    /// call brings as many more tokens. Where the burst has room for 4 tokens per node of the
    /// fleet (the most leasers the store has counted: [`LeaseContext::fleet`]) no node decides
    /// per request — leasing strands little of such a burst, and a node that decides per
    /// request is served before leasers that wait for credit. Where the horizon is longer than
    /// a third of the fill time (the automatic horizon's 10 ms floor, under a burst that fills
    /// in under 30 ms of the rate), a lease holds that many times more of a node's part of the
    /// burst, and the threshold is that many times higher (so is the threshold to leave: where
    /// the burst is a few tokens, a node leaves only with demand several times the rate — it
    /// decides per request for good, as pure-Redis mode does; a horizon set by hand, up to half
    /// the fill time, raises it too, by up to 1.5): ten nodes sharing 2 000/s with a
    /// burst of 10 (it fills in 5 ms) admitted 0.91–0.98 of their budget leasing beside nodes
    /// deciding per request (the busiest node, its lease of 10 ms of its demand twice the
    /// burst, starved while the others took the refill token by token), 0.996–1.000 all
    /// deciding per request, as pure-Redis mode (SIMULATIONS.md, "A burst of a few
    /// milliseconds"). 0 turns it off.
    pub fn per_request_below(mut self, tokens: f64) -> Self {
        self.per_request_below = at_least(tokens, 0.0);
        self
    }

    /// Ask for this multiple of a horizon of demand (default 1.25, at least 1).
    pub fn headroom(mut self, headroom: f64) -> Self {
        self.headroom = at_least(headroom, 1.0);
        self
    }

    /// The tokens a lease at `rate` over a horizon of `horizon_s` seconds should hold: the
    /// horizon with its headroom and the round trip, at least what [`lasting`](Self::lasting)
    /// says (what `ask` targets, and twice of which a trim keeps).
    fn lease_of(&self, ctx: &LeaseContext, rate: f64, horizon_s: f64) -> f64 {
        (rate * (horizon_s * self.headroom + ctx.rtt.as_secs_f64())).max(self.lasting(ctx))
    }

    /// The fewest tokens a node on terms with no rate lease asks to hold: [`MIN_LEASE_LIFE`]
    /// of the policy's own horizon at its demand (at most the rate), whatever the share last
    /// reported. A lease capped at a horizon of a share below the demand lasts
    /// `share / demand` of a horizon while the store grants what is asked (the bucket above
    /// its reserve), and the node calls that much more often: a node back from an idle
    /// give-back reports a demand still warming up, so a share of a few tokens a second, and
    /// leased a token or a few at a time (bursty: 22 calls in its first busy second); the
    /// largest shares of a 10 000-node start, a third of their demand over a horizon halved
    /// for their share, leased every 42 ms (27 calls a second). Below the reserve the store
    /// grants by credit (the share) whatever is asked, so shares under contention are kept;
    /// above it grants are first come, so the demand counts only up to the rate (a spike of
    /// the estimate, or a storm of retries, takes at most a tenth of a burst of a second
    /// more). Not for anonymous leases (keyed limiters, `ctx.horizon` `None`): nothing
    /// counts their tokens as outstanding, and their batch is bounded by the share.
    fn lasting(&self, ctx: &LeaseContext) -> f64 {
        if ctx.horizon.is_none() || ctx.rate_held > 0.0 || ctx.demand <= 0.0 {
            return 0.0;
        }
        let demand = ctx.demand.min(ctx.quota.per_second_f64());
        demand * self.horizon_for(&ctx.quota).as_secs_f64() * MIN_LEASE_LIFE
    }
}

/// The part of [`AdaptiveLease`]'s own horizon (before `terms_at` shortens it for a large
/// share) a token lease lasts at least at the node's demand (see `AdaptiveLease::lasting`):
/// at most about 1 / (0.35 × 250 ms) = 11 refills a second with a second of burst. Half made
/// 12–13 calls a second at the busiest node but held enough more tokens at a 1 000-node start
/// to cost its first second 0.01–0.014; a quarter left 10 000 nodes' busiest at 21–23.
const MIN_LEASE_LIFE: f64 = 0.35;

impl LeasePolicy for AdaptiveLease {
    fn ask(&self, ctx: &LeaseContext) -> LeaseAsk {
        let burst = ctx.quota.burst();
        let horizon = self.horizon_of(ctx).as_secs_f64();
        let demand = if ctx.demand > 0.0 {
            ctx.demand
        } else {
            ctx.quota.per_second_f64() / BLIND_FLEET
        };
        let rate = capped(demand, ctx.share);
        // What a rate lease drips needs no token lease: tokens (and the mark) for the rest.
        let rate = (rate - ctx.rate_held).max(0.0);
        let target = self.lease_of(ctx, rate, horizon);
        let want = (target.ceil() as u64).saturating_sub(ctx.local);
        let want = want.max(ctx.denied).clamp(1, burst);
        let lead = (3.0 * ctx.rtt.as_secs_f64())
            .max(horizon / 4.0)
            .max(MIN_LEAD.as_secs_f64());
        LeaseAsk {
            want,
            min: ctx.denied.clamp(1, want),
            low_water: ((rate * lead).ceil() as u64).min(burst),
        }
    }

    /// Two leases' worth of the measured demand (capped by the share); nothing before any
    /// demand was measured.
    fn most_worth_holding(&self, ctx: &LeaseContext) -> Option<u64> {
        if ctx.demand <= 0.0 {
            return None;
        }
        let horizon = self.horizon_of(ctx).as_secs_f64();
        let rate = capped(ctx.demand, ctx.share);
        let lease = self.lease_of(ctx, rate, horizon);
        Some((2.0 * lease).ceil() as u64)
    }

    /// Below [`per_request_below`](AdaptiveLease::per_request_below) tokens of the node's part
    /// of the burst (`burst × demand / rate`; by its share before any demand is measured, and
    /// no change before the first share), times how much longer than the policy's horizon
    /// its leases last (a small share: [`terms_at`](LeasePolicy::terms_at)), to
    /// enter; twice that to leave. The threshold itself grows by as much as the policy's
    /// horizon exceeds a third of the fill time (see `per_request_below`). The demand, not the
    /// share: nodes that decide per request report no demand to the store, so the shares of
    /// the others grow past what they use.
    fn per_request(&self, ctx: &LeaseContext, deciding: bool) -> bool {
        if self.per_request_below <= 0.0 {
            return false;
        }
        // Room in the burst for every node: lease (see `ROOM_PER_LEASER`).
        if ctx.fleet > 0 && ctx.fleet as f64 * ROOM_PER_LEASER <= ctx.quota.burst() as f64 {
            return false;
        }
        let usable = match ctx.share {
            _ if deciding || ctx.demand > 0.0 => ctx.demand,
            Some(share) if share > 0.0 => share,
            _ => return false,
        };
        let below = if deciding { 2.0 } else { 1.0 } * self.per_request_below;
        // A lease stretched longer than the policy's horizon (a small share) brings as many
        // more tokens a call. (One shortened for a large share of a large fleet is not a
        // reason to decide per request: it is shortened to hold fewer tokens, not for want.)
        let policy_horizon = self.horizon_for(&ctx.quota).as_secs_f64();
        let stretch = (self.horizon_of(ctx).as_secs_f64() / policy_horizon).max(1.0);
        let part = ctx.quota.burst() as f64 * usable / ctx.quota.per_second_f64() * stretch;
        // A horizon longer than a third of the fill time (the automatic one's 10 ms floor
        // where the burst fills in under 30 ms) makes a lease hold as many times more of the
        // node's part: the part must be as many times larger for leasing to pay.
        let over_fill = (policy_horizon * FILL_PARTS / fill_s(&ctx.quota)).max(1.0);
        part < below * over_fill
    }

    /// The horizon by the square root of the node's part of the rate: longer for a small
    /// share (at most half the ttl, and as far as a fleet of nodes like it could carry),
    /// shorter for a large share of a large fleet (at most by
    /// half, never below 10 ms; not under a rate-leasing policy, where shorter horizons made
    /// the busiest node of a 1 000-node start 26–28 store calls a second rather than 13,
    /// whether all its nodes shrank or only those holding no rate; the rule is `by_share`'s in
    /// `lease/policy.rs`). Not by the round
    /// trip: a lease's size and its low-water mark already cover the round trip, and at a
    /// fleet start the round trip is the queue the fleet itself makes — leases stretched by it
    /// handed the burst to the first nodes answered, and with a tight burst a lease of 16
    /// round trips of a 5 ms store could not be granted at all (SIMULATIONS.md, "A lease waits
    /// longer than a caller").
    ///
    /// Whether the call asks for a rate is decided here too (see
    /// [`rate_leases`](Self::rate_leases)): as set, else automatically — on where the burst is
    /// tight in a small fleet, or where `terms` (a wrapping policy's, say) already ask for one.
    fn terms_at(&self, terms: LeaseTerms, call: &CallContext) -> LeaseTerms {
        let rate_leases = self.rate_leases_at(terms.rate_leases, call);
        LeaseTerms {
            horizon: by_share(terms.horizon, call, terms.ttl, !rate_leases),
            rate_leases,
            ..terms
        }
    }

    fn terms(&self, quota: &Quota) -> Option<LeaseTerms> {
        let horizon = self.horizon_for(quota);
        let ttl = self.ttl_for(quota);
        Some(LeaseTerms {
            horizon,
            ttl,
            idle_after: self.idle_after,
            // Automatic: decided per call (`terms_at`), by the fleet the store reports.
            rate_leases: self.rate_leases.unwrap_or(false),
        })
    }
}

/// `x`, at least `min` (`min` if `x` is not a number or infinite).
fn at_least(x: f64, min: f64) -> f64 {
    if x.is_finite() {
        x.max(min)
    } else {
        min
    }
}

/// Tokens of burst per node (the most leasers a node has seen) from which no node decides per
/// request.
///
/// Deciding per request pays where the tokens small leasers hold between calls, a token or
/// two each, would be much of the burst: twenty nodes sharing a burst of 20 (low-rate) lost
/// 12 % of the budget leasing. Where the burst has that room, the anonymous takes of nodes
/// deciding per request reach the reserve that leasers reach only with credit, and are served
/// first: 1 000 nodes sharing a burst of 5 000 (tight-burst-fleet) had the 750 quietest
/// accept 0.7–0.99 of their requests and the busiest 0.44 (Jain 0.91); leasing, Jain 0.98
/// with a fifth fewer calls (SIMULATIONS.md, "tight-burst-fleet").
const ROOM_PER_LEASER: f64 = 4.0;

/// [`AdaptiveLease`] leases a rate by default where the burst fills in under this: token
/// leases there last under 83 ms (a third of the fill time) and each busy node would make 12
/// store calls a second or more (see [`AdaptiveLease::rate_leases`]).
const AUTO_RATE_FILL: Duration = Duration::from_millis(250);

/// The time `quota`'s bucket takes to fill, seconds (`burst / rate`).
fn fill_s(quota: &Quota) -> f64 {
    quota.burst() as f64 / quota.per_second_f64()
}

/// Whether `quota`'s burst is tight: it fills in under [`AUTO_RATE_FILL`] (where rate leases
/// are on by default in a small fleet, small shares lease for longer from
/// [`TIGHT_SHARE_REF`], and a rated node gone quiet reports no demand: `Task::quiet_at`).
pub(crate) fn tight(quota: &Quota) -> bool {
    fill_s(quota) < AUTO_RATE_FILL.as_secs_f64()
}

/// The largest fleet (the most leasers the store has reported to a node) in which
/// [`AdaptiveLease`] leases a rate by default: with 10–100 nodes rate leases cost a tight burst
/// at most a quarter of a point of utilization; with 300, 0.4–0.9 points; with 1 000, a
/// point (SIMULATIONS.md, "Rate leases by default for tight bursts").
const AUTO_RATE_MAX_FLEET: u64 = 100;

/// The share, as a part of the rate, below which a node leases for longer: one of a thousand
/// nodes (see [`by_share`]).
const SHARE_REF: f64 = 1_000.0;

/// Where the burst is tight (it fills in under [`AUTO_RATE_FILL`]), a node whose share is below
/// this part of the rate — one of a hundred nodes, not a thousand — leases for longer (see
/// [`by_share`]): the automatic horizon is then a third of a short fill time, and a share of
/// a thousandth made a lease of a token or two, a call per token admitted. 1 000 nodes sharing
/// a burst of 50 ms of the rate: 561 742 → 287 633 store calls, Jain 0.9842 → 0.9982, the
/// same utilization (SIMULATIONS.md, "Longer horizons for small shares of a tight burst"). With
/// a burst of a second it wrecked bursty-fleet (0.9846 → 0.7461: leases of a second held past
/// a node's busy spell); and it needs a pause on the store's answer to end when the demand
/// surges (`SURGE` in `hybrid/task.rs`), or a node told at a tiny share to come back in a
/// second is blind through its busy second.
const TIGHT_SHARE_REF: f64 = 100.0;

/// The most a large share's horizon shrinks: to half (see [`by_share`]). A quarter held
/// fewer tokens still, but made the busiest node of a 1 000-node start 33 store calls a
/// second (SIMULATIONS.md, "Short leases for the largest shares").
const MAX_SHRINK: f64 = 2.0;

/// `horizon` for a node, by its part of the rate — the economic order quantity of inventory
/// theory: store calls are `Σ 1/hᵢ` and the tokens nodes hold `Σ shareᵢ × hᵢ`; for a given
/// holding, calls are fewest with `hᵢ ∝ 1/√shareᵢ`.
///
/// - A node whose share is below a thousandth of the rate (a hundredth where the burst is
///   tight: [`TIGHT_SHARE_REF`]) leases for longer, by `√(rate / (SHARE_REF × share))`
///   (`TIGHT_SHARE_REF` there), at most half of `ttl`: under the skewed demand of a large
///   fleet this allows a few times fewer calls than one horizon for all (SIMULATIONS.md,
///   "Horizons by the square root of the share"). A node that is short of the level while its
///   credit covers its longer step does not starve: the store holds the step back for it (a
///   claim).
/// - The tokens those longer leases hold count against the burst, so a large fleet takes them
///   back from its largest shares: with `n` nodes holding leases (the store's count), a node
///   whose share is above `rate / f`, `f = min(n² / SHARE_REF, SHARE_REF)`, leases for shorter,
///   by `√(rate / (f × share))`, at most by half ([`MAX_SHRINK`]) and never below 10 ms
///   ([`MIN_AUTO_HORIZON`]). From a thousand nodes on
///   that is the same rule on both sides of a thousandth; a smaller fleet has fewer nodes
///   stretched and shrinks less (with 100 nodes only shares above a tenth); up to 31 nodes
///   (`f ≤ 1`) none, since no node of so small a fleet leases longer and shorter leases would
///   only add calls. A 1 000-node fleet that starts at once admitted 0.90 of its first
///   second's budget rather than 0.85 (SIMULATIONS.md, "Short leases for the largest shares").
/// - A longer lease is for a share that is small beside the others', not beside the rate: a
///   node stretches its horizon only as far as a fleet of nodes like it could (see
///   [`fleet_horizon_cap`]). Where every node is small — a thousand equal nodes under a tight
///   burst — every horizon was stretched, the tokens in flight held the whole burst, and
///   the fleet denied requests under its limit. Under rate leases too, where the horizon sets
///   a node's drip step and renewals (moving-hotspot-fleet's rate leases 0.8085 → 0.8359, the
///   10 000-node start's 0.9260 → 0.9204).
fn by_share(horizon: Duration, call: &CallContext, ttl: Duration, shrink: bool) -> Duration {
    let Some(share) = call.share.filter(|s| *s > 0.0) else {
        return horizon;
    };
    // The node's part of the rate (over 1 for a share above it: a rate that shrank).
    let part = share / call.quota.per_second_f64();
    let nodes = if shrink { call.leasers as f64 } else { 0.0 };
    let fleet = (nodes * nodes / SHARE_REF).min(SHARE_REF);
    // Where the burst is tight, from a hundredth of the rate (see `TIGHT_SHARE_REF`).
    let reference = if tight(&call.quota) {
        TIGHT_SHARE_REF
    } else {
        SHARE_REF
    };
    let longer = (1.0 / (reference * part)).sqrt();
    let shorter = (1.0 / (fleet * part)).sqrt();
    let factor = if longer > 1.0 {
        longer
    } else if shorter < 1.0 {
        shorter.max(1.0 / MAX_SHRINK)
    } else {
        return horizon;
    };
    let scaled =
        Duration::try_from_secs_f64(horizon.as_secs_f64() * factor).unwrap_or(Duration::MAX);
    if factor > 1.0 {
        let most = fleet_horizon_cap(call, share, part).map_or(ttl / 2, |cap| cap.min(ttl / 2));
        horizon.max(scaled.min(most))
    } else {
        // Never below the shortest automatic horizon (nor a shorter one the policy was set to).
        scaled.max(horizon.min(MIN_AUTO_HORIZON))
    }
}

/// The most a stretched horizon grows while the fleet asks for more than the rate (see
/// [`fleet_horizon_cap`]): a node whose demand is above its share spends its tokens as they
/// come, and leaves none idle while other nodes are denied. Half again: with no limit, horizons
/// at twice the share put the whole burst in flight again (1 000 equal nodes at twice a
/// 100 000/s limit, burst 5 000: utilization 0.9619 against 0.9933 with this).
const MAX_OVER_SHARE: f64 = 1.5;

/// The longest a node with `share` (`part` of the rate) may stretch its horizon to (see
/// [`by_share`], which passes a positive share), or `None` before the store has counted the
/// leasers (or for a part of the rate too small to divide by: no cap). Tokens a node leases
/// count against the burst until its next call, about a horizon later; were each of the
/// `leasers` a node like this one, their tokens in flight would be `leasers × share ×
/// horizon`, and this keeps that within the burst over [`MIN_FILL_PARTS`]: each stretched
/// node holds at most its part (`1 / leasers`) of half the burst. More, by the node's demand
/// over its share up to [`MAX_OVER_SHARE`] times — shares follow reported demand, so that is
/// about the fleet's demand over the rate, the same for every node. A small share of a skewed
/// fleet (`leasers × part` far below 1) is not held back. 1 000 equal nodes at 80 % of
/// 100 000/s with a burst of 20 000 (`even-fleet`) leased for 229 ms (their shares near 100/s,
/// moving with the demand each reports), held the whole burst and denied 5.7 % of their
/// requests; capped (100 ms), 0.1 % (SIMULATIONS.md, "A fleet of equal small shares").
fn fleet_horizon_cap(call: &CallContext, share: f64, part: f64) -> Option<Duration> {
    if call.leasers == 0 {
        return None;
    }
    let share_over_mean = call.leasers as f64 * part;
    let over_share = if call.demand > 0.0 {
        (call.demand / share).clamp(1.0, MAX_OVER_SHARE)
    } else {
        1.0
    };
    Duration::try_from_secs_f64(fill_s(&call.quota) / MIN_FILL_PARTS / share_over_mean * over_share)
        .ok()
}

/// The rate a node can use: its demand, capped by the fair share the store last reported (if
/// any; asking beyond it is pointless, the store caps grants at it).
pub(crate) fn capped(demand: f64, share: Option<f64>) -> f64 {
    match share {
        Some(share) if share > 0.0 => demand.min(share),
        _ => demand,
    }
}

/// A fixed batch size (a plain fixed batch lease): each lease is anonymous and all or nothing,
/// `min = want = size`. Taking a whole batch or none matters under overload: with `min = 1` a
/// starved node would wake for every single token the bucket earns (two store calls per token);
/// with `min = size` the store's `retry_after` is the time until a whole batch is there. A
/// denied request larger than the batch raises the next ask, so any request up to the burst
/// can be served. No conservation: tokens a node holds are invisible to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedLease {
    size: Option<u64>,
    low_water: Option<u64>,
}

/// Default target of [`FixedLease::for_quota`]: a batch lasts about this long at the full rate.
const DEFAULT_BATCH_SECS: f64 = 0.05;

impl FixedLease {
    /// Batches of `size` tokens, refilled below half a batch.
    pub fn new(size: u64) -> Self {
        FixedLease {
            size: Some(size.max(1)),
            low_water: None,
        }
    }

    /// Batches of about 50 ms of the quota's rate (at least 1, at most the burst).
    pub fn for_quota() -> Self {
        FixedLease {
            size: None,
            low_water: None,
        }
    }

    /// Refill below `tokens` (default: half a batch).
    pub fn low_water(mut self, tokens: u64) -> Self {
        self.low_water = Some(tokens);
        self
    }

    /// The batch size for `quota`.
    pub fn size(&self, quota: &Quota) -> u64 {
        let size = self
            .size
            .unwrap_or_else(|| (quota.per_second_f64() * DEFAULT_BATCH_SECS).ceil() as u64);
        size.clamp(1, quota.burst())
    }
}

impl Default for FixedLease {
    fn default() -> Self {
        Self::for_quota()
    }
}

impl LeasePolicy for FixedLease {
    fn ask(&self, ctx: &LeaseContext) -> LeaseAsk {
        let size = self.size(&ctx.quota).max(ctx.denied);
        LeaseAsk {
            want: size,
            min: size,
            low_water: self.low_water.unwrap_or(self.size(&ctx.quota) / 2),
        }
    }

    fn terms(&self, _quota: &Quota) -> Option<LeaseTerms> {
        None
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn ctx(
        q: Quota,
        local: u64,
        denied: u64,
        demand: f64,
        share: Option<f64>,
    ) -> LeaseContext {
        LeaseContext {
            quota: q,
            local,
            denied,
            demand,
            share,
            rtt: Duration::from_micros(100),
            rate_held: 0.0,
            horizon: None,
            leasers: 0,
            fleet: 0,
        }
    }

    pub(crate) fn terms(horizon_ms: u64) -> LeaseTerms {
        LeaseTerms {
            horizon: Duration::from_millis(horizon_ms),
            ttl: Duration::from_secs(1),
            idle_after: Duration::from_millis(500),
            rate_leases: true,
        }
    }

    #[test]
    fn a_token_lease_lasts_a_part_of_a_horizon_whatever_the_share() {
        // 100 000/s, burst 100 000: the policy's horizon 250 ms. A node on terms with
        // 20 000/s of demand and a share of 2 000/s (one back from idle, or a large share of a
        // large fleet start): capped by its share, a lease of 626 tokens would last 31 ms of
        // its demand; it asks for at least 0.35 of a horizon of its demand, 1 750 (88 ms).
        let q = Quota::per_second(100_000).unwrap();
        let p = AdaptiveLease::new();
        let on_terms = |demand: f64, share: f64| LeaseContext {
            horizon: Some(Duration::from_millis(250)),
            ..ctx(q, 0, 0, demand, Some(share))
        };
        assert_eq!(p.ask(&on_terms(20_000.0, 2_000.0)).want, 1_750);
        // … and holds as much without trimming it away (twice the lease, as for any lease).
        assert_eq!(
            p.most_worth_holding(&on_terms(20_000.0, 2_000.0)),
            Some(3_500)
        );
        // A share above the demand: a horizon of demand and the round trip, as before.
        assert_eq!(p.ask(&on_terms(20_000.0, 50_000.0)).want, 6_252);
        // A demand estimate above the rate (a spike, retries) counts up to the rate: 8 750.
        assert_eq!(p.ask(&on_terms(1e6, 2_000.0)).want, 8_750);
        // Anonymous (a keyed limiter's leases: nothing counts them outstanding), holding a
        // rate, or nothing measured: no floor (the share caps the lease).
        let anonymous = p.ask(&ctx(q, 0, 0, 20_000.0, Some(2_000.0)));
        assert_eq!(anonymous.want, 626);
        let rated = p.ask(&LeaseContext {
            rate_held: 1_000.0,
            ..on_terms(20_000.0, 2_000.0)
        });
        assert!(rated.want < 1_750, "{rated:?}");
        let unmeasured = p.ask(&on_terms(0.0, 2_000.0));
        assert!(unmeasured.want < 100, "{unmeasured:?}");
    }

    #[test]
    fn a_slow_store_does_not_stretch_the_horizon_but_the_lease_covers_its_round_trip() {
        // 1 000/s, burst 1 000: horizon 250 ms, ttl 2.5 s.
        let q = Quota::per_second(1_000).unwrap();
        let p = AdaptiveLease::new();
        let t = p.terms(&q).unwrap();
        // The terms know no round trip (one that long is most often the queue a fleet start
        // makes, not the network): without a share they are the policy's own.
        assert_eq!(p.terms_at(t, &CallContext::new(q, None)), t);
        // The ask covers the round trip: 400/s of demand over 312.5 ms and a round trip of
        // 0.1 ms (126 tokens) or 40 ms (141), refilled at a quarter horizon of demand (25) or
        // three round trips of it (48).
        let quick = p.ask(&ctx(q, 0, 0, 400.0, None));
        let slow = p.ask(&LeaseContext {
            rtt: Duration::from_millis(40),
            ..ctx(q, 0, 0, 400.0, None)
        });
        assert_eq!((quick.want, quick.low_water), (126, 25));
        assert_eq!((slow.want, slow.low_water), (141, 48));
    }

    #[test]
    fn a_small_share_leases_for_longer_by_its_square_root() {
        // 100 000/s, burst 100 000: horizon 250 ms, ttl 2.5 s; one node of a thousand has a
        // share of 100/s.
        let q = Quota::per_second(100_000).unwrap();
        let p = AdaptiveLease::new();
        let t = p.terms(&q).unwrap();
        let at = |share| p.terms_at(t, &CallContext::new(q, share)).horizon;
        assert_eq!(at(None), Duration::from_millis(250));
        assert_eq!(at(Some(0.0)), Duration::from_millis(250));
        assert_eq!(at(Some(10_000.0)), Duration::from_millis(250));
        assert_eq!(at(Some(100.0)), Duration::from_millis(250));
        // A quarter of that share: twice the horizon; a hundredth: at most half the ttl.
        assert_eq!(at(Some(25.0)), Duration::from_millis(500));
        assert_eq!(at(Some(1.0)), t.ttl / 2);
        // A fixed batch lease has no terms to stretch; the trait's default leaves them be.
        struct Plain;
        impl LeasePolicy for Plain {
            fn ask(&self, ctx: &LeaseContext) -> LeaseAsk {
                FixedLease::new(1).ask(ctx)
            }
            fn terms(&self, quota: &Quota) -> Option<LeaseTerms> {
                AdaptiveLease::new().terms(quota)
            }
        }
        assert_eq!(Plain.terms_at(t, &CallContext::new(q, Some(1.0))), t);
    }

    #[test]
    fn where_the_burst_is_tight_a_share_under_a_hundredth_leases_for_longer() {
        // 100 000/s with a burst of 5 000 (50 ms): a horizon of 50 / 3 ms, ttl 1 s. A share of
        // 250/s (a four-hundredth) leases for twice that; with a burst of a second, not at all.
        let tight = Quota::per_second(100_000)
            .unwrap()
            .with_burst(5_000)
            .unwrap();
        let p = AdaptiveLease::new();
        let t = p.terms(&tight).unwrap();
        let at = |share| p.terms_at(t, &CallContext::new(tight, Some(share))).horizon;
        assert_eq!(at(1_000.0), t.horizon);
        let twice = at(250.0).as_secs_f64() / t.horizon.as_secs_f64();
        assert!((twice - 2.0).abs() < 1e-9, "{twice}");
        let wide = Quota::per_second(100_000).unwrap();
        let tw = p.terms(&wide).unwrap();
        assert_eq!(
            p.terms_at(tw, &CallContext::new(wide, Some(250.0))).horizon,
            tw.horizon
        );
    }

    #[test]
    fn a_small_share_stretches_only_as_far_as_a_fleet_like_it_can_carry() {
        // 100 000/s with a burst of 20 000 (200 ms, tight): a horizon of 66.7 ms, ttl 1 s. A
        // share of a thousandth leases for √10 times that (211 ms) — unless the store counts
        // a thousand leasers: a thousand nodes like it would hold the whole burst in flight, so
        // it stops at half the fill time over leasers × part (1 000 × 1/1 000): 100 ms.
        let q = Quota::per_second(100_000)
            .unwrap()
            .with_burst(20_000)
            .unwrap();
        let p = AdaptiveLease::new();
        let t = p.terms(&q).unwrap();
        let at = |leasers, demand| {
            let call = CallContext::new(q, Some(100.0))
                .with_leasers(leasers)
                .with_demand(demand);
            p.terms_at(t, &call).horizon.as_micros()
        };
        assert_eq!(at(0, 80.0), 210_818);
        assert_eq!(at(1_000, 80.0), 100_000);
        // Among a hundred leasers it is small beside the others too: stretched in full.
        assert_eq!(at(100, 80.0), 210_818);
        // A demand above the share spends its tokens as they come: up to half again as long.
        assert_eq!(at(1_000, 120.0), 120_000);
        assert_eq!(at(1_000, 400.0), 150_000);
        // Never shorter than the horizon itself: a share of a two-hundredth among 1 000
        // leasers would stop at 20 ms.
        let larger = CallContext::new(q, Some(500.0))
            .with_leasers(1_000)
            .with_demand(400.0);
        assert_eq!(p.terms_at(t, &larger).horizon, t.horizon);
    }

    #[test]
    fn a_large_share_of_a_large_fleet_leases_for_shorter() {
        // 100 000/s, burst 100 000: horizon 250 ms.
        let q = Quota::per_second(100_000).unwrap();
        let p = AdaptiveLease::new();
        let t = p.terms(&q).unwrap();
        let at = |share, leasers| {
            p.terms_at(t, &CallContext::new(q, Some(share)).with_leasers(leasers))
                .horizon
        };
        let ms = Duration::from_millis;
        // A thousand nodes: a share above a thousandth of the rate leases for shorter, by the
        // square root, at most by half; below it, for longer, as before.
        assert_eq!(at(100.0, 1_000), ms(250));
        assert_eq!(at(400.0, 1_000), ms(125));
        assert_eq!(at(200.0, 1_000).as_micros(), 176_776);
        assert_eq!(at(10_000.0, 1_000), ms(125));
        assert_eq!(at(25.0, 1_000), ms(500));
        // Ten thousand nodes: the same rule (the fleet's reference stops at a thousand).
        assert_eq!(at(400.0, 10_000), ms(125));
        // A hundred: only a share above a tenth shrinks.
        assert_eq!(at(10_000.0, 100), ms(250));
        assert_eq!(at(40_000.0, 100), ms(125));
        // Thirty nodes, or a count the store did not report: one horizon for all.
        assert_eq!(at(90_000.0, 30), ms(250));
        assert_eq!(at(90_000.0, 0), ms(250));
        // Never below 10 ms: under a burst of 0.045 s a horizon of 15 ms shortens to 10, one
        // of 0.03 s (10 ms) stays.
        for (burst, horizon) in [(4_500, 15), (3_000, 10)] {
            let tight = q.with_burst(burst).unwrap();
            let tt = p.terms(&tight).unwrap();
            assert_eq!(tt.horizon, ms(horizon));
            let call = CallContext::new(tight, Some(10_000.0)).with_leasers(1_000);
            assert_eq!(p.terms_at(tt, &call).horizon, ms(10));
        }
        // A rate-leasing policy keeps its horizons (shorter ones made its nodes' reviews and
        // renewals more frequent: the busiest node of a 1 000-node start 26–28 calls a second,
        // whether every node shrank or only those holding no rate).
        let rated = AdaptiveLease::new().rate_leases(true);
        let rt = rated.terms(&q).unwrap();
        let call = CallContext::new(q, Some(10_000.0)).with_leasers(1_000);
        assert_eq!(rated.terms_at(rt, &call).horizon, ms(250));
    }

    #[test]
    fn leases_a_rate_by_default_where_the_burst_is_tight_and_the_fleet_small() {
        let rates = |p: &AdaptiveLease, q: Quota, fleet: u64| {
            let call = CallContext::new(q, Some(100.0))
                .with_leasers(fleet / 2)
                .with_fleet(fleet);
            p.terms_at(p.terms(&q).unwrap(), &call).rate_leases
        };
        let p = AdaptiveLease::new();
        let q = Quota::per_second(2_000).unwrap();
        // Bursts of 0.05 s and 0.2 s of the rate are tight; a quarter second is not.
        for (burst, tight) in [(100, true), (400, true), (500, false), (2_000, false)] {
            let q = q.with_burst(burst).unwrap();
            assert_eq!(rates(&p, q, 10), tight, "burst {burst}");
            // The terms alone say off: the policy decides at each call.
            assert!(!p.terms(&q).unwrap().rate_leases);
        }
        let tight = q.with_burst(100).unwrap();
        // A fleet of up to 100 nodes (the most the store has reported); none known yet, or
        // more than 100 (even if fewer hold leases now): token leases.
        for (fleet, on) in [
            (0, false),
            (1, true),
            (100, true),
            (101, false),
            (1_000, false),
        ] {
            assert_eq!(rates(&p, tight, fleet), on, "fleet {fleet}");
        }
        // Set either way, the setting holds.
        let on = AdaptiveLease::new().rate_leases(true);
        let off = AdaptiveLease::new().rate_leases(false);
        assert!(rates(&on, q, 1_000) && !rates(&off, tight, 10));
    }

    #[test]
    fn a_longer_lease_counts_toward_leasing_rather_than_deciding_per_request() {
        // 100 000/s, burst 100 000 (a fleet of thousands): a node with 2/s of demand has two
        // tokens of the burst — per request at the policy's horizon, but a lease stretched
        // to half the ttl (five horizons) brings ten a call.
        let q = Quota::per_second(100_000).unwrap();
        let p = AdaptiveLease::new();
        let t = p.terms(&q).unwrap();
        assert!(p.per_request(&ctx(q, 0, 0, 2.0, Some(1.0)), false));
        let stretched = LeaseContext {
            horizon: Some(t.ttl / 2),
            ..ctx(q, 0, 0, 2.0, Some(1.0))
        };
        assert!(!p.per_request(&stretched, false));
    }

    #[test]
    fn decides_per_request_where_its_part_of_the_burst_is_a_token_or_two() {
        // 20/s, burst 20: a node's part of the burst is its rate in tokens.
        let q = Quota::per_second(20).unwrap();
        let p = AdaptiveLease::new();
        // Nothing measured: by the share once known (1/s: a part of one token), else no change.
        assert!(p.per_request(&ctx(q, 0, 0, 0.0, Some(1.0)), false));
        assert!(!p.per_request(&ctx(q, 0, 0, 0.0, None), false));
        assert!(p.per_request(&ctx(q, 0, 0, 0.0, None), true));
        // Measured: by the demand, not the share (2/s in, 4/s out; 5/s stays, 7/s leaves).
        assert!(p.per_request(&ctx(q, 0, 0, 2.0, Some(10.0)), false));
        assert!(!p.per_request(&ctx(q, 0, 0, 4.0, Some(1.0)), false));
        assert!(p.per_request(&ctx(q, 0, 0, 5.0, Some(1.0)), true));
        assert!(!p.per_request(&ctx(q, 0, 0, 7.0, Some(1.0)), true));
        // Off.
        let off = AdaptiveLease::new().per_request_below(0.0);
        assert!(!off.per_request(&ctx(q, 0, 0, 1.0, Some(1.0)), false));
        // A wide fleet: 100 000/s with a second of burst, a share of 10/s: ten tokens.
        let wide = Quota::per_second(100_000).unwrap();
        assert!(!p.per_request(&ctx(wide, 0, 0, 0.0, Some(10.0)), false));
        // A fixed batch lease never decides per request.
        assert!(!FixedLease::new(1).per_request(&ctx(q, 0, 0, 1.0, Some(1.0)), false));
    }

    #[test]
    fn where_the_horizon_outlasts_a_third_of_the_fill_the_threshold_is_as_much_higher() {
        // 2 000/s with a burst of 10 fills in 5 ms; the horizon is its 10 ms floor, six times
        // a third of the fill: a node whose part of the burst is 9 tokens (1 800/s) decides
        // per request, one with 18 or more leases.
        let tiny = Quota::per_second(2_000).unwrap().with_burst(10).unwrap();
        let p = AdaptiveLease::new();
        assert!(p.per_request(&ctx(tiny, 0, 0, 1_800.0, Some(1_000.0)), false));
        assert!(!p.per_request(&ctx(tiny, 0, 0, 3_700.0, Some(1_000.0)), false));
        // With a burst of 100 (50 ms: the horizon is a third of it) the same part leases.
        let tight = Quota::per_second(2_000).unwrap().with_burst(100).unwrap();
        assert!(!p.per_request(&ctx(tight, 0, 0, 180.0, Some(100.0)), false));
        assert!(p.per_request(&ctx(tight, 0, 0, 50.0, Some(100.0)), false));
    }

    #[test]
    fn leases_where_the_burst_has_room_for_every_nodes_token_several_times_over() {
        // 100 000/s, burst 5 000 (50 ms): a node with 20/s of demand has one token of it.
        let q = Quota::per_second(100_000)
            .unwrap()
            .with_burst(5_000)
            .unwrap();
        let p = AdaptiveLease::new();
        let small = |fleet| LeaseContext {
            fleet,
            ..ctx(q, 0, 0, 20.0, Some(10.0))
        };
        // Fleet not known yet: by its part alone.
        assert!(p.per_request(&small(0), false));
        // 1 000 nodes: room for 5 tokens each. It leases, and leaves the regime if in it.
        assert!(!p.per_request(&small(1_000), false));
        assert!(!p.per_request(&small(1_000), true));
        // 1 251 nodes: under 4 each (low-rate's twenty nodes share a burst of 20: one each).
        assert!(p.per_request(&small(1_251), false));
        // The count the store reports now is not the fleet: nodes deciding per request keep no
        // lease, so they are not in it.
        let counted_now = LeaseContext {
            leasers: 100,
            ..small(2_000)
        };
        assert!(p.per_request(&counted_now, false));
    }

    #[test]
    fn fixed_batches_are_all_or_nothing_and_grow_for_big_requests() {
        let q = Quota::per_second(1_000).unwrap();
        assert_eq!(FixedLease::for_quota().size(&q), 50);
        let ask = FixedLease::new(50).ask(&ctx(q, 3, 1, 0.0, None));
        assert_eq!(
            ask,
            LeaseAsk {
                want: 50,
                min: 50,
                low_water: 25
            }
        );
        let ask = FixedLease::new(50).ask(&ctx(q, 0, 80, 0.0, None));
        assert_eq!((ask.want, ask.min), (80, 80));
        assert_eq!(FixedLease::new(5_000).size(&q), 1_000, "clamped to burst");
        assert!(FixedLease::new(5).terms(&q).is_none());
    }

    #[test]
    fn automatic_horizon_is_a_third_of_the_fill_time() {
        let p = AdaptiveLease::new();
        let q = Quota::per_second(1_000).unwrap();
        assert_eq!(
            p.horizon_for(&q),
            MAX_AUTO_HORIZON,
            "1 s of burst: capped at 250 ms"
        );
        let q = q.with_burst(300).unwrap();
        let h = p.horizon_for(&q).as_secs_f64();
        assert!((h - 0.1).abs() < 1e-6, "{h}");
        let q = q.with_burst(1).unwrap();
        assert_eq!(p.horizon_for(&q), MIN_AUTO_HORIZON);
        let fixed = p.horizon(Duration::from_millis(70));
        let wide = q.with_burst(300).unwrap();
        assert_eq!(fixed.horizon_for(&wide), Duration::from_millis(70));
    }

    #[test]
    fn a_set_horizon_is_at_most_half_the_fill_time() {
        // 100 000/s with a burst of 5 000: a fill time of 50 ms. A horizon of 100 ms would let
        // the fleet be granted at most 50 000 tokens a second: 25 ms is used.
        let q = Quota::per_second(100_000)
            .unwrap()
            .with_burst(5_000)
            .unwrap();
        let long = AdaptiveLease::new().horizon(Duration::from_millis(100));
        assert_eq!(long.horizon_for(&q), Duration::from_millis(25));
        assert_eq!(long.terms(&q).unwrap().horizon, Duration::from_millis(25));
        // Shorter ones as set; never shortened below 10 ms (a burst of 1 ms of the rate).
        let short = AdaptiveLease::new().horizon(Duration::from_millis(20));
        assert_eq!(short.horizon_for(&q), Duration::from_millis(20));
        let tiny = q.with_burst(100).unwrap();
        assert_eq!(long.horizon_for(&tiny), MIN_AUTO_HORIZON);
        assert_eq!(
            AdaptiveLease::new()
                .horizon(Duration::from_millis(5))
                .horizon_for(&tiny),
            Duration::from_millis(5)
        );
    }

    #[test]
    fn adaptive_asks_for_a_horizon_of_demand_capped_by_share() {
        // A horizon of 0.1 s (a third of 0.3 s of burst).
        let q = Quota::per_second(10_000)
            .unwrap()
            .with_burst(3_000)
            .unwrap();
        let p = AdaptiveLease::new();
        // 2 000/s demand, no share yet: 2 000 × (0.125 + 0.0001) = 250.2 → 251, minus 51 held.
        let ask = p.ask(&ctx(q, 51, 0, 2_000.0, None));
        assert_eq!(ask.want, 200);
        assert_eq!(ask.min, 1);
        assert_eq!(ask.low_water, 50, "a quarter horizon of demand");
        // The store says our share is 800/s: ask for that, not for the demand.
        let ask = p.ask(&ctx(q, 0, 0, 2_000.0, Some(800.0)));
        assert_eq!(ask.want, 101);
    }

    #[test]
    fn adaptive_holds_at_most_two_leases_of_measured_demand() {
        let q = Quota::per_second(10_000)
            .unwrap()
            .with_burst(3_000)
            .unwrap();
        let p = AdaptiveLease::new();
        let most = |demand, share| p.most_worth_holding(&ctx(q, 0, 0, demand, share));
        assert_eq!(
            most(0.0, None),
            None,
            "nothing measured: nothing to judge by"
        );
        // 2 000/s over 0.1 s × 1.25 + 100 µs is 250.2 a lease; two are 500.4.
        assert_eq!(most(2_000.0, None), Some(501));
        // The store's share (800/s) caps it.
        assert_eq!(most(2_000.0, Some(800.0)), Some(201));
        let fixed = FixedLease::new(5).most_worth_holding(&ctx(q, 0, 0, 2_000.0, None));
        assert_eq!(fixed, None, "anonymous batches are never given back early");
    }

    #[test]
    fn adaptive_terms_default_and_bounds() {
        let q = Quota::per_second(10).unwrap().with_burst(3).unwrap();
        let t = AdaptiveLease::new().terms(&q).unwrap();
        assert!(
            t.horizon.abs_diff(Duration::from_millis(100)) < Duration::from_micros(1),
            "{t:?}"
        );
        assert_eq!(t.ttl, Duration::from_secs(1));
        // A burst of 3 s of the rate carries a horizon of 1 s.
        let t = AdaptiveLease::new()
            .horizon(Duration::from_secs(1))
            .ttl(Duration::from_millis(10))
            .terms(&q.with_burst(30).unwrap())
            .unwrap();
        assert_eq!(
            t.ttl,
            Duration::from_secs(2),
            "ttl is at least two horizons"
        );
        assert_eq!(AdaptiveLease::new().headroom(f64::NAN).headroom, 1.0);
    }
}
