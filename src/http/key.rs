//! Key extractors: which budget a request spends.
//!
//! A [`KeyExtractor`] reads a request and names the key of a keyed limiter. It returns the key
//! in its borrowed form where it can (a header's `&str` for `String` keys), so an admitted
//! request allocates nothing for its key; the key is copied out only when the request has to
//! wait. A request without a usable key is a typed [`KeyError`], answered with its
//! [`status`](KeyError::status) (400 for a client's missing header, 500 for a server set up
//! without peer addresses).
//!
//! Here: [`PeerIp`] (the TCP peer), [`HeaderKey`] (an API key or tenant header);
//! [`ForwardedIp`](super::ForwardedIp) is the client address behind trusted proxies, and
//! [`KeyFn`](super::KeyFn) any key a closure computes.

use std::borrow::{Borrow, Cow};
use std::fmt::Display;
use std::hash::Hash;
use std::net::{IpAddr, SocketAddr};

use http::header::HeaderName;
use http::{Extensions, Request, StatusCode};

use super::trusted::mask;
use crate::limiter::KeyRef;

/// Names the key a request is limited by.
pub trait KeyExtractor: Send + Sync + 'static {
    /// The keyed limiter's key type.
    type Key: Hash + Eq + Clone + Display + Send + Sync + Borrow<Self::Borrowed> + 'static;
    /// The form the key is looked up in (`str` for `String` keys, the key type itself for
    /// small `Copy` keys).
    type Borrowed: KeyRef<Self::Key> + ?Sized;

    /// The key of `request`, borrowed from it where possible.
    ///
    /// # Errors
    /// A [`KeyError`] when the request carries no usable key.
    fn extract<'r, B>(&self, request: &'r Request<B>) -> Result<Cow<'r, Self::Borrowed>, KeyError>;
}

/// A request without a usable key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The request has no peer address: the server did not record it, or recorded it where
    /// this crate does not look. With axum, serve with
    /// `into_make_service_with_connect_info::<SocketAddr>()` **and** enable this crate's
    /// `axum` feature (with `http` alone axum's `ConnectInfo` is not read, so every request
    /// fails so); with plain hyper, insert the peer's `SocketAddr` into the request's
    /// extensions.
    #[error(
        "the request carries no peer address (with axum: serve with connect info and enable \
         ratelease's `axum` feature, which reads it; otherwise insert the peer's SocketAddr \
         into the request extensions)"
    )]
    NoPeerAddr,
    /// The key header is missing.
    #[error("missing header {0}")]
    MissingHeader(HeaderName),
    /// The key header is not visible ASCII (spaces and tabs allowed, as in any header value), is
    /// empty, or is longer than allowed.
    #[error("header {0} is not a valid key (visible ASCII, spaces and tabs, 1 to {1} bytes)")]
    InvalidHeader(HeaderName, usize),
    /// A custom extractor ([`KeyFn`](super::KeyFn)) found no key; the request is answered
    /// with `status`.
    #[error("no rate-limit key: {reason}")]
    Other {
        /// The status to answer with.
        status: StatusCode,
        /// Why, for the logs and the `Rejection`.
        reason: Cow<'static, str>,
    },
}

impl KeyError {
    /// The status a request with this error is answered with: 500 for
    /// [`NoPeerAddr`](Self::NoPeerAddr) (the server is set up wrong), the given one for
    /// [`Other`](Self::Other), 400 for the rest (the client sent no usable key).
    pub fn status(&self) -> StatusCode {
        match self {
            KeyError::NoPeerAddr => StatusCode::INTERNAL_SERVER_ERROR,
            KeyError::Other { status, .. } => *status,
            _ => StatusCode::BAD_REQUEST,
        }
    }
}

