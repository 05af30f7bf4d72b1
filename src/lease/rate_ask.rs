//! Whether a node should ask for a rate lease, and how a rate shapes the token lease that
//! goes with it.
//!
//! A rate lease pays where token leases are small — a tight burst, a small share — and a
//! node's counted tokens can carry it (see `lease/drip.rs`: the node drips the rate into its
//! local bucket between calls, inside its counted tokens less one step's slack).
//!
//! Two rules make rate leases fill the whole rate where the burst is tight:
//! - **Room for small shares.** A node's counted tokens are its part of the burst (by its part
//!   of the rate), which for a small share may have no room for the slack and [`MIN_ROOM`]
//!   tokens. When the store's count of claimants (the leasers, and the anonymous callers
//!   beside them as one more) says every node could have that room beside the others
//!   (`leasers × (slack + MIN_ROOM) ≤ burst`), a small share takes it anyway — in a
//!   fleet of at most [`EVEN_ROOM_MAX_LEASERS`]: in a larger one the many small shares' rate
//!   leases hold more of the burst than the busy nodes can spare. Beyond
//!   [`FULL_ROOM_MAX_LEASERS`] the room a rate needs is one token less ([`FLEET_MIN_ROOM`]):
//!   a fleet of a thousand small shares fits its rates in a tight burst beside the busy
//!   nodes' parts only so.
//! - **Asking a little above the share.** Shares move between renewals, so the rates held sum
//!   to less than the rate; the rest refills the shared bucket, whose ceiling (the capacity
//!   less the tokens leased out, every rated node's counted tokens among them) it soon
//!   reaches, and is lost. A node asks for up
//!   to [`ABOVE_SHARE`] times its share (never above its demand); the store grants beyond the
//!   share only while its bucket sits at that ceiling (see `lua/token_bucket.lua`, "Rate
//!   leases"), so the unheld rate goes to the nodes that want it instead of being lost.
//!
//! A rate is held until it is renewed, so it keeps whatever error its share had when it was
//! granted. Shares follow the demands nodes report, and right after a start those are still
//! climbing (each node's estimate warms up over its time constant, and nodes that have not
//! called since they were built still count with the demand they had then), so the first
//! shares are far off: the first nodes to call hold shares of most of the rate. A rate granted
//! then and held for half a ttl starves the nodes that lease tokens, whose refill is what the
//! rates leave. So a rate is renewed after as long as the node's demand had been measured when
//! it was granted ([`renew_after`]): after two horizons at least, then about twice as long each
//! time, up to half the ttl — a few calls more per start, each bringing the rate nearer the
//! share. The measure runs from the node's first demand since its limiter was built, or since
//! it last gave its lease back for idleness: its estimate warms up again from there (bursty,
//! rate leases: Jain 0.9966 → 0.9991, min/max acceptance 0.848 → 0.904, 5 more calls in 60 s).
//!
//! A rate ends when its node goes quiet: no request for twenty expected gaps at its demand
//! estimate as it was at its last request, and at least a review (the background task's
//! `quiet_at`); the node then renews asking for no rate. Renewals alone end a rate only as the estimate decays, halving
//! it call by call over a second or so, and where demand comes and goes across a fleet that
//! held rate is refill no one spends: 1 000 nodes each busy one second in twenty admitted
//! half their budget with rate leases (`sparse-tight-fleet` in SIMULATIONS.md).

use std::time::Duration;

use crate::algorithm::token_bucket::{drip_slack, drip_step_us};
use crate::quota::{Quota, MAX_VALUE};
use crate::time::micros;

use super::policy::{capped, LeaseAsk, LeaseContext, LeaseTerms};

/// A node asks for a rate lease while a horizon of its usable rate is below this many tokens
/// (twice this once it holds one): token leases that small would be frequent, while a node
/// with more to lease makes few calls anyway and follows changes of demand faster on them —
/// unless its horizon is under [`RATE_LEASE_SHORTER`].
const RATE_LEASE_BELOW: f64 = 32.0;

/// A node held to its share asks for a rate lease, however large its token leases would be,
/// while its horizon is under this: a busy node leasing tokens calls about once a horizon, so
/// more than 20 times a second below 50 ms (a burst under 150 ms of the rate), however many
/// tokens each call brings. 1 000 nodes sharing a burst of 50 ms of the rate, rate leases on:
/// the ten busiest made 2–3 calls a second instead of 19–58, utilization 0.9868 → 0.9907
/// (SIMULATIONS.md, "Rate leases for short horizons, one horizon of room"). Not a node with
/// tokens to spare (its demand under its share): one whose demand ramped from 10 000 to 145 000
/// a second under a limit of 10 000 000 was denied 164 times on a rate, never on tokens.
const RATE_LEASE_SHORTER: Duration = Duration::from_millis(50);

