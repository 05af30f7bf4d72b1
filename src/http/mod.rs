//! HTTP rate limiting for any tower stack (crate feature `http`): a layer that sheds
//! over-limit requests with `429 Too Many Requests`, `Retry-After` and the IETF
//! `RateLimit`/`RateLimit-Policy` headers, for a global limit or one per key.
//!
//! ```text
//! Router::new().route("/", get(handler))
//!     .layer(LimitLayer::keyed(limiter, PeerIp::new()))   // or ::global(limiter)
//! ```
//!
//! # Design
//!
//! **Shed, don't queue.** A server that makes over-limit requests wait holds their
//! connections and ends up serving at the limit's pace; a server that refuses them at once
//! stays fast and lets clients back off (`Retry-After`). So the layer decides in `call`,
//! synchronously whenever the limiter can (a [`HybridLimiter`](crate::HybridLimiter) or
//! [`KeyedHybridLimiter`](crate::KeyedHybridLimiter) always can): an admitted request costs the
//! local check and nothing else — no allocation, no await — and a refused one one response.
//!
//! **Two waits, two settings.** A hybrid limiter also denies when it simply has no answer yet:
//! a key new to this process holds no tokens until its first lease comes back, one store
//! round trip later. That is not the limit speaking, so the layer waits for that lease
//! ([`lease_wait`](LimitLayer::lease_wait), on by default, [`DEFAULT_LEASE_WAIT`]) and
//! never for the next token of a key the store said is spent ([`queue`](LimitLayer::queue),
//! off by default). The limiter tells the two apart ([`LocalAnswer`](crate::LocalAnswer));
//! see [`gate`] for how the layer uses it.
//!
//! **Keys.** A [`KeyExtractor`] names the budget: [`PeerIp`] (the TCP peer, from a
//! `SocketAddr` in the request extensions or, with feature `axum`, axum's `ConnectInfo`),
//! [`ForwardedIp`] (the client behind [`TrustedProxies`], from `X-Forwarded-For` or
//! `Forwarded`, read from the right), [`HeaderKey`] (an API key), [`KeyFn`] (a closure over
//! the request's head); [`LimitLayer::global`] needs none. Keys are borrowed from the request
//! on the fast path where they can be.
//!
//! **Responses, not errors.** Every refusal is a response (see [`Rejection`]), so the
//! service's error type is the inner service's and axum takes the layer without a
//! `HandleErrorLayer`. The layer depends on the `http` crate and tower's traits only, not on
//! a framework; the 429's body is the body type's `Default` (empty).
//!
//! The older [`middleware`](crate::middleware) module (feature `tower`) remains for non-HTTP
//! services: back-pressure through `poll_ready`, and keyed shedding through errors.

mod forwarded;
pub mod gate;
mod headers;
mod key;
mod key_fn;
mod layer;
mod rejection;
mod trusted;

pub use crate::limiter::DEFAULT_LEASE_WAIT;
pub use forwarded::{ForwardedHeader, ForwardedIp};
pub use gate::{Gate, Global, Keyed, Step, Waits};
pub use headers::{
    retry_after_secs, InvalidPolicyName, MAX_POLICY_NAME, RATELIMIT, RATELIMIT_POLICY,
};
pub use key::{HeaderKey, KeyError, KeyExtractor, PeerIp, DEFAULT_MAX_HEADER_KEY};
pub use key_fn::{KeyFn, RequestHead};
pub use layer::{Limit, LimitLayer, ResponseFuture, DEFAULT_POLICY_NAME};
pub use rejection::Rejection;
pub use trusted::{InvalidProxy, IpRange, TrustedProxies};
