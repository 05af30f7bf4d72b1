//! Limiters defined in a TOML file (feature `toml`): parsing, defaults, every refusal as a
//! typed error, and the built limiters — plain, keyed and concurrency — enforcing their
//! quotas and limits on a `MemoryStore` and on a real redis-server.
#![cfg(feature = "toml")]

mod support;
mod wrapped;

use std::time::Duration;

use ratelease::config_file::Mode;
use ratelease::{
    Algorithm, AnyKeyedLimiter, AnyLimiter, ConcurrencyLimiter, ConcurrencyMode, ConcurrencyStore,
    ConfigFileError, FailurePolicy, KeyedLimiter, Limiter, LimitersConfig, LocalAnswer,
    MemoryStore, Quota, RedisStore, DEFAULT_HOLDER_TTL, DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_KEYS,
};
use support::RedisServer;

const FILE: &str = r#"
[defaults]
on_store_failure = "local-fallback"
expected_nodes = 10
horizon = "20ms"

[limiters.partner-api]
rate = 1000
burst = 100

[limiters.sms]
rate = 1
period = "30m"
mode = "pure"
algorithm = "sliding-window"

[limiters.search]
rate = 200
period = "500ms"
lease_size = 20
on_store_failure = "fail-closed"
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
    assert_eq!(sms.algorithm(), Algorithm::SlidingWindow);
    assert_eq!(api.algorithm(), Algorithm::TokenBucket);
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
        Err(ConfigFileError::Invalid {
            limiter: l, reason, ..
        }) => {
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

/// A bad value or a missing key in a table is blamed by the parser on the whole table: the
/// error names the table, and for a value it does not take, the line and the key.
#[test]
fn a_bad_value_names_its_table_line_and_key() {
    let text = "[defaults]\nexpected_nodes = 2\n\n[limiters.a]\nrate = 5\nmode = \"hybird\"\n";
    let Err(ConfigFileError::Parse(e)) = LimitersConfig::from_toml(text) else {
        panic!("expected a parse error");
    };
    assert_eq!(
        (e.table(), e.key(), e.line()),
        (Some("limiters.a"), Some("mode"), 6),
        "{e}"
    );
    assert!(
        e.to_string()
            .starts_with("at line 6, column 1: [limiters.a] `mode`: unknown variant `hybird`"),
        "{e}"
    );
    let Err(ConfigFileError::Parse(e)) = LimitersConfig::from_toml("[limiters.b]\nburst = 5\n")
    else {
        panic!("expected a parse error");
    };
    assert_eq!(e.table(), Some("limiters.b"), "{e}");
    assert!(
        e.to_string().contains("[limiters.b] missing field `rate`"),
        "{e}"
    );
    // A commented-out line with the value is not blamed, nor one of two lines that have it.
    let commented = "[limiters.a]\n# mode = \"hybird\"\nrate = 5\nmode = \"hybird\"\n";
    let Err(ConfigFileError::Parse(e)) = LimitersConfig::from_toml(commented) else {
        panic!("expected a parse error");
    };
    assert_eq!((e.line(), e.key()), (4, Some("mode")), "{e}");
    let twice = "[limiters.a]\nrate = 5\nmode = \"x\"\nalgorithm = \"x\"\n";
    let Err(ConfigFileError::Parse(e)) = LimitersConfig::from_toml(twice) else {
        panic!("expected a parse error");
    };
    assert_eq!((e.line(), e.table()), (1, Some("limiters.a")), "{e}");
    // An array where a number goes is not a table header.
    let Err(ConfigFileError::Parse(e)) = LimitersConfig::from_toml("[limiters.a]\nrate = [5]\n")
    else {
        panic!("expected a parse error");
    };
    assert_ne!(e.table(), Some("5"), "{e}");
}

/// A value of the wrong type (or out of range) for one of the keys every kind of table shares
/// (`mode`, `on_store_failure`, `expected_nodes`, `horizon`, `lease_size`) is blamed by the
/// parser on the table alone, since those keys are read after the rest: the error finds the
/// line and the key by the value (it said "line 1: [limiters.a] invalid type: string "10",
/// expected u32", naming neither).
#[test]
fn a_shared_key_of_the_wrong_type_names_its_line_and_key() {
    for (text, key, line) in [
        (
            "[limiters.a]\nrate = 5\nexpected_nodes = \"10\"",
            "expected_nodes",
            3,
        ),
        (
            "[limiters.a]\nrate = 5\n\nhorizon = \"25 mss\"",
            "horizon",
            4,
        ),
        ("[keyed.k]\nrate = 5\nlease_size = -1\n", "lease_size", 3),
        (
            "[defaults]\nexpected_nodes = true\n[limiters.a]\nrate = 5",
            "expected_nodes",
            2,
        ),
    ] {
        let Err(ConfigFileError::Parse(e)) = LimitersConfig::from_toml(text) else {
            panic!("{text}: expected a parse error");
        };
        assert_eq!((e.key(), e.line()), (Some(key), line), "{e}");
        assert!(e.to_string().contains(&format!("`{key}`: invalid")), "{e}");
    }
}

/// `expected_nodes` in a table whose failure policy keeps no local rate — fail open or
/// closed, or a pure limiter with no policy named — would be ignored: refused, as every
/// setting a limiter would not use is. (`[defaults]`' falls through to the limiters it sizes.)
#[test]
fn expected_nodes_where_no_policy_uses_it_is_refused() {
    for text in [
        "[limiters.a]\nrate = 5\nmode = \"pure\"\nexpected_nodes = 10",
        "[limiters.a]\nrate = 5\non_store_failure = \"fail-open\"\nexpected_nodes = 10",
        "[keyed.a]\nrate = 5\non_store_failure = \"fail-closed\"\nexpected_nodes = 10",
        "[defaults]\non_store_failure = \"fail-open\"\n[limiters.a]\nrate = 5\nexpected_nodes = 3",
        // A concurrency table's too (it was accepted and ignored).
        "[concurrency.a]\nlimit = 5\non_store_failure = \"fail-open\"\nexpected_nodes = 3",
        "[defaults]\non_store_failure = \"fail-closed\"\n[concurrency.a]\nlimit = 5\nbatch = 2\nexpected_nodes = 3",
    ] {
        invalid(text, "a", "expected_nodes");
        invalid(text, "a", "would ignore it");
    }
    for text in [
        "[limiters.a]\nrate = 5\nexpected_nodes = 10",
        "[limiters.a]\nrate = 5\nmode = \"pure\"\non_store_failure = \"last-known-share\"\nexpected_nodes = 10",
        "[defaults]\nexpected_nodes = 10\n[limiters.a]\nrate = 5\nmode = \"pure\"",
        "[concurrency.a]\nlimit = 5\nexpected_nodes = 3",
        "[concurrency.a]\nlimit = 5\non_store_failure = \"local-fallback\"\nexpected_nodes = 3",
    ] {
        LimitersConfig::from_toml(text).unwrap();
    }
}

/// An invalid limiter in a file read from disk names the file too.
#[test]
fn an_invalid_limiter_in_a_file_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiters.toml");
    std::fs::write(&path, "[limiters.a]\nrate = 0\n").unwrap();
    let err = LimitersConfig::load(&path).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(&err, ConfigFileError::Invalid { path: Some(p), .. } if p.ends_with("limiters.toml")),
        "{err:?}"
    );
    assert!(
        text.starts_with(&format!("{}: limiter \"a\": ", path.display())),
        "{text}"
    );
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
    invalid(
        "[limiters.a]\nrate = 5\nalgorithm = \"token-buckets\"",
        "a",
        "unknown algorithm",
    );
    // A window's budget is its rate; sliding windows cannot lease batches.
    invalid(
        "[limiters.a]\nrate = 5\nburst = 3\nalgorithm = \"fixed-window\"",
        "a",
        "burst",
    );
    invalid(
        "[limiters.a]\nrate = 5\nalgorithm = \"sliding-window\"",
        "a",
        "sliding-window",
    );
    invalid(
        "[limiters.a]\nrate = 5\nmode = \"pure\"\nalgorithm = \"leaky-bucket\"\nunconfigured = \"unlimited\"",
        "a",
        "token",
    );
    unparsable("[limiters.a]\nrate = 5\nrat = 6", "`rat`");
    unparsable("[limiters.a]\nrate = -5", "rate");
    unparsable("[limiters.a]\nrate = \"fast\"", "rate");
    unparsable("[limiters.a]\nrate = 5\nperiod = \"soon\"", "period");
    unparsable("[limiters.a]\nrate = 5\nmode = \"turbo\"", "turbo");
    unparsable("[defaults]\nburst = 5", "burst");
    unparsable("[limiters.a]\nperiod = \"1s\"", "rate");
    unparsable("limiters = 3", "limiters");
    let missing = LimitersConfig::load("/nonexistent/limiters.toml").unwrap_err();
    assert!(matches!(missing, ConfigFileError::Io { .. }), "{missing:?}");
    // One line that says why, and no source to say it again.
    let text = missing.to_string();
    assert!(
        text.starts_with("cannot read ") && text.contains("No such file"),
        "{text}"
    );
    assert!(std::error::Error::source(&missing).is_none());
}

