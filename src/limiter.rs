//! What every limiter mode offers, so callers, the simulator and middleware can swap modes.

use std::borrow::Borrow;
use std::fmt::Display;
use std::future::Future;
use std::hash::Hash;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::AcquireError;
use crate::quota::Quota;
use crate::time;

/// The outcome of a check. Being limited is an outcome, not an error.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The tokens were taken.
    Allowed,
    /// Not now; try again after about `retry_after`.
    Denied {
        /// Estimated time until the request could succeed.
        retry_after: Duration,
    },
}

impl Decision {
    /// True for [`Decision::Allowed`].
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allowed)
    }
}

/// What a limiter can answer without awaiting anything: see
/// [`HybridLimiter::try_acquire_local`](crate::HybridLimiter::try_acquire_local),
/// [`KeyedHybridLimiter::try_acquire_local`](crate::KeyedHybridLimiter::try_acquire_local), and
/// for any limiter [`Limiter::local_answer`] and [`KeyedLimiter::local_answer`].
///
/// It tells apart the two reasons a hybrid limiter denies: the store said the budget is spent
/// ([`Denied`](LocalAnswer::Denied): waiting is the answer), and the limiter holds no tokens
/// and has no answer from the store yet ([`NeedsLease`](LocalAnswer::NeedsLease): a new key,
/// or tokens given back while idle), where one lease round trip decides. HTTP middleware sheds
/// the first and waits briefly for the second.
#[must_use]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalAnswer {
    /// The tokens were taken.
    Allowed,
    /// Refused by what the store said (or by the failure policy); try again after about
    /// `retry_after`.
    Denied {
        /// Estimated time until the request could succeed.
        retry_after: Duration,
    },
    /// No tokens here and no word from the store yet: a lease decides, about one store round
    /// trip (`retry_after`) away.
    NeedsLease {
        /// The expected time until the lease is answered (the measured round trip).
        retry_after: Duration,
    },
}

/// How long after the store last refused a limiter (or a key) a miss still counts as a
/// refusal ([`LocalAnswer::Denied`]) rather than as "no answer yet": a limiter at its limit
/// runs dry between two small grants, and waiting for each of those refills would queue
/// its requests one round trip at a time.
pub(crate) const RECENTLY_REFUSED: Duration = Duration::from_secs(1);

/// What a waiting check does with a refusal by the store (or by the failure policy): the
/// shed-or-wait decision that the waits of the hybrid and keyed limiters share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Patience {
    /// Return the refusal at once; wait only while there is no answer yet (a lease in
    /// flight). What `try_acquire_or_lease` does.
    LeaseOnly,
    /// Wait the refusal out, unless it ends after the deadline (`None`: never give up). What
    /// `acquire` and `try_acquire_for` do.
    Until(Option<Instant>),
}

impl Patience {
    /// Whether a refusal for `retry_after` ends the wait (it is returned) rather than being
    /// waited out.
    pub(crate) fn sheds(self, retry_after: Duration) -> bool {
        match self {
            Patience::LeaseOnly => true,
            Patience::Until(deadline) => deadline.is_some_and(|d| time::from_now(retry_after) > d),
        }
    }
}

/// Runs `wait` until `deadline`; past it, the answer is `Denied` with a `retry_after` of
/// `hint()`.
pub(crate) async fn bounded<F>(
    deadline: Instant,
    wait: F,
    hint: impl FnOnce() -> Duration,
) -> Result<Decision, AcquireError>
where
    F: Future<Output = Result<Decision, AcquireError>>,
{
    match tokio::time::timeout_at(deadline, wait).await {
        Ok(result) => result,
        Err(_) => Ok(Decision::Denied {
            retry_after: hint(),
        }),
    }
}

/// How long a limited request may wait for a lease when its limiter has no answer for it yet
/// ([`LocalAnswer::NeedsLease`]: a key new to this process, tokens given back while idle),
/// unless the layer's `lease_wait` says otherwise: a lease round trip with room to spare. The
/// default of both the HTTP layer and the tower middleware.
#[cfg(feature = "tower")]
pub const DEFAULT_LEASE_WAIT: Duration = Duration::from_millis(50);

/// The two waits a limited request may make in a layer that sheds load, each bounded on its
/// own: one for a lease ([`LocalAnswer::NeedsLease`]: one store round trip decides), one for
/// the next token after a refusal ([`LocalAnswer::Denied`]: waiting for it is queueing). The
/// default waits [`DEFAULT_LEASE_WAIT`] for a lease and never for a token.
#[cfg(feature = "tower")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waits {
    /// Longest wait for a lease when the limiter has no answer yet (zero: shed at once, with a
    /// `retry_after` of about one round trip).
    pub lease_wait: Duration,
    /// Longest wait for the next token after a refusal (zero: shed at once).
    pub queue: Duration,
}

