//! [`KeyFn`]: a key extractor from a closure, for keys the built-in extractors do not cover
//! (a path segment, a claim an authentication layer put in the extensions).
//!
//! The closure sees a [`RequestHead`] — the request without its body, whose type the layer is
//! generic over — and returns the key by value. That suits small `Copy` keys (an account id)
//! best: a `String` key is allocated per request, where [`HeaderKey`](super::HeaderKey)
//! borrows it.

use std::borrow::Cow;
use std::fmt::Display;
use std::hash::Hash;

use http::{Extensions, HeaderMap, Method, Request, Uri};

use super::key::{KeyError, KeyExtractor};

/// A request without its body, as [`KeyFn`]'s closure sees it.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct RequestHead<'r> {
    /// The method.
    pub method: &'r Method,
    /// The URI.
    pub uri: &'r Uri,
    /// The headers.
    pub headers: &'r HeaderMap,
    /// The extensions (where earlier layers leave what they learned).
    pub extensions: &'r Extensions,
}

impl<'r> RequestHead<'r> {
    /// The head of `request`.
    pub fn of<B>(request: &'r Request<B>) -> Self {
        RequestHead {
            method: request.method(),
            uri: request.uri(),
            headers: request.headers(),
            extensions: request.extensions(),
        }
    }
}

/// Keys requests by what a closure of the request's head returns, for keys the built-in
/// extractors do not cover (a path segment, a claim an authentication layer left in the
/// extensions). The key is returned by value: best for small `Copy` keys (a `String` key is
/// allocated per request, where [`HeaderKey`](super::HeaderKey) borrows it).
///
/// ```
/// use http::StatusCode; // the `http` crate, also `axum::http::StatusCode`
/// use ratelease::http::{KeyError, KeyFn};
///
/// // One budget per tenant, the first path segment of `/tenants/<id>/…`.
/// let by_tenant = KeyFn::new(|head| {
///     let mut segments = head.uri.path().split('/').skip(1);
///     match (segments.next(), segments.next().map(str::parse::<u64>)) {
///         (Some("tenants"), Some(Ok(id))) => Ok(id),
///         _ => Err(KeyError::Other { status: StatusCode::NOT_FOUND, reason: "no tenant".into() }),
///     }
/// });
/// # let _ = by_tenant;
/// ```
#[derive(Debug, Clone, Copy)]
pub struct KeyFn<F> {
    f: F,
}

impl<F> KeyFn<F> {
    /// Keys requests by `f(&head)`.
    pub fn new<K>(f: F) -> Self
    where
        F: Fn(&RequestHead<'_>) -> Result<K, KeyError>,
    {
        KeyFn { f }
    }
}

impl<F, K> KeyExtractor for KeyFn<F>
where
    F: Fn(&RequestHead<'_>) -> Result<K, KeyError> + Send + Sync + 'static,
    K: Hash + Eq + Clone + Display + Send + Sync + 'static,
{
    type Key = K;
    type Borrowed = K;

    fn extract<'r, B>(&self, request: &'r Request<B>) -> Result<Cow<'r, K>, KeyError> {
        (self.f)(&RequestHead::of(request)).map(Cow::Owned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    #[test]
    fn the_closure_sees_the_head_and_its_errors_pass_through() {
        let by_method = KeyFn::new(|head| match *head.method {
            Method::GET => Ok("reads"),
            _ => Err(KeyError::Other {
                status: StatusCode::METHOD_NOT_ALLOWED,
                reason: "reads only".into(),
            }),
        });
        let get = Request::get("/x").body(()).unwrap();
        assert_eq!(*by_method.extract(&get).unwrap(), "reads");
        let post = Request::post("/x").body(()).unwrap();
        let err = by_method.extract(&post).unwrap_err();
        assert_eq!(err.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(err.to_string(), "no rate-limit key: reads only");
    }
}
