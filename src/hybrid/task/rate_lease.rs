//! The background task's side of a rate lease: the drip into the local bucket, the slack it
//! keeps back, when the rate is renewed and how it ends (the rule itself: `lease/drip.rs`).

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::super::shared::Shared;
use super::{review_after, Task};
use crate::lease::policy::capped;
use crate::lease::rate_ask::renew_after;

impl Task {
    /// Adds what the rate lease earned to the local bucket (see `lease/drip.rs`). The count is
    /// `settled`: a chunk in transit between words must not read as room.
    pub(super) fn add_drip<S>(&mut self, s: &Shared<S>, now: Instant) {
        let add = self.drip.earn(now, self.counted, s.local.settled());
        dripped(s, add);
    }

    /// Adds what the rate earned while the call just answered was in flight (see
    /// `lease/drip.rs`), as [`add_drip`](Self::add_drip) adds a drip, counting the bucket as
    /// holding at least `held` (what it held at the send and the grant).
    pub(super) fn pay_flight<S>(&mut self, s: &Shared<S>, held: u64) {
        let add = self
            .drip
            .pay_flight(self.counted, s.local.settled().max(held));
        dripped(s, add);
    }

    /// Keeps the local bucket at or below its cap while a rate is held (see `lease/drip.rs`):
    /// tokens above it stay counted (reported as held) but are never spent.
    pub(super) fn keep_back_slack<S>(&mut self, s: &Shared<S>) {
        if self.drip.rate_mtps() == 0 {
            return;
        }
        let cap = self.drip.cap(self.counted);
        loop {
            let held = s.local.settled();
            if held <= cap {
                return;
            }
            if s.local.try_take(held - cap).is_ok() {
                // Dropped unspent, as far as the local count goes (see `Shared::spent`).
                s.counters
                    .tokens_expired
                    .fetch_add(held - cap, Ordering::Relaxed);
                return;
            }
        }
    }

    /// Ends the rate lease on this side (given back, or unknown after a failed call): no more
    /// drips, no renewal.
    pub(super) fn end_rate<S>(&mut self, s: &Shared<S>) {
        self.drip.stop();
        s.counters.rate_mtps.store(0, Ordering::Relaxed);
    }

    /// When to renew the rate lease: after as long as the node's demand had been measured at
    /// the call that granted it, at least two horizons and at most half its ttl (see
    /// `rate_ask::renew_after`: a young rate was granted on young shares), or sooner
    /// (`early_gap` after it, at least a review: see `review_after`) if the node's demand,
    /// capped by its share, moved 2× away from the rate it holds — it grew (a node that wants
    /// more) or fell (the rest is wasted on it and held from the fleet). Always a review
    /// before the lease's local expiry: half the ttl of terms adopted since the grant (a new
    /// quota's) may lie past it, and an expired lease is given back, not renewed. `None`
    /// without a rate lease.
    pub(super) fn renew_due(&self) -> Option<Instant> {
        if self.drip.rate_mtps() == 0 {
            return None;
        }
        let terms = self.terms?;
        let sent = self.sent_at?;
        let measured = self.demand.first_at().map_or(Duration::ZERO, |first| {
            sent.saturating_duration_since(first)
        });
        let mut renew = sent + renew_after(measured, &terms);
        if let Some(expires) = self.expires {
            let review = review_after(terms.horizon);
            renew = renew.min(expires.checked_sub(review).unwrap_or(expires));
        }
        let wanted = capped(self.sizing_demand(None), self.share);
        let held = self.drip.per_second();
        if wanted > 2.0 * held || wanted < held / 2.0 {
            let early = self.sent_at? + self.early_gap.max(review_after(terms.horizon));
            return Some(renew.min(early));
        }
        Some(renew)
    }

    /// When the rate lease needs a store call: its renewal ([`renew_due`](Self::renew_due)) or
    /// its end because its node went quiet ([`quiet_due`](Self::quiet_due)), whichever comes
    /// first. `None` without a rate lease.
    pub(super) fn rate_call_due(&self) -> Option<Instant> {
        [self.renew_due(), self.quiet_due()]
            .into_iter()
            .flatten()
            .min()
    }

