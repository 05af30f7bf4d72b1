//! An axum server that limits each API key fleet-wide: `KeyedRateLimitLayer` over a
//! `KeyedHybridLimiter`, and limited requests answered `429 Too Many Requests` with
//! `Retry-After`.
//!
//! ```text
//! cargo run --example axum --features tower                  # a demo against the router
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example axum --features tower -- serve 127.0.0.1:3000
//! curl -i -H 'x-api-key: alice' http://127.0.0.1:3000/
//! ```
//!
//! Without `REDIS_URL` the limiter runs on the in-process `MemoryStore` (one process); with it,
//! every process started this way shares each key's budget through Redis. Without `serve` the
//! example sends requests to the router in-process (`tower::ServiceExt::oneshot`) and prints
//! what came back; `cargo test --example axum --features tower` checks the same.

use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use ratelease::middleware::{BoxError, KeyedRateLimitLayer, Limited};
use ratelease::{KeyedHybridLimiter, LeaseStore, MemoryStore, Quota, RedisStore};
use tower::ServiceBuilder;

/// The header that names the caller's budget.
const API_KEY: &str = "x-api-key";

/// The router: `GET /` behind a per-key limit of `quota`.
fn app<S: LeaseStore + Clone>(limiter: KeyedHybridLimiter<String, S>) -> Router {
    Router::new().route("/", get(|| async { "hello\n" })).layer(
        ServiceBuilder::new()
            // Turns the limiter's errors into responses (axum needs infallible services).
            .layer(HandleErrorLayer::new(error_response))
            .layer(KeyedRateLimitLayer::new(limiter, api_key)),
    )
}

/// The longest API key taken as a key (the limiter's cap counts keys, not bytes).
const MAX_KEY_LEN: usize = 64;

/// The caller's API key; requests without one (or with one too long to be real) share the
/// budget of `anonymous`. A real service would authenticate the key first, so that callers
/// cannot mint fresh budgets by inventing keys.
fn api_key(request: &Request) -> String {
    request
        .headers()
        .get(API_KEY)
        .and_then(|v| v.to_str().ok())
        .filter(|key| key.len() <= MAX_KEY_LEN)
        .unwrap_or("anonymous")
        .to_owned()
}

/// `Limited` becomes 429 with `Retry-After` (whole seconds, rounded up); any other error (a
/// store failure under `FailClosed`, say) is a 503.
async fn error_response(error: BoxError) -> Response {
    match error.downcast_ref::<Limited>() {
        Some(limited) => {
            let mut response = (StatusCode::TOO_MANY_REQUESTS, "rate limited\n").into_response();
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(limited.retry_after_secs()),
            );
            response
        }
        None => {
            // The details are for the logs, not for the caller.
            tracing::warn!(%error, "rate limiter unavailable");
            (StatusCode::SERVICE_UNAVAILABLE, "unavailable\n").into_response()
        }
    }
}

/// 5 requests per minute per API key, fleet-wide.
fn limiter<S: LeaseStore + Clone>(store: S) -> Result<KeyedHybridLimiter<String, S>, BoxError> {
    let quota = Quota::per_minute(5)?;
    Ok(KeyedHybridLimiter::builder("axum-example", quota, store)
        .max_keys(100_000)
        .build()?)
}

/// Sends `n` requests as `key` to the router in-process; returns each status and Retry-After.
async fn send(app: &Router, key: &str, n: usize) -> Vec<(StatusCode, Option<String>)> {
    use tower::ServiceExt;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let request = Request::get("/")
            .header(API_KEY, key)
            .body(axum::body::Body::empty())
            .expect("a valid request");
        let response = app.clone().oneshot(request).await.expect("infallible");
        let retry = response
            .headers()
            .get(header::RETRY_AFTER)
            .map(|v| v.to_str().unwrap_or_default().to_owned());
        out.push((response.status(), retry));
    }
    out
}

async fn run<S: LeaseStore + Clone>(store: S, serve: Option<String>) -> Result<(), BoxError> {
    let app = app(limiter(store)?);
    match serve {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(&addr).await?;
            println!("listening on http://{}", listener.local_addr()?);
            axum::serve(listener, app).await?;
        }
        None => {
            for key in ["alice", "bob"] {
                let n = if key == "alice" { 7 } else { 2 };
                for (status, retry) in send(&app, key, n).await {
                    let retry = retry.map(|r| format!(", Retry-After: {r}"));
                    println!("{key}: {status}{}", retry.unwrap_or_default());
                }
            }
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mut args = std::env::args().skip(1);
    let serve = match args.next().as_deref() {
        Some("serve") => Some(args.next().unwrap_or_else(|| "127.0.0.1:3000".into())),
        Some(other) => return Err(format!("unknown argument {other:?}; try `serve ADDR`").into()),
        None => None,
    };
    match std::env::var("REDIS_URL") {
        Ok(url) => {
            println!("# using Redis at {url}");
            let store = RedisStore::builder(url)
                .response_timeout(Duration::from_millis(50))
                .connect()
                .await?;
            run(store, serve).await
        }
        Err(_) => {
            println!("# REDIS_URL not set: using the in-process MemoryStore");
            run(MemoryStore::new(), serve).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_key_gets_its_budget_then_429_with_retry_after() {
        let app = app(limiter(MemoryStore::new()).unwrap());
        let alice = send(&app, "alice", 7).await;
        // A new key's first request waits for its lease instead of being refused.
        let ok = |(s, r): &(StatusCode, Option<String>)| *s == StatusCode::OK && r.is_none();
        assert!(alice[..5].iter().all(ok), "{alice:?}");
        for (status, retry) in &alice[5..] {
            assert_eq!(*status, StatusCode::TOO_MANY_REQUESTS);
            // One token per 12 s.
            let secs: u64 = retry.as_deref().expect("Retry-After").parse().unwrap();
            assert!((1..=12).contains(&secs), "Retry-After: {secs}");
        }
        let bob = send(&app, "bob", 2).await;
        assert!(bob.iter().all(|(s, _)| *s == StatusCode::OK), "{bob:?}");
    }

    #[tokio::test]
    async fn other_errors_are_a_503() {
        // What a store failure under `FailurePolicy::FailClosed` surfaces as.
        let error =
            ratelease::Error::Store(ratelease::StoreError::Timeout(Duration::from_millis(50)));
        let response = error_response(Box::new(error)).await;
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(response.headers().get(header::RETRY_AFTER).is_none());
    }
}