/// A misspelt key in `[defaults]`, `[limiters.*]` or `[keyed.*]` is answered with the keys the
/// table takes, as in a `[concurrency.*]` table (serde named the key alone in the tables that
/// flatten their shared keys).
#[test]
fn an_unknown_key_lists_the_keys_its_table_takes() {
    let cases = [
        (
            "[defaults]\nmode = \"pure\"\nhorizn = \"5ms\"\n",
            "unknown field `horizn`, expected one of `algorithm`, `unconfigured`, `budget`, \
             `prefetch`, `mode`, `on_store_failure`, `expected_nodes`, `horizon`, `lease_size`",
        ),
        (
            "[limiters.api]\nrate = 5\nbrust = 3\n",
            "unknown field `brust`, expected one of `rate`, `period`, `burst`, `algorithm`, \
             `unconfigured`, `budget`, `prefetch`, `mode`, `on_store_failure`, \
             `expected_nodes`, `horizon`, `lease_size`",
        ),
        (
            "[keyed.\"per-user\"]\nrate = 5\nmax_key = 3\n",
            "unknown field `max_key`, expected one of `rate`, `period`, `burst`, `max_keys`, \
             `idle_ttl`, `give_back_after`, `max_in_flight`, `mode`, `on_store_failure`, \
             `expected_nodes`, `horizon`, `lease_size`",
        ),
    ];
    for (text, message) in cases {
        let Err(ConfigFileError::Parse(e)) = LimitersConfig::from_toml(text) else {
            panic!("{text}: expected a parse error");
        };
        assert_eq!(e.message(), message, "{text}");
        // Still the misspelt key's own line.
        assert_eq!(e.line(), 3, "{e}");
    }
    // In an inline table too, named by its key under the header (or by a dotted key).
    for text in [
        "[limiters]\napi = { rate = 5, brust = 3 }\n",
        "limiters.api = { rate = 5, brust = 3 }\n",
    ] {
        let Err(ConfigFileError::Parse(e)) = LimitersConfig::from_toml(text) else {
            panic!("{text}: expected a parse error");
        };
        assert_eq!(e.message(), cases[1].1, "{text}");
        // Named as the table it is, on its own line.
        assert_eq!(e.table(), Some("limiters.api"), "{text}");
        assert_eq!(e.key(), None, "{text}");
        assert!(
            e.to_string()
                .contains("[limiters.api] unknown field `brust`"),
            "{e}"
        );
    }
    let Err(ConfigFileError::Parse(e)) =
        LimitersConfig::from_toml("defaults = { mode = \"pure\", horizn = \"5ms\" }\n")
    else {
        panic!("expected a parse error");
    };
    assert_eq!(e.message(), cases[0].1);
    // A `[concurrency.*]` table's list is serde's own, not listed twice.
    let Err(ConfigFileError::Parse(e)) =
        LimitersConfig::from_toml("[concurrency.c]\nlimit = 5\nlimt = 3\n")
    else {
        panic!("expected a parse error");
    };
    assert_eq!(e.message().matches("expected one of").count(), 1, "{e}");
    assert!(e.message().contains("`idle_return`"), "{e}");
}

