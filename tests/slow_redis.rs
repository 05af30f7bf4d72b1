//! A slow Redis is not a limit: a caller whose lease does not come within its `lease_wait`
//! (what the HTTP layers wait for a new key's first lease) is answered by the failure
//! policy, as for a failed call — never denied as if the store had refused it. Redis is made
//! slow for real: `CLIENT PAUSE` holds every client's commands for 400 ms, longer than the
//! wait (50 ms) and than the store's lease timeout (150 ms by default).

mod support;

use std::time::{Duration, Instant};

use ratelease::{
    AcquireError, Decision, FailurePolicy, HybridLimiter, KeyedHybridLimiter, Quota, RedisStore,
    StoreError,
};
use support::RedisServer;

const WAIT: Duration = Duration::from_millis(50);

async fn store(server: &RedisServer) -> RedisStore {
    RedisStore::builder(server.url()).connect().await.unwrap()
}

/// Holds every client's commands on `server` for 400 ms.
fn pause(server: &RedisServer) {
    let _: String = server.cmd(&["CLIENT", "PAUSE", "400", "ALL"]);
}

fn keyed(store: RedisStore, policy: FailurePolicy) -> KeyedHybridLimiter<String, RedisStore> {
    let quota = Quota::per_second(100).unwrap();
    KeyedHybridLimiter::<String, _>::builder("slow", quota, store)
        .on_store_failure(policy)
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_new_keys_first_request_is_answered_by_the_policy_when_its_lease_is_late() {
    let server = RedisServer::start();
    // The default policy (the last share learnt; for a key, its rate over `nodes_if_unknown`).
    let limiter = keyed(store(&server).await, FailurePolicy::default());
    // A key leased once: the connection is up and the script loaded.
    let warm = limiter
        .try_acquire_or_lease("warm", 1, Duration::from_secs(1))
        .await;
    assert!(warm.unwrap().is_allowed());
    pause(&server);
    let start = Instant::now();
    let late = limiter.try_acquire_or_lease("ada", 1, WAIT).await;
    let waited = start.elapsed();
    // Before, this was `Denied { retry_after: ~rtt }`: an HTTP 429 with `r=0` for a key that
    // had its whole burst in Redis.
    assert_eq!(late.unwrap(), Decision::Allowed);
    assert!(
        (WAIT..WAIT * 3).contains(&waited),
        "answered once the wait was over, after {waited:?}"
    );
    let stats = limiter.stats();
    assert_eq!(stats.tokens_admitted_degraded, 1, "{stats:?}");
    assert_eq!(stats.store_errors, 0, "no call had failed yet: {stats:?}");
    limiter.shutdown().await;
}

#[tokio::test]
async fn fail_closed_answers_a_late_lease_with_the_timeout() {
    let server = RedisServer::start();
    let limiter = keyed(store(&server).await, FailurePolicy::FailClosed);
    let warm = limiter
        .try_acquire_or_lease("warm", 1, Duration::from_secs(1))
        .await;
    assert!(warm.unwrap().is_allowed());
    pause(&server);
    let late = limiter.try_acquire_or_lease("ada", 1, WAIT).await;
    // An error (an HTTP 503), not a refusal (a 429): the store gave no answer.
    assert!(
        matches!(late, Err(AcquireError::Store(StoreError::Timeout(d))) if d == WAIT),
        "{late:?}"
    );
    assert_eq!(limiter.stats().tokens_admitted_degraded, 0);
    limiter.shutdown().await;
}

#[tokio::test]
async fn a_hybrid_limiters_late_first_lease_is_answered_by_the_policy() {
    let server = RedisServer::start();
    let store = store(&server).await;
    // Warm the connection and the script with a limiter of another name.
    let quota = Quota::per_second(100).unwrap();
    let other = HybridLimiter::builder("other", quota, store.clone())
        .build()
        .unwrap();
    other.ready().await.unwrap();
    // Built to lease on first demand: its first lease starts in the pause.
    let limiter = HybridLimiter::builder("slow", quota, store)
        .on_store_failure(FailurePolicy::FailOpen)
        .prefetch(false)
        .build()
        .unwrap();
    pause(&server);
    let late = limiter.try_acquire_or_lease(1, WAIT).await;
    assert_eq!(late.unwrap(), Decision::Allowed);
    let stats = limiter.stats();
    assert_eq!(stats.tokens_admitted_degraded, 1, "{stats:?}");
    limiter.shutdown().await;
    other.shutdown().await;
}
