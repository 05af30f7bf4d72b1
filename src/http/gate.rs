//! How the layer asks its limiter: [`Global`] (one budget) and [`Keyed`] (one per key).
//!
//! A [`Gate`] turns a request into a [`Step`]. The decision is synchronous whenever the
//! limiter can answer without awaiting (a hybrid limiter always can): admitted, or shed with
//! the limiter's `retry_after`, with no allocation either way. Only two cases wait, each
//! bounded by its own setting of [`Waits`]:
//!
//! - **a lease** ([`LocalAnswer::NeedsLease`](crate::LocalAnswer::NeedsLease): a key new to
//!   this process, tokens given back while idle) — up to `lease_wait`, on by default: one round
//!   trip to the store decides, and refusing would answer every new key's first request with a
//!   429;
//! - **the next token** (a refusal whose `retry_after` fits in `queue`) — off by default: a
//!   server that waits for tokens of an over-limit key queues its requests instead of
//!   shedding them.
//!
//! A limiter that cannot answer without awaiting (pure mode) is awaited: its store call is the
//! decision, not a wait.

use std::borrow::{Borrow, Cow};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use http::Request;

use super::key::{KeyError, KeyExtractor};
use crate::error::AcquireError;
pub use crate::limiter::Waits;
use crate::limiter::{Decision, KeyedLimiter, Limiter, Next};
use crate::quota::Quota;

/// A boxed, sendable future: only requests that wait pay for one.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What to do with a request, as a [`Gate`] decided.
#[must_use]
#[non_exhaustive]
pub enum Step {
    /// Serve it.
    Admit,
    /// Refuse it: limited for about `retry_after`.
    Shed {
        /// The limiter's estimate of when a retry could succeed.
        retry_after: Duration,
    },
    /// The limiter failed (a store failure no failure policy answers, a request above the
    /// burst: see [`Rejection::Unavailable`](super::Rejection::Unavailable)).
    Fail(AcquireError),
    /// The request has no usable key.
    NoKey(KeyError),
    /// Wait for the decision (a lease, the next token, or a limiter that must await).
    Wait(BoxFuture<Result<Decision, AcquireError>>),
}

/// How a [`Limit`](super::Limit) service asks its limiter. Implemented by [`Global`] and
/// [`Keyed`].
pub trait Gate: Send + Sync + 'static {
    /// The quota the headers advertise.
    fn quota(&self) -> Quota;

    /// The step for `request`, charging `tokens`.
    fn check<B>(&self, request: &Request<B>, tokens: u64, waits: Waits) -> Step;
}

/// One budget for every request: a [`Limiter`], such as a fleet-wide
/// [`HybridLimiter`](crate::HybridLimiter).
#[derive(Debug, Clone)]
pub struct Global<L> {
    limiter: L,
}

impl<L> Global<L> {
    /// Every request spends from `limiter`.
    pub fn new(limiter: L) -> Self {
        Global { limiter }
    }

    /// The limiter.
    pub fn limiter(&self) -> &L {
        &self.limiter
    }
}

impl<L> Gate for Global<L>
where
    L: Limiter + Clone + 'static,
{
    fn quota(&self) -> Quota {
        self.limiter.quota()
    }

    fn check<B>(&self, _request: &Request<B>, tokens: u64, waits: Waits) -> Step {
        step(waits.next(self.limiter.local_answer(tokens)), |first| {
            let limiter = self.limiter.clone();
            Box::pin(async move {
                let lease = || limiter.try_acquire_or_lease(tokens, waits.lease_wait);
                let queue = |queue| limiter.try_acquire_for(tokens, queue);
                waits.settle(first, lease, queue).await
            })
        })
    }
}

/// One budget per key: a [`KeyedLimiter`], such as a
/// [`KeyedHybridLimiter`](crate::KeyedHybridLimiter), keyed by a [`KeyExtractor`].
#[derive(Debug, Clone)]
pub struct Keyed<KL, X> {
    limiter: KL,
    key: X,
}

impl<KL, X> Keyed<KL, X> {
    /// Requests spend the budget of the key `key` extracts, from `limiter`.
    pub fn new(limiter: KL, key: X) -> Self {
        Keyed { limiter, key }
    }

    /// The limiter.
    pub fn limiter(&self) -> &KL {
        &self.limiter
    }
}

impl<KL, X> Gate for Keyed<KL, X>
where
    KL: KeyedLimiter<X::Key> + Clone + 'static,
    X: KeyExtractor,
{
    fn quota(&self) -> Quota {
        self.limiter.quota()
    }

    fn check<B>(&self, request: &Request<B>, tokens: u64, waits: Waits) -> Step {
        let key = match self.key.extract(request) {
            Ok(key) => key,
            Err(e) => return Step::NoKey(e),
        };
        let next = waits.next(self.limiter.local_answer(&*key, tokens));
        step(next, |first| {
            let limiter = self.limiter.clone();
            // The slow path owns its key: the request moves on to the inner service.
            let key: X::Key = Cow::into_owned(key);
            Box::pin(async move {
                let key: &X::Borrowed = key.borrow();
                let lease = || limiter.try_acquire_or_lease(key, tokens, waits.lease_wait);
                let queue = |queue| limiter.try_acquire_for(key, tokens, queue);
                waits.settle(first, lease, queue).await
            })
        })
    }
}

/// The step for what the limiter answered at once; `wait(first)` makes the future of a request
/// that waits (see [`Waits::settle`]).
fn step<F>(next: Next, wait: F) -> Step
where
    F: FnOnce(Option<Decision>) -> BoxFuture<Result<Decision, AcquireError>>,
{
    match next {
        Next::Admit => Step::Admit,
        Next::Fail(e) => Step::Fail(e),
        Next::Shed(retry_after) => Step::Shed { retry_after },
        Next::Wait(first) => Step::Wait(wait(first)),
    }
}
