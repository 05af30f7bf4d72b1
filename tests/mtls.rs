//! Mutual TLS (feature `tls`, issue 16 item 4): a real redis-server started with
//! `--tls-auth-clients yes` serves a store that presents a client certificate signed by the CA
//! it trusts, and refuses one without a certificate, or with one from another CA, with an error
//! that says so. Bad PEM input is a configuration error, not a panic or a connect error.
#![cfg(feature = "tls")]

mod certs;
mod support;

use std::time::Duration;

use certs::{ca, cert};
use ratelease::{AcquireError, BuildError, Quota, RedisLimiter, RedisLock, RedisStore};
use rcgen::{CertifiedIssuer, KeyPair};
use support::{error_chain, BucketState, RedisServer};

/// A CA, a TLS-only server requiring client certificates from it, and a client certificate
/// from it.
struct Setup {
    ca: CertifiedIssuer<'static, KeyPair>,
    server: RedisServer,
    client_cert: String,
    client_key: String,
}

fn setup() -> Setup {
    let ca = ca("ratelease test CA");
    let (server_cert, server_key) = cert(&ca, &["127.0.0.1"]);
    let (client_cert, client_key) = cert(&ca, &["ratelease client"]);
    let server = RedisServer::start_mutual_tls(
        &server_cert,
        &server_key,
        &ca.pem(),
        &client_cert,
        &client_key,
    );
    // The server really requires client certificates.
    let auth: Vec<String> = server.cmd(&["CONFIG", "GET", "tls-auth-clients"]);
    assert_eq!(auth, ["tls-auth-clients", "yes"]);
    Setup {
        ca,
        server,
        client_cert,
        client_key,
    }
}

fn builder(s: &Setup) -> ratelease::RedisStoreBuilder {
    RedisStore::builder(s.server.url())
        .tls_root_certificate(s.ca.pem())
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
}

/// A store presenting the accepted client certificate, connected now or lazily.
async fn certified_store(s: &Setup, lazy: bool) -> RedisStore {
    let mut b = builder(s).tls_client_certificate(s.client_cert.clone(), s.client_key.clone());
    if lazy {
        b = b.lazy_connect();
    }
    b.connect().await.unwrap()
}

/// A rate so slow that nothing refills during a test.
fn slow(burst: u64) -> Quota {
    Quota::new(1, Duration::from_secs(3600))
        .unwrap()
        .with_burst(burst)
        .unwrap()
}

#[tokio::test]
async fn a_store_with_a_client_certificate_is_served() {
    let s = setup();
    for (name, lazy) in [("mtls", false), ("mtls-lazy", true)] {
        let store = certified_store(&s, lazy).await;
        let limiter = RedisLimiter::new(name, slow(3), store).unwrap();
        let mut allowed = Vec::new();
        for _ in 0..4 {
            allowed.push(limiter.acquire_now(1).await.unwrap().is_allowed());
        }
        assert_eq!(allowed, [true, true, true, false], "{name}");
        let state = BucketState::read(&s.server, &format!("ratelease:{{{name}}}"));
        assert!(state.is_some(), "{name}: no bucket on the server");
    }
}

/// A lock on the store (`RedisLock::builder_on_store`) shares its connection and its client —
/// certificate included — for its commands and for the unlock subscription a waiter uses, on
/// an eager and on a lazy store alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_on_an_mtls_store_shares_its_client_certificate() {
    let s = setup();
    for (name, lazy) in [("job", false), ("job-lazy", true)] {
        let store = certified_store(&s, lazy).await;
        // Polling so slow that only the subscription can wake the waiter within the test.
        let lock = RedisLock::builder_on_store(&store, name)
            .poll_interval(Duration::from_secs(30))
            .connect()
            .await
            .unwrap();
        let (me, them) = (lock.new_owner(), lock.new_owner());
        let mine = lock.try_lock(&me).await.unwrap().expect("free");
        assert!(
            lock.try_lock(&them).await.unwrap().is_none(),
            "{name}: held"
        );
        // A waiter is woken through the subscription when the lock is let go.
        let waiter = {
            let lock = lock.clone();
            tokio::spawn(async move { lock.lock(&them).await.map(|g| g.owner().task_id()) })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        mine.unlock().await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter was never woken")
            .unwrap()
            .unwrap();
        assert_eq!(got, them.task_id(), "{name}");
    }
}

#[tokio::test]
async fn a_client_without_an_accepted_certificate_is_refused_with_a_clear_error() {
    let s = setup();
    // No client certificate.
    let err = builder(&s).connect().await.unwrap_err();
    let BuildError::Config(msg) = &err else {
        panic!("expected a configuration error, got {err:?}")
    };
    let text = err.to_string();
    assert!(
        text.contains("requires a TLS client certificate")
            && msg.contains("CertificateRequired")
            && msg.contains("tls_client_certificate"),
        "{text}"
    );
    println!("without a certificate: {text}");

    // A certificate from a CA the server does not trust.
    let other = self::ca("some other CA");
    let (cert, key) = cert(&other, &["intruder"]);
    let err = builder(&s)
        .tls_client_certificate(cert, key)
        .connect()
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, BuildError::Config(_))
            && text.contains("refused this client's TLS certificate")
            && text.contains("UnknownCA"),
        "{err:?}"
    );
    println!("with another CA's certificate: {text}");

    // A lazy store builds, and each call reports the refusal as a store error.
    let store = builder(&s).lazy_connect().connect().await.unwrap();
    let limiter = RedisLimiter::new("refused", slow(3), store).unwrap();
    let err = limiter.acquire_now(1).await.unwrap_err();
    let text = error_chain(&err);
    assert!(
        matches!(err, AcquireError::Store(_)) && text.contains("CertificateRequired"),
        "{text}"
    );
    // Nothing was written.
    assert!(BucketState::read(&s.server, "ratelease:{refused}").is_none());
}

#[tokio::test]
async fn bad_pem_is_a_configuration_error() {
    let s = setup();
    let key = s.client_key.clone();
    let cases = [
        (
            "not a pem".to_owned(),
            key.clone(),
            "tls client certificate",
        ),
        (key.clone(), key.clone(), "tls client certificate"),
        (
            s.client_cert.clone(),
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n".to_owned(),
            "tls client key",
        ),
        (
            s.client_cert.clone(),
            s.client_cert.clone(),
            "tls client key",
        ),
    ];
    for (cert, key, culprit) in cases {
        let err = builder(&s)
            .tls_client_certificate(cert, key)
            .lazy_connect()
            .connect()
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, BuildError::Config(_)) && text.contains(culprit),
            "{culprit}: {err:?}"
        );
    }
    let err = builder(&s)
        .tls_root_certificate("garbage")
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, BuildError::Config(m) if m.contains("tls root certificate")),
        "{err:?}"
    );
    // A lock on a URL checks its root certificate the same way, before connecting.
    let err = RedisLock::builder(s.server.url(), "job")
        .tls_root_certificate("garbage")
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ratelease::LockError::Config(m) if m.contains("tls root certificate")),
        "{err:?}"
    );
}
