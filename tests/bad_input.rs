//! Bad input gets a typed error, never a panic and never corrupt state in Redis.

mod fuzz;
mod support;

use std::collections::HashMap;
use std::time::Duration;

use fuzz::int_in;
use proptest::prelude::*;
use ratelease::{
    AcquireError, BuildError, Error, HybridLimiter, MemoryStore, Quota, QuotaError, RedisLimiter,
    RedisStore, LOCK_LUA, TOKEN_BUCKET_LUA,
};
use support::{decode_leaser_record, BucketState, RedisServer};

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
    assert!(matches!(
        pure.acquire_now(0).await,
        Err(AcquireError::ZeroTokens)
    ));
    assert!(matches!(
        pure.acquire_now(11).await,
        Err(AcquireError::ExceedsBurst { .. })
    ));
    assert!(matches!(
        pure.acquire(u64::MAX).await,
        Err(AcquireError::ExceedsBurst { .. })
    ));
    let hybrid = HybridLimiter::new("h", quota, MemoryStore::new()).unwrap();
    assert!(matches!(
        hybrid.try_acquire(0),
        Err(AcquireError::ZeroTokens)
    ));
    assert!(matches!(
        hybrid
            .try_acquire_for(u64::MAX, Duration::from_secs(1))
            .await,
        Err(AcquireError::ExceedsBurst { .. })
    ));
    let long = "x".repeat(ratelease::MAX_NAME_LEN + 1);
    assert!(matches!(
        RedisLimiter::new(long, quota, MemoryStore::new()),
        Err(BuildError::Config(_))
    ));
    assert!(matches!(
        RedisLimiter::new("", quota, MemoryStore::new()),
        Err(BuildError::Config(_))
    ));
}

#[tokio::test]
async fn bad_urls_and_unreachable_servers_are_typed_errors() {
    let err = RedisStore::connect("not a url").await.unwrap_err();
    assert!(matches!(err, BuildError::Config(_)), "{err:?}");
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
    assert!(matches!(err, BuildError::Store(_)), "{err:?}");
}

/// Runs the token-bucket script with raw arguments.
fn eval(con: &mut redis::Connection, key: &str, args: &[String]) -> redis::RedisResult<Vec<i64>> {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(TOKEN_BUCKET_LUA).arg(3).arg(bucket_keys(key));
    for a in args {
        cmd.arg(a);
    }
    cmd.query(con)
}

/// The three keys of the bucket at `key`.
fn bucket_keys(key: &str) -> Vec<String> {
    vec![
        key.to_string(),
        format!("{key}:leasers"),
        format!("{key}:expiry"),
    ]
}

/// The keys of fuzzed token-bucket instance `i`: its bucket's and its config's.
fn fuzz_keys(i: u8) -> Vec<String> {
    let mut keys = bucket_keys(&format!("fuzz{{{i}}}"));
    keys.push(format!("fuzz{{{i}}}:config"));
    keys
}

/// Whether the bucket state at `key` is valid (see [`BUCKET_STATE`]); prints why not.
fn state_is_valid(con: &mut redis::Connection, key: &str) -> bool {
    let keys = bucket_keys(key);
    let mut pipe = redis::pipe();
    (BUCKET_STATE.read)(&keys, &mut pipe);
    let replies: Vec<redis::Value> = pipe.query(con).unwrap();
    (BUCKET_STATE.check)(&keys, &replies)
        .map_err(|why| eprintln!("invalid state at {key}: {why}"))
        .is_ok()
}

/// The bucket's stored state is absent, or a packed bucket whose numbers are integers in
/// range (level, scale, time, outstanding, demand, a valid quota, latest expiry, rate held);
/// each leaser record is a packed record of six (seven with a rate) integers in range, with an
/// expiry entry for every record; the leasers' bookkeeping counts them, is no later than the
/// earliest expiry, and the leasers' keys outlive the bucket. Given a fourth key, the name's
/// config is absent or a valid quota.
const BUCKET_STATE: fuzz::StateCheck = fuzz::StateCheck {
    read: |keys, pipe| {
        pipe.cmd("GET").arg(&keys[0]);
        pipe.cmd("HGETALL").arg(&keys[1]);
        pipe.cmd("ZRANGE")
            .arg(&keys[2])
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES");
        if let Some(config) = keys.get(3) {
            pipe.cmd("HGETALL").arg(config);
        }
        for key in &keys[..3] {
            pipe.cmd("PTTL").arg(key);
        }
    },
    check: |keys, replies| {
        // Every stored key expires (-2: absent; -1: no expiry, a leak).
        let ttls = &replies[replies.len() - 3..];
        for (key, ttl) in keys.iter().zip(ttls) {
            let ttl: i64 = redis::from_redis_value(ttl.clone()).unwrap();
            if ttl == -1 {
                return Err(format!("{key} never expires"));
            }
        }
        let raw: Option<Vec<u8>> = redis::from_redis_value(replies[0].clone()).unwrap();
        let mut leasers: HashMap<String, Vec<u8>> =
            redis::from_redis_value(replies[1].clone()).unwrap();
        // The bookkeeping, under the empty field name: a format byte (2), then as
        // little-endian doubles the leasers on record (-1: not known), a time no lease
        // expires before, and the pending claim's units and when it lapses (0 0: none), then
        // the claimant's id (a node on record). Format 3 has three more doubles before the id:
        // anonymous demand's window start (µs) and its counts in this window and the last.
        let meta = leasers.remove("");
        let expiry: Vec<(String, f64)> = redis::from_redis_value(replies[2].clone()).unwrap();
        const M: f64 = (1u64 << 52) as f64;
        let int = |x: f64, lo: f64, hi: f64| x.fract() == 0.0 && (lo..=hi).contains(&x);
        let bucket_ok = match raw.as_deref().map(BucketState::decode) {
            None => true,
            Some(Some(b)) => {
                int(b.v, 0.0, M)
                    && int(b.s, 1.0, M)
                    && int(b.t, 0.0, 2.0 * M)
                    && int(b.o, 0.0, M)
                    && int(b.d, 0.0, M)
                    && quota_ok(&b.r.to_string(), &b.p.to_string(), &b.b.to_string())
                    && int(b.x, 0.0, 2.0 * M)
                    && int(b.reserved, 0.0, M)
            }
            Some(None) => false,
        };
        if !bucket_ok {
            return Err(format!("bucket {raw:?}"));
        }
        let records_ok = leasers.values().all(|r| {
            decode_leaser_record(r).is_some_and(|f| f.iter().all(|&x| int(x, 0.0, 2.0 * M)))
        });
        let index_ok =
            expiry.len() == leasers.len() && expiry.iter().all(|(m, _)| leasers.contains_key(m));
        let first_expiry = expiry
            .iter()
            .map(|&(_, at)| at)
            .fold(f64::INFINITY, f64::min);
        let meta_ok = meta.as_deref().is_none_or(|c| {
            // Format 3 has anonymous demand before the claimant's id, format 4 that and the
            // anonymous callers' credit.
            let head = match c.first() {
                Some(3) => 57,
                Some(4) => 73,
                _ => 33,
            };
            if c.len() < head || c.len() > head + 128 || !matches!(c[0], 2..=4) {
                return false;
            }
            let double = |i: usize| f64::from_le_bytes(c[i..i + 8].try_into().unwrap());
            let id = &c[head..];
            let (count, earliest, units, untl) = (double(1), double(9), double(17), double(25));
            let anonymous_ok = head == 33
                || (int(double(33), 0.0, 2.0 * M)
                    && int(double(41), 0.0, M)
                    && int(double(49), 0.0, M)
                    && double(41) + double(49) > 0.0)
                    && (head < 73 || (int(double(57), 0.0, M) && int(double(65), 0.0, 2.0 * M)));
            anonymous_ok
                && (count == -1.0 || count == leasers.len() as f64)
                && int(earliest, 0.0, 2.0 * M)
                && earliest <= first_expiry
                && if id.is_empty() {
                    units == 0.0 && untl == 0.0
                } else {
                    int(units, 1.0, M)
                        && int(untl, 0.0, 2.0 * M)
                        && std::str::from_utf8(id).is_ok_and(|id| leasers.contains_key(id))
                }
        });
        // With leasers on record the bookkeeping is there, and their keys outlive the bucket.
        let ttl = |i: usize| redis::from_redis_value::<i64>(ttls[i].clone()).unwrap();
        let outlive =
            leasers.is_empty() || (meta.is_some() && ttl(1) >= ttl(0) && ttl(2) >= ttl(0));
        if !(records_ok && index_ok && meta_ok && outlive) {
            return Err(format!(
                "leasers {leasers:?}, bookkeeping {meta:?}, expiry {expiry:?}, ttls {ttls:?}"
            ));
        }
        if keys.len() > 3 {
            let config: HashMap<String, String> =
                redis::from_redis_value(replies[3].clone()).unwrap();
            let field = |k: &str| config.get(k).map(String::as_str).unwrap_or("");
            let ok = config.is_empty()
                || (config.len() == 3
                    && quota_ok(field("rate"), field("period_us"), field("burst")));
            if !ok {
                return Err(format!("config {config:?}"));
            }
        }
        Ok(())
    },
};

