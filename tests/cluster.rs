//! `RedisStore` on a real 3-primary Redis Cluster (feature `cluster`): limiters spread over
//! every primary, names with braces and percent signs keep all their keys in one slot, hybrid
//! limiters share one budget, both timeouts hold, NOSCRIPT is reloaded, and a slot migrated
//! while limiters run (ASK/TRYAGAIN, then MOVED) keeps its state and its budget.
#![cfg(feature = "cluster")]

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelease::{
    AcquireError, BuildError, HybridLimiter, Quota, RedisLimiter, RedisStore, StoreError,
};
use support::RedisCluster;

const PREFIX: &str = "rl:";

async fn store(cluster: &RedisCluster) -> RedisStore {
    store_with(cluster, Duration::from_secs(3)).await
}

async fn store_with(cluster: &RedisCluster, response_timeout: Duration) -> RedisStore {
    RedisStore::cluster_builder(cluster.urls())
        .prefix(PREFIX)
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(response_timeout)
        .connect()
        .await
        .unwrap()
}

/// Limiter `i`'s name; most contain `{`, `}` or `%`, some start with `}` (unescaped, that
/// would leave an empty hash tag and split the limiter's keys over several slots).
fn name(i: usize) -> String {
    match i % 4 {
        0 => format!("plain-{i}"),
        1 => format!("}}x{{{i}}}"),
        2 => format!("{{{i}%7D"),
        _ => format!("%{i}}}{{"),
    }
}

