//! [`Rejection`]: why the layer answered a request itself, and the response it sends.
//!
//! | rejection | status | headers |
//! | --- | --- | --- |
//! | [`Limited`](Rejection::Limited) | 429 Too Many Requests | `Retry-After`, `RateLimit`, `RateLimit-Policy` |
//! | [`NoKey`](Rejection::NoKey) | [`KeyError::status`] (400, 500 for a server without peer addresses, a `KeyFn`'s own) | |
//! | [`Unavailable`](Rejection::Unavailable) | 503 Service Unavailable (500 for a request the quota can never admit) | `Retry-After: 1` on a 503 |
//!
//! The body is empty (`Default` of the inner service's body type), so the layer works with
//! any HTTP stack's body. The `Rejection` itself rides along in the response's extensions:
//! a later layer (axum's `map_response`, say) can read it and write a body of its own. Add
//! that layer *after* the `LimitLayer` (so it wraps it) to see the limiter's refusals:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use axum::body::Body;
//! use axum::http::{Request, Response, StatusCode};
//! use axum::middleware::map_response;
//! use axum::routing::get;
//! use axum::Router;
//! use ratelease::http::{LimitLayer, Rejection};
//! use ratelease::{HybridLimiter, MemoryStore, Quota};
//! use tower::ServiceExt;
//!
//! /// A body that says why the request was refused (the client sees only this).
//! async fn explain(mut response: Response<Body>) -> Response<Body> {
//!     let text = match response.extensions().get::<Rejection>() {
//!         Some(Rejection::Limited { retry_after }) => {
//!             format!("rate limited: retry in {} ms\n", retry_after.as_millis())
//!         }
//!         Some(Rejection::NoKey(_)) => "missing API key\n".to_owned(),
//!         Some(_) => "try again later\n".to_owned(),
//!         None => return response, // not refused: the handler's own response
//!     };
//!     *response.body_mut() = Body::from(text);
//!     response
//! }
//!
//! let limiter = HybridLimiter::new("api", Quota::per_minute(1)?, MemoryStore::new())?;
//! limiter.ready().await?;
//! let app = Router::new()
//!     .route("/", get(|| async { "hello\n" }))
//!     .layer(LimitLayer::global(limiter))
//!     .layer(map_response(explain));
//! let ok = app.clone().oneshot(Request::new(Body::empty())).await?;
//! assert_eq!(ok.status(), StatusCode::OK);
//! let refused = app.oneshot(Request::new(Body::empty())).await?;
//! assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
//! let body = axum::body::to_bytes(refused.into_body(), 1 << 10).await?;
//! assert!(body.starts_with(b"rate limited: retry in"));
//! # Ok(()) }
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use http::header::RETRY_AFTER;
use http::{HeaderValue, Response, StatusCode};

use super::headers::{retry_after_secs, PolicyHeaders, RATELIMIT, RATELIMIT_POLICY};
use super::key::KeyError;
use crate::error::AcquireError;
use crate::quota::Quota;
use crate::retry::ERROR_BACKOFF_MAX;
use crate::time::Origin;

/// Why the layer answered a request instead of the inner service; found in the response's
/// extensions, so a later layer can write a body of its own (the layer's is empty).
///
/// | rejection | status | headers |
/// | --- | --- | --- |
/// | [`Limited`](Rejection::Limited) | 429 Too Many Requests | `Retry-After`, `RateLimit`, `RateLimit-Policy` |
/// | [`NoKey`](Rejection::NoKey) | [`KeyError::status`]: 400, 500 for a server without peer addresses, a [`KeyFn`](super::KeyFn)'s own | |
/// | [`Unavailable`](Rejection::Unavailable) | 503 Service Unavailable; 500 for a request the quota can never admit | `Retry-After: 1` on a 503 |
///
/// `Retry-After` is in whole seconds, rounded up (at least 1): a 429's from the limiter's
/// estimate, a 503's the circuit's longest back-off (500 ms: 1). `RateLimit` is
/// `"<policy>";r=0;t=<Retry-After>`; `RateLimit-Policy` is `"<policy>";q=<rate>;w=<period in
/// seconds>` (a quota whose period is not whole seconds is stated in lowest terms: one
/// request per 1.5 s is `q=2;w=3`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Rejection {
    /// Over the limit; a retry could succeed after about `retry_after`.
    Limited {
        /// The limiter's estimate.
        retry_after: Duration,
    },
    /// The request carried no usable key.
    NoKey(KeyError),
    /// The limiter could not decide: a store failure that no failure policy answers (a
    /// pure limiter's without one, a hybrid limiter's under
    /// [`FailurePolicy::FailClosed`](crate::FailurePolicy)), a closed limiter, a name refused
    /// under [`Unconfigured::Error`](crate::Unconfigured::Error), or a request for more tokens
    /// than the quota's burst.
    Unavailable(AcquireError),
}

