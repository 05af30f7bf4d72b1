//! Keyed limiters on virtual time: a new key's first lease, independent exact budgets, hot
//! keys leasing batches while cold keys lease exactly, idle eviction returning tokens to the
//! store, the live-key cap under a flood, waiting callers, store failures, shutdown and per-key
//! central configs.
//!
//! The store is the real [`MemoryStore`] on tokio's paused clock (with [`Wrapped`] adding a
//! round trip and a failure switch where that matters). `tests/keyed_redis.rs` runs the
//! fleet-wide checks against a real redis-server.

use std::sync::atomic::Ordering;
use std::time::Duration;

use ratelease::{
    AcquireError, ConfigStore, Decision, FailurePolicy, KeyedHybridLimiter, KeyedLimiter,
    KeyedRedisLimiter, KeyedStats, LeaseRequest, LeaseStore, LocalAnswer, MemoryStore, Quota,
    TokioClock,
};
use tokio::time::{sleep, Instant};

mod wrapped;
use wrapped::{Never, Wrapped};

const RTT: Duration = Duration::from_micros(100);

async fn settle() {
    sleep(Duration::from_millis(5)).await;
}

fn memory() -> MemoryStore {
    MemoryStore::with_clock(TokioClock::new())
}

/// Whether `bucket` holds its whole burst (taking it).
async fn takes_whole_burst(store: &MemoryStore, bucket: &str, quota: &Quota) -> bool {
    let all = LeaseRequest::exact(quota.burst());
    store.lease(bucket, quota, &all).await.unwrap().granted == quota.burst()
}

