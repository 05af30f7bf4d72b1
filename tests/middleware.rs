//! Tower middleware (feature `tower`): back-pressure in `poll_ready`, shedding with `Limited`
//! for keyed limiters, limiter errors surfaced, and permits never duplicated by clones.
#![cfg(feature = "tower")]

mod support;
mod wrapped;

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ratelease::middleware::{
    BoxError, KeyedRateLimitLayer, Limited, NotReady, RateLimitLayer, DEFAULT_LEASE_WAIT,
};
use ratelease::{
    Error, HybridLimiter, KeyedHybridLimiter, KeyedRedisLimiter, MemoryStore, Quota, RedisLimiter,
    RedisStore, TokioClock, Unconfigured,
};
use support::RedisServer;
use tower::{Service, ServiceBuilder, ServiceExt};

/// An inner service that counts its calls.
fn counting(
    calls: Arc<AtomicU64>,
) -> impl Service<u32, Response = u32, Error = Infallible> + Clone {
    tower::service_fn(move |x: u32| {
        calls.fetch_add(1, Ordering::Relaxed);
        async move { Ok::<_, Infallible>(x) }
    })
}

#[tokio::test(start_paused = true)]
async fn back_pressure_holds_callers_to_the_rate_on_virtual_time() {
    // 10 per second, burst 10, leased in batches of 5.
    let quota = Quota::per_second(10).unwrap();
    let store = MemoryStore::with_clock(TokioClock::new());
    let limiter = HybridLimiter::builder("bp", quota, store)
        .lease_size(5)
        .build()
        .unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    let mut svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(limiter.clone()))
        .service(counting(calls.clone()));
    let start = tokio::time::Instant::now();
    for i in 0..40 {
        let out = svc.ready().await.unwrap().call(i).await.unwrap();
        assert_eq!(out, i);
    }
    let elapsed = start.elapsed();
    assert_eq!(calls.load(Ordering::Relaxed), 40);
    // 40 tokens from a bucket of 10 refilling at 10/s: at least 3 s of waiting, and the
    // waits were real (not a spin): about the time the refill takes, plus retry slack.
    assert!(
        elapsed >= Duration::from_secs(3),
        "40 calls in {elapsed:?}: the limit did not hold"
    );
    assert!(elapsed < Duration::from_secs(6), "took {elapsed:?}");
    assert_eq!(limiter.stats().tokens_leased, 40);
}

#[tokio::test]
async fn a_pure_limiter_waits_through_the_boxed_path_and_errors_surface() {
    let server = RedisServer::start();
    let store = RedisStore::connect(server.url()).await.unwrap();
    // 20 per second, burst 2: the third and fourth calls wait ~50 ms each.
    let quota = Quota::per_second(20).unwrap().with_burst(2).unwrap();
    let limiter = RedisLimiter::new("pure-bp", quota, store.clone()).unwrap();
    // Three tokens a call could never be admitted under a burst of 2: refused at build.
    let err = RateLimitLayer::new(limiter.clone()).tokens(3).unwrap_err();
    assert!(matches!(err, ratelease::BuildError::Config(_)), "{err}");
    let calls = Arc::new(AtomicU64::new(0));
    let mut svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(limiter))
        .service(counting(calls.clone()));
    let start = std::time::Instant::now();
    for i in 0..4 {
        svc.ready().await.unwrap().call(i).await.unwrap();
    }
    assert_eq!(calls.load(Ordering::Relaxed), 4);
    assert!(
        start.elapsed() >= Duration::from_millis(90),
        "{:?}",
        start.elapsed()
    );

    // A limiter error (an unconfigured name the limiter must refuse) comes out of poll_ready
    // as the limiter's own error, and the inner service is never called.
    let refusing = RedisLimiter::builder("nobody-configured-this", quota, store)
        .if_unconfigured(Unconfigured::Error)
        .build()
        .unwrap();
    let mut svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(refusing))
        .service(counting(calls.clone()));
    let Err(err) = svc.ready().await.map(|_| ()) else {
        panic!("an unconfigured name was admitted")
    };
    let err = err.downcast::<Error>().expect("a ratelease error");
    assert!(matches!(*err, Error::Unconfigured(_)), "{err:?}");
    assert_eq!(calls.load(Ordering::Relaxed), 4);
}