#[cfg(feature = "tower")]
impl Default for Waits {
    fn default() -> Self {
        Waits {
            lease_wait: DEFAULT_LEASE_WAIT,
            queue: Duration::ZERO,
        }
    }
}

/// What a shedding layer does with a request, given what its limiter answered without
/// awaiting ([`Waits::next`]).
#[cfg(feature = "tower")]
pub(crate) enum Next {
    /// Serve it.
    Admit,
    /// The limiter failed.
    Fail(AcquireError),
    /// Refuse it: limited for about this long.
    Shed(Duration),
    /// Wait ([`Waits::settle`]): `Some` refusal to queue after, or `None` to ask the limiter
    /// (for a lease, or because it must await).
    Wait(Option<Decision>),
}

#[cfg(feature = "tower")]
impl Waits {
    /// Whether a refusal for `retry_after` is worth queueing for.
    fn queues(self, retry_after: Duration) -> bool {
        !self.queue.is_zero() && retry_after <= self.queue
    }

    /// The step for a limiter's immediate `answer` (`None`: the limiter must await).
    pub(crate) fn next(self, answer: Option<Result<LocalAnswer, AcquireError>>) -> Next {
        let refused = |retry_after| {
            if self.queues(retry_after) {
                Next::Wait(Some(Decision::Denied { retry_after }))
            } else {
                Next::Shed(retry_after)
            }
        };
        match answer {
            Some(Ok(LocalAnswer::Allowed)) => Next::Admit,
            Some(Err(e)) => Next::Fail(e),
            Some(Ok(LocalAnswer::Denied { retry_after })) => refused(retry_after),
            // No lease wait: "no answer yet" is a refusal for about one round trip.
            Some(Ok(LocalAnswer::NeedsLease { retry_after })) if self.lease_wait.is_zero() => {
                refused(retry_after)
            }
            Some(Ok(LocalAnswer::NeedsLease { .. })) | None => Next::Wait(None),
        }
    }

    /// The decision for a request that waits ([`Next::Wait`]): `first` if it is a refusal,
    /// else the limiter's answer within the lease wait (`lease()`); then, for a refusal that
    /// fits in `queue`, the next token within it (`queue(self.queue)`).
    ///
    /// # Errors
    /// The limiter's.
    pub(crate) async fn settle<L, Q>(
        self,
        first: Option<Decision>,
        lease: impl FnOnce() -> L,
        queue: impl FnOnce(Duration) -> Q,
    ) -> Result<Decision, AcquireError>
    where
        L: Future<Output = Result<Decision, AcquireError>>,
        Q: Future<Output = Result<Decision, AcquireError>>,
    {
        let decision = match first {
            Some(refused) => refused,
            None => lease().await?,
        };
        match decision {
            Decision::Denied { retry_after } if self.queues(retry_after) => queue(self.queue).await,
            decision => Ok(decision),
        }
    }
}

impl From<Decision> for LocalAnswer {
    fn from(decision: Decision) -> Self {
        match decision {
            Decision::Allowed => LocalAnswer::Allowed,
            Decision::Denied { retry_after } => LocalAnswer::Denied { retry_after },
        }
    }
}

/// The decision a [`LocalAnswer`] stands for: a lease still to come is a denial for about one
/// round trip (what `try_acquire` answers then).
fn decision_of(answer: LocalAnswer) -> Decision {
    match answer {
        LocalAnswer::Allowed => Decision::Allowed,
        LocalAnswer::Denied { retry_after } | LocalAnswer::NeedsLease { retry_after } => {
            Decision::Denied { retry_after }
        }
    }
}

/// A rate limiter shared by a fleet, in any mode.
///
/// Its methods have the names and shapes of the limiters' own methods (the rule is on the
/// [crate's front page](crate#one-name-one-shape)), so code written against the trait, or
/// switched between [`HybridLimiter`](crate::HybridLimiter) and
/// [`RedisLimiter`](crate::RedisLimiter), needs no edit: [`acquire_now`](Limiter::acquire_now)
/// decides once, [`acquire`](Limiter::acquire) waits until admitted,
/// [`try_acquire_for`](Limiter::try_acquire_for) waits at most a timeout. The synchronous
/// `try_acquire` is not here: only a limiter that keeps local state has it;
/// [`local_answer`](Limiter::local_answer) is its form for any limiter (`None` when the limiter
/// must ask the store).
pub trait Limiter: Send + Sync {
    /// The limiter's quota.
    fn quota(&self) -> Quota;