/// Whether `rate`, `period_us` and `burst` make a quota the script accepts: each in
/// `1..=2^52`, and the capacity in fixed-point units (`burst × period / gcd`) within `2^52`.
fn quota_ok(rate: &str, period: &str, burst: &str) -> bool {
    const M: i64 = 1 << 52;
    if !(int_in(rate, 1, M) && int_in(period, 1, M) && int_in(burst, 1, M)) {
        return false;
    }
    let [r, p, b] = [rate, period, burst].map(|x| x.parse::<u128>().unwrap());
    let (mut x, mut y) = (r, p);
    while y != 0 {
        (x, y) = (y, x % y);
    }
    b * (p / x) <= M as u128
}

/// `lua/token_bucket.lua` under the fuzz driver: mostly plausible vectors, so both the served
/// and the rejected paths run.
fn token_bucket_script() -> fuzz::Script {
    let ops = prop_oneof![
        8 => Just("lease".to_string()),
        4 => Just("release".to_string()),
        1 => Just("config_get".to_string()),
        1 => Just("config_init".to_string()),
        1 => Just("config_set".to_string()),
        1 => Just("config_delete".to_string()),
        2 => "[a-z]{0,4}",
    ];
    let plausible = prop_oneof![
        6 => (1u64..50).prop_map(|v| v.to_string()),
        1 => (1u64..5_000_000).prop_map(|v| v.to_string()),
        2 => fuzz::junk(),
    ];
    let now = prop_oneof![3 => Just(String::new()), 1 => fuzz::junk()];
    let node = prop_oneof![
        3 => Just(String::new()),
        3 => "n[0-2]",
        1 => fuzz::junk(),
        1 => Just("x".repeat(129)),
    ];
    let unconfigured = prop_oneof![
        3 => Just(String::new()),
        1 => Just("caller".to_string()),
        2 => Just("none".to_string()),
        1 => fuzz::junk(),
    ];
    // A rate lease's ask (ARGV[14]): absent, a rate, or junk.
    let rate = prop_oneof![
        3 => Just(None),
        3 => (0u64..5_000_000).prop_map(|v| Some(v.to_string())),
        1 => fuzz::junk().prop_map(Some),
    ];
    // The last release seq a node's lease says it sent (ARGV[15]): absent, a seq, or junk.
    let release_seq = prop_oneof![
        3 => Just(None),
        3 => (0u64..8).prop_map(|v| Some(v.to_string())),
        1 => fuzz::junk().prop_map(Some),
    ];
    let args = (
        (ops, prop::collection::vec(plausible.clone(), 5), now),
        (
            node,
            prop::collection::vec(plausible, 4),
            unconfigured,
            rate,
            release_seq,
        ),
    )
        .prop_map(
            |((op, rest, now), (node, node_args, unconfigured, rate, release_seq))| {
                let mut args = vec![op];
                args.extend(rest);
                args.push(now);
                args.push(node);
                args.extend(node_args);
                args.push(unconfigured);
                // ARGV[15] comes after ARGV[14], which it then needs ("": no rate asked).
                match (rate, release_seq) {
                    (rate, Some(seq)) => args.extend([rate.unwrap_or_default(), seq]),
                    (rate, None) => args.extend(rate),
                }
                args
            },
        );
    fuzz::Script {
        name: "token_bucket.lua",
        source: TOKEN_BUCKET_LUA,
        keys: fuzz_keys,
        // The config key: without it the script runs the 3-key protocol.
        optional_keys: 1,
        args: args.boxed(),
        encode: None,
        reply: |keys, args, reply| {
            let reply: Vec<i64> =
                redis::from_redis_value(reply.clone()).map_err(|e| e.to_string())?;
            // Config ops: {rate, period_us, burst, flag}; lease and release: five fields,
            // and with the config key the quota they ran under and its source; a lease by a
            // node: with the config key two more (the rate it holds, the leasers on record),
            // without it one more if it asked for a rate (ARGV[14]).
            let node_lease = args[0] == "lease" && args.get(7).is_some_and(|n| !n.is_empty());
            let asked_rate = node_lease && args.get(13).is_some_and(|r| !r.is_empty());
            let len = match (args[0].as_str(), keys.len()) {
                (op, 4) if op.starts_with("config_") => 4,
                ("config_get", 1) => 4,
                (_, 4) => 9 + 2 * usize::from(node_lease),
                (_, 3) => 5 + usize::from(asked_rate),
                _ => 5,
            };
            let in_range = match (len, keys.len()) {
                (4, _) => reply[3] <= 1,
                (9 | 11, 4) => reply[8] <= 2,
                _ => true,
            };
            // One key (the bucket alone, an anonymous call): `{0}` if the bucket has leasers
            // on record and the call must be sent again with every key.
            let resend = keys.len() == 1 && reply == [0];
            if resend || reply.len() == len && reply.iter().all(|v| *v >= 0) && in_range {
                Ok(())
            } else {
                Err(format!("expected {len} non-negative integers"))
            }
        },
        state: BUCKET_STATE,
    }
}

