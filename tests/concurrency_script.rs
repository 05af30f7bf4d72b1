//! `lua/concurrency.lua` against its Rust twin, under the fuzz driver, and in a real Redis.
//!
//! The differential property test runs random sequences of acquire / release / sync / peek /
//! time steps for three holders against [`MemoryStore`] and against a real redis-server
//! (explicit `now` from one shared [`FakeClock`]) and requires identical replies, errors
//! included. Sequence numbers are drawn from a small range, so retried and late releases and
//! refused (stale) syncs are common; ttls are short next to the time steps, so holders expire
//! and are reclaimed in the middle of sequences, often exactly at their expiry (both are
//! mostly drawn from a 250 µs grid).

mod fuzz;
mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fuzz::int_in;
use proptest::prelude::*;
use ratelease::concurrency::holders::{Op, Reply};
use ratelease::{
    ConcurrencyStore, FakeClock, MemoryStore, RedisStore, StoreError, CONCURRENCY_LUA,
};
use support::RedisServer;

const HOLDERS: [&str; 3] = ["a", "b", "c"];
const BIG: u64 = 1 << 52;

#[derive(Debug, Clone)]
enum Step {
    Call(Op<'static>),
    Advance { us: u64 },
}

/// Mostly small values; now and then 0, the largest valid value, or one past it.
fn count(hi: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        40 => 1..=hi,
        1 => Just(0),
        1 => Just(BIG),
        1 => Just(BIG + 1),
    ]
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let holder = prop::sample::select(&HOLDERS[..]);
    let seq = 0u64..6;
    // Times on a grid of 250 µs, so calls often land exactly on an expiry.
    let ttl = prop_oneof![
        20 => (1u64..8).prop_map(|k| k * 250),
        10 => 1u64..3_000,
        1 => Just(0u64),
        1 => Just(BIG),
    ];
    // Mostly one limit per case (as a fleet should), sometimes another.
    let limit = prop_oneof![20 => Just(6u64), 6 => 1u64..12, 1 => Just(0u64)];
    let acquire = (
        holder.clone(),
        count(8),
        count(8),
        limit,
        ttl.clone(),
        seq.clone(),
        seq.clone(),
    )
        .prop_map(
            |(holder, want, min, limit, ttl_us, aseq, rseq)| Op::Acquire {
                holder,
                want,
                min,
                limit,
                ttl_us,
                aseq,
                rseq,
            },
        );
    let release = (holder.clone(), count(6), seq.clone())
        .prop_map(|(holder, n, rseq)| Op::Release { holder, n, rseq });
    let sync = (holder.clone(), count(8), ttl, seq.clone(), seq).prop_map(
        |(holder, count, ttl_us, aseq, rseq)| Op::Sync {
            holder,
            count,
            ttl_us,
            aseq,
            rseq,
        },
    );
    let peek = prop_oneof![holder, Just("")].prop_map(|holder| Op::Peek { holder });
    let step = prop_oneof![
        6 => acquire.prop_map(Step::Call),
        3 => release.prop_map(Step::Call),
        3 => sync.prop_map(Step::Call),
        1 => peek.prop_map(Step::Call),
        3 => prop_oneof![(0u64..6).prop_map(|k| k * 250), 0u64..2_500]
            .prop_map(|us| Step::Advance { us }),
    ];
    prop::collection::vec(step, 1..40)
}

/// A store on `server` whose script calls carry `now` from `clock`.
async fn store_at(server: &RedisServer, clock: &FakeClock, prefix: &str) -> RedisStore {
    RedisStore::builder(server.url())
        .response_timeout(Duration::from_secs(5))
        .prefix(prefix)
        .explicit_clock(clock.clone())
        .connect()
        .await
        .unwrap()
}

/// Compares replies; errors must match in kind and message.
fn same(mem: &Result<Reply, StoreError>, red: &Result<Reply, StoreError>) -> bool {
    match (mem, red) {
        (Ok(a), Ok(b)) => a == b,
        (Err(StoreError::Rejected(a)), Err(StoreError::Rejected(b))) => a == b,
        _ => false,
    }
}

