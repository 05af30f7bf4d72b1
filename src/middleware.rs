//! Tower middleware (crate feature `tower`): rate-limit any `tower::Service` with a ratelease
//! limiter.
//!
//! # Design
//!
//! Two ways to be limited, as tower and HTTP services expect:
//!
//! - **Back-pressure** — [`RateLimitLayer`] over any [`Limiter`]: the wait happens in
//!   `poll_ready`, which does not return ready until the limiter granted the request's tokens;
//!   `call` spends that permit. Callers that drive readiness (a `Buffer`, a client pool, a
//!   queue consumer) slow down to the limit instead of failing. A clone starts without a
//!   permit (`Clone` is written by hand), so permits are never duplicated. With a
//!   [`HybridLimiter`](crate::HybridLimiter) an admitted request costs the synchronous check
//!   ([`Limiter::local_answer`]) and nothing else: no allocation, no await; only a request
//!   that must wait boxes the limiter's `acquire` future. The same holds for a keyed limiter
//!   that answers synchronously ([`KeyedLimiter::local_answer`]); one that must await (a
//!   store call per decision) boxes the decision and the call.
//! - **Shedding** — [`KeyedRateLimitLayer`] over a [`KeyedLimiter`], keyed by a user-supplied
//!   extractor (API key, user, client address): the key is only known from the request, so the
//!   decision is made in `call`. Two waits are told apart, each with its own setting: a key
//!   this process has no answer for yet (a new user: a
//!   [`KeyedHybridLimiter`](crate::KeyedHybridLimiter) holds no tokens for it until its first
//!   lease, one round trip away) waits up to [`lease_wait`](KeyedRateLimitLayer::lease_wait)
//!   (default [`DEFAULT_LEASE_WAIT`]) — that is not the limit speaking; a key the store refused
//!   waits for its next token only up to [`queue`](KeyedRateLimitLayer::queue) (default: not
//!   at all). Any other request fails at once with a [`Limited`] error that carries the retry
//!   hint.
//!
//! For HTTP servers, [`crate::http`] (feature `http`) is the ready-made form of the shedding
//! layer: refusals are `429` responses with `Retry-After` and `RateLimit` headers instead of
//! errors, with key extractors and a global variant.
//!
//! Both services' error type is [`BoxError`], as tower's own middleware: the inner service's
//! error, a limiter error (the decision's [`AcquireError`], boxed as the umbrella [`Error`],
//! so a `downcast::<ratelease::Error>()` finds it: a store failure under
//! [`FailurePolicy::FailClosed`](crate::FailurePolicy), an unconfigured name …), or
//! [`Limited`]. Being limited is still not a limiter error: [`Limited`] exists only because a
//! shed request must end somehow.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use sync_wrapper::SyncWrapper;
use tower_layer::Layer;
use tower_service::Service;

use crate::error::{AcquireError, BuildError, Error};
pub use crate::limiter::DEFAULT_LEASE_WAIT;
use crate::limiter::{
    layer_tokens, Decision, KeyRef, KeyedLimiter, Limiter, LocalAnswer, Next, Waits,
};

/// The old name of [`DEFAULT_LEASE_WAIT`], the default of the one wait
/// [`KeyedRateLimitLayer::max_wait`] set.
#[deprecated(
    note = "use DEFAULT_LEASE_WAIT: `max_wait` became `lease_wait` (a key's first lease) and \
            `queue` (the next token of a refused key, off by default)"
)]
pub const DEFAULT_MAX_WAIT: Duration = DEFAULT_LEASE_WAIT;

/// The error type of the services here, as in tower.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request was refused by a keyed limiter; try again after [`retry_after`](Self::retry_after).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited {
    retry_after: Duration,
}

impl Limited {
    /// How long until the request could succeed (an estimate, as
    /// [`Decision::Denied`]'s).
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }

    /// `retry_after` in whole seconds, rounded up, for an HTTP `Retry-After` header (which
    /// has second resolution; 0 would invite an immediate retry).
    pub fn retry_after_secs(&self) -> u64 {
        let d = self.retry_after;
        (d.as_secs() + u64::from(d.subsec_nanos() > 0)).max(1)
    }
}

