//! A rate lease's drip: what a rate held from the store earns, added to the local bucket by the
//! node itself between store calls.
//!
//! A token lease hands a node a batch of tokens; the fleet can hold at most one burst of them,
//! so with a tight burst leases are small and frequent. A *rate lease* (as Doorman leases
//! capacity, and CockroachDB's tenant buckets trickle grants over a period) hands it a rate
//! instead: the store carves the rate out of the shared bucket's refill, and the node adds what
//! it earns to its local bucket as time passes, with no call until it renews the lease.
//!
//! The node's counted tokens (what the store counts as outstanding for it) become its own
//! bucket while it holds a rate: it keeps reporting them as held, so the store keeps counting
//! them, and the drip refills the local bucket into them. The bound `burst + rate × W` holds
//! because the node keeps three rules (`lua/token_bucket.lua` says the store's side):
//! - **one step at most**: a drip covers at most one step (a quarter of the horizon) of time,
//!   however long since the last one. Drips are lazy — callers spend between them — so a drip
//!   after the bucket sat full adds what a continuous bucket would have lost at its cap: the
//!   node can run ahead of a continuous bucket by at most one step's tokens, the **slack**
//!   (the fraction of a token a drip carries to the next never reaches past the cap either);
//! - **slack kept back**: the local bucket never holds more than the counted tokens less the
//!   slack, so the run-ahead stays inside what the store counts;
//! - **in flight, the lesser rate**: no drip while a call is in flight; the store ends the old
//!   rate and starts the new one when it runs the call, some time between the node's send and
//!   its reply, so when the reply comes the node adds what the lesser of the two rates earned
//!   over the whole flight (up to the old lease's local expiry, and one step of it at most, as
//!   any drip) — the rate it uses is always one the store has counted. That is added at the
//!   reply or not at all, never with a later drip, and only into room the local bucket had at
//!   the send: what callers spent in flight was reported held, so the store still counts it,
//!   and filling its room at once let the fleet spend a step beyond the burst at that instant. Without it a renewal cost a round trip of
//!   the rate: 1 % on a store 5 ms away renewed twice a second;
//! - **none after expiry**: nothing is earned past the lease's local expiry, which comes before
//!   the store's;
//! - **fractions kept**: the fraction of a token earned and not yet added is kept across a
//!   renewal (it was earned under a rate the store counted); dropping it cost half a token a
//!   call.
//!
//! `tests/conservation.rs` checks the bound with nodes that follow these rules.
//!
//! Nothing here does I/O or reads a clock: the background task passes the time.

use std::time::Duration;

use tokio::time::Instant;

use crate::algorithm::token_bucket::{drip_slack, drip_step_us};
use crate::time::micros;

/// Millitoken-microseconds in a token.
const PER_TOKEN: u128 = 1_000_000_000;

/// A rate lease's drip (none until a store grants a rate).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Drip {
    /// The rate held, millitokens per second (0: none).
    rate_mtps: u64,
    /// Counted tokens kept out of the local bucket (one step's worth, rounded up).
    slack: u64,
    /// The longest time one drip covers.
    step: Duration,
    /// When the last drip was (or the rate was granted); `None` while a call is in flight.
    from: Option<Instant>,
    /// The lease's local expiry: nothing is earned past it.
    until: Option<Instant>,
    /// While a call is in flight: when the drip was suspended, with `rate_mtps` and `until`
    /// those of the rate it held then.
    paused_at: Option<Instant>,
    /// The fraction of a token earned and not yet added, in millitoken-microseconds (exact:
    /// a token is 10^9 of them).
    carry: u128,
    /// What a call's flight earned, to be added at its reply ([`pay_flight`](Self::pay_flight))
    /// or not at all, never merged into a later drip (that one would cover more than a step).
    owed: u128,
}

