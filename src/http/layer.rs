//! [`LimitLayer`] and its service [`Limit`]: the tower layer that sheds over-limit HTTP
//! requests.
//!
//! `call` asks the [`Gate`] and either calls the inner service (admitted), answers at once
//! (limited, no key, limiter failure; see [`Rejection`]), or — a request that waits for a
//! lease or a queued token — boxes the wait and the call. The service's error is the inner
//! service's: limits become responses, never errors, so axum takes the layer as it is (no
//! `HandleErrorLayer`).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderValue, Request, Response};
use tower_layer::Layer;
use tower_service::Service;

use super::gate::{BoxFuture, Gate, Global, Keyed, Step, Waits};
use super::headers::{InvalidPolicyName, PolicyHeaders, RATELIMIT_POLICY};
use super::key::KeyExtractor;
use super::rejection::Rejection;
use crate::error::BuildError;
use crate::limiter::layer_tokens;
#[cfg(doc)]
use crate::limiter::DEFAULT_LEASE_WAIT;
use crate::limiter::{Decision, KeyedLimiter, Limiter};

/// The policy name in the `RateLimit` headers unless [`LimitLayer::policy_name`] says
/// otherwise.
pub const DEFAULT_POLICY_NAME: &str = "default";

/// The settings a layer shares with its services.
#[derive(Debug, Clone)]
struct Config {
    tokens: u64,
    waits: Waits,
    headers: PolicyHeaders,
    advertise: bool,
}

impl Config {
    /// The response for `rejection`; a 429 states the policy of the quota `gate` has now.
    fn reject<B: Default>(&self, rejection: Rejection, gate: &impl Gate) -> Response<B> {
        rejection.into_response(&self.headers, || gate.quota())
    }

    /// The `RateLimit-Policy` value for admitted responses, if they carry it.
    fn advertised(&self, gate: &impl Gate) -> Option<HeaderValue> {
        self.advertise.then(|| self.headers.policy(&gate.quota()))
    }
}

/// Rate-limits HTTP requests and sheds the excess with `429 Too Many Requests`, `Retry-After`
/// and the IETF `RateLimit`/`RateLimit-Policy` headers: see the [module docs](super).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// use std::convert::Infallible;
/// use http::{Request, Response, StatusCode};
/// use ratelease::http::{HeaderKey, LimitLayer};
/// use ratelease::{KeyedHybridLimiter, MemoryStore, Quota};
/// use tower::{ServiceBuilder, ServiceExt};
///
/// let limiter = KeyedHybridLimiter::new("api", Quota::per_minute(1)?, MemoryStore::new())?;
/// let key = HeaderKey::new(http::HeaderName::from_static("x-api-key"));
/// let svc = ServiceBuilder::new()
///     .layer(LimitLayer::keyed(limiter, key))
///     .service_fn(|_: Request<()>| async { Ok::<_, Infallible>(Response::new(String::new())) });
/// let request = || Request::get("/").header("x-api-key", "alice").body(()).unwrap();
/// // A new key's first request waits for its lease and is served...
/// assert_eq!(svc.clone().oneshot(request()).await?.status(), StatusCode::OK);
/// // ...the next one is over the limit and shed at once.
/// let limited = svc.oneshot(request()).await?;
/// assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
/// assert_eq!(limited.headers()["retry-after"], "60");
/// assert_eq!(limited.headers()["ratelimit-policy"], "\"default\";q=1;w=60");
/// # Ok(()) }
/// ```
pub struct LimitLayer<G> {
    gate: Arc<G>,
    config: Arc<Config>,
}

impl<G> Clone for LimitLayer<G> {
    fn clone(&self) -> Self {
        LimitLayer {
            gate: self.gate.clone(),
            config: self.config.clone(),
        }
    }
}

impl<G: fmt::Debug> fmt::Debug for LimitLayer<G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LimitLayer")
            .field("gate", &self.gate)
            .field("config", &self.config)
            .finish()
    }
}

impl<L: Limiter + Clone + 'static> LimitLayer<Global<L>> {
    /// One budget for all requests: `limiter`'s (a fleet-wide
    /// [`HybridLimiter`](crate::HybridLimiter), say).
    pub fn global(limiter: L) -> Self {
        LimitLayer::new(Global::new(limiter))
    }
}

