//! Every error's `Display` is one line that names what failed and why, and an anyhow-style
//! chain printer (each `source()` joined with ": ") prints each fact once (issue 14, item 4).
//! Store errors come from real `redis-server` addresses: one with nothing listening, and a
//! live server whose ACL refuses the call.

mod support;

use std::error::Error as StdError;
use std::net::TcpListener;
use std::time::Duration;

use ratelease::{
    AcquireError, Algorithm, BuildError, ConcurrencyLimiter, Decision, Error, HybridLimiter,
    KeyedHybridLimiter, LockError, MemoryStore, Quota, QuotaError, RedisLimiter, RedisLock,
    RedisStore, StoreError, Unconfigured,
};
#[cfg(feature = "toml")]
use ratelease::{ConfigFileError, LimitersConfig};

/// The chain is one line and names each fact exactly once.
fn says_once(e: &(dyn StdError + 'static), facts: &[&str]) -> String {
    let text = support::error_chain(e);
    println!("{text}");
    assert!(!text.contains('\n'), "one line: {text:?}");
    for fact in facts {
        assert_eq!(
            text.matches(fact).count(),
            1,
            "{fact:?} should appear once in {text:?}"
        );
    }
    text
}

/// A loopback port with nothing listening.
fn dead_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[tokio::test]
async fn an_unreachable_redis_is_named_without_its_password() {
    let port = dead_port();
    let url = format!("redis://:hunter2@127.0.0.1:{port}/");
    let err = RedisStore::builder(&url)
        .connect_timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(err, BuildError::Store(StoreError::Redis(_))),
        "{err:?}"
    );
    let text = says_once(
        &err,
        &["store failed", &format!("redis://:***@127.0.0.1:{port}/")],
    );
    assert!(!text.contains("hunter2") && !format!("{err:?}").contains("hunter2"));
    assert!(text.to_lowercase().contains("refused"), "why: {text}");

    // A URL that does not parse is a configuration error, still without its password.
    let err = RedisStore::connect("redis://:hunter2@127.0.0.1:notaport/")
        .await
        .unwrap_err();
    assert!(matches!(err, BuildError::Config(_)), "{err:?}");
    let text = says_once(
        &err,
        &[
            "invalid redis url",
            "redis://:***@127.0.0.1:notaport/",
            "rediss://",
        ],
    );
    assert!(!text.contains("hunter2"), "{text}");
    // A generated password with an unescaped '/' makes the URL invalid at the wrong place
    // (its authority ends at the '/'), and the error says so without the password.
    let err = RedisStore::connect("redis://:hunt/er2@127.0.0.1:6390/")
        .await
        .unwrap_err();
    assert!(matches!(err, BuildError::Config(_)), "{err:?}");
    let text = says_once(&err, &["invalid redis url", "redis://:***@127.0.0.1:6390/"]);
    assert!(
        !text.contains("er2") && !format!("{err:?}").contains("er2"),
        "{text}"
    );
    // A unix socket's password is a query parameter (redis-rs reads `pass=`).
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("absent.sock");
    let unix = format!("redis+unix://{}?pass=hunter2", socket.display());
    let err = RedisStore::connect(&unix).await.unwrap_err();
    let text = says_once(&err, &["pass=***"]);
    assert!(
        !text.contains("hunter2") && !format!("{err:?}").contains("hunter2"),
        "{text}"
    );

    // A call of a limiter on a lazy store names the server and the limiter's key.
    let store = RedisStore::builder(&url)
        .lazy_connect()
        .connect_timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let limiter = RedisLimiter::new("checkout", Quota::per_second(5).unwrap(), store).unwrap();
    let err = limiter.acquire_now(1).await.unwrap_err();
    let text = says_once(
        &err,
        &[
            "store failed",
            &format!("redis://:***@127.0.0.1:{port}/"),
            "ratelease:{checkout}",
        ],
    );
    assert!(!text.contains("hunter2"), "{text}");
    let AcquireError::Store(StoreError::Redis(failure)) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(failure.key(), Some("ratelease:{checkout}"));
    assert!(
        failure.is_connection_refusal() || failure.is_io_error(),
        "{failure:?}"
    );

    // A lock names the server too.
    let err = RedisLock::builder(&url, "job")
        .connect_timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Redis(_)), "{err:?}");
    let text = says_once(&err, &[&format!("redis://:***@127.0.0.1:{port}/")]);
    assert!(!text.contains("hunter2"), "{text}");
}

