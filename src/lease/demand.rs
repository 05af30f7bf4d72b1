//! Demand estimation: how many tokens per second this node is being asked for.
//!
//! Demand is what callers asked for — admitted *and* denied — not what they got, so a node
//! starved by a small share still reports how much it needs, and its share grows to match. The
//! estimate is an exponentially weighted moving average over time (not over samples), so it
//! does not depend on how often the background task happens to look.
//!
//! It is symmetric on purpose. An earlier version weighted samples above the estimate at least
//! one half ("fast attack"), to react faster to jumps; on Poisson traffic that turned noise into
//! bias (a node with 100 requests/s reported 223/s in the skewed simulation), and since shares
//! follow reported demand, quiet nodes got more than their share. The first sample is taken as
//! is, so a new node does not start from zero.

use std::time::Duration;

use tokio::time::Instant;

/// Samples closer together than this are merged into the next one.
const MIN_SAMPLE: Duration = Duration::from_millis(5);

/// A time-weighted EWMA of a counter's rate.
#[derive(Debug, Clone)]
pub(crate) struct DemandEstimator {
    tau: Duration,
    rate: f64,
    sampled: bool,
    last_at: Instant,
    last_count: u64,
    /// The running total as last seen, by a sample or by [`note`](Self::note).
    seen: u64,
    last_change: Instant,
    /// The estimate when the total last changed (see [`rate_at_change`](Self::rate_at_change)).
    rate_at_change: f64,
    /// When demand was first seen (again, after a restart of the warm-up; `None` before).
    first_at: Option<Instant>,
}

impl DemandEstimator {
    /// An estimator at zero demand.
    pub(crate) fn new(tau: Duration, now: Instant) -> Self {
        DemandEstimator {
            tau,
            rate: 0.0,
            sampled: false,
            last_at: now,
            last_count: 0,
            seen: 0,
            last_change: now,
            rate_at_change: 0.0,
            first_at: None,
        }
    }

    /// When demand was first seen, or first seen again since [`restart_warm_up`]: the
    /// estimate has been warming up since (`None` while nothing has been asked for since).
    ///
    /// [`restart_warm_up`]: Self::restart_warm_up
    pub(crate) fn first_at(&self) -> Option<Instant> {
        self.first_at
    }

    /// Feeds the running total of demanded tokens; returns the estimate in tokens per second.
    pub(crate) fn observe(&mut self, now: Instant, count: u64) -> f64 {
        self.note(now, count);
        let dt = now.saturating_duration_since(self.last_at);
        if dt < MIN_SAMPLE {
            return self.rate;
        }
        let sample = count.saturating_sub(self.last_count) as f64 / dt.as_secs_f64();
        if self.sampled {
            let alpha = 1.0 - (-dt.as_secs_f64() / self.tau.as_secs_f64()).exp();
            self.rate += alpha * (sample - self.rate);
        } else if count > self.last_count {
            self.rate = sample;
            self.sampled = true;
        }
        self.last_at = now;
        self.last_count = count;
        if self.last_change == now {
            self.rate_at_change = self.rate;
        }
        self.rate
    }

    /// Feeds the running total without taking a sample: only [`last_change`] (with
    /// [`rate_at_change`]) and [`first_at`] follow it, so a caller may look for demand more
    /// often than the estimate is sampled and leave the estimate as it was.
    ///
    /// [`last_change`]: Self::last_change
    /// [`rate_at_change`]: Self::rate_at_change
    /// [`first_at`]: Self::first_at
    pub(crate) fn note(&mut self, now: Instant, count: u64) {
        if count != self.seen {
            self.seen = count;
            self.last_change = now;
            self.rate_at_change = self.rate;
            self.first_at.get_or_insert(now);
        }
    }

    /// Starts timing the estimate's warm-up again from the next demand (see [`first_at`]).
    ///
    /// [`first_at`]: Self::first_at
    pub(crate) fn restart_warm_up(&mut self) {
        self.first_at = None;
    }

    /// Forgets the estimate, for a node whose demand is known to be gone (the hybrid task's
    /// quiet node): zero until demand shows again, then its first sample taken as is, as a
    /// new node's. The warm-up is not timed again ([`first_at`](Self::first_at) stays): a
    /// young estimate has its rate lease renewed sooner, and a warm-up timed again from the
    /// next demand cost moving-hotspot-fleet's rate leases 3 points (0.8634 → 0.8326).
    pub(crate) fn forget(&mut self) {
        self.rate = 0.0;
        self.sampled = false;
        self.rate_at_change = 0.0;
    }

    /// The current estimate, tokens per second.
    pub(crate) fn rate(&self) -> f64 {
        self.rate
    }

    /// When the demanded total last changed.
    pub(crate) fn last_change(&self) -> Instant {
        self.last_change
    }

    /// The estimate as it was when the demanded total last changed (with the sample taken
    /// then, if one was): how busy the node was when it last saw demand, which the estimate
    /// itself forgets as it decays through a quiet spell.
    pub(crate) fn rate_at_change(&self) -> f64 {
        self.rate_at_change
    }
}