impl Drip {
    /// Starts dripping `rate_mtps` (the store's grant to a node of `horizon`) from `now`, the
    /// reply's arrival, until the lease's local expiry `until`. A rate of 0 stops the drip.
    /// After a [`suspend`](Self::suspend), what the lesser of the old and new rates earned
    /// while the call was in flight — up to the old lease's local expiry, over one step at
    /// most — with the fraction carried from before, is owed to
    /// [`pay_flight`](Self::pay_flight).
    pub(crate) fn start(
        &mut self,
        rate_mtps: u64,
        horizon: Duration,
        now: Instant,
        until: Instant,
    ) {
        let step_us = drip_step_us(micros(horizon));
        let step = Duration::from_micros(step_us);
        let dripping = rate_mtps > 0 && step_us > 0;
        let owed = match (self.paused_at, self.until) {
            (Some(at), Some(old_until)) if dripping => {
                let flight = now.min(old_until).saturating_duration_since(at).min(step);
                u128::from(self.rate_mtps.min(rate_mtps)) * u128::from(micros(flight)) + self.carry
            }
            _ => 0,
        };
        *self = Drip {
            rate_mtps,
            slack: drip_slack(rate_mtps, step_us),
            step,
            from: dripping.then_some(now),
            until: dripping.then_some(until),
            paused_at: None,
            carry: 0,
            owed,
        };
    }

    /// Stops: the rate is gone (given back, expired, or unknown after a failed call).
    pub(crate) fn stop(&mut self) {
        *self = Drip::default();
    }

    /// Pauses at `now` while a call is in flight (its reply starts the drip again); the drip
    /// is up to `now` (see [`earn`](Self::earn)).
    pub(crate) fn suspend(&mut self, now: Instant) {
        self.paused_at = self.from.take().map(|_| now);
        self.owed = 0;
    }

    /// Resumes at `now` the rate held before a [`suspend`](Self::suspend), to its old local
    /// expiry, where the call in flight changed nothing the store holds for the node (it was
    /// refused before the node's record was read). Its flight earns nothing (the safe side).
    pub(crate) fn resume(&mut self, now: Instant) {
        if self.paused_at.take().is_some() && self.until.is_some_and(|until| now < until) {
            self.from = Some(now);
        }
    }

    /// The rate held and dripping, millitokens per second (0 if none or suspended).
    pub(crate) fn rate_mtps(&self) -> u64 {
        if self.from.is_some() {
            self.rate_mtps
        } else {
            0
        }
    }

    /// Counted tokens to keep out of the local bucket while the rate is held.
    #[cfg(test)]
    pub(crate) fn slack(&self) -> u64 {
        self.slack
    }

    /// The most the local bucket may hold with `counted` tokens counted by the store: all of
    /// them without a rate, less the slack with one.
    pub(crate) fn cap(&self, counted: u64) -> u64 {
        counted.saturating_sub(self.slack)
    }

    /// The rate held, tokens per second (0 if none or suspended).
    pub(crate) fn per_second(&self) -> f64 {
        self.rate_mtps() as f64 / 1_000.0
    }

    /// When the next drip is due: half a step after the last one, so a timer that fires late
    /// (tokio's have a resolution of a millisecond) still lands within the step and nothing
    /// the rate earned is lost; at the lease's local expiry at the latest, and none after it
    /// (`None` if not dripping).
    pub(crate) fn due(&self) -> Option<Instant> {
        let (from, until) = (self.from?, self.until?);
        (from < until).then(|| (from + self.step / 2).min(until))
    }

    /// The tokens to add at `now`: what the rate earned since the last drip (over one step at
    /// most; nothing past the lease's local expiry), but no more than fills the local bucket
    /// (`held` now, at least what is there) to its cap with `counted` tokens counted by the
    /// store ([`cap`](Self::cap)). What does not fit is lost, as a full bucket's refill is.
    pub(crate) fn earn(&mut self, now: Instant, counted: u64, held: u64) -> u64 {
        let (Some(from), Some(until)) = (self.from, self.until) else {
            return 0;
        };
        let now = now.min(until);
        if now <= from {
            return 0;
        }
        let dt = (now - from).min(self.step);
        self.from = Some(now);
        let amount = u128::from(self.rate_mtps) * u128::from(micros(dt)) + self.carry;
        self.add(amount, counted, held)
    }

    /// Adds what the call just answered owed for its flight (see [`start`](Self::start)), as
    /// [`earn`](Self::earn) adds a drip; once.
    pub(crate) fn pay_flight(&mut self, counted: u64, held: u64) -> u64 {
        let owed = std::mem::take(&mut self.owed);
        if owed == 0 || self.from.is_none() {
            return 0;
        }
        self.add(owed, counted, held)
    }

