//! [`Rejection`]: why the layer answered a request itself, and the response it sends.
//!
//! | rejection | status | headers |
//! | --- | --- | --- |
//! | [`Limited`](Rejection::Limited) | 429 Too Many Requests | `Retry-After`, `RateLimit`, `RateLimit-Policy` |
//! | [`NoKey`](Rejection::NoKey) | [`KeyError::status`] (400, 500 for a server without peer addresses, a `KeyFn`'s own) | |
//! | [`Unavailable`](Rejection::Unavailable) | 503 Service Unavailable (500 for a request the quota can never admit) | |
//!
//! The body is empty (`Default` of the inner service's body type), so the layer works with
//! any HTTP stack's body. The `Rejection` itself rides along in the response's extensions:
//! a later layer (axum's `map_response`, say) can read it and write a body of its own.

use std::time::Duration;

use http::header::RETRY_AFTER;
use http::{HeaderValue, Response, StatusCode};

use super::headers::{retry_after_secs, PolicyHeaders, RATELIMIT, RATELIMIT_POLICY};
use super::key::KeyError;
use crate::error::AcquireError;

/// Why the layer answered a request instead of the inner service; found in the response's
/// extensions, so a later layer can write a body of its own (the layer's is empty).
///
/// | rejection | status | headers |
/// | --- | --- | --- |
/// | [`Limited`](Rejection::Limited) | 429 Too Many Requests | `Retry-After`, `RateLimit`, `RateLimit-Policy` |
/// | [`NoKey`](Rejection::NoKey) | [`KeyError::status`]: 400, 500 for a server without peer addresses, a [`KeyFn`](super::KeyFn)'s own | |
/// | [`Unavailable`](Rejection::Unavailable) | 503 Service Unavailable; 500 for a request the quota can never admit | |
///
/// `Retry-After` is in whole seconds, rounded up (at least 1). `RateLimit` is
/// `"<policy>";r=0;t=<Retry-After>`; `RateLimit-Policy` is `"<policy>";q=<rate>;w=<period in
/// seconds>` (a quota whose period is not whole seconds is stated per second).
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

    /// The response for this rejection, with `headers`' policy for a 429.
    pub(crate) fn into_response<B: Default>(self, headers: &PolicyHeaders) -> Response<B> {
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
                h.insert(RATELIMIT_POLICY, headers.policy());
            }
            // The details are for the operator, not for the client.
            Rejection::NoKey(KeyError::NoPeerAddr) => {
                tracing::warn!("rate limit: {}", KeyError::NoPeerAddr);
            }
            Rejection::NoKey(_) => {}
            Rejection::Unavailable(error) => {
                tracing::warn!(%error, "rate limiter unavailable; request refused");
            }
        }
        response.extensions_mut().insert(self);
        response
    }
}
