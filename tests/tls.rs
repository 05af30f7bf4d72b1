//! `rediss://` (feature `tls`): a limiter works against a TLS-only redis-server whose
//! certificate is signed by a private CA it was told to trust, and a client that does not trust
//! that CA gets a clear certificate error instead of a connection. With feature `cluster` too,
//! the same against a TLS-only Redis Cluster (client connections, cluster bus and redirections
//! all over TLS).
#![cfg(feature = "tls")]

mod certs;
mod support;

use std::time::Duration;

use certs::{ca, cert};
use ratelease::{BuildError, Quota, RedisLimiter, RedisLock, RedisStore, StoreError};
use rcgen::{CertifiedIssuer, KeyPair};
use support::{BucketState, RedisServer};

/// A PEM certificate for 127.0.0.1 signed by `ca`, and its PEM key.
fn server_cert(ca: &CertifiedIssuer<'static, KeyPair>) -> (String, String) {
    cert(ca, &["127.0.0.1"])
}

/// A TLS-only server with a certificate for 127.0.0.1 signed by `ca`.
fn server(ca: &CertifiedIssuer<'static, KeyPair>) -> RedisServer {
    let (cert, key) = server_cert(ca);
    RedisServer::start_tls(&cert, &key, &ca.pem())
}

/// A rate so slow that nothing refills during a test.
fn slow(burst: u64) -> Quota {
    Quota::new(1, Duration::from_secs(3600))
        .unwrap()
        .with_burst(burst)
        .unwrap()
}

#[tokio::test]
async fn a_limiter_works_over_tls_with_a_private_ca() {
    let ca = ca("ratelease test CA");
    let server = server(&ca);
    assert!(server.url().starts_with("rediss://"));
    let store = RedisStore::builder(server.url())
        .tls_root_certificate(ca.pem())
        .response_timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let limiter = RedisLimiter::new("tls", slow(5), store).unwrap();
    let mut allowed = Vec::new();
    for _ in 0..6 {
        allowed.push(limiter.acquire_now(1).await.unwrap().is_allowed());
    }
    assert_eq!(allowed, [true, true, true, true, true, false]);
    // The state is really on this server, written over TLS.
    assert!(BucketState::read(&server, "ratelease:{tls}").is_some());

    // The lock too, including a waiter's unlock subscription.
    let lock = RedisLock::builder(server.url(), "tls")
        .tls_root_certificate(ca.pem())
        .connect()
        .await
        .unwrap();
    let (a, b) = (lock.new_owner(), lock.new_owner());
    let held = lock.lock(&a).await.unwrap();
    let waiter = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.try_lock_for(&b, Duration::from_secs(5)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    held.unlock().await.unwrap();
    let got = waiter.await.unwrap().unwrap().expect("waiter got the lock");
    got.unlock().await.unwrap();
}

#[tokio::test]
async fn a_client_that_does_not_trust_the_ca_gets_a_certificate_error() {
    let ca = ca("ratelease test CA");
    let server = server(&ca);
    let other = self::ca("some other CA");
    for store in [
        // The system's roots, which do not include the private CA.
        RedisStore::builder(server.url()),
        // Another private CA.
        RedisStore::builder(server.url()).tls_root_certificate(other.pem()),
    ] {
        let err = store
            .connect_timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap_err();
        assert_unknown_issuer(&err);
    }
    // Plain `redis://` to the TLS port is not answered as Redis either.
    let plain = server.url().replace("rediss://", "redis://");
    let err = RedisStore::builder(plain)
        .connect_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, BuildError::Store(_)), "{err:?}");
}

/// Asserts that `err` is the redis error of a server certificate signed by an unknown CA.
fn assert_unknown_issuer(err: &BuildError) {
    let BuildError::Store(StoreError::Redis(e)) = err else {
        panic!("expected a redis error, got {err:?}")
    };
    let message = e.to_string();
    assert!(
        message.contains("certificate") && message.contains("UnknownIssuer"),
        "{message}"
    );
}

