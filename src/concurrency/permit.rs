//! [`Permit`]: the RAII guard of held slots, and the state it shares with its limiter.
//!
//! A permit must give its slots back from `Drop`, which cannot await. So dropping one only
//! touches atomics of [`Local`], the part of a limiter that is not generic over the store:
//!
//! - hybrid mode: the slots go back into the local pool (one `fetch_add`), ready for the next
//!   caller of this process without a store call;
//! - pure mode: the slots are added to `pending` and the limiter's background task is woken
//!   (lock-free, [`RefillSignal`]); it sends one release for everything pending, so a burst of
//!   drops costs one store call, and no task is spawned per drop;
//! - a permit admitted by the failure policy (the store was failing) was never recorded in the
//!   store: dropping it only lowers the local count of such permits.
//!
//! Callers parked in [`acquire`](super::ConcurrencyLimiter::acquire) are woken through a tokio
//! `Notify`, whose `notify_waiters` takes a lock; a drop calls it only when someone is parked
//! (the `waiters` count), so an uncontended drop takes no lock.
//!
//! # Memory ordering
//!
//! Two store-buffer (Dekker) patterns need `SeqCst`: a dropper writes the pool (or `pending`)
//! and then reads `waiters` (or the refill flag), while a waiter increments `waiters` and then
//! reads the pool (the task lowers the flag and then reads `pending`); sequential consistency
//! guarantees that at least one side sees the other, so no wake-up is lost. The counts that
//! only feed statistics are `Relaxed`.

use std::ops::Deref;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

use crate::lease::refill::RefillSignal;

/// What permits, callers and the background task share (not generic over the store).
#[derive(Debug, Default)]
pub(crate) struct Local {
    /// Hybrid mode (a pool of leased slots), else pure mode.
    pub(crate) hybrid: bool,
    /// Hybrid: leased slots in no permit, ready to hand out (and the count of slots taken).
    pub(crate) pool: Pool,
    /// Hybrid: the store may have forgotten this holder (no successful renewal for 90 % of the
    /// ttl), or the limiter is closing; the pool is not handed out until a renewal succeeds.
    pub(crate) stale: AtomicBool,
    /// Pure: slots in live permits granted by the store.
    pub(crate) in_use: AtomicU64,
    /// Pure: slots of dropped permits not yet sent back to the store.
    pub(crate) pending: AtomicU64,
    /// Slots in live permits admitted by the failure policy (never recorded in the store).
    pub(crate) degraded: AtomicU64,
    /// Callers parked in `acquire`.
    pub(crate) waiters: AtomicU64,
    /// Wakes parked callers: slots came back locally, or a store call finished.
    pub(crate) wake: Notify,
    /// Wakes the background task (pending releases, refill requests, shutdown).
    pub(crate) signal: RefillSignal,
}

/// Hybrid: the pool word (what `Deref` gives) and the total of slots ever taken from it, side
/// by side in 16 aligned bytes, so on one cache line: a successful take already owns that
/// line, and counting itself there costs no second cache miss. The total is a statistic
/// (published by the background task), so the hot path makes no metrics call.
#[derive(Debug, Default)]
#[repr(C, align(16))]
pub(crate) struct Pool {
    slots: AtomicU64,
    /// Slots taken from the pool by callers, ever.
    pub(crate) taken: AtomicU64,
}

impl Deref for Pool {
    type Target = AtomicU64;

    fn deref(&self) -> &AtomicU64 {
        &self.slots
    }
}

impl Local {
    pub(crate) fn new(hybrid: bool) -> Self {
        Local {
            hybrid,
            ..Local::default()
        }
    }

    /// Takes `n` slots from the pool: `Ok(left)`, or `Err(what there was)`.
    #[inline]
    pub(crate) fn take(&self, n: u64) -> Result<u64, u64> {
        // SeqCst load (a plain load on x86): a waiter registers in `waiters`, then reads the
        // pool here; a dropper adds to the pool, then reads `waiters` (`wake_waiters`). With
        // all four SeqCst, one of them sees the other, so no wake-up is lost — a Relaxed read
        // could see the pool from before the drop and park for a whole poll interval. SeqCst
        // on a successful CAS for the Dekker pattern with the refill flag (as in
        // `crate::lease::local`).
        let mut current = self.pool.load(Ordering::SeqCst);
        while current >= n {
            match self.pool.compare_exchange_weak(
                current,
                current - n,
                Ordering::SeqCst,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    // Relaxed: a statistic; nothing is published through it.
                    self.pool.taken.fetch_add(n, Ordering::Relaxed);
                    return Ok(current - n);
                }
                Err(actual) => current = actual,
            }
        }
        Err(current)
    }

    /// Takes up to `n` slots from the pool; returns how many.
    pub(crate) fn take_up_to(&self, n: u64) -> u64 {
        let mut current = self.pool.load(Ordering::SeqCst);
        loop {
            let take = current.min(n);
            match self.pool.compare_exchange_weak(
                current,
                current - take,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return take,
                Err(actual) => current = actual,
            }
        }
    }

    /// Wakes parked callers, if any (see the module docs for the ordering).
    #[inline]
    pub(crate) fn wake_waiters(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.wake.notify_waiters();
        }
    }
}

/// Slots held by this process until the permit is dropped.
///
/// Dropping the permit gives the slots back: in hybrid mode to the local pool at once, in pure
/// mode through the limiter's background task (one store call for every permit dropped
/// meanwhile). A permit that outlives its limiter's shutdown is not sent back; the store
/// reclaims its slots one ttl after the holder's last renewal.
///
/// There is no `forget`: a slot kept by a live process would be renewed forever, which is
/// exactly the leak this limiter exists to prevent.
#[must_use = "dropping a permit gives its slots back at once"]
pub struct Permit {
    local: Arc<Local>,
    n: u64,
    degraded: bool,
}

impl Permit {
    pub(crate) fn new(local: Arc<Local>, n: u64, degraded: bool) -> Self {
        Permit { local, n, degraded }
    }

    /// How many slots this permit holds.
    pub fn permits(&self) -> u64 {
        self.n
    }

    /// True if the failure policy admitted this permit while the store was failing: it is not
    /// recorded in the store, so it does not count against the fleet's limit.
    pub fn is_degraded(&self) -> bool {
        self.degraded
    }

    /// Gives the slots back now (the same as dropping the permit).
    pub fn release(self) {}
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("permits", &self.n)
            .field("degraded", &self.degraded)
            .finish()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let local = &*self.local;
        if self.degraded {
            local.degraded.fetch_sub(self.n, Ordering::SeqCst);
            local.wake_waiters();
        } else if local.hybrid {
            local.pool.fetch_add(self.n, Ordering::SeqCst);
            local.wake_waiters();
        } else {
            // Relaxed: a statistic.
            local.in_use.fetch_sub(self.n, Ordering::Relaxed);
            local.pending.fetch_add(self.n, Ordering::SeqCst);
            local.signal.request();
        }
    }
}
