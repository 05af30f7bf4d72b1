//! The fleet's admitted rate while Redis is down, for each failure policy with its default
//! settings (issue 14, item 5), against a real `redis-server` that the test kills.
//!
//! Four nodes share one limit of 400/s (burst 40); each asks for a token every 2 ms (500/s,
//! 2 000/s for the fleet: five times the limit) for 1.5 s, Redis is killed for 2 s, then
//! restarted. Every policy runs at once, on its own limiter name, so one outage measures all.
//! The figures printed here are RELIABILITY.md's "Outage defaults" table.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ratelease::{
    AcquireError, BuildError, FailurePolicy, HybridLimiter, KeyedRedisLimiter, Quota, RedisLimiter,
    RedisStore,
};
use support::RedisServer;
use tokio::time::{Instant, MissedTickBehavior};

const NODES: usize = 4;
const RATE: u64 = 400;
const TICK: Duration = Duration::from_millis(2);
const WARM: Duration = Duration::from_millis(1_500);
const OUTAGE: Duration = Duration::from_secs(2);

/// One policy's fleet: its nodes' try-acquire, and what they admitted while Redis was down.
struct Fleet {
    label: &'static str,
    admitted_in_outage: Arc<AtomicU64>,
    /// … of that, once every lease taken before the outage had expired locally.
    admitted_after_leases: Arc<AtomicU64>,
}

type Try = Arc<
    dyn Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>> + Send + Sync,
>;

/// A span of time `[from, to)` and the admissions counted in it.
type Window = (Arc<(Instant, Instant)>, Arc<AtomicU64>);

