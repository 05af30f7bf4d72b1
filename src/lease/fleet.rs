//! The fleet's size as one node can tell it: the nodes holding a lease, which the store counts
//! and reports with every node lease. Nodes that decide per request keep no lease and are not
//! in the count.
//!
//! Two readings serve two decisions:
//! - **ever**, the most the node has heard since it started, decides whether a small node
//!   decides per request ([`LeaseContext::fleet`](super::policy::LeaseContext::fleet)). Nodes
//!   that do drop out of the count, so a count that fell would let them leave that regime a
//!   few at a time; the largest fleet seen keeps their decisions exact, the safe side.
//! - **lately**, the most heard within the last one to two windows of [`FLEET_WINDOW`],
//!   decides whether a node leases a rate by default
//!   ([`CallContext::fleet`](super::policy::CallContext::fleet)). A rated node holds a lease,
//!   so rate leases do not move the count, and a fleet that shrank — after a surge, a rolling
//!   restart's overlap or a scale-in — gets its rate leases back within two windows instead of
//!   never.
//!
//! The recent reading is the greater of two counts: the current window's and the one before
//! it (a sliding maximum in two registers, no history kept).

use std::time::Duration;

use tokio::time::Instant;

/// The window of the recent reading: a count is remembered for one to two of these. Longer
/// than a lease's ttl, so a node that stopped leasing has left the store's count before the
/// window forgets what it was.
pub(crate) const FLEET_WINDOW: Duration = Duration::from_secs(60);

/// The most leasers the store has reported to one node: ever, and lately.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FleetSize {
    ever: u64,
    /// Start of the current window.
    start: Instant,
    /// The most heard in the current window, and in the window before it.
    current: u64,
    previous: u64,
}

impl FleetSize {
    /// Nothing heard yet, windows counted from `now`.
    pub(crate) fn new(now: Instant) -> Self {
        FleetSize {
            ever: 0,
            start: now,
            current: 0,
            previous: 0,
        }
    }

    /// The store reported `leasers` at `now`.
    pub(crate) fn observe(&mut self, leasers: u64, now: Instant) {
        match self.windows_since_start(now) {
            0 => {}
            1 => {
                self.previous = self.current;
                self.current = 0;
                self.start += FLEET_WINDOW;
            }
            n => {
                self.previous = 0;
                self.current = 0;
                self.start += FLEET_WINDOW * n;
            }
        }
        self.current = self.current.max(leasers);
        self.ever = self.ever.max(leasers);
    }

    /// The most leasers reported since the node started (0: none yet).
    pub(crate) fn ever(&self) -> u64 {
        self.ever
    }

    /// The most leasers reported in the current window and the one before it, as of `now`
    /// (0: none in that time).
    pub(crate) fn lately(&self, now: Instant) -> u64 {
        match self.windows_since_start(now) {
            0 => self.current.max(self.previous),
            1 => self.current,
            _ => 0,
        }
    }

    /// Whole windows from the current one's start to `now` (saturating; a clock never runs
    /// back, but a count this large means "long ago" either way).
    fn windows_since_start(&self, now: Instant) -> u32 {
        let elapsed = now.saturating_duration_since(self.start);
        u32::try_from(elapsed.as_nanos() / FLEET_WINDOW.as_nanos()).unwrap_or(u32::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recent_count_forgets_a_surge_after_one_to_two_windows_and_ever_never_does() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut fleet = FleetSize::new(t0);
        assert_eq!((fleet.ever(), fleet.lately(t0)), (0, 0));
        fleet.observe(150, at(10));
        fleet.observe(40, at(30));
        assert_eq!((fleet.ever(), fleet.lately(at(30))), (150, 150));
        // The next window still remembers the surge, heard in the window before it.
        fleet.observe(40, at(70));
        assert_eq!(fleet.lately(at(119)), 150);
        // Two windows on, the surge's window is gone: what was heard since.
        assert_eq!(fleet.lately(at(120)), 40);
        fleet.observe(45, at(125));
        assert_eq!((fleet.ever(), fleet.lately(at(125))), (150, 45));
        // Nothing heard for two whole windows: nothing known lately.
        assert_eq!(fleet.lately(at(240)), 0);
        // A long silence, then a count: windows skipped, the new count alone.
        fleet.observe(30, at(1_000));
        assert_eq!((fleet.ever(), fleet.lately(at(1_000))), (150, 30));
        assert_eq!(fleet.lately(at(1_059)), 30);
        // A larger count raises both at once.
        fleet.observe(500, at(1_061));
        assert_eq!((fleet.ever(), fleet.lately(at(1_061))), (500, 500));
    }
}
