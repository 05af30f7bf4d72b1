//! A service that starts while Redis is down (issue 16, item 2): with
//! [`RedisStoreBuilder::lazy_connect`](ratelease::RedisStoreBuilder::lazy_connect) the store
//! and its limiters build without Redis, the failure policy answers from the first call, and
//! the store connects by itself once a real `redis-server` appears on the address, 2 s later.
//!
//! The figures printed here are reported in RELIABILITY.md ("Booting without Redis").

mod support;

use std::time::{Duration, Instant};

use ratelease::{
    AcquireError, BuildError, FailurePolicy, HybridLimiter, Quota, RedisLimiter, RedisStore,
};
use support::{BucketState, RedisServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_starts_before_redis_and_connects_when_it_appears() {
    // The address Redis will listen on, with nothing listening yet.
    let mut server = RedisServer::reserve(&[]);
    let t0 = Instant::now();
    let store = RedisStore::builder(server.url())
        .lazy_connect()
        .connect_timeout(Duration::from_millis(100))
        .response_timeout(Duration::from_millis(200))
        .connect()
        .await
        .expect("a lazy store builds without Redis");
    // 100/s, burst 10; the fallback enforces all of it on this one node.
    let quota = Quota::per_second(100).unwrap().with_burst(10).unwrap();
    let hybrid = HybridLimiter::builder("boot", quota, store.clone())
        .on_store_failure(FailurePolicy::local_fallback(1))
        .build()
        .unwrap();
    let pure = RedisLimiter::new("boot-pure", quota, store.clone()).unwrap();
    let built_in = t0.elapsed();

    // `ready` reports the failed first lease instead of waiting for Redis.
    let t = Instant::now();
    let err = hybrid.ready().await.unwrap_err();
    let ready_in = t.elapsed();
    assert!(matches!(err, AcquireError::Store(_)), "{err:?}");
    // A pure call fails promptly with the store error (its caller decides).
    let t = Instant::now();
    let err = pure.acquire_now(1).await.unwrap_err();
    let pure_in = t.elapsed();
    assert!(matches!(err, AcquireError::Store(_)), "{err:?}");
    assert!(
        ready_in < Duration::from_secs(1) && pure_in < Duration::from_secs(1),
        "ready answered in {ready_in:?}, a pure call in {pure_in:?}"
    );

    // Until Redis appears (2 s after the store was built), the policy answers every call.
    let (mut allowed, mut denied) = (0u64, 0u64);
    let appear_at = t0 + Duration::from_secs(2);
    let policy_from = Instant::now();
    while Instant::now() < appear_at {
        if hybrid.try_acquire(1).unwrap().is_allowed() {
            allowed += 1;
        } else {
            denied += 1;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let outage = policy_from.elapsed().as_secs_f64();
    let stats = hybrid.stats();
    assert!(stats.circuit_open, "{stats:?}");
    assert_eq!(stats.tokens_leased, 0, "{stats:?}");
    // Every admission was the policy's: burst 10 plus 100/s.
    assert_eq!(stats.tokens_admitted_degraded, allowed, "{stats:?}");
    let bound = 11 + (100.0 * outage).ceil() as u64;
    assert!(
        allowed > 0 && allowed <= bound && denied > 0,
        "allowed {allowed} (bound {bound}), denied {denied} in {outage:.2} s"
    );

    server.restart();
    let appeared = Instant::now();
    // The hybrid limiter leases again on its own (its task keeps probing), and a pure call
    // is served, without rebuilding anything.
    let (mut hybrid_back, mut pure_back) = (None, None);
    while hybrid_back.is_none() || pure_back.is_none() {
        assert!(
            appeared.elapsed() < Duration::from_secs(3),
            "not back 3 s after Redis appeared: hybrid {hybrid_back:?}, pure {pure_back:?}, {:?}",
            hybrid.stats()
        );
        let _ = hybrid.try_acquire(1).unwrap();
        let s = hybrid.stats();
        if hybrid_back.is_none() && s.tokens_leased > 0 && !s.circuit_open {
            hybrid_back = Some(appeared.elapsed());
        }
        if pure_back.is_none() && matches!(pure.acquire_now(1).await, Ok(d) if d.is_allowed()) {
            pure_back = Some(appeared.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The state is on the server that appeared.
    assert!(BucketState::read(&server, "ratelease:{boot}").is_some());
    assert!(BucketState::read(&server, "ratelease:{boot-pure}").is_some());
    println!(
        "built in {built_in:?}; ready Err in {ready_in:?}, pure Err in {pure_in:?}; \
         policy admitted {allowed} / denied {denied} in {outage:.2} s (bound {bound}); \
         after Redis appeared: hybrid leasing in {:?}, pure served in {:?}",
        hybrid_back.unwrap(),
        pure_back.unwrap()
    );
}

/// With Redis down from the start, a request's first check — as the HTTP layer makes it,
/// waiting up to its default lease wait, 50 ms, for the first lease — is the failure policy's to
/// answer: the lease fails (a refused connect and its one retry) well within that wait. (The
/// retry waited 100–200 ms: the first request was refused as over the limit, a 429.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_down_from_the_start_the_first_request_is_the_policys() {
    let nothing = RedisServer::reserve(&[]);
    let store = nothing.lazy_store().await;
    let lease_wait = Duration::from_millis(50);
    let quota = Quota::per_second(100).unwrap();
    // The default policy (the last known share; none known yet: the whole quota).
    let limiter = HybridLimiter::new("down-at-boot", quota, store).unwrap();
    let t = Instant::now();
    let first = limiter.try_acquire_or_lease(1, lease_wait).await.unwrap();
    let took = t.elapsed();
    assert!(
        first.is_allowed(),
        "{first:?} after {took:?}: {:?}",
        limiter.stats()
    );
    assert!(limiter.stats().circuit_open);
    assert!(took < lease_wait, "{took:?}");
}

/// Without `lazy_connect`, `connect` still fails fast on an unreachable Redis (a service that
/// would rather not start without its limits), and bad configuration fails a lazy store too.
#[tokio::test]
async fn connect_without_lazy_still_fails_and_lazy_still_checks_the_configuration() {
    let server = RedisServer::reserve(&[]);
    let err = RedisStore::builder(server.url())
        .connect_timeout(Duration::from_millis(100))
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, BuildError::Store(_)), "{err:?}");
    let err = RedisStore::builder("not a url")
        .lazy_connect()
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, BuildError::Config(_)), "{err:?}");
    let err = RedisStore::builder(server.url())
        .prefix("bad{prefix")
        .lazy_connect()
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, BuildError::Config(_)), "{err:?}");
}

