//! The Lua script against its Rust twin, and the script's life in a real Redis.
//!
//! The differential property test runs random sequences of lease / release / time steps
//! against [`MemoryStore`] and against a real redis-server (explicit `now` from one shared
//! [`FakeClock`]) and requires identical replies, errors included. Central config operations
//! (init, modify, delete, with quotas that rescale the bucket both ways), per-client budgets
//! and "configured only" requests are among the random steps.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use ratelease::{
    Clock, ConfigStore, FakeClock, LeaseReply, LeaseRequest, LeaseStore, MemoryStore, NodeLease,
    NodeRelease, Quota, QuotaSource, RedisStore, ReleaseRequest, StoreError, TOKEN_BUCKET_LUA,
};
use support::{decode_leaser_record, BucketState, RedisServer};

#[derive(Debug, Clone)]
enum Step {
    Lease(LeaseRequest),
    /// The same anonymous lease several times with no time between: a pure-mode client's
    /// run of requests, which drains what it may take.
    Run(LeaseRequest, usize),
    Release(ReleaseRequest),
    Advance {
        us: u64,
    },
    Init(Quota),
    Modify(Quota),
    Delete,
}

/// Everyday quotas, and quotas near the 2^52 limit of exact arithmetic in Lua doubles.
fn quota() -> impl Strategy<Value = Quota> {
    let everyday = (1u64..2_000, 1u64..5_000_000, 1u64..500);
    let huge = (1u64..1 << 45, 1u64..1 << 45, 1u64..1 << 30);
    prop_oneof![everyday, huge].prop_filter_map("representable", |(r, p, b)| {
        Quota::with_parts(r, Duration::from_micros(p), b).ok()
    })
}

/// Random operations: anonymous and per-node (three nodes, so shares and expiries interact).
fn steps(q: Quota) -> impl Strategy<Value = Vec<Step>> {
    let burst = q.burst();
    let period = q.period_us();
    let node_lease = (
        0u64..3,
        0..=burst + 1,
        0u64..5_000_000,
        1u64..=period * 2,
        1u64..=period * 4,
        // Half of the leases also ask for a rate (a rate lease).
        prop_oneof![Just(0u64), 0u64..5_000_000],
        // Half say which release they sent last (the releases' seqs below), so some releases
        // land at or below it and are ignored; now and then one past 2^52, refused alike.
        prop_oneof![8 => Just(0u64), 8 => 0u64..7, 1 => Just((1u64 << 52) + 1)],
    )
        .prop_map(
            |(id, held, demand_mtps, horizon, ttl, rate_mtps, release_seq)| NodeLease {
                id,
                held,
                demand_mtps,
                horizon: Duration::from_micros(horizon),
                ttl: Duration::from_micros(ttl),
                rate_mtps,
                release_seq,
            },
        );
    let node_release = (0u64..3, 0u64..6, any::<bool>())
        .prop_map(|(id, seq, leaving)| NodeRelease { id, seq, leaving });
    // Config changes: near the caller's quota (small rescales), and anything at all.
    let near = (1..=q.rate() * 3, 1..=period * 3, 1..=burst * 3)
        .prop_filter_map("representable", |(r, p, b)| {
            Quota::with_parts(r, Duration::from_micros(p), b).ok()
        });
    let config = prop_oneof![near, quota()];
    let client = prop_oneof![3 => Just(None), 1 => (0u64..2).prop_map(Some)];
    let step = prop_oneof![
        2 => (1..=burst * 2, 1..=burst + 1, client.clone(), any::<bool>()).prop_map(
            |(want, min, c, only)| {
                Step::Lease(LeaseRequest::new(want, min).for_client(c).configured_only(only))
            }
        ),
        1 => (1..=burst.div_ceil(4), 0.0..=1.0f64, 2usize..12).prop_map(|(want, part, n)| {
            let min = ((want as f64 * part).ceil() as u64).clamp(1, want);
            Step::Run(LeaseRequest::new(want, min), n)
        }),
        1 => config.clone().prop_map(Step::Init),
        1 => config.prop_map(Step::Modify),
        1 => Just(Step::Delete),
        4 => (1..=burst * 2, 1..=burst + 1, node_lease, prop::bool::weighted(0.2)).prop_map(
            |(want, min, n, only)| {
                Step::Lease(LeaseRequest::new(want, min).by(n).configured_only(only))
            }
        ),
        1 => (0..=burst * 3, client)
            .prop_map(|(tokens, c)| Step::Release(ReleaseRequest::new(tokens).for_client(c))),
        2 => (0..=burst + 1, node_release)
            .prop_map(|(tokens, n)| Step::Release(ReleaseRequest::new(tokens).by(n))),
        3 => (0..=period.saturating_mul(2)).prop_map(|us| Step::Advance { us }),
    ];
    prop::collection::vec(step, 1..40)
}

/// Compares replies; errors must match in kind and message.
fn same<T: PartialEq>(mem: &Result<T, StoreError>, red: &Result<T, StoreError>) -> bool {
    match (mem, red) {
        (Ok(a), Ok(b)) => a == b,
        (Err(StoreError::Rejected(a)), Err(StoreError::Rejected(b))) => a == b,
        _ => false,
    }
}

