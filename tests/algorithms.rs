//! The fixed-window, sliding-window and leaky-bucket scripts against real redis-server
//! processes:
//!
//! - each script against its Rust twin ([`MemoryStore`]): random leases, releases (to the
//!   right window and to wrong ones), peeks, per-client budgets, and time moving both ways,
//!   on explicit times, must give identical replies, errors included;
//! - each script under the fuzz driver (`tests/fuzz`), 10 000 vectors, its stored state valid
//!   after every call;
//! - each algorithm in pure mode: exact counts (a fixed window admits exactly `rate` per
//!   window, and almost twice that across its edge; a sliding window never more than `rate`
//!   in any window of `period`; a leaky bucket its burst, then one grant per emission
//!   interval), its budget and retry hints, its keys, and bad input as typed errors.

mod fuzz;
mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fuzz::int_in;
use proptest::prelude::*;
use ratelease::{
    AcquireError, Algorithm, Budget, BuildError, Clock, FakeClock, HybridLimiter, LeaseReply,
    LeaseRequest, LeaseStore, MemoryStore, NodeLease, Quota, RedisLimiter, RedisStore,
    ReleaseRequest, StoreError, Unconfigured, FIXED_WINDOW_LUA, LEAKY_BUCKET_LUA,
    SLIDING_WINDOW_LUA,
};
use support::{max_in_window, RedisServer};

const NEW: [Algorithm; 3] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingWindow,
    Algorithm::LeakyBucket,
];

/// A clock tests can set, also backwards (the scripts must cope with a server clock that
/// steps back).
#[derive(Clone, Default)]
struct TestClock(Arc<AtomicU64>);

impl TestClock {
    fn set_us(&self, us: u64) {
        self.0.store(us, Ordering::Relaxed);
    }