impl fmt::Display for Limited {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rate limited; retry after {:?}", self.retry_after)
    }
}

impl std::error::Error for Limited {}

/// A limiter's error as the services return it: boxed as the umbrella [`Error`] (what
/// `downcast` finds), not as the decision's [`AcquireError`].
fn boxed(e: AcquireError) -> BoxError {
    Error::from(e).into()
}

/// Applies back-pressure with a [`Limiter`]: see the [module docs](self).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), ratelease::middleware::BoxError> {
/// use ratelease::middleware::RateLimitLayer;
/// use ratelease::{HybridLimiter, MemoryStore, Quota};
/// use tower::{Service, ServiceBuilder, ServiceExt};
///
/// let limiter = HybridLimiter::new("backend", Quota::per_second(100)?, MemoryStore::new())?;
/// let mut svc = ServiceBuilder::new()
///     .layer(RateLimitLayer::new(limiter))
///     .service_fn(|x: u32| async move { Ok::<_, std::convert::Infallible>(x * 2) });
/// assert_eq!(svc.ready().await?.call(21).await?, 42); // waited for a permit, then called
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RateLimitLayer<L> {
    limiter: L,
    tokens: u64,
}

impl<L> RateLimitLayer<L> {
    /// One token per request from `limiter`.
    pub fn new(limiter: L) -> Self {
        RateLimitLayer { limiter, tokens: 1 }
    }

    /// Charges `tokens` per request instead of one (0 is read as 1).
    ///
    /// # Errors
    /// [`BuildError::Config`] for more than the limiter's burst now: no request could ever be
    /// admitted.
    pub fn tokens(mut self, tokens: u64) -> Result<Self, BuildError>
    where
        L: Limiter,
    {
        self.tokens = layer_tokens(tokens, &self.limiter.quota())?;
        Ok(self)
    }
}

impl<S, L: Clone> Layer<S> for RateLimitLayer<L> {
    type Service = RateLimit<S, L>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            limiter: self.limiter.clone(),
            tokens: self.tokens,
            state: State::Idle,
        }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

pin_project_lite::pin_project! {
    /// The response future of both services: the inner service's future, an immediate
    /// error, or (a keyed limiter that must await) a boxed decision-then-call.
    #[project = Proj]
    pub struct ResponseFuture<F, T> {
        #[pin]
        kind: Kind<F, T>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<F, T> {
        Inner { #[pin] future: F },
        Failed { error: Option<BoxError> },
        Boxed { future: BoxFuture<Result<T, BoxError>> },
    }
}

impl<F, T> ResponseFuture<F, T> {
    fn inner(future: F) -> Self {
        ResponseFuture {
            kind: Kind::Inner { future },
        }
    }

    fn failed(error: impl Into<BoxError>) -> Self {
        ResponseFuture {
            kind: Kind::Failed {
                error: Some(error.into()),
            },
        }
    }

    fn boxed(future: BoxFuture<Result<T, BoxError>>) -> Self {
        ResponseFuture {
            kind: Kind::Boxed { future },
        }
    }
}

impl<F, T, E> Future for ResponseFuture<F, T>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Inner { future } => future.poll(cx).map_err(Into::into),
            KindProj::Failed { error } => Poll::Ready(Err(error
                .take()
                .unwrap_or_else(|| "response future polled after completion".into()))),
            KindProj::Boxed { future } => future.as_mut().poll(cx),
        }
    }
}

impl<F, T> fmt::Debug for ResponseFuture<F, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

/// Where a [`RateLimit`] is between requests.
enum State {
    /// No permit, no wait in progress.
    Idle,
    /// Waiting for the limiter. `SyncWrapper`: only ever polled through `&mut self`, so the
    /// service is `Sync` (as axum requires) whether or not the limiter's future is.
    Waiting(SyncWrapper<BoxFuture<Result<(), AcquireError>>>),
    /// Holding a permit for the next `call`.
    Permitted,
}

/// The service of [`RateLimitLayer`].
pub struct RateLimit<S, L> {
    inner: S,
    limiter: L,
    tokens: u64,
    state: State,
}