/// `prefetch = false` (in `[defaults]` or a table) builds hybrid limiters that lease on first
/// demand: nothing is asked until `ready` (which starts every first lease before it waits, so
/// they are in flight together) or a first check. On a pure limiter's table it is refused, in a
/// keyed table it is no key at all, and `[defaults]`' is skipped for pure limiters.
#[tokio::test(start_paused = true)]
async fn prefetch_false_leases_on_first_demand() {
    let text = "[defaults]\nprefetch = false\n\n\
                [limiters.a]\nrate = 100\n\n\
                [limiters.b]\nrate = 100\n\n\
                [limiters.c]\nrate = 100\nprefetch = true\n\n\
                [limiters.p]\nrate = 100\nmode = \"pure\"";
    let file = LimitersConfig::from_toml(text).unwrap();
    let prefetch: Vec<_> = file.iter().map(|s| (s.name(), s.prefetch())).collect();
    assert_eq!(
        prefetch,
        [("a", false), ("b", false), ("c", true), ("p", true)],
        "a table's own prefetch wins; [defaults]' is skipped for a pure limiter"
    );
    invalid(
        "[limiters.p]\nrate = 5\nmode = \"pure\"\nprefetch = false",
        "p",
        "hybrid mode",
    );
    unparsable("[keyed.k]\nrate = 5\nprefetch = false", "prefetch");
    // A store 10 ms away.
    let store = wrapped::Wrapped::new(Duration::from_millis(10));
    let limiters = file.build(&store).unwrap();
    let hybrid = |name| match limiters.get(name) {
        Some(AnyLimiter::Hybrid(l)) => l.clone(),
        other => panic!("{name}: expected a hybrid limiter, got {other:?}"),
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let leases = |name| hybrid(name).stats().leases;
    assert_eq!((leases("a"), leases("b"), leases("c")), (0, 0, 1));
    let started = tokio::time::Instant::now();
    limiters.ready().await.unwrap();
    assert_eq!((leases("a"), leases("b"), leases("c")), (1, 1, 1));
    assert!(hybrid("a").available() > 0 && hybrid("b").available() > 0);
    // One round trip for all, not one each: a's and b's first leases and the pure p's call
    // (c's lease was answered at its build).
    assert!(
        started.elapsed() < Duration::from_millis(15),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        store
            .max_in_flight
            .load(std::sync::atomic::Ordering::SeqCst),
        3
    );
    limiters.shutdown().await;
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

        [limiters.windowed]
        rate = 4
        period = "1h"
        mode = "pure"
        algorithm = "fixed-window"
        "#,
    )
    .unwrap();
    let store = RedisStore::connect(server.url()).await.unwrap();
    let limiters = LimitersConfig::load(&path).unwrap().build(&store).unwrap();
    // A warm start: once ready, the hybrid limiter holds its first batch, so its first check
    // is answered locally.
    limiters.ready().await.unwrap();
    let Some(AnyLimiter::Hybrid(warm)) = limiters.get("leased") else {
        panic!("expected a hybrid limiter")
    };
    assert_eq!(warm.available(), 5, "{:?}", warm.stats());

    let hourly = limiters.get("hourly").unwrap();
    assert!(matches!(hourly, AnyLimiter::Pure(_)));
    let mut admitted = 0;
    for _ in 0..10 {
        if hourly.acquire_now(1).await.unwrap().is_allowed() {
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
    assert!(!probe.acquire_now(1).await.unwrap().is_allowed());
    limiters.shutdown().await;
}

const KINDS: &str = r#"
[defaults]
mode = "hybrid"
on_store_failure = "fail-closed"
expected_nodes = 4
algorithm = "fixed-window"   # plain limiters only: keyed limiters are token buckets
unconfigured = "unlimited"   # plain limiters only
budget = "per-client"        # plain limiters only
horizon = "30ms"             # hybrid plain and keyed limiters; not concurrency limiters

[keyed.per-user]
rate = 5
period = "1m"
max_keys = 1000
idle_ttl = "2m"
give_back_after = "1s"
max_in_flight = 8

[keyed.per-ip]
rate = 10
burst = 4
mode = "pure"

[concurrency.exports]
limit = 20
ttl = "30s"
batch = 4
idle_return = "250ms"

[concurrency.gpu]
limit = 3
expected_nodes = 2
on_store_failure = "local-fallback"
"#;

#[test]
fn keyed_and_concurrency_tables_parse_with_defaults_applied() {
    let file = LimitersConfig::from_toml(KINDS).unwrap();
    assert_eq!(file.len(), 4);
    assert!(!file.is_empty());
    assert_eq!(file.iter().count(), 0, "no [limiters.*] tables");

    let user = file.keyed("per-user").unwrap();
    assert_eq!(user.name(), "per-user");
    assert_eq!(user.quota(), Quota::per_minute(5).unwrap());
    assert_eq!(user.mode(), Mode::Hybrid);
    assert_eq!(user.failure_policy(), FailurePolicy::FailClosed);
    assert_eq!(user.max_keys(), 1000);
    assert_eq!(user.idle_ttl(), Some(Duration::from_secs(120)));
    assert_eq!(user.give_back_after(), Some(Duration::from_secs(1)));
    assert_eq!(user.max_in_flight(), 8);

    let ip = file.keyed("per-ip").unwrap();
    assert_eq!(ip.mode(), Mode::Pure);
    assert_eq!(
        ip.quota(),
        Quota::per_second(10).unwrap().with_burst(4).unwrap()
    );
    // `[defaults]`' fail-closed, which keeps no local rate: the pure keyed limiter's too.
    assert_eq!(ip.failure_policy(), FailurePolicy::FailClosed);
    assert_eq!(ip.pure_failure_policy(), Some(FailurePolicy::FailClosed));
    assert_eq!(ip.max_keys(), DEFAULT_MAX_KEYS);
    assert_eq!(ip.idle_ttl(), None);
    assert_eq!(ip.give_back_after(), None);
    assert_eq!(ip.max_in_flight(), DEFAULT_MAX_IN_FLIGHT);

    let exports = file.concurrency("exports").unwrap();
    assert_eq!(exports.name(), "exports");
    assert_eq!(exports.limit(), 20);
    assert_eq!(exports.ttl(), Duration::from_secs(30));
    assert_eq!(exports.mode(), ConcurrencyMode::Hybrid { batch: 4 });
    assert_eq!(exports.failure_policy(), FailurePolicy::FailClosed);

    // `[defaults]`' mode = "hybrid" does not make a concurrency limiter without a batch
    // hybrid; its failure keys are its own.
    let gpu = file.concurrency("gpu").unwrap();
    assert_eq!(gpu.mode(), ConcurrencyMode::Pure);
    assert_eq!(gpu.ttl(), DEFAULT_HOLDER_TTL);
    assert_eq!(gpu.failure_policy(), FailurePolicy::local_fallback(2));

    assert!(file.keyed("exports").is_none());
    assert!(file.concurrency("per-user").is_none());
    assert!(file.get("per-user").is_none());
    let keyed: Vec<_> = file.iter_keyed().map(|s| s.name()).collect();
    assert_eq!(keyed, ["per-ip", "per-user"]);
    let concurrency: Vec<_> = file.iter_concurrency().map(|s| s.name()).collect();
    assert_eq!(concurrency, ["exports", "gpu"]);

    // `[defaults]` mode = "pure" applies to keyed limiters, not to concurrency limiters
    // (a batch makes them hybrid), and its lease keys are skipped for pure limiters.
    let file = LimitersConfig::from_toml(
        "[defaults]\nmode = \"pure\"\nlease_size = 50\n\
         [keyed.k]\nrate = 5\n[concurrency.c]\nlimit = 4\nbatch = 2\n\
         [limiters.l]\nrate = 1",
    )
    .unwrap();
    assert_eq!(file.keyed("k").unwrap().mode(), Mode::Pure);
    assert_eq!(file.get("l").unwrap().mode(), Mode::Pure);
    assert_eq!(
        file.concurrency("c").unwrap().mode(),
        ConcurrencyMode::Hybrid { batch: 2 }
    );
}

#[test]
fn bad_keyed_and_concurrency_tables_are_typed_errors_naming_the_limiter_and_the_field() {
    invalid("[keyed.k]\nrate = 0", "k", "quota");
    invalid("[keyed.k]\nrate = 5\nperiod = \"0s\"", "k", "quota");
    invalid("[keyed.k]\nrate = 5\nmax_keys = 0", "k", "max_keys");
    invalid(
        "[keyed.k]\nrate = 5\nmax_in_flight = 0",
        "k",
        "max_in_flight",
    );
    invalid("[keyed.k]\nrate = 5\nidle_ttl = \"100ms\"", "k", "idle_ttl");
    invalid(
        "[keyed.k]\nrate = 5\nexpected_nodes = 0",
        "k",
        "expected_nodes",
    );
    invalid(
        "[keyed.k]\nrate = 5\nlease_size = 6",
        "k",
        "exceeds the burst",
    );
    invalid("[keyed.k]\nrate = 5\nhorizon = \"10us\"", "k", "1ms");
    invalid(
        "[keyed.k]\nrate = 5\nhorizon = \"5ms\"\nlease_size = 2",
        "k",
        "not both",
    );
    for key in [
        "max_keys = 5",
        "idle_ttl = \"1m\"",
        "give_back_after = \"1s\"",
        "max_in_flight = 4",
    ] {
        let field = key.split(' ').next().unwrap();
        invalid(
            &format!("[keyed.k]\nrate = 5\nmode = \"pure\"\n{key}"),
            "k",
            field,
        );
    }
    invalid(
        "[keyed.k]\nrate = 5\nmode = \"pure\"\nlease_size = 2",
        "k",
        "hybrid mode",
    );
    // A default that does not fit a hybrid keyed limiter's burst is that limiter's error.
    invalid(
        "[defaults]\nlease_size = 20\n[keyed.k]\nrate = 5",
        "k",
        "exceeds the burst",
    );
    invalid("[keyed.\"\"]\nrate = 5", "", "name");
    // Keyed names leave room for the key in every bucket name.
    let long = "n".repeat(900);
    invalid(
        &format!("[keyed.{long}]\nrate = 5"),
        &long,
        "keyed limiter name",
    );
    LimitersConfig::from_toml(&format!("[limiters.{long}]\nrate = 5")).unwrap();

    invalid("[concurrency.c]\nlimit = 0", "c", "limit");
    invalid("[concurrency.c]\nlimit = 9007199254740993", "c", "limit");
    invalid("[concurrency.c]\nlimit = 5\nttl = \"2ms\"", "c", "ttl");
    invalid("[concurrency.c]\nlimit = 5\nbatch = 0", "c", "batch");
    invalid("[concurrency.c]\nlimit = 5\nbatch = 6", "c", "batch");
    invalid(
        "[concurrency.c]\nlimit = 5\nmode = \"hybrid\"",
        "c",
        "batch",
    );
    invalid(
        "[concurrency.c]\nlimit = 5\nmode = \"pure\"\nbatch = 2",
        "c",
        "batch",
    );
    invalid(
        "[concurrency.c]\nlimit = 5\nidle_return = \"1s\"",
        "c",
        "idle_return",
    );
    invalid(
        "[concurrency.c]\nlimit = 5\nexpected_nodes = 0",
        "c",
        "expected_nodes",
    );
    invalid(
        "[defaults]\nexpected_nodes = 0\n[concurrency.c]\nlimit = 5",
        "c",
        "expected_nodes",
    );
    invalid("[concurrency.\"\"]\nlimit = 5", "", "name");

    // Names are unique across kinds.
    invalid(
        "[limiters.sms]\nrate = 1\n[keyed.sms]\nrate = 1",
        "sms",
        "[limiters.sms] and [keyed.sms]",
    );
    invalid(
        "[keyed.x]\nrate = 1\n[concurrency.x]\nlimit = 1",
        "x",
        "unique across kinds",
    );

    // Keys of another kind, misspelt keys, missing and wrongly typed values.
    unparsable(
        "[keyed.k]\nrate = 5\nalgorithm = \"fixed-window\"",
        "algorithm",
    );
    unparsable("[keyed.k]\nrate = 5\nbudget = \"overall\"", "budget");
    unparsable("[keyed.k]\nrate = 5\nmax_key = 3", "`max_key`");
    unparsable("[keyed.k]\nrate = 5\nbatch = 3", "batch");
    unparsable("[keyed.k]\nperiod = \"1s\"", "rate");
    unparsable("[keyed.k]\nrate = 5\nidle_ttl = \"later\"", "idle_ttl");
    unparsable("[keyed.k]\nrate = 5\nmax_keys = -1", "max_keys");
    unparsable("[concurrency.c]\nlimit = 5\nrate = 5", "rate");
    unparsable("[concurrency.c]\nlimit = 5\nhorizon = \"5ms\"", "horizon");
    unparsable("[concurrency.c]\nlimit = 5\nmax_keys = 5", "max_keys");
    unparsable("[concurrency.c]\nttl = \"5s\"", "limit");
    unparsable("[concurrency.c]\nlimit = \"many\"", "limit");
    unparsable("[concurrency.c]\nlimit = 5\nmode = \"turbo\"", "turbo");
    unparsable("[defaults]\nmax_keys = 5", "max_keys");
    unparsable("[defaults]\nlimit = 5", "limit");
    unparsable("keyed = 3", "keyed");
    unparsable("[concurency.c]\nlimit = 5", "concurency");
}

/// Takes one token of `key` at a time until refused (waiting for each lease), and returns
/// how many were admitted.
async fn admitted<L: KeyedLimiter<String>>(limiter: &L, key: &str, tries: u32) -> u32 {
    let mut admitted = 0;
    for _ in 0..tries {
        if limiter
            .try_acquire_for(key, 1, Duration::from_millis(200))
            .await
            .unwrap()
            .is_allowed()
        {
            admitted += 1;
        }
    }
    admitted
}

const BUILT: &str = r#"
[keyed.hourly]
rate = 3
period = "1h"

[keyed.hourly-pure]
rate = 4
period = "1h"
mode = "pure"

[keyed.batched]
rate = 1
period = "1h"
burst = 10
lease_size = 5

[concurrency.pure]
limit = 3

[concurrency.leased]
limit = 3
batch = 2
"#;

#[tokio::test]
async fn a_keyed_limiter_from_the_file_gives_each_key_exactly_its_burst() {
    let store = MemoryStore::new();
    let limiters = LimitersConfig::from_toml(BUILT)
        .unwrap()
        .build(&store)
        .unwrap();
    assert_eq!(limiters.iter_keyed().count(), 3);

    let hourly = limiters.keyed("hourly").unwrap();
    assert!(matches!(hourly, AnyKeyedLimiter::Hybrid(_)), "{hourly:?}");
    assert_eq!(hourly.name(), "hourly");
    assert_eq!(admitted(hourly, "alice", 8).await, 3);
    assert_eq!(
        admitted(hourly, "bob", 8).await,
        3,
        "every key has a budget"
    );
    // The hybrid answers synchronously through the trait: alice is spent.
    let now = KeyedLimiter::<String>::local_answer(hourly, "alice", 1).expect("hybrid");
    assert!(matches!(now.unwrap(), LocalAnswer::Denied { .. }));

    let pure = limiters.keyed("hourly-pure").unwrap();
    assert!(matches!(pure, AnyKeyedLimiter::Pure(_)), "{pure:?}");
    assert_eq!(admitted(pure, "alice", 8).await, 4);
    assert_eq!(admitted(pure, "carol", 8).await, 4);
    assert!(KeyedLimiter::<String>::local_answer(pure, "carol", 1).is_none());
    assert_eq!(
        KeyedLimiter::<String>::quota(pure),
        Quota::new(4, Duration::from_secs(3600)).unwrap()
    );

    // Fixed batches of 5 for a hot key, out of a burst of 10: exactly 10, no more.
    let batched = limiters.keyed("batched").unwrap();
    assert_eq!(admitted(batched, "dave", 14).await, 10);
    // The budget is in the store, under the key's bucket: a fresh build finds it spent.
    let again = LimitersConfig::from_toml(BUILT)
        .unwrap()
        .keyed("batched")
        .unwrap()
        .pure(store.clone())
        .unwrap();
    assert_eq!(batched.bucket_name("dave"), again.bucket_name("dave"));
    assert!(!again.acquire_now("dave", 1).await.unwrap().is_allowed());
    limiters.shutdown().await;
}

#[tokio::test]
async fn keyed_limiters_can_be_built_with_any_key_type() {
    let store = MemoryStore::new();
    let file = LimitersConfig::from_toml(BUILT).unwrap();
    let by_id = file.build_with_keys::<u64, _>(&store).unwrap();
    let hourly = by_id.keyed("hourly").unwrap();
    let mut admitted = 0;
    for _ in 0..5 {
        if hourly
            .try_acquire_for(&42, 1, Duration::from_millis(200))
            .await
            .unwrap()
            .is_allowed()
        {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 3);
    // One keyed limiter with a key type of its own; keys that print alike share a bucket.
    let by_name = file
        .keyed("hourly")
        .unwrap()
        .build::<String, _>(store.clone())
        .unwrap();
    assert!(!by_name
        .try_acquire_for("42", 1, Duration::from_millis(200))
        .await
        .unwrap()
        .is_allowed());
    by_name.shutdown().await;
    by_id.shutdown().await;
}

/// Takes single permits from `limiter` until refused; returns them.
async fn fill<S: ConcurrencyStore>(limiter: &ConcurrencyLimiter<S>) -> Vec<ratelease::Permit> {
    let mut permits = Vec::new();
    for _ in 0..10 {
        match limiter
            .try_acquire_for(1, Duration::from_millis(50))
            .await
            .unwrap()
        {
            Some(permit) => permits.push(permit),
            None => break,
        }
    }
    permits
}

#[tokio::test]
async fn a_concurrency_limiter_from_the_file_refuses_the_permit_over_its_limit() {
    let store = MemoryStore::new();
    let limiters = LimitersConfig::from_toml(BUILT)
        .unwrap()
        .build(&store)
        .unwrap();
    for name in ["pure", "leased"] {
        let limiter = limiters.concurrency(name).unwrap();
        assert_eq!(limiter.name(), name);
        assert_eq!(limiter.limit(), 3);
        let mut permits = fill(limiter).await;
        assert_eq!(permits.len(), 3, "{name}: the limit, then no more");
        assert!(limiter.acquire_now(1).await.unwrap().is_none(), "{name}");
        permits.pop();
        assert!(
            limiter
                .try_acquire_for(1, Duration::from_secs(1))
                .await
                .unwrap()
                .is_some(),
            "{name}: a dropped permit's slot comes back"
        );
    }
    assert_eq!(
        limiters.concurrency("pure").unwrap().mode(),
        ConcurrencyMode::Pure
    );
    let leased = limiters.concurrency("leased").unwrap();
    assert_eq!(leased.mode(), ConcurrencyMode::Hybrid { batch: 2 });
    assert_eq!(limiters.iter_concurrency().count(), 2);
    limiters.shutdown().await;
}

#[tokio::test]
async fn keyed_and_concurrency_limiters_from_a_file_hold_across_processes_on_redis() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("limiters.toml");
    std::fs::write(
        &path,
        r#"
        [defaults]
        expected_nodes = 2
        on_store_failure = "fail-closed"

        [keyed.sms]
        rate = 3
        period = "1h"

        [concurrency.exports]
        limit = 3
        batch = 1
        ttl = "5s"
        idle_return = "20ms"
        "#,
    )
    .unwrap();
    // Two processes: each loads the file and builds on a connection of its own.
    let file = LimitersConfig::load(&path).unwrap();
    let store = RedisStore::connect(server.url()).await.unwrap();
    let a = file.build(&store).unwrap();
    let b = file
        .build(&RedisStore::connect(server.url()).await.unwrap())
        .unwrap();

    let (sms_a, sms_b) = (a.keyed("sms").unwrap(), b.keyed("sms").unwrap());
    let mut admitted = 0;
    for i in 0..10 {
        let node = if i % 2 == 0 { sms_a } else { sms_b };
        if node
            .try_acquire_for("+4912345", 1, Duration::from_millis(500))
            .await
            .unwrap()
            .is_allowed()
        {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 3, "one budget per key across the fleet");
    assert!(sms_b
        .try_acquire_for("+4967890", 1, Duration::from_millis(500))
        .await
        .unwrap()
        .is_allowed());
    let bucket = store.key(&sms_a.bucket_name("+4912345"));
    let exists: i64 = server.cmd(&["EXISTS", &bucket]);
    assert_eq!(exists, 1, "the key's bucket {bucket} is in Redis");

    let (ex_a, ex_b) = (
        a.concurrency("exports").unwrap(),
        b.concurrency("exports").unwrap(),
    );
    let held_a = fill(ex_a).await;
    let held_b = fill(ex_b).await;
    assert_eq!(
        held_a.len() + held_b.len(),
        3,
        "the limit holds across processes"
    );
    assert!(ex_b.acquire_now(1).await.unwrap().is_none());
    drop(held_a);
    // A's pool goes back to the store once idle (`idle_return`), and B gets a slot.
    let more = ex_b
        .try_acquire_for(1, Duration::from_secs(2))
        .await
        .unwrap();
    assert!(
        more.is_some(),
        "slots dropped in one process serve the other"
    );
    drop((held_b, more));
    a.shutdown().await;
    b.shutdown().await;
}

#[test]
fn the_failure_policy_defaults_to_the_last_known_share_and_reaches_pure_limiters_when_named() {
    let file = LimitersConfig::from_toml(
        r#"
        [defaults]
        expected_nodes = 4

        [limiters.plain]
        rate = 10

        [limiters.pure-default]
        rate = 10
        mode = "pure"

        [limiters.pure-named]
        rate = 10
        mode = "pure"
        on_store_failure = "last-known-share"
        "#,
    )
    .unwrap();
    let plain = file.get("plain").unwrap();
    assert_eq!(plain.failure_policy(), FailurePolicy::last_known_share(4));
    let store = ratelease::MemoryStore::new();
    // A pure limiter returns store errors unless the file names a policy.
    let unnamed = file.get("pure-default").unwrap().pure(store.clone());
    assert_eq!(unnamed.build().unwrap().failure_policy(), None);
    let named = file.get("pure-named").unwrap().pure(store);
    assert_eq!(
        named.build().unwrap().failure_policy(),
        Some(FailurePolicy::last_known_share(4))
    );
}

/// A pure keyed limiter keeps no per-key state, so of the failure policies it takes only
/// fail-open and fail-closed, named in its own `[keyed.*]` table or in `[defaults]`; one in
/// its table that enforces a local rate (or sets `expected_nodes`) is refused rather than
/// built without it, and `[defaults]`' local-rate policy and `expected_nodes` are skipped for
/// it, as the hybrid-only keys are.
#[test]
fn a_pure_keyed_table_takes_fail_open_or_closed_and_refuses_a_local_rate() {
    for (key, policy) in [
        ("fail-open", FailurePolicy::FailOpen),
        ("fail-closed", FailurePolicy::FailClosed),
    ] {
        let text = format!("[keyed.k]\nrate = 5\nmode = \"pure\"\non_store_failure = \"{key}\"");
        let file = LimitersConfig::from_toml(&text).unwrap();
        let spec = file.keyed("k").unwrap();
        assert_eq!(spec.pure_failure_policy(), Some(policy));
        let built = spec.pure(MemoryStore::new()).unwrap();
        assert_eq!(built.failure_policy(), Some(policy));
    }
    for key in [
        "on_store_failure = \"last-known-share\"",
        "on_store_failure = \"local-fallback\"",
        "expected_nodes = 4",
    ] {
        let field = key.split(' ').next().unwrap();
        let text = format!("[keyed.k]\nrate = 5\nmode = \"pure\"\n{key}");
        invalid(&text, "k", field);
        invalid(&text, "k", "no per-key state");
        invalid(&text, "k", "mode = \"hybrid\"");
        // In hybrid mode the same keys are the limiter's policy.
        let hybrid = text.replace("\"pure\"", "\"hybrid\"");
        LimitersConfig::from_toml(&hybrid).unwrap();
    }
}

/// `[defaults]`' fail-open or fail-closed reaches a pure keyed limiter, as it reaches a pure
/// plain one (it was ignored: the limiter returned the store's errors); its own table's name
/// comes first; a local-rate policy in `[defaults]` is skipped for it, which then has none.
#[test]
fn a_pure_keyed_table_takes_fail_open_or_closed_from_defaults() {
    let pure_keyed = |defaults: &str, own: &str| {
        let text = format!(
            "[defaults]\n{defaults}\n[keyed.k]\nrate = 5\nmode = \"pure\"\n{own}\n\
             [limiters.p]\nrate = 5\nmode = \"pure\""
        );
        let file = LimitersConfig::from_toml(&text).unwrap();
        let spec = file.keyed("k").unwrap().clone();
        assert_eq!(spec.mode(), Mode::Pure);
        let plain = file
            .get("p")
            .unwrap()
            .pure(MemoryStore::new())
            .build()
            .unwrap();
        (spec, plain.failure_policy())
    };
    for (name, policy) in [
        ("fail-open", FailurePolicy::FailOpen),
        ("fail-closed", FailurePolicy::FailClosed),
    ] {
        let defaults = format!("on_store_failure = \"{name}\"\nexpected_nodes = 4");
        let (spec, plain) = pure_keyed(&defaults, "");
        assert_eq!(
            plain,
            Some(policy),
            "the pure plain limiter's, for comparison"
        );
        assert_eq!(spec.pure_failure_policy(), Some(policy), "{name}");
        let built = spec.pure(MemoryStore::new()).unwrap();
        assert_eq!(built.failure_policy(), Some(policy), "{name}");
    }
    // The table's own name first.
    let (spec, _) = pure_keyed(
        "on_store_failure = \"fail-open\"",
        "on_store_failure = \"fail-closed\"",
    );
    assert_eq!(spec.pure_failure_policy(), Some(FailurePolicy::FailClosed));
    // A local rate the limiter cannot keep: skipped, as documented.
    for name in ["local-fallback", "last-known-share"] {
        let defaults = format!("on_store_failure = \"{name}\"\nexpected_nodes = 4");
        let (spec, plain) = pure_keyed(&defaults, "");
        assert!(plain.is_some(), "{name}");
        assert_eq!(spec.pure_failure_policy(), None, "{name}");
        let built = spec.pure(MemoryStore::new()).unwrap();
        assert_eq!(built.failure_policy(), None, "{name}");
    }
}

/// A layer over a file-built hybrid limiter waits for a first lease as over one built in code:
/// `local_answer` says a lease is still to come (not "denied"), and `try_acquire_or_lease`
/// waits for it and admits.
#[tokio::test]
async fn file_built_hybrid_limiters_wait_for_their_first_lease() {
    let file =
        LimitersConfig::from_toml("[limiters.api]\nrate = 100\n[keyed.per-user]\nrate = 10\n")
            .unwrap();
    let store = MemoryStore::new();
    let limiters = file.build(&store).unwrap();
    let api = limiters.get("api").unwrap();
    // Built a moment ago on a current-thread runtime: its first lease has not run yet.
    assert!(matches!(
        api.local_answer(1),
        Some(Ok(LocalAnswer::NeedsLease { .. }))
    ));
    let wait = Duration::from_secs(1);
    assert!(api
        .try_acquire_or_lease(1, wait)
        .await
        .unwrap()
        .is_allowed());
    let per_user = limiters.keyed("per-user").unwrap();
    assert!(matches!(
        per_user.local_answer("ada", 1),
        Some(Ok(LocalAnswer::NeedsLease { .. }))
    ));
    assert!(per_user
        .try_acquire_or_lease("ada", 1, wait)
        .await
        .unwrap()
        .is_allowed());
}
