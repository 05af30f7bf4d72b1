//! Time as the limiters keep it: deadlines that never overflow, durations saturated into the
//! integer words atomics hold, and nanosecond timestamps against a fixed origin.
//!
//! Hot paths and background tasks share instants through `AtomicU64`s, so an instant is kept
//! as nanoseconds since an [`Origin`] taken when the limiter was built. Conversions saturate
//! rather than panic or wrap: `Duration::MAX` ("never") is a valid setting, and a deadline too
//! far to represent is read as "in about 30 years" — tokio's own far future — which no caller
//! waits out.

use std::time::Duration;

use tokio::time::Instant;

/// As far ahead as a deadline goes (tokio uses the same for `timeout(Duration::MAX, …)`).
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// `at + d`, or `at` plus about 30 years if that is not representable.
pub(crate) fn after(at: Instant, d: Duration) -> Instant {
    at.checked_add(d)
        .or_else(|| at.checked_add(FAR_FUTURE))
        .unwrap_or(at)
}

/// `now + d`, saturating as [`after`].
pub(crate) fn from_now(d: Duration) -> Instant {
    after(Instant::now(), d)
}

/// Nanoseconds of `d`, saturating at `u64::MAX` (about 584 years).
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Whether a period that ends at `until_ns` (0: there was none) has not ended, or ended less
/// than `window` before `now_ns` (all in ns since one origin).
pub(crate) fn ended_within(until_ns: u64, window: Duration, now_ns: u64) -> bool {
    until_ns != 0 && until_ns.saturating_add(nanos(window)) > now_ns
}

/// Microseconds of `d`, saturating at `u64::MAX`.
pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The zero of a limiter's nanosecond timestamps (an instant taken when it was built).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Origin(Instant);

impl Origin {
    /// An origin at this moment.
    pub(crate) fn now() -> Self {
        Origin(Instant::now())
    }

    /// The origin itself.
    pub(crate) fn instant(self) -> Instant {
        self.0
    }

    /// Nanoseconds from the origin to now.
    pub(crate) fn elapsed_ns(self) -> u64 {
        nanos(self.0.elapsed())
    }

    /// Nanoseconds from the origin to `at` (0 for an instant before it).
    pub(crate) fn ns_at(self, at: Instant) -> u64 {
        nanos(at.saturating_duration_since(self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_durations_saturate_instead_of_panicking() {
        let now = Instant::now();
        assert_eq!(
            after(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
        assert_eq!(after(now, Duration::MAX), now + FAR_FUTURE);
        assert!(from_now(Duration::MAX) > now + Duration::from_secs(86_400 * 365));
        assert_eq!(nanos(Duration::MAX), u64::MAX);
        assert_eq!(micros(Duration::MAX), u64::MAX);
        assert_eq!(nanos(Duration::from_micros(3)), 3_000);
        assert_eq!(micros(Duration::from_nanos(2_999)), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn timestamps_count_from_the_origin_and_saturate_before_it() {
        let origin = Origin::now();
        let before = origin.instant();
        tokio::time::advance(Duration::from_millis(5)).await;
        assert_eq!(origin.elapsed_ns(), 5_000_000);
        assert_eq!(origin.ns_at(before + Duration::from_micros(7)), 7_000);
        let earlier = before.checked_sub(Duration::from_secs(1));
        if let Some(earlier) = earlier {
            assert_eq!(origin.ns_at(earlier), 0);
        }
    }
}