    fn us(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Clock for TestClock {
    fn now(&self) -> Duration {
        Duration::from_micros(self.us())
    }
}

/// Where a release says its tokens were leased.
#[derive(Debug, Clone, Copy)]
enum At {
    None,
    /// The `at` of one of the last leases (0 = the last).
    Recent(usize),
    /// The last lease's `at`, moved by a few µs.
    Shifted(i64),
}

#[derive(Debug, Clone, Copy)]
enum Step {
    Lease {
        want: u64,
        min: u64,
        client: Option<u64>,
    },
    Release {
        tokens: u64,
        at: At,
        client: Option<u64>,
    },
    Advance {
        us: u64,
    },
    Back {
        us: u64,
    },
}

/// Everyday quotas and quotas near the 2^52 limit; windows have `burst = rate`.
fn quota(algorithm: Algorithm) -> impl Strategy<Value = Quota> {
    let windowed = algorithm != Algorithm::LeakyBucket;
    let everyday = (1u64..2_000, 1u64..5_000_000, 1u64..500);
    let huge = (1u64..1 << 44, 1u64..1 << 44, 1u64..1 << 30);
    prop_oneof![3 => everyday, 1 => huge].prop_filter_map("representable", move |(r, p, b)| {
        let b = if windowed { r } else { b };
        Quota::with_parts(r, Duration::from_micros(p), b).ok()
    })
}

fn steps(q: Quota) -> impl Strategy<Value = Vec<Step>> {
    let (burst, period) = (q.burst(), q.period_us());
    let client = prop_oneof![3 => Just(None), 1 => (0u64..2).prop_map(Some)];
    let at = prop_oneof![
        1 => Just(At::None),
        4 => Just(At::Recent(0)),
        2 => (1usize..4).prop_map(At::Recent),
        1 => (-3i64..=3).prop_map(At::Shifted),
    ];
    let step = prop_oneof![
        6 => (1..=burst * 2, 1..=burst + 1, client.clone())
            .prop_map(|(want, min, client)| Step::Lease { want, min, client }),
        3 => (0..=burst + 1, at, client)
            .prop_map(|(tokens, at, client)| Step::Release { tokens, at, client }),
        3 => (0..=period * 2).prop_map(|us| Step::Advance { us }),
        1 => (0..=period / 2).prop_map(|us| Step::Advance { us }),
        1 => (0..=period).prop_map(|us| Step::Back { us }),
    ];
    prop::collection::vec(step, 1..40)
}

/// Replies must match; errors in kind and message.
fn same(m: &Result<LeaseReply, StoreError>, r: &Result<LeaseReply, StoreError>) -> bool {
    match (m, r) {
        (Ok(a), Ok(b)) => a == b,
        (Err(StoreError::Rejected(a)), Err(StoreError::Rejected(b))) => a == b,
        _ => false,
    }
}

/// A store on `server` that sends `clock`'s time to the scripts.
async fn explicit_store(server: &RedisServer, clock: impl Clock) -> RedisStore {
    RedisStore::builder(server.url())
        .response_timeout(Duration::from_secs(5))
        .explicit_clock(clock)
        .connect()
        .await
        .unwrap()
}

/// Counts of what the differential test compared, so it cannot pass vacuously.
#[derive(Debug, Default)]
struct Seen {
    replies: u64,
    grants: u64,
    denials: u64,
    releases: u64,
    /// Releases that raised the budget (same client, no time moved since its last reply).
    effective: u64,
    rejected: u64,
}

#[test]
fn each_script_and_its_twin_agree() {
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let clock = TestClock::default();
    let redis = rt.block_on(explicit_store(&server, clock.clone()));
    let case = AtomicU64::new(0);
    for algorithm in NEW {
        let seen = std::cell::RefCell::new(Seen::default());
        let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(96));
        let strategy = quota(algorithm).prop_flat_map(|q| (Just(q), steps(q)));
        let result = runner.run(&strategy, |(q, steps)| {
            // A fresh memory store, key and time per case.
            let memory = MemoryStore::with_clock(clock.clone());
            let name = format!("diff-{}", case.fetch_add(1, Ordering::Relaxed));
            clock.set_us(1_700_000_000_000_000);
            let mut ats: Vec<Duration> = Vec::new();
            // The last reply's client and remaining, while time stands still.
            let mut last: Option<(Option<u64>, u64)> = None;
            rt.block_on(async {
                for step in &steps {
                    let (m, r) = match *step {
                        Step::Advance { us } => {
                            clock.set_us(clock.us() + us);
                            last = None;
                            continue;
                        }
                        Step::Back { us } => {
                            clock.set_us(clock.us().saturating_sub(us));
                            last = None;
                            continue;
                        }
                        Step::Lease { want, min, client } => {
                            let req = LeaseRequest::new(want, min)
                                .for_client(client)
                                .algorithm(algorithm);
                            (
                                memory.lease(&name, &q, &req).await,
                                redis.lease(&name, &q, &req).await,
                            )
                        }
                        Step::Release { tokens, at, client } => {
                            let last = ats.last().copied();
                            let at = match at {
                                At::None => None,
                                At::Recent(i) => ats.iter().rev().nth(i).copied(),
                                At::Shifted(d) => last.map(|a| {
                                    Duration::from_micros((a.as_micros() as i64 + d).max(0) as u64)
                                }),
                            };
                            let req = ReleaseRequest::new(tokens)
                                .for_client(client)
                                .algorithm(algorithm)
                                .leased_at(at);
                            seen.borrow_mut().releases += 1;
                            (
                                memory.release(&name, &q, &req).await,
                                redis.release(&name, &q, &req).await,
                            )
                        }
                    };
                    prop_assert!(
                        same(&m, &r),
                        "{algorithm} {step:?} on {q:?}: memory {m:?} vs redis {r:?}"
                    );
                    let mut seen = seen.borrow_mut();
                    seen.replies += 1;
                    let client = match *step {
                        Step::Lease { client, .. } | Step::Release { client, .. } => client,
                        _ => None,
                    };
                    if let (Ok(reply), Step::Release { .. }, Some((c, before))) = (&m, step, last) {
                        seen.effective += u64::from(c == client && reply.remaining > before);
                    }
                    last = m.as_ref().ok().map(|reply| (client, reply.remaining));
                    match (&m, step) {
                        (Ok(reply), Step::Lease { .. }) if reply.granted > 0 => {
                            seen.grants += 1;
                            ats.extend(reply.at);
                        }
                        (Ok(reply), Step::Lease { .. }) if reply.retry_after > Duration::ZERO => {
                            seen.denials += 1;
                        }
                        (Err(_), _) => seen.rejected += 1,
                        _ => {}
                    }
                }
                Ok(())
            })
        });
        result.unwrap();
        let seen = seen.into_inner();
        eprintln!("{algorithm}: {seen:?}");
        assert!(
            seen.replies > 600
                && seen.grants > 150
                && seen.denials > 50
                && seen.effective > 20
                && seen.rejected > 20,
            "{algorithm}: {seen:?}"
        );
    }
}

#[tokio::test]
async fn a_long_sliding_log_gives_a_lower_bound_retry_in_both() {
    let server = RedisServer::start();
    let clock = FakeClock::starting_at(Duration::from_secs(1_000));
    let redis = explicit_store(&server, clock.clone()).await;
    let memory = MemoryStore::with_clock(clock.clone());
    // 300 single grants 1 µs apart: 300 log entries. A lease of min 250 needs 150 to leave;
    // the retry is looked up among the 128 oldest, so it is the time the 128th leaves.
    let q = Quota::new(400, Duration::from_secs(1)).unwrap();
    let lease = |n| LeaseRequest::exact(n).algorithm(Algorithm::SlidingWindow);
    for _ in 0..300 {
        let (m, r) = (
            memory.lease("log", &q, &lease(1)).await,
            redis.lease("log", &q, &lease(1)).await,
        );
        assert!(same(&m, &r) && m.unwrap().granted == 1);
        clock.advance(Duration::from_micros(1));
    }
    let entries: u64 = server.cmd(&[
        "ZCARD",
        &redis.algorithm_keys("log", Algorithm::SlidingWindow, None)[0],
    ]);
    assert_eq!(entries, 300);
    let (m, r) = (
        memory.lease("log", &q, &lease(250)).await,
        redis.lease("log", &q, &lease(250)).await,
    );
    assert!(same(&m, &r), "{m:?} vs {r:?}");
    let m = m.unwrap();
    assert_eq!((m.granted, m.remaining), (0, 100));
    // Now is 300 µs after the first entry; the 128th was made at 127 µs.
    assert_eq!(m.retry_after, Duration::from_micros(1_000_000 - 300 + 127));
    assert_eq!(m.reset_after, Duration::from_micros(1_000_000 - 1));
}

// ---------------------------------------------------------------------------------------------
// Fuzz

/// A plausible small integer, or junk.
fn plausible() -> BoxedStrategy<String> {
    prop_oneof![
        6 => (1u64..50).prop_map(|v| v.to_string()),
        1 => (1u64..5_000_000).prop_map(|v| v.to_string()),
        2 => fuzz::junk(),
    ]
    .boxed()
}

/// The window and leaky-bucket scripts' argument vectors: op, rate, period, burst (usually the rate), want or
/// tokens, min or at, now (mostly the server's clock, sometimes small explicit times, so
/// time also goes back).
fn new_script_args() -> BoxedStrategy<Vec<String>> {
    let op = prop_oneof![
        6 => Just("lease".to_string()),
        3 => Just("release".to_string()),
        2 => Just("peek".to_string()),
        1 => "[a-z]{0,5}",
    ];
    let burst = prop_oneof![4 => Just(None), 1 => plausible().prop_map(Some)];
    let sixth = prop_oneof![4 => plausible(), 1 => Just(String::new())];
    let now = prop_oneof![
        4 => Just(String::new()),
        2 => (0u64..60).prop_map(|v| v.to_string()),
        1 => fuzz::junk(),
    ];
    (op, plausible(), plausible(), burst, plausible(), sixth, now)
        .prop_map(|(op, rate, period, burst, fifth, sixth, now)| {
            let burst = burst.unwrap_or_else(|| rate.clone());
            vec![op, rate, period, burst, fifth, sixth, now]
        })
        .boxed()
}

/// A reply of the window and leaky-bucket scripts: five non-negative integers.
fn five_integers(_: &[String], _: &[String], reply: &redis::Value) -> Result<(), String> {
    let reply: Vec<i64> = redis::from_redis_value(reply.clone()).map_err(|e| e.to_string())?;
    if reply.len() == 5 && reply.iter().all(|v| *v >= 0) {
        Ok(())
    } else {
        Err("expected 5 non-negative integers".into())
    }
}

const M: i64 = 1 << 52;

/// A hash's fields as strings, and its time to live.
fn hash_and_ttl(replies: &[redis::Value]) -> (HashMap<String, String>, i64) {
    let hash = redis::from_redis_value(replies[0].clone()).unwrap();
    let ttl = redis::from_redis_value(replies[1].clone()).unwrap();
    (hash, ttl)
}

/// The fixed window: absent, or exactly `s` in 0..=2^52 and `c` in 1..=2^52, expiring.
const FIXED_STATE: fuzz::StateCheck = fuzz::StateCheck {
    read: |keys, pipe| {
        pipe.cmd("HGETALL").arg(&keys[0]);
        pipe.cmd("PTTL").arg(&keys[0]);
    },
    check: |_, replies| {
        let (h, ttl) = hash_and_ttl(replies);
        let field = |k: &str| h.get(k).map(String::as_str).unwrap_or("");
        let ok = (h.is_empty() && ttl == -2)
            || (h.len() == 2 && int_in(field("s"), 0, M) && int_in(field("c"), 1, M) && ttl >= 0);
        ok.then_some(())
            .ok_or_else(|| format!("window {h:?}, ttl {ttl}"))
    },
};

/// The leaky bucket: absent, or exactly `t` in 0..=2^53 and `f` in 0..2^52, expiring.
const LEAKY_STATE: fuzz::StateCheck = fuzz::StateCheck {
    read: FIXED_STATE.read,
    check: |_, replies| {
        let (h, ttl) = hash_and_ttl(replies);
        let field = |k: &str| h.get(k).map(String::as_str).unwrap_or("");
        let ok = (h.is_empty() && ttl == -2)
            || (h.len() == 2
                && int_in(field("t"), 0, 2 * M)
                && int_in(field("f"), 0, M - 1)
                && ttl >= 0);
        ok.then_some(())
            .ok_or_else(|| format!("funnel {h:?}, ttl {ttl}"))
    },
};

/// The sliding window: both keys absent, or a log of entries "t:n" scored t with n ≥ 1, one
/// per time, and a total equal to their sum; both expiring.
const SLIDING_STATE: fuzz::StateCheck = fuzz::StateCheck {
    read: |keys, pipe| {
        pipe.cmd("ZRANGE")
            .arg(&keys[0])
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES");
        pipe.cmd("HGETALL").arg(&keys[1]);
        pipe.cmd("PTTL").arg(&keys[0]);
        pipe.cmd("PTTL").arg(&keys[1]);
    },
    check: |_, r| {
        let log: Vec<(String, i64)> = redis::from_redis_value(r[0].clone()).unwrap();
        let total: HashMap<String, String> = redis::from_redis_value(r[1].clone()).unwrap();
        let ttls: [i64; 2] = [2, 3].map(|i| redis::from_redis_value(r[i].clone()).unwrap());
        if log.is_empty() && total.is_empty() && ttls == [-2, -2] {
            return Ok(());
        }
        let mut sum = 0i64;
        for (member, score) in &log {
            let ok = match member.split_once(':') {
                Some((t, n)) => t == score.to_string() && int_in(n, 1, M) && int_in(t, 0, M),
                None => false,
            };
            if !ok {
                return Err(format!("entry {member} at {score}"));
            }
            sum += member.split_once(':').unwrap().1.parse::<i64>().unwrap();
        }
        let ok = !log.is_empty()
            && total.len() == 1
            && total.get("n") == Some(&sum.to_string())
            && ttls.iter().all(|t| *t >= 0);
        ok.then_some(()).ok_or_else(|| {
            format!(
                "log of {} entries summing {sum}, total {total:?}, ttls {ttls:?}",
                log.len()
            )
        })
    },
};

fn new_script(
    name: &'static str,
    source: &'static str,
    keys: fn(u8) -> Vec<String>,
    state: fuzz::StateCheck,
) -> fuzz::Script {
    fuzz::Script {
        name,
        source,
        keys,
        optional_keys: 0,
        args: new_script_args(),
        encode: None,
        reply: five_integers,
        state,
    }
}

fn fuzz_one(script: fuzz::Script) {
    let server = RedisServer::start();
    let out = fuzz::run(&script, &mut server.connection(), 10_000);
    eprintln!("{}: {out:?}", script.name);
    assert!(out.rejected > 1_000 && out.served > 1_000, "{out:?}");
}

#[test]
fn the_fixed_window_script_never_fails_at_runtime_nor_stores_invalid_state() {
    fuzz_one(new_script(
        "fixed_window.lua",
        FIXED_WINDOW_LUA,
        |i| vec![format!("fuzz:{{fw{i}}}")],
        FIXED_STATE,
    ));
}

#[test]
fn the_sliding_window_script_never_fails_at_runtime_nor_stores_invalid_state() {
    fuzz_one(new_script(
        "sliding_window.lua",
        SLIDING_WINDOW_LUA,
        |i| vec![format!("fuzz:{{sw{i}}}"), format!("fuzz:{{sw{i}}}:n")],
        SLIDING_STATE,
    ));
}

#[test]
fn the_leaky_bucket_script_never_fails_at_runtime_nor_stores_invalid_state() {
    fuzz_one(new_script(
        "leaky_bucket.lua",
        LEAKY_BUCKET_LUA,
        |i| vec![format!("fuzz:{{lb{i}}}")],
        LEAKY_STATE,
    ));
}

// ---------------------------------------------------------------------------------------------
// Pure mode

fn pure(
    store: &RedisStore,
    name: &str,
    quota: Quota,
    algorithm: Algorithm,
) -> RedisLimiter<RedisStore> {
    RedisLimiter::builder(name, quota, store.clone())
        .algorithm(algorithm)
        .build()
        .unwrap()
}

/// Requests `n` single tokens; returns how many were admitted.
async fn admit(limiter: &RedisLimiter<RedisStore>, n: u64) -> u64 {
    let mut admitted = 0;
    for _ in 0..n {
        admitted += u64::from(limiter.acquire_now(1).await.unwrap().is_allowed());
    }
    admitted
}

#[tokio::test]
async fn a_fixed_window_admits_exactly_its_rate_per_window_and_almost_twice_across_an_edge() {
    let server = RedisServer::start();
    let clock = FakeClock::starting_at(Duration::from_secs(1_000_000));
    let store = explicit_store(&server, clock.clone()).await;
    let q = Quota::per_second(10).unwrap();
    let fw = pure(&store, "fw", q, Algorithm::FixedWindow);
    assert_eq!(admit(&fw, 15).await, 10);
    let denied = fw.check(1).await.unwrap();
    assert_eq!(
        denied.retry_after(),
        Duration::from_secs(1),
        "until the window ends"
    );
    assert_eq!((denied.limit, denied.remaining), (10, 0));
    clock.advance(Duration::from_micros(999_999));
    assert_eq!(admit(&fw, 5).await, 0, "still the same window");
    clock.advance(Duration::from_micros(1));
    assert_eq!(
        admit(&fw, 15).await,
        10,
        "a new window: exactly the rate again"
    );

    // The edge: one request opens a window; nine more just before it ends, ten just after.
    let edge = pure(&store, "edge", q, Algorithm::FixedWindow);
    clock.advance(Duration::from_secs(5));
    assert_eq!(admit(&edge, 1).await, 1);
    clock.advance(Duration::from_micros(999_999));
    let before = admit(&edge, 20).await;
    clock.advance(Duration::from_micros(1));
    let after = admit(&edge, 20).await;
    assert_eq!(
        (before, after),
        (9, 10),
        "19 = 2 × rate − 1 admitted within 1 µs"
    );

    // The same pattern under a sliding window admits the rate and no more.
    let sw = pure(&store, "edge-sw", q, Algorithm::SlidingWindow);
    assert_eq!(admit(&sw, 1).await, 1);
    clock.advance(Duration::from_micros(999_999));
    let before = admit(&sw, 20).await;
    clock.advance(Duration::from_micros(1));
    let after = admit(&sw, 20).await;
    assert_eq!(
        (before, after),
        (9, 1),
        "only the token of the first request left"
    );
}

#[tokio::test]
async fn a_sliding_window_never_admits_more_than_its_rate_in_any_window() {
    let server = RedisServer::start();
    let clock = FakeClock::starting_at(Duration::from_secs(1_000_000));
    let start = clock.now();
    let store = explicit_store(&server, clock.clone()).await;
    let q = Quota::new(20, Duration::from_millis(100)).unwrap();
    let limiters = [1, 2].map(|id| {
        RedisLimiter::builder("sw", q, store.clone())
            .algorithm(Algorithm::SlidingWindow)
            .client_id(id)
            .build()
            .unwrap()
    });
    let mut rng = fastrand::Rng::with_seed(7);
    let (mut admissions, mut asked) = (Vec::new(), 0);
    for i in 0..1_500 {
        clock.advance(Duration::from_micros(rng.u64(0..2_000)));
        let n = rng.u64(1..=3);
        asked += n;
        if limiters[i % 2].acquire_now(n).await.unwrap().is_allowed() {
            admissions.push(((clock.now() - start).as_micros() as u64, n));
        }
    }
    let elapsed = (clock.now() - start).as_micros() as u64;
    let admitted: u64 = admissions.iter().map(|a| a.1).sum();
    for window in [100_000, 50_000, 10_000] {
        let most = max_in_window(&admissions, window);
        assert!(most <= 20, "{most} admitted in a window of {window} µs");
    }
    assert_eq!(
        max_in_window(&admissions, 100_000),
        20,
        "the rate was reached"
    );
    // Demand was about three times the rate; nearly the whole rate was admitted.
    let limit = 20 * elapsed / 100_000;
    assert!(asked > 2 * limit, "asked {asked}, limit {limit}");
    assert!(admitted * 10 >= limit * 9, "admitted {admitted} of {limit}");
}

#[tokio::test]
async fn a_leaky_bucket_admits_its_burst_then_one_per_emission_interval() {
    let server = RedisServer::start();
    let clock = FakeClock::starting_at(Duration::from_secs(1_000_000));
    let start = clock.now();
    let store = explicit_store(&server, clock.clone()).await;
    // A funnel of 3 leaking 10 per second: one every 100 ms.
    let q = Quota::per_second(10).unwrap().with_burst(3).unwrap();
    let lb = pure(&store, "sms", q, Algorithm::LeakyBucket);
    assert_eq!(admit(&lb, 5).await, 3, "the burst");
    let denied = lb.check(1).await.unwrap();
    assert_eq!(denied.retry_after(), Duration::from_millis(100));
    assert_eq!(
        denied.reset_after,
        Duration::from_millis(300),
        "until the funnel is empty"
    );
    let mut at = Vec::new();
    for _ in 0..1_000 {
        clock.advance(Duration::from_millis(1));
        if lb.acquire_now(1).await.unwrap().is_allowed() {
            at.push((clock.now() - start).as_millis());
        }
    }
    let expected: Vec<u128> = (1..=10).map(|k| k * 100).collect();
    assert_eq!(at, expected, "spaced exactly 100 ms apart");
    assert_eq!(lb.available_permits().await.unwrap(), 0);
    clock.advance(Duration::from_millis(300));
    assert_eq!(lb.available_permits().await.unwrap(), 3, "empty again");
    let keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    assert_eq!(
        keys,
        vec!["ratelease:{sms}:lb".to_string()],
        "expires 10 s after empty"
    );
}

#[tokio::test]
async fn every_algorithm_reports_its_budget_and_keeps_keys_of_its_own() {
    let server = RedisServer::start();
    let clock = FakeClock::starting_at(Duration::from_secs(1_000_000));
    let store = explicit_store(&server, clock.clone()).await;
    let q = Quota::per_minute(60).unwrap();
    for algorithm in Algorithm::ALL {
        let limiter = pure(&store, "api", q, algorithm);
        assert_eq!(limiter.algorithm(), algorithm);
        assert_eq!(
            limiter.available_permits().await.unwrap(),
            60,
            "{algorithm}"
        );
        let v = limiter.check(45).await.unwrap();
        assert!(v.is_allowed(), "{algorithm}: its own budget");
        assert_eq!((v.limit, v.remaining), (60, 15), "{algorithm}");
        // The windows are whole again when they end; the buckets once 45 tokens refilled.
        let reset = match algorithm {
            Algorithm::FixedWindow | Algorithm::SlidingWindow => 60,
            _ => 45,
        };
        assert_eq!(v.reset_after, Duration::from_secs(reset), "{algorithm}");
        let v = limiter.check(20).await.unwrap();
        assert!(!v.is_allowed(), "{algorithm}");
        assert_eq!(
            limiter.available_permits().await.unwrap(),
            15,
            "{algorithm}"
        );
        // Per-client budgets: a client of its own.
        let client = RedisLimiter::builder("api", q, store.clone())
            .algorithm(algorithm)
            .budget(Budget::PerClient)
            .client_id(9)
            .build()
            .unwrap();
        assert!(
            client.acquire_now(60).await.unwrap().is_allowed(),
            "{algorithm}"
        );
    }
    let mut keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    keys.sort();
    let client = ":client:0000000000000009";
    let expected = [
        "ratelease:{api}".to_string(),
        format!("ratelease:{{api}}{client}"),
        "ratelease:{api}:fw".to_string(),
        format!("ratelease:{{api}}:fw{client}"),
        "ratelease:{api}:lb".to_string(),
        format!("ratelease:{{api}}:lb{client}"),
        "ratelease:{api}:sw".to_string(),
        "ratelease:{api}:sw:n".to_string(),
        format!("ratelease:{{api}}:sw{client}"),
        format!("ratelease:{{api}}:sw{client}:n"),
    ];
    let mut expected = expected.to_vec();
    expected.sort();
    assert_eq!(keys, expected);
    for algorithm in NEW {
        for key in store.algorithm_keys("api", algorithm, None) {
            assert!(keys.contains(&key), "{algorithm}: {key}");
        }
    }
}

#[tokio::test]
async fn releases_go_back_only_to_where_their_lease_was_counted_on_the_server_clock() {
    let server = RedisServer::start();
    let store = server.store().await;
    let q = Quota::per_minute(10).unwrap();
    for algorithm in NEW {
        let name = algorithm.name();
        let lease = LeaseRequest::new(8, 1).algorithm(algorithm);
        let got = store.lease(name, &q, &lease).await.unwrap();
        assert_eq!((got.granted, got.remaining), (8, 2), "{algorithm}");
        let at = got
            .at
            .expect("the window and leaky-bucket scripts say where");
        let now = std::time::SystemTime::UNIX_EPOCH.elapsed().unwrap();
        assert!(
            now.abs_diff(at) < Duration::from_secs(5),
            "{algorithm}: server time"
        );
        let release = |at| ReleaseRequest::new(5).algorithm(algorithm).leased_at(at);
        // The windows ignore a release to another window (or log entry); the funnel takes
        // tokens back wherever they came from.
        let expected = match algorithm {
            Algorithm::LeakyBucket => [7, 10],
            _ => [2, 7],
        };
        let wrong = at + Duration::from_micros(1);
        let r = store
            .release(name, &q, &release(Some(wrong)))
            .await
            .unwrap();
        assert_eq!(r.remaining, expected[0], "{algorithm}");
        let r = store.release(name, &q, &release(Some(at))).await.unwrap();
        assert_eq!(r.remaining, expected[1], "{algorithm}");
    }
}

#[tokio::test]
async fn bad_settings_and_requests_are_typed_errors() {
    let store = MemoryStore::new();
    let q = Quota::per_second(10).unwrap();
    let bursty = q.with_burst(20).unwrap();
    for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
        let err = RedisLimiter::builder("x", bursty, store.clone())
            .algorithm(algorithm)
            .build()
            .unwrap_err();
        assert!(
            matches!(&err, BuildError::Config(m) if m.contains("burst")),
            "{err}"
        );
    }
    for algorithm in NEW {
        let err = RedisLimiter::builder("x", q, store.clone())
            .algorithm(algorithm)
            .if_unconfigured(Unconfigured::Unlimited)
            .build()
            .unwrap_err();
        assert!(
            matches!(&err, BuildError::Config(m) if m.contains("token bucket")),
            "{err}"
        );
        let pure = pure_on(&store, q, algorithm);
        assert!(matches!(
            pure.acquire_now(0).await,
            Err(AcquireError::ZeroTokens)
        ));
        assert!(matches!(
            pure.acquire_now(11).await,
            Err(AcquireError::ExceedsBurst { .. })
        ));
        // Lease terms, "configured only", and a window's release without its window.
        let node = NodeLease {
            id: 1,
            held: 0,
            demand_mtps: 0,
            horizon: Duration::from_millis(10),
            ttl: Duration::from_secs(1),
            rate_mtps: 0,
            release_seq: 0,
        };
        let by_node = LeaseRequest::new(1, 1).algorithm(algorithm).by(node);
        let only = LeaseRequest::new(1, 1)
            .algorithm(algorithm)
            .configured_only(true);
        for req in [by_node, only] {
            let err = store.lease("x", &q, &req).await.unwrap_err();
            assert!(matches!(err, StoreError::Rejected(_)), "{err:?}");
        }
        let no_at = ReleaseRequest::new(1).algorithm(algorithm);
        let r = store.release("x", &q, &no_at).await;
        match algorithm {
            Algorithm::LeakyBucket => assert!(r.is_ok()),
            _ => assert!(
                matches!(&r, Err(StoreError::Rejected(m)) if m == "invalid argument at"),
                "{r:?}"
            ),
        }
    }
    for algorithm in [Algorithm::SlidingWindow, Algorithm::LeakyBucket] {
        let err = HybridLimiter::builder("x", q, store.clone())
            .algorithm(algorithm)
            .build()
            .unwrap_err();
        assert!(
            matches!(&err, BuildError::Config(m) if m.contains("RedisLimiter")),
            "{err}"
        );
    }
    assert!(HybridLimiter::builder("x", q, store.clone())
        .algorithm(Algorithm::FixedWindow)
        .build()
        .is_ok());
}

