//! Central configuration and budgets against a real redis-server.
//!
//! - a fleet of hybrid limiters adopts a quota changed in Redis within one lease horizon (at
//!   its renewals, at most half a ttl, when it leases rates), and
//!   admits at most `burst + rate_old × t1 + rate_new × t2` (t1 up to the moment every instance
//!   has seen the change, which is after the store switched);
//! - a capacity cut below what is outstanding keeps `level + outstanding` within bounds;
//! - init does not overwrite; delete falls back to the builder's choice;
//! - a lease runs under a stored config that differs from the caller's quota in any one field;
//! - a config changed by another process reaches pure-mode calls within the store's config
//!   refresh, one changed through the same store at once, and in between a pure call sends
//!   the bucket's key alone (the config is not read);
//! - bad values get typed errors and leave the state alone;
//! - `Budget::PerClient` gives each client a bucket of its own, `Overall` one for all;
//! - a pure limiter's failure policy answers an outage at the share of the stored quota.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelease::{
    AcquireError, AdaptiveLease, Budget, ConfigStore, FailurePolicy, FakeClock, HybridLimiter,
    LeaseRequest, LeaseStore, NodeLease, Quota, QuotaSource, RedisLimiter, RedisStore, StoreError,
    Unconfigured,
};
use support::{BucketState, RedisServer};

async fn store(server: &RedisServer) -> RedisStore {
    RedisStore::builder(server.url())
        .response_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap()
}

/// A store whose pure-mode calls read the config every time, for tests of what the script
/// does with a config changed by another store between two calls.
async fn store_reading_config_every_call(server: &RedisServer) -> RedisStore {
    RedisStore::builder(server.url())
        .response_timeout(Duration::from_secs(2))
        .config_refresh(Duration::ZERO)
        .connect()
        .await
        .unwrap()
}