/// A server that is not Redis (an HTTP server on the port, say): one line that says the reply
/// could not be read and asks whether this is a Redis server's port, not redis-rs's parser
/// message over several lines.
#[tokio::test]
async fn a_server_that_is_not_redis_is_named_as_such_in_one_line() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buf = [0u8; 1024];
                let _ = socket.read(&mut buf).await;
                let _ = socket
                    .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                    .await;
            });
        }
    });
    let url = format!("redis://127.0.0.1:{port}/");
    let err = RedisStore::builder(&url)
        .connect_timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap_err();
    let text = says_once(
        &err,
        &["store failed", &url, "is this a Redis server's port?"],
    );
    assert!(
        matches!(&err, BuildError::Store(StoreError::Redis(f)) if f.kind() == redis::ErrorKind::Parse),
        "{err:?}: {text}"
    );
    server.abort();
}

#[tokio::test]
async fn an_acl_denial_says_what_redis_refused() {
    let server = support::RedisServer::start();
    let _: () = server.cmd(&["ACL", "SETUSER", "narrow", "on", ">pw", "~other:*", "+@all"]);
    let url = server.url().replace("redis://", "redis://narrow:pw@");
    let store = RedisStore::connect(url).await.unwrap();
    let limiter = RedisLimiter::new("api", Quota::per_second(5).unwrap(), store).unwrap();
    let err = limiter.acquire_now(1).await.unwrap_err();
    assert!(
        matches!(err, AcquireError::Store(StoreError::NoPermission(_))),
        "{err:?}"
    );
    says_once(&err, &["store failed", "ACL"]);
}

#[test]
fn quota_errors_name_the_quota_and_the_bound() {
    let err: Error = Quota::per_day(1)
        .and_then(|q| q.with_burst(1_000_000_000))
        .unwrap_err()
        .into();
    let text = says_once(
        &err,
        &["invalid quota", "burst 1000000000", "at most 52124"],
    );
    assert!(!text.contains("gcd") && !text.contains("2^52"), "{text}");
    let err: Error = QuotaError::ZeroBurst.into();
    says_once(&err, &["invalid quota", "burst must be at least 1"]);
    let err: Error = StoreError::Timeout(Duration::from_millis(50)).into();
    says_once(&err, &["store failed", "timed out after 50ms"]);
}

/// Errors are shaped by call (issue 12): a build fails with a `BuildError`, a decision with an
/// `AcquireError`, and `?` turns either into the umbrella `Error`, variant for variant, with the
/// same one-line text.
#[tokio::test]
async fn builds_and_decisions_fail_with_their_own_types_and_convert_into_error() {
    // A quota a fixed window cannot run under (its budget is its rate, not a larger burst).
    let quota = Quota::per_second(10).unwrap().with_burst(20).unwrap();
    let build = || {
        RedisLimiter::builder("window", quota, MemoryStore::new())
            .algorithm(Algorithm::FixedWindow)
            .build()
    };
    let err: BuildError = build().unwrap_err();
    assert!(
        matches!(&err, BuildError::Config(m) if m.contains("burst (20) must equal the rate (10)")),
        "{err:?}"
    );
    let text = says_once(&err, &["invalid configuration", "fixed-window"]);
    let built = || -> Result<RedisLimiter<MemoryStore>, Error> { Ok(build()?) };
    let umbrella = built().unwrap_err();
    assert!(matches!(umbrella, Error::Config(_)), "{umbrella:?}");
    assert_eq!(umbrella.to_string(), text);

    // Zero tokens, from a pure limiter's decision and a hybrid limiter's synchronous one.
    let pure =
        RedisLimiter::new("pure", Quota::per_second(5).unwrap(), MemoryStore::new()).unwrap();
    let err: AcquireError = pure.acquire_now(0).await.unwrap_err();
    assert!(matches!(err, AcquireError::ZeroTokens), "{err:?}");
    let text = says_once(&err, &["cannot acquire zero tokens"]);
    async fn decide(limiter: &RedisLimiter<MemoryStore>) -> Result<Decision, Error> {
        Ok(limiter.acquire_now(0).await?)
    }
    let umbrella = decide(&pure).await.unwrap_err();
    assert!(matches!(umbrella, Error::ZeroTokens), "{umbrella:?}");
    assert_eq!(umbrella.to_string(), text);

    let hybrid =
        HybridLimiter::new("hybrid", Quota::per_second(5).unwrap(), MemoryStore::new()).unwrap();
    let err: AcquireError = hybrid.try_acquire(0).unwrap_err();
    assert!(matches!(err, AcquireError::ZeroTokens), "{err:?}");
    let umbrella: Error = err.clone().into();
    assert!(matches!(umbrella, Error::ZeroTokens), "{umbrella:?}");
    // And into the boxed errors of `main` and tower, with the same text.
    let boxed: Box<dyn StdError + Send + Sync> = err.into();
    assert_eq!(boxed.to_string(), text);
    hybrid.shutdown().await;
}