/// Fewest tokens a rate lease's local bucket must have room for: requests arrive unevenly, and
/// what the rate brings while the bucket is full is lost. A node whose part of the burst is
/// smaller leases tokens instead: with a local bucket of one or two tokens a rated node lost
/// 13–33 % of its rate (ten nodes sharing a burst of 100), and thirty nodes sharing it admitted
/// 0.85 of the budget where token leases admit 0.9997 (SIMULATIONS.md, "Rate leases").
const MIN_ROOM: u64 = 4;

/// [`MIN_ROOM`] in a fleet of more than [`FULL_ROOM_MAX_LEASERS`] leasers (as the store
/// counts them), where many small shares each hold room for a rate: one token less each keeps
/// their rates within the burst beside the busy nodes' parts. 1 000 nodes sharing a burst of
/// 50 ms of the rate, rate leases on (`tight-burst-fleet`): 217 280 → 45 482 store calls (3 %
/// of pure mode's), the busiest node 28 → 15 calls a second, utilization 0.9915 → 0.9853 —
/// the quiet nodes' rates replace their token-at-a-time leases, and a local bucket of three
/// tokens drops a little of what the rate brings (SIMULATIONS.md, "Room for three tokens in
/// a large fleet").
const FLEET_MIN_ROOM: u64 = 3;

/// The largest fleet (leasers, as the store counts them) in which a rate needs room for
/// [`MIN_ROOM`] tokens beside the slack; [`FLEET_MIN_ROOM`] in a larger one.
const FULL_ROOM_MAX_LEASERS: u64 = 100;

/// The largest fleet (leasers, as the store counts them) in which a small share takes the room
/// the burst has for every leaser beside the others: at 10 000 nodes (Zipf demand) the tail's
/// rate leases of 5 counted tokens each held what the busy nodes needed — utilization 0.914
/// without the rule, 0.885 with it at any fleet size (SIMULATIONS.md, "Rate leases"); with
/// rooms of [`FLEET_MIN_ROOM`], a limit of 100 000 leasers cost a 10 000-node start 0.011 of
/// utilization (0.9260 → 0.9147) where 1 000 costs it nothing.
const EVEN_ROOM_MAX_LEASERS: u64 = 1_000;

/// How far above its share a node asks for a rate (never above its demand): the store grants
/// that much only while its shared bucket sits at its ceiling, its refill otherwise lost.
/// Asking for the whole demand made renewals chase a rate the store would not grant, and a
/// node that had taken the leftover kept it after its demand moved (moving-hotspot, rate
/// leases: utilization 0.9885 → 0.9701); 1.05 did as well as this on the tight scenarios
/// (SIMULATIONS.md, "Rate leases").
const ABOVE_SHARE: f64 = 1.25;

/// How long after the call that granted it a rate lease is renewed, the node's demand having
/// been measured for `measured` at that call (see the module docs): as long again (the estimate
/// may have doubled since, and the shares with it), at least two horizons (a rate renewed
/// sooner than that costs more calls than the token leases it replaces) and at most half the
/// ttl (the lease must be renewed before it expires).
pub(crate) fn renew_after(measured: Duration, terms: &LeaseTerms) -> Duration {
    measured.max(terms.horizon * 2).min(terms.ttl / 2)
}

/// A rate lease to ask for (see `lease/drip.rs`), and how it shapes the token lease that
/// goes with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RateAsk {
    /// The rate, millitokens per second: the node's demand as sized for leases, capped at
    /// [`ABOVE_SHARE`] times its share.
    pub(crate) rate_mtps: u64,
    /// Counted tokens worth keeping for it: the slack plus room for a horizon of the rate (at
    /// least [`MIN_ROOM`]), never more than the node's room in the burst (which has room for
    /// the slack and [`MIN_ROOM`], or [`FLEET_MIN_ROOM`] beyond [`FULL_ROOM_MAX_LEASERS`]
    /// leasers). Every counted token lowers the shared bucket's ceiling
    /// (the burst less what is counted out), and a rated node's drip fills its bucket only
    /// while its demand lags its rate: room for two horizons held the ceiling so low that
    /// the refill the rates leave was lost there (1 000 nodes each busy one second in twenty:
    /// utilization 0.925 with two horizons, 0.990 with one; SIMULATIONS.md, "Rate leases for
    /// short horizons, one horizon of room").
    pub(crate) capacity: u64,
    /// Fewest tokens beyond the rate worth a call while it is held: a horizon of it.
    pub(crate) batch: u64,
}

