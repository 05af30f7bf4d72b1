//! The concurrency limiter: the fleet-wide bound under contention (pure and hybrid, on a real
//! redis-server), crashed holders, permits given back on drop, lost replies that must not leak
//! slots, store failures, and bad input.
//!
//! Tests that need no Redis run on tokio's paused clock over a [`MemoryStore`] reading it
//! ([`TokioClock`]); [`Faulty`] wraps that store with a delay, an outage switch, and replies
//! lost after the call was applied (what a timeout after a successful EVALSHA looks like).

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ratelease::concurrency::holders::{Op, Reply};
use ratelease::{
    AcquireError, BuildError, Clock, ConcurrencyLimiter, ConcurrencyStore, FailurePolicy,
    FakeClock, MemoryStore, RedisStore, StoreError, TokioClock,
};
use support::RedisServer;
use tokio::time::{sleep, Instant};

/// A [`MemoryStore`] on tokio's clock with a delay, an outage switch, and lost replies.
#[derive(Clone)]
struct Faulty {
    inner: MemoryStore,
    delay: Duration,
    failing: Arc<AtomicBool>,
    /// Every call is refused by the ACL (an error that is no outage).
    refusing: Arc<AtomicBool>,
    /// Syncs (renewals) fail, so a leak stays visible.
    fail_syncs: Arc<AtomicBool>,
    /// The next this many acquires are applied, but answered with a timeout.
    lose_acquire_replies: Arc<AtomicU64>,
}

impl Faulty {
    fn new(delay: Duration) -> Self {
        Faulty {
            inner: MemoryStore::with_clock(TokioClock::new()),
            delay,
            failing: Arc::default(),
            refusing: Arc::default(),
            fail_syncs: Arc::default(),
            lose_acquire_replies: Arc::default(),
        }
    }

    /// What the store counts for `limiter`'s holder, and in all.
    async fn held(&self, limiter: &ConcurrencyLimiter<Faulty>) -> (u64, u64) {
        let holder = format!("{:016x}", limiter.holder_id());
        let op = Op::Peek { holder: &holder };
        let r = self.inner.concurrency(limiter.name(), &op).await.unwrap();
        (r.held, r.in_use)
    }
}

impl ConcurrencyStore for Faulty {
    async fn concurrency(&self, name: &str, op: &Op<'_>) -> Result<Reply, StoreError> {
        sleep(self.delay / 2).await;
        let sync = matches!(op, Op::Sync { .. });
        if self.failing.load(Ordering::SeqCst) || (sync && self.fail_syncs.load(Ordering::SeqCst)) {
            return Err(StoreError::Timeout(self.delay));
        }
        if self.refusing.load(Ordering::SeqCst) {
            return Err(StoreError::NoPermission("NOPERM".into()));
        }
        let reply = self.inner.concurrency(name, op).await;
        sleep(self.delay / 2).await;
        let lose = matches!(op, Op::Acquire { .. })
            && self
                .lose_acquire_replies
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
        if lose {
            return Err(StoreError::Timeout(self.delay));
        }
        reply
    }
}

const RTT: Duration = Duration::from_micros(200);
const TTL: Duration = Duration::from_secs(1);

fn pure(store: &Faulty, limit: u64) -> ConcurrencyLimiter<Faulty> {
    ConcurrencyLimiter::builder("jobs", limit, store.clone())
        .ttl(TTL)
        .on_store_failure(FailurePolicy::FailClosed)
        .build()
        .unwrap()
}