/// Outside a tokio runtime a limiter with a background task cannot be built: `NoRuntime`, a
/// build's error, the same text under `Error`. The text names the builder's setter that fixes
/// it, and no one kind of limiter: keyed and concurrency builders return it too.
#[test]
fn no_runtime_is_a_build_error() {
    let quota = Quota::per_second(5).unwrap();
    let hybrid = HybridLimiter::new("api", quota, MemoryStore::new()).unwrap_err();
    let keyed = KeyedHybridLimiter::<String, _>::builder("api", quota, MemoryStore::new())
        .build()
        .unwrap_err();
    let concurrency = ConcurrencyLimiter::builder("api", 5, MemoryStore::new())
        .build()
        .unwrap_err();
    for err in [hybrid, keyed, concurrency] {
        assert!(matches!(err, BuildError::NoRuntime), "{err:?}");
        let text = says_once(&err, &["needs a tokio runtime", ".runtime(handle)"]);
        assert!(!text.contains("HybridLimiter"), "{text}");
        let umbrella = Error::from(err);
        assert!(matches!(umbrella, Error::NoRuntime), "{umbrella:?}");
        assert_eq!(umbrella.to_string(), text);
    }
}

/// A name without a stored quota, under `Unconfigured::Error`: the text names the limiter and
/// both ways out (store a quota, or build the limiter to run without one).
#[tokio::test]
async fn an_unconfigured_name_says_how_to_configure_it() {
    let quota = Quota::per_second(5).unwrap();
    let limiter = RedisLimiter::builder("api", quota, MemoryStore::new())
        .if_unconfigured(Unconfigured::Error)
        .build()
        .unwrap();
    let err = limiter.acquire_now(1).await.unwrap_err();
    assert!(matches!(err, AcquireError::Unconfigured(_)), "{err:?}");
    says_once(
        &err,
        &[
            "\"api\"",
            "ConfigStore::init_config",
            ".if_unconfigured(Unconfigured::UseQuota)",
        ],
    );
}

#[cfg(feature = "toml")]
#[test]
fn a_misspelt_key_points_at_its_line_and_the_file_is_not_copied() {
    let text = "[defaults]\nmode = \"hybrid\"\n\n[limiters.api]\nrate = 5\nbrust = 3\n";
    let err = LimitersConfig::from_toml(text).unwrap_err();
    let ConfigFileError::Parse(parse) = &err else {
        panic!("{err:?}")
    };
    assert_eq!((parse.line(), parse.column()), (6, 1), "{parse}");
    says_once(
        &err,
        &["invalid limiters file", "line 6, column 1", "`brust`"],
    );
    let debug = format!("{err:?}");
    assert!(!debug.contains("mode = "), "Debug holds no file: {debug}");

    // Indented and quoted keys, in a later table.
    let text = "[limiters.a]\nrate = 1\n\n[keyed.b]\nrate = 2\n  \"max_key\" = 3\n";
    let err = LimitersConfig::from_toml(text).unwrap_err();
    let ConfigFileError::Parse(parse) = &err else {
        panic!("{err:?}")
    };
    assert_eq!((parse.line(), parse.column()), (6, 3), "{parse}");

    // A value of the wrong type: its line, and the key it was given for.
    let err = LimitersConfig::from_toml("[limiters.a]\nrate = -5\n").unwrap_err();
    says_once(&err, &["line 2, column 8", "`rate`: invalid value"]);

    // Bad TOML: the parser's position; from a file, the path leads.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiters.toml");
    std::fs::write(&path, "[limiters.a]\nrate = = 5\n").unwrap();
    let err = LimitersConfig::load(&path).unwrap_err();
    let ConfigFileError::Parse(parse) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(parse.line(), 2, "{parse}");
    says_once(&err, &[&format!("{}:2:", path.display())]);

    // A file that cannot be read: the path once, the OS's reason once.
    let missing = dir.path().join("missing.toml");
    let err = LimitersConfig::load(&missing).unwrap_err();
    says_once(
        &err,
        &[&missing.display().to_string(), "No such file or directory"],
    );
}