/// `lua/token_bucket.lua`'s packed node calls under the fuzz driver: an op, twelve numbers
/// (plausible, -1 where it means "none", or junk: NaN, infinities, fractions, negatives, huge;
/// the twelfth is `release_seq`), a node
/// id and the unconfigured setting; [`packed_args`] makes the call's arguments of them (a
/// vector cut short packs fewer numbers, so wrong lengths are sent too).
fn token_bucket_packed_script() -> fuzz::Script {
    let op = prop_oneof![
        6 => Just("node_lease".to_string()),
        3 => Just("node_release".to_string()),
        1 => fuzz::junk(),
    ];
    let plausible = || {
        // Ten of these: mostly plausible, or few calls would pass every check.
        prop_oneof![
            30 => (1u64..50).prop_map(|v| v.to_string()),
            5 => (1u64..5_000_000).prop_map(|v| v.to_string()),
            1 => Just("-1".to_string()),
            2 => fuzz::junk(),
        ]
    };
    let now = prop_oneof![4 => Just("-1".to_string()), 1 => fuzz::junk()];
    let rate = prop_oneof![
        3 => Just("-1".to_string()),
        3 => (0u64..5_000_000).prop_map(|v| v.to_string()),
        1 => fuzz::junk(),
    ];
    // Never left out: a vector cut short sends wrong lengths (see `packed_args`), eleven
    // numbers among them.
    let release_seq = prop_oneof![
        2 => Just("-1".to_string()),
        5 => (0u64..8).prop_map(|v| v.to_string()),
        1 => fuzz::junk(),
    ];
    let node = prop_oneof![
        6 => "n[0-2]",
        1 => Just(String::new()),
        1 => Just("x".repeat(129)),
        1 => fuzz::junk(),
    ];
    let unconfigured = prop_oneof![
        3 => Just(String::new()),
        2 => Just("none".to_string()),
        1 => fuzz::junk(),
    ];
    let args = (
        op,
        prop::collection::vec(plausible(), 5),
        now,
        prop::collection::vec(plausible(), 4),
        (rate, release_seq),
        node,
        unconfigured,
    )
        .prop_map(
            |(op, quota_want_min, now, node_args, (rate, seq), node, unconfigured)| {
                let mut args = vec![op];
                args.extend(quota_want_min);
                args.push(now);
                args.extend(node_args);
                args.extend([rate, seq, node, unconfigured]);
                args
            },
        );
    fuzz::Script {
        name: "token_bucket.lua, packed",
        source: TOKEN_BUCKET_LUA,
        keys: fuzz_keys,
        // A packed call sends every key; with three it is refused.
        optional_keys: 1,
        args: args.boxed(),
        encode: Some(packed_args),
        reply: |_, args, reply| {
            let redis::Value::BulkString(bytes) = reply else {
                return Err("not one string".into());
            };
            let values: Vec<f64> = bytes
                .chunks(8)
                .map(|b| f64::from_le_bytes(b.try_into().unwrap_or([0xff; 8])))
                .collect();
            let len = if args[0] == "node_lease" { 11 } else { 9 };
            if bytes.len() == 8 * len
                && values
                    .iter()
                    .all(|v| v.is_finite() && *v >= 0.0 && v.fract() == 0.0)
                && values[8] <= 2.0
            {
                Ok(())
            } else {
                Err(format!(
                    "expected {len} non-negative integers, got {values:?}"
                ))
            }
        },
        state: BUCKET_STATE,
    }
}

/// A packed call's arguments from [`token_bucket_packed_script`]'s vector: the op, the
/// numbers as little-endian doubles (text that is no number as NaN), the node id and the
/// unconfigured setting; a vector cut short packs what it has (the last two go first).
fn packed_args(args: &[String]) -> Vec<Vec<u8>> {
    if args.is_empty() {
        return Vec::new();
    }
    let numbers = &args[1.min(args.len())..args.len().min(13)];
    let packed = numbers
        .iter()
        .flat_map(|x| x.trim().parse::<f64>().unwrap_or(f64::NAN).to_le_bytes())
        .collect();
    let mut out = vec![args[0].clone().into_bytes(), packed];
    out.extend(args.iter().skip(13).map(|a| a.clone().into_bytes()));
    out
}

/// `lua/lock.lua` under the fuzz driver.
fn lock_script() -> fuzz::Script {
    let op = prop_oneof![
        4 => Just("acquire".to_string()),
        3 => Just("release".to_string()),
        2 => Just("extend".to_string()),
        1 => fuzz::junk(),
    ];
    let owner = prop_oneof![
        6 => "[abc]",
        1 => Just("#fence".to_string()),
        1 => Just(String::new()),
        1 => fuzz::junk(),
    ];
    let lease = prop_oneof![
        6 => (1u64..200_000).prop_map(|v| v.to_string()),
        1 => Just((1u64 << 52).to_string()),
        3 => fuzz::junk(),
    ];
    let channel = prop_oneof![
        5 => Just("fuzz:unlock".to_string()),
        1 => Just(String::new()),
        1 => fuzz::junk(),
    ];
    // The hold's fencing token (release, extend): none, a plausible one, or junk.
    let hold = prop_oneof![
        3 => Just(String::new()),
        4 => (1u64..4).prop_map(|v| v.to_string()),
        1 => fuzz::junk(),
    ];
    fuzz::Script {
        name: "lock.lua",
        source: LOCK_LUA,
        optional_keys: 0,
        keys: |i| {
            vec![
                format!("fuzz:{{l{i}}}:lock"),
                format!("fuzz:{{l{i}}}:fence"),
            ]
        },
        args: (op, owner, lease, channel, hold)
            .prop_map(|(op, owner, lease, channel, hold)| vec![op, owner, lease, channel, hold])
            .boxed(),
        encode: None,
        reply: |_, args, reply| {
            let ok = match (args[0].as_str(), reply) {
                ("acquire", redis::Value::Array(v)) => {
                    let v: Vec<i64> = redis::from_redis_value(redis::Value::Array(v.clone()))
                        .map_err(|e| e.to_string())?;
                    matches!(v[..], [1, fence, count] if fence > 0 && count > 0)
                        || matches!(v[..], [0, pttl] if pttl >= 0)
                }
                ("release", redis::Value::Int(n)) => *n >= -1,
                ("extend", redis::Value::Int(n)) => *n == 0 || *n == 1,
                _ => false,
            };
            ok.then_some(())
                .ok_or_else(|| "not a reply of this op".into())
        },
        state: LOCK_STATE,
    }
}

