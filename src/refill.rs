//! Single-flight refill signalling between callers and a limiter's background task.
//!
//! Callers never talk to the store. When a caller leaves the local bucket below its low-water
//! mark, or is denied, it raises the `requested` flag; only the caller that flips it from false
//! to true wakes the task, so a thousand callers crossing the mark cause one wake-up and one
//! store call. The task clears the flag after the lease, then looks at the bucket again
//! (the other half of the Dekker pattern described in [`crate::local`]), so a request made while
//! the flag was still up is never lost.
//!
//! The wake-up is an [`AtomicWaker`]: registering and waking are lock-free. (Scheduling the
//! woken task is tokio's business and happens once per lease, not once per call.)

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::Poll;

use atomic_waker::AtomicWaker;

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
        // Relaxed: the value is a hint for sizing the next lease; the flag carries the ordering.
        if self.denied_max.load(Ordering::Relaxed) < n {
            self.denied_max.fetch_max(n, Ordering::Relaxed);
        }
        self.request();
    }

    /// The largest denied request since the last call (0 if none), resetting it.
    pub(crate) fn take_denied(&self) -> u64 {
        self.denied_max.swap(0, Ordering::Relaxed)
    }

    /// Whether a caller was denied since the last [`take_denied`](Self::take_denied).
    pub(crate) fn was_denied(&self) -> bool {
        self.denied_max.load(Ordering::Relaxed) > 0
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

    /// Waits until a refill is requested (true) or the signal is closed (false).
    pub(crate) async fn wait(&self) -> bool {
        poll_fn(|cx| {
            if self.is_closed() {
                return Poll::Ready(false);
            }
            if self.requested.load(Ordering::SeqCst) {
                return Poll::Ready(true);
            }
            self.waker.register(cx.waker());
            // Re-check after registering: a wake between the check and the registration
            // would otherwise be lost.
            if self.is_closed() {
                Poll::Ready(false)
            } else if self.requested.load(Ordering::SeqCst) {
                Poll::Ready(true)
            } else {
                Poll::Pending
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
                while s.wait().await {
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