/// A lazy cluster store (feature `cluster`): it builds with no node reachable and its calls
/// fail promptly with the store error; on a running cluster the first call connects, and
/// concurrent first calls share that connection.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lazy_cluster_store_builds_without_nodes_and_connects_on_first_use() {
    use support::RedisCluster;

    let nobody = RedisServer::reserve(&[]);
    let store = RedisStore::cluster_builder([nobody.url()])
        .lazy_connect()
        .connect_timeout(Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let limiter = RedisLimiter::new("lazy-cluster", Quota::per_second(5).unwrap(), store).unwrap();
    let t = Instant::now();
    let err = limiter.acquire_now(1).await.unwrap_err();
    assert!(matches!(err, AcquireError::Store(_)), "{err:?}");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());

    let cluster = RedisCluster::start(3);
    let store = RedisStore::cluster_builder(cluster.urls())
        .lazy_connect()
        .response_timeout(Duration::from_secs(1))
        .connect()
        .await
        .unwrap();
    // Ten names, burst 3 each, all asked at once before any connection exists.
    let quota = Quota::new(1, Duration::from_secs(3600))
        .unwrap()
        .with_burst(3)
        .unwrap();
    let mut calls = Vec::new();
    for i in 0..10 {
        let limiter = RedisLimiter::new(format!("lazy-{i}"), quota, store.clone()).unwrap();
        calls.push(tokio::spawn(async move {
            let mut allowed = 0;
            for _ in 0..4 {
                allowed += u32::from(limiter.acquire_now(1).await.unwrap().is_allowed());
            }
            allowed
        }));
    }
    for call in calls {
        assert_eq!(call.await.unwrap(), 3);
    }
}

/// A pure limiter's `ready` that finds no store counts as a failed call: the circuit opens, so
/// the next decisions are the failure policy's at once (here, from its local bucket), each
/// without waiting on the store, until a probe finds it. Before, a failed `ready` opened
/// nothing and the first decision paid the store's failure again.
#[tokio::test]
async fn a_failed_ready_opens_a_pure_limiters_circuit() {
    let nothing = RedisServer::reserve(&[]);
    let store = nothing.lazy_store().await;
    let quota = Quota::per_second(100).unwrap();
    let pure = RedisLimiter::builder("down-pure", quota, store)
        .on_store_failure(FailurePolicy::local_fallback(1))
        .build()
        .unwrap();
    assert!(!pure.circuit_open());
    let err = pure.ready().await.unwrap_err();
    assert!(matches!(err, AcquireError::Store(_)), "{err:?}");
    assert!(
        pure.circuit_open(),
        "a failed ready left the circuit closed"
    );
    // The policy answers (its local bucket holds the burst), not the store's error.
    assert!(pure.acquire_now(1).await.unwrap().is_allowed());
}