    /// A warm start: waits until the limiter has heard from the store once, so the first
    /// decision waits neither for a lease nor for a connection, and reports a store that does
    /// not answer before traffic is served. [`HybridLimiter::ready`](crate::HybridLimiter::ready)
    /// waits for the first lease, [`RedisLimiter::ready`](crate::RedisLimiter::ready) makes
    /// one call that takes nothing. The default, for a limiter with nothing to prepare,
    /// returns at once.
    ///
    /// # Errors
    /// [`AcquireError::Store`] if the store did not answer (the limiter keeps running under
    /// its failure policy); [`AcquireError::Closed`] if it was shut down.
    fn ready(&self) -> impl Future<Output = Result<(), AcquireError>> + Send {
        std::future::ready(Ok(()))
    }

    /// Takes `n` tokens now, or says when to retry: one decision, never a wait for tokens. A
    /// pure limiter makes one store call; a hybrid one is its own
    /// [`acquire_now`](crate::HybridLimiter::acquire_now): an answer from its local bucket (the
    /// future is ready at once), or where leasing buys nothing one store call for a miss.
    ///
    /// # Errors
    /// [`AcquireError::ZeroTokens`], [`AcquireError::ExceedsBurst`], or a store failure.
    fn acquire_now(&self, n: u64) -> impl Future<Output = Result<Decision, AcquireError>> + Send;

    /// Waits until `n` tokens are taken.
    ///
    /// # Errors
    /// As [`acquire_now`](Limiter::acquire_now).
    ///
    /// # Cancel safety
    /// Cancel safe in the sense that a dropped future never admits: no tokens are handed to
    /// it. A decision already sent to the store (pure mode, or where leasing buys nothing)
    /// still runs there and may take its tokens — the fleet then admits fewer, never more.
    fn acquire(&self, n: u64) -> impl Future<Output = Result<(), AcquireError>> + Send;

    /// Waits at most `timeout` for `n` tokens. Returns `Denied` at once when the earliest
    /// possible grant is known to lie beyond the timeout.
    ///
    /// # Errors
    /// As [`acquire_now`](Limiter::acquire_now).
    fn try_acquire_for(
        &self,
        n: u64,
        timeout: Duration,
    ) -> impl Future<Output = Result<Decision, AcquireError>> + Send;

    /// The limiter's synchronous `try_acquire_local`, if it keeps local state (a
    /// [`HybridLimiter`](crate::HybridLimiter) does): takes `n` tokens without awaiting, and
    /// tells a refusal from "no answer from the store yet" ([`LocalAnswer::NeedsLease`]).
    /// `None` if this limiter must ask the store (pure mode, and a hybrid limiter's miss where
    /// leasing buys nothing: use [`acquire_now`](Limiter::acquire_now) or
    /// [`try_acquire_or_lease`](Limiter::try_acquire_or_lease)), the default. Middleware uses
    /// it to admit without allocating a future.
    fn local_answer(&self, n: u64) -> Option<Result<LocalAnswer, AcquireError>> {
        let _ = n;
        None
    }

    /// Takes `n` tokens now, waiting at most `lease_wait` while the limiter has no answer from
    /// the store yet (a lease in flight), but never for tokens the store said are not there:
    /// that is `Denied` at once. Pure modes, whose every decision is a store call, answer as
    /// [`acquire_now`](Limiter::acquire_now) (the default).
    ///
    /// # Errors
    /// As [`acquire_now`](Limiter::acquire_now).
    fn try_acquire_or_lease(
        &self,
        n: u64,
        lease_wait: Duration,
    ) -> impl Future<Output = Result<Decision, AcquireError>> + Send {
        let _ = lease_wait;
        self.acquire_now(n)
    }

    /// The old name of [`acquire_now`](Limiter::acquire_now).
    ///
    /// # Errors
    /// As [`acquire_now`](Limiter::acquire_now).
    #[deprecated(
        note = "use `acquire_now` (the same decision): `try_acquire` is now the synchronous \
                local check, on the limiters that keep local state"
    )]
    fn try_acquire(&self, n: u64) -> impl Future<Output = Result<Decision, AcquireError>> + Send {
        self.acquire_now(n)
    }

    /// The old name of [`local_answer`](Limiter::local_answer), as a [`Decision`] (no answer
    /// yet is a denial).
    #[deprecated(note = "use `local_answer`")]
    fn try_acquire_now(&self, n: u64) -> Option<Result<Decision, AcquireError>> {
        self.local_answer(n).map(|r| r.map(decision_of))
    }

    /// The old name of [`local_answer`](Limiter::local_answer).
    #[deprecated(
        note = "use `local_answer` (`try_acquire_local` is the limiters' own synchronous method)"
    )]
    fn try_acquire_local(&self, n: u64) -> Option<Result<LocalAnswer, AcquireError>> {
        self.local_answer(n)
    }
}