/// A current-thread runtime, a fake clock and a store on `server` whose calls pass the clock's
/// time (at 1 700 000 000 s).
fn runtime_and_store(server: &RedisServer) -> (tokio::runtime::Runtime, FakeClock, RedisStore) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let clock = FakeClock::starting_at(Duration::from_secs(1_700_000_000));
    let redis = rt.block_on(async {
        RedisStore::builder(server.url())
            .response_timeout(Duration::from_secs(5))
            .explicit_clock(clock.clone())
            .connect()
            .await
            .unwrap()
    });
    (rt, clock, redis)
}

#[test]
fn memory_store_and_lua_script_agree() {
    let server = RedisServer::start();
    let (rt, clock, redis) = runtime_and_store(&server);
    let case = AtomicU64::new(0);
    let compared = std::cell::Cell::new(0u64);
    let stored_quota = std::cell::Cell::new(0u64);
    let rated = std::cell::Cell::new(0u64);
    let claimed = std::cell::Cell::new(0u64);
    let held_back = std::cell::Cell::new(0u64);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(160));
    runner
        .run(
            &quota().prop_flat_map(|q| (Just(q), steps(q))),
            |(q, steps)| {
                // A fresh memory store and a fresh key per case: both start with a full bucket.
                let memory = MemoryStore::with_clock(clock.clone());
                let name = format!("diff-{}", case.fetch_add(1, Ordering::Relaxed));
                rt.block_on(async {
                    for step in &steps {
                        let (m, r) = match *step {
                            Step::Advance { us } => {
                                clock.advance(Duration::from_micros(us));
                                continue;
                            }
                            Step::Lease(ref req) if req.node.is_some() => {
                                // The pending claim before and after: a new one was made.
                                // It is the bookkeeping field's tail (units, when it lapses,
                                // the claimant's id), there if an id is.
                                let field = format!("{}:leasers", redis.key(&name));
                                let claim = || -> Option<Vec<u8>> {
                                    let raw: Option<Vec<u8>> = server.cmd(&["HGET", &field, ""]);
                                    // (Formats 3 and 4 have anonymous demand between:
                                    // skipped.)
                                    let head = |b: &Vec<u8>| match b[0] {
                                        3 => 57,
                                        4 => 73,
                                        _ => 33,
                                    };
                                    raw.filter(|b| b.len() > head(b)).map(|b| {
                                        let mut claim = b[17..33].to_vec();
                                        claim.extend_from_slice(&b[head(&b)..]);
                                        claim
                                    })
                                };
                                let before = claim();
                                let replies = (
                                    memory.lease(&name, &q, req).await,
                                    redis.lease(&name, &q, req).await,
                                );
                                let after = claim();
                                if after.is_some() && after != before {
                                    claimed.set(claimed.get() + 1);
                                }
                                replies
                            }
                            Step::Lease(ref req) => (
                                memory.lease(&name, &q, req).await,
                                redis.lease(&name, &q, req).await,
                            ),
                            Step::Run(ref req, n) => {
                                for _ in 0..n {
                                    let (m, r) = (
                                        memory.lease(&name, &q, req).await,
                                        redis.lease(&name, &q, req).await,
                                    );
                                    prop_assert!(
                                        same(&m, &r),
                                        "{step:?} on {q:?}: memory {m:?} vs redis {r:?}"
                                    );
                                    compared.set(compared.get() + 1);
                                    // Refused with whole tokens in the bucket: an anonymous
                                    // take beside leasers, kept from the reserve.
                                    if matches!(&m, Ok(r) if r.granted == 0
                                        && r.remaining >= req.min && req.min <= r.quota.burst())
                                    {
                                        held_back.set(held_back.get() + 1);
                                    }
                                }
                                continue;
                            }
                            Step::Release(ref req) => (
                                memory.release(&name, &q, req).await,
                                redis.release(&name, &q, req).await,
                            ),
                            Step::Init(ref c) => {
                                let (m, r) = (
                                    memory.init_config(&name, c).await,
                                    redis.init_config(&name, c).await,
                                );
                                prop_assert!(same(&m, &r), "{step:?}: {m:?} vs {r:?}");
                                continue;
                            }
                            Step::Modify(ref c) => {
                                let (m, r) = (
                                    memory.modify_config(&name, c).await,
                                    redis.modify_config(&name, c).await,
                                );
                                prop_assert!(same(&m, &r), "{step:?}: {m:?} vs {r:?}");
                                continue;
                            }
                            Step::Delete => {
                                let (m, r) = (
                                    memory.delete_config(&name).await,
                                    redis.delete_config(&name).await,
                                );
                                prop_assert!(same(&m, &r), "{step:?}: {m:?} vs {r:?}");
                                let (m, r) = (
                                    memory.get_config(&name).await,
                                    redis.get_config(&name).await,
                                );
                                prop_assert!(same(&m, &r) && m.unwrap().is_none());
                                continue;
                            }
                        };
                        if matches!(&m, Ok(reply) if reply.source == QuotaSource::Stored) {
                            stored_quota.set(stored_quota.get() + 1);
                        }
                        if matches!(&m, Ok(reply) if reply.rate_mtps > 0) {
                            rated.set(rated.get() + 1);
                        }
                        prop_assert!(
                            same(&m, &r),
                            "{step:?} on {q:?}: memory {m:?} vs redis {r:?}"
                        );
                        compared.set(compared.get() + 1);
                    }
                    Ok(())
                })
            },
        )
        .unwrap();
    let compared = compared.get();
    assert!(compared > 500, "only {compared} replies compared");
    let stored = stored_quota.get();
    assert!(
        stored > 100,
        "only {stored} replies ran under a stored quota"
    );
    // Rate leases granted (and so refills at a reduced rate, expiries that end them) too.
    let rated = rated.get();
    assert!(rated > 50, "only {rated} replies granted a rate");
    // Claims made (and so others held back by them, and claims collected or lapsed).
    let claimed = claimed.get();
    assert!(claimed > 20, "only {claimed} claims made");
    // Anonymous takes beside leasers kept from the reserve (and so credit for them).
    let held_back = held_back.get();
    assert!(
        held_back > 20,
        "only {held_back} anonymous takes kept from the reserve"
    );
}