    /// The whole tokens of `amount` that fit under the cap; the fraction is carried.
    fn add(&mut self, amount: u128, counted: u64, held: u64) -> u64 {
        let whole = u64::try_from(amount / PER_TOKEN).unwrap_or(u64::MAX);
        let room = self.cap(counted).saturating_sub(held);
        let add = whole.min(room);
        // The fraction carried never reaches past the cap either (a full bucket loses what
        // it earns, fractions included): held + added + carried stays within the cap, so the
        // next drip runs ahead of a continuous bucket by one step's tokens at most.
        let left = u128::from(room - add) * PER_TOKEN;
        self.carry = if add == whole {
            (amount % PER_TOKEN).min(left)
        } else {
            0
        };
        add
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Instant {
        // A fixed origin: tokio's Instant has no zero.
        static ORIGIN: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *ORIGIN.get_or_init(Instant::now) + Duration::from_millis(ms)
    }

    /// A lease's local expiry far away.
    fn far() -> Instant {
        at(1_000_000)
    }

    #[test]
    fn earns_the_rate_with_fractions_carried() {
        let mut d = Drip::default();
        // 300 tokens/s, horizon 40 ms: steps of 10 ms, 3 tokens each.
        d.start(300_000, Duration::from_millis(40), at(0), far());
        assert_eq!(d.due(), Some(at(5)));
        let mut total = 0;
        for ms in (1..=100).map(|i| i * 2) {
            total += d.earn(at(ms), 1_000, 0);
        }
        assert_eq!(total, 60, "200 ms at 300/s");
    }

    #[test]
    fn resumes_the_old_rate_to_its_old_expiry() {
        let mut d = Drip::default();
        d.start(300_000, Duration::from_millis(40), at(0), at(100));
        d.suspend(at(20));
        assert_eq!((d.rate_mtps(), d.due()), (0, None));
        d.resume(at(30));
        assert_eq!(d.rate_mtps(), 300_000);
        assert_eq!(d.due(), Some(at(35)));
        // The flight (20 → 30 ms) earned nothing; from 30 ms on, a step at most.
        assert_eq!(d.earn(at(40), 1_000, 0), 3);
        // Nothing past the old expiry.
        assert_eq!(d.earn(at(200), 1_000, 0), 3);
        assert_eq!(d.earn(at(300), 1_000, 0), 0);
        // Past its expiry it stays suspended; without a suspend it does nothing.
        let mut late = Drip::default();
        late.start(300_000, Duration::from_millis(40), at(0), at(100));
        late.suspend(at(50));
        late.resume(at(150));
        assert_eq!(late.rate_mtps(), 0);
        let mut idle = Drip::default();
        idle.resume(at(10));
        assert_eq!(idle.rate_mtps(), 0);
    }

    #[test]
    fn never_covers_more_than_one_step() {
        let mut d = Drip::default();
        d.start(300_000, Duration::from_millis(40), at(0), far());
        // A second later, one step's worth: a continuous bucket would have lost the rest.
        assert_eq!(d.earn(at(1_000), 1_000, 0), 3);
    }

    #[test]
    fn fills_the_counted_tokens_less_the_slack() {
        let mut d = Drip::default();
        d.start(300_000, Duration::from_millis(40), at(0), far());
        // Counted 10, slack 3 (a 10 ms step at 300/s), holds 6: one more fits.
        assert_eq!((d.slack(), d.cap(10)), (3, 7));
        assert_eq!(d.earn(at(10), 10, 6), 1);
        // Full: what the rate earns is lost, not carried.
        assert_eq!(d.earn(at(20), 10, 7), 0);
        assert_eq!(d.earn(at(30), 10, 2), 3);
    }

    #[test]
    fn a_fraction_carried_never_reaches_past_the_cap() {
        let mut d = Drip::default();
        // 50/s, horizon 40 ms: 0.5 tokens a step, slack 1. Counted 5: cap 4.
        d.start(50_000, Duration::from_millis(40), at(0), far());
        // Holding 3: 0.45 earned, carried (room for it).
        assert_eq!(d.earn(at(9), 5, 3), 0);
        // Holding 4 (the cap): the next 0.45 and the carry are lost, not carried.
        assert_eq!(d.earn(at(18), 5, 4), 0);
        // All spent: one step's 0.5 at most, nothing carried from before: still 0.
        assert_eq!(d.earn(at(28), 5, 0), 0);
        assert_eq!(d.earn(at(38), 5, 0), 1);
    }

    #[test]
    fn suspended_or_stopped_earns_nothing() {
        let mut d = Drip::default();
        d.start(300_000, Duration::from_millis(40), at(0), far());
        d.suspend(at(0));
        assert_eq!(
            (d.earn(at(10), 10, 0), d.due(), d.rate_mtps()),
            (0, None, 0)
        );
        d.start(300_000, Duration::from_millis(40), at(10), far());
        d.stop();
        assert_eq!(d.earn(at(20), 10, 0), 0);
        d.start(0, Duration::from_millis(40), at(20), far());
        assert_eq!((d.earn(at(30), 10, 0), d.due()), (0, None));
    }

    #[test]
    fn a_flight_earns_the_lesser_rate_over_one_step_at_most() {
        let mut d = Drip::default();
        // 300 tokens/s, steps of 10 ms.
        d.start(300_000, Duration::from_millis(40), at(0), far());
        assert_eq!(d.earn(at(5), 100, 0), 1, "1.5 earned, 0.5 carried");
        d.suspend(at(5));
        // Renewed at 200/s, the reply 5 ms later: 5 ms at 200/s, and the half token carried.
        d.start(200_000, Duration::from_millis(40), at(10), far());
        assert_eq!(d.pay_flight(100, 0), 1, "1 + 0.5 owed at the reply");
        assert_eq!(d.pay_flight(100, 0), 0, "once");
        assert_eq!(
            d.earn(at(20), 100, 0),
            2,
            "then the new rate, the 0.5 carried on"
        );
        // A flight of a second pays one step at the lesser rate (here the old one, 200/s).
        d.suspend(at(20));
        d.start(1_000_000, Duration::from_millis(40), at(1_020), far());
        assert_eq!(d.pay_flight(100, 0), 2, "10 ms at 200/s, 0.5 carried");
        // A flight that ends the rate, or a start with no flight before it, pays nothing.
        d.suspend(at(1_020));
        d.start(0, Duration::from_millis(40), at(1_030), far());
        assert_eq!(d.pay_flight(100, 0), 0);
        d.start(300_000, Duration::from_millis(40), at(1_040), far());
        assert_eq!(d.pay_flight(100, 0), 0);
    }

    #[test]
    fn a_flight_is_paid_up_to_the_old_leases_expiry_and_only_at_its_reply() {
        let mut d = Drip::default();
        // 1 000/s (a token a ms), steps of 10 ms; the lease expires locally at 100 ms.
        d.start(1_000_000, Duration::from_millis(40), at(0), at(100));
        assert_eq!(d.earn(at(96), 100, 0), 10, "one step at most");
        d.suspend(at(96));
        // Answered at 110: only the 4 ms before the old expiry were counted for certain.
        d.start(1_000_000, Duration::from_millis(40), at(110), at(1_000));
        assert_eq!(d.pay_flight(100, 0), 4);
        // Suspended past the expiry: the flight pays nothing.
        let mut d = Drip::default();
        d.start(1_000_000, Duration::from_millis(40), at(0), at(100));
        d.suspend(at(105));
        d.start(1_000_000, Duration::from_millis(40), at(108), at(1_000));
        assert_eq!(d.pay_flight(100, 0), 0);
        // Owed but not paid at the reply: a later drip covers its own step only.
        d.suspend(at(108));
        d.start(1_000_000, Duration::from_millis(40), at(113), at(1_000));
        assert_eq!(d.earn(at(123), 100, 0), 10);
    }

    #[test]
    fn nothing_is_earned_past_the_leases_local_expiry() {
        let mut d = Drip::default();
        d.start(1_000_000, Duration::from_millis(40), at(0), at(25));
        assert_eq!(d.due(), Some(at(5)));
        assert_eq!(d.earn(at(20), 100, 0), 10);
        assert_eq!(d.due(), Some(at(25)), "due at the expiry at the latest");
        assert_eq!(d.earn(at(40), 100, 0), 5, "20 to 25 ms");
        assert_eq!((d.earn(at(60), 100, 0), d.due()), (0, None));
    }

    #[test]
    fn what_a_flight_earned_stays_within_the_cap() {
        let mut d = Drip::default();
        d.start(300_000, Duration::from_millis(40), at(0), far());
        d.suspend(at(0));
        d.start(300_000, Duration::from_millis(40), at(10), far());
        // Counted 10, slack 3: cap 7; holding 6, one of the 3 owed fits, the rest is lost.
        assert_eq!(d.pay_flight(10, 6), 1);
        assert_eq!(d.earn(at(10), 10, 0), 0);
    }
}
