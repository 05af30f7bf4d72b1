//! Clocks: where stores read the current time.
//!
//! A [`Clock`] returns the time elapsed since its own origin, as a [`Duration`]. Only the stores
//! read it: [`MemoryStore`](crate::MemoryStore) for its lazy refill, and a
//! [`RedisStore`](crate::RedisStore) that was told to send an explicit `now` to the script instead
//! of letting Redis use its own `TIME` (for deterministic tests and replays only).
//!
//! The limiters never read a `Clock` on the hot path. Their timers (waiting in
//! [`acquire`](crate::HybridLimiter::acquire), backing off after a denial) run on tokio's timer,
//! which tests and the simulator control with `tokio::time::pause()`; [`TokioClock`] reads that
//! same time, so a `MemoryStore` built on it follows paused, virtual time exactly.
//!
//! - [`MonotonicClock`]: real time, from [`std::time::Instant`].
//! - [`FakeClock`]: manual time; clones share one counter and [`FakeClock::advance`] moves all.
//! - [`TokioClock`]: tokio's (possibly paused) time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A source of monotonic time, measured from the clock's own origin.
pub trait Clock: Send + Sync + 'static {
    /// Time elapsed since this clock's origin. Never decreases.
    fn now(&self) -> Duration;
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Duration {
        (**self).now()
    }
}

/// Real monotonic time since the clock was created.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        MonotonicClock {
            origin: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// A manual clock for tests: time moves only when told to. Clones share the same time.
///
/// ```
/// use std::time::Duration;
/// use ratelease::{Clock, FakeClock};
///
/// let clock = FakeClock::new();
/// let view = clock.clone();
/// clock.advance(Duration::from_millis(5));
/// assert_eq!(view.now(), Duration::from_millis(5));
/// ```
#[derive(Debug, Clone, Default)]
pub struct FakeClock {
    nanos: Arc<AtomicU64>,
}

impl FakeClock {
    /// A clock at time zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// A clock at `start`.
    pub fn starting_at(start: Duration) -> Self {
        let clock = Self::new();
        clock.set(start);
        clock
    }

    /// Moves time forward by `by` (saturating).
    pub fn advance(&self, by: Duration) {
        let by = crate::time::nanos(by);
        // Relaxed: the counter is the only shared state; readers need no other memory ordered.
        let _ = self
            .nanos
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_add(by))
            });
    }

    /// Sets the time; a value earlier than the current time is ignored, keeping it monotonic.
    pub fn set(&self, to: Duration) {
        let to = crate::time::nanos(to);
        self.nanos.fetch_max(to, Ordering::Relaxed);
    }
}

impl Clock for FakeClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }
}

/// tokio's clock, measured from when this value was created. Follows `tokio::time::pause()`
/// and `advance()`, so stores and limiters share one virtual time in tests and simulations.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// A clock whose origin is tokio's "now".
    pub fn new() -> Self {
        TokioClock {
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fake_clock_is_shared_and_monotonic() {
        let a = FakeClock::new();
        let b = a.clone();
        a.advance(Duration::from_secs(2));
        assert_eq!(b.now(), Duration::from_secs(2));
        b.set(Duration::from_secs(1));
        assert_eq!(a.now(), Duration::from_secs(2), "set() must not go back");
        b.set(Duration::from_secs(3));
        assert_eq!(a.now(), Duration::from_secs(3));
    }

    #[test]
    fn monotonic_clock_moves_forward() {
        let c = MonotonicClock::new();
        let t0 = c.now();
        std::thread::sleep(Duration::from_millis(2));
        assert!(c.now() > t0);
    }

    #[tokio::test(start_paused = true)]
    async fn tokio_clock_follows_paused_time() {
        let c = TokioClock::new();
        tokio::time::advance(Duration::from_millis(250)).await;
        assert_eq!(c.now(), Duration::from_millis(250));
    }
}
