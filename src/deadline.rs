//! Deadlines from durations a user chose: `Instant + Duration` panics on overflow, and
//! `try_acquire_for(n, Duration::MAX)` or a builder's `Duration::MAX` ("never") must not. A
//! deadline too far to represent is read as "in about 30 years" — tokio's own far future — which
//! no caller waits out.

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
    }
}
