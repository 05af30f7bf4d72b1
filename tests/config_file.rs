//! Limiters defined in a TOML file (feature `toml`): parsing, defaults, every refusal as a
//! typed error, and the built limiters enforcing their quotas on a real redis-server.
#![cfg(feature = "toml")]

mod support;

use std::time::Duration;

use ratelease::config_file::Mode;
use ratelease::{
    AnyLimiter, ConfigFileError, FailurePolicy, Limiter, LimitersConfig, Quota, RedisStore,
};
use support::RedisServer;

const FILE: &str = r#"
[defaults]
on_store_failure = "local_fallback"
expected_nodes = 10
horizon = "20ms"

[limiters.partner-api]
rate = 1000
burst = 100

[limiters.sms]
rate = 1
period = "30m"
mode = "pure"

[limiters.search]
rate = 200
period = "500ms"
lease_size = 20
on_store_failure = "fail_closed"
"#;

#[test]
fn a_file_parses_with_its_defaults_applied() {
    let file = LimitersConfig::from_toml(FILE).unwrap();
    assert_eq!(file.len(), 3);
    let api = file.get("partner-api").unwrap();
    assert_eq!(
        api.quota(),
        Quota::per_second(1_000).unwrap().with_burst(100).unwrap()
    );
    assert_eq!(api.mode(), Mode::Hybrid);
    assert_eq!(api.failure_policy(), FailurePolicy::local_fallback(10));

    let sms = file.get("sms").unwrap();
    assert_eq!(sms.mode(), Mode::Pure);
    assert_eq!(
        sms.quota(),
        Quota::new(1, Duration::from_secs(30 * 60)).unwrap()
    );

    let search = file.get("search").unwrap();
    assert_eq!(search.failure_policy(), FailurePolicy::FailClosed);
    assert_eq!(search.quota().period(), Duration::from_millis(500));
    assert_eq!(search.quota().burst(), 200, "burst defaults to the rate");
    assert!(file.get("other").is_none());
    let names: Vec<_> = file.iter().map(|s| s.name()).collect();
    assert_eq!(names, ["partner-api", "search", "sms"]);
}

/// Loads `text`, expecting an `Invalid` error about `limiter` that mentions `what`.
fn invalid(text: &str, limiter: &str, what: &str) {
    match LimitersConfig::from_toml(text) {
        Err(ConfigFileError::Invalid { limiter: l, reason }) => {
            assert_eq!(l, limiter);
            assert!(
                reason.contains(what),
                "{reason:?} does not mention {what:?}"
            );
        }
        other => panic!("{text}: expected Invalid({limiter}, {what}), got {other:?}"),
    }
}

/// Loads `text`, expecting a parse error that mentions `what`.
fn unparsable(text: &str, what: &str) {
    match LimitersConfig::from_toml(text) {
        Err(e @ ConfigFileError::Parse(_)) => {
            let message = e.to_string();
            assert!(
                message.contains(what),
                "{message:?} does not mention {what:?}"
            );
        }
        other => panic!("{text}: expected a parse error about {what:?}, got {other:?}"),
    }
}

#[test]
fn bad_files_are_typed_errors_naming_the_limiter_and_the_field() {
    invalid("[limiters.a]\nrate = 0", "a", "quota");
    invalid("[limiters.a]\nrate = 5\nburst = 0", "a", "quota");
    invalid("[limiters.a]\nrate = 5\nperiod = \"0s\"", "a", "quota");
    invalid("[limiters.a]\nrate = 9007199254740993", "a", "quota");
    invalid(
        "[limiters.a]\nrate = 5\nhorizon = \"5ms\"\nlease_size = 2",
        "a",
        "not both",
    );
    invalid(
        "[limiters.a]\nrate = 5\nlease_size = 6",
        "a",
        "exceeds the burst",
    );
    invalid("[limiters.a]\nrate = 5\nlease_size = 0", "a", "at least 1");
    invalid("[limiters.a]\nrate = 5\nhorizon = \"10us\"", "a", "1ms");
    invalid(
        "[limiters.a]\nrate = 5\nexpected_nodes = 0",
        "a",
        "expected_nodes",
    );
    invalid(
        "[limiters.a]\nrate = 5\nmode = \"pure\"\nlease_size = 2",
        "a",
        "hybrid mode",
    );
    invalid("[limiters.\"\"]\nrate = 5", "", "name");
    unparsable("[limiters.a]\nrate = 5\nrat = 6", "rat");
    unparsable("[limiters.a]\nrate = -5", "rate");
    unparsable("[limiters.a]\nrate = \"fast\"", "rate");
    unparsable("[limiters.a]\nrate = 5\nperiod = \"soon\"", "period");
    unparsable("[limiters.a]\nrate = 5\nmode = \"turbo\"", "turbo");
    unparsable("[defaults]\nburst = 5", "burst");
    unparsable("[limiters.a]\nperiod = \"1s\"", "rate");
    unparsable("limiters = 3", "limiters");
    let missing = LimitersConfig::load("/nonexistent/limiters.toml").unwrap_err();
    assert!(matches!(missing, ConfigFileError::Io { .. }), "{missing:?}");
}

#[tokio::test]
async fn the_built_limiters_enforce_their_quotas_on_redis() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiters.toml");
    std::fs::write(
        &path,
        r#"
        [defaults]
        expected_nodes = 2

        [limiters.hourly]
        rate = 3
        period = "1h"
        mode = "pure"

        [limiters.leased]
        rate = 1
        period = "1h"
        burst = 10
        lease_size = 5
        "#,
    )
    .unwrap();
    let store = RedisStore::connect(server.url()).await.unwrap();
    let limiters = LimitersConfig::load(&path).unwrap().build(&store).unwrap();

    let hourly = limiters.get("hourly").unwrap();
    assert!(matches!(hourly, AnyLimiter::Pure(_)));
    let mut admitted = 0;
    for _ in 0..10 {
        if hourly.try_acquire(1).await.unwrap().is_allowed() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 3, "a pure limiter admits exactly its burst");

    // Hybrid, fixed batches of 5 out of a burst of 10: two leases, then nothing.
    let leased = limiters.get("leased").unwrap();
    let AnyLimiter::Hybrid(hybrid) = leased else {
        panic!("expected a hybrid limiter, got {leased:?}")
    };
    let mut admitted = 0;
    for _ in 0..12 {
        if leased
            .try_acquire_for(1, Duration::from_millis(200))
            .await
            .unwrap()
            .is_allowed()
        {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 10);
    assert_eq!(hybrid.stats().tokens_leased, 10);
    // The spec's quota reached the store: its bucket of 10 is empty, so an exact pure
    // limiter on the same name is refused.
    let spec = LimitersConfig::load(&path).unwrap();
    let probe = spec
        .get("leased")
        .unwrap()
        .pure(store.clone())
        .build()
        .unwrap();
    assert!(!probe.try_acquire(1).await.unwrap().is_allowed());
    limiters.shutdown().await;
}
