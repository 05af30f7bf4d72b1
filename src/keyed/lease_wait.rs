//! Waiting for a key's lease without queueing for its tokens: what HTTP middleware needs.
//!
//! A [`KeyedHybridLimiter`] denies a request for one of two reasons, and a server that sheds
//! load must treat them differently:
//!
//! - **no answer yet** (`Why::Pending`, not refused): the key holds no tokens here and the
//!   store has not refused it lately — a key new to this process (or evicted while idle), or a
//!   refill still in flight while the key ramps up. One lease round trip decides; refusing
//!   would turn every new user's first request (and a growing key's late refill) into a 429.
//! - **the store's answer** (`Why::Blocked`, or the failure policy's): the key's budget is
//!   spent until `retry_after`. Waiting for it is queueing, which a shedding server must not
//!   do (at 1 000/s for one key, waiting requests pile up and throughput collapses to the
//!   limit). A key the store refused within the last second (`RECENTLY_REFUSED`) is at its
//!   limit: it runs dry between two small grants, and a miss on it is a refusal too. Only
//!   the store's refusal counts: a key denied while the store was failing is not at its limit
//!   once the store answers again. The check reads the key's state and the clock once, for
//!   the miss and this alike.
//!
//! [`try_acquire_local`](KeyedHybridLimiter::try_acquire_local) reports which one it is,
//! without awaiting; [`try_acquire_or_lease`](KeyedHybridLimiter::try_acquire_or_lease) waits
//! for the first kind only. It is `Shared::wait` with [`Patience::LeaseOnly`]: a known refusal
//! is returned instead of waited out, and a lease is waited for on the worker's reply to this
//! call (held back by the worker while another lease of the key is in flight, and answered as
//! soon as that one is), so an over-limit key's requests that land between two of its leases
//! wait one round trip, not a timer tick, and are woken by no other key's lease.

use std::borrow::Borrow;
use std::fmt::Display;
use std::hash::{BuildHasher, Hash};
use std::time::Duration;

use super::shared::{Outcome, Why};
use super::KeyedHybridLimiter;
use crate::error::AcquireError;
use crate::limiter::{bounded, Decision, KeyRef, LocalAnswer, Patience};
use crate::store::LeaseStore;

impl<K, S, H> KeyedHybridLimiter<K, S, H>
where
    K: Hash + Eq + Clone + Display + Send + Sync + 'static,
    S: LeaseStore,
    H: BuildHasher + Clone + Send + Sync + 'static,
{
    /// [`try_acquire`](Self::try_acquire) that tells a refusal by the store
    /// ([`LocalAnswer::Denied`]: the key's budget is spent until `retry_after`) from a key
    /// that holds no tokens here and was not refused ([`LocalAnswer::NeedsLease`]: a new key,
    /// or a refill in flight). Never waits; queues the key's lease as `try_acquire` does.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    #[inline]
    pub fn try_acquire_local<Q>(&self, key: &Q, n: u64) -> Result<LocalAnswer, AcquireError>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        let s = &*self.handle.shared;
        Ok(match s.take(key, n, true)? {
            Outcome::Allowed => LocalAnswer::Allowed,
            Outcome::Denied {
                retry_after,
                why: Why::Pending { refused: false },
            } => LocalAnswer::NeedsLease { retry_after },
            Outcome::Denied { retry_after, .. } => LocalAnswer::Denied { retry_after },
        })
    }

    /// Takes `n` tokens of `key`, waiting at most `lease_wait` while this process has no
    /// answer from the store for the key (a new key's first lease, a refill in flight) — one
    /// round trip, typically. A refusal by the store (or by the failure policy) is returned at
    /// once as `Denied`: this never waits for the key's next token.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire_or_lease<Q>(
        &self,
        key: &Q,
        n: u64,
        lease_wait: Duration,
    ) -> Result<Decision, AcquireError>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        let s = &*self.handle.shared;
        let wait = s.wait(key, n, Patience::LeaseOnly);
        bounded(crate::time::from_now(lease_wait), wait, || s.rtt()).await
    }
}