/// The peer's address from a request's extensions: a `SocketAddr` inserted by the server, or
/// (crate feature `axum`) axum's `ConnectInfo<SocketAddr>`.
pub(crate) fn peer_addr(extensions: &Extensions) -> Option<IpAddr> {
    // With the `axum` feature, axum's is looked up first: it is where an axum server puts it.
    #[cfg(feature = "axum")]
    if let Some(info) = extensions.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(info.0.ip());
    }
    extensions.get::<SocketAddr>().map(SocketAddr::ip)
}

/// Keys requests by the TCP peer's IP address: one budget per client when clients connect
/// directly. Behind a reverse proxy every request comes from the proxy — use
/// [`ForwardedIp`](super::ForwardedIp) there.
///
/// IPv4-mapped IPv6 peers count as their IPv4 address. An IPv6 client usually holds a whole
/// `/64` and can rotate through it; [`ipv6_prefix`](Self::ipv6_prefix) keys by the network
/// instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerIp {
    ipv6_prefix: u8,
}

impl Default for PeerIp {
    fn default() -> Self {
        PeerIp { ipv6_prefix: 128 }
    }
}

impl PeerIp {
    /// Keys by the whole peer address.
    pub fn new() -> Self {
        PeerIp::default()
    }

    /// Keys IPv6 peers by their first `bits` bits (at most 128; 64 is a common choice), so
    /// that one client's addresses share one budget.
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits.min(128);
        self
    }

    /// `addr` as this extractor keys it.
    pub(crate) fn key_of(&self, addr: IpAddr) -> IpAddr {
        match addr.to_canonical() {
            v6 @ IpAddr::V6(_) => mask(v6, self.ipv6_prefix),
            v4 => v4,
        }
    }
}

impl KeyExtractor for PeerIp {
    type Key = IpAddr;
    type Borrowed = IpAddr;

    fn extract<'r, B>(&self, request: &'r Request<B>) -> Result<Cow<'r, IpAddr>, KeyError> {
        peer_addr(request.extensions())
            .map(|addr| Cow::Owned(self.key_of(addr)))
            .ok_or(KeyError::NoPeerAddr)
    }
}

/// The longest header key [`HeaderKey`] takes by default.
pub const DEFAULT_MAX_HEADER_KEY: usize = 256;

/// Keys requests by a header's value (an API key, a tenant id), borrowed from the request.
///
/// A request without the header (or with an invalid one) is answered 400, unless
/// [`or_key`](Self::or_key) names a budget such requests share. Authenticate the key first
/// (put this layer after authentication) or callers mint fresh budgets by inventing keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderKey {
    name: HeaderName,
    max_len: usize,
    fallback: Option<Cow<'static, str>>,
}

impl HeaderKey {
    /// Keys by the value of header `name`.
    pub fn new(name: HeaderName) -> Self {
        HeaderKey {
            name,
            max_len: DEFAULT_MAX_HEADER_KEY,
            fallback: None,
        }
    }

    /// Keys by the value of the header named `name` (any case, e.g. `"x-api-key"`), without
    /// building an [`http::HeaderName`] first.
    ///
    /// # Errors
    /// [`BuildError::Config`](crate::BuildError::Config), naming `name`, if it is not a valid
    /// header name.
    pub fn named(name: &str) -> Result<Self, crate::BuildError> {
        HeaderName::from_bytes(name.as_bytes())
            .map(Self::new)
            .map_err(|_| {
                crate::BuildError::Config(format!(
                    "{name:?} is not an HTTP header name (letters, digits and \
                     !#$%&'*+-.^_`|~ only: no spaces, no colon)"
                ))
            })
    }

    /// Requests without a valid header share the budget of `key` instead of being refused.
    pub fn or_key(mut self, key: impl Into<Cow<'static, str>>) -> Self {
        self.fallback = Some(key.into());
        self
    }

    /// Longest value taken as a key (default [`DEFAULT_MAX_HEADER_KEY`], at least 1); a
    /// longer one is invalid. The limiter's key cap counts keys, not bytes.
    pub fn max_len(mut self, max_len: usize) -> Self {
        self.max_len = max_len.max(1);
        self
    }
}

