//! Connection reuse (issue 14, item 6): stores and locks built on a service's own redis-rs
//! client or connection manager, against a real `redis-server`. The server's own client count
//! (`INFO clients`) shows that no extra connection is opened.

mod support;

use std::time::{Duration, Instant};

use ratelease::{AcquireError, LockError, Quota, RedisLimiter, RedisLock, RedisStore, StoreError};
use support::RedisServer;

/// Clients connected to `server`, not counting the connection that asks.
fn other_clients(server: &RedisServer) -> u64 {
    let info: String = server.cmd(&["INFO", "clients"]);
    let line = info
        .lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .expect("INFO clients has connected_clients");
    line.trim().parse::<u64>().expect("a count") - 1
}

#[tokio::test]
async fn a_store_and_a_lock_share_the_services_connection_manager() {
    let server = RedisServer::start();
    let client = server.client();
    let manager = redis::aio::ConnectionManager::new(client.clone())
        .await
        .expect("manager");
    assert_eq!(other_clients(&server), 1, "the service's own connection");

    let store = RedisStore::with_connection_manager(manager.clone())
        .prefix("svc:")
        .connect()
        .await
        .expect("a store on the manager");
    let quota = Quota::per_second(1).unwrap().with_burst(3).unwrap();
    let limiter = RedisLimiter::new("shared", quota, store.clone()).unwrap();
    let mut admitted = 0;
    for _ in 0..5 {
        admitted += u32::from(limiter.acquire_now(1).await.unwrap().is_allowed());
    }
    assert_eq!(
        admitted, 3,
        "the burst, then denials: the store works on the shared manager"
    );
    assert!(server.cmd::<bool>(&["EXISTS", &store.key("shared")]));

    let lock = RedisLock::builder_on_store(&store, "job")
        .connect()
        .await
        .expect("a lock on the store's connection");
    let me = lock.new_owner();
    let guard = lock.try_lock(&me).await.unwrap().expect("free lock");
    assert!(lock.is_locked().await.unwrap());
    guard.unlock().await.unwrap();

    assert_eq!(
        other_clients(&server),
        1,
        "store, limiter and lock opened no connection of their own"
    );
}

#[tokio::test]
async fn a_store_from_a_client_hands_its_client_to_a_lock() {
    let server = RedisServer::start();
    let store = RedisStore::with_client(server.client())
        .connect()
        .await
        .expect("a store on the client");
    assert!(store.client().is_some() && store.connection_manager().is_some());
    let quota = Quota::per_second(10).unwrap();
    let limiter = RedisLimiter::new("from-client", quota, store.clone()).unwrap();
    assert!(limiter.acquire_now(1).await.unwrap().is_allowed());
    assert_eq!(other_clients(&server), 1, "one connection manager");

    let lock = RedisLock::builder_on_store(&store, "job")
        .connect()
        .await
        .unwrap();
    let (a, b) = (lock.new_owner(), lock.new_owner());
    let guard = lock.try_lock(&a).await.unwrap().expect("free lock");
    // A waiter subscribes with the store's client and wakes on the unlock message.
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move { lock.try_lock_for(&b, Duration::from_secs(5)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    guard.unlock().await.unwrap();
    let got = waiter.await.unwrap().unwrap();
    assert!(got.is_some(), "the waiter got the lock after the unlock");
}

#[tokio::test]
async fn calls_on_a_shared_manager_are_bounded_by_the_stores_response_timeout() {
    let server = RedisServer::start();
    // The service's manager has no response timeout of its own.
    let manager = redis::aio::ConnectionManager::new(server.client())
        .await
        .unwrap();
    let store = RedisStore::with_connection_manager(manager)
        .response_timeout(Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let limiter = RedisLimiter::new("hung", Quota::per_second(10).unwrap(), store).unwrap();
    assert!(limiter.acquire_now(1).await.unwrap().is_allowed());
    // Freeze the server: it accepts nothing and answers nothing until continued.
    let pid = server.pid().to_string();
    let signal = |sig: &str| {
        let status = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .expect("kill");
        assert!(status.success());
    };
    signal("-STOP");
    let started = Instant::now();
    let result = limiter.acquire_now(1).await;
    let waited = started.elapsed();
    signal("-CONT");
    assert!(
        matches!(result, Err(AcquireError::Store(StoreError::Timeout(t))) if t == Duration::from_millis(100)),
        "{result:?}"
    );
    assert!(waited < Duration::from_millis(600), "waited {waited:?}");
}

#[tokio::test]
async fn a_lock_refuses_a_store_it_cannot_share() {
    // A Sentinel store is never a single connection; lazy, so no Redis is needed.
    let store = RedisStore::sentinel_builder(["redis://127.0.0.1:1/"], "mymaster")
        .lazy_connect()
        .connect()
        .await
        .unwrap();
    assert!(store.connection_manager().is_none());
    let err = RedisLock::builder_on_store(&store, "job")
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, LockError::Config(msg) if msg.contains("single Redis")),
        "{err}"
    );
}

#[cfg(feature = "tls")]
#[tokio::test]
async fn tls_settings_on_a_shared_connection_are_a_config_error() {
    let server = RedisServer::start();
    let manager = redis::aio::ConnectionManager::new(server.client())
        .await
        .unwrap();
    let err = RedisStore::with_connection_manager(manager)
        .tls_root_certificate(b"-----BEGIN CERTIFICATE-----".to_vec())
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ratelease::BuildError::Config(msg) if msg.contains("redis::Client")),
        "{err}"
    );
}
