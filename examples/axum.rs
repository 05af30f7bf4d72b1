//! An axum server that limits each API key fleet-wide: one `LimitLayer` over a
//! `KeyedHybridLimiter`. Over-limit requests get `429 Too Many Requests` with `Retry-After`,
//! `RateLimit` and `RateLimit-Policy`; a request without an API key gets 400.
//!
//! ```text
//! cargo run --example axum --features axum                         # serves 127.0.0.1:3000
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example axum --features axum -- 127.0.0.1:3000
//! curl -i -H 'x-api-key: alice' http://127.0.0.1:3000/
//! ```
//!
//! Without `REDIS_URL` the limiter runs on the in-process `MemoryStore` (one process); with
//! it, every process started this way shares each key's budget through Redis.
//! `cargo test --example axum --features axum` starts the server on a real port and checks
//! the responses over HTTP.

use std::time::Duration;

use axum::routing::get;
use axum::Router;
use ratelease::http::{HeaderKey, LimitLayer};
use ratelease::{FailurePolicy, KeyedHybridLimiter, LeaseStore, MemoryStore, Quota, RedisStore};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The router: `GET /` behind a limit of 5 requests per minute per API key, fleet-wide.
/// (A real service authenticates the key first, so that callers cannot mint fresh budgets by
/// inventing keys.)
fn app<S: LeaseStore + Clone>(store: S) -> Result<Router, BoxError> {
    // While Redis is down each process enforces its part of a key's limit: a keyed limiter
    // learns no share from the store, so it is told the fleet's size (here up to 4 processes;
    // the default of one would let each process admit a key's whole limit).
    let limiter = KeyedHybridLimiter::builder("axum-example", Quota::per_minute(5)?, store)
        .on_store_failure(FailurePolicy::last_known_share(4))
        .build()?;
    let api_key = HeaderKey::named("x-api-key")?.max_len(64);
    Ok(Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(LimitLayer::keyed(limiter, api_key)))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3000".into());
    let app = match std::env::var("REDIS_URL") {
        Ok(url) => {
            println!("# using Redis at {url}");
            // Lazy: the service starts even while Redis is down (the failure policy answers
            // until it is reachable), and connects in the background when it appears.
            let store = RedisStore::builder(url)
                .response_timeout(Duration::from_millis(50))
                .lazy_connect()
                .connect()
                .await?;
            app(store)?
        }
        Err(_) => {
            println!("# REDIS_URL not set: using the in-process MemoryStore");
            app(MemoryStore::new())?
        }
    };
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}

#[cfg(test)]
#[path = "../tests/support/http_client.rs"]
mod http_client;

#[cfg(test)]
mod tests {
    use super::*;
    use http_client::get;

    #[tokio::test]
    async fn over_http_each_key_gets_its_budget_then_429_with_rate_limit_headers() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            axum::serve(listener, app(MemoryStore::new()).unwrap())
                .await
                .unwrap()
        });

        let mut alice = Vec::new();
        for _ in 0..7 {
            alice.push(get(addr, "/", &[("x-api-key", "alice")]).await.unwrap());
        }
        // The new key's first request waited for its lease instead of being refused; the
        // budget of 5 is served, then the layer sheds.
        for ok in &alice[..5] {
            assert_eq!((ok.status, ok.body.as_str()), (200, "hello\n"), "{alice:?}");
            assert_eq!(ok.header("retry-after"), None);
        }
        for limited in &alice[5..] {
            assert_eq!(limited.status, 429, "{limited:?}");
            // One token per 12 s.
            let secs: u64 = limited.header("retry-after").unwrap().parse().unwrap();
            assert!((1..=12).contains(&secs), "Retry-After: {secs}");
            assert_eq!(
                limited.header("ratelimit"),
                Some(format!("\"default\";r=0;t={secs}").as_str())
            );
            assert_eq!(
                limited.header("ratelimit-policy"),
                Some("\"default\";q=5;w=60")
            );
        }
        // Another key has its own budget, new to the server too: served at once.
        let bob = get(addr, "/", &[("x-api-key", "bob")]).await.unwrap();
        assert_eq!(bob.status, 200);
        // No key (or an absurd one): 400.
        assert_eq!(get(addr, "/", &[]).await.unwrap().status, 400);
        let long = "k".repeat(65);
        let long = get(addr, "/", &[("x-api-key", &long)]).await.unwrap();
        assert_eq!(long.status, 400);
        server.abort();
    }
}