#[tokio::test]
async fn a_lock_call_names_the_server_and_the_locks_key() {
    let mut server = support::RedisServer::start();
    let url = server.url();
    let lock = RedisLock::builder(&url, "invoice-42")
        .connect_timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    server.stop();
    let err = lock.try_lock(&lock.new_owner()).await.unwrap_err();
    assert!(matches!(err, LockError::Redis(_)), "{err:?}");
    says_once(&err, &[&url, "ratelease:{invoice-42}:lock"]);
}

/// With the `http` feature alone `PeerIp` does not read axum's `ConnectInfo`, so an axum server
/// that serves with connect info still answers every request with this error: the text names
/// the crate feature that reads it, not only the server setup the user already did.
#[cfg(feature = "http")]
#[test]
fn a_missing_peer_address_names_the_axum_feature() {
    let err = ratelease::http::KeyError::NoPeerAddr;
    says_once(
        &err,
        &[
            "no peer address",
            "with axum",
            "ratelease's `axum` feature",
            "request extensions",
        ],
    );
}

/// `?` into `ratelease::Error` works for the HTTP layer's and a limiters file's setup errors
/// too (they did not compile under it): each lands in `Config` with its own text, said once.
#[cfg(all(feature = "http", feature = "toml"))]
#[tokio::test]
async fn http_and_file_setup_errors_convert_into_error_with_their_text() {
    use ratelease::http::{InvalidPolicyName, InvalidProxy, LimitLayer, TrustedProxies};

    fn proxies() -> Result<TrustedProxies, Error> {
        Ok(TrustedProxies::new(["10.0.0.0/8", "10.0.0.0/33"])?)
    }
    fn named_layer() -> Result<(), Error> {
        let limiter = HybridLimiter::new("api", Quota::per_second(5)?, MemoryStore::new())?;
        let _layer = LimitLayer::global(limiter).policy_name("no spaces")?;
        Ok(())
    }
    fn file() -> Result<LimitersConfig, Error> {
        Ok(LimitersConfig::from_toml(
            "[limiters.a]\nrate = 5\nbrust = 3\n",
        )?)
    }

    let typed: InvalidProxy = TrustedProxies::new(["10.0.0.0/33"]).unwrap_err();
    let umbrella = proxies().unwrap_err();
    assert!(matches!(&umbrella, Error::Config(_)), "{umbrella:?}");
    let text = says_once(&umbrella, &["invalid configuration", "\"10.0.0.0/33\""]);
    assert_eq!(text, format!("invalid configuration: {typed}"));

    let umbrella = named_layer().unwrap_err();
    assert!(matches!(&umbrella, Error::Config(_)), "{umbrella:?}");
    let typed = InvalidPolicyName("no spaces".into());
    let text = says_once(&umbrella, &["invalid configuration", "\"no spaces\""]);
    assert_eq!(text, format!("invalid configuration: {typed}"));

    let typed: ConfigFileError =
        LimitersConfig::from_toml("[limiters.a]\nrate = 5\nbrust = 3\n").unwrap_err();
    let umbrella = file().unwrap_err();
    assert!(matches!(&umbrella, Error::Config(_)), "{umbrella:?}");
    let text = says_once(&umbrella, &["line 3, column 1", "`brust`"]);
    assert_eq!(text, format!("invalid configuration: {typed}"));
}
