//! Single-flight refill signalling between callers and a limiter's background task.
//!
//! Callers never talk to the store. When a caller leaves the local bucket below its low-water
//! mark, or is denied, it raises the `requested` flag; only the caller that flips it from false
//! to true wakes the task, so a thousand callers crossing the mark cause one wake-up and one
//! store call. The task clears the flag after the lease, then looks at the bucket again
//! (the other half of the Dekker pattern described in [`crate::lease::local`]), so a request made while
//! the flag was still up is never lost.
//!
//! Loom models check that handshake on this code and the local bucket's (`refill/loom_tests.rs`;
//! how to run them: [`crate::lease::local`]); they leave the wake-up below out.
//!
//! The wake-up is an [`AtomicWaker`]: registering and waking are lock-free. (Scheduling the
//! woken task is tokio's business and happens once per lease, not once per call.)

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::atomic::Ordering;
use std::task::Poll;

use atomic_waker::AtomicWaker;
use tokio::time::Instant;

// std's atomics, or loom's in the loom models (see `super::sync`).
use super::sync::{AtomicBool, AtomicU64};

/// Why [`RefillSignal::wait_until`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// A refill was requested.
    Requested,
    /// The deadline passed.
    Timer,
    /// The limiter is closing.
    Closed,
}

/// The flag, the wake-up, and what denied callers asked for.
#[derive(Debug, Default)]
pub(crate) struct RefillSignal {
    requested: AtomicBool,
    closed: AtomicBool,
    denied_max: AtomicU64,
    waker: AtomicWaker,
}

impl RefillSignal {
    /// A signal whose first refill is already requested (prefetch) or not.
    pub(crate) fn new(requested: bool) -> Self {
        let s = Self::default();
        s.requested.store(requested, Ordering::Relaxed);
        s
    }

    /// Asks for a refill; wakes the task only on the false → true edge.
    #[inline]
    pub(crate) fn request(&self) {
        // SeqCst: see the module docs of `local` (store-buffer pattern with the token count).
        // The plain load first keeps the cache line shared while a refill is already pending.
        if !self.requested.load(Ordering::SeqCst) && !self.requested.swap(true, Ordering::SeqCst) {
            self.waker.wake();
        }
    }

    /// Records that a caller was denied `n` tokens, and asks for a refill.
    pub(crate) fn denied(&self, n: u64) {
        // SeqCst: after lowering the flag the task checks `was_denied` (another store-buffer
        // pattern with the flag): a denial recorded before the caller saw the flag still up
        // must be visible to that check, on any architecture. This is the denial path only.
        if self.denied_max.load(Ordering::SeqCst) < n {
            self.denied_max.fetch_max(n, Ordering::SeqCst);
        }
        self.request();
    }

    /// The largest denied request since the last call (0 if none), resetting it.
    pub(crate) fn take_denied(&self) -> u64 {
        self.denied_max.swap(0, Ordering::SeqCst)
    }

    /// Whether a caller was denied since the last [`take_denied`](Self::take_denied).
    pub(crate) fn was_denied(&self) -> bool {
        self.denied_max.load(Ordering::SeqCst) > 0
    }

    /// Lowers the flag after a refill.
    pub(crate) fn done(&self) {
        self.requested.store(false, Ordering::SeqCst);
    }

    /// Tells the task to give back its tokens and stop.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.waker.wake();
    }

    /// Whether [`close`](Self::close) was called.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Whether a refill is requested.
    pub(crate) fn is_requested(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }

    /// Waits until a refill is requested, the signal is closed, or `deadline` passes.
    pub(crate) async fn wait_until(&self, deadline: Option<Instant>) -> Wake {
        let sleep = deadline.map(tokio::time::sleep_until);
        let mut sleep = pin!(sleep);
        poll_fn(|cx| {
            self.waker.register(cx.waker());
            // Checked after registering, so a wake in between is not lost.
            if self.is_closed() {
                return Poll::Ready(Wake::Closed);
            }
            if self.is_requested() {
                return Poll::Ready(Wake::Requested);
            }
            match sleep.as_mut().as_pin_mut().map(|sleep| sleep.poll(cx)) {
                Some(Poll::Ready(())) => Poll::Ready(Wake::Timer),
                _ => Poll::Pending,
            }
        })
        .await
    }

    /// Runs `fut` unless the signal closes first; `None` if it closed.
    pub(crate) async fn unless_closed<F: Future>(&self, fut: F) -> Option<F::Output> {
        let mut fut = pin!(fut);
        poll_fn(|cx| {
            self.waker.register(cx.waker());
            if self.is_closed() {
                return Poll::Ready(None);
            }
            fut.as_mut().poll(cx).map(Some)
        })
        .await
    }
}

/// Loom models of the handshake (`--cfg ratelease_loom`, see `super::sync`).
#[cfg(all(test, ratelease_loom))]
mod loom_tests;

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn one_wake_per_edge_and_close_ends_waiting() {
        let s = Arc::new(RefillSignal::new(false));
        let task = tokio::spawn({
            let s = s.clone();
            async move {
                let mut refills = 0;
                while s.wait_until(None).await == Wake::Requested {
                    refills += 1;
                    s.done();
                }
                refills
            }
        });
        s.request();
        tokio::time::sleep(Duration::from_millis(20)).await;
        s.request();
        tokio::time::sleep(Duration::from_millis(20)).await;
        s.close();
        assert_eq!(task.await.unwrap(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn wait_until_wakes_at_the_deadline() {
        let s = RefillSignal::new(false);
        let at = Instant::now() + Duration::from_millis(30);
        assert_eq!(s.wait_until(Some(at)).await, Wake::Timer);
        assert!(Instant::now() >= at);
    }

    #[test]
    fn denied_keeps_the_largest_request() {
        let s = RefillSignal::new(false);
        s.denied(3);
        s.denied(7);
        s.denied(5);
        assert!(s.was_denied());
        assert_eq!(s.take_denied(), 7);
        assert!(!s.was_denied());
    }
}