impl KeyExtractor for HeaderKey {
    type Key = String;
    type Borrowed = str;

    fn extract<'r, B>(&self, request: &'r Request<B>) -> Result<Cow<'r, str>, KeyError> {
        let found = match request.headers().get(&self.name) {
            None => Err(KeyError::MissingHeader(self.name.clone())),
            Some(value) => value
                .to_str()
                .ok()
                .filter(|v| !v.is_empty() && v.len() <= self.max_len)
                .map(Cow::Borrowed)
                .ok_or_else(|| KeyError::InvalidHeader(self.name.clone(), self.max_len)),
        };
        match (&self.fallback, found) {
            (_, Ok(key)) => Ok(key),
            // A `&'static str` is lent as it is; an owned fallback is copied.
            (Some(Cow::Borrowed(fallback)), Err(_)) => Ok(Cow::Borrowed(*fallback)),
            (Some(Cow::Owned(fallback)), Err(_)) => Ok(Cow::Owned(fallback.clone())),
            (None, Err(e)) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_name_that_is_not_one_is_refused_by_name() {
        assert!(HeaderKey::named("X-Api-Key").is_ok());
        let err = HeaderKey::named("x api key").unwrap_err();
        assert!(
            matches!(&err, crate::BuildError::Config(m) if m.contains("\"x api key\"")),
            "{err}"
        );
    }

    fn request() -> http::request::Builder {
        Request::get("/")
    }

    #[test]
    fn peer_ip_reads_the_socket_addr_and_masks_ipv6() {
        let mut req = request().body(()).unwrap();
        assert_eq!(PeerIp::new().extract(&req), Err(KeyError::NoPeerAddr));
        req.extensions_mut()
            .insert("[2001:db8::1:2:3:4]:443".parse::<SocketAddr>().unwrap());
        let full = PeerIp::new().extract(&req).unwrap().into_owned();
        assert_eq!(full, "2001:db8::1:2:3:4".parse::<IpAddr>().unwrap());
        let net = PeerIp::new().ipv6_prefix(64).extract(&req).unwrap();
        assert_eq!(*net, "2001:db8::".parse::<IpAddr>().unwrap());
        req.extensions_mut()
            .insert("[::ffff:192.0.2.7]:80".parse::<SocketAddr>().unwrap());
        let v4 = PeerIp::new().ipv6_prefix(64).extract(&req).unwrap();
        assert_eq!(*v4, "192.0.2.7".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn header_key_borrows_validates_and_falls_back() {
        let x = HeaderName::from_static("x-api-key");
        let req = request().header(&x, "alice").body(()).unwrap();
        assert!(matches!(
            HeaderKey::new(x.clone()).extract(&req),
            Ok(Cow::Borrowed("alice"))
        ));
        let missing = request().body(()).unwrap();
        let err = HeaderKey::new(x.clone()).extract(&missing).unwrap_err();
        assert_eq!(err, KeyError::MissingHeader(x.clone()));
        assert_eq!(err.status(), StatusCode::BAD_REQUEST);
        let long = request().header(&x, "k".repeat(9)).body(()).unwrap();
        assert_eq!(
            HeaderKey::new(x.clone()).max_len(8).extract(&long),
            Err(KeyError::InvalidHeader(x.clone(), 8))
        );
        let empty = request().header(&x, "").body(()).unwrap();
        assert!(HeaderKey::new(x.clone()).extract(&empty).is_err());
        let shared = HeaderKey::new(x.clone()).or_key("anonymous");
        assert_eq!(shared.extract(&missing).unwrap(), "anonymous");
        assert_eq!(shared.extract(&empty).unwrap(), "anonymous");
        // By name, in any case; a name a header cannot have is an error, not a panic.
        assert_eq!(HeaderKey::named("X-Api-Key").unwrap(), HeaderKey::new(x));
        assert!(HeaderKey::named("x api key").is_err());
        assert!(HeaderKey::named("").is_err());
    }
}