impl<KL, X> LimitLayer<Keyed<KL, X>>
where
    KL: KeyedLimiter<X::Key> + Clone + 'static,
    X: KeyExtractor,
{
    /// One budget per key: `limiter`'s budget of the key `key` extracts from each request.
    pub fn keyed(limiter: KL, key: X) -> Self {
        LimitLayer::new(Keyed::new(limiter, key))
    }
}

impl<G: Gate> LimitLayer<G> {
    /// A layer asking `gate`, with the default settings.
    pub fn new(gate: G) -> Self {
        let headers = PolicyHeaders::new(DEFAULT_POLICY_NAME, &gate.quota(), 1)
            .expect("the default policy name is valid");
        LimitLayer {
            gate: Arc::new(gate),
            config: Arc::new(Config {
                tokens: 1,
                waits: Waits::default(),
                headers,
                advertise: false,
            }),
        }
    }

    fn with(mut self, change: impl FnOnce(&mut Config)) -> Self {
        change(Arc::make_mut(&mut self.config));
        self
    }

    /// Charges `tokens` per request instead of one (0 is read as 1); `RateLimit-Policy`
    /// then states the requests the quota allows (its rate over `tokens`).
    ///
    /// # Errors
    /// [`BuildError::Config`] for more than the limiter's burst now: no request could ever be
    /// admitted. (Should a stored config later shrink the burst below it, such requests are
    /// refused.)
    pub fn tokens(self, tokens: u64) -> Result<Self, BuildError> {
        let tokens = layer_tokens(tokens, &self.gate.quota())?;
        Ok(self.with(|c| {
            c.tokens = tokens;
            c.headers = c.headers.with_tokens(tokens);
        }))
    }

    /// How long a request may wait when the limiter has no answer for it yet — a key new to
    /// this process, or tokens given back while idle — for the lease that brings one (default
    /// [`DEFAULT_LEASE_WAIT`]). `Duration::ZERO` refuses such requests at once (with a
    /// `Retry-After` of about one round trip), as a 429 for every new key's first request.
    pub fn lease_wait(self, lease_wait: Duration) -> Self {
        self.with(|c| c.waits.lease_wait = lease_wait)
    }

    /// How long a refused request may wait for the next token instead of being shed (default:
    /// zero, shed at once). Waiting requests hold their connections: a server queueing on an
    /// over-limit key serves at the limit's pace.
    pub fn queue(self, queue: Duration) -> Self {
        self.with(|c| c.waits.queue = queue)
    }

    /// Names the policy in the `RateLimit` and `RateLimit-Policy` headers (default
    /// [`DEFAULT_POLICY_NAME`]).
    ///
    /// # Errors
    /// [`InvalidPolicyName`] unless `name` is 1 to 64 of letters, digits and `-_.:/`.
    pub fn policy_name(self, name: &str) -> Result<Self, InvalidPolicyName> {
        let headers = PolicyHeaders::new(name, &self.gate.quota(), self.config.tokens)?;
        Ok(self.with(|c| c.headers = headers))
    }

    /// Whether admitted responses carry `RateLimit-Policy` too (default: only 429s do). The
    /// field is a list: this layer adds its policy to those already on the response, so a
    /// 429 from a layer inside it keeps its own (stacked layers need distinct
    /// [`policy_name`](Self::policy_name)s for a client to tell them apart). It
    /// costs an admitted request the header's insertion (two allocations when the inner
    /// service's response has no headers yet) and a read of the limiter's quota (a short lock
    /// for a plain hybrid or pure limiter, and the value formatted anew while a stored config
    /// differs from the quota the layer was built with); the default path allocates nothing
    /// (`tests/http_alloc.rs`).
    pub fn advertise_policy(self, advertise: bool) -> Self {
        self.with(|c| c.advertise = advertise)
    }

    /// The gate (and through it, the limiter).
    pub fn gate(&self) -> &G {
        &self.gate
    }
}

impl<S, G> Layer<S> for LimitLayer<G> {
    type Service = Limit<S, G>;

    fn layer(&self, inner: S) -> Limit<S, G> {
        Limit {
            inner,
            gate: self.gate.clone(),
            config: self.config.clone(),
        }
    }
}

/// The service of [`LimitLayer`].
pub struct Limit<S, G> {
    inner: S,
    gate: Arc<G>,
    config: Arc<Config>,
}