#[tokio::test(start_paused = true)]
async fn a_clone_starts_without_a_permit() {
    let quota = Quota::per_second(1_000).unwrap();
    let store = MemoryStore::with_clock(TokioClock::new());
    let limiter = HybridLimiter::new("clone", quota, store).unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    let mut svc = ServiceBuilder::new()
        .layer(RateLimitLayer::new(limiter.clone()))
        .service(counting(calls.clone()));
    svc.ready().await.unwrap();
    let mut copy = svc.clone();
    let err = copy.call(1).await.unwrap_err();
    assert!(err.downcast_ref::<NotReady>().is_some(), "{err}");
    assert_eq!(svc.call(2).await.unwrap(), 2);
    // The permit was spent: another call needs poll_ready again.
    assert!(svc.call(3).await.unwrap_err().is::<NotReady>());
    assert_eq!(calls.load(Ordering::Relaxed), 1);
}

/// Sends `n` requests for `key` (the request is `(key, i)`); returns (served, limited).
async fn send<S>(svc: &mut S, key: &str, n: u32) -> (u32, Vec<Limited>)
where
    S: Service<(String, u32), Response = u32, Error = BoxError>,
{
    let (mut served, mut limited) = (0, Vec::new());
    for i in 0..n {
        match svc.ready().await.unwrap().call((key.to_owned(), i)).await {
            Ok(x) => {
                assert_eq!(x, i);
                served += 1;
            }
            Err(e) => limited.push(*e.downcast::<Limited>().expect("only Limited errors")),
        }
    }
    (served, limited)
}

fn keyed_inner(
    calls: Arc<AtomicU64>,
) -> impl Service<(String, u32), Response = u32, Error = Infallible, Future: Send> + Clone + Send + 'static
{
    tower::service_fn(move |(_, x): (String, u32)| {
        calls.fetch_add(1, Ordering::Relaxed);
        async move { Ok::<_, Infallible>(x) }
    })
}

#[tokio::test]
async fn keyed_shedding_limits_each_key_on_its_own_with_a_retry_hint() {
    let server = RedisServer::start();
    let store = RedisStore::connect(server.url()).await.unwrap();
    let quota = Quota::new(3, Duration::from_secs(3600)).unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    let mut svc = ServiceBuilder::new()
        .layer(KeyedRateLimitLayer::new(
            KeyedRedisLimiter::new("k", quota, store).unwrap(),
            |req: &(String, u32)| req.0.clone(),
        ))
        .service(keyed_inner(calls.clone()));
    let (served, limited) = send(&mut svc, "alice", 5).await;
    assert_eq!((served, limited.len()), (3, 2));
    // One token per 20 minutes: the hint says so, in whole seconds for Retry-After.
    assert!(limited[0].retry_after() > Duration::from_secs(60));
    assert!(limited[0].retry_after_secs() >= 1_199);
    let (served, _) = send(&mut svc, "bob", 2).await;
    assert_eq!(served, 2, "bob has a budget of his own");
    assert_eq!(
        calls.load(Ordering::Relaxed),
        5,
        "limited requests never reach the service"
    );
}

#[tokio::test]
async fn keyed_shedding_with_a_synchronous_limiter() {
    let quota = Quota::new(4, Duration::from_secs(3600)).unwrap();
    let keyed = KeyedHybridLimiter::<String, _>::builder("h", quota, MemoryStore::new())
        .lease_size(4)
        .build()
        .unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    let layer = |lease_wait| {
        ServiceBuilder::new()
            .layer(
                KeyedRateLimitLayer::new(keyed.clone(), |req: &(String, u32)| req.0.clone())
                    .lease_wait(lease_wait),
            )
            .service(keyed_inner(calls.clone()))
    };
    // Strict shedding: a new key holds no tokens yet, so its first request is refused with a
    // hint of about one round trip while its lease is fetched.
    let mut strict = layer(Duration::ZERO);
    let (served, limited) = send(&mut strict, "new", 1).await;
    assert_eq!((served, limited.len()), (0, 1));
    assert!(
        limited[0].retry_after() < Duration::from_secs(1),
        "{limited:?}"
    );
    // The default waits that round trip: a's first request is served, and so is its whole
    // budget; then requests are shed at once with a hint of a token's refill time.
    let mut svc = layer(DEFAULT_LEASE_WAIT);
    let (served, limited) = send(&mut svc, "a", 6).await;
    assert_eq!((served, limited.len()), (4, 2));
    assert!(limited
        .iter()
        .all(|l| l.retry_after() > Duration::from_secs(60)));
    let (served, limited) = send(&mut svc, "b", 2).await;
    assert_eq!((served, limited.len()), (2, 0), "b has a budget of its own");
    assert_eq!(calls.load(Ordering::Relaxed), 6);
    // Charging more per request drains a budget faster: at 2 tokens a request, a fresh key's
    // 4 tokens buy two requests.
    let mut costly = ServiceBuilder::new()
        .layer(
            KeyedRateLimitLayer::new(keyed.clone(), |req: &(String, u32)| req.0.clone()).tokens(2),
        )
        .service(keyed_inner(calls.clone()));
    let (served, limited) = send(&mut costly, "c", 3).await;
    assert_eq!((served, limited.len()), (2, 1));
}