/// A node's lease or release sent in the script's text protocol (every argument a decimal
/// string, every key, as another language's client sends it); the reply as its integers.
fn text_call(
    con: &mut redis::Connection,
    store: &RedisStore,
    name: &str,
    quota: &Quota,
    now_us: u64,
    step: &Step,
) -> Result<Vec<u64>, String> {
    let bucket = store.key(name);
    let keys = [
        bucket.clone(),
        format!("{bucket}:leasers"),
        format!("{bucket}:expiry"),
        store.config_key(name),
    ];
    let mut args = vec![
        String::new(),
        quota.rate().to_string(),
        quota.period_us().to_string(),
        quota.burst().to_string(),
    ];
    let unconfigured = |fallback: bool| if fallback { "" } else { "none" }.to_string();
    match step {
        Step::Lease(req) => {
            let n = req.node.expect("a node's lease");
            args[0] = "lease".into();
            args.extend([
                req.want.to_string(),
                req.min.to_string(),
                now_us.to_string(),
                format!("{:016x}", n.id),
                n.held.to_string(),
                n.demand_mtps.to_string(),
                n.horizon.as_micros().to_string(),
                n.ttl.as_micros().to_string(),
                unconfigured(req.fallback_to_caller),
                match n.rate_mtps {
                    0 => String::new(),
                    r => r.to_string(),
                },
            ]);
            // ARGV[15], optional: left out where it is 0, as an older client leaves it out.
            if n.release_seq > 0 {
                args.push(n.release_seq.to_string());
            }
        }
        Step::Release(req) => {
            let n = req.node.expect("a node's release");
            args[0] = "release".into();
            args.extend([
                req.tokens.to_string(),
                "0".into(),
                now_us.to_string(),
                format!("{:016x}", n.id),
                n.seq.to_string(),
                u8::from(n.leaving).to_string(),
            ]);
        }
        _ => unreachable!("only a node's calls"),
    }
    redis::cmd("EVAL")
        .arg(TOKEN_BUCKET_LUA)
        .arg(4)
        .arg(&keys)
        .arg(&args)
        .query(con)
        .map_err(|e| e.to_string())
}

/// A reply as the integers of the script's 4-key reply (see `text_call`).
fn integers(reply: &LeaseReply, node_lease: bool) -> Vec<u64> {
    let mut out = vec![
        reply.granted,
        reply.remaining,
        reply.retry_after.as_micros() as u64,
        reply.reset_after.as_micros() as u64,
        reply.share_mtps,
        reply.quota.rate(),
        reply.quota.period_us(),
        reply.quota.burst(),
        reply.source.code(),
    ];
    if node_lease {
        out.extend([reply.rate_mtps, reply.leasers]);
    }
    out
}

/// Everything stored for a bucket: the bucket, its leasers' records and their expiries.
fn stored(con: &mut redis::Connection, store: &RedisStore, name: &str) -> Vec<redis::Value> {
    let bucket = store.key(name);
    let mut pipe = redis::pipe();
    pipe.atomic()
        .cmd("GET")
        .arg(&bucket)
        .cmd("HGETALL")
        .arg(format!("{bucket}:leasers"))
        .cmd("ZRANGE")
        .arg(format!("{bucket}:expiry"))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES");
    pipe.query(con).unwrap()
}