/// A rate so slow that nothing refills during the test.
fn slow(burst: u64) -> Quota {
    Quota::new(1, Duration::from_secs(3600))
        .unwrap()
        .with_burst(burst)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_limiters_spread_over_every_primary_and_admit_exactly_their_burst() {
    let cluster = RedisCluster::start(3);
    // 4 000 calls at once through one connection take 1–4 s in a debug build on a busy
    // 2-core machine: a generous timeout, as this test checks where keys go, not latency.
    let store = store_with(&cluster, Duration::from_secs(30)).await;
    let quota = slow(3);
    let mut tasks = Vec::new();
    for i in 0..1_000 {
        let limiter = RedisLimiter::new(name(i), quota, store.clone()).unwrap();
        tasks.push(tokio::spawn(async move {
            let mut allowed = Vec::new();
            for _ in 0..4 {
                allowed.push(limiter.acquire_now(1).await.unwrap().is_allowed());
            }
            allowed
        }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        assert_eq!(
            t.await.unwrap(),
            [true, true, true, false],
            "limiter {:?}",
            name(i)
        );
    }

    // The store's connection to every primary closes once its server goes silent
    // (keepalive and a user timeout, as on one server: `tests/reliability.rs`).
    #[cfg(target_os = "linux")]
    for node in cluster.nodes() {
        let sockets = support::sockets_to(node.port().unwrap());
        assert!(!sockets.is_empty(), "a connection to every primary");
        for (keepalive, user_timeout) in sockets {
            assert_eq!(keepalive, Some(Duration::from_secs(10)));
            assert_eq!(user_timeout, Some(Duration::from_secs(10)));
        }
    }

    // Every key is under the prefix, in the slot of its limiter's hash tag, and together they
    // land on all three primaries.
    let mut con = cluster.nodes()[0].connection();
    let mut per_node = [0usize; 3];
    for i in 0..1_000 {
        let bucket = store.key(&name(i));
        assert!(bucket.starts_with(PREFIX), "{bucket}");
        let slots: Vec<u16> = ["", ":leasers", ":expiry"]
            .iter()
            .map(|suffix| {
                redis::cmd("CLUSTER")
                    .arg("KEYSLOT")
                    .arg(format!("{bucket}{suffix}"))
                    .query(&mut con)
                    .unwrap()
            })
            .collect();
        assert!(
            slots.iter().all(|s| *s == slots[0]),
            "{bucket}: slots {slots:?}"
        );
        per_node[cluster.owner(slots[0])] += 1;
    }
    assert!(
        per_node.iter().all(|n| *n > 100),
        "keys per primary {per_node:?}"
    );
    let mut total = 0;
    for node in cluster.nodes() {
        let keys: Vec<String> = node.cmd(&["KEYS", "*"]);
        assert!(keys.iter().all(|k| k.starts_with(PREFIX)), "{keys:?}");
        total += keys.len();
    }
    assert_eq!(total, 1_000, "one bucket key per limiter, nothing else");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_limiters_on_a_cluster_share_one_budget() {
    let cluster = RedisCluster::start(3);
    let (rate, burst) = (300u64, 30u64);
    let quota = Quota::per_second(rate).unwrap().with_burst(burst).unwrap();
    let names = ["a}{b", "}", "%7D{"];
    let stop = Arc::new(AtomicBool::new(false));
    let admitted: Vec<Arc<AtomicU64>> = names.iter().map(|_| Arc::default()).collect();
    let mut limiters = Vec::new();
    let mut tasks = Vec::new();
    let started = Instant::now();
    for (n, name) in names.iter().enumerate() {
        // Two "processes" per name, each with its own cluster connection.
        for seed in 0..2 {
            let h = HybridLimiter::builder(*name, quota, store(&cluster).await)
                .seed(seed)
                .build()
                .unwrap();
            limiters.push(h.clone());
            let (stop, admitted) = (stop.clone(), admitted[n].clone());
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    if h.try_acquire(1).unwrap().is_allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_micros(300)).await;
                }
            }));
        }
    }
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let budget = burst as f64 + rate as f64 * elapsed;
    for (name, admitted) in names.iter().zip(&admitted) {
        let admitted = admitted.load(Ordering::Relaxed) as f64;
        assert!(
            admitted <= budget,
            "{name:?}: admitted {admitted} > {budget:.0}"
        );
        assert!(
            admitted >= 0.5 * rate as f64 * elapsed,
            "{name:?}: admitted only {admitted} of {budget:.0}"
        );
    }
    // Both processes of each name registered as leasers (adaptive leases) on the same
    // (one-slot) keys.
    let store = store(&cluster).await;
    for name in names {
        let leasers = format!("{}:leasers", store.key(name));
        let slot = cluster.slot(&leasers);
        let node = &cluster.nodes()[cluster.owner(slot)];
        // Node ids; the empty field is a pending claim, not a leaser.
        let ids: Vec<String> = node.cmd(&["HKEYS", &leasers]);
        let n = ids.iter().filter(|id| !id.is_empty()).count();
        assert_eq!(n, 2, "{leasers}: {ids:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_store_honours_both_timeouts_and_reloads_flushed_scripts() {
    // Connect timeout: a listener that never answers the handshake.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}/", silent.local_addr().unwrap());
    let t = Instant::now();
    let err = RedisStore::cluster_builder([url])
        .connect_timeout(Duration::from_millis(200))
        .response_timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, BuildError::Store(_)), "{err:?}");
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "took {:?}",
        t.elapsed()
    );

    let cluster = RedisCluster::start(3);
    let store = RedisStore::cluster_builder(cluster.urls())
        .prefix(PREFIX)
        .response_timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let limiter = RedisLimiter::new("paused", slow(5), store.clone()).unwrap();
    assert!(limiter.acquire_now(1).await.unwrap().is_allowed());

    // NOSCRIPT on every primary: reloaded transparently.
    for node in cluster.nodes() {
        let _: () = node.cmd(&["SCRIPT", "FLUSH"]);
    }
    assert!(limiter.acquire_now(1).await.unwrap().is_allowed());

    // Response timeout: the primary holding the limiter stops answering for 2 s.
    let owner = &cluster.nodes()[cluster.owner(cluster.slot(&store.key("paused")))];
    let _: () = owner.cmd(&["CLIENT", "PAUSE", "2000", "ALL"]);
    let t = Instant::now();
    let err = limiter.acquire_now(1).await.unwrap_err();
    let waited = t.elapsed();
    assert!(
        matches!(err, AcquireError::Store(StoreError::Timeout(_))),
        "{err:?}"
    );
    assert!(waited < Duration::from_millis(1_000), "waited {waited:?}");
    let _: () = owner.cmd(&["CLIENT", "UNPAUSE"]);
    // Two admitted so far; the budget of 5 still holds after the timeout.
    let mut allowed = 0;
    for _ in 0..6 {
        if limiter.acquire_now(1).await.unwrap().is_allowed() {
            allowed += 1;
        }
    }
    assert!(allowed <= 3, "allowed {allowed} more after 2 of 5");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migrated_during_the_run_keeps_its_state_and_budget() {
    let cluster = RedisCluster::start(3);
    let burst = 2_000;
    let quota = slow(burst);
    let name = "mig}rate{";
    let pure = RedisLimiter::new(name, quota, store(&cluster).await).unwrap();
    let hybrid = HybridLimiter::new(name, slow(burst), store(&cluster).await).unwrap();
    let bucket = pure.store().key(name);
    let slot = cluster.slot(&bucket);
    let from = cluster.owner(slot);
    let to = (from + 1) % 3;

    let stop = Arc::new(AtomicBool::new(false));
    let admitted = Arc::new(AtomicU64::new(0));
    let hybrid_admitted = Arc::new(AtomicU64::new(0));
    let slowest_us = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    {
        let (stop, admitted, slowest_us, pure) = (
            stop.clone(),
            admitted.clone(),
            slowest_us.clone(),
            pure.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                // Never an error: TRYAGAIN and ASK are retried within the response timeout.
                if pure.acquire_now(1).await.unwrap().is_allowed() {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
                slowest_us.fetch_max(t.elapsed().as_micros() as u64, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }));
    }
    {
        let (stop, admitted, hybrid_admitted, hybrid) = (
            stop.clone(),
            admitted.clone(),
            hybrid_admitted.clone(),
            hybrid.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if hybrid.try_acquire(1).unwrap().is_allowed() {
                    admitted.fetch_add(1, Ordering::Relaxed);
                    hybrid_admitted.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(4)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = admitted.load(Ordering::Relaxed);
    let hybrid_before = hybrid_admitted.load(Ordering::Relaxed);
    let started = Instant::now();
    let moved = {
        let cluster = &cluster;
        tokio::task::block_in_place(|| cluster.migrate_slot(slot, to, Duration::from_millis(150)))
    };
    let migration = started.elapsed();
    let hybrid_during = hybrid_admitted.load(Ordering::Relaxed) - hybrid_before;
    assert_eq!(cluster.owner(slot), to);
    // The bucket, the leasers hash and the expiry index.
    assert_eq!(moved, 3, "keys moved");
    assert!(before > 0);
    // The hybrid hot path never waits for the store: it kept admitting from its lease while
    // the slot moved (until the lease ran out: its next lease waits like a pure call).
    assert!(
        hybrid_during > 0,
        "hybrid admitted nothing during a {migration:?} migration"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    // After the migration: the limiter still answers (MOVED followed), and the state came
    // along: the budget is used up, not restored to a full bucket.
    let after = admitted.load(Ordering::Relaxed);
    assert!(after > before, "nothing admitted after the migration began");
    // A script call whose keys are not all on one node gets TRYAGAIN until the slot is handed
    // over. A pure call on a name that also has leasers sends every key (the bucket has
    // leasers on record), so it can wait for the rest of the migration, but no longer than
    // the response timeout (3 s here); alone on its name it sends one key (next test).
    let slowest = Duration::from_micros(slowest_us.load(Ordering::Relaxed));
    eprintln!(
        "migration {migration:?}; slowest pure call {slowest:?}; hybrid admitted {hybrid_during} meanwhile"
    );
    assert!(
        slowest < Duration::from_secs(3),
        "a pure call took {slowest:?}"
    );
    // The hybrid limiter gives back what it holds (a lease still in flight lands first), so
    // every token is now admitted or in Redis.
    hybrid.shutdown().await;
    let stats = hybrid.stats();
    // Drain what is left in Redis, in decreasing chunks.
    let mut extra = 0;
    for chunk in [100, 10, 1] {
        while pure.acquire_now(chunk).await.unwrap().is_allowed() {
            extra += chunk;
        }
    }
    let total = after + extra;
    assert!(total <= burst, "admitted {total} > burst {burst}");
    // Pure mode is exact: nothing was lost in the migration.
    assert_eq!(
        total, burst,
        "admitted {after} + left {extra} != burst {burst}: tokens lost in the migration; {stats:?}"
    );
    let on_target: u64 = cluster.nodes()[to].cmd(&["EXISTS", &bucket]);
    assert_eq!(on_target, 1);
}

/// A pure-mode limiter alone on its name (the common case) sends the bucket's key alone: while
/// its slot migrates, a call is redirected (ASK) once the key has moved, never answered
/// `TRYAGAIN` until the handover as a call whose keys are split between two nodes is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pure_limiter_alone_on_a_migrating_slot_is_redirected_not_stalled() {
    let cluster = RedisCluster::start(3);
    let burst = 2_000;
    let name = "pure}only{";
    let pure = RedisLimiter::new(name, slow(burst), store(&cluster).await).unwrap();
    assert!(pure.acquire_now(1).await.unwrap().is_allowed());
    let bucket = pure.store().key(name);
    let slot = cluster.slot(&bucket);
    let to = (cluster.owner(slot) + 1) % 3;

    let stop = Arc::new(AtomicBool::new(false));
    let admitted = Arc::new(AtomicU64::new(1));
    let slowest_us = Arc::new(AtomicU64::new(0));
    let calls = Arc::new(AtomicU64::new(0));
    let task = {
        let (stop, admitted, slowest_us, calls, pure) = (
            stop.clone(),
            admitted.clone(),
            slowest_us.clone(),
            calls.clone(),
            pure.clone(),
        );
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                if pure.acquire_now(1).await.unwrap().is_allowed() {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
                slowest_us.fetch_max(t.elapsed().as_micros() as u64, Ordering::Relaxed);
                calls.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let pause = Duration::from_millis(150);
    let started = Instant::now();
    let calls_before = calls.load(Ordering::Relaxed);
    let moved = {
        let cluster = &cluster;
        tokio::task::block_in_place(|| cluster.migrate_slot(slot, to, pause))
    };
    let migration = started.elapsed();
    let during = calls.load(Ordering::Relaxed) - calls_before;
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    task.await.unwrap();
    // The bucket alone: a pure-mode name has no leasers' keys and no config key.
    assert_eq!(moved, 1, "keys moved");
    let slowest = Duration::from_micros(slowest_us.load(Ordering::Relaxed));
    eprintln!("migration {migration:?}; {during} pure calls meanwhile, slowest {slowest:?}");
    // No call waited for a step of the migration (each 150 ms apart): calls went on
    // throughout it (one every ~2 ms), and none took as long as a step.
    assert!(
        slowest < pause,
        "a pure call took {slowest:?} during a {migration:?} migration"
    );
    assert!(
        during > 50,
        "only {during} calls during a {migration:?} migration"
    );
    // Exact, and the state moved with the key.
    let mut total = admitted.load(Ordering::Relaxed);
    for chunk in [100, 10, 1] {
        while pure.acquire_now(chunk).await.unwrap().is_allowed() {
            total += chunk;
        }
    }
    assert_eq!(total, burst, "tokens lost or made in the migration");
}

#[tokio::test]
async fn a_store_on_the_services_cluster_connection_routes_every_limiter() {
    let cluster = RedisCluster::start(3);
    let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
    let conn = client.get_async_connection().await.unwrap();
    let store = RedisStore::with_cluster_connection(conn)
        .prefix(PREFIX)
        .response_timeout(Duration::from_secs(3))
        .connect()
        .await
        .unwrap();
    assert!(store.connection_manager().is_none() && store.client().is_none());
    let mut owners = std::collections::BTreeSet::new();
    for i in 0..12 {
        let limiter = RedisLimiter::new(name(i), slow(2), store.clone()).unwrap();
        let mut admitted = 0;
        for _ in 0..3 {
            admitted += u32::from(limiter.acquire_now(1).await.unwrap().is_allowed());
        }
        assert_eq!(
            admitted, 2,
            "limiter {i}: its burst, on the shared connection"
        );
        owners.insert(cluster.owner(cluster.slot(&store.key(&name(i)))));
    }
    assert!(
        owners.len() > 1,
        "limiters spread over primaries: {owners:?}"
    );
}