fn hybrid(store: &Faulty, limit: u64, batch: u64) -> ConcurrencyLimiter<Faulty> {
    ConcurrencyLimiter::builder("jobs", limit, store.clone())
        .ttl(TTL)
        .hybrid(batch)
        .on_store_failure(FailurePolicy::FailClosed)
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn permits_come_back_when_dropped_in_both_modes() {
    let store = Faulty::new(RTT);
    for limiter in [pure(&store, 2), hybrid(&store, 2, 2)] {
        let a = limiter.acquire(1).await.unwrap();
        let b = limiter.acquire(1).await.unwrap();
        assert_eq!(limiter.in_use(), 2);
        assert!(
            limiter.acquire_now(1).await.unwrap().is_none(),
            "at the limit"
        );
        let waiter = tokio::spawn({
            let limiter = limiter.clone();
            async move {
                let start = Instant::now();
                let permit = limiter.acquire(2).await.unwrap();
                (permit.permits(), start.elapsed())
            }
        });
        sleep(Duration::from_millis(100)).await;
        assert!(!waiter.is_finished(), "waits while the slots are held");
        drop(a);
        b.release();
        let (got, waited) = waiter.await.unwrap();
        assert_eq!(got, 2);
        // Drops at 100 ms; a store call takes ~2 ms here (tokio's timer rounds the 100 µs
        // halves up to 1 ms), and pure mode needs two: the release, then the acquire.
        assert!(
            waited < Duration::from_millis(110),
            "{:?}: woken by the drops, got the slots after {waited:?}",
            limiter.mode()
        );
        limiter.shutdown().await;
        assert_eq!(store.held(&limiter).await, (0, 0), "shutdown unregisters");
    }
}

#[tokio::test(start_paused = true)]
async fn hybrid_hands_permits_out_locally_without_a_store_call_each() {
    let store = MemoryStore::with_clock(TokioClock::new());
    let limiter = ConcurrencyLimiter::builder("local", 10, store.clone())
        .hybrid(5)
        .build()
        .unwrap();
    let first = limiter.acquire(1).await.unwrap();
    let calls_before = store.calls();
    let mut held = Vec::new();
    for i in 0..10_000 {
        // Up to four held at once, released in turn: all served from the pool of five.
        if held.len() == 4 {
            drop(held.remove(i % 4));
        }
        let permit = limiter.try_acquire(1).unwrap().expect("from the pool");
        held.push(permit);
    }
    assert_eq!(limiter.in_use(), 5);
    assert_eq!(
        store.calls(),
        calls_before,
        "no store call for 10 000 permits"
    );
    drop((first, held));
    // Unused slots go back after the idle time; one call.
    sleep(Duration::from_millis(300)).await;
    let stats = limiter.stats();
    assert_eq!(
        (stats.pooled, stats.in_use, stats.releases),
        (0, 0, 1),
        "{stats:?}"
    );
}

/// Hybrid: a request for more than one batch gets its slots at once, in a store call or two.
/// The lease for it went back before the caller could take it (the pool is trimmed to one
/// batch), the caller was denied again and the slots leased again, a store call each way,
/// until a renewal let it in; and a lease asked for the whole request again, although the
/// pooled slots counted already: with a permit out of a batch of 8 on a limit of 10, a
/// caller of 8 waited forever.
#[tokio::test(start_paused = true)]
async fn hybrid_grants_a_request_larger_than_a_batch_at_once() {
    let store = Faulty::new(RTT);
    let limiter = hybrid(&store, 10, 2);
    let calls = store.inner.calls();
    let wide = limiter
        .try_acquire_for(5, Duration::from_millis(100))
        .await
        .unwrap();
    assert!(wide.is_some(), "{:?}", limiter.stats());
    assert!(
        store.inner.calls() - calls <= 3,
        "{} store calls",
        store.inner.calls() - calls
    );
    drop(wide);
    limiter.shutdown().await;

    let store = Faulty::new(RTT);
    let limiter = hybrid(&store, 10, 8);
    let _one = limiter.acquire(1).await.unwrap();
    let eight = limiter
        .try_acquire_for(8, Duration::from_secs(1))
        .await
        .unwrap();
    assert!(eight.is_some(), "{:?}", limiter.stats());
}

/// Pure: a caller parked while a renewal is counted (the gate closed) is answered when the
/// limiter is aborted meanwhile: the renewal never reopened the gate, and the caller — even one
/// with a 50 ms deadline — waited for good.
#[tokio::test(start_paused = true)]
async fn a_caller_parked_at_a_renewal_is_answered_when_the_limiter_is_aborted() {
    let store = Faulty::new(Duration::from_millis(100));
    let limiter = pure(&store, 2);
    let sent = tokio::time::Instant::now();
    let _held = limiter.acquire(1).await.unwrap();
    // The renewal of the held slot is sent a third of the ttl after the acquire was, and
    // takes 100 ms.
    tokio::time::sleep_until(sent + TTL / 3 + Duration::from_millis(10)).await;
    let waiter = tokio::spawn({
        let limiter = limiter.clone();
        async move { limiter.try_acquire_for(1, Duration::from_millis(50)).await }
    });
    tokio::task::yield_now().await;
    limiter.abort();
    let answered = tokio::time::timeout(Duration::from_secs(5), waiter).await;
    assert!(
        matches!(answered, Ok(Ok(Err(AcquireError::Closed)))),
        "{answered:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_crashed_holder_frees_its_slots_after_the_ttl_and_a_live_one_keeps_them() {
    for hybrid_mode in [false, true] {
        let store = Faulty::new(RTT);
        let (a, b) = match hybrid_mode {
            false => (pure(&store, 3), pure(&store, 3)),
            true => (hybrid(&store, 3, 3), hybrid(&store, 3, 3)),
        };
        let held: Vec<_> = futures_join(&a, 3).await;
        // Alive for five ttls: its renewals keep the slots.
        for _ in 0..50 {
            sleep(TTL / 10).await;
            assert!(b.acquire_now(1).await.unwrap().is_none());
        }
        a.abort();
        let crashed = Instant::now();
        drop(held); // a crashed process's permits are never given back
        let permit = b.acquire(3).await.unwrap();
        let waited = crashed.elapsed();
        // Slots return one ttl after the last renewal, sent within the last third of it.
        assert!(
            waited >= TTL * 2 / 3 && waited <= TTL + Duration::from_millis(60),
            "hybrid {hybrid_mode}: waited {waited:?}"
        );
        assert_eq!(permit.permits(), 3);
    }
}

/// Takes `n` single permits from `limiter`.
async fn futures_join(limiter: &ConcurrencyLimiter<Faulty>, n: u64) -> Vec<ratelease::Permit> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(limiter.acquire(1).await.unwrap());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn lost_replies_and_cancelled_calls_leak_nothing_after_the_next_sync() {
    // Pure: three acquires applied whose replies are lost, and one cancelled in flight. Syncs
    // fail meanwhile, so the leak is visible.
    // Whole milliseconds: tokio's timer rounds up to them.
    let store = Faulty::new(Duration::from_millis(4));
    let a = pure(&store, 5);
    let kept = a.acquire(1).await.unwrap();
    store.fail_syncs.store(true, Ordering::SeqCst);
    store.lose_acquire_replies.store(3, Ordering::SeqCst);
    for _ in 0..3 {
        let err = a.acquire_now(1).await.unwrap_err();
        assert!(
            matches!(err, AcquireError::Store(StoreError::Timeout(_))),
            "{err:?}"
        );
    }
    let cancelled = tokio::time::timeout(Duration::from_millis(3), a.acquire_now(1)).await;
    assert!(cancelled.is_err(), "cancelled mid-call: {cancelled:?}");
    sleep(Duration::from_millis(5)).await;
    let leaked = store.held(&a).await.0;
    assert!(
        (4..=5).contains(&leaked),
        "the store counts {leaked} slots; one is held"
    );
    // Once syncs go through again, the next one sets the count to what is really held.
    store.fail_syncs.store(false, Ordering::SeqCst);
    sleep(Duration::from_millis(600)).await;
    assert_eq!(store.held(&a).await, (1, 1));
    assert_eq!(a.in_use(), 1);
    drop(kept);

    // Hybrid: a lease applied whose reply is lost.
    let store = Faulty::new(Duration::from_millis(2));
    let h = hybrid(&store, 5, 4);
    store.fail_syncs.store(true, Ordering::SeqCst);
    store.lose_acquire_replies.store(1, Ordering::SeqCst);
    assert!(h.try_acquire(1).unwrap().is_none(), "asks for a lease");
    sleep(Duration::from_millis(100)).await;
    assert_eq!(store.held(&h).await.0, 4, "leased, but the reply was lost");
    assert_eq!(h.stats().pooled, 0);
    store.fail_syncs.store(false, Ordering::SeqCst);
    let permit = h.acquire(1).await.unwrap();
    sleep(Duration::from_millis(600)).await;
    let (held, in_use) = store.held(&h).await;
    assert_eq!(
        (held, in_use, h.stats().pooled),
        (4, 4, 3),
        "the lost lease was counted out and the next one in: no slot counted twice"
    );
    drop(permit);
}

#[tokio::test(start_paused = true)]
async fn store_failures_are_answered_by_the_failure_policy() {
    let store = Faulty::new(RTT);
    let build = |policy, hybrid: bool| {
        let b = ConcurrencyLimiter::builder("fail", 8, store.clone()).on_store_failure(policy);
        match hybrid {
            true => b.hybrid(2).build().unwrap(),
            false => b.build().unwrap(),
        }
    };
    store.failing.store(true, Ordering::SeqCst);
    for hybrid in [false, true] {
        let closed = build(FailurePolicy::FailClosed, hybrid);
        let err = closed.acquire(1).await.unwrap_err();
        assert!(matches!(err, AcquireError::Store(_)), "{err:?}");

        let open = build(FailurePolicy::FailOpen, hybrid);
        let mut admitted = Vec::new();
        for _ in 0..20 {
            if let Some(p) = open
                .try_acquire_for(1, Duration::from_millis(50))
                .await
                .unwrap()
            {
                assert!(p.is_degraded());
                admitted.push(p);
            }
        }
        assert_eq!(admitted.len(), 20, "fail open admits beyond the limit");

        // A fleet of four: each process may hold 8 / 4 = 2 while the store fails.
        let fallback = build(FailurePolicy::local_fallback(4), hybrid);
        let mut held = Vec::new();
        for _ in 0..5 {
            if let Some(p) = fallback
                .try_acquire_for(1, Duration::from_millis(50))
                .await
                .unwrap()
            {
                held.push(p);
            }
        }
        assert_eq!(held.len(), 2, "hybrid {hybrid}");
        assert!(fallback.stats().circuit_open);
        held.pop();
        assert!(fallback
            .try_acquire_for(1, Duration::from_millis(50))
            .await
            .unwrap()
            .is_some());
        assert_eq!(store.inner.calls(), 0, "nothing reached the store");
    }
    store.failing.store(false, Ordering::SeqCst);
    let recovered = build(FailurePolicy::FailClosed, true);
    let p = recovered.acquire(1).await.unwrap();
    assert!(!p.is_degraded() && !recovered.stats().circuit_open);
}

/// An error that is no outage (an ACL denial) is not answered by the failure policy, in
/// either mode: under `FailOpen` every acquire was admitted (degraded) on NOPERM. The call
/// ends with the error, and the circuit stays closed.
#[tokio::test(start_paused = true)]
async fn an_error_that_is_no_outage_is_not_answered_by_the_failure_policy() {
    let store = Faulty::new(RTT);
    store.refusing.store(true, Ordering::SeqCst);
    for hybrid in [false, true] {
        let b = ConcurrencyLimiter::builder("acl", 8, store.clone())
            .on_store_failure(FailurePolicy::FailOpen);
        let open = match hybrid {
            true => b.hybrid(2).build().unwrap(),
            false => b.build().unwrap(),
        };
        let result = tokio::time::timeout(Duration::from_secs(5), open.acquire(1)).await;
        assert!(
            matches!(
                result,
                Ok(Err(AcquireError::Store(StoreError::NoPermission(_))))
            ),
            "hybrid {hybrid}: {:?}",
            result.map(|r| r.map(|p| p.is_degraded()))
        );
        let stats = open.stats();
        assert!(!stats.circuit_open, "hybrid {hybrid}: {stats:?}");
        assert_eq!(stats.degraded, 0, "hybrid {hybrid}: {stats:?}");
    }
}

#[tokio::test]
async fn bad_input_gets_typed_errors() {
    let store = MemoryStore::new();
    let build = |limit: u64| ConcurrencyLimiter::builder("bad", limit, store.clone());
    for b in [
        build(0),
        build(1 << 53),
        build(4).ttl(Duration::ZERO),
        build(4).ttl(Duration::from_millis(2)),
        build(4).hybrid(0),
        build(4).hybrid(5),
        ConcurrencyLimiter::builder("", 4, store.clone()),
    ] {
        let err = b.build().unwrap_err();
        assert!(matches!(err, BuildError::Config(_)), "{err:?}");
    }
    for limiter in [
        build(4).build().unwrap(),
        build(4).hybrid(2).build().unwrap(),
    ] {
        assert!(matches!(
            limiter.acquire_now(0).await,
            Err(AcquireError::ZeroTokens)
        ));
        let err = limiter.acquire(5).await.unwrap_err();
        assert!(
            matches!(
                err,
                AcquireError::ExceedsLimit {
                    requested: 5,
                    limit: 4
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("can never succeed"));
        let err = limiter
            .try_acquire_for(u64::MAX, Duration::from_secs(1))
            .await;
        assert!(matches!(err, Err(AcquireError::ExceedsLimit { .. })));
        limiter.shutdown().await;
        assert!(matches!(
            limiter.acquire_now(1).await,
            Err(AcquireError::Closed)
        ));
    }
    let pure = build(4).build().unwrap();
    assert!(matches!(pure.try_acquire(1), Err(AcquireError::Config(_))));
    // Bad arguments reach the store as typed rejections, never panics.
    let op = Op::Acquire {
        holder: "h",
        want: 1,
        min: 2,
        limit: 4,
        ttl_us: 1,
        aseq: 0,
        rseq: 0,
    };
    let err = store.concurrency("bad", &op).await.unwrap_err();
    assert!(matches!(err, StoreError::Rejected(ref m) if m == "invalid argument min"));
}

#[test]
fn building_outside_a_runtime_is_an_error() {
    let err = ConcurrencyLimiter::builder("x", 1, MemoryStore::new())
        .build()
        .unwrap_err();
    assert!(matches!(err, BuildError::NoRuntime));
}

/// Several limiter instances (each with its own connection, as separate processes would have)
/// and many tasks: the slots held at once never exceed the limit, contention really happened
/// (the peak reached the limit and attempts were refused), and nothing stays registered after
/// shutdown.
async fn fleet_bound(server: &RedisServer, hybrid_batch: Option<u64>) -> (u64, u64, u64) {
    const LIMIT: u64 = 6;
    let name = format!("fleet-{hybrid_batch:?}");
    let mut limiters = Vec::new();
    for _ in 0..3 {
        let store = RedisStore::builder(server.url())
            .response_timeout(Duration::from_secs(2))
            .connect()
            .await
            .unwrap();
        let b = ConcurrencyLimiter::builder(name.clone(), LIMIT, store)
            .on_store_failure(FailurePolicy::FailClosed);
        let b = match hybrid_batch {
            Some(batch) => b.hybrid(batch).idle_return(Duration::from_millis(5)),
            None => b,
        };
        limiters.push(b.build().unwrap());
    }
    let holding = Arc::new(AtomicU64::new(0));
    let peak = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let served = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_millis(700);
    let mut tasks = Vec::new();
    for i in 0..30u64 {
        let limiter = limiters[(i % 3) as usize].clone();
        let (holding, peak, refused, served) = (
            holding.clone(),
            peak.clone(),
            refused.clone(),
            served.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let n = 1 + i % 2;
                let permit = match i % 3 {
                    0 => Some(limiter.acquire(n).await.unwrap()),
                    _ => limiter.acquire_now(n).await.unwrap(),
                };
                let Some(permit) = permit else {
                    refused.fetch_add(1, Ordering::SeqCst);
                    sleep(Duration::from_millis(1)).await;
                    continue;
                };
                // Counted while held: the store released nothing of it yet.
                let now = holding.fetch_add(n, Ordering::SeqCst) + n;
                peak.fetch_max(now, Ordering::SeqCst);
                served.fetch_add(1, Ordering::SeqCst);
                sleep(Duration::from_micros(500 + 300 * (i % 7))).await;
                holding.fetch_sub(n, Ordering::SeqCst);
                drop(permit);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    for l in &limiters {
        eprintln!("{:?}", l.stats());
        assert_eq!(l.stats().store_errors, 0, "{:?}", l.stats());
        l.shutdown().await;
    }
    let keys: u64 = server.cmd(&["DBSIZE"]);
    assert_eq!(keys, 0, "every holder unregistered at shutdown");
    let (peak, refused, served) = (
        peak.load(Ordering::SeqCst),
        refused.load(Ordering::SeqCst),
        served.load(Ordering::SeqCst),
    );
    eprintln!("{hybrid_batch:?}: peak {peak}, refused {refused}, served {served}");
    assert!(peak <= LIMIT, "{peak} slots held at once, limit {LIMIT}");
    assert_eq!(peak, LIMIT, "contention reached the limit");
    assert!(
        refused > 50 && served > 100,
        "refused {refused}, served {served}"
    );
    (peak, refused, served)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pure_fleet_never_holds_more_than_the_limit() {
    let server = RedisServer::start();
    fleet_bound(&server, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hybrid_fleet_never_holds_more_than_the_limit() {
    let server = RedisServer::start();
    fleet_bound(&server, Some(2)).await;
}

/// Script calls Redis has served (`INFO commandstats`).
fn evalsha_calls(server: &RedisServer) -> u64 {
    let info: String = server.cmd(&["INFO", "commandstats"]);
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hybrid_permits_cost_no_script_call_each_on_redis() {
    let server = RedisServer::start();
    let store = RedisStore::connect(server.url()).await.unwrap();
    let limiter = ConcurrencyLimiter::builder("hot", 8, store)
        .hybrid(8)
        .build()
        .unwrap();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let limiter = limiter.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..2_500 {
                let permit = limiter.acquire(1).await.unwrap();
                tokio::task::yield_now().await;
                drop(permit);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let calls = evalsha_calls(&server);
    eprintln!(
        "20 000 permits, {calls} script calls, {:?}",
        limiter.stats()
    );
    assert!(calls >= 1, "the lease went through Redis");
    assert!(calls <= 20, "{calls} script calls for 20 000 permits");
}

/// The store's time is a [`FakeClock`], so "after the ttl and not before" is exact: the holder
/// that crashed acquired at T0 and never renewed; its slots are taken at T0 + ttl − 1 µs and
/// free at T0 + ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_slots_come_back_exactly_one_ttl_later_on_redis() {
    let server = RedisServer::start();
    let clock = FakeClock::starting_at(Duration::from_secs(1_000));
    let store = || async {
        RedisStore::builder(server.url())
            .response_timeout(Duration::from_secs(2))
            .explicit_clock(clock.clone())
            .connect()
            .await
            .unwrap()
    };
    let ttl = Duration::from_secs(30);
    for (i, batch) in [None, Some(3)].into_iter().enumerate() {
        let name = format!("crash-{i}");
        let build = |store| {
            let b = ConcurrencyLimiter::builder(name.clone(), 3, store).ttl(ttl);
            match batch {
                Some(batch) => b.hybrid(batch).build().unwrap(),
                None => b.build().unwrap(),
            }
        };
        let (a, b) = (build(store().await), build(store().await));
        let held = a.acquire(3).await.unwrap();
        let t0 = clock.now();
        a.abort();
        drop(held);
        assert!(b.acquire_now(1).await.unwrap().is_none());
        clock.set(t0 + ttl - Duration::from_micros(1));
        assert!(
            b.acquire_now(1).await.unwrap().is_none(),
            "not before the ttl"
        );
        assert_eq!(b.available_permits().await.unwrap(), 0);
        clock.set(t0 + ttl);
        let permit = b.try_acquire_for(3, Duration::from_secs(1)).await.unwrap();
        assert_eq!(permit.map(|p| p.permits()), Some(3), "free after the ttl");
        clock.advance(Duration::from_secs(1));
    }
}

/// `FLUSHALL` loses every holder record: slots held then can be granted again, until each live
/// holder's next renewal registers what it still holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_state_is_registered_again_by_the_next_renewal() {
    let server = RedisServer::start();
    // Renewals every 500 ms: B's acquire right after the flush comes long before A's renewal.
    let ttl = Duration::from_millis(1_500);
    for (i, batch) in [None, Some(2)].into_iter().enumerate() {
        let name = format!("flushed-{i}");
        let build = |store| {
            let b = ConcurrencyLimiter::builder(name.clone(), 3, store).ttl(ttl);
            match batch {
                Some(batch) => b.hybrid(batch).build().unwrap(),
                None => b.build().unwrap(),
            }
        };
        let a = build(RedisStore::connect(server.url()).await.unwrap());
        let b = build(RedisStore::connect(server.url()).await.unwrap());
        let held = (a.acquire(1).await.unwrap(), a.acquire(1).await.unwrap());
        let _: () = server.cmd(&["FLUSHALL"]);
        // The store forgot: the whole limit is granted again (one extra limit at most).
        let mut again = Vec::new();
        for _ in 0..3 {
            let permit = b.try_acquire_for(1, Duration::from_secs(1)).await.unwrap();
            again.push(permit.expect("granted again after the flush"));
        }
        let holder = format!("{:016x}", a.holder_id());
        let peek = Op::Peek { holder: &holder };
        let store = RedisStore::connect(server.url()).await.unwrap();
        assert_eq!(store.concurrency(&name, &peek).await.unwrap().held, 0);
        // Within a renewal period, A's two slots are counted again.
        sleep(ttl / 3 + Duration::from_millis(100)).await;
        let reply = store.concurrency(&name, &peek).await.unwrap();
        assert_eq!(
            reply.held, 2,
            "batch {batch:?}: A's slots are counted again"
        );
        assert_eq!(reply.in_use, 5, "over the limit while B's permits live");
        // B keeps one permit. Pure: the two others are released. Hybrid: they go to B's pool,
        // which B's next renewal finds over-subscribed: it gives back what is above the limit
        // instead of handing it out.
        again.truncate(1);
        sleep(ttl / 3 + Duration::from_millis(100)).await;
        let in_use = store.concurrency(&name, &peek).await.unwrap().in_use;
        assert_eq!(in_use, 3, "batch {batch:?}: {:?}", b.stats());
        drop(again);
        drop(held);
        a.shutdown().await;
        b.shutdown().await;
    }
}

/// A hybrid holder that cannot renew stops handing out its pool at 90 % of the ttl (the store
/// may forget it at 100 %), and hands it out again once a renewal succeeds.
#[tokio::test(start_paused = true)]
async fn a_hybrid_pool_is_not_handed_out_once_renewals_fail_for_most_of_the_ttl() {
    let store = Faulty::new(RTT);
    let limiter = ConcurrencyLimiter::builder("stale", 4, store.clone())
        .ttl(TTL)
        .hybrid(4)
        .idle_return(TTL * 10) // kept while unused: this test is about renewals
        .on_store_failure(FailurePolicy::FailClosed)
        .build()
        .unwrap();
    drop(limiter.acquire(1).await.unwrap());
    let leased_at = Instant::now();
    store.failing.store(true, Ordering::SeqCst);
    // Until 90 % of the ttl after the lease, the pool serves (renewals fail meanwhile).
    while leased_at.elapsed() < TTL * 85 / 100 {
        assert!(limiter.try_acquire(1).unwrap().is_some());
        sleep(TTL / 20).await;
    }
    sleep(TTL / 10).await;
    let stats = limiter.stats();
    assert_eq!(stats.pooled, 4, "the slots are still there");
    assert!(stats.circuit_open && stats.store_errors > 0, "{stats:?}");
    assert!(
        limiter.try_acquire(1).unwrap().is_none(),
        "not handed out: the store may have forgotten them"
    );
    // The store answers again: the next renewal registers the slots, the pool serves again.
    store.failing.store(false, Ordering::SeqCst);
    let permit = limiter.try_acquire_for(1, TTL).await.unwrap();
    assert!(permit.is_some_and(|p| !p.is_degraded()));
    assert_eq!(store.held(&limiter).await.0, 4);
}