/// Runs one node: a request every tick until `end`, counting admissions in each window.
fn drive(attempt: Try, windows: Vec<Window>, end: Instant) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
        while Instant::now() < end {
            tick.tick().await;
            let admitted = attempt().await;
            let now = Instant::now();
            for (window, count) in &windows {
                if admitted && now >= window.0 && now < window.1 {
                    count.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_policys_fleet_rate_during_an_outage() {
    let mut server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .lazy_connect()
        .connect_timeout(Duration::from_millis(50))
        .connect()
        .await
        .unwrap();
    let quota = Quota::per_second(RATE).unwrap().with_burst(40).unwrap();
    let start = Instant::now();
    // Measured from a little after the kill (the nodes notice it within a call), to the
    // restart.
    let outage_from = start + WARM + Duration::from_millis(100);
    let outage_to = start + WARM + OUTAGE;
    let window = Arc::new((outage_from, outage_to));
    // Every lease taken before the kill has expired locally by then (at 90 % of its ttl, 1 s
    // here): what a fleet admits after it, its policy admits.
    let after_leases = Arc::new((start + WARM + Duration::from_secs(1), outage_to));
    let end = outage_to + Duration::from_millis(300);

    let hybrid: [(&str, Option<FailurePolicy>); 4] = [
        ("hybrid, default (last known share)", None),
        (
            "hybrid, local_fallback(1) (the old default)",
            Some(FailurePolicy::local_fallback(1)),
        ),
        ("hybrid, fail open", Some(FailurePolicy::FailOpen)),
        ("hybrid, fail closed", Some(FailurePolicy::FailClosed)),
    ];
    let pure: [(&str, Option<FailurePolicy>); 4] = [
        ("pure, default (the store's error)", None),
        ("pure, last_known_share(1)", Some(FailurePolicy::default())),
        ("pure, fail open", Some(FailurePolicy::FailOpen)),
        ("pure, fail closed", Some(FailurePolicy::FailClosed)),
    ];
    // The pure default's calls that returned an error while Redis was down.
    let errors = Arc::new(AtomicU64::new(0));
    let mut fleets = Vec::new();
    let mut keep = Vec::new();
    // Requests the hybrid fail-open fleet sent while Redis was down: ticks a busy runtime
    // skips send none, so what it admits is measured against these.
    let open_sent = Arc::new(AtomicU64::new(0));
    for (i, (label, policy)) in hybrid.into_iter().enumerate() {
        let count = Arc::new(AtomicU64::new(0));
        let late = Arc::new(AtomicU64::new(0));
        let sent = (policy == Some(FailurePolicy::FailOpen)).then(|| open_sent.clone());
        for _ in 0..NODES {
            let mut b = HybridLimiter::builder(format!("h{i}"), quota, store.clone());
            if let Some(p) = policy {
                b = b.on_store_failure(p);
            }
            let limiter = Arc::new(b.build().unwrap());
            keep.push(limiter.clone());
            let (sent, seen) = (sent.clone(), window.clone());
            let attempt: Try = Arc::new(move || {
                let now = Instant::now();
                if let Some(sent) = sent.as_ref().filter(|_| now >= seen.0 && now < seen.1) {
                    sent.fetch_add(1, Ordering::Relaxed);
                }
                let limiter = limiter.clone();
                Box::pin(async move { limiter.try_acquire(1).is_ok_and(|d| d.is_allowed()) })
            });
            let windows = vec![
                (window.clone(), count.clone()),
                (after_leases.clone(), late.clone()),
            ];
            drive(attempt, windows, end);
        }
        fleets.push(Fleet {
            label,
            admitted_in_outage: count,
            admitted_after_leases: late,
        });
    }
    for (i, (label, policy)) in pure.into_iter().enumerate() {
        let count = Arc::new(AtomicU64::new(0));
        for _ in 0..NODES {
            let mut b = RedisLimiter::builder(format!("p{i}"), quota, store.clone());
            if let Some(p) = policy {
                b = b.on_store_failure(p);
            }
            let limiter = Arc::new(b.build().unwrap());
            let (errors, seen) = (errors.clone(), window.clone());
            let attempt: Try = Arc::new(move || {
                let (limiter, errors, window) = (limiter.clone(), errors.clone(), seen.clone());
                Box::pin(async move {
                    let result = limiter.acquire_now(1).await;
                    let now = Instant::now();
                    if result.is_err() && now >= window.0 && now < window.1 {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                    result.is_ok_and(|d| d.is_allowed())
                })
            });
            drive(attempt, vec![(window.clone(), count.clone())], end);
        }
        fleets.push(Fleet {
            label,
            admitted_in_outage: count,
            admitted_after_leases: Arc::new(AtomicU64::new(0)),
        });
    }

    tokio::time::sleep_until(start + WARM).await;
    server.stop();
    tokio::time::sleep_until(outage_to).await;
    server.restart();
    tokio::time::sleep_until(end + Duration::from_millis(50)).await;

    let secs = (outage_to - outage_from).as_secs_f64();
    let demand = NODES as f64 / TICK.as_secs_f64();
    println!(
        "limit {RATE}/s, {NODES} nodes, demand {demand:.0}/s; admitted/s while Redis was down:"
    );
    let mut rates = std::collections::HashMap::new();
    for f in &fleets {
        let rate = f.admitted_in_outage.load(Ordering::Relaxed) as f64 / secs;
        println!(
            "  {:<46} {rate:>6.0}/s ({:.2}× the limit)",
            f.label,
            rate / RATE as f64
        );
        rates.insert(f.label, rate);
    }
    let failed = errors.load(Ordering::Relaxed) as f64 / secs;
    println!("  pure default: {failed:.0} calls/s returned the store's error");
    let limit = RATE as f64;
    let rate = |label: &str| rates[label];
    // Without a policy, pure calls return the error, and at once while the circuit is open:
    // only a probe waits for the store (a refused connect and its retry, about 15 ms). A
    // wait per call would allow each node about 60 calls/s, the fleet 250.
    assert_eq!(rate("pure, default (the store's error)"), 0.0);
    assert!(failed > 0.3 * demand, "pure default: {failed:.0} errors/s");
    // The default keeps the fleet near its limit: each node enforces the share it last had.
    let h = rate("hybrid, default (last known share)");
    assert!(
        (0.6 * limit..=1.4 * limit).contains(&h),
        "hybrid default: {h:.0}/s"
    );
    let p = rate("pure, last_known_share(1)");
    assert!(
        (0.6 * limit..=1.4 * limit).contains(&p),
        "pure, last known share: {p:.0}/s"
    );
    // A fallback of the whole quota per node lets the fleet spend it once per node.
    let old = rate("hybrid, local_fallback(1) (the old default)");
    assert!(old > 3.0 * limit, "local_fallback(1): {old:.0}/s");
    // Failing open, a hybrid fleet admits most of what it is asked (about 96 % here: a node
    // that has spent its lease is denied until its failed call opens the circuit). Counted
    // against the requests the driver sent, not the nominal demand: a busy machine skips
    // ticks (1 555/s admitted once, where 1 810–1 920/s of 2 000 is usual).
    let open = rate("hybrid, fail open");
    let sent = open_sent.load(Ordering::Relaxed) as f64 / secs;
    assert!(
        open > 0.8 * sent,
        "hybrid fail open: {open:.0}/s of {sent:.0}/s sent"
    );
    assert!(
        sent > 0.5 * demand,
        "the driver sent {sent:.0}/s of {demand:.0}/s"
    );
    // In pure mode the caller that probes waits for the store's answer (a failed connect);
    // here each node is one sequential caller, so its probes cost it some of its ticks.
    let open = rate("pure, fail open");
    assert!(open > 0.3 * demand, "pure fail open: {open:.0}/s");
    // Fail closed: nothing beyond what the store granted before the outage. A hybrid node
    // spends its lease until it expires locally — with this tight burst (0.1 s of the rate)
    // that is a rate lease, which drips until the node's renewal fails or the lease expires —
    // then admits nothing.
    assert_eq!(rate("pure, fail closed"), 0.0);
    let closed = fleets
        .iter()
        .find(|f| f.label == "hybrid, fail closed")
        .unwrap();
    let after = closed.admitted_after_leases.load(Ordering::Relaxed);
    assert_eq!(after, 0, "hybrid fail closed, after its leases expired");
    let granted = rate("hybrid, fail closed") * secs;
    assert!(
        granted <= limit * 0.9 + quota.burst() as f64,
        "hybrid, fail closed: {granted:.0} in the outage"
    );
    drop(keep);
}

/// A store on an address where nothing listens (its server is kept, not started): every
/// connect is refused (after one retry). Hold the server while the store is used.
async fn refused_store() -> (RedisServer, RedisStore) {
    let server = RedisServer::reserve(&[]);
    let store = server.lazy_store().await;
    (server, store)
}

#[tokio::test]
async fn a_keyed_pure_limiters_keys_share_one_circuit() {
    let (_server, store) = refused_store().await;
    let keyed = KeyedRedisLimiter::new("per-user", Quota::per_second(10).unwrap(), store).unwrap();
    let first = std::time::Instant::now();
    let err = keyed.acquire_now("alice", 1).await.unwrap_err();
    assert!(matches!(err, AcquireError::Store(_)), "{err:?}");
    let waited = first.elapsed();
    // Other keys get the same error at once: only a probe (one per back-off, 5 ms doubling)
    // waits for the store.
    let mut slow = 0;
    for i in 0..100 {
        let key = format!("user-{i}");
        let t = std::time::Instant::now();
        assert!(keyed.acquire_now(&key, 1).await.is_err());
        slow += usize::from(t.elapsed() > waited / 2);
    }
    assert!(
        slow <= 3,
        "{slow} of 100 calls waited like the first ({waited:?}): the keys share no circuit"
    );
}

/// A pure keyed limiter answers an outage by the policies that need no per-key state: failing
/// open it admits every key's call, failing closed it denies them (not the store's error);
/// the policies that enforce a local rate are refused at build, with the reason.
#[tokio::test]
async fn a_keyed_pure_limiter_fails_open_or_closed_as_told() {
    let (_server, store) = refused_store().await;
    let quota = Quota::per_second(2).unwrap();
    let open = KeyedRedisLimiter::new("keyed-open", quota, store.clone())
        .unwrap()
        .on_store_failure(FailurePolicy::FailOpen)
        .unwrap();
    let closed = KeyedRedisLimiter::new("keyed-closed", quota, store.clone())
        .unwrap()
        .on_store_failure(FailurePolicy::FailClosed)
        .unwrap();
    for i in 0..20 {
        // Ten calls per key: more than the quota's burst of 2, so only the policy admits them.
        let key = format!("user-{}", i % 2);
        let admitted = open.acquire_now(&key, 1).await.unwrap();
        assert!(admitted.is_allowed(), "fail open, call {i}: {admitted:?}");
        let denied = closed.acquire_now(&key, 1).await.unwrap();
        assert!(!denied.is_allowed(), "fail closed, call {i}: {denied:?}");
    }
    // A waiting call failing closed returns the store's error instead of waiting it out.
    let waited = closed.acquire("user-0", 1).await.unwrap_err();
    assert!(matches!(waited, AcquireError::Store(_)), "{waited:?}");
    let timed = closed
        .try_acquire_for("user-1", 1, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(timed, AcquireError::Store(_)), "{timed:?}");
    assert_eq!(open.failure_policy(), Some(FailurePolicy::FailOpen));
    for policy in [
        FailurePolicy::local_fallback(4),
        FailurePolicy::last_known_share(1),
    ] {
        let err = KeyedRedisLimiter::new("keyed-rate", quota, store.clone())
            .unwrap()
            .on_store_failure(policy)
            .unwrap_err();
        assert!(
            matches!(&err, BuildError::Config(m) if m.contains("no per-key state")),
            "{policy:?}: {err}"
        );
    }
}
