//! The `lock-based` mode: a Redis lock around a client-side token bucket (the common shape,
//! with the safe unlock), modelled one store call per Redis command.
//!
//! Per request a node:
//!
//! 1. **locks**: `SET lock <owner> NX PX <lease>`; if another owner holds it, it retries at
//!    after a back-off of [`BACKOFF_NS`] until the request's deadline (the client timeout after
//!    arrival), when it gives up with an error;
//! 2. **reads** the bucket (`HMGET tokens ts`);
//! 3. **computes** the token-bucket step in the client, at the virtual instant the read's reply
//!    arrives (the decision time);
//! 4. **writes** the bucket back;
//! 5. **unlocks** safely: deletes the lock only if it still names this owner (the
//!    compare-and-delete script the common recipe lacks).
//!
//! That is four round trips and four service times per decision without contention, plus one
//! per failed lock attempt. The bucket is integer arithmetic in units of `1 / period_ns`
//! tokens, so it is exact: with the lock held, nothing else writes. The lease is four client
//! timeouts, longer than the three calls a holder makes, so a holder that gives up on a
//! timeout loses the lock before anyone could mistake it for live.

use std::sync::{Arc, Mutex};

use ratelease::Quota;

use crate::record::Outcome;
use crate::store_model::SimStore;

/// Wait between failed lock attempts, ns.
pub const BACKOFF_NS: u64 = 200_000;

/// The Redis data of the lock-based mode: the lock key and the bucket hash.
#[derive(Debug, Default)]
pub struct LockData {
    /// Owner and expiry (ns) of the lock, if set.
    holder: Option<(u64, u64)>,
    /// Level in units of `1 / period_ns` tokens and the time it was written; `None`: absent.
    bucket: Option<(u64, u64)>,
}

/// Shared [`LockData`].
pub type Shared = Arc<Mutex<LockData>>;

fn data(d: &Shared) -> std::sync::MutexGuard<'_, LockData> {
    d.lock().unwrap_or_else(|e| e.into_inner())
}

/// Serves one request (see the module docs). Returns the outcome and the decision time.
pub async fn serve(
    store: &SimStore,
    shared: &Shared,
    quota: Quota,
    owner: u64,
    lease_ns: u64,
    deadline_ns: u64,
    now: &(dyn Fn() -> u64 + Send + Sync),
) -> (Outcome, u64) {
    // 1. Lock.
    loop {
        let d = shared.clone();
        let got = store
            .command(Box::new(move |t| {
                let mut d = data(&d);
                let free = d.holder.is_none_or(|(_, exp)| exp <= t);
                if free {
                    d.holder = Some((owner, t + lease_ns));
                }
                [u64::from(free), 0]
            }))
            .await;
        match got {
            Ok([1, _]) => break,
            Ok(_) if now() + BACKOFF_NS < deadline_ns => store.sleep_ns(BACKOFF_NS).await,
            _ => return (Outcome::Error, now()),
        }
    }
    let outcome = step(store, shared, quota, now).await;
    let decided = outcome.map_or_else(now, |(_, t)| t);
    // 5. Unlock, only if still ours.
    let d = shared.clone();
    let _ = store
        .command(Box::new(move |_| {
            let mut d = data(&d);
            let ours = d.holder.is_some_and(|(o, _)| o == owner);
            if ours {
                d.holder = None;
            }
            [u64::from(ours), 0]
        }))
        .await;
    match outcome {
        Some((true, _)) => (Outcome::Admitted, decided),
        Some((false, _)) => (Outcome::Rejected, decided),
        None => (Outcome::Error, decided),
    }
}

/// Steps 2–4 under the lock: `Some((admitted, decision time))`, `None` on a store error.
async fn step(
    store: &SimStore,
    shared: &Shared,
    quota: Quota,
    now: &(dyn Fn() -> u64 + Send + Sync),
) -> Option<(bool, u64)> {
    let period = quota.period().as_nanos() as u64;
    let full = quota.burst() * period;
    // 2. Read: the level and the time it was written, plus one (0: no bucket yet).
    let d = shared.clone();
    let [stored, written] = store
        .command(Box::new(move |_| match data(&d).bucket {
            Some((level, ts)) => [level, ts + 1],
            None => [0, 0],
        }))
        .await
        .ok()?;
    let now = now();
    // 3. Compute, in the client.
    let mut level = if written > 0 {
        let refill = now.saturating_sub(written - 1).saturating_mul(quota.rate());
        stored.saturating_add(refill).min(full)
    } else {
        full
    };
    let admitted = level >= period;
    if admitted {
        level -= period;
    }
    // 4. Write.
    let d = shared.clone();
    store
        .command(Box::new(move |_| {
            data(&d).bucket = Some((level, now));
            [1, 0]
        }))
        .await
        .ok()?;
    Some((admitted, now))
}
