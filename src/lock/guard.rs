//! [`LockGuard`]: one hold of a lock, its watchdog, and its release.
//!
//! While a guard lives, its watchdog task renews the lease every third of the lease time, so a
//! live holder keeps the lock however long it works and a dead one loses it within one lease.
//! If a renewal finds the lock no longer held by its owner (the lease ran out while the
//! process was paused or cut off), the watchdog stops and [`LockGuard::lease_lost`] turns true:
//! from then on only the fencing token protects downstream writes.
//!
//! Dropping a guard stops its watchdog and spawns the release on the current tokio runtime
//! (outside a runtime the lock is left to expire); [`LockGuard::unlock`] releases and waits for
//! the answer.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::task::JoinHandle;

use super::error::LockError;
use super::owner::LockOwner;
use super::redis_lock::RedisLock;
use super::script;

/// One hold of a [`RedisLock`]; releases it when dropped.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard {
    lock: RedisLock,
    owner: LockOwner,
    fence: u64,
    count: u64,
    lost: Arc<AtomicBool>,
    watchdog: Option<JoinHandle<()>>,
    released: bool,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("lock", &self.lock.name())
            .field("owner", &self.owner)
            .field("fence", &self.fence)
            .field("count", &self.count)
            .field("lease_lost", &self.lease_lost())
            .finish()
    }
}

impl LockGuard {
    pub(crate) fn new(lock: RedisLock, owner: LockOwner, fence: u64, count: u64) -> Self {
        let lost = Arc::new(AtomicBool::new(false));
        let watchdog = lock
            .shared
            .watchdog
            .then(|| tokio::spawn(watchdog(lock.clone(), owner, fence, lost.clone())));
        LockGuard {
            lock,
            owner,
            fence,
            count,
            lost,
            watchdog,
            released: false,
        }
    }

    /// The fencing token of this hold: strictly greater than that of every earlier holder of
    /// the lock, the same for re-entries of one hold. Pass it to downstream stores and have them
    /// reject writes carrying a smaller token than one they have already seen.
    pub fn fencing_token(&self) -> u64 {
        self.fence
    }

    /// The owner's re-entry count when this guard was acquired (1 for a first acquisition).
    pub fn hold_count(&self) -> u64 {
        self.count
    }

    /// The owner holding the lock.
    pub fn owner(&self) -> &LockOwner {
        &self.owner
    }

    /// The lock.
    pub fn lock(&self) -> &RedisLock {
        &self.lock
    }

    /// Whether the watchdog found the lock no longer held by this owner (its lease ran out).
    /// Always `false` with the watchdog off.
    pub fn lease_lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }

    /// Releases this hold and waits for Redis to confirm: the count goes down by one, and at
    /// zero the lock is deleted and waiters are notified.
    ///
    /// # Errors
    /// [`LockError::NotHeld`] if the owner no longer held the lock in this guard's hold (its
    /// lease expired, even if the owner has taken the lock again since; nothing was changed),
    /// or the Redis error.
    pub async fn unlock(mut self) -> Result<(), LockError> {
        self.stop_watchdog();
        self.released = true;
        match release(&self.lock, &self.owner, self.fence).await? {
            Some(_) => Ok(()),
            None => Err(LockError::NotHeld {
                name: self.lock.name().to_owned(),
                owner: self.owner.to_string(),
            }),
        }
    }

    fn stop_watchdog(&mut self) {
        if let Some(w) = self.watchdog.take() {
            w.abort();
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.stop_watchdog();
        if self.released {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let lock = self.lock.clone();
            let (owner, fence) = (self.owner, self.fence);
            rt.spawn(async move {
                if let Err(e) = release(&lock, &owner, fence).await {
                    tracing::warn!(lock = %lock.name(), error = %e, "release on drop failed");
                }
            });
        }
    }
}

/// Releases one hold of `owner`'s hold `fence` (a later hold of the same owner is not this
/// guard's to release).
async fn release(
    lock: &RedisLock,
    owner: &LockOwner,
    fence: u64,
) -> Result<Option<u64>, LockError> {
    let s = &lock.shared;
    script::release(
        &s.conn,
        &lock.keys,
        owner,
        fence,
        s.lease,
        s.response_timeout,
    )
    .await
}

/// Renews the lease of hold `fence` every third of it until aborted or the lock is found lost
/// (expired, or held again by the owner in a later hold).
async fn watchdog(lock: RedisLock, owner: LockOwner, fence: u64, lost: Arc<AtomicBool>) {
    let s = &lock.shared;
    let period = (s.lease / 3).max(std::time::Duration::from_millis(1));
    loop {
        tokio::time::sleep(period).await;
        let renewed = script::extend(
            &s.conn,
            &lock.keys,
            &owner,
            fence,
            s.lease,
            s.response_timeout,
        );
        match renewed.await {
            Ok(true) => {}
            Ok(false) => {
                lost.store(true, Ordering::Relaxed);
                tracing::warn!(lock = %lock.name(), %owner, "lease lost; watchdog stops");
                return;
            }
            // A failed renewal is retried next period; the lease covers two more tries.
            Err(e) => tracing::debug!(lock = %lock.name(), error = %e, "lease renewal failed"),
        }
    }
}