/// The lock's stored state: the fence counter is absent or a positive integer that never
/// expires; the lock hash is absent, or holds exactly one owner (a re-entry count ≥ 1, not a
/// `#` field) and a `#fence` token in 1..=counter, and expires.
const LOCK_STATE: fuzz::StateCheck = fuzz::StateCheck {
    read: |keys, pipe| {
        pipe.cmd("TYPE").arg(&keys[0]);
        pipe.cmd("HGETALL").arg(&keys[0]);
        pipe.cmd("PTTL").arg(&keys[0]);
        pipe.cmd("TYPE").arg(&keys[1]);
        pipe.cmd("GET").arg(&keys[1]);
        pipe.cmd("PTTL").arg(&keys[1]);
    },
    check: |_, r| {
        let ty = |v: &redis::Value| fuzz::string(v).unwrap_or_default();
        let (lock_type, fence_type) = (ty(&r[0]), ty(&r[3]));
        let hash: HashMap<String, String> = redis::from_redis_value(r[1].clone()).unwrap();
        let lock_ttl: i64 = redis::from_redis_value(r[2].clone()).unwrap();
        let counter = fuzz::string(&r[4]);
        let fence_ttl: i64 = redis::from_redis_value(r[5].clone()).unwrap();
        let counter = match (fence_type.as_str(), &counter) {
            ("none", None) => 0,
            ("string", Some(c)) if int_in(c, 1, i64::MAX) && fence_ttl == -1 => c.parse().unwrap(),
            _ => {
                return Err(format!(
                    "fence counter {fence_type} {counter:?} ttl {fence_ttl}"
                ))
            }
        };
        match lock_type.as_str() {
            // A lease of 1 ms can end between TYPE and HGETALL, even inside MULTI.
            "none" => return Ok(()),
            "hash" if hash.is_empty() && lock_ttl == -2 => return Ok(()),
            "hash" => {}
            other => return Err(format!("lock key is a {other}")),
        }
        let fence_ok = hash.get("#fence").is_some_and(|f| int_in(f, 1, counter));
        let owners: Vec<_> = hash.iter().filter(|(k, _)| *k != "#fence").collect();
        let owner_ok = matches!(owners[..], [(k, v)] if !k.is_empty() && !k.starts_with('#') && int_in(v, 1, i64::MAX));
        if fence_ok && owner_ok && hash.len() == 2 && lock_ttl >= 0 {
            Ok(())
        } else {
            Err(format!("lock {hash:?} ttl {lock_ttl}, counter {counter}"))
        }
    },
};

#[test]
fn the_token_bucket_script_never_fails_at_runtime_nor_stores_invalid_state() {
    let server = RedisServer::start();
    let out = fuzz::run(&token_bucket_script(), &mut server.connection(), 10_000);
    // Twelve arguments, each sometimes junk: most vectors are rejected (about 5 % served).
    assert!(out.rejected > 1_000 && out.served > 250, "{out:?}");
}

#[test]
fn packed_node_calls_never_fail_at_runtime_nor_store_invalid_state() {
    let server = RedisServer::start();
    let mut con = server.connection();
    // Text calls first, then packed ones on the state they left, then text calls again.
    fuzz::run(&token_bucket_script(), &mut con, 1_000);
    let out = fuzz::run(&token_bucket_packed_script(), &mut con, 5_000);
    // Ten numbers, each sometimes junk, and min ≤ want, burst: about 3 % served.
    assert!(out.rejected > 500 && out.served > 80, "{out:?}");
    fuzz::run(&token_bucket_script(), &mut con, 1_000);
}

#[test]
fn the_lock_script_never_fails_at_runtime_nor_stores_invalid_state() {
    let server = RedisServer::start();
    let out = fuzz::run(&lock_script(), &mut server.connection(), 10_000);
    eprintln!("{out:?}");
    assert!(out.rejected > 1_000 && out.served > 1_000, "{out:?}");
}

#[test]
fn corrupt_stored_state_reads_as_full_and_is_replaced() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let key = "corrupt{k}";
    let args: Vec<String> = ["lease", "10", "1000000", "10", "4", "1", "5000000"]
        .map(String::from)
        .to_vec();
    // A packed bucket: format byte, then v s t o d r p b x.
    let packed = |format: u8, fields: [f64; 9]| -> Vec<u8> {
        let mut raw = vec![format];
        raw.extend(fields.iter().flat_map(|f| f.to_le_bytes()));
        raw
    };
    let good = [0.0, 1.0, 0.0, 0.0, 0.0, 10.0, 1e6, 10.0, 0.0];
    let with = |i: usize, x: f64| {
        let mut f = good;
        f[i] = x;
        packed(1, f)
    };
    let mut corrupt: Vec<(String, Vec<u8>)> = vec![
        ("format byte 2".into(), packed(2, good)),
        ("too short".into(), packed(1, good)[..40].to_vec()),
        ("text".into(), b"0 1 0 0 0 10 1000000 10 0 0".to_vec()),
    ];
    for (i, name) in ["v", "s", "t", "o", "d"].iter().enumerate() {
        corrupt.push((format!("{name} NaN"), with(i, f64::NAN)));
        corrupt.push((format!("{name} negative"), with(i, -5.0)));
        corrupt.push((format!("{name} infinite"), with(i, f64::INFINITY)));
    }
    corrupt.push(("scale 0".into(), with(1, 0.0)));
    corrupt.push(("level 0.5".into(), with(0, 0.5)));
    for (what, raw) in corrupt {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg(&raw)
            .query(&mut con)
            .unwrap();
        let reply = eval(&mut con, key, &args).unwrap();
        assert_eq!(reply[0], 4, "granted from a full bucket after {what}");
        assert!(state_is_valid(&mut con, key), "{what}");
    }
    // The hash an earlier version of the script wrote: read once (its tokens counted), then
    // replaced by a packed bucket; a corrupt one reads as full.
    for (v, s, t, granted) in [
        ("0", "1", "5000000", 0),
        ("nan", "1", "0", 4),
        ("-5", "1", "0", 4),
        ("1", "0", "0", 4),
        ("x", "y", "z", 4),
    ] {
        let _: () = redis::cmd("DEL").arg(key).query(&mut con).unwrap();
        let _: () = redis::cmd("HSET")
            .arg(key)
            .arg(&["v", v, "s", s, "t", t])
            .query(&mut con)
            .unwrap();
        let reply = eval(&mut con, key, &args).unwrap();
        assert_eq!(reply[0], granted, "after the hash ({v}, {s}, {t})");
        assert!(state_is_valid(&mut con, key));
        assert!(BucketState::read(&server, key).is_some());
    }
    // A key of another type reads as full and is replaced too.
    let _: () = redis::cmd("DEL").arg(key).query(&mut con).unwrap();
    let _: () = redis::cmd("RPUSH")
        .arg(key)
        .arg("x")
        .query(&mut con)
        .unwrap();
    assert_eq!(eval(&mut con, key, &args).unwrap()[0], 4);
    assert!(state_is_valid(&mut con, key));
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
    let t = BucketState::read(&server, key).expect("a bucket").t;
    assert!(t == 0.0 && t.is_sign_positive(), "{t}");
}