/// What the random sequences exercised, so the property cannot pass vacuously.
#[derive(Debug, Default)]
struct Seen {
    compared: u64,
    granted: u64,
    full: u64,
    rejected: u64,
    ignored_releases: u64,
    stale_syncs: u64,
    reclaimed: u64,
}

#[test]
fn memory_store_and_lua_script_agree() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let clock = FakeClock::starting_at(Duration::from_secs(1_700_000_000));
    let redis = rt.block_on(store_at(&server, &clock, "ratelease:"));
    let case = AtomicU64::new(0);
    let seen = std::cell::RefCell::new(Seen::default());
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(200));
    runner
        .run(&steps(), |steps| {
            let memory = MemoryStore::with_clock(clock.clone());
            let name = format!("diff-{}", case.fetch_add(1, Ordering::Relaxed));
            // Which holders the store counts, to notice reclaims.
            let mut live = std::collections::HashSet::new();
            rt.block_on(async {
                for step in &steps {
                    let op = match *step {
                        Step::Call(op) => op,
                        Step::Advance { us } => {
                            clock.advance(Duration::from_micros(us));
                            continue;
                        }
                    };
                    let m = memory.concurrency(&name, &op).await;
                    let r = redis.concurrency(&name, &op).await;
                    prop_assert!(same(&m, &r), "{op:?}: memory {m:?} vs redis {r:?}");
                    let mut s = seen.borrow_mut();
                    s.compared += 1;
                    let Ok(reply) = m else {
                        s.rejected += 1;
                        continue;
                    };
                    match op {
                        Op::Acquire { .. } if reply.granted > 0 => s.granted += 1,
                        Op::Acquire { .. } => s.full += 1,
                        Op::Release { n, .. } if reply.granted == 0 && n > 0 && reply.existed => {
                            s.ignored_releases += 1
                        }
                        Op::Sync { .. } if reply.granted == 0 => s.stale_syncs += 1,
                        _ => {}
                    }
                    let h = op.holder();
                    if h.is_empty() {
                        continue;
                    }
                    if live.contains(h) && !reply.existed {
                        s.reclaimed += 1;
                    }
                    match reply.held > 0 {
                        true => live.insert(h),
                        false => live.remove(h),
                    };
                }
                Ok(())
            })
        })
        .unwrap();
    let s = seen.into_inner();
    eprintln!("{s:?}");
    assert!(s.compared > 2_000, "{s:?}");
    for (what, n) in [
        ("granted", s.granted),
        ("full", s.full),
        ("rejected", s.rejected),
        ("ignored releases", s.ignored_releases),
        ("stale syncs", s.stale_syncs),
        ("reclaimed", s.reclaimed),
    ] {
        assert!(n > 50, "only {n} {what}: {s:?}");
    }
}

#[tokio::test]
async fn keys_carry_the_hash_tag_and_a_suffix_of_their_own_and_expire() {
    let server = RedisServer::start();
    let clock = FakeClock::starting_at(Duration::from_secs(1_000));
    let store = store_at(&server, &clock, "app:").await;
    let acquire = Op::Acquire {
        holder: "h",
        want: 2,
        min: 1,
        limit: 5,
        ttl_us: 2_000_000,
        aseq: 1,
        rseq: 0,
    };
    let reply = store.concurrency("jobs}{x", &acquire).await.unwrap();
    assert_eq!((reply.granted, reply.in_use, reply.held), (2, 2, 2));
    let mut keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    keys.sort();
    assert_eq!(
        keys,
        ["app:{jobs%7D%7Bx}:conc", "app:{jobs%7D%7Bx}:conc:expiry"],
        "one hash tag, apart from the token bucket's key"
    );
    assert_eq!(keys.to_vec(), store.concurrency_keys("jobs}{x").to_vec());
    let ttl_ms: i64 = server.cmd(&["PTTL", &keys[0]]);
    assert!(
        (11_000..=12_000).contains(&ttl_ms),
        "kept until the holder expires (2 s) + 10 s slack, got {ttl_ms}"
    );
    let record: String = server.cmd(&["HGET", &keys[0], "h"]);
    assert_eq!(record, "2 1 0");
    // Releasing everything deletes both keys.
    let release = Op::Release {
        holder: "h",
        n: 2,
        rseq: 1,
    };
    assert_eq!(
        store
            .concurrency("jobs}{x", &release)
            .await
            .unwrap()
            .granted,
        2
    );
    let left: i64 = server.cmd(&["DBSIZE"]);
    assert_eq!(left, 0);
}

