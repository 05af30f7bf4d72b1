//! The local tier: tokens this process has leased and not yet spent, in one atomic word.
//!
//! `try_take` is a compare-and-swap loop on an `AtomicU64`: it never locks, never waits, never
//! allocates and never does I/O, and it can neither hand out a token twice nor lose one, because
//! every read-modify-write of one atomic location is totally ordered. The word is aligned to its
//! own cache lines so the rest of the limiter's state does not share them.
//!
//! # Memory ordering
//!
//! The counter publishes no other data, so `Relaxed` would be enough for conservation. The
//! successful CAS and [`LocalBucket::available`] are `SeqCst` because they take part in a
//! store-buffer (Dekker) pattern with the refill flag (see [`crate::refill`]): a caller writes
//! the count then reads the flag, the refill task writes the flag then reads the count, and only
//! sequential consistency guarantees that one of the two sees the other. On x86 a `SeqCst` RMW
//! is the same `lock cmpxchg` as a relaxed one and a `SeqCst` load is a plain `mov`.

use std::sync::atomic::{AtomicU64, Ordering};

/// Unspent leased tokens.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct LocalBucket {
    tokens: AtomicU64,
}

impl LocalBucket {
    /// Takes `n` tokens if there are that many; returns what is left, or what there was.
    #[inline]
    pub(crate) fn try_take(&self, n: u64) -> Result<u64, u64> {
        self.take_counting(n, || {})
    }

    /// [`try_take`](Self::try_take), calling `on_retry` each time another thread won the race.
    #[inline(always)]
    pub(crate) fn take_counting(&self, n: u64, mut on_retry: impl FnMut()) -> Result<u64, u64> {
        let mut current = self.tokens.load(Ordering::Relaxed);
        loop {
            if current < n {
                return Err(current);
            }
            match self.tokens.compare_exchange_weak(
                current,
                current - n,
                Ordering::SeqCst,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(current - n),
                Err(actual) => {
                    on_retry();
                    current = actual;
                }
            }
        }
    }

    /// Adds leased tokens; returns the new count.
    pub(crate) fn add(&self, n: u64) -> u64 {
        self.tokens.fetch_add(n, Ordering::SeqCst) + n
    }

    /// Takes every token (to give them back); returns how many there were.
    pub(crate) fn take_all(&self) -> u64 {
        self.tokens.swap(0, Ordering::SeqCst)
    }

    /// Tokens available now.
    pub(crate) fn available(&self) -> u64 {
        self.tokens.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Barrier;

    use super::*;

    #[test]
    fn takes_only_what_is_there() {
        let b = LocalBucket::default();
        assert_eq!(b.try_take(1), Err(0));
        b.add(5);
        assert_eq!(b.try_take(3), Ok(2));
        assert_eq!(b.try_take(3), Err(2));
        assert_eq!(b.take_all(), 2);
        assert_eq!(b.available(), 0);
    }

    /// Two threads drain one bucket: together they take exactly what was there, and the CAS
    /// loop really did collide (otherwise the test proves nothing about concurrency).
    #[test]
    fn two_threads_hand_out_exactly_the_leased_count() {
        const LEASED: u64 = 2_000_000;
        let bucket = LocalBucket::default();
        bucket.add(LEASED);
        let retries = AtomicUsize::new(0);
        let barrier = Barrier::new(2);
        let taken: Vec<u64> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        let mut mine = 0u64;
                        let mut local_retries = 0usize;
                        while bucket.take_counting(1, || local_retries += 1).is_ok() {
                            mine += 1;
                        }
                        retries.fetch_add(local_retries, Ordering::Relaxed);
                        mine
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(
            taken.iter().sum::<u64>(),
            LEASED,
            "no token lost or doubled"
        );
        assert!(
            taken.iter().all(|&t| t > 0),
            "both threads took tokens: {taken:?}"
        );
        assert!(
            retries.load(Ordering::Relaxed) > 0,
            "the threads never contended; the test proved nothing"
        );
        assert_eq!(bucket.available(), 0);
    }
}