#[test]
fn packed_and_text_node_calls_run_the_same_step() {
    // A node's calls go packed (`RedisStore`); the same calls in the text protocol on a second
    // name must get the same replies and leave the same state, config operations and
    // anonymous calls (one path for both) in between.
    let server = RedisServer::start();
    let (rt, clock, redis) = runtime_and_store(&server);
    let con = std::cell::RefCell::new(server.connection());
    let case = AtomicU64::new(0);
    let (compared, granted) = (std::cell::Cell::new(0u64), std::cell::Cell::new(0u64));
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(100));
    runner
        .run(
            &quota().prop_flat_map(|q| (Just(q), steps(q))),
            |(quota, steps)| {
                let i = case.fetch_add(1, Ordering::Relaxed);
                let (packed, text) = (format!("pk-{i}"), format!("tx-{i}"));
                for step in &steps {
                    let both = |name: &str| {
                        rt.block_on(async {
                            match step {
                                Step::Lease(req) => redis.lease(name, &quota, req).await.map(drop),
                                Step::Run(req, n) => {
                                    let mut all = Ok(());
                                    for _ in 0..*n {
                                        all =
                                            all.and(redis.lease(name, &quota, req).await.map(drop));
                                    }
                                    all
                                }
                                Step::Release(req) => {
                                    redis.release(name, &quota, req).await.map(drop)
                                }
                                Step::Init(c) => redis.init_config(name, c).await.map(drop),
                                Step::Modify(c) => redis.modify_config(name, c).await.map(drop),
                                Step::Delete => redis.delete_config(name).await.map(drop),
                                Step::Advance { .. } => Ok(()),
                            }
                            .map_err(|e| e.to_string())
                        })
                    };
                    let node_lease = matches!(step, Step::Lease(r) if r.node.is_some());
                    let node_call =
                        node_lease || matches!(step, Step::Release(r) if r.node.is_some());
                    if let Step::Advance { us } = step {
                        clock.advance(Duration::from_micros(*us));
                    } else if node_call {
                        let reply = rt.block_on(async {
                            match step {
                                Step::Lease(req) => redis.lease(&packed, &quota, req).await,
                                Step::Release(req) => redis.release(&packed, &quota, req).await,
                                _ => unreachable!(),
                            }
                        });
                        let now = clock.now().as_micros() as u64;
                        let by_text =
                            text_call(&mut con.borrow_mut(), &redis, &text, &quota, now, step);
                        match (&reply, &by_text) {
                            (Ok(r), Ok(t)) => {
                                prop_assert_eq!(&integers(r, node_lease), t, "{:?}", step);
                                granted.set(granted.get() + r.granted);
                            }
                            // Refused alike (the text says which argument).
                            (Err(StoreError::Rejected(a)), Err(b)) => {
                                prop_assert!(b.contains(a.as_str()), "{} / {}", a, b);
                            }
                            _ => prop_assert!(false, "{:?}: {:?} / {:?}", step, reply, by_text),
                        }
                        compared.set(compared.get() + 1);
                    } else {
                        prop_assert_eq!(both(&packed), both(&text), "{:?}", step);
                    }
                    prop_assert_eq!(
                        stored(&mut con.borrow_mut(), &redis, &packed),
                        stored(&mut con.borrow_mut(), &redis, &text),
                        "after {:?}",
                        step
                    );
                }
                Ok(())
            },
        )
        .unwrap();
    // Node calls compared, and tokens granted by them.
    assert!(compared.get() > 500, "{} node calls", compared.get());
    assert!(granted.get() > 1_000, "{} tokens granted", granted.get());
}

/// A store on `server` whose calls pass an explicit time: a fake clock at 1 000 s.
async fn store_at_1000_s(server: &RedisServer) -> (RedisStore, FakeClock) {
    let clock = FakeClock::starting_at(Duration::from_secs(1_000));
    let store = RedisStore::builder(server.url())
        .response_timeout(Duration::from_secs(5))
        .explicit_clock(clock.clone())
        .connect()
        .await
        .unwrap();
    (store, clock)
}

/// A node's lease of up to `want` tokens (at least 1) with a demand of 100/s, a 100 ms horizon
/// and a lease valid for `ttl`.
fn node_lease(id: u64, want: u64, ttl: Duration) -> LeaseRequest {
    LeaseRequest::new(want, 1).by(NodeLease {
        id,
        held: 0,
        demand_mtps: 100_000,
        horizon: Duration::from_millis(100),
        ttl,
        rate_mtps: 0,
        release_seq: 0,
    })
}

#[tokio::test]
async fn script_state_is_exact_and_expires_after_time_to_full() {
    let server = RedisServer::start();
    let (store, clock) = store_at_1000_s(&server).await;
    // 3 tokens per 10 ms: scale = 10_000 / gcd(3, 10_000) = 10_000 units per token.
    let q = Quota::with_parts(3, Duration::from_millis(10), 3).unwrap();
    let sent = std::time::Instant::now();
    let r = store
        .lease("exact", &q, &LeaseRequest::new(3, 1))
        .await
        .unwrap();
    assert_eq!(r.granted, 3);
    let key = store.key("exact");
    let (v, s, t): (u64, u64, u64) = {
        let b = BucketState::read(&server, &key).expect("a packed bucket");
        (b.v as u64, b.s as u64, b.t as u64)
    };
    assert_eq!((v, s, t), (0, 10_000, 1_000_000_000));
    let ttl_ms: i64 = server.cmd(&["PTTL", &key]);
    // The TTL was set to exactly 10 010 ms and has run down since (in real time).
    let since = sent.elapsed().as_millis() as i64;
    assert!(
        (10_010 - since - 1..=10_010).contains(&ttl_ms),
        "TTL is time-to-full (10 ms) + 10 s slack, got {ttl_ms} after {since} ms"
    );
    // Ten 1 ms steps refill exactly 3 tokens, and the full bucket is deleted.
    for _ in 0..10 {
        clock.advance(Duration::from_millis(1));
        store
            .release("exact", &q, &ReleaseRequest::new(0))
            .await
            .unwrap();
    }
    let exists: i64 = server.cmd(&["EXISTS", &key]);
    assert_eq!(exists, 0, "a full bucket is not stored");
}