/// Shortest interval [`RecentRate`] measures over; shorter ones are merged into the next.
const MIN_RECENT: Duration = Duration::from_millis(1);
/// Fewest tokens [`RecentRate`] measures over (sparse traffic: a longer interval, less noise).
const MIN_RECENT_TOKENS: u64 = 8;

/// Demand over the last interval between two looks (the hybrid task looks at each lease): no
/// smoothing, so it follows a ramp or a step within one round trip where the EWMA above takes
/// its time constant. It is noisy on sparse traffic, so it only ever *raises* what a node holds
/// (its lease size and low-water mark, `max(estimate, recent)`); the demand a node reports to
/// the store, which decides fair shares, stays the unbiased EWMA. A measurement older than
/// `max_age` counts for nothing, so a node that went quiet does not keep a stale high rate.
#[derive(Debug, Clone)]
pub(crate) struct RecentRate {
    rate: f64,
    /// When `rate` was measured.
    measured_at: Option<Instant>,
    /// Start of the current interval and the running total then.
    since: Option<(Instant, u64)>,
}

impl RecentRate {
    /// Nothing measured yet.
    pub(crate) fn new() -> Self {
        RecentRate {
            rate: 0.0,
            measured_at: None,
            since: None,
        }
    }

    /// Feeds the running total of demanded tokens: measures the interval since the last look,
    /// unless it is shorter than 1 ms or holds fewer than 8 tokens (then it runs on to the next
    /// look; a count that went backwards starts a new interval).
    pub(crate) fn look(&mut self, now: Instant, count: u64) {
        match self.since {
            Some((_, before)) if count < before => self.since = Some((now, count)),
            Some((at, before))
                if now.saturating_duration_since(at) < MIN_RECENT
                    || count - before < MIN_RECENT_TOKENS => {}
            Some((at, before)) => {
                let dt = now.saturating_duration_since(at).as_secs_f64();
                self.rate = count.saturating_sub(before) as f64 / dt;
                self.measured_at = Some(now);
                self.since = Some((now, count));
            }
            None => self.since = Some((now, count)),
        }
    }

    /// The rate since the last look (the interval under way), without ending the interval: 0
    /// while it is shorter than 1 ms or holds fewer than 8 tokens.
    pub(crate) fn peek(&self, now: Instant, count: u64) -> f64 {
        match self.since {
            Some((at, before))
                if now.saturating_duration_since(at) >= MIN_RECENT
                    && count.saturating_sub(before) >= MIN_RECENT_TOKENS =>
            {
                let dt = now.saturating_duration_since(at).as_secs_f64();
                (count - before) as f64 / dt
            }
            _ => 0.0,
        }
    }

    /// The last interval's rate, tokens per second; 0 if none was measured within `max_age`.
    pub(crate) fn rate(&self, now: Instant, max_age: Duration) -> f64 {
        match self.measured_at {
            Some(at) if now.saturating_duration_since(at) <= max_age => self.rate,
            _ => 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracks_a_steady_rate_and_follows_a_jump_within_tau() {
        let t0 = Instant::now();
        let tau = Duration::from_millis(300);
        let mut e = DemandEstimator::new(tau, t0);
        let mut count = 0;
        for ms in 1..=2_000u64 {
            count += 1; // 1 000 per second
            e.observe(t0 + Duration::from_millis(ms), count);
        }
        assert!((e.rate() - 1_000.0).abs() < 50.0, "{}", e.rate());
        // Ten times the traffic: after one tau, 1 - 1/e of the way there.
        for ms in 2_001..=2_300u64 {
            count += 10;
            e.observe(t0 + Duration::from_millis(ms), count);
        }
        let expected = 1_000.0 + 9_000.0 * (1.0 - (-1.0f64).exp());
        assert!(
            (e.rate() - expected).abs() < 300.0,
            "{} vs {expected}",
            e.rate()
        );
    }

    #[test]
    fn is_unbiased_on_noisy_traffic() {
        // Poisson-like arrivals averaging 100/s, looked at irregularly: the mean estimate stays
        // near 100, where a fast-attack filter drifts well above it.
        let t0 = Instant::now();
        let mut e = DemandEstimator::new(Duration::from_millis(300), t0);
        let mut rng = fastrand::Rng::with_seed(1);
        let (mut count, mut t, mut sum, mut n) = (0u64, 0u64, 0.0, 0u32);
        while t < 60_000_000 {
            t += (-(rng.f64().max(1e-12)).ln() * 10_000.0) as u64; // exponential gaps, mean 10 ms
            count += 1;
            let r = e.observe(t0 + Duration::from_micros(t), count);
            if t > 5_000_000 {
                sum += r;
                n += 1;
            }
        }
        let mean = sum / f64::from(n);
        assert!((mean - 100.0).abs() < 10.0, "mean estimate {mean}");
    }

    #[test]
    fn decays_over_tau_when_traffic_stops() {
        let t0 = Instant::now();
        let mut e = DemandEstimator::new(Duration::from_millis(500), t0);
        e.observe(t0 + Duration::from_millis(100), 100); // 1 000/s, the first sample as is
        let before = e.rate();
        assert_eq!(before, 1_000.0);
        e.observe(t0 + Duration::from_millis(600), 100); // nothing for tau
        let after = e.rate();
        assert!(
            (after / before - (-1.0f64).exp()).abs() < 0.01,
            "{before} -> {after}"
        );
        assert_eq!(e.last_change(), t0 + Duration::from_millis(100));
    }

    #[test]
    fn a_note_moves_the_last_change_on_new_demand_only_and_takes_no_sample() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut e = DemandEstimator::new(ms(300), t0);
        e.observe(t0 + ms(100), 100);
        let rate = e.rate();
        // New demand between samples: the last change follows it, the estimate does not.
        e.note(t0 + ms(110), 120);
        assert_eq!(e.last_change(), t0 + ms(110));
        assert_eq!(e.rate(), rate);
        // Looks that find no more demand leave it where it was, noted or sampled.
        e.note(t0 + ms(150), 120);
        e.observe(t0 + ms(200), 120);
        assert_eq!(e.last_change(), t0 + ms(110));
        // The sample after the note still counts the noted demand: 20 tokens in 100 ms.
        let alpha = 1.0 - (-100.0f64 / 300.0).exp();
        let expected = rate + alpha * (200.0 - rate);
        assert!(
            (e.rate() - expected).abs() < 1e-6,
            "{} not {expected}",
            e.rate()
        );
        // The estimate at the last change stays as it was then while the estimate moves.
        assert_eq!(e.rate_at_change(), rate);
        e.observe(t0 + ms(210), 121);
        assert_eq!(e.last_change(), t0 + ms(210));
        // A change with a sample: the estimate after it.
        assert_eq!(e.rate_at_change(), e.rate());
        assert_ne!(e.rate_at_change(), rate);
    }

    #[test]
    fn warm_up_is_timed_from_the_first_demand_and_again_after_a_restart() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut e = DemandEstimator::new(ms(300), t0);
        // Looks without demand start nothing.
        e.observe(t0 + ms(10), 0);
        assert_eq!(e.first_at(), None);
        e.observe(t0 + ms(20), 5);
        assert_eq!(e.first_at(), Some(t0 + ms(20)));
        e.observe(t0 + ms(40), 9);
        assert_eq!(e.first_at(), Some(t0 + ms(20)));
        // Restarted (the node gave its lease back for idleness): from the next demand on, not
        // from a look that finds none.
        e.restart_warm_up();
        e.observe(t0 + ms(900), 9);
        assert_eq!(e.first_at(), None);
        e.observe(t0 + ms(950), 12);
        assert_eq!(e.first_at(), Some(t0 + ms(950)));
    }

