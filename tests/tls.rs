//! `rediss://` (feature `tls`): a limiter works against a TLS-only redis-server whose
//! certificate is signed by a private CA it was told to trust, and a client that does not trust
//! that CA gets a clear certificate error instead of a connection.
#![cfg(feature = "tls")]

mod support;

use std::time::Duration;

use ratelease::{Error, Quota, RedisLimiter, RedisLock, RedisStore, StoreError};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use support::RedisServer;

/// A fresh CA: its PEM certificate and the issuer that signs with it.
fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

/// A TLS-only server with a certificate for 127.0.0.1 signed by `ca`.
fn server(ca: &CertifiedIssuer<'static, KeyPair>) -> RedisServer {
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, ca)
        .unwrap();
    RedisServer::start_tls(&cert.pem(), &key.serialize_pem(), &ca.pem())
}

fn quota() -> Quota {
    Quota::new(1, Duration::from_secs(3600))
        .unwrap()
        .with_burst(5)
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
    let limiter = RedisLimiter::new("tls", quota(), store).unwrap();
    let mut allowed = Vec::new();
    for _ in 0..6 {
        allowed.push(limiter.try_acquire(1).await.unwrap().is_allowed());
    }
    assert_eq!(allowed, [true, true, true, true, true, false]);
    // The state is really on this server, written over TLS.
    let v: Option<String> = server.cmd(&["HGET", "ratelease:{tls}", "v"]);
    assert!(v.is_some());

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
        let Error::Store(StoreError::Redis(e)) = &err else {
            panic!("expected a redis error, got {err:?}")
        };
        let message = e.to_string();
        assert!(
            message.contains("certificate") && message.contains("UnknownIssuer"),
            "{message}"
        );
    }
    // Plain `redis://` to the TLS port is not answered as Redis either.
    let plain = server.url().replace("rediss://", "redis://");
    let err = RedisStore::builder(plain)
        .connect_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Store(_)), "{err:?}");
}