#[tokio::test]
async fn noscript_after_script_flush_is_recovered() {
    let server = RedisServer::start();
    let store = server.store().await;
    let q = Quota::per_second(100).unwrap();
    store
        .lease("flush", &q, &LeaseRequest::exact(1))
        .await
        .unwrap();
    let sha = redis::Script::new(TOKEN_BUCKET_LUA).get_hash().to_owned();
    let loaded: Vec<i64> = server.cmd(&["SCRIPT", "EXISTS", &sha]);
    assert_eq!(loaded, vec![1]);
    let _: () = server.cmd(&["SCRIPT", "FLUSH"]);
    let loaded: Vec<i64> = server.cmd(&["SCRIPT", "EXISTS", &sha]);
    assert_eq!(loaded, vec![0], "flush really emptied the script cache");
    let r = store
        .lease("flush", &q, &LeaseRequest::exact(1))
        .await
        .unwrap();
    assert_eq!(r.granted, 1);
    let loaded: Vec<i64> = server.cmd(&["SCRIPT", "EXISTS", &sha]);
    assert_eq!(loaded, vec![1], "the store reloaded the script");
}

#[tokio::test]
async fn keys_carry_one_hash_tag_and_braces_cannot_escape_it() {
    let server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .response_timeout(Duration::from_secs(5))
        .prefix("app:")
        .connect()
        .await
        .unwrap();
    let q = Quota::per_second(10).unwrap();
    store
        .lease("user}{x", &q, &LeaseRequest::exact(1))
        .await
        .unwrap();
    let keys: Vec<String> = server.cmd(&["KEYS", "*"]);
    assert_eq!(keys, vec!["app:{user%7D%7Bx}".to_string()]);
    let err = RedisStore::builder(server.url())
        .response_timeout(Duration::from_secs(5))
        .prefix("bad{prefix")
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, ratelease::BuildError::Config(_)), "{err:?}");
}

/// The bucket must never outlive its leasers' keys — a bucket whose leaser records had expired
/// away would count their tokens as outstanding for good — and every key must expire, also
/// when an emptied hash or set is recreated.
#[tokio::test]
async fn the_bucket_never_outlives_its_leasers_keys() {
    let server = RedisServer::start();
    let (store, clock) = store_at_1000_s(&server).await;
    let q = Quota::per_second(100).unwrap();
    let node = NodeLease {
        id: 7,
        held: 0,
        demand_mtps: 50_000,
        horizon: Duration::from_millis(100),
        ttl: Duration::from_secs(10),
        rate_mtps: 0,
        release_seq: 0,
    };
    let lease = LeaseRequest::new(10, 1).by(node);
    assert!(store.lease("ttl", &q, &lease).await.unwrap().granted > 0);
    clock.advance(Duration::from_secs(4));
    assert!(store.lease("ttl", &q, &lease).await.unwrap().granted > 0);
    let key = store.key("ttl");
    let pttl = |k: String| -> i64 { server.cmd(&["PTTL", &k]) };
    // Absolute expiry times, ms: comparable exactly.
    let at = |k: String| -> i64 { server.cmd(&["PEXPIRETIME", &k]) };
    let (bucket_at, leasers_at, expiry_at) = (
        at(key.clone()),
        at(format!("{key}:leasers")),
        at(format!("{key}:expiry")),
    );
    assert!(leasers_at > 0 && expiry_at > 0, "{leasers_at} {expiry_at}");
    assert!(
        bucket_at <= leasers_at && bucket_at <= expiry_at,
        "bucket {bucket_at}, leasers {leasers_at}, expiry index {expiry_at}"
    );
    let bucket = pttl(key.clone());
    // It still lives past the point where every lease has expired and the bucket is full
    // (a 10 s lease, 0.1 s to refill 10 tokens), with room to spare.
    assert!(bucket > 10_100, "{bucket}");
    // A short lease on a slow bucket (1 token/s): when it has expired, the next lease removes
    // its record — the emptied keys are deleted — and writes a new one: the recreated keys
    // need an expiry again.
    let slow = Quota::per_second(1).unwrap().with_burst(10).unwrap();
    let short = LeaseRequest::new(10, 1).by(NodeLease {
        ttl: Duration::from_secs(1),
        ..node
    });
    assert_eq!(
        store.lease("slow", &slow, &short).await.unwrap().granted,
        10
    );
    clock.advance(Duration::from_secs(2));
    assert!(store.lease("slow", &slow, &short).await.unwrap().granted > 0);
    let key = store.key("slow");
    for k in [
        key.clone(),
        format!("{key}:leasers"),
        format!("{key}:expiry"),
    ] {
        let left = pttl(k.clone());
        assert!(left > 5_000, "{k}: {left}");
    }
}