    #[test]
    fn recent_rate_follows_a_step_at_once_and_expires() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut r = RecentRate::new();
        assert_eq!(r.rate(t0, ms(100)), 0.0);
        r.look(t0, 0);
        assert_eq!(r.rate(t0, ms(100)), 0.0, "one look is no interval");
        assert_eq!(r.peek(t0 + ms(10), 7), 0.0, "fewer than 8 tokens");
        assert_eq!(r.peek(t0 + ms(10), 10), 1_000.0, "the interval under way");
        r.look(t0 + ms(10), 10); // 1 000/s
        assert_eq!(r.rate(t0 + ms(10), ms(100)), 1_000.0);
        // Shorter than 1 ms: merged into the next interval.
        r.look(t0 + ms(10) + Duration::from_micros(500), 1_000);
        assert_eq!(r.rate(t0 + ms(11), ms(100)), 1_000.0);
        r.look(t0 + ms(12), 300); // 290 in 2 ms
        assert_eq!(r.rate(t0 + ms(12), ms(100)), 145_000.0);
        assert_eq!(r.rate(t0 + ms(200), ms(100)), 0.0, "stale");
        // Sparse traffic: an interval runs on until it holds 8 tokens.
        r.look(t0 + ms(300), 304);
        assert_eq!(r.rate(t0 + ms(300), ms(100)), 0.0, "still stale: 4 tokens");
        r.look(t0 + ms(400), 308); // 8 tokens in 388 ms
        let rate = r.rate(t0 + ms(400), ms(100));
        assert!((rate - 8.0 / 0.388).abs() < 1e-6, "{rate}");
        // A count that went backwards (never, but) starts over instead of panicking.
        r.look(t0 + ms(401), 0);
        r.look(t0 + ms(411), 10);
        assert_eq!(r.rate(t0 + ms(411), ms(100)), 1_000.0);
    }

    #[test]
    fn a_forgotten_estimate_starts_again_from_the_next_demand() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut d = DemandEstimator::new(Duration::from_millis(300), t0);
        for n in 1..=100 {
            d.observe(ms(n * 10), n * 10);
        }
        assert!((d.rate() - 1_000.0).abs() < 1.0, "{}", d.rate());
        d.forget();
        assert_eq!(d.rate(), 0.0);
        // A look with no new demand keeps it at zero and unsampled …
        assert_eq!(d.observe(ms(1_050), 1_000), 0.0);
        // … and the first demand after it is taken as is (20 tokens in 100 ms), not averaged
        // in from zero.
        assert_eq!(d.observe(ms(1_150), 1_020), 200.0);
    }
}