/// A borrowed form of a key of type `K`, as keyed limiters take it: `&str` for `String` keys,
/// `&K` for any key. Implemented for every type with these bounds.
pub trait KeyRef<K>: Hash + Eq + Display + ToOwned<Owned = K> + Sync {}

impl<K, Q> KeyRef<K> for Q where Q: Hash + Eq + Display + ToOwned<Owned = K> + Sync + ?Sized {}

/// A limiter with one budget per key, in any mode: what middleware keyed by user, API key or
/// address calls.
///
/// As [`Limiter`], its methods have the names and shapes of the keyed limiters' own (see the
/// [crate's front page](crate#one-name-one-shape)):
/// [`KeyedHybridLimiter`](crate::KeyedHybridLimiter) and
/// [`KeyedRedisLimiter`](crate::KeyedRedisLimiter) swap without an edit. Keys are passed in
/// any borrowed form of `K` (`&str` for `String` keys), so a lookup allocates nothing.
pub trait KeyedLimiter<K>: Send + Sync {
    /// The quota every key gets.
    fn quota(&self) -> Quota;

    /// Takes `n` tokens of `key` now, or says when to retry: one decision, never a wait for
    /// tokens. A pure limiter makes one store call; a hybrid one answers from the key's local
    /// tokens, as its synchronous `try_acquire` (the future is ready at once).
    ///
    /// # Errors
    /// [`AcquireError::ZeroTokens`], [`AcquireError::ExceedsBurst`], or a store failure.
    fn acquire_now<Q>(
        &self,
        key: &Q,
        n: u64,
    ) -> impl Future<Output = Result<Decision, AcquireError>> + Send
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized;

    /// Waits until `n` tokens of `key` are taken.
    ///
    /// # Errors
    /// As [`acquire_now`](KeyedLimiter::acquire_now).
    ///
    /// # Cancel safety
    /// Cancel safe in the sense that a dropped future never admits: no tokens are handed to
    /// it. A decision already sent to the store (pure mode, or where leasing buys nothing)
    /// still runs there and may take its tokens — the fleet then admits fewer, never more.
    fn acquire<Q>(&self, key: &Q, n: u64) -> impl Future<Output = Result<(), AcquireError>> + Send
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized;

    /// Waits at most `timeout` for `n` tokens of `key`. Returns `Denied` at once when the
    /// earliest possible grant is known to lie beyond the timeout.
    ///
    /// # Errors
    /// As [`acquire_now`](KeyedLimiter::acquire_now).
    fn try_acquire_for<Q>(
        &self,
        key: &Q,
        n: u64,
        timeout: Duration,
    ) -> impl Future<Output = Result<Decision, AcquireError>> + Send
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized;

