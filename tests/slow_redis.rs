//! A slow Redis is not a limit: a caller whose lease does not come within its `lease_wait`
//! (what the HTTP layers wait for a new key's first lease) is answered by the failure
//! policy, as for a failed call — never denied as if the store had refused it. What the policy
//! admits so is a debt the late lease repays, so the key still admits at most its burst.
//! Redis is made slow for real: `CLIENT PAUSE` holds every client's commands for 400 ms, longer
//! than the wait (50 ms) and shorter than these stores' timeouts (2 s), so the lease lands.

mod support;

use std::time::Duration;

use ratelease::{
    AcquireError, Decision, FailurePolicy, HybridLimiter, KeyedHybridLimiter, Quota, RedisStore,
    StoreError,
};
use support::RedisServer;

const WAIT: Duration = Duration::from_millis(50);
const PAUSE: Duration = Duration::from_millis(400);

async fn store(server: &RedisServer) -> RedisStore {
    RedisStore::builder(server.url())
        .response_timeout(Duration::from_secs(2))
        .lease_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap()
}

/// Holds every client's commands on `server` for [`PAUSE`].
fn pause(server: &RedisServer) {
    let ms = PAUSE.as_millis().to_string();
    let _: String = server.cmd(&["CLIENT", "PAUSE", &ms, "ALL"]);
}

/// Ten tokens and no refill to speak of (10 per 100 s): what a key admits is its burst.
fn quota() -> Quota {
    Quota::with_parts(10, Duration::from_secs(100), 10).unwrap()
}

fn keyed(store: RedisStore, policy: FailurePolicy) -> KeyedHybridLimiter<String, RedisStore> {
    KeyedHybridLimiter::<String, _>::builder("slow", quota(), store)
        .on_store_failure(policy)
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_new_keys_late_first_lease_is_answered_by_the_policy_and_repays_it() {
    let server = RedisServer::start();
    // The default policy (the last share learnt; for a key, its rate over `nodes_if_unknown`).
    let limiter = keyed(store(&server).await, FailurePolicy::default());
    // A key leased once: the connection is up and the script loaded.
    let warm = limiter.try_acquire_or_lease("warm", 1, Duration::from_secs(1));
    assert!(warm.await.unwrap().is_allowed());
    pause(&server);
    // Before, this was `Denied { retry_after: ~rtt }`: an HTTP 429 with `r=0` for a key that
    // had its whole burst in Redis.
    let late = limiter.try_acquire_or_lease("ada", 1, WAIT).await;
    assert_eq!(late.unwrap(), Decision::Allowed);
    assert_eq!(limiter.stats().tokens_admitted_degraded, 1);
    // Once Redis runs again the lease lands; the key then admits the rest of its burst, not a
    // whole burst more.
    let mut admitted = 1;
    while limiter
        .try_acquire_or_lease("ada", 1, Duration::from_secs(2))
        .await
        .unwrap()
        .is_allowed()
    {
        admitted += 1;
        assert!(admitted <= 20, "runaway");
    }
    assert_eq!(admitted, 10, "the burst, once: {:?}", limiter.stats());
    limiter.shutdown().await;
}

#[tokio::test]
async fn fail_closed_answers_a_late_lease_with_the_timeout() {
    let server = RedisServer::start();
    let limiter = keyed(store(&server).await, FailurePolicy::FailClosed);
    let warm = limiter.try_acquire_or_lease("warm", 1, Duration::from_secs(1));
    assert!(warm.await.unwrap().is_allowed());
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
async fn a_hybrid_limiters_late_first_lease_is_answered_by_the_policy_and_repays_it() {
    let server = RedisServer::start();
    let store = store(&server).await;
    // Warm the connection and the script with a limiter of another name.
    let other = HybridLimiter::builder("other", quota(), store.clone())
        .build()
        .unwrap();
    other.ready().await.unwrap();
    // Built to lease on first demand: its first lease starts in the pause.
    let limiter = HybridLimiter::builder("slow", quota(), store)
        .on_store_failure(FailurePolicy::FailOpen)
        .prefetch(false)
        .build()
        .unwrap();
    pause(&server);
    let late = limiter.try_acquire_or_lease(1, WAIT).await;
    assert_eq!(late.unwrap(), Decision::Allowed);
    assert_eq!(limiter.stats().tokens_admitted_degraded, 1);
    let mut admitted = 1;
    while limiter
        .try_acquire_or_lease(1, Duration::from_secs(2))
        .await
        .unwrap()
        .is_allowed()
    {
        admitted += 1;
        assert!(admitted <= 20, "runaway");
    }
    assert_eq!(admitted, 10, "the burst, once: {:?}", limiter.stats());
    limiter.shutdown().await;
    other.shutdown().await;
}