#[tokio::test]
async fn corrupt_state_reads_as_absent_and_is_recounted() {
    let server = RedisServer::start();
    let clock = FakeClock::starting_at(Duration::from_secs(1_000));
    let store = store_at(&server, &clock, "ratelease:").await;
    let [hash, zset] = store.concurrency_keys("c");
    let far = (2_000u64 * 1_000_000).to_string();
    let _: () = server.cmd(&["HSET", &hash, "#total", "nan", "a", "3 0 0", "b", "x y z"]);
    let _: () = server.cmd(&["ZADD", &zset, &far, "a", &far, "b"]);
    let peek = Op::Peek { holder: "b" };
    let reply = store.concurrency("c", &peek).await.unwrap();
    assert_eq!((reply.in_use, reply.held, reply.existed), (3, 0, false));
    let total: String = server.cmd(&["HGET", &hash, "#total"]);
    assert_eq!(
        total, "3",
        "the invalid total was recounted from the valid records"
    );
}

/// A key of another type under a limiter's name (a string where the holders hash should be, a
/// hash where the expiry zset should be) is no state the script can read: Redis's WRONGTYPE
/// error reaches the caller as a store error, and neither key is touched (the script reads
/// both before it writes either).
#[tokio::test]
async fn a_key_of_another_type_is_an_error_and_nothing_is_written() {
    let server = RedisServer::start();
    let clock = FakeClock::starting_at(Duration::from_secs(1_000));
    let store = store_at(&server, &clock, "ratelease:").await;
    let acquire = |holder| Op::Acquire {
        holder,
        want: 1,
        min: 1,
        limit: 5,
        ttl_us: 1_000_000,
        aseq: 1,
        rseq: 0,
    };
    for (name, wrong) in [("s", 0), ("z", 1)] {
        let keys = store.concurrency_keys(name);
        let _: () = if wrong == 0 {
            server.cmd(&["SET", &keys[0], "not a hash"])
        } else {
            server.cmd(&["HSET", &keys[1], "f", "v"])
        };
        let err = store.concurrency(name, &acquire("a")).await.unwrap_err();
        assert!(err.to_string().contains("WRONGTYPE"), "{name}: {err}");
        let types: Vec<String> = keys.iter().map(|k| server.cmd(&["TYPE", k])).collect();
        let expected = if wrong == 0 {
            ["string", "none"]
        } else {
            ["none", "hash"]
        };
        assert_eq!(types, expected, "{name}: nothing written");
    }
}