    /// The limiter's synchronous `try_acquire_local`, if it keeps local state (a
    /// [`KeyedHybridLimiter`](crate::KeyedHybridLimiter) does): takes `n` tokens of `key`
    /// without awaiting, and tells a refusal from "no answer from the store yet"
    /// ([`LocalAnswer::NeedsLease`]: a key new to this process, a refill in flight). `None` if
    /// this limiter must ask the store (pure mode: use
    /// [`acquire_now`](KeyedLimiter::acquire_now)), the default. Middleware uses it to admit
    /// without allocating a future.
    fn local_answer<Q>(&self, key: &Q, n: u64) -> Option<Result<LocalAnswer, AcquireError>>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        let _ = (key, n);
        None
    }

    /// Takes `n` tokens of `key` now, waiting at most `lease_wait` while the limiter has no
    /// answer from the store for the key yet (a new key's first lease, a refill in flight), but
    /// never for tokens the store said are not there: that is `Denied` at once. Pure modes,
    /// whose every decision is a store call, answer as
    /// [`acquire_now`](KeyedLimiter::acquire_now) (the default).
    ///
    /// # Errors
    /// As [`acquire_now`](KeyedLimiter::acquire_now).
    fn try_acquire_or_lease<Q>(
        &self,
        key: &Q,
        n: u64,
        lease_wait: Duration,
    ) -> impl Future<Output = Result<Decision, AcquireError>> + Send
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        let _ = lease_wait;
        self.acquire_now(key, n)
    }

    /// The old name of [`acquire_now`](KeyedLimiter::acquire_now).
    ///
    /// # Errors
    /// As [`acquire_now`](KeyedLimiter::acquire_now).
    #[deprecated(
        note = "use `acquire_now` (the same decision): `try_acquire` is now the synchronous \
                local check, on the limiters that keep local state"
    )]
    fn try_acquire<Q>(
        &self,
        key: &Q,
        n: u64,
    ) -> impl Future<Output = Result<Decision, AcquireError>> + Send
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        self.acquire_now(key, n)
    }

    /// The old name of [`local_answer`](KeyedLimiter::local_answer), as a [`Decision`] (no
    /// answer yet is a denial).
    #[deprecated(note = "use `local_answer`")]
    fn try_acquire_now<Q>(&self, key: &Q, n: u64) -> Option<Result<Decision, AcquireError>>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        self.local_answer(key, n).map(|r| r.map(decision_of))
    }

    /// The old name of [`local_answer`](KeyedLimiter::local_answer).
    #[deprecated(
        note = "use `local_answer` (`try_acquire_local` is the limiters' own synchronous method)"
    )]
    fn try_acquire_local<Q>(&self, key: &Q, n: u64) -> Option<Result<LocalAnswer, AcquireError>>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        self.local_answer(key, n)
    }
}

/// Rejects requests that can never succeed.
#[inline]
pub(crate) fn check_request(quota: &Quota, n: u64) -> Result<(), AcquireError> {
    check_tokens(n, quota.burst())
}

/// A layer's tokens per request (0 is read as 1), refused where no request could ever be
/// admitted: more than `quota`'s burst.
#[cfg(feature = "tower")]
pub(crate) fn layer_tokens(tokens: u64, quota: &Quota) -> Result<u64, crate::BuildError> {
    let tokens = tokens.max(1);
    check_tokens(tokens, quota.burst()).map_err(|e| {
        crate::BuildError::Config(format!(
            "a layer charging {tokens} tokens per request could admit none: {e}"
        ))
    })?;
    Ok(tokens)
}

/// Rejects requests that can never succeed against a bucket of `burst`.
#[inline]
pub(crate) fn check_tokens(n: u64, burst: u64) -> Result<(), AcquireError> {
    if n == 0 {
        return Err(AcquireError::ZeroTokens);
    }
    if n > burst {
        return Err(AcquireError::ExceedsBurst {
            requested: n,
            burst,
        });
    }
    Ok(())
}

#[cfg(all(test, feature = "tower"))]
mod tests {
    use super::*;

    fn step(waits: Waits, answer: LocalAnswer) -> &'static str {
        match waits.next(Some(Ok(answer))) {
            Next::Admit => "admit",
            Next::Fail(_) => "fail",
            Next::Shed(_) => "shed",
            Next::Wait(None) => "ask",
            Next::Wait(Some(_)) => "queue",
        }
    }

    #[test]
    fn a_lease_is_waited_for_a_refusal_only_if_it_fits_in_the_queue() {
        let ms = Duration::from_millis;
        let lease = LocalAnswer::NeedsLease { retry_after: ms(2) };
        let refused = LocalAnswer::Denied {
            retry_after: ms(30),
        };
        let default = Waits::default();
        assert_eq!(default.lease_wait, DEFAULT_LEASE_WAIT);
        assert_eq!(step(default, LocalAnswer::Allowed), "admit");
        assert_eq!(step(default, lease), "ask");
        assert_eq!(step(default, refused), "shed");
        assert!(matches!(
            default.next(Some(Err(AcquireError::Closed))),
            Next::Fail(AcquireError::Closed)
        ));
        assert!(matches!(default.next(None), Next::Wait(None)), "must await");
        let no_lease_wait = Waits {
            lease_wait: Duration::ZERO,
            ..default
        };
        assert!(matches!(no_lease_wait.next(Some(Ok(lease))), Next::Shed(d) if d == ms(2)));
        let queue = |queue| Waits {
            queue,
            ..no_lease_wait
        };
        assert_eq!(step(queue(ms(30)), refused), "queue");
        assert_eq!(step(queue(ms(29)), refused), "shed");
        assert_eq!(
            step(queue(ms(2)), lease),
            "queue",
            "no lease wait: a refusal"
        );
    }
}
