//! Bad input gets a typed error, never a panic and never corrupt state in Redis.

mod support;

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use ratelease::{
    Error, HybridLimiter, MemoryStore, Quota, QuotaError, RedisLimiter, RedisStore,
    TOKEN_BUCKET_LUA,
};
use support::RedisServer;

#[test]
fn invalid_quotas_are_typed_errors() {
    assert_eq!(Quota::per_second(0), Err(QuotaError::ZeroRate));
    assert_eq!(Quota::new(5, Duration::ZERO), Err(QuotaError::ZeroPeriod));
    assert_eq!(
        Quota::per_second(5).and_then(|q| q.with_burst(0)),
        Err(QuotaError::ZeroBurst)
    );
    assert!(matches!(
        Quota::per_second(u64::MAX),
        Err(QuotaError::TooLarge(_))
    ));
    assert!(matches!(
        Quota::with_parts(1, Duration::from_secs(u64::MAX), 1),
        Err(QuotaError::TooLarge(_))
    ));
    assert!(matches!(
        Quota::per_second(1).and_then(|q| q.with_burst(u64::MAX)),
        Err(QuotaError::TooLarge(_))
    ));
    let e: Error = QuotaError::ZeroRate.into();
    assert!(e.to_string().contains("invalid quota"));
}

#[tokio::test]
async fn invalid_requests_are_typed_errors_in_every_mode() {
    let quota = Quota::per_second(10).unwrap();
    let pure = RedisLimiter::new("p", quota, MemoryStore::new()).unwrap();
    assert!(matches!(pure.try_acquire(0).await, Err(Error::ZeroTokens)));
    assert!(matches!(
        pure.try_acquire(11).await,
        Err(Error::ExceedsBurst { .. })
    ));
    assert!(matches!(
        pure.acquire(u64::MAX).await,
        Err(Error::ExceedsBurst { .. })
    ));
    let hybrid = HybridLimiter::new("h", quota, MemoryStore::new()).unwrap();
    assert!(matches!(hybrid.try_acquire(0), Err(Error::ZeroTokens)));
    assert!(matches!(
        hybrid
            .try_acquire_for(u64::MAX, Duration::from_secs(1))
            .await,
        Err(Error::ExceedsBurst { .. })
    ));
    let long = "x".repeat(ratelease::MAX_NAME_LEN + 1);
    assert!(matches!(
        RedisLimiter::new(long, quota, MemoryStore::new()),
        Err(Error::Config(_))
    ));
    assert!(matches!(
        RedisLimiter::new("", quota, MemoryStore::new()),
        Err(Error::Config(_))
    ));
}

#[tokio::test]
async fn bad_urls_and_unreachable_servers_are_typed_errors() {
    let err = RedisStore::connect("not a url").await.unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    // A port nothing listens on (bound, then released).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = RedisStore::builder(format!("redis://127.0.0.1:{port}/"))
        .connect_timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Store(_)), "{err:?}");
}

/// Runs the script with raw arguments.
fn eval(con: &mut redis::Connection, key: &str, args: &[String]) -> redis::RedisResult<Vec<i64>> {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(TOKEN_BUCKET_LUA)
        .arg(3)
        .arg(key)
        .arg(format!("{key}:leasers"))
        .arg(format!("{key}:expiry"));
    for a in args {
        cmd.arg(a);
    }
    cmd.query(con)
}

fn int_in(x: &str, lo: u64, hi: u64) -> bool {
    x.parse::<u64>().is_ok_and(|x| (lo..=hi).contains(&x))
}

/// The stored state is absent, or integers in range: the bucket's five fields (a bucket
/// written before the lease protocol may lack `o` and `d`), each leaser record's six, and an
/// expiry entry for every leaser record. Prints what it found when it is not.
fn state_is_valid(con: &mut redis::Connection, key: &str) -> bool {
    let fields: Vec<Option<String>> = redis::cmd("HMGET")
        .arg(key)
        .arg(&["v", "s", "t", "o", "d"])
        .query(con)
        .unwrap();
    let bucket_ok = match &fields[..] {
        [None, None, None, None, None] => true,
        [Some(v), Some(s), Some(t), Some(o), Some(d)] => {
            int_in(v, 0, 1 << 52)
                && int_in(s, 1, 1 << 52)
                && int_in(t, 0, 1 << 53)
                && int_in(o, 0, 1 << 52)
                && int_in(d, 0, 1 << 52)
        }
        _ => false,
    };
    let leasers: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg(format!("{key}:leasers"))
        .query(con)
        .unwrap();
    let expiry: Vec<String> = redis::cmd("ZRANGE")
        .arg(format!("{key}:expiry"))
        .arg(0)
        .arg(-1)
        .query(con)
        .unwrap();
    let records_ok = leasers.values().all(|r| {
        let f: Vec<&str> = r.split(' ').collect();
        f.len() == 6 && f.iter().all(|x| int_in(x, 0, 1 << 53))
    });
    let index_ok = expiry.len() == leasers.len() && expiry.iter().all(|m| leasers.contains_key(m));
    let ok = bucket_ok && records_ok && index_ok;
    if !ok {
        eprintln!(
            "invalid state at {key}: bucket {fields:?}, leasers {leasers:?}, expiry {expiry:?}"
        );
    }
    ok
}