impl RateAsk {
    /// The token lease to make with it, given `have` (counted tokens while `rated`, else what
    /// the node holds): enough to reach its capacity; while rated, tokens beyond the rate only
    /// in batches worth a call (the store paces the node until they are there); unrated, the
    /// tokens that carry the rate or none (taken one at a time, each would be spent before the
    /// next came).
    pub(crate) fn shape(&self, mut ask: LeaseAsk, have: u64, rated: bool) -> LeaseAsk {
        let short = self.capacity.saturating_sub(have);
        ask.want = ask.want.max(short);
        ask.min = ask.min.max(if rated { self.batch } else { short });
        ask.want = ask.want.max(ask.min);
        ask
    }
}

/// The rate lease a node on `terms` should ask for, if any (`rated`: it holds one now).
///
/// A rate lease pays where token leases are small — a tight burst, a small share — and a
/// node's counted tokens carry it; it costs where demand moves fast (a rate is renewed every
/// half ttl, token leases follow demand at every call). So: none before any demand is
/// measured (the first lease is sized without one, the next call asks), none when a horizon
/// of the usable rate is more than [`RATE_LEASE_BELOW`] tokens unless the horizon is under
/// [`RATE_LEASE_SHORTER`] and the node held to its share, and none when the node's room
/// has none for [`MIN_ROOM`] tokens beside the slack ([`FLEET_MIN_ROOM`] in a fleet of more
/// than [`FULL_ROOM_MAX_LEASERS`]) — its room being its part of the burst
/// (by its part of the rate), or, if larger and the fleet has at most
/// [`EVEN_ROOM_MAX_LEASERS`] nodes, that much of the burst over the claimants the store counts
/// (the leasers, and anonymous callers as one more).
/// Its capacity never exceeds that room. Parts fit in the burst together; rooms taken by small
/// shares beside large parts may not — then the last nodes to ask cannot start a rate (the
/// store grants counted tokens only from the bucket, whose level and outstanding tokens never
/// exceed the burst: the bound holds, utilization pays).
pub(crate) fn rate_ask(
    quota: &Quota,
    terms: &LeaseTerms,
    ctx: &LeaseContext,
    rated: bool,
) -> Option<RateAsk> {
    let usable = capped(ctx.demand, ctx.share);
    let rate_mtps = (usable * 1_000.0).min(MAX_VALUE as f64) as u64;
    let horizon = terms.horizon.as_secs_f64();
    let slack = drip_slack(rate_mtps, drip_step_us(micros(terms.horizon)));
    let part = quota.burst() as f64 * usable / quota.per_second_f64();
    let limit = if rated { 2.0 } else { 1.0 } * RATE_LEASE_BELOW;
    let min_room = if ctx.leasers > FULL_ROOM_MAX_LEASERS {
        FLEET_MIN_ROOM
    } else {
        MIN_ROOM
    };
    let need = slack + min_room;
    // The room every leaser could have beside the others: a small part may take that much.
    let even = if ctx.leasers > 0 && ctx.leasers <= EVEN_ROOM_MAX_LEASERS {
        quota.burst() as f64 / ctx.leasers as f64
    } else {
        0.0
    };
    let room = part.max(even.min(need as f64));
    // A short horizon asks for a rate only where the node is held to its share (its demand
    // above it; above half of it once rated): with tokens to spare, a rated node whose demand
    // outgrows its rate between renewals is denied while the fleet has tokens, and token
    // leases follow it at every call.
    let held_to_share = ctx
        .share
        .is_some_and(|share| ctx.demand > share * if rated { 0.5 } else { 1.0 });
    let short = terms.horizon < RATE_LEASE_SHORTER && held_to_share;
    let large = usable * horizon > limit && !short;
    if rate_mtps == 0 || room < need as f64 || large {
        return None;
    }
    let asked = capped(ctx.demand, ctx.share.map(|share| share * ABOVE_SHARE));
    let lease = (usable * horizon).ceil() as u64;
    Some(RateAsk {
        rate_mtps: ((asked * 1_000.0).min(MAX_VALUE as f64) as u64).max(rate_mtps),
        capacity: (slack + lease.max(MIN_ROOM)).min(room as u64),
        batch: lease,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::policy::tests::{ctx, terms};

    #[test]
    fn rate_leases_where_token_leases_would_be_small() {
        // A tight burst: 2 000/s, burst 100, a horizon of 12 ms; a node with a share of 200/s.
        let q = Quota::with_parts(2_000, Duration::from_secs(1), 100).unwrap();
        let t = terms(12);
        let r = rate_ask(&q, &t, &ctx(q, 0, 0, 400.0, Some(200.0)), false).unwrap();
        // It asks for 250/s (a quarter above its share: the store grants beyond the share only
        // while its bucket sits at its ceiling); tokens by the 200/s it can count on: slack 1
        // (a 3 ms step), room 4 (a horizon of 2.4 tokens is 3, rounded up; at least 4); its
        // part of the burst is 10 tokens.
        assert_eq!((r.rate_mtps, r.capacity, r.batch), (250_000, 5, 3));
        // Never above its demand; with no share known, its demand.
        let r = rate_ask(&q, &t, &ctx(q, 0, 0, 220.0, Some(200.0)), false).unwrap();
        assert_eq!(r.rate_mtps, 220_000);
        let r = rate_ask(&q, &t, &ctx(q, 0, 0, 150.0, None), false).unwrap();
        assert_eq!(r.rate_mtps, 150_000);
        // Nothing measured yet: no rate.
        assert_eq!(rate_ask(&q, &t, &ctx(q, 0, 0, 0.0, None), false), None);
        // One second of burst, a horizon of 250 ms: 50 tokens a lease, token leases serve.
        let wide = Quota::with_parts(2_000, Duration::from_secs(1), 2_000).unwrap();
        assert_eq!(
            rate_ask(
                &wide,
                &terms(250),
                &ctx(wide, 0, 0, 400.0, Some(200.0)),
                false
            ),
            None
        );
        // ... unless it already holds a rate and is under twice the bound (hysteresis).
        let held = rate_ask(
            &wide,
            &terms(250),
            &ctx(wide, 0, 0, 200.0, Some(200.0)),
            true,
        );
        assert!(held.is_some());
        // A burst of 50 ms of a large rate: a horizon of 17 ms. The busiest node's horizon of
        // 25 000/s is 425 tokens, far above the bound, but token leases would make it call
        // about 60 times a second: a rate, with a horizon of room (425 tokens, 426 as rounded up
        // in doubles, beside the slack of 107: a 4.25 ms step), within its part of 1 250.
        let fleet = Quota::with_parts(100_000, Duration::from_secs(1), 5_000).unwrap();
        let busy = ctx(fleet, 0, 0, 46_000.0, Some(25_000.0));
        let r = rate_ask(&fleet, &terms(17), &busy, false).unwrap();
        assert_eq!((r.rate_mtps, r.capacity, r.batch), (31_250_000, 533, 426));
        // From a horizon of 50 ms on, the bound again; and with tokens to spare (a demand
        // under the share), the bound whatever the horizon.
        assert_eq!(rate_ask(&fleet, &terms(50), &busy, false), None);
        let ample = ctx(fleet, 0, 0, 25_000.0, Some(40_000.0));
        assert_eq!(rate_ask(&fleet, &terms(17), &ample, false), None);
        // Rated, it keeps the rate down to half its share.
        let slower = ctx(fleet, 0, 0, 20_000.0, Some(25_000.0));
        assert!(rate_ask(&fleet, &terms(17), &slower, true).is_some());
        assert_eq!(rate_ask(&fleet, &terms(17), &slower, false), None);
    }

    #[test]
    fn no_rate_lease_where_the_burst_cannot_carry_one() {
        // 20 nodes share 20/s with a burst of 20: a node's part of the burst is one token, no
        // room beside the slack.
        let q = Quota::with_parts(20, Duration::from_secs(1), 20).unwrap();
        assert_eq!(
            rate_ask(&q, &terms(250), &ctx(q, 0, 0, 2.0, Some(1.0)), false),
            None
        );
        // Thirty nodes share 2 000/s with a burst of 100: a part of 3.3 tokens, room for 2.3
        // beside the slack of 1 — not the 4 a rate needs; nor does the burst over 30 leasers.
        let tight = Quota::with_parts(2_000, Duration::from_secs(1), 100).unwrap();
        let small = |leasers| LeaseContext {
            leasers,
            ..ctx(tight, 0, 0, 133.0, Some(66.7))
        };
        assert_eq!(rate_ask(&tight, &terms(12), &small(0), false), None);
        assert_eq!(rate_ask(&tight, &terms(12), &small(30), false), None);
        // Among 20 leasers every node has room for 5 (100 / 20): the slack and 4.
        let r = rate_ask(&tight, &terms(12), &small(20), false).unwrap();
        assert_eq!((r.rate_mtps, r.capacity), (83_375, 5));
        // Not in a fleet of more than 1 000: a burst of 10 000 over 1 001 leasers has room for
        // 9.99 each, but a node's part (2 tokens) is its own.
        let wide = Quota::with_parts(200_000, Duration::from_secs(1), 10_000).unwrap();
        let crowd = |leasers| LeaseContext {
            leasers,
            ..ctx(wide, 0, 0, 40.0, Some(40.0))
        };
        assert!(rate_ask(&wide, &terms(12), &crowd(100), false).is_some());
        assert!(rate_ask(&wide, &terms(12), &crowd(1_000), false).is_some());
        assert_eq!(rate_ask(&wide, &terms(12), &crowd(1_001), false), None);
        // Up to 100 leasers a rate needs room for 4 beside the slack, beyond for 3: 2 000
        // leasers of 100 000/s sharing a burst of 5 000 have room for 2.5 each, 300 for 16.7,
        // and a node whose part is 4 tokens (a share of 80/s) takes a rate of 3 counted
        // tokens among 101 leasers, 5 among 100.
        let tight_fleet = Quota::with_parts(100_000, Duration::from_secs(1), 5_000).unwrap();
        let among = |leasers, demand, share| LeaseContext {
            leasers,
            ..ctx(tight_fleet, 0, 0, demand, Some(share))
        };
        let small = rate_ask(&tight_fleet, &terms(17), &among(300, 22.0, 11.0), false).unwrap();
        assert_eq!((small.rate_mtps, small.capacity), (13_750, 4));
        assert_eq!(
            rate_ask(&tight_fleet, &terms(17), &among(2_000, 22.0, 11.0), false),
            None
        );
        let r = rate_ask(&tight_fleet, &terms(17), &among(100, 160.0, 80.0), false).unwrap();
        assert_eq!(r.capacity, 5);
        let r = rate_ask(&tight_fleet, &terms(17), &among(101, 160.0, 80.0), false).unwrap();
        assert_eq!(r.capacity, 4);
        // A small node of a big fleet: a part of 2 tokens, none; of 6, the slack and room for
        // 4 (a horizon of 6/s is 2 tokens, rounded up); on a 1 s horizon, capped at its part
        // (the slack of 2 and a horizon, 6, would be 8).
        let big = Quota::with_parts(100_000, Duration::from_secs(1), 100_000).unwrap();
        assert_eq!(
            rate_ask(&big, &terms(250), &ctx(big, 0, 0, 2.0, Some(10.0)), false),
            None
        );
        let r = rate_ask(&big, &terms(250), &ctx(big, 0, 0, 6.0, Some(10.0)), false).unwrap();
        assert_eq!((r.rate_mtps, r.capacity), (6_000, 5));
        let r = rate_ask(&big, &terms(1_000), &ctx(big, 0, 0, 6.0, Some(10.0)), false).unwrap();
        assert_eq!((r.rate_mtps, r.capacity), (6_000, 6));
    }

    #[test]
    fn a_young_rate_is_renewed_soon_then_at_half_the_ttl() {
        // A horizon of 66 ms, a ttl of 1 s.
        let t = terms(66);
        let ms = Duration::from_millis;
        // Granted 20 ms into the demand: two horizons on. Then as long again as it had been
        // measured: 300 ms after 300 ms. Measured for long: half the ttl.
        assert_eq!(renew_after(ms(20), &t), ms(132));
        assert_eq!(renew_after(ms(152), &t), ms(152));
        assert_eq!(renew_after(ms(300), &t), ms(300));
        assert_eq!(renew_after(ms(5_000), &t), ms(500));
        // Nothing measured (a rate is not asked for then, but a schedule still exists).
        assert_eq!(renew_after(Duration::ZERO, &t), ms(132));
    }

    #[test]
    fn a_rate_shapes_its_token_lease() {
        let r = RateAsk {
            rate_mtps: 200_000,
            capacity: 5,
            batch: 3,
        };
        let base = LeaseAsk {
            want: 1,
            min: 1,
            low_water: 0,
        };
        // Unrated with 1 token: the 4 that carry the rate, all or none.
        assert_eq!(
            r.shape(base, 1, false),
            LeaseAsk {
                want: 4,
                min: 4,
                low_water: 0
            }
        );
        // Rated at capacity: tokens beyond the rate only a horizon's worth at a time.
        assert_eq!(
            r.shape(base, 5, true),
            LeaseAsk {
                want: 3,
                min: 3,
                low_water: 0
            }
        );
    }
}