/// Calls of `command` the server has run (scripts' commands included).
fn calls(server: &RedisServer, command: &str) -> u64 {
    let info: String = server.cmd(&["INFO", "commandstats"]);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

#[tokio::test]
async fn a_config_changed_elsewhere_reaches_pure_calls_within_the_refresh() {
    let server = RedisServer::start();
    let admin = store(&server).await;
    let refresh = Duration::from_millis(600);
    let own = RedisStore::builder(server.url())
        .response_timeout(Duration::from_secs(2))
        .config_refresh(refresh)
        .connect()
        .await
        .unwrap();
    let (builder, first, second, third) = (
        Quota::per_minute(5).unwrap(),
        Quota::per_minute(50).unwrap(),
        Quota::per_minute(500).unwrap(),
        Quota::per_minute(5000).unwrap(),
    );
    admin.init_config("r", &first).await.unwrap();
    let limiter = RedisLimiter::new("r", builder, own.clone()).unwrap();
    assert!(limiter.acquire_now(1).await.unwrap().is_allowed());
    assert_eq!(limiter.quota(), first);

    // Changed by another process: still the config read a moment ago, and the calls in
    // between send the bucket alone — the config hash is not read.
    let read_at = Instant::now();
    admin.modify_config("r", &second).await.unwrap();
    let hmget_before = calls(&server, "hmget");
    for _ in 0..20 {
        assert!(limiter.acquire_now(1).await.unwrap().is_allowed());
    }
    assert!(
        read_at.elapsed() < refresh,
        "the test ran too slowly to see the cache"
    );
    assert_eq!(limiter.quota(), first);
    assert_eq!(
        calls(&server, "hmget"),
        hmget_before,
        "config read while cached"
    );
    // After the refresh: the new config.
    tokio::time::sleep(refresh).await;
    assert!(limiter.acquire_now(1).await.unwrap().is_allowed());
    assert_eq!(limiter.quota(), second);

    // Changed through the limiter's own store: at once.
    own.modify_config("r", &third).await.unwrap();
    assert!(limiter.acquire_now(1).await.unwrap().is_allowed());
    assert_eq!(limiter.quota(), third);
    // Deleted through it: the builder's quota at once.
    own.delete_config("r").await.unwrap();
    assert!(limiter.acquire_now(1).await.is_ok());
    assert_eq!(limiter.quota(), builder);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_adopts_a_new_rate_within_one_horizon_and_stays_in_bounds() {
    // Token leases: a node calls at least once a lease horizon of the automatic policy, at
    // most 250 ms.
    a_fleet_adopts_a_new_rate(Some(false), Duration::from_millis(400)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_leasing_fleet_adopts_a_new_rate_at_its_renewals_and_stays_in_bounds() {
    // The default: this tight burst (0.1 s of the rate, 3 nodes) leases rates, and a rated
    // node learns of the change at its renewal, at most half its ttl (1 s) away (and a round
    // trip; the rest is room for a busy machine's timers).
    a_fleet_adopts_a_new_rate(None, Duration::from_millis(750)).await;
}

/// Three hybrid nodes under 400/s, cut to 100/s in the store while they are busy: every one
/// runs under the new quota by `deadline`, and the fleet admits within the bound of each rate
/// while it was in force. `rate_leases`: the policy's setting (`None`: its default).
async fn a_fleet_adopts_a_new_rate(rate_leases: Option<bool>, deadline: Duration) {
    let server = RedisServer::start();
    let admin = store(&server).await;
    let old = Quota::per_second(400).unwrap().with_burst(40).unwrap();
    let new = Quota::per_second(100).unwrap().with_burst(40).unwrap();
    // The builders say 1 000/s: the stored config wins.
    let builder = Quota::per_second(1_000).unwrap().with_burst(40).unwrap();
    assert!(admin.init_config("fleet", &old).await.unwrap().1);

    let stop = Arc::new(AtomicBool::new(false));
    let admitted = Arc::new(AtomicU64::new(0));
    let denied = Arc::new(AtomicU64::new(0));
    let mut fleet = Vec::new();
    for i in 0..3 {
        let mut policy = AdaptiveLease::new();
        if let Some(on) = rate_leases {
            policy = policy.rate_leases(on);
        }
        fleet.push(
            HybridLimiter::builder("fleet", builder, store(&server).await)
                .seed(i)
                .policy(policy)
                .build()
                .unwrap(),
        );
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for l in &fleet {
        let (l, stop, admitted, denied) =
            (l.clone(), stop.clone(), admitted.clone(), denied.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match l.try_acquire(1) {
                    Ok(d) if d.is_allowed() => admitted.fetch_add(1, Ordering::Relaxed),
                    _ => denied.fetch_add(1, Ordering::Relaxed),
                };
                tokio::time::sleep(Duration::from_micros(500)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(800)).await;
    for l in &fleet {
        assert_eq!(l.quota(), old, "every instance runs under the stored quota");
    }
    // Token leases only, or rates dripping into local buckets, as the policy says (a node
    // may not hold a rate when the others' leave it no room).
    let dripped = fleet.iter().any(|l| l.stats().tokens_dripped > 0);
    assert_eq!(
        dripped,
        rate_leases.is_none(),
        "rate leases: {rate_leases:?}"
    );
    let changed_at = started.elapsed();
    let before = admitted.load(Ordering::Relaxed);
    assert!(admin.modify_config("fleet", &new).await.unwrap());
    let deadline = Instant::now() + deadline;
    while fleet.iter().any(|l| l.quota() != new) {
        assert!(Instant::now() < deadline, "an instance missed the change");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let t1 = started.elapsed();
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let total = started.elapsed();
    let admitted = admitted.load(Ordering::Relaxed);
    let bound = 40.0 + 400.0 * t1.as_secs_f64() + 100.0 * (total - t1).as_secs_f64();
    assert!(
        (admitted as f64) <= bound,
        "admitted {admitted} > bound {bound:.0} (t1 {t1:?}, total {total:?})"
    );
    // The old rate really was in force before the change, and the new one after it.
    let after = admitted - before;
    let after_span = (total - changed_at).as_secs_f64();
    assert!(
        before as f64 >= 0.7 * 400.0 * changed_at.as_secs_f64(),
        "only {before} admitted before the change"
    );
    assert!(
        (after as f64) < 250.0 * after_span,
        "{after} admitted in {after_span:.2}s after a cut to 100/s"
    );
    assert!(
        denied.load(Ordering::Relaxed) > 100,
        "demand exceeded the limit"
    );
}

#[tokio::test]
async fn a_capacity_cut_below_outstanding_keeps_conservation() {
    let server = RedisServer::start();
    let clock = FakeClock::starting_at(Duration::from_secs(1_000));
    let store = RedisStore::builder(server.url())
        .response_timeout(Duration::from_secs(2))
        .explicit_clock(clock.clone())
        .connect()
        .await
        .unwrap();
    let q = Quota::per_second(100).unwrap();
    let node = |held| NodeLease {
        id: 7,
        held,
        demand_mtps: 100_000,
        horizon: Duration::from_millis(100),
        ttl: Duration::from_secs(60),
        rate_mtps: 0,
        release_seq: 0,
    };
    let r = store
        .lease("cut", &q, &LeaseRequest::new(80, 1).by(node(0)))
        .await
        .unwrap();
    assert_eq!(r.granted, 80);
    let cut = Quota::per_second(10).unwrap();
    store.modify_config("cut", &cut).await.unwrap();
    let outstanding = |server: &RedisServer| -> (u64, u64) {
        let b = BucketState::read(server, "ratelease:{cut}").expect("a bucket");
        (b.v as u64, b.o as u64)
    };
    // Ten seconds later: 80 still outstanding, above the new capacity of 10 — nothing refills.
    clock.advance(Duration::from_secs(10));
    let r = store
        .lease("cut", &q, &LeaseRequest::new(5, 1))
        .await
        .unwrap();
    assert_eq!(
        (r.granted, r.quota, r.source),
        (0, cut, QuotaSource::Stored)
    );
    assert_eq!(outstanding(&server), (0, 80));
    // The node reports it spent 75 (holds 5): room for 5 under the new capacity, no more.
    store
        .lease("cut", &q, &LeaseRequest::new(1, 1).by(node(5)))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(10));
    let r = store
        .lease("cut", &q, &LeaseRequest::new(10, 1))
        .await
        .unwrap();
    let (_, o) = outstanding(&server);
    assert!(
        r.granted + o <= 10,
        "granted {} + outstanding {o}",
        r.granted
    );
    assert!(r.granted >= 4, "the bucket refilled up to the new capacity");
}

/// A node's lease runs under the stored config whenever any of its three fields differs from
/// the caller's quota (the script skips parsing the config only when all three are the very
/// strings the caller sent).
#[tokio::test]
async fn a_lease_runs_under_a_stored_config_that_differs_in_any_one_field() {
    let server = RedisServer::start();
    let store = store(&server).await;
    let caller = Quota::with_parts(1_000, Duration::from_secs(1), 1_000).unwrap();
    let node = NodeLease {
        id: 7,
        held: 0,
        demand_mtps: 100_000,
        horizon: Duration::from_millis(100),
        ttl: Duration::from_secs(60),
        rate_mtps: 0,
        release_seq: 0,
    };
    let stored = [
        ("same", caller),
        (
            "rate",
            Quota::with_parts(999, Duration::from_secs(1), 1_000).unwrap(),
        ),
        (
            "period",
            Quota::with_parts(1_000, Duration::from_secs(2), 1_000).unwrap(),
        ),
        (
            "burst",
            Quota::with_parts(1_000, Duration::from_secs(1), 40).unwrap(),
        ),
    ];
    for (name, quota) in stored {
        store.modify_config(name, &quota).await.unwrap();
        let r = store
            .lease(name, &caller, &LeaseRequest::new(1_000, 1).by(node))
            .await
            .unwrap();
        assert_eq!((r.quota, r.source), (quota, QuotaSource::Stored), "{name}");
        assert!(
            r.granted >= 1 && r.granted <= quota.burst(),
            "{name}: {r:?}"
        );
    }
}

#[tokio::test]
async fn init_does_not_overwrite_and_delete_falls_back() {
    let server = RedisServer::start();
    let admin = store(&server).await;
    let builder = Quota::per_minute(5).unwrap();
    let stored = Quota::per_minute(50).unwrap();
    assert_eq!(admin.get_config("n").await.unwrap(), None);
    assert_eq!(
        admin.init_config("n", &stored).await.unwrap(),
        (stored, true)
    );
    let other = Quota::per_second(7).unwrap();
    assert_eq!(
        admin.init_config("n", &other).await.unwrap(),
        (stored, false)
    );
    assert_eq!(admin.get_config("n").await.unwrap(), Some(stored));

    // Each limiter reads the config on every call: the admin's delete below applies at once
    // (see `a_config_changed_elsewhere_reaches_pure_calls_within_the_refresh` for the default).
    let limiters = store_reading_config_every_call(&server).await;
    let use_quota = RedisLimiter::new("n", builder, limiters.clone()).unwrap();
    let unlimited = RedisLimiter::builder("n", builder, limiters.clone())
        .if_unconfigured(Unconfigured::Unlimited)
        .build()
        .unwrap();
    let refuse = RedisLimiter::builder("n", builder, limiters)
        .if_unconfigured(Unconfigured::Error)
        .build()
        .unwrap();
    // Configured: all three run under the stored 50 per minute.
    let mut allowed = 0;
    for _ in 0..60 {
        allowed += u64::from(use_quota.acquire_now(1).await.unwrap().is_allowed());
    }
    assert_eq!(allowed, 50);
    assert_eq!(use_quota.quota(), stored);
    assert!(!unlimited.acquire_now(1).await.unwrap().is_allowed());
    assert!(!refuse.acquire_now(1).await.unwrap().is_allowed());

    assert!(admin.delete_config("n").await.unwrap());
    assert!(!admin.delete_config("n").await.unwrap());
    // Unconfigured: the builder's 5 per minute, no limit at all, or an error.
    let mut allowed = 0;
    for _ in 0..10 {
        allowed += u64::from(use_quota.acquire_now(1).await.unwrap().is_allowed());
    }
    assert!(allowed <= 5, "builder quota after delete: {allowed}");
    assert_eq!(use_quota.quota(), builder);
    for _ in 0..200 {
        assert!(unlimited.acquire_now(1).await.unwrap().is_allowed());
    }
    assert!(matches!(
        refuse.acquire_now(1).await,
        Err(AcquireError::Unconfigured(ref n)) if n == "n"
    ));
    // A hybrid limiter that treats the name as unlimited admits far beyond any bucket.
    let hybrid = HybridLimiter::builder("n", builder, store(&server).await)
        .if_unconfigured(Unconfigured::Unlimited)
        .build()
        .unwrap();
    hybrid.acquire(1).await.unwrap_or(());
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut allowed = 0;
    for _ in 0..1_000 {
        allowed += u64::from(hybrid.try_acquire(1).unwrap().is_allowed());
    }
    assert_eq!(allowed, 1_000);
    hybrid.shutdown().await;
}

#[tokio::test]
async fn bad_config_values_get_typed_errors_and_change_nothing() {
    let server = RedisServer::start();
    // A config corrupted by hand below is read by the next call, not one cached before it.
    let s = store_reading_config_every_call(&server).await;
    let q = Quota::per_second(10).unwrap();
    s.lease("bad", &q, &LeaseRequest::exact(3)).await.unwrap();
    let key = s.key("bad");
    let before = BucketState::read(&server, &key);
    assert!(before.is_some());
    // Out-of-range values through the script itself: rejected, nothing written.
    let script = redis::Script::new(ratelease::TOKEN_BUCKET_LUA);
    let mut conn = server.client().get_connection().unwrap();
    let config_key = s.config_key("bad");
    for (rate, period, burst, field) in [
        ("0", "1000000", "10", "rate"),
        ("10", "-1", "10", "period_us"),
        ("10", "1000000", "1e99", "burst"),
        ("1", "4503599627370496", "4503599627370496", "burst"),
    ] {
        let err = script
            .key(&key)
            .key(format!("{key}:leasers"))
            .key(format!("{key}:expiry"))
            .key(&config_key)
            .arg("config_set")
            .arg(rate)
            .arg(period)
            .arg(burst)
            .invoke::<Vec<u64>>(&mut conn)
            .unwrap_err();
        assert_eq!(
            StoreError::from(err).to_string(),
            format!("script rejected the call: invalid argument {field}")
        );
    }
    assert_eq!(s.get_config("bad").await.unwrap(), None);
    // A config corrupted by hand: typed errors, the bucket untouched.
    let _: () = server.cmd(&[
        "HSET",
        &config_key,
        "rate",
        "abc",
        "period_us",
        "1",
        "burst",
        "1",
    ]);
    let err = s
        .lease("bad", &q, &LeaseRequest::exact(1))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Rejected(ref m) if m == "invalid stored config"));
    assert!(matches!(
        s.get_config("bad").await,
        Err(StoreError::Rejected(_))
    ));
    let after = BucketState::read(&server, &key);
    assert_eq!(before, after);
    // A store that caches what it learns of the config: initializing over the bad one is
    // refused and teaches it nothing, so its next pure-mode call still hears the config is
    // bad (it ran under the caller's quota for a refresh period, as if none were stored).
    let caching = RedisStore::builder(server.url())
        .response_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let init = caching.init_config("bad", &q).await;
    assert!(matches!(init, Err(StoreError::Rejected(_))), "{init:?}");
    let err = caching
        .lease("bad", &q, &LeaseRequest::exact(1))
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Rejected(ref m) if m == "invalid stored config"));
    assert_eq!(before, BucketState::read(&server, &key));
    // Deleting the bad config heals the name.
    assert!(s.delete_config("bad").await.unwrap());
    assert!(s.lease("bad", &q, &LeaseRequest::exact(1)).await.is_ok());
}

/// What to do without a stored config (`ARGV[13]`: "", "caller" or "none") is checked whether
/// or not one is stored: a misspelt "None" ran while a config was stored, and failed every call
/// once it was deleted.
#[tokio::test]
async fn an_unknown_unconfigured_answer_is_refused_with_a_config_stored_too() {
    let server = RedisServer::start();
    let s = store_reading_config_every_call(&server).await;
    let q = Quota::per_second(10).unwrap();
    s.init_config("typo", &q).await.unwrap();
    s.lease("typo", &q, &LeaseRequest::exact(3)).await.unwrap();
    let key = s.key("typo");
    let before = BucketState::read(&server, &key);
    let script = redis::Script::new(ratelease::TOKEN_BUCKET_LUA);
    let mut conn = server.client().get_connection().unwrap();
    // An anonymous lease of 1 with every key, and `unconfigured` as ARGV[13].
    let mut lease = |unconfigured: &str| {
        script
            .key(&key)
            .key(format!("{key}:leasers"))
            .key(format!("{key}:expiry"))
            .key(s.config_key("typo"))
            .arg(
                &[
                    "lease", "10", "1000000", "10", "1", "1", "", "", "", "", "", "",
                ][..],
            )
            .arg(unconfigured)
            .invoke::<Vec<u64>>(&mut conn)
    };
    for unconfigured in ["None", "callers", "0"] {
        let err = lease(unconfigured).unwrap_err();
        assert_eq!(
            StoreError::from(err).to_string(),
            "script rejected the call: invalid argument unconfigured",
            "{unconfigured:?}"
        );
    }
    assert_eq!(before, BucketState::read(&server, &key), "nothing written");
    for unconfigured in ["", "caller", "none"] {
        let granted = lease(unconfigured).unwrap();
        assert_eq!(granted[0], 1, "{unconfigured:?}: {granted:?}");
    }
}

#[tokio::test]
async fn per_client_budgets_are_separate_and_overall_is_shared() {
    let server = RedisServer::start();
    let q = Quota::per_minute(10).unwrap();
    let count = |l: RedisLimiter| async move {
        let mut n = 0;
        for _ in 0..15 {
            n += u64::from(l.acquire_now(1).await.unwrap().is_allowed());
        }
        n
    };
    let mut per_client = 0;
    for id in 1..=3 {
        let l = RedisLimiter::builder("pc", q, store(&server).await)
            .budget(Budget::PerClient)
            .client_id(id)
            .build()
            .unwrap();
        assert_eq!(l.client_id(), Some(id));
        per_client += count(l).await;
    }
    assert_eq!(per_client, 30, "three clients, ten each");
    let mut overall = 0;
    for _ in 0..3 {
        let l = RedisLimiter::new("ov", q, store(&server).await).unwrap();
        overall += count(l).await;
    }
    assert_eq!(overall, 10, "one budget for all");
    // The name's central config applies to every client's bucket.
    store(&server)
        .await
        .modify_config("pc", &Quota::per_minute(2).unwrap())
        .await
        .unwrap();
    let l = RedisLimiter::builder("pc", q, store(&server).await)
        .budget(Budget::PerClient)
        .client_id(9)
        .build()
        .unwrap();
    assert_eq!(count(l).await, 2);

    // Hybrid: two instances with their own budgets each get a full burst.
    let mut got = 0;
    for seed in 0..2 {
        let h = HybridLimiter::builder("hpc", q, store(&server).await)
            .budget(Budget::PerClient)
            .seed(seed)
            .build()
            .unwrap();
        for _ in 0..15 {
            if h.try_acquire_for(1, Duration::from_millis(20))
                .await
                .unwrap()
                .is_allowed()
            {
                got += 1;
            }
        }
        h.shutdown().await;
    }
    assert_eq!(got, 20, "two hybrid clients, ten each");
}

/// A pure limiter whose name has a stored quota (5 an hour) answers an outage at the share of
/// that quota, not of its builder's (1 000 a minute): its fallback follows the quota the store
/// last reported, as a hybrid limiter's does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pure_limiters_fallback_follows_the_stored_quota_into_an_outage() {
    let mut server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .lazy_connect()
        .connect_timeout(Duration::from_millis(50))
        .response_timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let builder = Quota::per_minute(1_000).unwrap();
    let stored = Quota::new(5, Duration::from_secs(3_600)).unwrap();
    let policies = [
        FailurePolicy::local_fallback(1),
        FailurePolicy::last_known_share(1),
    ];
    let mut limiters = Vec::new();
    for (i, policy) in policies.into_iter().enumerate() {
        let name = format!("pure-fallback-{i}");
        assert!(store.init_config(&name, &stored).await.unwrap().1);
        let limiter = RedisLimiter::builder(name, builder, store.clone())
            .on_store_failure(policy)
            .build()
            .unwrap();
        assert!(limiter.acquire_now(1).await.unwrap().is_allowed());
        assert_eq!(limiter.quota(), stored);
        limiters.push((policy, limiter));
    }
    server.stop();
    for (policy, limiter) in limiters {
        let mut admitted = 0;
        for _ in 0..50 {
            admitted += u64::from(limiter.acquire_now(1).await.unwrap().is_allowed());
        }
        assert!(limiter.circuit_open(), "{policy:?}");
        assert_eq!(admitted, 5, "{policy:?}: the stored quota's burst");
    }
}

/// A pure limiter checks a request against the burst of the quota in force — the stored
/// config's, once a reply has carried it, and never above its builder's (the store checks a
/// call's arguments against the caller's quota) — as its module docs say: a request above a
/// smaller stored burst was refused only after a store call.
#[tokio::test]
async fn a_pure_limiter_checks_requests_against_the_stored_burst() {
    use ratelease::MemoryStore;

    let store = MemoryStore::new();
    store
        .init_config("narrow", &Quota::per_second(10).unwrap())
        .await
        .unwrap();
    let narrow =
        RedisLimiter::new("narrow", Quota::per_second(100).unwrap(), store.clone()).unwrap();
    narrow.ready().await.unwrap();
    let calls = store.calls();
    assert!(matches!(
        narrow.acquire_now(50).await,
        Err(AcquireError::ExceedsBurst {
            requested: 50,
            burst: 10
        })
    ));
    assert_eq!(store.calls(), calls, "refused without a store call");
    assert!(narrow.acquire_now(10).await.unwrap().is_allowed());

    store
        .init_config("wide", &Quota::per_second(100).unwrap())
        .await
        .unwrap();
    let wide = RedisLimiter::new("wide", Quota::per_second(10).unwrap(), store.clone()).unwrap();
    wide.ready().await.unwrap();
    assert_eq!(wide.quota().burst(), 100);
    assert!(matches!(
        wide.acquire_now(50).await,
        Err(AcquireError::ExceedsBurst {
            requested: 50,
            burst: 10
        })
    ));
    assert!(wide.acquire_now(10).await.unwrap().is_allowed());
}