/// On the server's clock the leasers' bookkeeping spares a busy bucket's calls the search for
/// expired leases and the count of leasers, and one PTTL the two PEXPIREs: a hundred leases by
/// three nodes set the leasers' keys' expiry as each node is added, search once, count once —
/// and after every call those keys still outlive the bucket.
#[tokio::test]
async fn a_busy_bucket_skips_the_leasers_upkeep_and_its_keys_still_outlive_it() {
    let server = RedisServer::start();
    let store = server.store().await;
    let q = Quota::per_second(1_000).unwrap();
    let key = store.key("busy");
    let at = |k: &str| -> i64 { server.cmd(&["PEXPIRETIME", k]) };
    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
    for i in 0..100u64 {
        let lease = node_lease(i % 3, 5, Duration::from_secs(60));
        store.lease("busy", &q, &lease).await.unwrap();
        let bucket_at = at(&key);
        for k in [format!("{key}:leasers"), format!("{key}:expiry")] {
            let keys_at = at(&k);
            assert!(
                bucket_at > 0 && keys_at >= bucket_at,
                "call {i}: {k} {keys_at} < {bucket_at}"
            );
        }
    }
    // Without the bookkeeping: 200 PEXPIREs, 100 ZCARDs and 100 searches. With it, the first
    // call (no bookkeeping yet, no bucket) searches the expiry set, reads back its latest
    // entry, sets both keys' expiry, counts the leasers and leaves the next call to search.
    // The 99 others read the expiry set's PTTL; the first leases of nodes 2 and 3 add them to
    // the count from ZADD's reply. (No lease expires within the test, and the keys' expiry is
    // renewed for time only some 9 s after it was set.)
    assert_eq!(
        ["pexpire", "pttl", "zcard", "zrange"].map(|c| server.command_calls(c)),
        [2, 99, 1, 3],
        "PEXPIRE, PTTL, ZCARD and ZRANGE calls in 100 leases"
    );
}

/// A claim written by a script of an earlier version (format 1: a byte, units and when it
/// lapses, then the claimant's id; no bookkeeping) is still honoured — another node's lease
/// sees the level less it — and the field is written anew in format 2, with the bookkeeping
/// and the same claim.
#[tokio::test]
async fn a_claim_of_an_earlier_version_is_honoured_and_rewritten_with_the_bookkeeping() {
    let server = RedisServer::start();
    let (store, _clock) = store_at_1000_s(&server).await;
    let q = Quota::per_second(100).unwrap();
    let node = |id: u64, want: u64| node_lease(id, want, Duration::from_secs(10));
    // The same two first leases of 10 on two names, then node 2's lease of up to 100: on
    // "old", with node 1's claim of 50 tokens (500 000 units of 1/10 000 token) pending.
    let mut granted = Vec::new();
    for name in ["plain", "old"] {
        store.lease(name, &q, &node(1, 10)).await.unwrap();
        store.lease(name, &q, &node(2, 10)).await.unwrap();
    }
    let field = format!("{}:leasers", store.key("old"));
    let mut claim = vec![1u8];
    claim.extend(500_000f64.to_le_bytes());
    claim.extend(2_000_000_000f64.to_le_bytes());
    claim.extend(b"0000000000000001");
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(&field)
        .arg("")
        .arg(&claim)
        .query(&mut con)
        .unwrap();
    for name in ["plain", "old"] {
        granted.push(store.lease(name, &q, &node(2, 100)).await.unwrap().granted);
    }
    // Exactly the claim's 50 tokens held back from node 2 (80 without it).
    assert_eq!(
        granted[0] - granted[1],
        50,
        "node 2 got {} beside the claim, {} without it",
        granted[1],
        granted[0]
    );
    let raw: Vec<u8> = redis::cmd("HGET")
        .arg(&field)
        .arg("")
        .query(&mut con)
        .unwrap();
    let double = |i: usize| f64::from_le_bytes(raw[i..i + 8].try_into().unwrap());
    assert_eq!(raw[0], 2, "{raw:?}");
    assert_eq!(double(1), 2.0, "two leasers counted");
    assert_eq!((double(17), double(25)), (500_000.0, 2_000_000_000.0));
    assert_eq!(&raw[33..], b"0000000000000001");
}

/// A leaser added by a script of an earlier version (a record and an expiry entry, the
/// bookkeeping untouched) is missing from the count until the next renewal of the leasers'
/// keys' expiry — at once when that version has also set their expiry to its bucket's, as it
/// does on every call — which counts them all again.
#[tokio::test]
async fn a_leaser_the_bookkeeping_missed_is_counted_at_the_next_renewal() {
    let server = RedisServer::start();
    let store = server.store().await;
    let q = Quota::per_second(1_000).unwrap();
    let lease = |id: u64| node_lease(id, 5, Duration::from_secs(60));
    for id in [1, 2] {
        store.lease("mixed", &q, &lease(id)).await.unwrap();
    }
    // What an earlier version's lease of node 0xff writes beside the bucket: a packed record
    // (format 1: outstanding, demand, credit, credit time, expiry, release seq) and its entry.
    let key = store.key("mixed");
    let expiry = 9_007_199_254_740_992f64; // 2^53: never expires within the test
    let mut record = vec![1u8];
    for x in [0.0, 0.0, 0.0, 0.0, expiry, 0.0] {
        record.extend(f64::to_le_bytes(x));
    }
    let id = format!("{:016x}", 0xff);
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(format!("{key}:leasers"))
        .arg(&id)
        .arg(&record)
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("ZADD")
        .arg(format!("{key}:expiry"))
        .arg(expiry)
        .arg(&id)
        .query(&mut con)
        .unwrap();
    // Nothing renewed yet (the keys outlive the bucket by the slack): the bookkeeping's count.
    let stale = store.lease("mixed", &q, &lease(1)).await.unwrap();
    assert_eq!(stale.leasers, 2, "{stale:?}");
    // The earlier version's expiry: the bucket's, on both keys. The next lease renews them,
    // and with them the count: 1, 2 and 0xff.
    let bucket_ms: i64 = server.cmd(&["PTTL", &key]);
    for k in [format!("{key}:leasers"), format!("{key}:expiry")] {
        let _: () = server.cmd(&["PEXPIRE", &k, &bucket_ms.to_string()]);
    }
    let fresh = store.lease("mixed", &q, &lease(2)).await.unwrap();
    assert_eq!(fresh.leasers, 3, "{fresh:?}");
}