/// A TLS-only 3-primary cluster (cluster bus over TLS too): a pure limiter on each of 100 names
/// spread over every primary admits exactly its burst, hybrid limiters stay within
/// `burst + rate × elapsed`, a slot moved under a connected store is found by following MOVED
/// over TLS (and its state came along), and clients that do not trust the CA fail `connect`
/// with the certificate error, promptly.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limiters_work_on_a_tls_cluster_and_follow_its_redirections() {
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Instant;

    use ratelease::HybridLimiter;
    use support::RedisCluster;

    let t0 = Instant::now();
    let ca = ca("ratelease test CA");
    let (cert, key) = server_cert(&ca);
    let cluster = RedisCluster::start_tls(3, &cert, &key, &ca.pem());
    let started_in = t0.elapsed();
    let urls = cluster.urls();
    assert!(urls.iter().all(|u| u.starts_with("rediss://")), "{urls:?}");
    let store = || {
        RedisStore::cluster_builder(cluster.urls())
            .tls_root_certificate(ca.pem())
            .connect_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(3))
            .connect()
    };

    // Pure: 100 names over every primary, each admits exactly its burst of 3.
    let pure_store = store().await.unwrap();
    let names: Vec<String> = (0..100).map(|i| format!("tls-{i}")).collect();
    let mut tasks = Vec::new();
    for name in &names {
        let limiter = RedisLimiter::new(name, slow(3), pure_store.clone()).unwrap();
        tasks.push(tokio::spawn(async move {
            let mut allowed = Vec::new();
            for _ in 0..4 {
                allowed.push(limiter.acquire_now(1).await.unwrap().is_allowed());
            }
            allowed
        }));
    }
    for (name, task) in names.iter().zip(tasks) {
        assert_eq!(task.await.unwrap(), [true, true, true, false], "{name}");
    }
    // Every bucket is on exactly one primary and each primary holds its share (`KEYS` on each
    // node rather than a lookup per name: a harness connection is a TLS handshake, slow in a
    // debug build).
    let mut buckets: HashSet<String> = names.iter().map(|n| pure_store.key(n)).collect();
    let mut per_node = Vec::new();
    for node in cluster.nodes() {
        let keys: Vec<String> = node.cmd(&["KEYS", "*"]);
        for key in &keys {
            assert!(buckets.remove(key), "unexpected key {key:?}");
        }
        per_node.push(keys.len());
    }
    assert!(
        buckets.is_empty(),
        "buckets not on any primary: {buckets:?}"
    );
    assert!(
        per_node.iter().all(|n| *n >= 10),
        "buckets per primary {per_node:?}"
    );

    // Hybrid: two "processes" (stores) per name, one budget per name.
    let (rate, burst) = (200u64, 20u64);
    let quota = Quota::per_second(rate).unwrap().with_burst(burst).unwrap();
    let hybrid_names = ["h-a", "h-b", "h-c"];
    let stop = Arc::new(AtomicBool::new(false));
    let admitted: Vec<Arc<AtomicU64>> = hybrid_names.iter().map(|_| Arc::default()).collect();
    let mut tasks = Vec::new();
    let mut hybrid_stores = Vec::new();
    for _ in 0..2 {
        hybrid_stores.push(store().await.unwrap());
    }
    let hybrid_started = Instant::now();
    for (n, name) in hybrid_names.iter().enumerate() {
        for (seed, store) in hybrid_stores.iter().enumerate() {
            let h = HybridLimiter::builder(*name, quota, store.clone())
                .seed(seed as u64)
                .build()
                .unwrap();
            let (stop, admitted) = (stop.clone(), admitted[n].clone());
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    if h.try_acquire(1).unwrap().is_allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_micros(500)).await;
                }
            }));
        }
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = hybrid_started.elapsed().as_secs_f64();
    let budget = burst as f64 + rate as f64 * elapsed;
    let admitted: Vec<u64> = admitted.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    for (name, &admitted) in hybrid_names.iter().zip(&admitted) {
        let admitted = admitted as f64;
        assert!(
            admitted <= budget,
            "{name}: admitted {admitted} > {budget:.0}"
        );
        assert!(
            admitted >= 0.5 * rate as f64 * elapsed,
            "{name}: admitted only {admitted} of {budget:.0}"
        );
    }

    // MOVED over TLS: move a used name's slot (and its keys) to another primary under the
    // connected store; its next call is redirected and finds the state where it went.
    let moved_name = "moved";
    let limiter = RedisLimiter::new(moved_name, slow(5), pure_store.clone()).unwrap();
    for _ in 0..2 {
        assert!(limiter.acquire_now(1).await.unwrap().is_allowed());
    }
    let slot = cluster.slot(&pure_store.key(moved_name));
    let from = cluster.owner(slot);
    let to = (from + 1) % 3;
    let moved_before = moved_replies(&cluster.nodes()[from]);
    let keys = {
        let cluster = &cluster;
        tokio::task::block_in_place(|| cluster.migrate_slot(slot, to, Duration::ZERO))
    };
    assert!(keys >= 1, "no key moved");
    assert_eq!(cluster.owner(slot), to);
    let mut allowed = 0;
    for _ in 0..5 {
        if limiter.acquire_now(1).await.unwrap().is_allowed() {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 3, "2 of 5 were taken before the move");
    assert!(
        moved_replies(&cluster.nodes()[from]) > moved_before,
        "the old owner sent no MOVED"
    );

    // Clients that do not trust the CA: the system's roots, another private CA. A clear error,
    // promptly (no retry loop, no hang).
    let other = self::ca("some other CA");
    for builder in [
        RedisStore::cluster_builder(cluster.urls()),
        RedisStore::cluster_builder(cluster.urls()).tls_root_certificate(other.pem()),
    ] {
        let t = Instant::now();
        let err = builder
            .connect_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(1))
            .connect()
            .await
            .unwrap_err();
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "took {:?}",
            t.elapsed()
        );
        assert_unknown_issuer(&err);
    }
    // Plain `redis://` to the TLS ports: no Redis there.
    let plain: Vec<String> = urls
        .iter()
        .map(|u| u.replace("rediss://", "redis://"))
        .collect();
    let t = Instant::now();
    let err = RedisStore::cluster_builder(plain)
        .connect_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, BuildError::Store(_)), "{err:?}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    eprintln!(
        "TLS cluster started in {started_in:?}; buckets per primary {per_node:?}; hybrid \
         admitted {admitted:?} of {budget:.0}; whole test {:?}",
        t0.elapsed()
    );
}

/// How many MOVED replies `node` has sent (`INFO errorstats`).
#[cfg(feature = "cluster")]
fn moved_replies(node: &RedisServer) -> u64 {
    let info: String = node.cmd(&["INFO", "errorstats"]);
    info.lines()
        .find_map(|line| line.strip_prefix("errorstat_MOVED:count="))
        .map_or(0, |n| n.trim().parse().unwrap())
}