/// An over-limit key is shed at once — no request waits for its next token, nor for the
/// small refills of a key the store just refused — unless `queue` asks for waiting (the old
/// single `max_wait` did, and throughput fell to the limit: issue 14, item 1). Virtual time,
/// a store with a 1 ms round trip; 50 requests every 10 ms against 100/s (burst 10).
#[tokio::test(start_paused = true)]
async fn keyed_shedding_does_not_queue_an_over_limit_key_unless_asked() {
    use tokio::time::Instant;

    let quota = Quota::per_second(100).unwrap().with_burst(10).unwrap();
    let run = |queue: Duration| async move {
        let store = wrapped::Wrapped::new(Duration::from_millis(1));
        let limiter = KeyedHybridLimiter::<String, _>::new("hot", quota, store).unwrap();
        let mut svc = ServiceBuilder::new()
            .layer(
                KeyedRateLimitLayer::new(limiter, |req: &(String, u32)| req.0.clone()).queue(queue),
            )
            .service(keyed_inner(Arc::default()));
        let (mut served, mut inside) = (0u32, Duration::ZERO);
        for _ in 0..100 {
            let start = Instant::now();
            served += send(&mut svc, "hot", 50).await.0;
            inside += start.elapsed();
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        (served, inside)
    };
    let (served, inside) = run(Duration::ZERO).await;
    // The burst, then the rate for about a second; the waiting was the new key's start (its
    // burst leased a token at a time, one 1 ms round trip each).
    assert!((90..=125).contains(&served), "served {served}");
    assert!(
        inside <= Duration::from_millis(15),
        "requests spent {inside:?} waiting"
    );
    let (served, inside) = run(Duration::from_millis(20)).await;
    assert!(
        inside > Duration::from_secs(10),
        "queued requests spent only {inside:?}"
    );
    assert!(served > 1_000, "served {served}");
}

/// The names `max_wait` and `DEFAULT_MAX_WAIT` had before the split still work, deprecated:
/// `max_wait(d)` sets both waits, as the one setting did.
#[test]
#[allow(deprecated)]
fn the_old_max_wait_sets_both_waits() {
    use ratelease::middleware::DEFAULT_MAX_WAIT;

    assert_eq!(DEFAULT_MAX_WAIT, DEFAULT_LEASE_WAIT);
    let quota = Quota::per_second(1).unwrap();
    let limiter = KeyedRedisLimiter::new("old", quota, MemoryStore::new()).unwrap();
    let layer = || KeyedRateLimitLayer::new(limiter.clone(), |req: &(String, u32)| req.0.clone());
    let d = Duration::from_millis(20);
    let old = format!("{:?}", layer().max_wait(d));
    assert_eq!(old, format!("{:?}", layer().lease_wait(d).queue(d)));
    assert_ne!(old, format!("{:?}", layer().lease_wait(d)));
}

/// `RateLimitLayer` goes straight onto an axum `Router` (which needs a `Sync` service) and
/// holds requests to the rate there.
#[tokio::test(start_paused = true)]
async fn back_pressure_on_an_axum_router() {
    use axum::body::Body;
    use axum::error_handling::HandleErrorLayer;
    use axum::http::{Request, StatusCode};
    use axum::routing::get;
    use axum::Router;

    let quota = Quota::per_second(10).unwrap();
    let store = MemoryStore::with_clock(TokioClock::new());
    let limiter = HybridLimiter::builder("axum-bp", quota, store)
        .lease_size(5)
        .build()
        .unwrap();
    // Limiter errors (a store failing under FailClosed, …) become 503s.
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(|_: BoxError| async {
                StatusCode::SERVICE_UNAVAILABLE
            }))
            .layer(RateLimitLayer::new(limiter.clone())),
    );
    let start = tokio::time::Instant::now();
    for _ in 0..30 {
        let request = Request::get("/").body(Body::empty()).unwrap();
        let response = app.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    // 30 tokens from a bucket of 10 refilling at 10/s: at least 2 s of waiting.
    let elapsed = start.elapsed();
    assert!(
        elapsed >= Duration::from_secs(2),
        "30 requests in {elapsed:?}"
    );
    assert_eq!(limiter.stats().tokens_leased, 30);
}