/// Fifty leases that expired together (a fleet stopped) are dropped by the next lease in one
/// search: the earliest entry, every due one at once, then the next earliest — not a command
/// per batch of them.
#[tokio::test]
async fn leases_that_expired_together_are_dropped_in_one_search() {
    let server = RedisServer::start();
    let (store, clock) = store_at_1000_s(&server).await;
    let q = Quota::per_second(1_000).unwrap();
    let lease = |id: u64| node_lease(id, 5, Duration::from_secs(1));
    for id in 0..50 {
        store.lease("stopped", &q, &lease(id)).await.unwrap();
    }
    clock.advance(Duration::from_secs(2));
    let _: () = server.cmd(&["CONFIG", "RESETSTAT"]);
    let reply = store.lease("stopped", &q, &lease(99)).await.unwrap();
    assert_eq!(reply.leasers, 1, "{reply:?}");
    // The search: ZRANGE of the earliest, one ZRANGEBYSCORE of the 50 due, ZRANGE again; the
    // latest expiry is read back too, as leasers were dropped.
    assert_eq!(
        ["zrangebyscore", "zrange", "zrem"].map(|c| server.command_calls(c)),
        [1, 3, 50]
    );
    // Their tokens no longer hold the refill back: a full bucket less the new lease's 5.
    assert_eq!(reply.remaining, 995, "{reply:?}");
}

/// The script's side of the algorithm's unit test of the same name: a node that gives its
/// rate up is paced by its whole share, in Redis as in its twin.
#[tokio::test]
async fn a_node_that_gives_its_rate_up_waits_for_credit_at_its_whole_share() {
    let server = RedisServer::start();
    let (store, clock) = store_at_1000_s(&server).await;
    let memory = MemoryStore::with_clock(clock.clone());
    let q = Quota::per_second(1_000).unwrap();
    let lease = |id, want, held, demand_mtps, rate_mtps| {
        LeaseRequest::new(want, 1).by(NodeLease {
            id,
            held,
            demand_mtps,
            horizon: Duration::from_millis(100),
            ttl: Duration::from_secs(1),
            rate_mtps,
            release_seq: 0,
        })
    };
    // `a` (1) holds its share of 500/s as a rate; `b` (2) drains the bucket and spends it.
    let steps = [
        (0, lease(2, 1, 0, 1_000_000, 0)),
        (0, lease(1, 100, 0, 1_000_000, 500_000)),
        (0, lease(2, 1_000, 1, 1_000_000, 0)),
        (0, lease(2, 1, 0, 1_000_000, 0)),
        // 10 ms on, `a` has spent its tokens and asks for tokens alone, its share now
        // 500.25/s: the old rate left it a quarter of a token a second.
        (10, lease(1, 50, 0, 1_001_000, 0)),
    ];
    let mut last = None;
    for (ms, req) in &steps {
        clock.advance(Duration::from_millis(*ms));
        let (m, r) = (
            memory.lease("give-up", &q, req).await.unwrap(),
            store.lease("give-up", &q, req).await.unwrap(),
        );
        assert_eq!(m, r, "{req:?}");
        last = Some(r);
    }
    let a = last.unwrap();
    assert_eq!((a.granted, a.rate_mtps), (1, 0), "{a:?}");
    // Its credit accrues at 500.25/s from here: the next token 2 ms away, not 4 s.
    assert_eq!(a.retry_after, Duration::from_millis(2), "{a:?}");
}

/// Tokens a node holds stay counted when the burst shrinks below them (a central change, or
/// callers that disagree on the quota): the bucket stays empty until the node spends, returns
/// or loses them. The second call under the smaller burst used to cut what was counted down
/// to that burst (the node's record still held all of it), so the bucket refilled behind the
/// node's back: with its 90 unspent tokens and a refilled burst of 10, the fleet could admit
/// 100 where 10 were allowed.
#[tokio::test]
async fn tokens_held_above_a_smaller_burst_stay_counted() {
    let server = RedisServer::start();
    let (store, clock) = store_at_1000_s(&server).await;
    let memory = MemoryStore::with_clock(clock.clone());
    let wide = Quota::per_second(10).unwrap().with_burst(100).unwrap();
    let narrow = Quota::per_second(10).unwrap();
    let node = |want, held| {
        LeaseRequest::new(want, 1).by(NodeLease {
            id: 7,
            held,
            demand_mtps: 10_000,
            horizon: Duration::from_secs(1),
            ttl: Duration::from_secs(60),
            rate_mtps: 0,
            release_seq: 0,
        })
    };
    let anonymous = LeaseRequest::new(1, 1);
    let steps = [
        (0, &wide, node(100, 0)),
        (0, &narrow, anonymous),
        (0, &narrow, anonymous),
        // Ten seconds on, the node reports 90 unspent: 90 are still counted against a burst
        // of 10, so nothing is refilled and nothing granted, to it or anyone else.
        (10_000, &narrow, node(1, 90)),
        (0, &narrow, anonymous),
    ];
    for (i, (ms, q, req)) in steps.iter().enumerate() {
        clock.advance(Duration::from_millis(*ms));
        let (m, r) = (
            memory.lease("shrunk", q, req).await.unwrap(),
            store.lease("shrunk", q, req).await.unwrap(),
        );
        assert_eq!(m, r, "{req:?}");
        let expected = if i == 0 { 100 } else { 0 };
        assert_eq!(r.granted, expected, "step {i}: {r:?}");
    }
    let bucket = BucketState::read(&server, &store.key("shrunk")).expect("a bucket");
    assert_eq!(bucket.o as u64, 90, "{bucket:?}");
}

