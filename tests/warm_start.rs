//! Warm start and refilling ahead of demand: the first check after [`HybridLimiter::ready`] is
//! allowed (on `MemoryStore` and on a real redis-server, in real time), a pure limiter's
//! `ready` connects and reads the stored quota without taking a token, and a limit far above
//! demand never denies a caller while the fleet has tokens — with a store with a network delay
//! and demand ramping up to 145 000 requests a second (on virtual time).

mod support;
mod wrapped;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ratelease::{
    AcquireError, ConfigStore, HybridLimiter, LeaseStore, Limiter, Quota, RedisLimiter, RedisStore,
    StoreError, Unconfigured,
};
use support::RedisServer;
use wrapped::Wrapped;

/// Calls `try_acquire(1)` at `per_ms(t)` requests a millisecond at `t` seconds, in 1 ms slices
/// on tokio's paused clock (the limiter's task and the store's delay run on the same virtual
/// time), for `run`. Returns (allowed, denied).
async fn drive<S: LeaseStore>(
    limiter: &HybridLimiter<S>,
    per_ms: impl Fn(f64) -> f64,
    run: Duration,
) -> (u64, u64) {
    let start = tokio::time::Instant::now();
    let (mut allowed, mut denied, mut owed) = (0u64, 0u64, 0.0f64);
    while start.elapsed() < run {
        owed += per_ms(start.elapsed().as_secs_f64());
        while owed >= 1.0 {
            owed -= 1.0;
            if limiter.try_acquire(1).unwrap().is_allowed() {
                allowed += 1;
            } else {
                denied += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    (allowed, denied)
}

/// Demand ramps from 10 000 to 145 000 requests a second, against 10 000 000/s (a bucket of
/// 100 000: leases of about 12 ms of demand), with a 1 ms round trip to the store: the local
/// bucket must never run dry — not while demand grows faster than the demand estimate (time
/// constant 300 ms) follows, and not while a refill is in flight. On virtual time, so the
/// answer does not depend on how loaded the machine is. (Sized by the estimate alone, leases
/// were sized for a few thousand a second and callers were denied thousands of times.)
#[tokio::test(start_paused = true)]
async fn a_limit_far_above_a_ramping_demand_never_denies() {
    let store = Wrapped::new(Duration::from_millis(1));
    let quota = Quota::per_second(10_000_000)
        .unwrap()
        .with_burst(100_000)
        .unwrap();
    let limiter = HybridLimiter::new("ample", quota, store.clone()).unwrap();
    limiter.ready().await.unwrap();
    // 10/ms for half a second, up to 145/ms over 300 ms, then steady.
    let ramp = |t: f64| 10.0 + 135.0 * ((t - 0.5) / 0.3).clamp(0.0, 1.0);
    let (allowed, denied) = drive(&limiter, ramp, Duration::from_secs(2)).await;
    let stats = limiter.stats();
    assert!(allowed > 200_000, "{allowed} allowed: {stats:?}");
    assert_eq!(denied, 0, "{allowed} allowed: {stats:?}");
    assert_eq!(
        stats.over_limit, 0,
        "the fleet's bucket never ran out: {stats:?}"
    );
    limiter.shutdown().await;
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// The first check after `ready` is allowed on a real redis-server, with and without prefetch.
#[test]
fn the_first_check_after_ready_is_allowed_on_redis() {
    let server = RedisServer::start();
    let rt = runtime();
    rt.block_on(async {
        let store = RedisStore::connect(server.url()).await.unwrap();
        let quota = Quota::per_second(1_000).unwrap().with_burst(100).unwrap();
        let limiter = HybridLimiter::new("warm", quota, store.clone()).unwrap();
        limiter.ready().await.unwrap();
        let stats = limiter.stats();
        assert_eq!(stats.leases, 1, "{stats:?}");
        assert!(limiter.try_acquire(1).unwrap().is_allowed(), "{stats:?}");

        let lazy = HybridLimiter::builder("lazy", quota, store.clone())
            .prefetch(false)
            .build()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(lazy.stats().leases, 0, "nothing leased before ready");
        tokio::time::timeout(Duration::from_secs(5), lazy.ready())
            .await
            .expect("ready starts the first lease itself")
            .unwrap();
        assert!(lazy.try_acquire(1).unwrap().is_allowed());

        // A drained bucket: ready returns (denials are honest now), and the check is denied.
        let drained = Quota::per_minute(1).unwrap();
        let first = HybridLimiter::new("drained", drained, store.clone()).unwrap();
        first.ready().await.unwrap();
        assert!(first.try_acquire(1).unwrap().is_allowed());
        let second = HybridLimiter::new("drained", drained, store.clone()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), second.ready())
            .await
            .expect("an empty bucket is an answer")
            .unwrap();
        assert!(!second.try_acquire(1).unwrap().is_allowed());

        for l in [limiter, lazy, first, second] {
            l.shutdown().await;
            assert!(matches!(l.ready().await, Err(AcquireError::Closed)));
        }
    });
}

/// A redis-server that is gone: `ready` reports the store error after the first failed lease
/// (not after a second one), and the limiter answers by its failure policy meanwhile.
#[test]
fn ready_reports_an_unreachable_redis_promptly() {
    let mut server = RedisServer::start();
    let rt = runtime();
    rt.block_on(async {
        let store = RedisStore::builder(server.url())
            .response_timeout(Duration::from_millis(200))
            .connect_timeout(Duration::from_millis(200))
            .connect()
            .await
            .unwrap();
        server.stop();
        let quota = Quota::per_second(1_000).unwrap();
        let limiter = HybridLimiter::new("down", quota, store).unwrap();
        let started = Instant::now();
        let err = tokio::time::timeout(Duration::from_secs(5), limiter.ready())
            .await
            .expect("answered")
            .unwrap_err();
        assert!(matches!(err, AcquireError::Store(_)), "{err:?}");
        let stats = limiter.stats();
        assert!(stats.circuit_open, "{stats:?}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        // The default failure policy (a local fallback) answers.
        assert!(limiter.try_acquire(1).unwrap().is_allowed());
        limiter.shutdown().await;
    });
}

/// `ready` called once the first lease has already failed asks the store again, and reports
/// that call's outcome; a store that recovered meanwhile makes it succeed.
#[test]
fn ready_after_a_failed_first_lease_probes_again() {
    let rt = runtime();
    rt.block_on(async {
        let store = Wrapped::new(Duration::from_millis(1));
        store.failing.store(true, Ordering::SeqCst);
        let quota = Quota::per_second(1_000).unwrap();
        let limiter = HybridLimiter::new("flaky", quota, store.clone()).unwrap();
        let err = limiter.ready().await.unwrap_err();
        assert!(
            matches!(err, AcquireError::Store(StoreError::Timeout(_))),
            "{err:?}"
        );
        assert_eq!(limiter.stats().leases, 1, "the first failure is reported");
        store.failing.store(false, Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(2), limiter.ready())
            .await
            .expect("a probe, not a wait for the back-off to grow")
            .unwrap();
        assert!(limiter.try_acquire(1).unwrap().is_allowed());
        limiter.shutdown().await;
    });
}

/// Script calls the server has run (EVAL and EVALSHA).
fn script_calls(server: &RedisServer) -> u64 {
    let info: String = server.cmd(&["INFO", "commandstats"]);
    info.lines()
        .filter_map(|l| {
            let rest = l
                .strip_prefix("cmdstat_evalsha:calls=")
                .or_else(|| l.strip_prefix("cmdstat_eval:calls="))?;
            rest.split(',').next()?.parse::<u64>().ok()
        })
        .sum()
}

/// A pure limiter's `ready` (here through the `Limiter` trait, as code written for either
/// mode calls it) makes one store call that takes nothing: on a lazily connected store it
/// connects and reads the name's stored quota, so the first decision runs under it and finds
/// the whole burst; with nothing listening it reports the store's error.
#[test]
fn a_pure_limiters_ready_reads_the_stored_quota_and_takes_nothing() {
    async fn warm<L: Limiter>(limiter: &L) -> Result<(), AcquireError> {
        limiter.ready().await
    }
    let server = RedisServer::start();
    let rt = runtime();
    rt.block_on(async {
        let admin = RedisStore::connect(server.url()).await.unwrap();
        let stored = Quota::per_minute(5).unwrap();
        assert!(admin.init_config("pure-warm", &stored).await.unwrap().1);
        let store = server.lazy_store().await;
        let builders = Quota::per_second(1_000).unwrap();
        let limiter = RedisLimiter::new("pure-warm", builders, store).unwrap();
        assert_eq!(limiter.quota(), builders);
        let before = script_calls(&server);
        warm(&limiter).await.unwrap();
        assert_eq!(script_calls(&server) - before, 1, "one call");
        assert_eq!(limiter.quota(), stored, "the stored quota, read by ready");
        for i in 0..5 {
            let d = limiter.acquire_now(1).await.unwrap();
            assert!(d.is_allowed(), "call {i}: ready took a token? {d:?}");
        }
        assert!(!limiter.acquire_now(1).await.unwrap().is_allowed());

        let nothing = RedisServer::reserve(&[]);
        let refused = nothing.lazy_store().await;
        let limiter = RedisLimiter::new("pure-cold", builders, refused).unwrap();
        let err = warm(&limiter).await.unwrap_err();
        assert!(matches!(err, AcquireError::Store(_)), "{err:?}");

        // A limiter that must refuse a name with no stored quota says so at once.
        let strict = RedisLimiter::builder("nobody-configured-this", builders, admin.clone())
            .if_unconfigured(Unconfigured::Error)
            .build()
            .unwrap();
        let err = strict.ready().await.unwrap_err();
        assert!(matches!(err, AcquireError::Unconfigured(_)), "{err:?}");
        let configured = RedisLimiter::builder("pure-warm", builders, admin)
            .if_unconfigured(Unconfigured::Error)
            .build()
            .unwrap();
        configured.ready().await.unwrap();
    });
}