/// The state under one instance's keys: absent, or a total equal to the sum of records of
/// three integers (count ≥ 1), an expiry entry for exactly the records, and a TTL on both keys.
const HOLDERS_STATE: fuzz::StateCheck = fuzz::StateCheck {
    read: |keys, pipe| {
        pipe.cmd("HGETALL").arg(&keys[0]);
        pipe.cmd("ZRANGE")
            .arg(&keys[1])
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES");
        pipe.cmd("PTTL").arg(&keys[0]);
        pipe.cmd("PTTL").arg(&keys[1]);
        pipe.cmd("TYPE").arg(&keys[0]);
        pipe.cmd("TYPE").arg(&keys[1]);
    },
    check: |_, r| {
        let hash: HashMap<String, String> = redis::from_redis_value(r[0].clone()).unwrap();
        let index: Vec<(String, String)> = redis::from_redis_value(r[1].clone()).unwrap();
        let ttls: [i64; 2] = [0, 1].map(|i| redis::from_redis_value(r[2 + i].clone()).unwrap());
        let types = [4, 5].map(|i| fuzz::string(&r[i]).unwrap_or_default());
        match types.each_ref().map(String::as_str) {
            ["none", "none"] => return Ok(()),
            ["hash", "zset"] => {}
            other => return Err(format!("key types {other:?}")),
        }
        const M: i64 = 1 << 52;
        let mut sum = 0i64;
        for (holder, record) in hash.iter().filter(|(k, _)| *k != "#total") {
            let f: Vec<&str> = record.split(' ').collect();
            let ok = f.len() == 3
                && int_in(f[0], 1, M)
                && int_in(f[1], 0, M)
                && int_in(f[2], 0, M)
                && !holder.is_empty()
                && holder.len() <= 128
                && !holder.starts_with('#');
            if !ok {
                return Err(format!("record {holder:?} = {record:?}"));
            }
            sum += f[0].parse::<i64>().unwrap();
        }
        let total = hash.get("#total").map(String::as_str).unwrap_or("");
        if !int_in(total, 0, M) || total.parse::<i64>().unwrap() != sum {
            return Err(format!("total {total:?}, records sum to {sum}"));
        }
        let indexed: Vec<&str> = index.iter().map(|(m, _)| m.as_str()).collect();
        let records = hash.len() - 1;
        let scores_ok = index.iter().all(|(_, s)| int_in(s, 0, 2 * M));
        if indexed.len() != records || !indexed.iter().all(|m| hash.contains_key(*m)) || !scores_ok
        {
            return Err(format!("index {index:?} vs records {hash:?}"));
        }
        if ttls.iter().any(|t| *t <= 0) {
            return Err(format!("keys without expiry: {ttls:?}"));
        }
        Ok(())
    },
};

/// `lua/concurrency.lua` under the fuzz driver: mostly plausible vectors, so both the served
/// and the rejected paths run, on four instances whose state builds up.
fn concurrency_script() -> fuzz::Script {
    let op = prop_oneof![
        6 => Just("acquire".to_string()),
        3 => Just("release".to_string()),
        3 => Just("sync".to_string()),
        1 => Just("peek".to_string()),
        1 => "[a-z]{0,5}",
    ];
    let now = prop_oneof![
        6 => Just(String::new()),
        2 => (0u64..5_000_000).prop_map(|v| v.to_string()),
        1 => fuzz::junk(),
    ];
    let holder = prop_oneof![
        8 => "h[0-2]",
        1 => Just(String::new()),
        1 => Just("#total".to_string()),
        1 => Just("x".repeat(129)),
        1 => fuzz::junk(),
    ];
    let plausible = prop_oneof![
        8 => (0u64..12).prop_map(|v| v.to_string()),
        2 => (1u64..5_000_000).prop_map(|v| v.to_string()),
        1 => Just(BIG.to_string()),
        2 => fuzz::junk(),
    ];
    let args = (op, now, holder, prop::collection::vec(plausible, 6)).prop_map(
        |(op, now, holder, rest)| {
            let mut args = vec![op, now, holder];
            args.extend(rest);
            args
        },
    );
    fuzz::Script {
        name: "concurrency.lua",
        source: CONCURRENCY_LUA,
        keys: |i| {
            vec![
                format!("fuzz:{{c{i}}}:conc"),
                format!("fuzz:{{c{i}}}:conc:expiry"),
            ]
        },
        optional_keys: 0,
        args: args.boxed(),
        encode: None,
        reply: |_, _, reply| {
            let v: Vec<i64> = redis::from_redis_value(reply.clone()).map_err(|e| e.to_string())?;
            match v[..] {
                [granted, in_use, held, existed]
                    if granted >= 0
                        && (0..=1 << 52).contains(&in_use)
                        && (0..=in_use).contains(&held)
                        && (existed == 0 || existed == 1) =>
                {
                    Ok(())
                }
                _ => Err("expected {granted, in_use, held ≤ in_use, existed ∈ 0..=1}".into()),
            }
        },
        state: HOLDERS_STATE,
    }
}

#[test]
fn the_concurrency_script_never_fails_at_runtime_nor_stores_invalid_state() {
    let server = RedisServer::start();
    let out = fuzz::run(&concurrency_script(), &mut server.connection(), 10_000);
    eprintln!("{out:?}");
    assert!(out.rejected > 1_000 && out.served > 2_000, "{out:?}");
}