/// A keyed limiter with `String` keys and default settings.
fn keyed<S: LeaseStore>(name: &str, quota: Quota, store: S) -> KeyedHybridLimiter<String, S> {
    KeyedHybridLimiter::new(name, quota, store).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_new_key_is_denied_once_then_served_from_an_exact_lease() {
    let store = Wrapped::new(RTT);
    let quota = Quota::per_second(100).unwrap();
    let limiter = keyed("first", quota, store.clone());
    let first = limiter.try_acquire("alice", 3).unwrap();
    let one_round_trip = Duration::from_millis(1);
    assert!(
        matches!(first, Decision::Denied { retry_after } if retry_after <= one_round_trip),
        "{first:?}"
    );
    assert_eq!(limiter.live_keys(), 1);
    settle().await;
    assert_eq!(limiter.available("alice"), 3, "exactly what was asked");
    assert!(limiter.try_acquire("alice", 3).unwrap().is_allowed());
    assert_eq!(limiter.available("alice"), 0);
    let stats = limiter.stats();
    assert_eq!(
        (stats.leases, stats.tokens_leased, stats.keys_created),
        (1, 3, 1)
    );
    // The store's bucket for alice gave exactly those 3.
    let rest = store
        .inner
        .lease(
            &limiter.bucket_name("alice"),
            &quota,
            &LeaseRequest::new(100, 1),
        )
        .await
        .unwrap();
    assert_eq!(rest.granted, 97);
    assert!(matches!(
        limiter.try_acquire("alice", 101),
        Err(AcquireError::ExceedsBurst { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn every_key_has_its_own_budget_as_exact_as_pure_mode() {
    let store = memory();
    // 5 per minute per key, asked every 100 ms for two minutes by sync callers.
    let quota = Quota::per_minute(5).unwrap();
    let keyed = KeyedHybridLimiter::<u64, _>::builder("sms", quota, store.clone())
        .build()
        .unwrap();
    let pure = KeyedRedisLimiter::new("sms-pure", quota, store.clone()).unwrap();
    let (mut hybrid, mut exact) = ([0u64; 3], [0u64; 3]);
    for _ in 0..1_200 {
        for key in 0..3u64 {
            if keyed.try_acquire(&key, 1).unwrap().is_allowed() {
                hybrid[key as usize] += 1;
            }
            if pure.acquire_now(&key, 1).await.unwrap().is_allowed() {
                exact[key as usize] += 1;
            }
        }
        sleep(Duration::from_millis(100)).await;
    }
    // 120 s: the burst of 5, plus one token every 12 s up to 119.9 s.
    assert_eq!(exact, [14; 3], "pure mode is the reference");
    for key in 0..3 {
        assert!(
            hybrid[key] <= exact[key] && hybrid[key] + 1 >= exact[key],
            "key {key}: {hybrid:?} vs pure {exact:?}"
        );
    }
    // The denials were answered locally: about one store call per token earned, not one per
    // call (3 600 calls).
    let stats = keyed.stats();
    assert!(stats.leases <= 3 * 2 * 15, "{stats:?}");
    // A key nobody used still has its whole burst.
    let fresh = 99u64;
    for _ in 0..5 {
        let d = keyed
            .try_acquire_for(&fresh, 1, Duration::from_millis(10))
            .await
            .unwrap();
        assert!(d.is_allowed());
    }
    assert!(!keyed
        .try_acquire_for(&fresh, 1, Duration::from_millis(10))
        .await
        .unwrap()
        .is_allowed());
}

#[tokio::test(start_paused = true)]
async fn a_hot_key_leases_batches_and_a_cold_key_leases_exactly() {
    let store = Wrapped::new(RTT);
    let quota = Quota::per_second(10_000).unwrap();
    let limiter = keyed("mixed", quota, store.clone());
    // Hot: 5 000 calls per second for two seconds (tokio's timer has millisecond ticks).
    let mut admitted = 0;
    for _ in 0..2_000 {
        for _ in 0..5 {
            if limiter.try_acquire("hot", 1).unwrap().is_allowed() {
                admitted += 1;
            }
        }
        sleep(Duration::from_millis(1)).await;
    }
    let hot = limiter.stats();
    // Only the first few milliseconds are denied: an exact first lease, then batches as soon
    // as the key's demand is measured (round trips are 2 ms on tokio's millisecond timer).
    assert!(admitted >= 9_950, "only the first calls wait: {admitted}");
    // About 1.25 horizons (250 ms) of demand per lease: ~1 560 tokens.
    assert!(hot.leases <= 15, "batches, not one lease per call: {hot:?}");
    // Idle for a second: its tokens go back to the store.
    sleep(Duration::from_secs(2)).await;
    assert_eq!(limiter.available("hot"), 0);
    let idle = limiter.stats();
    assert!(idle.tokens_released > 0, "{idle:?}");
    assert_eq!(
        idle.tokens_leased - idle.tokens_released,
        admitted,
        "every leased token was spent or returned"
    );
    // Cold: one call per second, waiting for it.
    for _ in 0..10 {
        limiter.acquire("cold", 1).await.unwrap();
        sleep(Duration::from_secs(1)).await;
    }
    let cold = limiter.stats();
    assert_eq!(cold.leases - idle.leases, 10, "one lease per call");
    assert_eq!(
        cold.tokens_leased - idle.tokens_leased,
        10,
        "each exactly what was asked: nothing stranded"
    );
}

#[tokio::test(start_paused = true)]
async fn idle_keys_are_evicted_and_their_tokens_returned_to_the_store() {
    let store = memory();
    // Ten tokens an hour: nothing refills meanwhile, so the store's count shows the return.
    let quota = Quota::new(10, Duration::from_secs(3_600)).unwrap();
    let limiter = KeyedHybridLimiter::<String, _>::builder("idle", quota, store.clone())
        .idle_ttl(Duration::from_secs(2))
        .give_back_after(Duration::from_secs(3_600))
        .build()
        .unwrap();
    assert!(!limiter.try_acquire("k", 3).unwrap().is_allowed());
    settle().await;
    assert_eq!(limiter.available("k"), 3, "leased, never spent");
    sleep(Duration::from_secs(1)).await;
    assert_eq!(limiter.live_keys(), 1, "not idle long enough");
    sleep(Duration::from_millis(2_500)).await;
    let stats = limiter.stats();
    assert_eq!(limiter.live_keys(), 0, "{stats:?}");
    assert_eq!((stats.evicted_idle, stats.tokens_released), (1, 3));
    // All ten are back in the store.
    assert!(takes_whole_burst(&store, &limiter.bucket_name("k"), &quota).await);

    // Tokens idle for `give_back_after` go back while the key stays.
    let limiter = KeyedHybridLimiter::<String, _>::builder("give", quota, store.clone())
        .give_back_after(Duration::from_millis(500))
        .build()
        .unwrap();
    assert!(!limiter.try_acquire("k", 4).unwrap().is_allowed());
    settle().await;
    assert_eq!(limiter.available("k"), 4);
    sleep(Duration::from_secs(2)).await;
    assert_eq!(limiter.available("k"), 0);
    assert_eq!(limiter.live_keys(), 1, "the TTL is an hour and ten seconds");
    assert_eq!(limiter.stats().tokens_released, 4);
    assert!(takes_whole_burst(&store, &limiter.bucket_name("k"), &quota).await);
}

#[tokio::test(start_paused = true)]
async fn the_live_key_cap_holds_under_a_flood_and_keys_in_use_stay() {
    let quota = Quota::per_second(1_000_000).unwrap();
    let limiter = KeyedHybridLimiter::<String, _>::builder("flood", quota, memory())
        .max_keys(64)
        .build()
        .unwrap();
    limiter.acquire("legit", 1).await.unwrap();
    let (mut legit, mut max_live) = (0, 0);
    for i in 0..5_000 {
        // One-shot keys: the flood never comes back for its tokens.
        let _ = limiter.try_acquire(&format!("flood-{i}"), 1).unwrap();
        max_live = max_live.max(limiter.live_keys());
        if limiter.try_acquire("legit", 1).unwrap().is_allowed() {
            legit += 1;
        }
        sleep(Duration::from_micros(50)).await;
    }
    let stats = limiter.stats();
    assert!(max_live <= 64, "cap exceeded: {max_live}");
    assert!(stats.keys_created > 2_000, "the flood got in: {stats:?}");
    assert!(
        stats.refused_at_cap > 0 && stats.evicted_at_cap > 0,
        "the cap was reached and room was made: {stats:?}"
    );
    // Never-used flood keys are evicted first: the key in use stays and keeps its tokens.
    assert!(
        legit >= 4_900,
        "the legitimate key was served {legit} of 5 000 times"
    );
}

#[tokio::test(start_paused = true)]
async fn async_callers_wait_one_round_trip_or_get_the_stores_answer() {
    let store = Wrapped::new(Duration::from_millis(2));
    let quota = Quota::per_second(100).unwrap();
    let limiter = KeyedHybridLimiter::<String, _>::builder("wait", quota, store.clone())
        .max_keys(1)
        .build()
        .unwrap();
    let t0 = Instant::now();
    limiter.acquire("a", 100).await.unwrap();
    assert_eq!(t0.elapsed(), Duration::from_millis(2), "one round trip");
    // The store says 50 more take 500 ms: a 100 ms timeout is answered at once.
    let t0 = Instant::now();
    let d = limiter
        .try_acquire_for("a", 50, Duration::from_millis(100))
        .await
        .unwrap();
    assert!(
        matches!(d, Decision::Denied { retry_after } if retry_after >= Duration::from_millis(490)),
        "{d:?}"
    );
    assert_eq!(t0.elapsed(), Duration::from_millis(2));
    // A longer timeout waits for them.
    let d = limiter
        .try_acquire_for("a", 50, Duration::from_secs(1))
        .await
        .unwrap();
    assert!(d.is_allowed());
    assert!(t0.elapsed() >= Duration::from_millis(500));
    // At the cap (one key) another key is still served: its lease goes straight to it.
    let d = limiter
        .try_acquire_for("b", 1, Duration::from_millis(10))
        .await
        .unwrap();
    assert!(d.is_allowed());
    assert!(limiter.live_keys() <= 1);
    // Through the trait, as middleware would call it.
    async fn via_trait(l: &impl KeyedLimiter<String>) -> Result<(), AcquireError> {
        l.acquire("c", 1).await
    }
    via_trait(&limiter).await.unwrap();
}

/// Admitted calls of 1 000 over one second on a key whose one-token lease is spent, with the
/// store failing throughout.
async fn admitted_while_failing(policy: FailurePolicy) -> (u64, KeyedStats) {
    let store = Wrapped::new(RTT);
    let quota = Quota::per_second(1_000).unwrap().with_burst(100).unwrap();
    let limiter = KeyedHybridLimiter::<String, _>::builder("failing", quota, store.clone())
        .on_store_failure(policy)
        .build()
        .unwrap();
    limiter.acquire("k", 1).await.unwrap();
    store.failing.store(true, Ordering::SeqCst);
    let mut admitted = 0;
    for _ in 0..1_000 {
        if limiter.try_acquire("k", 1).unwrap().is_allowed() {
            admitted += 1;
        }
        sleep(Duration::from_millis(1)).await;
    }
    if policy == FailurePolicy::FailClosed {
        let e = limiter.acquire("k", 1).await.unwrap_err();
        assert!(matches!(e, AcquireError::Store(_)), "{e:?}");
    }
    let stats = limiter.stats();
    // The store answers again: the circuit closes within the longest back-off.
    store.failing.store(false, Ordering::SeqCst);
    let t0 = Instant::now();
    while limiter.stats().circuit_open {
        let _ = limiter.try_acquire("k", 1);
        sleep(Duration::from_millis(1)).await;
        assert!(
            t0.elapsed() < Duration::from_millis(600),
            "circuit still open"
        );
    }
    (admitted, stats)
}

#[tokio::test(start_paused = true)]
async fn each_failure_policy_answers_as_documented_and_the_circuit_closes_again() {
    let (closed, stats) = admitted_while_failing(FailurePolicy::FailClosed).await;
    assert_eq!(closed, 0, "{stats:?}");
    assert!(stats.store_errors > 0);
    // One probe per back-off (10 ms doubling to 500 ms), not one store call per denied call.
    assert!(stats.leases <= 15, "{stats:?}");
    let (open, stats) = admitted_while_failing(FailurePolicy::FailOpen).await;
    assert!(open >= 995, "fail open admits: {open}");
    assert_eq!(stats.tokens_admitted_degraded, open);
    // Four nodes share the limit: this one enforces 250/s with a burst of 25, per key.
    let (local, _) = admitted_while_failing(FailurePolicy::local_fallback(4)).await;
    assert!((260..=280).contains(&local), "local fallback: {local}");
}

#[tokio::test(start_paused = true)]
async fn shutdown_gives_every_keys_tokens_back() {
    let store = memory();
    let quota = Quota::new(10, Duration::from_secs(3_600)).unwrap();
    let limiter = KeyedHybridLimiter::<u32, _>::builder("bye", quota, store.clone())
        .build()
        .unwrap();
    for key in 0..3u32 {
        assert!(!limiter.try_acquire(&key, 4).unwrap().is_allowed());
    }
    settle().await;
    assert_eq!(limiter.stats().tokens_leased, 12);
    limiter.shutdown().await;
    assert_eq!(limiter.stats().tokens_released, 12);
    assert_eq!(limiter.live_keys(), 0);
    for key in 0..3u32 {
        let bucket = limiter.bucket_name(&key);
        assert!(
            takes_whole_burst(&store, &bucket, &quota).await,
            "key {key}"
        );
    }
    assert!(matches!(
        limiter.try_acquire(&0, 1),
        Err(AcquireError::Closed)
    ));
    assert!(matches!(
        limiter.acquire(&7, 1).await,
        Err(AcquireError::Closed)
    ));
}

#[tokio::test(start_paused = true)]
async fn a_config_stored_under_a_keys_bucket_name_applies_to_that_key() {
    let store = memory();
    let limiter = KeyedHybridLimiter::<String, _>::builder(
        "cfg",
        Quota::per_minute(5).unwrap(),
        store.clone(),
    )
    .build()
    .unwrap();
    store
        .modify_config(&limiter.bucket_name("vip"), &Quota::per_minute(50).unwrap())
        .await
        .unwrap();
    let mut admitted = [0; 2];
    for _ in 0..60 {
        for (i, key) in ["vip", "regular"].into_iter().enumerate() {
            let d = limiter
                .try_acquire_for(key, 1, Duration::from_millis(1))
                .await
                .unwrap();
            admitted[i] += u32::from(d.is_allowed());
        }
    }
    assert_eq!(admitted, [50, 5]);
}

/// A key new to this process while the circuit is open gets the policy's answer at its first
/// request, as a key seen before does: admitted by a local fallback (its own bucket of the
/// fallback rate), denied failing closed. It was denied for want of the key's state.
#[tokio::test(start_paused = true)]
async fn a_new_keys_first_request_in_an_outage_is_the_policys_to_answer() {
    for (policy, admits) in [
        (FailurePolicy::local_fallback(4), true),
        (FailurePolicy::last_known_share(1), true),
        (FailurePolicy::FailOpen, true),
        (FailurePolicy::FailClosed, false),
    ] {
        let store = Wrapped::new(RTT);
        let quota = Quota::per_second(1_000).unwrap().with_burst(100).unwrap();
        let limiter =
            KeyedHybridLimiter::<String, _>::builder("new-in-outage", quota, store.clone())
                .on_store_failure(policy)
                .build()
                .unwrap();
        store.failing.store(true, Ordering::SeqCst);
        let _ = limiter
            .try_acquire_for("seen", 1, Duration::from_millis(50))
            .await;
        assert!(limiter.stats().circuit_open, "{policy:?}");
        for key in ["a", "b", "c"] {
            let answer = limiter.try_acquire_local(key, 1).unwrap();
            if admits {
                assert_eq!(answer, LocalAnswer::Allowed, "{policy:?}, key {key}");
            } else {
                assert!(
                    matches!(answer, LocalAnswer::Denied { .. }),
                    "{policy:?}, key {key}: {answer:?}"
                );
            }
        }
        // A local fallback's rate is the key's own: 25 a key (burst 100 over 4 nodes), then
        // its refill.
        if policy == FailurePolicy::local_fallback(4) {
            let admitted = (0..40)
                .filter(|_| limiter.try_acquire_local("d", 1).unwrap() == LocalAnswer::Allowed)
                .count();
            assert_eq!(admitted, 25);
        }
        limiter.shutdown().await;
    }
}

/// Callers that only wait (`acquire`, `try_acquire_for`) probe the store too: after an outage
/// the circuit closes without any `try_acquire` call, under every policy.
#[tokio::test(start_paused = true)]
async fn waiting_callers_alone_close_the_circuit_after_an_outage() {
    for policy in [
        FailurePolicy::FailClosed,
        FailurePolicy::FailOpen,
        FailurePolicy::local_fallback(1),
    ] {
        let store = Wrapped::new(RTT);
        let quota = Quota::per_second(1_000).unwrap().with_burst(100).unwrap();
        let limiter = KeyedHybridLimiter::<String, _>::builder("probe", quota, store.clone())
            .on_store_failure(policy)
            .build()
            .unwrap();
        store.failing.store(true, Ordering::SeqCst);
        let during = limiter
            .try_acquire_for("k", 1, Duration::from_millis(50))
            .await;
        assert!(limiter.stats().circuit_open, "{policy:?}: {during:?}");
        store.failing.store(false, Ordering::SeqCst);
        let start = Instant::now();
        while limiter.stats().circuit_open {
            assert!(
                start.elapsed() < Duration::from_secs(2),
                "{policy:?}: waiting callers never probed: {:?}",
                limiter.stats()
            );
            let _ = limiter
                .try_acquire_for("k", 1, Duration::from_millis(50))
                .await;
            sleep(Duration::from_millis(10)).await;
        }
        // Served from the store again.
        let leases = limiter.stats().leases;
        limiter.acquire("k", 1).await.unwrap();
        limiter.acquire("other", 1).await.unwrap();
        assert!(limiter.stats().leases > leases, "{policy:?}");
        limiter.shutdown().await;
    }
}

/// A `try_acquire` that queued a key's first lease, then a wait for the same key: one lease,
/// not two (the wait joins the queued one).
#[tokio::test(start_paused = true)]
async fn a_wait_joins_the_lease_a_try_acquire_queued() {
    let store = Wrapped::new(RTT);
    let quota = Quota::per_second(1_000).unwrap().with_burst(100).unwrap();
    let limiter = keyed("join", quota, store.clone());
    assert!(!limiter.try_acquire("k", 1).unwrap().is_allowed());
    let got = limiter
        .try_acquire_for("k", 1, Duration::from_millis(50))
        .await
        .unwrap();
    assert!(got.is_allowed());
    let stats = limiter.stats();
    assert_eq!(
        (stats.leases, stats.tokens_leased),
        (1, 1),
        "one exact lease: {stats:?}"
    );
    limiter.shutdown().await;
}

/// A lease wait is woken by its own key's lease alone, and counts its tokens as denied once:
/// the leases of other keys answered while it waits (nine, a millisecond apart) neither wake
/// it nor count it again, and it is served from the lease its check queued, with no lease of
/// its own.
#[tokio::test(start_paused = true)]
async fn a_lease_wait_is_woken_by_its_own_keys_lease_and_counts_its_denial_once() {
    let rtt = Duration::from_millis(10);
    let store = Wrapped::new(rtt);
    let quota = Quota::per_second(1_000).unwrap().with_burst(100).unwrap();
    let limiter = keyed("own", quota, store.clone());
    for i in 0..9 {
        let other = format!("other{i}");
        assert!(!limiter.try_acquire(other.as_str(), 1).unwrap().is_allowed());
        sleep(Duration::from_millis(1)).await;
    }
    let start = Instant::now();
    let local = limiter.try_acquire_local("k", 1).unwrap();
    assert!(matches!(local, LocalAnswer::NeedsLease { .. }), "{local:?}");
    let got = limiter
        .try_acquire_or_lease("k", 1, Duration::from_millis(50))
        .await
        .unwrap();
    assert!(got.is_allowed());
    let waited = start.elapsed();
    assert!(
        waited >= rtt && waited <= rtt + Duration::from_millis(1),
        "served when k's lease landed, after {waited:?}"
    );
    let stats = limiter.stats();
    assert_eq!(stats.leases, 10, "the wait joined k's lease: {stats:?}");
    assert_eq!(
        stats.tokens_denied,
        9 + 1 + 1,
        "each other key's check, k's check and k's wait, once each: {stats:?}"
    );
    limiter.shutdown().await;
}

/// The worker keeps time only while keys are live: a key created after an idle spell still
/// counts as just used, and is not evicted as if it had been idle all along.
#[tokio::test(start_paused = true)]
async fn a_key_created_after_an_idle_spell_is_not_evicted_at_once() {
    let quota = Quota::per_second(100).unwrap();
    let limiter = KeyedHybridLimiter::<String, _>::builder("spell", quota, memory())
        .idle_ttl(Duration::from_secs(1))
        .build()
        .unwrap();
    limiter.acquire("a", 1).await.unwrap();
    sleep(Duration::from_secs(5)).await;
    assert_eq!(limiter.live_keys(), 0, "{:?}", limiter.stats());
    // Nothing live: the worker's clock stands still through this.
    sleep(Duration::from_secs(30)).await;
    limiter.acquire("b", 1).await.unwrap();
    sleep(Duration::from_millis(600)).await;
    let stats = limiter.stats();
    assert_eq!((stats.live_keys, stats.evicted_idle), (1, 1), "{stats:?}");
    // And b goes once it really was idle for its TTL.
    sleep(Duration::from_secs(3)).await;
    assert_eq!(limiter.stats().evicted_idle, 2, "{:?}", limiter.stats());
    limiter.shutdown().await;
}

/// A large request denied for want of tokens does not make the key's next lease refuse the
/// small ones: the lease is for at least the request that asks it, and for the large one only
/// as far as the store has tokens. Under a stored config whose burst (5) is below the large
/// request (50), a small waiter was answered `ExceedsBurst` for another caller's request, or
/// the key was refused for a second while the store held tokens.
#[tokio::test(start_paused = true)]
async fn a_large_denied_request_does_not_refuse_the_small_ones_after_it() {
    let store = memory();
    let limiter =
        KeyedHybridLimiter::new("sized", Quota::per_second(100).unwrap(), store.clone()).unwrap();
    store
        .modify_config(&limiter.bucket_name("k"), &Quota::per_second(5).unwrap())
        .await
        .unwrap();
    limiter.acquire("k", 1).await.unwrap();
    assert_eq!(limiter.available("k"), 0);
    // 50 tokens at once: never there (the stored burst is 5), so denied.
    assert!(!limiter.try_acquire("k", 50).unwrap().is_allowed());
    settle().await;
    for i in 0..4 {
        let decision = limiter
            .try_acquire_for("k", 1, Duration::from_millis(100))
            .await;
        assert!(
            matches!(decision, Ok(Decision::Allowed)),
            "request {i}: {decision:?}"
        );
    }
    // A waiter's own request beyond the stored burst is its error, and only its own.
    assert!(matches!(
        limiter.acquire("k", 6).await,
        Err(AcquireError::ExceedsBurst {
            requested: 6,
            burst: 5
        })
    ));
    let decision = limiter
        .try_acquire_for("k", 1, Duration::from_millis(300))
        .await;
    assert!(matches!(decision, Ok(Decision::Allowed)), "{decision:?}");
}

/// `max_keys(usize::MAX)` — no cap — builds a limiter (it aborted the process: shards were
/// allocated for every key it could ever hold).
#[tokio::test(start_paused = true)]
async fn a_limiter_with_no_key_cap_builds_and_serves() {
    let limiter = KeyedHybridLimiter::<String, _>::builder(
        "uncapped",
        Quota::per_second(10).unwrap(),
        memory(),
    )
    .max_keys(usize::MAX)
    .build()
    .unwrap();
    limiter.acquire("k", 1).await.unwrap();
    assert_eq!(limiter.live_keys(), 1);
}

/// An error that is no outage (an ACL denial) is not answered by the failure policy: under
/// `FailOpen` the key's waiter got the error once, then the limiter asked the store again at
/// each back-off for good and never returned; and the circuit opened, admitting every other
/// caller. Now the waiter hears the error, and callers are denied.
#[tokio::test(start_paused = true)]
async fn an_error_that_is_no_outage_is_not_answered_by_the_failure_policy() {
    let store = Wrapped::new(Duration::from_millis(1));
    store.refusing.store(true, Ordering::SeqCst);
    let quota = Quota::per_second(100).unwrap();
    let limiter = KeyedHybridLimiter::<String, _>::builder("acl", quota, store.clone())
        .on_store_failure(FailurePolicy::FailOpen)
        .build()
        .unwrap();
    let waited = tokio::time::timeout(Duration::from_secs(5), limiter.acquire("k", 1)).await;
    assert!(
        matches!(
            waited,
            Ok(Err(AcquireError::Store(
                ratelease::StoreError::NoPermission(_)
            )))
        ),
        "{waited:?}"
    );
    for _ in 0..10 {
        assert!(!limiter.try_acquire("k", 1).unwrap().is_allowed());
        assert!(!limiter.try_acquire("other", 1).unwrap().is_allowed());
    }
    let stats = limiter.stats();
    assert!(!stats.circuit_open, "{stats:?}");
}

/// Ten callers wait on one key at its limit (10 a second, a burst of one). They all wake at
/// the end of the same refusal: one lease of the key in flight answers the others (its grant,
/// or its refusal kept in the key), rather than one store call per waiter each time. The new
/// key's first leases go side by side (ten calls, one granted); then one call a token: 19
/// calls where each waiter asked for itself made 55 (10 + 9 + … + 1).
#[tokio::test(start_paused = true)]
async fn waiters_on_a_key_at_its_limit_share_one_lease_call_per_retry() {
    let store = Wrapped::new(RTT);
    let quota = Quota::with_parts(10, Duration::from_secs(1), 1).unwrap();
    let limiter = keyed("waiters", quota, store.clone());
    let start = Instant::now();
    let waiters: Vec<_> = (0..10)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                limiter.acquire("k", 1).await.unwrap();
                Instant::now()
            })
        })
        .collect();
    let mut done = Vec::new();
    for w in waiters {
        done.push(w.await.unwrap() - start);
    }
    done.sort();
    // One a tenth of a second: the last of them about a second in (they did contend).
    assert!(done[9] >= Duration::from_millis(800), "{done:?}");
    let stats = limiter.stats();
    assert_eq!(stats.tokens_leased, 10, "{stats:?}");
    assert!(
        stats.leases <= 20,
        "{} lease calls for 10 tokens over {:?}: {stats:?}",
        stats.leases,
        done[9]
    );
}

/// A key whose lease failed while another key's, in flight beside it, succeeded: the success
/// closes the circuit, and the failed key's back-off goes with it. It stayed blocked for the
/// whole back-off, answered as a key at its limit (a 429 from a layer) though the store had
/// never refused it.
#[tokio::test(start_paused = true)]
async fn a_back_off_ends_when_the_circuit_closes() {
    let store = Wrapped::new(Duration::from_millis(10));
    let limiter = keyed("back-off", Quota::per_second(100).unwrap(), store.clone());
    store.failing.store(true, Ordering::SeqCst);
    assert!(!limiter.try_acquire("a", 1).unwrap().is_allowed());
    // a's call reads the switch 5 ms in; b's, sent after that, reads it off.
    sleep(Duration::from_millis(6)).await;
    store.failing.store(false, Ordering::SeqCst);
    assert!(!limiter.try_acquire("b", 1).unwrap().is_allowed());
    sleep(Duration::from_millis(14)).await;
    let stats = limiter.stats();
    assert_eq!(stats.store_errors, 1, "{stats:?}");
    assert!(!stats.circuit_open, "b's grant closed it: {stats:?}");
    assert!(
        matches!(
            limiter.try_acquire_local("a", 1).unwrap(),
            LocalAnswer::NeedsLease { .. }
        ),
        "a is not at its limit: its miss asks for a lease"
    );
    sleep(Duration::from_millis(15)).await;
    assert!(limiter.try_acquire("a", 1).unwrap().is_allowed());
}

/// An error that is no outage (an ACL denial) leaves the circuit closed; its back-off still
/// keeps the key's callers from asking the store on every miss (each would fail the same way).
#[tokio::test(start_paused = true)]
async fn an_error_that_is_no_outage_still_backs_off() {
    let store = Wrapped::new(RTT);
    let limiter = keyed("acl", Quota::per_second(100).unwrap(), store.clone());
    store.refusing.store(true, Ordering::SeqCst);
    assert!(!limiter.try_acquire("k", 1).unwrap().is_allowed());
    settle().await;
    let stats = limiter.stats();
    assert_eq!((stats.leases, stats.circuit_open), (1, false), "{stats:?}");
    for _ in 0..50 {
        assert!(!limiter.try_acquire("k", 1).unwrap().is_allowed());
        sleep(Duration::from_millis(1)).await;
    }
    // Back-off doubling from about 10 ms: a few calls, not one for each of the 50 misses.
    let stats = limiter.stats();
    assert!(stats.leases <= 6, "a lease a miss: {stats:?}");
}

/// A waiter of one token held back behind another waiter's lease of fifty, which the store
/// refuses (it has twenty): the small one is served, not given the large one's refusal.
#[tokio::test(start_paused = true)]
async fn a_small_waiter_is_not_given_a_larger_waiters_refusal() {
    let store = Wrapped::new(Duration::from_millis(10));
    let limiter = keyed("small", Quota::per_second(100).unwrap(), store.clone());
    // The key spends its whole bucket: it has measured demand, and the bucket is empty.
    limiter.acquire("k", 100).await.unwrap();
    sleep(Duration::from_millis(200)).await;
    let large = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.acquire("k", 50).await })
    };
    sleep(Duration::from_millis(1)).await;
    let t0 = Instant::now();
    limiter.acquire("k", 1).await.unwrap();
    assert!(
        t0.elapsed() < Duration::from_millis(50),
        "served after {:?}",
        t0.elapsed()
    );
    large.await.unwrap().unwrap();
}

/// The worker reads a refusal's wait of `Duration::MAX` as "not for a long time": it does not
/// panic (which would leave every key's waiters unanswered for good).
#[tokio::test(start_paused = true)]
async fn a_refusal_that_says_never_panics_nothing() {
    let limiter = KeyedHybridLimiter::builder(
        "never",
        Quota::per_second(10).unwrap(),
        Never { granted: 0 },
    )
    .build()
    .unwrap();
    for key in ["a", "b", "a"] {
        let answer = tokio::time::timeout(
            Duration::from_secs(1),
            limiter.try_acquire_for(key, 1, Duration::from_millis(50)),
        )
        .await
        .expect("unanswered");
        assert!(!answer.unwrap().is_allowed(), "{key}");
    }
    assert!(limiter.stats().over_limit > 0, "{:?}", limiter.stats());
    tokio::time::timeout(Duration::from_secs(1), limiter.shutdown())
        .await
        .expect("no shutdown");
}
