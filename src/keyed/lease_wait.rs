//! Waiting for a key's lease without queueing for its tokens: what HTTP middleware needs.
//!
//! A [`KeyedHybridLimiter`] denies a request for one of two reasons, and a server that sheds
//! load must treat them differently:
//!
//! - **no answer yet** (`Why::Pending` on a key never granted tokens): a key new to this
//!   process (or evicted while idle). One lease round trip decides; refusing would turn every
//!   new user's first request into a 429.
//! - **the store's answer** (`Why::Blocked`, or the failure policy's): the key's budget is
//!   spent until `retry_after`. Waiting for it is queueing, which a shedding server must not
//!   do (at 1 000/s for one key, waiting requests pile up and throughput collapses to the
//!   limit). A key served before whose refill is late is treated the same way: its refill
//!   comes ahead of need (the low-water mark), so a miss on it means demand above its share,
//!   and polling for refills of a hot key is queueing by another name.
//!
//! [`try_acquire_local`](KeyedHybridLimiter::try_acquire_local) reports which one it is,
//! without awaiting; [`try_acquire_or_lease`](KeyedHybridLimiter::try_acquire_or_lease) waits
//! for the first kind only. This is [`Shared::wait`](super::Shared) with every wait for a
//! known refusal replaced by the refusal itself.

use std::borrow::Borrow;
use std::fmt::Display;
use std::hash::{BuildHasher, Hash};
use std::time::Duration;

use tokio::time::Instant;

use super::state::GRANTED;
use super::worker::Answer;
use super::{KeyedHybridLimiter, Outcome, Shared, Why};
use crate::error::Error;
use crate::failure::FailurePolicy;
use crate::limiter::{check_tokens, Decision, KeyRef, LocalAnswer};
use crate::store::LeaseStore;

/// Shortest pause between two looks for a lease in flight.
const MIN_POLL: Duration = Duration::from_micros(100);

impl<K, S, H> KeyedHybridLimiter<K, S, H>
where
    K: Hash + Eq + Clone + Display + Send + Sync + 'static,
    S: LeaseStore,
    H: BuildHasher + Clone + Send + Sync + 'static,
{
    /// [`try_acquire`](Self::try_acquire) that tells a refusal by the store
    /// ([`LocalAnswer::Denied`]) from a key this process has no answer for yet
    /// ([`LocalAnswer::NeedsLease`]). Never waits.
    ///
    /// `NeedsLease` is only for a key this process was never granted tokens for (a new key,
    /// or one evicted after `idle_ttl`): no lease is queued for it, since
    /// [`try_acquire_or_lease`](Self::try_acquire_or_lease) asks the store directly (and
    /// `try_acquire` queues one). A key served before is refilled ahead of need; a miss on it
    /// queues its refill, as `try_acquire` does, and is `Denied` for a round trip — waiting for
    /// refills is how an over-limit key's requests would queue.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    #[inline]
    pub fn try_acquire_local<Q>(&self, key: &Q, n: u64) -> Result<LocalAnswer, Error>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        let s = &*self.handle.shared;
        check_tokens(n, s.quota.burst())?;
        match s.map.get(key) {
            Some(state) => match s.take_held(&state, n) {
                Some(left) => {
                    if state.below_low_water(left) {
                        s.request(key, &state, 0);
                    }
                    Ok(LocalAnswer::Allowed)
                }
                // Served before: its refill is queued as by `try_acquire`, and a miss until it
                // lands is a refusal (waiting for it would queue on an over-limit key).
                None if state.flags() & GRANTED != 0 => {
                    Ok(s.miss(key, Some(&state), n, true)?.into_decision().into())
                }
                None => Ok(local_answer(s.miss(key, Some(&state), n, false)?)),
            },
            None => Ok(local_answer(s.miss(key, None, n, false)?)),
        }
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
    ) -> Result<Decision, Error>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        let s = &*self.handle.shared;
        let deadline = crate::deadline::from_now(lease_wait);
        match tokio::time::timeout_at(deadline, s.wait_for_answer(key, n, deadline)).await {
            Ok(result) => result,
            Err(_) => Ok(Decision::Denied {
                retry_after: s.rtt(),
            }),
        }
    }
}

impl Outcome {
    fn into_decision(self) -> Decision {
        match self {
            Outcome::Allowed => Decision::Allowed,
            Outcome::Denied { retry_after, .. } => Decision::Denied { retry_after },
        }
    }
}

/// The public form of a local check's outcome for a key never granted tokens: a miss still
/// waiting for the store is [`LocalAnswer::NeedsLease`].
fn local_answer(outcome: Outcome) -> LocalAnswer {
    match outcome {
        Outcome::Allowed => LocalAnswer::Allowed,
        Outcome::Denied {
            retry_after,
            why: Why::Pending,
        } => LocalAnswer::NeedsLease { retry_after },
        Outcome::Denied { retry_after, .. } => LocalAnswer::Denied { retry_after },
    }
}

impl<K, S, H> Shared<K, S, H>
where
    K: Hash + Eq + Clone + Display + Send + Sync + 'static,
    S: LeaseStore,
    H: BuildHasher + Clone + Send + Sync + 'static,
{
    /// Takes `n` tokens of `key` once the store has answered for it; returns the store's (or
    /// the failure policy's) refusal as it comes. The caller bounds it with a timeout.
    async fn wait_for_answer<Q>(
        &self,
        key: &Q,
        n: u64,
        deadline: Instant,
    ) -> Result<Decision, Error>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        loop {
            // As in `wait`: under an open circuit a miss queues the probe that closes it.
            let probe = self.circuit.is_open();
            let (retry_after, why) = match self.take(key, n, probe)? {
                Outcome::Allowed => return Ok(Decision::Allowed),
                Outcome::Denied { retry_after, why } => (retry_after, why),
            };
            match why {
                Why::Blocked | Why::Policy => return Ok(Decision::Denied { retry_after }),
                Why::Failing => {
                    return match self.circuit.last_error() {
                        Some(e) => Err(Error::Store(e)),
                        None => Ok(Decision::Denied { retry_after }),
                    }
                }
                // A lease of this key is on its way (a refill, or the one a sync check
                // queued): poll for its tokens, a round trip at a time, until the deadline.
                Why::Pending if self.lease_queued(key) => {
                    let wake = Instant::now() + retry_after.max(MIN_POLL);
                    tokio::time::sleep_until(wake.min(deadline)).await;
                }
                Why::Pending => {
                    self.ensure_state(key);
                    match self.ask(key, n).await? {
                        Answer::Granted => return Ok(Decision::Allowed),
                        // A refill of this key may have landed meanwhile: take it if so.
                        Answer::Denied(_) if self.take_local(key, n) => {
                            return Ok(Decision::Allowed)
                        }
                        Answer::Denied(retry_after) => return Ok(Decision::Denied { retry_after }),
                        Answer::Failed(e) if self.failure == FailurePolicy::FailClosed => {
                            return Err(Error::Store(e))
                        }
                        // The circuit is open now: the next check answers by the policy.
                        Answer::Failed(_) => continue,
                        Answer::TooLarge(burst) => {
                            return Err(Error::ExceedsBurst {
                                requested: n,
                                burst,
                            })
                        }
                        Answer::Closed => return Err(Error::Closed),
                    }
                }
            }
        }
    }
}