fn arg() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u64..50).prop_map(|v| v.to_string()),
        any::<u64>().prop_map(|v| v.to_string()),
        any::<i64>().prop_map(|v| v.to_string()),
        any::<f64>().prop_map(|v| v.to_string()),
        Just("nan".to_string()),
        Just("-nan".to_string()),
        Just("inf".to_string()),
        Just("-inf".to_string()),
        Just("1e308".to_string()),
        Just("4503599627370497".to_string()),
        Just(String::new()),
        Just("0x10".to_string()),
        Just("-0".to_string()),
        Just("-0.0".to_string()),
        Just(" 7 ".to_string()),
        "[a-z]{1,6}",
    ]
}

#[test]
fn the_script_never_fails_at_runtime_nor_stores_invalid_state() {
    let server = RedisServer::start();
    let con = std::cell::RefCell::new(server.connection());
    let mut runner = TestRunner::new(ProptestConfig::with_cases(3_000));
    let ops = prop_oneof![
        4 => Just("lease".to_string()),
        2 => Just("release".to_string()),
        1 => "[a-z]{0,4}",
    ];
    let (rejected, served) = (std::cell::Cell::new(0u32), std::cell::Cell::new(0u32));
    // Mostly plausible vectors, so both the served and the rejected paths run; sometimes
    // shortened, so missing arguments are covered too.
    let plausible = prop_oneof![
        6 => (1u64..50).prop_map(|v| v.to_string()),
        1 => (1u64..5_000_000).prop_map(|v| v.to_string()),
        2 => arg(),
    ];
    let now = prop_oneof![3 => Just(String::new()), 1 => arg()];
    let node = prop_oneof![
        3 => Just(String::new()),
        3 => "n[0-2]",
        1 => arg(),
        1 => Just("x".repeat(129)),
    ];
    let strategy = (
        (ops, prop::collection::vec(plausible.clone(), 5), now),
        (node, prop::collection::vec(plausible, 4)),
        prop_oneof![6 => Just(12usize), 1 => 0usize..12],
        0u8..4,
    );
    runner
        .run(
            &strategy,
            |((op, rest, now), (node, node_args), len, key)| {
                let key = format!("fuzz{{{key}}}");
                let mut args = vec![op];
                args.extend(rest);
                args.push(now);
                args.push(node);
                args.extend(node_args);
                args.truncate(len);
                let con = &mut *con.borrow_mut();
                match eval(con, &key, &args) {
                    Ok(reply) => {
                        prop_assert_eq!(reply.len(), 5);
                        prop_assert!(reply.iter().all(|v| *v >= 0), "{:?}", reply);
                        served.set(served.get() + 1);
                    }
                    Err(e) => {
                        prop_assert_eq!(e.code(), Some("RATELEASE"), "{:?} for {:?}", e, args);
                        rejected.set(rejected.get() + 1);
                    }
                }
                prop_assert!(state_is_valid(con, &key), "state after {:?}", args);
                Ok(())
            },
        )
        .unwrap();
    let (rejected, served) = (rejected.get(), served.get());
    assert!(
        rejected > 100 && served > 10,
        "rejected {rejected}, served {served}"
    );
}

#[test]
fn corrupt_stored_state_reads_as_full_and_is_replaced() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let key = "corrupt{k}";
    for (v, s, t) in [
        ("nan", "1", "0"),
        ("-5", "1", "0"),
        ("1", "0", "0"),
        ("x", "y", "z"),
    ] {
        let _: () = redis::cmd("HSET")
            .arg(key)
            .arg(&["v", v, "s", s, "t", t])
            .query(&mut con)
            .unwrap();
        let args: Vec<String> = ["lease", "10", "1000000", "10", "4", "1", "5000000"]
            .map(String::from)
            .to_vec();
        let reply = eval(&mut con, key, &args).unwrap();
        assert_eq!(
            reply[0], 4,
            "granted from a full bucket after ({v}, {s}, {t})"
        );
        assert!(state_is_valid(&mut con, key));
    }
}

/// "-0" parses to negative zero in Lua; stored as is it would read "-0", which strict integer
/// parsers reject. Found by the fuzzer above at 30 000 cases.
#[test]
fn negative_zero_arguments_are_stored_as_zero() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let key = "negzero{k}";
    let args: Vec<String> = [
        "lease", "10", "1000000", "10", "4", "1", "-0", "n1", "-0", "-0.0", "100000", "1000000",
    ]
    .map(String::from)
    .to_vec();
    let reply = eval(&mut con, key, &args).unwrap();
    assert_eq!(reply[0], 4);
    assert!(state_is_valid(&mut con, key));
    let t: String = redis::cmd("HGET")
        .arg(key)
        .arg("t")
        .query(&mut con)
        .unwrap();
    assert_eq!(t, "0");
}
