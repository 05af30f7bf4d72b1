//! The least-privilege ACL documented in RELIABILITY.md ("Security") is enough for every
//! Redis-backed type, and a user without it gets a typed `NoPermission` error with Redis left
//! untouched.

mod support;

use std::time::Duration;

use ratelease::{
    AcquireError, Algorithm, ConcurrencyLimiter, FailurePolicy, HybridLimiter, LeaseRequest,
    LeaseStore, LockError, NodeLease, Quota, RedisLimiter, RedisLock, RedisStore, ReleaseRequest,
    StoreError,
};
use support::RedisServer;

/// The ACL rules of RELIABILITY.md, "Security" (keep the two in step): the script commands,
/// exactly the commands `lua/*.lua` call (Redis 7 checks ACLs inside scripts), the two
/// read-only commands `RedisLock` sends itself, and pub/sub on the lock channels; all on the
/// `ratelease:` prefix.
const LEAST_PRIVILEGE: &[&str] = &[
    "resetkeys",
    "~ratelease:*",
    "resetchannels",
    "&ratelease:*",
    "nocommands",
    "+evalsha",
    "+eval",
    "+script|load",
    // lua/token_bucket.lua (+ PTTL, below; lua/concurrency.lua needs: TIME HGET HSET HDEL ZADD
    // ZREM ZRANGE ZRANGEBYSCORE DEL PEXPIRE)
    "+time",
    "+get",
    "+set",
    "+hmget",
    "+hget",
    "+hset",
    "+hdel",
    "+zadd",
    "+zrem",
    "+zrange",
    "+zrangebyscore",
    "+zcard",
    "+pttl",
    "+del",
    "+pexpire",
    // lua/sliding_window.lua (+ the above; fixed_window.lua and leaky_bucket.lua use only
    // commands above)
    "+zremrangebyscore",
    // lua/lock.lua (+ HGET, HSET, DEL, PEXPIRE above)
    "+exists",
    "+hexists",
    "+hincrby",
    "+incr",
    "+publish",
    // RedisLock waiters
    "+subscribe",
    "+unsubscribe",
];

fn create_user(server: &RedisServer, user: &str, rules: &[&str]) {
    let mut args = vec!["ACL", "SETUSER", user, "reset", "on", ">secret"];
    args.extend_from_slice(rules);
    let _: () = server.cmd(&args);
}

fn url(server: &RedisServer, user: &str) -> String {
    format!(
        "redis://{user}:secret@127.0.0.1:{}/",
        server.port().unwrap()
    )
}

