//! Tower middleware (feature `tower`): back-pressure in `poll_ready`, shedding with `Limited`
//! for keyed limiters, limiter errors surfaced, and permits never duplicated by clones.
#![cfg(feature = "tower")]

mod support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use ratelease::middleware::{BoxError, KeyedRateLimitLayer, Limited, NotReady, RateLimitLayer};
use ratelease::{
    Decision, Error, HybridLimiter, KeyedLimiter, MemoryStore, Quota, RedisLimiter, RedisStore,
    TokioClock, Unconfigured,
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

/// A keyed limiter that must await: a pure limiter per key on one store.
#[derive(Clone)]
struct PurePerKey {
    store: RedisStore,
    quota: Quota,
}

impl KeyedLimiter<String> for PurePerKey {
    async fn try_acquire(&self, key: &String, n: u64) -> Result<Decision, Error> {
        let limiter = RedisLimiter::new(format!("k:{key}"), self.quota, self.store.clone())?;
        limiter.try_acquire(n).await
    }

    async fn acquire(&self, key: &String, n: u64) -> Result<(), Error> {
        let limiter = RedisLimiter::new(format!("k:{key}"), self.quota, self.store.clone())?;
        limiter.acquire(n).await
    }

    async fn try_acquire_for(
        &self,
        key: &String,
        n: u64,
        timeout: Duration,
    ) -> Result<Decision, Error> {
        let limiter = RedisLimiter::new(format!("k:{key}"), self.quota, self.store.clone())?;
        limiter.try_acquire_for(n, timeout).await
    }
}

/// A keyed limiter that answers at once: a hybrid limiter per key.
#[derive(Clone)]
struct HybridPerKey {
    store: MemoryStore,
    quota: Quota,
    limiters: Arc<DashMap<String, HybridLimiter<MemoryStore>>>,
}

impl HybridPerKey {
    fn get(&self, key: &str) -> HybridLimiter<MemoryStore> {
        self.limiters
            .entry(key.to_owned())
            .or_insert_with(|| {
                HybridLimiter::builder(format!("h:{key}"), self.quota, self.store.clone())
                    .lease_size(self.quota.burst())
                    .build()
                    .unwrap()
            })
            .clone()
    }
}

impl KeyedLimiter<String> for HybridPerKey {
    async fn try_acquire(&self, key: &String, n: u64) -> Result<Decision, Error> {
        self.get(key).try_acquire(n)
    }

    async fn acquire(&self, key: &String, n: u64) -> Result<(), Error> {
        self.get(key).acquire(n).await
    }

    async fn try_acquire_for(
        &self,
        key: &String,
        n: u64,
        timeout: Duration,
    ) -> Result<Decision, Error> {
        self.get(key).try_acquire_for(n, timeout).await
    }

    fn try_acquire_now(&self, key: &String, n: u64) -> Option<Result<Decision, Error>> {
        Some(self.get(key).try_acquire(n))
    }
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
            PurePerKey { store, quota },
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
    let keyed = HybridPerKey {
        store: MemoryStore::new(),
        quota,
        limiters: Arc::default(),
    };
    // Let each key's first lease land so decisions are local.
    for key in ["a", "b"] {
        keyed.get(key).acquire(1).await.unwrap();
    }
    let calls = Arc::new(AtomicU64::new(0));
    let mut svc = ServiceBuilder::new()
        .layer(KeyedRateLimitLayer::new(
            keyed.clone(),
            |req: &(String, u32)| req.0.clone(),
        ))
        .service(keyed_inner(calls.clone()));
    let (served, limited) = send(&mut svc, "a", 6).await;
    assert_eq!((served, limited.len()), (3, 3));
    let (served, limited) = send(&mut svc, "b", 2).await;
    assert_eq!((served, limited.len()), (2, 0));
    assert_eq!(calls.load(Ordering::Relaxed), 5);
    // Charging more per request drains a budget faster: b has 1 left, a request costs 2.
    let mut costly = ServiceBuilder::new()
        .layer(KeyedRateLimitLayer::new(keyed, |req: &(String, u32)| req.0.clone()).tokens(2))
        .service(keyed_inner(calls.clone()));
    let (served, limited) = send(&mut costly, "b", 1).await;
    assert_eq!((served, limited.len()), (0, 1));
}