/// A release the store runs after the node's next lease is ignored when that lease said it
/// was sent (`release_seq`): its tokens left `held` before it was sent, and the lease counted
/// them as spent. Through the script, packed and in the text protocol, beside its twin: node
/// 7 leases the whole burst (10/s), trims 4 and sends their release (seq 1), which is delayed;
/// it leases again holding 6, then the release lands. Applied, it offered those 4 a second
/// time (8 in the bucket 400 ms later while the node held 6: 14 against a burst of 10), and
/// leaving, it dropped the node's new record.
#[test]
fn a_release_the_nodes_next_lease_accounted_for_is_ignored() {
    let server = RedisServer::start();
    let (rt, clock, redis) = runtime_and_store(&server);
    let mut con = server.connection();
    let memory = MemoryStore::with_clock(clock.clone());
    let q = Quota::per_second(10).unwrap();
    let lease = |want, held, release_seq| {
        LeaseRequest::new(want, 1).by(NodeLease {
            id: 7,
            held,
            demand_mtps: 1_000,
            horizon: Duration::from_millis(100),
            ttl: Duration::from_secs(1),
            rate_mtps: 0,
            release_seq,
        })
    };
    for leaving in [false, true] {
        let late = ReleaseRequest::new(4).by(NodeRelease {
            id: 7,
            seq: 1,
            leaving,
        });
        let steps = [
            Step::Lease(lease(10, 0, 0)),
            Step::Lease(lease(1, 6, 1)),
            Step::Release(late),
        ];
        let (packed, text) = (format!("late-pk-{leaving}"), format!("late-tx-{leaving}"));
        for (i, step) in steps.iter().enumerate() {
            let now = clock.now().as_micros() as u64;
            let (m, r) = rt.block_on(async {
                match step {
                    Step::Lease(req) => (
                        memory.lease(&packed, &q, req).await,
                        redis.lease(&packed, &q, req).await,
                    ),
                    Step::Release(req) => (
                        memory.release(&packed, &q, req).await,
                        redis.release(&packed, &q, req).await,
                    ),
                    _ => unreachable!(),
                }
            });
            let (m, r) = (m.unwrap(), r.unwrap());
            assert_eq!(m, r, "{step:?}");
            let node_lease = matches!(step, Step::Lease(_));
            let by_text = text_call(&mut con, &redis, &text, &q, now, step).unwrap();
            assert_eq!(integers(&r, node_lease), by_text, "{step:?}");
            if i == 0 {
                assert_eq!(r.granted, 10);
            }
        }
        clock.advance(Duration::from_millis(400));
        for name in [&packed, &text] {
            // The store offers at most the burst less the 6 the node holds.
            let peek = ReleaseRequest::new(0);
            let offered = rt
                .block_on(redis.release(name, &q, &peek))
                .unwrap()
                .remaining;
            assert!(offered <= 10 - 6, "{name}: {offered} offered, 6 held");
            assert_eq!(offered, 4, "{name}");
            let field = format!("{}:leasers", redis.key(name));
            let raw: Option<Vec<u8>> = server.cmd(&["HGET", &field, "0000000000000007"]);
            let record = raw.as_deref().and_then(decode_leaser_record);
            // Outstanding 6, release seq 1: the record survived, a leaving release too.
            assert_eq!(record.map(|r| (r[0], r[5])), Some((6.0, 1.0)), "{name}");
        }
        let peek = ReleaseRequest::new(0);
        assert_eq!(
            rt.block_on(memory.release(&packed, &q, &peek))
                .unwrap()
                .remaining,
            4
        );
    }
}

/// A packed call of any length but twelve numbers (96 bytes) is refused, and writes nothing.
#[test]
fn a_packed_call_of_another_length_is_refused() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let keys = [
        "{short}",
        "{short}:leasers",
        "{short}:expiry",
        "{short}:config",
    ];
    for n in [10, 11, 13] {
        let bytes: Vec<u8> = (0..n).flat_map(|_| 1.0f64.to_le_bytes()).collect();
        let e = redis::cmd("EVAL")
            .arg(TOKEN_BUCKET_LUA)
            .arg(4)
            .arg(&keys)
            .arg("node_lease")
            .arg(bytes)
            .arg("n1")
            .arg("")
            .query::<redis::Value>(&mut con)
            .unwrap_err();
        assert!(e.to_string().contains("packed"), "{n}: {e}");
    }
    let exists: u64 = redis::cmd("EXISTS").arg(&keys).query(&mut con).unwrap();
    assert_eq!(exists, 0);
}