/// `Duration::MAX` ("never", "wait forever") anywhere a duration is taken is read as a very
/// long time, never a panic: timeouts of every limiter, and the keyed and concurrency
/// limiters' idle settings (which their background tasks add to the current time).
#[tokio::test(start_paused = true)]
async fn huge_durations_are_read_as_a_long_time_not_a_panic() {
    use ratelease::{ConcurrencyLimiter, KeyedHybridLimiter, KeyedRedisLimiter, MemoryStore};

    let quota = Quota::per_second(10).unwrap();
    let store = MemoryStore::with_clock(ratelease::TokioClock::new());
    let keyed = KeyedHybridLimiter::<String, _>::builder("huge", quota, store.clone())
        .idle_ttl(Duration::MAX)
        .give_back_after(Duration::MAX)
        .build()
        .unwrap();
    let pure_keyed = KeyedRedisLimiter::new("huge-pure", quota, store.clone()).unwrap();
    let pure = RedisLimiter::new("huge-pure-1", quota, store.clone()).unwrap();
    let conc = ConcurrencyLimiter::builder("huge-conc", 2, store.clone())
        .hybrid(2)
        .idle_return(Duration::MAX)
        .build()
        .unwrap();
    // "Never give back", "never expire": the hybrid limiter's task adds them to the clock.
    let hybrid = ratelease::HybridLimiter::builder("huge-hybrid", quota, store.clone())
        .policy(
            ratelease::AdaptiveLease::new()
                .idle_after(Duration::MAX)
                .ttl(Duration::MAX),
        )
        .build()
        .unwrap();
    hybrid.ready().await.unwrap();
    for _ in 0..3 {
        let k = keyed.try_acquire_for("k", 1, Duration::MAX).await.unwrap();
        let p = pure_keyed
            .try_acquire_for("k", 1, Duration::MAX)
            .await
            .unwrap();
        let q = pure.try_acquire_for(1, Duration::MAX).await.unwrap();
        assert!(k.is_allowed() && p.is_allowed() && q.is_allowed());
    }
    for _ in 0..25 {
        // (A bounded wait: the task that panicked at its idle timer left waits forever.)
        let h = hybrid
            .try_acquire_for(1, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(h.is_allowed(), "{:?}", hybrid.stats());
    }
    let stats = hybrid.stats();
    assert!(
        stats.leases >= 2 && stats.store_errors == 0 && !stats.circuit_open,
        "it leases again, and the store takes its terms: {stats:?}"
    );
    let permit = conc.try_acquire_for(2, Duration::MAX).await.unwrap();
    assert!(permit.is_some());
    drop(permit);
    // Let the background tasks run their timers (the pool is full and idle now): the
    // concurrency task renews its holder record every third of its ttl, so it is alive.
    let syncs = conc.stats().syncs;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(conc.stats().syncs > syncs, "{:?}", conc.stats());
    let again = conc
        .try_acquire_for(2, Duration::from_secs(1))
        .await
        .unwrap();
    assert!(
        again.is_some(),
        "the concurrency task is alive and the slots came back"
    );
    drop(again);
    keyed.shutdown().await;
    conc.shutdown().await;
    hybrid.shutdown().await;
}

/// A store's timeouts: zero would time every call out at once, so a build refuses it (the
/// lock's too); `Duration::MAX` ("as long as it takes") connects and serves — the lease
/// timeout's default (three response timeouts) and a first call's bound (response plus
/// connect timeout) panicked on it.
#[tokio::test]
async fn zero_store_timeouts_are_refused_and_huge_ones_serve() {
    use ratelease::{LockError, RedisLock};

    let server = RedisServer::start();
    let url = server.url();
    let zero = Duration::ZERO;
    for (what, builder) in [
        (
            "connect timeout",
            RedisStore::builder(&url).connect_timeout(zero),
        ),
        (
            "response timeout",
            RedisStore::builder(&url).response_timeout(zero),
        ),
    ] {
        match builder.connect().await {
            Err(BuildError::Config(m)) => assert!(m.contains(what) && m.contains("zero"), "{m}"),
            other => panic!("{what}: {:?}", other.map(|_| ())),
        }
    }
    let lock = RedisLock::builder(&url, "job")
        .response_timeout(zero)
        .connect()
        .await;
    assert!(
        matches!(lock, Err(LockError::Config(_))),
        "{:?}",
        lock.map(|_| ())
    );

    let quota = Quota::per_second(100).unwrap();
    let long = RedisStore::builder(&url)
        .response_timeout(Duration::MAX)
        .connect_timeout(Duration::MAX)
        .connect()
        .await
        .unwrap();
    let lazy = RedisStore::builder(&url)
        .lease_timeout(Duration::MAX)
        .lazy_connect()
        .connect()
        .await
        .unwrap();
    for (name, store) in [("long", long), ("lazy", lazy)] {
        let limiter = HybridLimiter::new(name, quota, store).unwrap();
        limiter.ready().await.unwrap();
        assert!(limiter.try_acquire(1).unwrap().is_allowed(), "{name}");
        let stats = limiter.stats();
        assert_eq!(stats.store_errors, 0, "{name}: {stats:?}");
        limiter.shutdown().await;
    }
}

/// A store (a wrapper around one) that misbehaves: it tampers with its grants (`tamper`: more
/// than a lease asked for, or with `Some(true)` fewer than its minimum, counted in `tampered`),
/// and its calls panic while `lease_panics` / `release_panics` are above zero, one a call.
#[derive(Clone, Default)]
struct Misbehaving {
    inner: ratelease::MemoryStore,
    tamper: Option<bool>,
    tampered: std::sync::Arc<std::sync::atomic::AtomicU64>,
    lease_panics: std::sync::Arc<std::sync::atomic::AtomicU64>,
    release_panics: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Misbehaving {
    fn new() -> Self {
        Misbehaving {
            inner: ratelease::MemoryStore::with_clock(ratelease::TokioClock::new()),
            ..Misbehaving::default()
        }
    }

    /// Whether a call is to panic now (taking one from `counter`).
    fn due(counter: &std::sync::atomic::AtomicU64) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        counter
            .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

impl ratelease::LeaseStore for Misbehaving {
    async fn lease(
        &self,
        name: &str,
        quota: &Quota,
        req: &ratelease::LeaseRequest,
    ) -> Result<ratelease::LeaseReply, ratelease::StoreError> {
        if Self::due(&self.lease_panics) {
            panic!("a lease panicked");
        }
        let mut reply = self.inner.lease(name, quota, req).await?;
        if let Some(less) = self.tamper {
            if reply.granted > 0 && (!less || req.min >= 2) {
                reply.granted = if less { req.min - 1 } else { u64::MAX };
                self.tampered
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        Ok(reply)
    }

    async fn release(
        &self,
        name: &str,
        quota: &Quota,
        req: &ratelease::ReleaseRequest,
    ) -> Result<ratelease::LeaseReply, ratelease::StoreError> {
        if Self::due(&self.release_panics) {
            panic!("a release panicked");
        }
        self.inner.release(name, quota, req).await
    }
}

/// A store that grants more than a lease asked for, or fewer than its minimum: the limiters
/// treat the reply as a failed call (`StoreError::BadReply`, which reaches the waiter)
/// instead of counting tokens the bucket never had, overflowing, or handing a waiter of `n`
/// tokens the `n - 1` granted (an overshoot). A malformed reply is no outage: the failure
/// policy does not answer for it (the circuit stays closed, see `StoreError::is_outage`).
#[tokio::test(start_paused = true)]
async fn a_store_granting_more_than_asked_or_less_than_the_minimum_is_a_bad_reply() {
    use ratelease::{FailurePolicy, HybridLimiter, KeyedHybridLimiter, StoreError};

    for less in [false, true] {
        let store = Misbehaving {
            tamper: Some(less),
            ..Misbehaving::new()
        };
        let quota = Quota::per_second(10).unwrap();
        let keyed = KeyedHybridLimiter::<String, _>::builder("tampered", quota, store.clone())
            .on_store_failure(FailurePolicy::FailClosed)
            .build()
            .unwrap();
        // A waiter of 3: its lease's minimum is 3.
        let mut errors = vec![keyed.acquire("k", 3).await.unwrap_err()];
        assert_eq!(keyed.available("k"), 0);
        assert!(!keyed.stats().circuit_open);
        if !less {
            let hybrid = HybridLimiter::builder("tampered", quota, store.clone())
                .on_store_failure(FailurePolicy::FailClosed)
                .build()
                .unwrap();
            errors.push(hybrid.acquire(1).await.unwrap_err());
            assert_eq!(hybrid.available(), 0);
            assert!(!hybrid.stats().circuit_open);
        }
        for e in errors {
            assert!(
                matches!(e, AcquireError::Store(StoreError::BadReply(_))),
                "less: {less}: {e:?}"
            );
        }
        assert!(store.tampered.load(std::sync::atomic::Ordering::Relaxed) > 0);
    }
}

/// At the end of representable time (2^53 µs; "2^53 + 1" parses to it) a node's lease still
/// gets a valid expiry for its bucket (`SET … PX 0` is an error). Found by the fuzzer above
/// against an earlier version of the script.
#[test]
fn a_lease_at_the_end_of_time_still_sets_a_valid_expiry() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let key = "endtime{k}";
    let args: Vec<String> = [
        "lease",
        "1",
        "1",
        "18",
        "18",
        "1",
        "9007199254740993",
        "n0",
        "1",
        "1",
        "1",
        "1",
    ]
    .map(String::from)
    .to_vec();
    let reply = eval(&mut con, key, &args).unwrap();
    assert_eq!(reply[0], 18, "{reply:?}");
    assert!(state_is_valid(&mut con, key));
}

/// Numbers the script writes as text keep every digit: a lease's expiry near the end of
/// representable time (above 10^15 µs, where Redis's own number-to-text conversion rounds to 14
/// digits) is stored in the expiry index exactly, and an expiry index entry, read back as an
/// integer, is the time of the call plus the lease's TTL. The script writes an expiry as its
/// hundred-millions and the rest (eight digits with their zeros), so the cases include both
/// sides of a multiple of 10^8, an expiry below 10^8 and 2^53 itself.
#[test]
fn the_scripts_write_large_integers_with_every_digit() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let max: u64 = 1 << 53;
    // (now, ttl); the first sum, 9 007 199 254 506 426, is far from any number of 14
    // significant digits.
    let cases: [(u64, u64); 7] = [
        (max - 1_234_567, 1_000_001),
        (0, 1_234),
        (0, 99_999_999),
        (1, 99_999_999),
        (9_007_199_199_999_999 - 1_000_001, 1_000_001),
        (9_007_199_200_000_000 - 1_000_001, 1_000_001),
        (max - 1_000_001, 1_000_001),
    ];
    for (i, (now, ttl)) in cases.into_iter().enumerate() {
        let key = format!("digits{i}{{k}}");
        let (now_arg, ttl_arg) = (now.to_string(), ttl.to_string());
        let args: Vec<String> = [
            "lease", "1000", "1000000", "10", "10", "1", &now_arg, "n0", "0", "1000", "100000",
            &ttl_arg,
        ]
        .map(String::from)
        .to_vec();
        let reply = eval(&mut con, &key, &args).unwrap();
        assert_eq!(reply[0], 10, "{reply:?}");
        let score: String = redis::cmd("ZSCORE")
            .arg(format!("{key}:expiry"))
            .arg("n0")
            .query(&mut con)
            .unwrap();
        assert_eq!(score, (now + ttl).to_string(), "now {now}, ttl {ttl}");
        assert!(state_is_valid(&mut con, &key));
    }
}

/// One number of a token-bucket call set to `value` (`text` in the text protocol), the rest
/// valid: what the script answers (see [`checked_fields`]).
fn checked_field(
    con: &mut redis::Connection,
    key: &str,
    packed: bool,
    field: &EdgeField,
    value: f64,
    text: &str,
) -> Option<String> {
    checked_fields(con, key, packed, field.lease, &[(field.place, value, text)])
}

/// A node's token-bucket call (a lease, else a release) with the numbers at the places of `set`
/// set to their value (packed) or text, the rest valid: what the script answers, in the text
/// protocol (`packed: false`, every number a decimal argument) or packed (twelve doubles):
/// `None` if it ran the call, else the field its error names.
fn checked_fields(
    con: &mut redis::Connection,
    key: &str,
    packed: bool,
    lease: bool,
    set: &[(usize, f64, &str)],
) -> Option<String> {
    // The call's numbers in the packed order: rate, period, burst, want (a release's tokens),
    // min, now (-1: the server's), held (seq), demand (leaving), horizon, ttl, rate asked (-1:
    // none), release seq sent (-1: none). A quota of 1 000 000 per second with a burst of 1:
    // every edge of rate, period and burst stays within the capacity's limit.
    let mut numbers = [
        1e6, 1e6, 1.0, 1.0, 1.0, -1.0, 0.0, 1000.0, 1e5, 1e6, -1.0, -1.0,
    ];
    if !lease {
        numbers = [
            1e6, 1e6, 1.0, 1.0, 0.0, -1.0, 1.0, 0.0, 0.0, 0.0, -1.0, -1.0,
        ];
    }
    for &(place, value, _) in set {
        numbers[place] = value;
    }
    let mut keys = bucket_keys(key);
    keys.push(format!("{key}:config"));
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(TOKEN_BUCKET_LUA).arg(4).arg(&keys);
    if packed {
        let op = if lease { "node_lease" } else { "node_release" };
        let bytes: Vec<u8> = numbers.iter().flat_map(|x| x.to_le_bytes()).collect();
        cmd.arg(op).arg(bytes).arg("n1").arg("");
    } else {
        let mut args: Vec<String> = numbers
            .iter()
            .map(|x| match *x {
                -1.0 => String::new(),
                x => format!("{x:.0}"),
            })
            .collect();
        for &(place, _, text) in set {
            args[place] = text.to_string();
        }
        let op = if lease { "lease" } else { "release" };
        // The text protocol's places: the op, the first six numbers, the node, the next four,
        // the unconfigured setting, then the rate asked and the release seq sent.
        cmd.arg(op).arg(&args[..6]).arg("n1").arg(&args[6..10]);
        cmd.arg("").arg(&args[10..]);
    }
    match cmd.query::<redis::Value>(con) {
        Ok(_) => None,
        Err(e) => {
            let e = ratelease::StoreError::from(e).to_string();
            let name = e.strip_prefix("script rejected the call: invalid argument ");
            Some(name.unwrap_or(&e).to_string())
        }
    }
}

/// A number of a token-bucket call and its documented range.
struct EdgeField {
    /// The name an error gives it.
    name: &'static str,
    /// A node's lease (else its release).
    lease: bool,
    /// Its place among the packed numbers (see [`checked_field`]).
    place: usize,
    lo: f64,
    hi: f64,
    /// Whether "" (text) and -1 (packed) mean "none" (the server's clock; no rate asked; no
    /// release sent).
    optional: bool,
}

impl EdgeField {
    /// The nearest double above the range: `hi + 1`, but 2^53 + 2 past 2^53 (2^53 + 1 is no
    /// double).
    fn past(&self) -> f64 {
        if self.hi >= 9_007_199_254_740_992.0 {
            self.hi + 2.0
        } else {
            self.hi + 1.0
        }
    }
}

/// Each number of a node's token-bucket call is checked at the edges of its documented range,
/// in the text protocol and packed: one at a time is set to each edge and just past it, to a
/// fraction, ±0, NaN, ±infinity and (text) junk, the others valid. The call runs exactly when
/// the number is an integer in range (or the "none" of an optional one), and is otherwise
/// refused with the field's own name — the same answer either way.
#[test]
fn every_number_is_checked_at_the_edges_of_its_range_in_both_protocols() {
    const MAX: f64 = 4_503_599_627_370_496.0; // 2^52
    const MAX_TIME: f64 = 9_007_199_254_740_992.0; // 2^53
    let server = RedisServer::start();
    let mut con = server.connection();
    let field = |name, lease, place, lo, hi| EdgeField {
        name,
        lease,
        place,
        lo,
        hi,
        optional: false,
    };
    let fields = [
        field("rate", true, 0, 1.0, MAX),
        field("period_us", true, 1, 1.0, MAX),
        field("burst", true, 2, 1.0, MAX),
        field("want", true, 3, 1.0, MAX),
        // At most want (1 here).
        field("min", true, 4, 1.0, 1.0),
        EdgeField {
            optional: true,
            ..field("now_us", true, 5, 0.0, MAX_TIME)
        },
        field("held", true, 6, 0.0, MAX),
        field("demand", true, 7, 0.0, MAX),
        field("horizon_us", true, 8, 1.0, MAX),
        field("ttl_us", true, 9, 1.0, MAX),
        EdgeField {
            optional: true,
            ..field("rate_mtps", true, 10, 0.0, MAX)
        },
        EdgeField {
            optional: true,
            ..field("release_seq", true, 11, 0.0, MAX)
        },
        field("tokens", false, 3, 0.0, MAX),
        field("seq", false, 6, 0.0, MAX),
        field("leaving", false, 7, 0.0, 1.0),
    ];
    let mut case = 0;
    let (mut ran, mut refused) = (0, 0);
    for f in &fields {
        let past = f.past();
        let mut values = vec![
            (f.lo - 1.0, format!("{:.0}", f.lo - 1.0)),
            (f.lo, format!("{:.0}", f.lo)),
            (f.hi, format!("{:.0}", f.hi)),
            (past, format!("{past:.0}")),
            (f.lo + 0.5, format!("{}", f.lo + 0.5)),
            (-0.0, "-0".to_string()),
            (f64::NAN, "nan".to_string()),
            (f64::INFINITY, "inf".to_string()),
            (f64::NEG_INFINITY, "-inf".to_string()),
        ];
        if f.lo == 0.0 && f.hi == MAX {
            values.push((MAX - 0.5, format!("{}", MAX - 0.5)));
        }
        for (value, text) in values {
            let in_range = value >= f.lo && value <= f.hi && value.fract() == 0.0;
            for packed in [false, true] {
                case += 1;
                let key = format!("edge{{{case}}}");
                let got = checked_field(&mut con, &key, packed, f, value, &text);
                // -1 packed is "none" where the number is optional.
                let none = packed && f.optional && value == -1.0;
                let expected = (!(in_range || none)).then(|| f.name.to_string());
                assert_eq!(
                    got,
                    expected,
                    "{} = {text} ({}): expected {}",
                    f.name,
                    if packed { "packed" } else { "text" },
                    if expected.is_some() {
                        "a refusal"
                    } else {
                        "a run"
                    }
                );
                if got.is_some() {
                    refused += 1;
                    assert!(
                        redis::cmd("EXISTS")
                            .arg(bucket_keys(&key))
                            .query::<u64>(&mut con)
                            .unwrap()
                            == 0,
                        "a refused call wrote"
                    );
                } else {
                    ran += 1;
                }
            }
        }
        // Junk and, unless optional, nothing at all: refused in the text protocol.
        let mut junk = vec!["abc", "1x", "0x"];
        if !f.optional {
            junk.push("");
        }
        for text in junk {
            case += 1;
            let key = format!("edge{{{case}}}");
            let got = checked_field(&mut con, &key, false, f, f64::NAN, text);
            assert_eq!(got.as_deref(), Some(f.name), "{} = {text:?}", f.name);
        }
        // Nothing at all where it is optional: the server's clock, no rate asked.
        if f.optional {
            case += 1;
            let key = format!("edge{{{case}}}");
            assert_eq!(checked_field(&mut con, &key, false, f, -1.0, ""), None);
        }
    }
    assert!(ran >= 70 && refused >= 180, "ran {ran}, refused {refused}");
    // Two numbers out of range at once: the error names the one the script checks first,
    // which is the order `fields` lists them in.
    let mut pairs = 0;
    for (i, first) in fields.iter().enumerate() {
        for second in fields[i + 1..].iter().filter(|f| f.lease == first.lease) {
            let past = |f: &EdgeField| (f.place, f.past(), format!("{:.0}", f.past()));
            let (a, b) = (past(first), past(second));
            for packed in [false, true] {
                case += 1;
                let key = format!("edge{{{case}}}");
                let set = [(a.0, a.1, a.2.as_str()), (b.0, b.1, b.2.as_str())];
                let got = checked_fields(&mut con, &key, packed, first.lease, &set);
                assert_eq!(
                    got.as_deref(),
                    Some(first.name),
                    "{} and {}",
                    first.name,
                    second.name
                );
                pairs += 1;
            }
        }
    }
    // Twelve numbers of a lease, three of a release, each pair in both protocols.
    assert_eq!(pairs, 2 * (12 * 11 / 2 + 3 * 2 / 2));
    // -0 is stored as 0: a packed lease holding -0 tokens at a demand of -0.
    let key = "edge{zero}";
    let hold = field("held", true, 6, 0.0, MAX);
    assert_eq!(checked_field(&mut con, key, true, &hold, -0.0, ""), None);
    let demand = field("demand", true, 7, 0.0, MAX);
    assert_eq!(checked_field(&mut con, key, true, &demand, -0.0, ""), None);
    let raw: Vec<u8> = redis::cmd("HGET")
        .arg(format!("{key}:leasers"))
        .arg("n1")
        .query(&mut con)
        .unwrap();
    let record = decode_leaser_record(&raw).expect("a leaser record");
    assert!(record.iter().all(|x| x.is_sign_positive()), "{record:?}");
}

/// A store call that panics in a limiter's background task is a failed call: the failure
/// policy answers (here failing closed: the store's error) and the next call serves. The
/// panic ended the hybrid limiter's task — every later wait hung — and left the keyed
/// worker's bookkeeping of the call in flight for good (a waiter heard `Closed`; a release
/// that panicked never freed its slot, so with one slot no key was given back again).
#[tokio::test(start_paused = true)]
async fn a_store_call_that_panics_is_a_failed_call_not_a_dead_limiter() {
    use ratelease::{FailurePolicy, HybridLimiter, KeyedHybridLimiter, StoreError};
    use std::sync::atomic::Ordering;

    let store = Misbehaving::new();
    store.lease_panics.store(1, Ordering::SeqCst);
    let quota = Quota::per_second(100).unwrap();
    let patience = Duration::from_secs(5);
    let hybrid = HybridLimiter::builder("panicking", quota, store.clone())
        .on_store_failure(FailurePolicy::FailClosed)
        .build()
        .unwrap();
    let first = tokio::time::timeout(patience, hybrid.ready())
        .await
        .unwrap();
    assert!(
        matches!(first, Err(AcquireError::Store(StoreError::BadReply(ref m))) if m.contains("panicked")),
        "{first:?}"
    );
    tokio::time::timeout(patience, hybrid.acquire(1))
        .await
        .expect("the limiter's task lives on")
        .unwrap();

    hybrid.shutdown().await;
    store.lease_panics.store(1, Ordering::SeqCst);
    store.release_panics.store(1, Ordering::SeqCst);
    let keyed = KeyedHybridLimiter::<String, _>::builder("panicking", quota, store.clone())
        .on_store_failure(FailurePolicy::FailClosed)
        .max_in_flight(1)
        .give_back_after(Duration::from_millis(100))
        .build()
        .unwrap();
    let first = tokio::time::timeout(patience, keyed.acquire("a", 1))
        .await
        .unwrap();
    assert!(
        matches!(first, Err(AcquireError::Store(StoreError::BadReply(_)))),
        "{first:?}"
    );
    assert_eq!(
        store.lease_panics.load(Ordering::SeqCst),
        0,
        "the lease panic ran"
    );
    // Failing closed, the store's error answers until a probe finds it serving again.
    let mut served = false;
    for _ in 0..20 {
        let next = tokio::time::timeout(patience, keyed.acquire("a", 1));
        if next.await.expect("the key's waiters are answered").is_ok() {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(served, "{:?}", keyed.stats());
    // Idle keys give their tokens back: the first release panics, the next ones serve. (Each
    // key is asked at 50/s for a while first, so that its leases are sized for that and
    // leave tokens over.)
    for key in ["b", "c"] {
        for _ in 0..200 {
            let _ = keyed.try_acquire(key, 1).unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    assert_eq!(
        store.release_panics.load(Ordering::SeqCst),
        0,
        "the release panic ran"
    );
    let stats = keyed.stats();
    assert!(
        stats.releases >= 2 && stats.tokens_released > 0,
        "{stats:?}"
    );
}