    /// When the rate lease ends because its node went quiet (see [`quiet_at`](Self::quiet_at)),
    /// unless demand comes before: the task looks then. `None` without a rate lease.
    pub(super) fn quiet_due(&self) -> Option<Instant> {
        if self.drip.rate_mtps() == 0 {
            return None;
        }
        self.quiet_at()
    }

    /// When this node counts as gone quiet: no demand for [`QUIET_GAPS`] expected gaps between
    /// its requests (at its demand estimate as it was at its last demand: the estimate decays
    /// through the quiet spell, which would stretch the gaps as they are waited out), and at
    /// least a review; at most its ttl. Its rate lease ends then: the task looks at that time
    /// (`quiet_due`, and between drips while it waits: `Task::pause`) and asks for no rate
    /// (`Task::lease`). A rate held by a node whose demand stopped is refill no one spends,
    /// and the renewals alone would end it only as the estimate decays, halving it each time
    /// (on a fleet whose nodes are busy one second in twenty, rate leases admitted half of
    /// what they may). A node quiet for longer gives its tokens back too (`idle_at`): one
    /// asked fewer than about 40 times a second (20 gaps over the default `idle_after` of
    /// 500 ms) reaches that first. `None` without terms (no leases on terms, no rate).
    ///
    /// Where the burst is tight, the call that ends the rate reports no demand: the store
    /// shares the rate by reported demand, and a quiet node's estimate (it decays over a
    /// second) held part of every busy node's share until the node gave its tokens back. The
    /// rates then covered a third less than the limit, and busy nodes chased the rest in
    /// small token batches (a tight burst has room for no larger ones): on 1 000 nodes each
    /// busy one second in twenty, 92 store calls a second on the busiest node, 25 reporting
    /// none (SIMULATIONS.md, "A quiet node's demand is gone"). Its estimate is forgotten
    /// then, and its next calls report what it is asked from then on: a hot spot that moved
    /// on reported its decaying estimate in every call after that one, and took a rate it
    /// could not use from the new hot spot (moving-hotspot-fleet's rate leases 0.8569 →
    /// 0.8634, the busiest node 41 → 12 calls a second). Where the burst has room, the
    /// estimate stays: the refill the rates leave is collected in large batches, cheaply, and
    /// serves nodes whose demand starts (with quiet nodes reporting none, bursty-fleet's rate
    /// leases admitted 0.955 of the budget rather than 0.977).
    pub(super) fn quiet_at(&self) -> Option<Instant> {
        let terms = self.terms?;
        let rate = self.demand.rate_at_change();
        // (Capped before it becomes a Duration: an estimate decays towards zero, never to it,
        // and QUIET_GAPS over a subnormal is infinite.)
        let gaps = if rate > 0.0 {
            Duration::from_secs_f64((QUIET_GAPS / rate).min(terms.ttl.as_secs_f64()))
        } else {
            Duration::ZERO
        };
        Some(self.demand.last_change() + gaps.max(review_after(terms.horizon)))
    }
}

/// Puts `add` tokens a rate lease earned into the local bucket, counted as leased and dripped.
fn dripped<S>(s: &Shared<S>, add: u64) {
    if add > 0 {
        s.local.add(add);
        s.counters.tokens_leased.fetch_add(add, Ordering::Relaxed);
        s.counters.tokens_dripped.fetch_add(add, Ordering::Relaxed);
    }
}

/// How many expected gaps between a node's requests without one make it quiet. On Poisson
/// traffic a gap that long comes once in e^20 (5 × 10^8) gaps: a node asked 1 000 times a second
/// reads as quiet by chance about once in six days. Eight gaps (once in 3 000) ended busy
/// nodes' rates every few seconds in the tight-burst scenario.
const QUIET_GAPS: f64 = 20.0;