impl<S: Clone, L: Clone> Clone for RateLimit<S, L> {
    /// A clone starts without a permit: permits are never duplicated.
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            limiter: self.limiter.clone(),
            tokens: self.tokens,
            state: State::Idle,
        }
    }
}

impl<S: fmt::Debug, L: fmt::Debug> fmt::Debug for RateLimit<S, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Idle => "idle",
            State::Waiting(_) => "waiting",
            State::Permitted => "permitted",
        };
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("limiter", &self.limiter)
            .field("tokens", &self.tokens)
            .field("state", &state)
            .finish()
    }
}

impl<S, L, Req> Service<Req> for RateLimit<S, L>
where
    S: Service<Req>,
    S::Error: Into<BoxError>,
    L: Limiter + Clone + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, S::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        loop {
            match &mut self.state {
                State::Permitted => return self.inner.poll_ready(cx).map_err(Into::into),
                State::Idle => match self.limiter.local_answer(self.tokens) {
                    Some(Ok(LocalAnswer::Allowed)) => self.state = State::Permitted,
                    Some(Err(e)) => return Poll::Ready(Err(boxed(e))),
                    // Denied (by the store or for want of a lease), or a limiter that must
                    // await: wait for a grant.
                    Some(Ok(LocalAnswer::Denied { .. } | LocalAnswer::NeedsLease { .. }))
                    | None => {
                        let (limiter, n) = (self.limiter.clone(), self.tokens);
                        self.state = State::Waiting(SyncWrapper::new(Box::pin(async move {
                            limiter.acquire(n).await
                        })));
                    }
                },
                State::Waiting(wait) => match wait.get_mut().as_mut().poll(cx) {
                    Poll::Ready(Ok(())) => self.state = State::Permitted,
                    Poll::Ready(Err(e)) => {
                        self.state = State::Idle;
                        return Poll::Ready(Err(boxed(e)));
                    }
                    Poll::Pending => return Poll::Pending,
                },
            }
        }
    }

    fn call(&mut self, req: Req) -> Self::Future {
        if !matches!(
            std::mem::replace(&mut self.state, State::Idle),
            State::Permitted
        ) {
            // Called without a successful poll_ready: refuse rather than admit unlimited.
            return ResponseFuture::failed(NotReady);
        }
        ResponseFuture::inner(self.inner.call(req))
    }
}

/// `call` without a successful `poll_ready` first (a misuse of the `Service` contract).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotReady;

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("service called before poll_ready granted a permit")
    }
}

impl std::error::Error for NotReady {}

/// Sheds requests over a [`KeyedLimiter`], keyed by an extractor: see the
/// [module docs](self).
pub struct KeyedRateLimitLayer<KL, F> {
    limiter: KL,
    key: Arc<F>,
    tokens: u64,
    waits: Waits,
}

impl<KL: Clone, F> Clone for KeyedRateLimitLayer<KL, F> {
    fn clone(&self) -> Self {
        KeyedRateLimitLayer {
            limiter: self.limiter.clone(),
            key: self.key.clone(),
            tokens: self.tokens,
            waits: self.waits,
        }
    }
}

impl<KL: fmt::Debug, F> fmt::Debug for KeyedRateLimitLayer<KL, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedRateLimitLayer")
            .field("limiter", &self.limiter)
            .field("tokens", &self.tokens)
            .field("waits", &self.waits)
            .finish_non_exhaustive()
    }
}

impl<KL, F> KeyedRateLimitLayer<KL, F> {
    /// One token per request from `limiter`, from the budget of the key `key(&request)`.
    pub fn new(limiter: KL, key: F) -> Self {
        KeyedRateLimitLayer {
            limiter,
            key: Arc::new(key),
            tokens: 1,
            waits: Waits::default(),
        }
    }

    /// Charges `tokens` per request instead of one (0 is read as 1). Not checked against
    /// the burst here, as [`RateLimitLayer::tokens`] is (the key type is known only where the
    /// layer serves): more than the burst fails every request with
    /// [`AcquireError::ExceedsBurst`].
    pub fn tokens(mut self, tokens: u64) -> Self {
        self.tokens = tokens.max(1);
        self
    }