fn pure_on(store: &MemoryStore, quota: Quota, algorithm: Algorithm) -> RedisLimiter<MemoryStore> {
    RedisLimiter::builder("typed", quota, store.clone())
        .algorithm(algorithm)
        .build()
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// Hybrid fixed window (on the in-process store and tokio's paused clock)

/// Lets every ready task (refill tasks, whose store calls complete at once) run.
async fn settle() {
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
}

/// A store that takes `delay` on the way to the store and again on the way back.
#[derive(Clone)]
struct Delayed {
    inner: MemoryStore,
    delay: Duration,
}

impl LeaseStore for Delayed {
    async fn lease(
        &self,
        name: &str,
        quota: &Quota,
        req: &LeaseRequest,
    ) -> Result<LeaseReply, StoreError> {
        tokio::time::sleep(self.delay).await;
        let reply = self.inner.lease(name, quota, req).await;
        tokio::time::sleep(self.delay).await;
        reply
    }

    async fn release(
        &self,
        name: &str,
        quota: &Quota,
        req: &ReleaseRequest,
    ) -> Result<LeaseReply, StoreError> {
        tokio::time::sleep(self.delay).await;
        let reply = self.inner.release(name, quota, req).await;
        tokio::time::sleep(self.delay).await;
        reply
    }
}

/// The fixed window open now (its start), if any, and its remaining budget: a peek.
async fn window(store: &MemoryStore, name: &str, q: &Quota) -> (Option<Duration>, u64) {
    let peek = ReleaseRequest::new(0).algorithm(Algorithm::FixedWindow);
    let r = store.release(name, q, &peek).await.unwrap();
    // Remaining below the rate: something is counted, so a window is open and `at` is its start.
    (
        (r.remaining < q.rate()).then_some(r.at.unwrap()),
        r.remaining,
    )
}

/// Four hybrid nodes (fixed batches and the adaptive policy) share a fixed window of 100
/// tokens per 100 ms, under overload and then light load, with a store `delay` each way.
/// Every admission is attributed to the window open at that moment: there must be one, and no
/// window may admit more than its rate.
async fn hybrid_fleet_on_fixed_windows(delay: Duration) {
    let store = MemoryStore::with_clock(ratelease::TokioClock::new());
    let q = Quota::new(100, Duration::from_millis(100)).unwrap();
    let nodes: Vec<HybridLimiter<Delayed>> = (0..4)
        .map(|i| {
            let shared = Delayed {
                inner: store.clone(),
                delay,
            };
            let builder = HybridLimiter::builder("fw", q, shared)
                .algorithm(Algorithm::FixedWindow)
                .seed(i);
            let builder = if i % 2 == 0 {
                builder.lease_size(15)
            } else {
                builder
            };
            builder.build().unwrap()
        })
        .collect();
    let mut per_window: HashMap<Duration, u64> = HashMap::new();
    let mut rng = fastrand::Rng::with_seed(11);
    for i in 0..12_000 {
        // Overload (about 13 times the rate), then light load (below it).
        let gap = if i < 6_000 { 300 } else { 4_000 };
        tokio::time::advance(Duration::from_micros(rng.u64(0..gap))).await;
        settle().await;
        let n = rng.u64(1..=3);
        if nodes[rng.usize(0..4)].try_acquire(n).unwrap().is_allowed() {
            let (open, _) = window(&store, "fw", &q).await;
            let start = open.expect("admitted while no window was open");
            *per_window.entry(start).or_default() += n;
        }
    }
    let most = per_window.values().max().copied().unwrap_or(0);
    assert!(most <= 100, "a window admitted {most}");
    assert_eq!(most, 100, "the rate was reached");
    let full = per_window.values().filter(|&&n| n >= 90).count();
    assert!(per_window.len() > 30 && full > 10, "{per_window:?}");
    let stats: Vec<_> = nodes.iter().map(HybridLimiter::stats).collect();
    let dropped: u64 = stats.iter().map(|s| s.tokens_expired).sum();
    let returned: u64 = stats.iter().map(|s| s.tokens_released).sum();
    assert!(
        dropped > 0,
        "tokens left at a window's end were dropped: {stats:?}"
    );
    eprintln!(
        "delay {delay:?}: {} windows, {full} at ≥ 90 %; dropped {dropped}, returned {returned}",
        per_window.len()
    );
    for node in &nodes {
        node.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn hybrid_fixed_windows_never_exceed_the_rate_and_carry_no_token_over() {
    hybrid_fleet_on_fixed_windows(Duration::ZERO).await;
}

#[tokio::test(start_paused = true)]
async fn hybrid_fixed_windows_hold_with_slow_store_calls() {
    // Grants arrive 3 ms after the store counted them; leases are in flight across window ends.
    hybrid_fleet_on_fixed_windows(Duration::from_millis(3)).await;
}

#[tokio::test(start_paused = true)]
async fn hybrid_fixed_window_returns_unused_tokens_to_their_own_window_only() {
    let store = MemoryStore::with_clock(ratelease::TokioClock::new());
    let q = Quota::new(100, Duration::from_secs(1)).unwrap();
    let node = |name: &str| {
        HybridLimiter::builder(name, q, store.clone())
            .algorithm(Algorithm::FixedWindow)
            .lease_size(50)
            .build()
            .unwrap()
    };
    // Shutdown: the 40 unspent go back to their window.
    let a = node("a");
    a.acquire(10).await.unwrap();
    assert_eq!(window(&store, "a", &q).await.1, 50);
    a.shutdown().await;
    assert_eq!(window(&store, "a", &q).await.1, 90);

    // Idle (the default policy gives back after 500 ms without demand, and not sooner than
    // four expected gaps between requests).
    let minute = Quota::per_minute(6_000).unwrap();
    let idle = HybridLimiter::builder("idle", minute, store.clone())
        .algorithm(Algorithm::FixedWindow)
        .build()
        .unwrap();
    let mut spent = 0;
    for _ in 0..200 {
        spent += u64::from(idle.try_acquire(1).unwrap().is_allowed());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(idle.available() > 0, "it holds a batch");
    let held = 6_000 - spent - window(&store, "idle", &minute).await.1;
    assert_eq!(held, idle.available());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(idle.available(), 0);
    assert_eq!(idle.stats().tokens_released, held);
    assert_eq!(window(&store, "idle", &minute).await.1, 6_000 - spent);

    // Across a window's end: dropped, without a store call, and nothing reaches the next.
    let b = node("b");
    b.acquire(10).await.unwrap();
    let releases = b.stats().releases;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(b.available(), 0);
    assert_eq!(b.stats().tokens_expired, 40);
    assert_eq!(
        b.stats().releases,
        releases,
        "no release to an ended window"
    );
    assert_eq!(
        window(&store, "b", &q).await,
        (None, 100),
        "nothing carried over"
    );
    let pure = RedisLimiter::builder("b", q, store.clone())
        .algorithm(Algorithm::FixedWindow)
        .build()
        .unwrap();
    assert!(pure.acquire_now(100).await.unwrap().is_allowed());
    b.shutdown().await;
    assert_eq!(window(&store, "b", &q).await.1, 0);
}