async fn store(server: &RedisServer, user: &str) -> RedisStore {
    RedisStore::builder(url(server, user))
        .response_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_without_zcard_still_leases_and_reports_no_leaser_count() {
    // The ACL documented before the script counted leasers on every node's lease: the count
    // is refused, the lease is answered (not written and then failed), and says "not known".
    let server = RedisServer::start();
    let rules: Vec<&str> = LEAST_PRIVILEGE
        .iter()
        .copied()
        .filter(|r| *r != "+zcard")
        .collect();
    assert_eq!(rules.len() + 1, LEAST_PRIVILEGE.len());
    create_user(&server, "old-acl", &rules);
    let quota = Quota::per_second(100).unwrap();
    let old = store(&server, "old-acl").await;
    let node = |id| NodeLease {
        id,
        held: 0,
        demand_mtps: 10_000,
        horizon: Duration::from_millis(100),
        ttl: Duration::from_secs(10),
        rate_mtps: 0,
        release_seq: 0,
    };
    for id in [1, 2] {
        let reply = old
            .lease("old-acl", &quota, &LeaseRequest::new(10, 1).by(node(id)))
            .await
            .unwrap();
        assert_eq!((reply.granted, reply.leasers), (10, 0), "{reply:?}");
    }
    // Anonymous callers beside the leasers are one more claimant where the count is known,
    // but do not make an unknown count read as one.
    old.lease("old-acl", &quota, &LeaseRequest::new(1, 1))
        .await
        .unwrap();
    let reply = old
        .lease("old-acl", &quota, &LeaseRequest::new(10, 1).by(node(1)))
        .await
        .unwrap();
    assert_eq!(reply.leasers, 0, "{reply:?}");
    // The documented ACL counts them, and the anonymous callers as one more.
    create_user(&server, "new-acl", LEAST_PRIVILEGE);
    let reply = store(&server, "new-acl")
        .await
        .lease("old-acl", &quota, &LeaseRequest::new(10, 1).by(node(3)))
        .await
        .unwrap();
    assert_eq!((reply.granted, reply.leasers), (10, 4), "{reply:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_without_pttl_still_leases_and_the_leasers_keys_still_outlive_the_bucket() {
    // The ACL documented before the script read the expiry set's PTTL: the read is refused
    // and taken as "renew their expiry", on every call.
    let server = RedisServer::start();
    let rules: Vec<&str> = LEAST_PRIVILEGE
        .iter()
        .copied()
        .filter(|r| *r != "+pttl")
        .collect();
    assert_eq!(rules.len() + 1, LEAST_PRIVILEGE.len());
    create_user(&server, "no-pttl", &rules);
    let quota = Quota::per_second(100).unwrap();
    let store = store(&server, "no-pttl").await;
    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
    for i in 0..6u64 {
        let lease = LeaseRequest::new(5, 1).by(NodeLease {
            id: i % 2,
            held: 0,
            demand_mtps: 10_000,
            horizon: Duration::from_millis(100),
            ttl: Duration::from_secs(10),
            rate_mtps: 0,
            release_seq: 0,
        });
        let reply = store.lease("no-pttl", &quota, &lease).await.unwrap();
        assert_eq!(reply.granted, 5, "{reply:?}");
    }
    let key = store.key("no-pttl");
    let at = |k: &str| -> i64 { server.cmd(&["PEXPIRETIME", k]) };
    let bucket = at(&key);
    for k in [format!("{key}:leasers"), format!("{key}:expiry")] {
        assert!(bucket > 0 && at(&k) >= bucket, "{k}: {} < {bucket}", at(&k));
    }
    // Every call renewed both keys' expiry: 6 calls, 12 PEXPIREs.
    assert_eq!(server.command_calls("pexpire"), 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_acl_runs_every_limiter_and_the_lock() {
    let server = RedisServer::start();
    create_user(&server, "ratelease", LEAST_PRIVILEGE);
    let quota = Quota::new(1, Duration::from_secs(3600))
        .unwrap()
        .with_burst(20)
        .unwrap();

    // Pure mode, also after SCRIPT FLUSH (the reload needs SCRIPT LOAD).
    let pure = RedisLimiter::new("acl", quota, store(&server, "ratelease").await).unwrap();
    assert!(pure.acquire_now(5).await.unwrap().is_allowed());
    let _: () = server.cmd(&["SCRIPT", "FLUSH"]);
    assert!(pure.acquire_now(5).await.unwrap().is_allowed());

    // Hybrid mode with node records (leasers hash, expiry index, releases); and a fixed
    // window leased in batches, the unused ones returned on shutdown.
    let window = Quota::per_minute(20).unwrap();
    for (algorithm, quota) in [
        (Algorithm::TokenBucket, quota),
        (Algorithm::FixedWindow, window),
    ] {
        let hybrid = HybridLimiter::builder("acl", quota, store(&server, "ratelease").await)
            .algorithm(algorithm)
            .on_store_failure(FailurePolicy::FailClosed)
            .build()
            .unwrap();
        hybrid.acquire(3).await.unwrap();
        hybrid.shutdown().await;
        assert_eq!(hybrid.stats().store_errors, 0, "{:?}", hybrid.stats());
    }
    assert!(!pure.acquire_now(20).await.unwrap().is_allowed());

    // The other algorithms in pure mode: a sliding log partly left behind (trimmed), a fixed
    // window that ended, a funnel that leaked; peeks; leases given back in full (deleted).
    let short = Quota::new(10, Duration::from_millis(50)).unwrap();
    let algorithms = [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::LeakyBucket,
    ];
    for algorithm in algorithms {
        let store = store(&server, "ratelease").await;
        let pure = RedisLimiter::builder("acl-algo", short, store.clone())
            .algorithm(algorithm)
            .build()
            .unwrap();
        assert!(pure.acquire_now(4).await.unwrap().is_allowed());
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(pure.acquire_now(2).await.unwrap().is_allowed());
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(
            pure.acquire_now(8).await.unwrap().is_allowed(),
            "{algorithm}"
        );
        assert!(pure.available_permits().await.unwrap() <= 2, "{algorithm}");
        let lease = LeaseRequest::new(3, 3).algorithm(algorithm);
        let got = store.lease("acl-back", &short, &lease).await.unwrap();
        let back = ReleaseRequest::new(3)
            .algorithm(algorithm)
            .leased_at(got.at);
        let r = store.release("acl-back", &short, &back).await.unwrap();
        assert_eq!(r.remaining, 10, "{algorithm}");
    }
    let keys: Vec<String> = server.cmd(&["KEYS", "ratelease:*"]);
    for key in [
        "ratelease:{acl-algo}:fw",
        "ratelease:{acl-algo}:sw",
        "ratelease:{acl}:fw",
    ] {
        assert!(keys.contains(&key.to_string()), "{key} in {keys:?}");
    }

    // The concurrency limit, pure and hybrid: acquire, release, renew on shutdown.
    for batch in [None, Some(2)] {
        let b = ConcurrencyLimiter::builder("acl", 2, store(&server, "ratelease").await)
            .on_store_failure(FailurePolicy::FailClosed);
        let conc = match batch {
            Some(batch) => b.hybrid(batch).build().unwrap(),
            None => b.build().unwrap(),
        };
        let permit = conc.acquire(2).await.unwrap();
        assert!(conc.acquire_now(1).await.unwrap().is_none());
        drop(permit);
        conc.shutdown().await;
        assert_eq!(conc.stats().store_errors, 0, "{:?}", conc.stats());
    }

    // The lock: acquire, re-enter, inspect, wait for an unlock (subscribe + publish).
    let lock = RedisLock::builder(url(&server, "ratelease"), "acl")
        .lease_time(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let (a, b) = (lock.new_owner(), lock.new_owner());
    let held = lock.lock(&a).await.unwrap();
    assert_eq!(lock.hold_count(&a).await.unwrap(), 1);
    assert!(lock.is_locked().await.unwrap());
    let waiter = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.try_lock_for(&b, Duration::from_secs(5)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    held.unlock().await.unwrap();
    let got = waiter.await.unwrap().unwrap().expect("waiter got the lock");
    got.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
}

#[tokio::test]
async fn a_user_without_the_acl_gets_a_typed_error_and_changes_nothing() {
    let server = RedisServer::start();
    let quota = Quota::per_second(10).unwrap();
    // Right commands, wrong key pattern; no EVALSHA; commands the scripts call first missing
    // (TIME in the bucket script, INCR in the lock script: denied before any write).
    let other_keys: Vec<&str> = LEAST_PRIVILEGE
        .iter()
        .map(|r| match *r {
            "~ratelease:*" => "~other:*",
            "&ratelease:*" => "&other:*",
            r => r,
        })
        .collect();
    create_user(&server, "other-keys", &other_keys);
    let no_evalsha: Vec<&str> = LEAST_PRIVILEGE
        .iter()
        .copied()
        .filter(|r| *r != "+evalsha")
        .collect();
    create_user(&server, "no-evalsha", &no_evalsha);
    let no_time: Vec<&str> = LEAST_PRIVILEGE
        .iter()
        .copied()
        .filter(|r| *r != "+time" && *r != "+incr")
        .collect();
    create_user(&server, "no-time-incr", &no_time);

    for user in ["other-keys", "no-evalsha", "no-time-incr"] {
        for algorithm in Algorithm::ALL {
            let pure = RedisLimiter::builder("x", quota, store(&server, user).await)
                .algorithm(algorithm)
                .build()
                .unwrap();
            let err = pure.acquire_now(1).await.unwrap_err();
            assert!(
                matches!(err, AcquireError::Store(StoreError::NoPermission(_))),
                "{user} {algorithm}: {err:?}"
            );
            assert!(err.to_string().contains("store failed"), "{err}");
        }

        let hybrid = HybridLimiter::builder("x", quota, store(&server, user).await)
            .on_store_failure(FailurePolicy::FailClosed)
            .prefetch(false)
            .build()
            .unwrap();
        let err = tokio::time::timeout(Duration::from_secs(5), hybrid.acquire(1))
            .await
            .expect("a denied lease ends the wait")
            .unwrap_err();
        assert!(
            matches!(err, AcquireError::Store(StoreError::NoPermission(_))),
            "{user}: {err:?}"
        );
        hybrid.abort();

        let conc = ConcurrencyLimiter::builder("x", 2, store(&server, user).await)
            .on_store_failure(FailurePolicy::FailClosed)
            .build()
            .unwrap();
        let err = conc.acquire_now(1).await.unwrap_err();
        assert!(
            matches!(err, AcquireError::Store(StoreError::NoPermission(_))),
            "{user}: {err:?}"
        );
        conc.abort();

        let lock = RedisLock::connect(url(&server, user), "x").await.unwrap();
        let err = lock.try_lock(&lock.new_owner()).await.unwrap_err();
        assert!(matches!(err, LockError::NoPermission(_)), "{user}: {err:?}");
    }
    let keys: u64 = server.cmd(&["DBSIZE"]);
    assert_eq!(keys, 0, "a denied call wrote to Redis");
}

/// The bucket script reads its state with a `GET` it is allowed to fail (a key of another
/// type, such as the hash an earlier version wrote, reads as absent): a `GET` the ACL refuses
/// must fail the call, never read as a full bucket.
#[tokio::test]
async fn a_refused_read_fails_the_call_instead_of_reading_a_full_bucket() {
    let server = RedisServer::start();
    create_user(&server, "ratelease", LEAST_PRIVILEGE);
    let no_get: Vec<&str> = LEAST_PRIVILEGE
        .iter()
        .copied()
        .filter(|r| *r != "+get")
        .collect();
    create_user(&server, "no-get", &no_get);
    let quota = Quota::per_hour(1).unwrap().with_burst(3).unwrap();
    let full = RedisLimiter::new("empty", quota, store(&server, "ratelease").await).unwrap();
    assert!(full.acquire_now(3).await.unwrap().is_allowed());
    assert!(!full.acquire_now(1).await.unwrap().is_allowed());
    let refused = RedisLimiter::new("empty", quota, store(&server, "no-get").await).unwrap();
    let err = refused.acquire_now(1).await.unwrap_err();
    assert!(
        matches!(err, AcquireError::Store(StoreError::NoPermission(_))),
        "{err:?}"
    );
    assert!(
        !full.acquire_now(1).await.unwrap().is_allowed(),
        "still empty"
    );
}