impl<S: Clone, G> Clone for Limit<S, G> {
    fn clone(&self) -> Self {
        Limit {
            inner: self.inner.clone(),
            gate: self.gate.clone(),
            config: self.config.clone(),
        }
    }
}

impl<S: fmt::Debug, G: fmt::Debug> fmt::Debug for Limit<S, G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limit")
            .field("inner", &self.inner)
            .field("gate", &self.gate)
            .field("config", &self.config)
            .finish()
    }
}

impl<S, G, B, RB> Service<Request<B>> for Limit<S, G>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    G: Gate,
    B: Send + 'static,
    RB: Default + Send + 'static,
{
    type Response = Response<RB>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, RB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let c = &*self.config;
        let rejection = match self.gate.check(&request, c.tokens, c.waits) {
            Step::Admit => {
                let advertised = c.advertised(&*self.gate);
                return ResponseFuture::inner(self.inner.call(request), advertised);
            }
            Step::Shed { retry_after } => Rejection::Limited { retry_after },
            Step::NoKey(e) => Rejection::NoKey(e),
            Step::Fail(e) => Rejection::Unavailable(e),
            Step::Wait(decision) => return self.wait(decision, request),
        };
        ResponseFuture::ready(c.reject(rejection, &*self.gate))
    }
}

impl<S, G: Gate> Limit<S, G> {
    /// The response future of a request that waits for its `decision`.
    fn wait<B, RB>(
        &mut self,
        decision: BoxFuture<Result<Decision, crate::AcquireError>>,
        request: Request<B>,
    ) -> ResponseFuture<S::Future, RB, S::Error>
    where
        S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
        B: Send + 'static,
        RB: Default + Send + 'static,
    {
        // The inner service that was polled ready goes into the future (it is the one allowed
        // to be called); a clone takes its place, to be polled ready before the next call.
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let (config, gate) = (self.config.clone(), self.gate.clone());
        ResponseFuture::boxed(Box::pin(async move {
            match decision.await {
                Ok(Decision::Allowed) => {
                    let mut response = inner.call(request).await?;
                    if let Some(policy) = config.advertised(&*gate) {
                        response.headers_mut().append(RATELIMIT_POLICY, policy);
                    }
                    Ok(response)
                }
                Ok(Decision::Denied { retry_after }) => {
                    Ok(config.reject(Rejection::Limited { retry_after }, &*gate))
                }
                Err(e) => Ok(config.reject(Rejection::Unavailable(e), &*gate)),
            }
        }))
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`Limit`]: the inner service's, a rejection, or (a request that
    /// waited) a boxed wait-then-call.
    pub struct ResponseFuture<F, RB, E> {
        #[pin]
        kind: Kind<F, RB, E>,
    }
}

pin_project_lite::pin_project! {
    #[project = KindProj]
    enum Kind<F, RB, E> {
        Inner { #[pin] future: F, policy: Option<HeaderValue> },
        Ready { response: Option<Response<RB>> },
        Boxed { future: BoxFuture<Result<Response<RB>, E>> },
    }
}

impl<F, RB, E> ResponseFuture<F, RB, E> {
    fn inner(future: F, policy: Option<HeaderValue>) -> Self {
        ResponseFuture {
            kind: Kind::Inner { future, policy },
        }
    }

    fn ready(response: Response<RB>) -> Self {
        ResponseFuture {
            kind: Kind::Ready {
                response: Some(response),
            },
        }
    }

    fn boxed(future: BoxFuture<Result<Response<RB>, E>>) -> Self {
        ResponseFuture {
            kind: Kind::Boxed { future },
        }
    }
}

impl<F, RB, E> Future for ResponseFuture<F, RB, E>
where
    F: Future<Output = Result<Response<RB>, E>>,
    RB: Default,
{
    type Output = Result<Response<RB>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Inner { future, policy } => {
                let mut response = std::task::ready!(future.poll(cx))?;
                if let Some(policy) = policy.take() {
                    response.headers_mut().append(RATELIMIT_POLICY, policy);
                }
                Poll::Ready(Ok(response))
            }
            // Polled again after completion (a contract breach by the caller): an empty
            // response rather than a panic.
            KindProj::Ready { response } => Poll::Ready(Ok(response.take().unwrap_or_default())),
            KindProj::Boxed { future } => future.as_mut().poll(cx),
        }
    }
}

impl<F, RB, E> fmt::Debug for ResponseFuture<F, RB, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