impl Rejection {
    /// The response's status.
    pub fn status(&self) -> StatusCode {
        match self {
            Rejection::Limited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Rejection::NoKey(e) => e.status(),
            // The layer's `tokens` exceed the burst: every request would fail; a setup error.
            Rejection::Unavailable(
                AcquireError::ExceedsBurst { .. } | AcquireError::ZeroTokens,
            ) => StatusCode::INTERNAL_SERVER_ERROR,
            Rejection::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The response for this rejection, with `headers`' policy for a 429 (under the quota
    /// `quota()` reads).
    pub(crate) fn into_response<B: Default>(
        self,
        headers: &PolicyHeaders,
        quota: impl FnOnce() -> Quota,
    ) -> Response<B> {
        let mut response = Response::new(B::default());
        *response.status_mut() = self.status();
        match &self {
            Rejection::Limited { retry_after } => {
                let h = response.headers_mut();
                h.insert(
                    RETRY_AFTER,
                    HeaderValue::from(retry_after_secs(*retry_after)),
                );
                h.insert(RATELIMIT, headers.exhausted(*retry_after));
                h.insert(RATELIMIT_POLICY, headers.policy(&quota()));
            }
            // The details are for the operator, not for the client: a warning at most once a
            // second, with the count of those it stands for (an outage refuses every request).
            Rejection::NoKey(KeyError::NoPeerAddr) => {
                if let Some(refused) = NO_PEER.due() {
                    tracing::warn!(refused, "rate limit: {}", KeyError::NoPeerAddr);
                }
            }
            Rejection::NoKey(_) => {}
            Rejection::Unavailable(error) => {
                // A 503 says when to come back. The rejection holds the error alone, not the
                // circuit's back-off, but that is at most `ERROR_BACKOFF_MAX`: in whole
                // seconds, rounded up, the same 1 whatever the back-off. A 500 (a request the
                // quota can never admit) has none: a retry would fail alike.
                if self.status() == StatusCode::SERVICE_UNAVAILABLE {
                    let secs = retry_after_secs(ERROR_BACKOFF_MAX);
                    response
                        .headers_mut()
                        .insert(RETRY_AFTER, HeaderValue::from(secs));
                }
                if let Some(refused) = UNAVAILABLE.due() {
                    // Without the Redis key: a keyed limiter's holds the request's key (an API
                    // key, a client's address), which is no log's business.
                    let error = error.without_key();
                    tracing::warn!(%error, refused, "rate limiter unavailable; requests refused");
                }
            }
        }
        response.extensions_mut().insert(self);
        response
    }
}

/// A warning logged at most once a second (per process, per kind), counting the events it
/// stands for: a store outage refuses every request, and a line for each one buried the log
/// (48 000 lines in 2 s behind a pure limiter).
struct Throttled {
    /// When it was last logged, ms after [`origin`] (0: never).
    last_ms: AtomicU64,
    /// Events since then, this one included.
    events: AtomicU64,
}

static NO_PEER: Throttled = Throttled::new();
static UNAVAILABLE: Throttled = Throttled::new();

/// The process's first use of a throttled warning: the clock `Throttled` reads.
fn origin() -> Origin {
    static ORIGIN: OnceLock<Origin> = OnceLock::new();
    *ORIGIN.get_or_init(Origin::now)
}

impl Throttled {
    const fn new() -> Self {
        Throttled {
            last_ms: AtomicU64::new(0),
            events: AtomicU64::new(0),
        }
    }

    /// Counts one event; if the last warning is a second old (or there was none), returns
    /// the events it should report, this one included, and starts over.
    fn due(&self) -> Option<u64> {
        // +1 so that 0 stays "never" at the process's first millisecond.
        self.due_at(origin().elapsed_ns() / 1_000_000 + 1)
    }

    /// [`due`](Self::due) at `now` (ms after [`origin`], plus one).
    fn due_at(&self, now: u64) -> Option<u64> {
        // Relaxed throughout: a count for a log line; of two callers racing past the same
        // second, the compare-exchange lets one log.
        self.events.fetch_add(1, Ordering::Relaxed);
        let last = self.last_ms.load(Ordering::Relaxed);
        if last != 0 && now < last.saturating_add(1_000) {
            return None;
        }
        self.last_ms
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .ok()?;
        Some(self.events.swap(0, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_throttled_warning_is_due_once_a_second_with_the_events_it_stands_for() {
        let t = Throttled::new();
        assert_eq!(t.due_at(1), Some(1), "the first is logged");
        for ms in 1..100 {
            assert_eq!(t.due_at(ms * 10), None);
        }
        // A second later: due, standing for the 99 skipped and this one.
        assert_eq!(t.due_at(1_001), Some(100));
        assert_eq!(t.due_at(1_500), None);
        assert_eq!(t.due_at(2_001), Some(2));
    }
}