    /// How long a request may wait for the lease of a key the limiter has no answer for yet
    /// (a new key's first request; default [`DEFAULT_LEASE_WAIT`]). `Duration::ZERO` refuses
    /// such requests, with a hint of about one round trip — shed at once unless
    /// [`queue`](Self::queue) is at least that hint, which queues them for the lease as it
    /// queues any refusal it covers.
    pub fn lease_wait(mut self, lease_wait: Duration) -> Self {
        self.waits.lease_wait = lease_wait;
        self
    }

    /// How long a refused request may wait for its key's next token instead of being shed
    /// (default: zero, shed at once). Waiting requests pile up on an over-limit key.
    pub fn queue(mut self, queue: Duration) -> Self {
        self.waits.queue = queue;
        self
    }

    /// The old single wait, for a new key's lease and for a refused key's next token alike:
    /// [`lease_wait(max_wait)`](Self::lease_wait) and [`queue(max_wait)`](Self::queue). Queueing
    /// on an over-limit key makes a server serve at the limit's pace; set `lease_wait` alone
    /// to shed such requests.
    #[deprecated(
        note = "use `lease_wait` (a key's first lease) and `queue` (the next token of a \
                refused key): `.max_wait(d)` is `.lease_wait(d).queue(d)`"
    )]
    pub fn max_wait(self, max_wait: Duration) -> Self {
        self.lease_wait(max_wait).queue(max_wait)
    }
}

impl<S, KL: Clone, F> Layer<S> for KeyedRateLimitLayer<KL, F> {
    type Service = KeyedRateLimit<S, KL, F>;

    fn layer(&self, inner: S) -> Self::Service {
        KeyedRateLimit {
            inner,
            limiter: self.limiter.clone(),
            key: self.key.clone(),
            tokens: self.tokens,
            waits: self.waits,
        }
    }
}

/// The service of [`KeyedRateLimitLayer`].
pub struct KeyedRateLimit<S, KL, F> {
    inner: S,
    limiter: KL,
    key: Arc<F>,
    tokens: u64,
    waits: Waits,
}

impl<S: Clone, KL: Clone, F> Clone for KeyedRateLimit<S, KL, F> {
    fn clone(&self) -> Self {
        KeyedRateLimit {
            inner: self.inner.clone(),
            limiter: self.limiter.clone(),
            key: self.key.clone(),
            tokens: self.tokens,
            waits: self.waits,
        }
    }
}

impl<S: fmt::Debug, KL: fmt::Debug, F> fmt::Debug for KeyedRateLimit<S, KL, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedRateLimit")
            .field("inner", &self.inner)
            .field("limiter", &self.limiter)
            .field("tokens", &self.tokens)
            .field("waits", &self.waits)
            .finish_non_exhaustive()
    }
}

impl<S, KL, F, K, Req> Service<Req> for KeyedRateLimit<S, KL, F>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    Req: Send + 'static,
    KL: KeyedLimiter<K> + Clone + 'static,
    F: Fn(&Req) -> K,
    K: KeyRef<K> + Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, S::Response>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let key = (self.key)(&req);
        let (tokens, waits) = (self.tokens, self.waits);
        let first = match waits.next(self.limiter.local_answer(&key, tokens)) {
            Next::Admit => return ResponseFuture::inner(self.inner.call(req)),
            Next::Fail(e) => return ResponseFuture::failed(boxed(e)),
            Next::Shed(retry_after) => return ResponseFuture::failed(Limited { retry_after }),
            Next::Wait(first) => first,
        };
        // Decide inside the response future. The inner service that was polled ready goes
        // into it (it is the one allowed to be called); a clone takes its place here, to be
        // polled ready before the next call.
        let limiter = self.limiter.clone();
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        ResponseFuture::boxed(Box::pin(async move {
            let lease = || limiter.try_acquire_or_lease(&key, tokens, waits.lease_wait);
            let queue = |queue| limiter.try_acquire_for(&key, tokens, queue);
            match waits.settle(first, lease, queue).await.map_err(boxed)? {
                Decision::Allowed => inner.call(req).await.map_err(Into::into),
                Decision::Denied { retry_after } => Err(Limited { retry_after }.into()),
            }
        }))
    }
}
