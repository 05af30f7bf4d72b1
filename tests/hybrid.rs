//! Behaviour of the hybrid limiter on virtual time: prefetch, single flight, refilling before
//! the bucket runs dry, the over-limit cache, waiting, giving tokens back, and store failures.
//!
//! The store is the real [`MemoryStore`] on tokio's paused clock; [`Wrapped`] adds a network
//! delay and an on/off failure switch around it and records how many calls overlap.

use std::sync::atomic::Ordering;
use std::time::Duration;

use ratelease::{
    AcquireError, AdaptiveLease, BuildError, CallContext, Decision, FailurePolicy, HybridLimiter,
    HybridStats, LeaseAsk, LeaseContext, LeasePolicy, LeaseRequest, LeaseStore, LeaseTerms,
    LocalAnswer, MemoryStore, Quota, ReleaseRequest, StoreError,
};

mod wrapped;
use wrapped::{Never, Wrapped};

async fn settle() {
    tokio::time::sleep(Duration::from_millis(5)).await;
}

#[tokio::test(start_paused = true)]
async fn prefetches_one_batch_and_refills_once_below_low_water() {
    let store = Wrapped::new(Duration::from_micros(100));
    let quota = Quota::per_second(1_000).unwrap();
    let limiter = HybridLimiter::builder("a", quota, store.clone())
        .lease_size(100)
        .build()
        .unwrap();
    settle().await;
    assert_eq!(limiter.available(), 100, "first batch prefetched");
    assert_eq!(limiter.stats().leases, 1);
    // Spend down to the low-water mark (50) without yielding: no refill may start yet...
    for _ in 0..50 {
        assert!(limiter.try_acquire(1).unwrap().is_allowed());
    }
    settle().await;
    assert_eq!(
        limiter.stats().leases,
        1,
        "no refill above the low-water mark"
    );
    // ...then a burst of callers crosses it: exactly one lease goes out.
    for _ in 0..40 {
        assert!(limiter.try_acquire(1).unwrap().is_allowed());
    }
    settle().await;
    let stats = limiter.stats();
    assert_eq!(
        stats.leases, 2,
        "single flight: one lease for forty callers"
    );
    assert_eq!(stats.local_tokens, 110);
    assert_eq!(store.max_in_flight.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn steady_demand_below_the_rate_is_never_denied() {
    // 1 request every 2 ms (500/s) against 1000/s, 1 ms round trips: the next batch must
    // always arrive before the bucket runs dry.
    let store = Wrapped::new(Duration::from_millis(1));
    let quota = Quota::per_second(1_000).unwrap();
    let limiter = HybridLimiter::builder("steady", quota, store.clone())
        .lease_size(20)
        .build()
        .unwrap();
    settle().await;
    let mut denied = 0;
    for _ in 0..2_000 {
        if !limiter.try_acquire(1).unwrap().is_allowed() {
            denied += 1;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(denied, 0);
    let stats = limiter.stats();
    assert!(stats.leases >= 100, "it did lease repeatedly: {stats:?}");
    assert_eq!(store.max_in_flight.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn over_limit_replies_are_cached_so_store_calls_stay_bounded() {
    let store = Wrapped::new(Duration::from_micros(100));
    // 100 tokens/s; demand 100 000/s for 2 s.
    let quota = Quota::per_second(100).unwrap().with_burst(10).unwrap();
    let limiter = HybridLimiter::builder("hot", quota, store.clone())
        .lease_size(5)
        .seed(7)
        .build()
        .unwrap();
    let (mut admitted, mut denied) = (0u64, 0u64);
    let mut retry_hints = Vec::new();
    let start = tokio::time::Instant::now();
    // tokio's timer ticks in whole milliseconds: 50 requests per tick for 2 000 ticks.
    for _ in 0..2_000 {
        for _ in 0..50 {
            match limiter.try_acquire(1).unwrap() {
                Decision::Allowed => admitted += 1,
                Decision::Denied { retry_after } => {
                    denied += 1;
                    retry_hints.push(retry_after);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = start.elapsed();
    assert!(elapsed < Duration::from_millis(2_100), "{elapsed:?}");
    let stats = limiter.stats();
    // Admitted ≤ burst + rate × 2.1 s = 220; leasing in batches of 5 takes ~42 successful
    // leases; each over-limit reply holds the node back until a whole batch is there (50 ms
    // here), so there is at most one failed call per successful one: ~84 calls in 2 s, where
    // an uncached limiter would call on each of 100 000 denials.
    assert!((150..=220).contains(&admitted), "admitted {admitted}");
    assert!(stats.leases <= 90, "store calls not bounded: {stats:?}");
    assert!(stats.over_limit > 0, "the bucket did run out: {stats:?}");
    assert!(denied > 90_000, "denied {denied}");
    assert!(
        retry_hints.iter().any(|d| *d >= Duration::from_millis(1)),
        "denials carry the store's retry_after"
    );
}

#[tokio::test(start_paused = true)]
async fn acquire_waits_for_tokens_and_try_acquire_for_gives_up_early() {
    let store = Wrapped::new(Duration::from_micros(100));
    let quota = Quota::per_second(10).unwrap().with_burst(2).unwrap();
    let limiter = HybridLimiter::builder("wait", quota, store)
        .lease_size(2)
        .build()
        .unwrap();
    let start = tokio::time::Instant::now();
    for _ in 0..6 {
        limiter.acquire(1).await.unwrap();
    }
    // 2 at once, then one every 100 ms: the sixth comes after ~400 ms, not before.
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(390) && waited < Duration::from_millis(700),
        "waited {waited:?}"
    );
    // The bucket is empty and the store said ~100 ms: a 1 ms budget fails at once.
    let before = tokio::time::Instant::now();
    let d = limiter
        .try_acquire_for(2, Duration::from_millis(1))
        .await
        .unwrap();
    assert!(matches!(d, Decision::Denied { .. }), "{d:?}");
    assert!(before.elapsed() <= Duration::from_millis(1));
    // A generous budget succeeds.
    let d = limiter
        .try_acquire_for(2, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(d, Decision::Allowed);
}

#[tokio::test(start_paused = true)]
async fn shutdown_gives_tokens_back_and_abort_does_not() {
    let store = Wrapped::new(Duration::from_micros(100));
    let quota = Quota::per_minute(100).unwrap();
    let a = HybridLimiter::builder("k", quota, store.clone())
        .lease_size(60)
        .build()
        .unwrap();
    settle().await;
    assert_eq!(a.available(), 60);
    a.shutdown().await;
    assert!(matches!(a.try_acquire(1), Err(AcquireError::Closed)));
    let stats = a.stats();
    assert_eq!((stats.releases, stats.tokens_released), (1, 60));
    // All 100 are back in the shared bucket (a minute's refill would take far longer).
    let b = HybridLimiter::builder("k", quota, store.clone())
        .lease_size(100)
        .build()
        .unwrap();
    settle().await;
    assert_eq!(b.available(), 100);
    b.abort();
    assert_eq!(b.stats().releases, 0, "a crash returns nothing");
    let c = HybridLimiter::builder("k", quota, store.clone())
        .lease_size(100)
        .prefetch(false)
        .build()
        .unwrap();
    let d = c
        .try_acquire_for(1, Duration::from_millis(50))
        .await
        .unwrap();
    assert!(
        !d.is_allowed(),
        "the crashed node's 100 tokens are gone: {d:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn dropping_the_last_clone_gives_tokens_back() {
    let store = Wrapped::new(Duration::from_micros(100));
    let quota = Quota::per_minute(100).unwrap();
    let a = HybridLimiter::builder("d", quota, store.clone())
        .lease_size(40)
        .build()
        .unwrap();
    settle().await;
    let clone = a.clone();
    drop(a);
    settle().await;
    assert_eq!(clone.available(), 40, "a clone keeps the limiter alive");
    drop(clone);
    settle().await;
    let reply = store
        .inner
        .lease("d", &quota, &LeaseRequest::exact(100))
        .await
        .unwrap();
    assert_eq!(reply.granted, 100, "the 40 tokens came back");
}

#[tokio::test(start_paused = true)]
async fn fail_closed_store_failures_reach_waiters_and_leasing_resumes() {
    let store = Wrapped::new(Duration::from_micros(100));
    store.failing.store(true, Ordering::SeqCst);
    let quota = Quota::per_second(100).unwrap();
    let limiter = HybridLimiter::builder("f", quota, store.clone())
        .lease_size(10)
        .on_store_failure(FailurePolicy::FailClosed)
        .build()
        .unwrap();
    let err = limiter.acquire(1).await.unwrap_err();
    assert!(
        matches!(err, AcquireError::Store(StoreError::Timeout(_))),
        "{err:?}"
    );
    // The store's error is in the line itself, not repeated as a source.
    assert!(err.to_string().contains("timed out"), "{err}");
    assert!(std::error::Error::source(&err).is_none(), "{err:?}");
    assert!(!limiter.try_acquire(1).unwrap().is_allowed());
    store.failing.store(false, Ordering::SeqCst);
    // Back-off is at most 1 s; the next attempt succeeds.
    limiter.acquire(1).await.unwrap();
    assert!(limiter.stats().store_errors >= 1);
}

#[tokio::test]
async fn bad_requests_are_typed_errors() {
    let quota = Quota::per_second(10).unwrap();
    let limiter = HybridLimiter::new("bad", quota, MemoryStore::new()).unwrap();
    assert!(matches!(
        limiter.try_acquire(0),
        Err(AcquireError::ZeroTokens)
    ));
    assert!(matches!(
        limiter.try_acquire(11),
        Err(AcquireError::ExceedsBurst {
            requested: 11,
            burst: 10
        })
    ));
    assert!(matches!(
        limiter.acquire(u64::MAX).await,
        Err(AcquireError::ExceedsBurst { .. })
    ));
    assert!(matches!(
        HybridLimiter::new("", quota, MemoryStore::new()),
        Err(BuildError::Config(_))
    ));
}

#[test]
fn building_outside_a_runtime_is_an_error() {
    let quota = Quota::per_second(10).unwrap();
    let err = HybridLimiter::new("x", quota, MemoryStore::new()).unwrap_err();
    assert!(matches!(err, BuildError::NoRuntime));
}

/// Two nodes with 3:1 demand, together 4× the rate: each gets about the same acceptance ratio
/// (as with one shared bucket), and the fleet uses nearly all of the rate.
#[tokio::test(start_paused = true)]
async fn adaptive_nodes_share_in_proportion_to_demand() {
    let store = Wrapped::new(Duration::from_micros(100));
    let quota = Quota::per_second(1_000).unwrap();
    let nodes: Vec<_> = (0..2)
        .map(|i| {
            HybridLimiter::builder("fair", quota, store.clone())
                .seed(i)
                .build()
                .unwrap()
        })
        .collect();
    let demand = [3u64, 1]; // requests per millisecond: 3 000/s and 1 000/s
    let mut asked = [0u64; 2];
    let mut got = [0u64; 2];
    for ms in 0..5_000 {
        for (i, node) in nodes.iter().enumerate() {
            for _ in 0..demand[i] {
                asked[i] += 1;
                got[i] += u64::from(node.try_acquire(1).unwrap().is_allowed());
            }
        }
        if ms % 1_000 == 999 {
            println!("{ms} ms: got {got:?}");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let ratio = [
        got[0] as f64 / asked[0] as f64,
        got[1] as f64 / asked[1] as f64,
    ];
    let total = got[0] + got[1];
    assert!(total <= 1_000 + 5_000 + 10, "bound: {total}");
    assert!(total >= 4_500, "utilization: {total} of ~6 000");
    assert!(
        (ratio[0] / ratio[1] - 1.0).abs() < 0.15,
        "acceptance ratios {ratio:?} should match"
    );
    for n in &nodes {
        let calls_per_s = n.stats().store_calls() as f64 / 5.0;
        assert!(
            calls_per_s <= 30.0,
            "{calls_per_s} store calls/s: {:?}",
            n.stats()
        );
    }
}

/// The leaser counts recorded after the first `skip`.
fn seen_after(seen: &parking_lot::Mutex<Vec<u64>>, skip: usize) -> Vec<u64> {
    seen.lock()[skip..].to_vec()
}

/// The default policy, recording the leaser counts its calls were made with.
struct Recording {
    seen: std::sync::Arc<parking_lot::Mutex<Vec<u64>>>,
}

impl LeasePolicy for Recording {
    fn ask(&self, ctx: &LeaseContext) -> LeaseAsk {
        AdaptiveLease::new().ask(ctx)
    }
    fn terms(&self, quota: &Quota) -> Option<LeaseTerms> {
        AdaptiveLease::new().terms(quota)
    }
    fn terms_at(&self, terms: LeaseTerms, call: &CallContext) -> LeaseTerms {
        self.seen.lock().push(call.leasers);
        AdaptiveLease::new().terms_at(terms, call)
    }
    fn most_worth_holding(&self, ctx: &LeaseContext) -> Option<u64> {
        AdaptiveLease::new().most_worth_holding(ctx)
    }
    fn per_request(&self, ctx: &LeaseContext, deciding: bool) -> bool {
        AdaptiveLease::new().per_request(ctx, deciding)
    }
}

#[tokio::test(start_paused = true)]
async fn a_node_hears_how_many_nodes_hold_leases() {
    let store = Wrapped::new(Duration::from_micros(100));
    let quota = Quota::per_second(1_000).unwrap();
    let seen = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    let watched = HybridLimiter::builder("count", quota, store.clone())
        .policy(Recording { seen: seen.clone() })
        .build()
        .unwrap();
    let others: Vec<_> = (1..3)
        .map(|i| {
            HybridLimiter::builder("count", quota, store.clone())
                .seed(i)
                .build()
                .unwrap()
        })
        .collect();
    let mut admitted = 0;
    for _ in 0..300 {
        for node in others.iter() {
            admitted += u64::from(node.try_acquire(1).unwrap().is_allowed());
        }
        admitted += u64::from(watched.try_acquire(1).unwrap().is_allowed());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(
        admitted > 600,
        "all three lease: {admitted} of 900 admitted"
    );
    // Its first call knows nothing yet; once all three lease, its calls are told three.
    let first = seen_after(&seen, 0);
    assert_eq!(first.first(), Some(&0), "{first:?}");
    assert_eq!(first.last(), Some(&3), "{first:?}");
    assert!(first.iter().all(|n| *n <= 3), "{first:?}");
    // The two others leave (their records go): the watched node's next leases hear one.
    for node in others {
        node.shutdown().await;
    }
    let mut alone = 0;
    for _ in 0..300 {
        alone += u64::from(watched.try_acquire(1).unwrap().is_allowed());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(alone > 200, "{alone} of 300 admitted");
    let after = seen_after(&seen, first.len());
    assert!(!after.is_empty(), "it leased again");
    assert_eq!(after.last(), Some(&1), "{after:?}");
}

#[tokio::test(start_paused = true)]
async fn an_idle_node_gives_its_tokens_back() {
    let store = Wrapped::new(Duration::from_micros(100));
    let quota = Quota::per_minute(6_000).unwrap(); // 100/s, slow refill
    let node = HybridLimiter::builder("idle", quota, store.clone())
        .build()
        .unwrap();
    for _ in 0..200 {
        let _ = node.try_acquire(1).unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let held = node.available();
    assert!(held > 0, "it holds a lease");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stats = node.stats();
    assert_eq!(node.available(), 0);
    assert_eq!(stats.tokens_released, held, "{stats:?}");
    assert_eq!(stats.tokens_expired, 0);
    // The store has them back: another node can lease them.
    let reply = store
        .inner
        .lease("idle", &quota, &LeaseRequest::new(6_000, 1))
        .await
        .unwrap();
    assert!(reply.granted >= 6_000 - 200, "{reply:?}");
}

/// A node's call to a store that, while `late` is on, answers a node's release with a timeout
/// and runs it only at [`LateReleases::land`], after whatever the node did meanwhile.
#[derive(Clone)]
struct LateReleases {
    inner: MemoryStore,
    late: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Releases not run yet, with their name and quota.
    held_back: std::sync::Arc<std::sync::Mutex<Vec<(String, Quota, ReleaseRequest)>>>,
    /// The node's calls as sent: a lease's `release_seq` (`true`), a release's `seq`.
    calls: std::sync::Arc<std::sync::Mutex<Vec<(bool, u64)>>>,
}

impl LateReleases {
    fn new() -> Self {
        LateReleases {
            inner: MemoryStore::with_clock(ratelease::TokioClock::new()),
            late: Default::default(),
            held_back: Default::default(),
            calls: Default::default(),
        }
    }

    /// Runs the releases held back.
    async fn land(&self) -> usize {
        let held_back = std::mem::take(&mut *self.held_back.lock().unwrap());
        for (name, quota, req) in &held_back {
            self.inner.release(name, quota, req).await.unwrap();
        }
        held_back.len()
    }
}

impl LeaseStore for LateReleases {
    async fn lease(
        &self,
        name: &str,
        quota: &Quota,
        req: &LeaseRequest,
    ) -> Result<ratelease::LeaseReply, StoreError> {
        if let Some(n) = req.node {
            self.calls.lock().unwrap().push((true, n.release_seq));
        }
        self.inner.lease(name, quota, req).await
    }

    async fn release(
        &self,
        name: &str,
        quota: &Quota,
        req: &ReleaseRequest,
    ) -> Result<ratelease::LeaseReply, StoreError> {
        if let Some(n) = req.node {
            self.calls.lock().unwrap().push((false, n.seq));
            if self.late.load(Ordering::SeqCst) {
                let held = (name.to_owned(), *quota, *req);
                self.held_back.lock().unwrap().push(held);
                return Err(StoreError::Timeout(Duration::from_millis(100)));
            }
        }
        self.inner.release(name, quota, req).await
    }
}

/// Every lease carries the seq of the last release the node sent, so a release the store runs
/// after it is ignored: an idle node's give-back (a leaving release) times out for the node
/// and runs after the node has leased again. Run, it dropped the node's new record, and the
/// tokens that lease granted were counted nowhere.
#[tokio::test(start_paused = true)]
async fn a_release_the_store_runs_after_the_nodes_next_lease_is_ignored() {
    let store = LateReleases::new();
    let quota = Quota::per_minute(6_000).unwrap();
    let node = HybridLimiter::builder("late", quota, store.clone())
        .build()
        .unwrap();
    let spend = || async {
        for _ in 0..200 {
            let _ = node.try_acquire(1).unwrap();
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    spend().await;
    assert!(node.available() > 0, "it holds a lease");
    // Idle: it gives its tokens back as it leaves; the store runs that release late.
    store.late.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(node.available(), 0);
    assert_eq!(store.held_back.lock().unwrap().len(), 1);
    store.late.store(false, Ordering::SeqCst);
    spend().await;
    assert!(node.available() > 0, "it leased again");
    assert_eq!(store.land().await, 1);
    // Its record is still on the store's books: another node's lease counts two leasers.
    let other = LeaseRequest::new(1, 1).by(ratelease::NodeLease {
        id: 999,
        held: 0,
        demand_mtps: 1_000,
        horizon: Duration::from_millis(100),
        ttl: Duration::from_secs(1),
        rate_mtps: 0,
        release_seq: 0,
    });
    let reply = store.inner.lease("late", &quota, &other).await.unwrap();
    assert_eq!(reply.leasers, 2, "{reply:?}");
    // Every lease said which release the node had sent last.
    let calls = store.calls.lock().unwrap().clone();
    let mut last = 0;
    for &(lease, seq) in &calls {
        if lease {
            assert_eq!(seq, last, "{calls:?}");
        } else {
            last = seq;
        }
    }
    assert!(last > 0 && calls.last().is_some_and(|c| c.0), "{calls:?}");
}

/// A node on `store` whose leases last a second (ttl 1 s) and are not given back for idleness.
fn lasting_a_second(name: &str, store: &Wrapped) -> HybridLimiter<Wrapped> {
    HybridLimiter::builder(name, Quota::per_minute(6_000).unwrap(), store.clone())
        .policy(
            AdaptiveLease::new()
                .horizon(Duration::from_millis(100)) // so the ttl is 1 s
                .idle_after(Duration::from_secs(60)),
        )
        .build()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn tokens_are_dropped_before_their_lease_expires() {
    // A store that answers the first lease and then fails: the node cannot renew, so it must
    // stop spending before the store forgets its lease (ttl 1 s).
    let store = Wrapped::new(Duration::from_micros(100));
    let node = lasting_a_second("expire", &store);
    for _ in 0..100 {
        let _ = node.try_acquire(1).unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    store.failing.store(true, Ordering::SeqCst);
    let held = node.available();
    assert!(held > 0);
    tokio::time::sleep(Duration::from_millis(850)).await;
    assert_eq!(node.available(), held, "still valid at 0.95 s of the lease");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(node.available(), 0, "dropped before the store's expiry");
    assert_eq!(node.stats().tokens_expired, held);
}

#[tokio::test(start_paused = true)]
async fn tokens_are_dropped_at_their_expiry_while_a_renewal_is_in_flight() {
    // The renewal leaves 50 ms before the lease's local expiry (90 % of its 1 s ttl) and
    // reaches the store 250 ms later, after the store forgot the lease: the old tokens must go
    // at the local expiry, in flight or not, and what the reply brings is all the node holds.
    let store = Wrapped::new(Duration::from_micros(100));
    let node = lasting_a_second("in-flight", &store);
    let mut leased_at = tokio::time::Instant::now();
    let mut leases = node.stats().leases;
    for _ in 0..100 {
        let _ = node.try_acquire(1).unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
        if node.stats().leases != leases {
            leases = node.stats().leases;
            leased_at = tokio::time::Instant::now();
        }
    }
    let held = node.available();
    assert!(held > 0, "it holds a lease");
    tokio::time::sleep_until(leased_at + Duration::from_millis(850)).await;
    assert_eq!(node.available(), held, "no renewal yet");
    let leased_before = node.stats().tokens_leased;
    store.stall_us.store(250_000, Ordering::SeqCst);
    assert!(!node.try_acquire(held + 1).unwrap().is_allowed());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(node.stats().leases, leases, "the renewal is in flight");
    assert_eq!(node.available(), 0, "dropped at the local expiry");
    assert_eq!(node.stats().tokens_expired, held);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let stats = node.stats();
    assert!(stats.leases > leases, "the renewal came back: {stats:?}");
    let granted = stats.tokens_leased - leased_before;
    assert!(
        node.available() <= granted,
        "it holds {} of a grant of {granted}: {stats:?}",
        node.available()
    );
}

/// Spends the leased tokens, then fails the store and counts what each policy admits in one
/// second of 10 requests per millisecond.
async fn admitted_while_failing(policy: FailurePolicy) -> (u64, HybridStats) {
    let store = Wrapped::new(Duration::from_micros(100));
    let quota = Quota::per_second(1_000).unwrap();
    let limiter = HybridLimiter::builder("outage", quota, store.clone())
        .lease_size(50)
        .on_store_failure(policy)
        .build()
        .unwrap();
    settle().await;
    store.failing.store(true, Ordering::SeqCst);
    let mut admitted = 0;
    for _ in 0..1_000 {
        for _ in 0..10 {
            admitted += u64::from(limiter.try_acquire(1).unwrap().is_allowed());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    (admitted, limiter.stats())
}

#[tokio::test(start_paused = true)]
async fn each_failure_policy_answers_as_documented() {
    // Leased tokens first (50), then the policy.
    let (closed, stats) = admitted_while_failing(FailurePolicy::FailClosed).await;
    assert!(stats.circuit_open, "{stats:?}");
    assert!(
        closed <= 50 + 50,
        "fail closed: the lease, and at most one more: {closed}"
    );
    assert_eq!(stats.tokens_admitted_degraded, 0);

    let (open, stats) = admitted_while_failing(FailurePolicy::FailOpen).await;
    assert!(open >= 9_900, "fail open admits everything: {open}");
    assert!(stats.tokens_admitted_degraded >= 9_800, "{stats:?}");

    // 1 000/s over 4 nodes: 250/s each, burst 250, for one second, plus the lease.
    let (local, stats) = admitted_while_failing(FailurePolicy::local_fallback(4)).await;
    assert!((450..=600).contains(&local), "local fallback: {local}");
    assert!(stats.circuit_open && stats.store_errors >= 2, "{stats:?}");
    // Probes back off up to 500 ms: about ten in a second, not one per request.
    assert!(stats.leases <= 15, "{stats:?}");
}

#[tokio::test(start_paused = true)]
async fn the_circuit_closes_when_the_store_answers_again() {
    let store = Wrapped::new(Duration::from_micros(100));
    let quota = Quota::per_second(1_000).unwrap();
    let limiter = HybridLimiter::builder("recover", quota, store.clone())
        .lease_size(20)
        .on_store_failure(FailurePolicy::FailClosed)
        .build()
        .unwrap();
    settle().await;
    store.failing.store(true, Ordering::SeqCst);
    for _ in 0..2_000 {
        let _ = limiter.try_acquire(1).unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(limiter.stats().circuit_open);
    store.failing.store(false, Ordering::SeqCst);
    let healed = tokio::time::Instant::now();
    while !limiter.try_acquire(1).unwrap().is_allowed() {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(
        healed.elapsed() <= Duration::from_millis(600),
        "{:?}",
        healed.elapsed()
    );
    assert!(!limiter.stats().circuit_open);
}

/// A node of a 100 000 000/s limit (on a store answering in 100 µs) holding its first, blind
/// lease, and how many tokens that is.
async fn blind_lease(name: &str) -> (Wrapped, Quota, HybridLimiter<Wrapped>, u64) {
    let store = Wrapped::new(Duration::from_micros(100));
    let quota = Quota::per_second(100_000_000).unwrap();
    let limiter = HybridLimiter::builder(name, quota, store.clone())
        .build()
        .unwrap();
    settle().await;
    let first = limiter.available();
    assert!(first > 20_000, "the first lease is a guess: {first}");
    (store, quota, limiter, first)
}

/// A node whose first lease was sized before its demand was known (a blind lease: a horizon
/// of a thousandth of the rate, here 100 000 000/s) holds far more than it uses: it gives the
/// excess back within a review, instead of keeping it from the fleet until the lease expires.
#[tokio::test(start_paused = true)]
async fn a_node_holding_far_more_than_its_demand_gives_the_excess_back() {
    let (store, quota, limiter, first) = blind_lease("trim").await;
    // 200 requests/s for 400 ms.
    for _ in 0..80 {
        assert!(limiter.try_acquire(1).unwrap().is_allowed());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stats = limiter.stats();
    assert!(stats.releases >= 1, "{stats:?}");
    assert!(
        stats.tokens_released > first / 2,
        "most of the guess went back: {stats:?}"
    );
    // What is kept: about two horizons' worth of 200/s (0.25 s × 1.25 each), not thousands.
    assert!(stats.local_tokens < 300, "{stats:?}");
    assert_eq!(stats.tokens_denied, 0, "{stats:?}");
    // The fleet's bucket has them again.
    let left = store
        .lease("trim", &quota, &LeaseRequest::new(100_000_000, 1))
        .await
        .unwrap();
    assert!(
        left.granted > 100_000_000 - 80 - stats.local_tokens - 100,
        "{left:?}"
    );
}

/// The same when the node's first requests come only after its first review (a quiet node of
/// a large fleet): with nothing measured the review looks again, and gives the excess back
/// once the requests show how little it needs.
#[tokio::test(start_paused = true)]
async fn a_quiet_node_gives_a_blind_lease_back_once_its_demand_shows() {
    let (_, _, limiter, first) = blind_lease("quiet").await;
    // Silent past the first review (a quarter horizon: 62.5 ms), then 10 requests/s.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(limiter.stats().releases, 0);
    for _ in 0..10 {
        assert!(limiter.try_acquire(1).unwrap().is_allowed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stats = limiter.stats();
    assert!(
        stats.tokens_released > first / 2,
        "most of the guess went back: {stats:?}"
    );
    assert!(stats.local_tokens < 100, "{stats:?}");
}

/// A policy that leases one big batch (spread over the local bucket's slots), then small ones.
struct BigThenSmall;

impl ratelease::LeasePolicy for BigThenSmall {
    fn ask(&self, ctx: &ratelease::LeaseContext) -> ratelease::LeaseAsk {
        let size = if ctx.demand == 0.0 && ctx.local == 0 {
            2_048
        } else {
            8
        };
        ratelease::LeaseAsk {
            want: size,
            min: size.min(8),
            low_water: 16,
        }
    }

    fn terms(&self, _quota: &Quota) -> Option<ratelease::LeaseTerms> {
        None
    }
}

/// Tokens parked in a slot of the local bucket by a big lease are not in the hint callers
/// compare with the low-water mark once small leases follow; a refill request while the
/// bucket still holds the mark must not become a lease (it would ask for nothing and, token
/// after token, make one store call each).
#[tokio::test(start_paused = true)]
async fn a_low_reading_hint_does_not_start_a_lease_per_token() {
    let store = Wrapped::new(Duration::from_micros(100));
    let quota = Quota::per_second(1_000_000).unwrap();
    let limiter = HybridLimiter::builder("parked", quota, store.clone())
        .policy(BigThenSmall)
        .build()
        .unwrap();
    settle().await;
    assert_eq!(limiter.available(), 2_048);
    let mut taken = 0u64;
    for _ in 0..5_000 {
        if limiter.try_acquire(1).unwrap().is_allowed() {
            taken += 1;
            if taken == 2_048 + 400 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let stats = limiter.stats();
    assert_eq!(taken, 2_048 + 400, "{stats:?}");
    // 400 tokens beyond the big batch, 8 a lease: about 50 leases, not one per token.
    assert!(stats.leases < 120, "{stats:?}");
}

/// A new limiter denies until its first lease lands a round trip later; `ready` waits for it,
/// so the first check after it is allowed (a warm start).
#[tokio::test(start_paused = true)]
async fn ready_waits_for_the_first_lease_so_the_first_check_is_allowed() {
    let store = Wrapped::new(Duration::from_millis(1));
    let quota = Quota::per_second(1_000).unwrap();
    let cold = HybridLimiter::new("cold", quota, store.clone()).unwrap();
    assert!(
        !cold.try_acquire(1).unwrap().is_allowed(),
        "without ready: the lease is still in flight"
    );
    let warm = HybridLimiter::new("warm", quota, store.clone()).unwrap();
    let started = tokio::time::Instant::now();
    warm.ready().await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(1),
        "one round trip"
    );
    assert!(warm.try_acquire(1).unwrap().is_allowed());
    // Later calls return at once, and count no lease.
    let leases = warm.stats().leases;
    warm.ready().await.unwrap();
    assert_eq!(warm.stats().leases, leases);

    // Without prefetch, ready starts the first lease itself.
    let lazy = HybridLimiter::builder("lazy", quota, store.clone())
        .prefetch(false)
        .build()
        .unwrap();
    settle().await;
    assert_eq!(lazy.stats().leases, 0);
    lazy.ready().await.unwrap();
    assert_eq!(lazy.stats().leases, 1);
    assert!(lazy.try_acquire(1).unwrap().is_allowed());
}

#[tokio::test(start_paused = true)]
async fn ready_reports_a_failing_store_and_a_closed_limiter() {
    let store = Wrapped::new(Duration::from_millis(1));
    store.failing.store(true, Ordering::SeqCst);
    let quota = Quota::per_second(1_000).unwrap();
    let limiter = HybridLimiter::new("down", quota, store.clone()).unwrap();
    let err = tokio::time::timeout(Duration::from_millis(50), limiter.ready())
        .await
        .expect("answered after the first failed lease")
        .unwrap_err();
    assert!(
        matches!(err, AcquireError::Store(StoreError::Timeout(_))),
        "{err:?}"
    );
    // The limiter keeps running: once the store answers, ready succeeds.
    store.failing.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(1)).await;
    limiter.ready().await.unwrap();
    let d = limiter.try_acquire(1).unwrap();
    assert!(d.is_allowed(), "{d:?} {:?}", limiter.stats());

    let closed = HybridLimiter::builder("closed", quota, store.clone())
        .prefetch(false)
        .build()
        .unwrap();
    closed.shutdown().await;
    assert!(matches!(closed.ready().await, Err(AcquireError::Closed)));
}

/// A limit far above demand: no caller is ever denied while the fleet has plenty of tokens,
/// including while a refill is in flight and while demand ramps up (145 000/s in bursts of
/// 145 a millisecond, against 10 000 000/s).
#[tokio::test(start_paused = true)]
async fn a_limit_far_above_demand_never_denies() {
    let store = Wrapped::new(Duration::from_micros(200));
    let quota = Quota::per_second(10_000_000).unwrap();
    let limiter = HybridLimiter::new("ample", quota, store.clone()).unwrap();
    limiter.ready().await.unwrap();
    let mut denied = 0;
    for ms in 0..3_000u64 {
        // Ramps from 1 000/s to 145 000/s over the first second.
        let per_ms = (1 + ms * 144 / 1_000).min(145);
        for _ in 0..per_ms {
            if !limiter.try_acquire(1).unwrap().is_allowed() {
                denied += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let stats = limiter.stats();
    assert!(stats.leases >= 3, "it leased along the way: {stats:?}");
    assert_eq!(denied, 0, "{stats:?}");
}

/// A miss is a refusal ([`LocalAnswer::Denied`]) within a second of the store refusing the
/// limiter, but not after an outage: the back-off that errors left behind is no refusal, and
/// once the circuit closes an empty local bucket waits for its lease
/// ([`LocalAnswer::NeedsLease`]).
#[tokio::test(start_paused = true)]
async fn after_an_outage_a_miss_needs_a_lease_and_after_a_refusal_it_is_denied() {
    let store = Wrapped::new(Duration::from_millis(1));
    let quota = Quota::per_second(1_000).unwrap().with_burst(100).unwrap();
    // Token leases (this tight burst would lease a rate by default, which is renewed, not
    // refused, and drips between renewals).
    let limiter = HybridLimiter::builder("recent", quota, store.clone())
        .policy(AdaptiveLease::new().rate_leases(false))
        .build()
        .unwrap();
    limiter.ready().await.unwrap();
    // Spends the local tokens; the first answer that is not `Allowed`.
    let drain = || loop {
        match limiter.try_acquire_local(1).unwrap() {
            LocalAnswer::Allowed => {}
            other => return other,
        }
    };
    store.failing.store(true, Ordering::SeqCst);
    // Its miss asks for the lease that fails (no answer yet, so `NeedsLease`).
    let _ = drain();
    settle().await;
    assert!(limiter.stats().circuit_open);
    store.failing.store(false, Ordering::SeqCst);
    while limiter.stats().circuit_open {
        let _ = limiter.try_acquire(1).unwrap();
        settle().await;
    }
    let after_outage = drain();
    assert!(
        matches!(after_outage, LocalAnswer::NeedsLease { .. }),
        "{after_outage:?}"
    );

    // Another client takes all it may of the store's bucket, again and again, while the
    // limiter spends all it gets (an anonymous take beside a leaser leaves the reserve to the
    // leaser's credit, which covers its share): refused, the limiter is at its limit.
    let one = LeaseRequest::exact(1);
    for _ in 0..100 {
        while store
            .inner
            .lease("recent", &quota, &one)
            .await
            .unwrap()
            .granted
            > 0
        {}
        if limiter.stats().over_limit > 0 {
            break;
        }
        let _ = drain();
        settle().await;
    }
    assert!(limiter.stats().over_limit > 0, "{:?}", limiter.stats());
    let refused = drain();
    assert!(matches!(refused, LocalAnswer::Denied { .. }), "{refused:?}");
}

/// A store that answers in 100 µs, or, while `failing`, times out after 100 ms; it keeps
/// every node lease it answers.
#[derive(Clone)]
struct TimingOut {
    inner: MemoryStore,
    failing: std::sync::Arc<std::sync::atomic::AtomicBool>,
    answered: std::sync::Arc<std::sync::Mutex<Vec<LeaseRequest>>>,
}

impl LeaseStore for TimingOut {
    async fn lease(
        &self,
        name: &str,
        quota: &Quota,
        req: &LeaseRequest,
    ) -> Result<ratelease::LeaseReply, StoreError> {
        if self.failing.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            return Err(StoreError::Timeout(Duration::from_millis(100)));
        }
        tokio::time::sleep(Duration::from_micros(100)).await;
        if req.node.is_some() {
            self.answered.lock().unwrap().push(*req);
        }
        self.inner.lease(name, quota, req).await
    }

    async fn release(
        &self,
        name: &str,
        quota: &Quota,
        req: &ratelease::ReleaseRequest,
    ) -> Result<ratelease::LeaseReply, StoreError> {
        tokio::time::sleep(Duration::from_micros(100)).await;
        self.inner.release(name, quota, req).await
    }
}

/// A timed-out call is not a round trip: after an outage of timeouts the next lease is sized
/// for the store's real round trip, not for one of 100 ms (a lease covers a round trip of
/// demand; counted, timeouts had also kept every lease stretched for seconds after a Sentinel
/// failover).
#[tokio::test(start_paused = true)]
async fn timeouts_do_not_count_as_round_trips() {
    let store = TimingOut {
        inner: MemoryStore::new(),
        failing: Default::default(),
        answered: Default::default(),
    };
    // 1 000/s, burst 1 000: a horizon of 250 ms, leases of 1.25 horizons and a round trip of
    // demand.
    let quota = Quota::per_second(1_000).unwrap();
    // Failing closed, so the callers' demand is measured through the outage.
    let limiter = HybridLimiter::builder("rtt", quota, store.clone())
        .on_store_failure(FailurePolicy::FailClosed)
        .build()
        .unwrap();
    settle().await;
    store.failing.store(true, Ordering::SeqCst);
    // Callers keep asking, 1 000/s, through a second of timeouts.
    for _ in 0..1_000 {
        let _ = limiter.try_acquire(1);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(limiter.stats().store_errors >= 3, "{:?}", limiter.stats());
    store.failing.store(false, Ordering::SeqCst);
    let answered = store.answered.lock().unwrap().len();
    while store.answered.lock().unwrap().len() == answered {
        let _ = limiter.try_acquire(1);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let after = store.answered.lock().unwrap()[answered];
    assert_eq!(after.node.unwrap().horizon, Duration::from_millis(250));
    // About 1 000/s × (312.5 ms + the round trip): 313 tokens for 100 µs, 323 for 10 ms;
    // with the timeouts counted as round trips it was 347.
    assert!((290..=323).contains(&after.want), "{after:?}");
}

/// In an outage, a request larger than the local fallback's burst (50 of a share of 25/s,
/// burst 25) can never be served locally: it is denied with a retry hint of the store's
/// back-off (when the store may answer again), not told a wait of its own that never comes
/// true (the local rate said 1 s, and said it again a second later), while requests that fit
/// are served by the fallback. Pure and hybrid alike.
#[tokio::test(start_paused = true)]
async fn a_request_larger_than_the_fallbacks_burst_is_not_told_a_wait_that_never_ends() {
    use ratelease::RedisLimiter;

    let store = Wrapped::new(Duration::from_millis(1));
    let quota = Quota::per_second(100).unwrap();
    let policy = FailurePolicy::local_fallback(4);
    let pure = RedisLimiter::builder("big-pure", quota, store.clone())
        .on_store_failure(policy)
        .build()
        .unwrap();
    let hybrid = HybridLimiter::builder("big-hybrid", quota, store.clone())
        .on_store_failure(policy)
        .build()
        .unwrap();
    hybrid.ready().await.unwrap();
    for _ in 0..hybrid.available() {
        assert!(hybrid.try_acquire(1).unwrap().is_allowed());
    }
    store.failing.store(true, Ordering::SeqCst);
    // Both circuits open on a failed call.
    let _ = pure.acquire_now(1).await;
    let _ = hybrid.try_acquire(1);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(hybrid.stats().circuit_open);
    let hint = |d: Decision| match d {
        Decision::Denied { retry_after } => retry_after,
        Decision::Allowed => panic!("50 tokens admitted by a local rate of burst 25"),
    };
    let pure_wait = hint(pure.acquire_now(50).await.unwrap());
    let hybrid_wait = hint(hybrid.try_acquire(50).unwrap());
    for wait in [pure_wait, hybrid_wait] {
        assert!(
            wait <= Duration::from_millis(500),
            "told {wait:?} for tokens the local rate can never hold"
        );
    }
    assert!(pure.acquire_now(10).await.unwrap().is_allowed());
    assert!(hybrid.try_acquire(10).unwrap().is_allowed());

    // A keyed limiter: a denial, and for a waiter the store's error (it waited for good).
    store.failing.store(false, Ordering::SeqCst);
    let keyed =
        ratelease::KeyedHybridLimiter::<String, _>::builder("big-keyed", quota, store.clone())
            .on_store_failure(policy)
            .build()
            .unwrap();
    keyed.acquire("k", 1).await.unwrap();
    store.failing.store(true, Ordering::SeqCst);
    let _ = keyed.try_acquire("k", 100);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(keyed.stats().circuit_open);
    let wait = hint(keyed.try_acquire("k", 50).unwrap());
    assert!(wait <= Duration::from_millis(500), "told {wait:?}");
    let waited = tokio::time::timeout(Duration::from_secs(5), keyed.acquire("k", 50)).await;
    assert!(
        matches!(waited, Ok(Err(AcquireError::Store(_)))),
        "{waited:?}"
    );
    assert!(keyed.try_acquire("k", 10).unwrap().is_allowed());
}

/// A node paused on the store's answer (over the limit: its next tokens are seconds away)
/// still drops its local tokens when their lease nears its ttl: the store forgets them then,
/// and spending them later admitted them twice. (Checked only at the task's loop before; a
/// pause of the store's retry hint ran past the ttl with the tokens still spendable.)
#[tokio::test(start_paused = true)]
async fn local_tokens_expire_while_the_task_pauses_on_the_stores_answer() {
    let store = Wrapped::new(Duration::from_micros(100));
    let quota = Quota::per_second(1).unwrap().with_burst(10).unwrap();
    let limiter = HybridLimiter::builder("paused", quota, store.clone())
        .policy(AdaptiveLease::new().ttl(Duration::from_millis(300)))
        .build()
        .unwrap();
    limiter.ready().await.unwrap();
    assert_eq!(limiter.available(), 1, "{:?}", limiter.stats());
    // Another client takes what the bucket has left.
    let drained = store
        .inner
        .lease("paused", &quota, &LeaseRequest::new(9, 1))
        .await
        .unwrap();
    assert_eq!(drained.granted, 9);
    // A request for 5: the lease for it is refused, the next try seconds away.
    assert!(!limiter.try_acquire(5).unwrap().is_allowed());
    tokio::time::sleep(Duration::from_millis(50)).await;
    let stats = limiter.stats();
    assert_eq!((stats.over_limit, stats.local_tokens), (1, 1), "{stats:?}");
    match limiter.try_acquire(5).unwrap() {
        Decision::Denied { retry_after } => {
            assert!(retry_after > Duration::from_secs(2), "{retry_after:?}")
        }
        d => panic!("{d:?}"),
    }
    // The lease's ttl is 500 ms (twice the 250 ms horizon): long before the pause ends the
    // token is gone, given back rather than spent.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stats = limiter.stats();
    assert_eq!(stats.local_tokens, 0, "{stats:?}");
    assert!(!limiter.try_acquire(1).unwrap().is_allowed(), "{stats:?}");
    assert_eq!(stats.tokens_released, 1, "given back: {stats:?}");
}

/// An error that is no outage (an ACL denial, a rejected or malformed reply: the store
/// answered, and retrying will not help) is not answered by the failure policy: under
/// `FailOpen` a user without the script's permissions admitted every request. Callers are
/// denied, and `ready` and `acquire` end with the error; an outage still opens the circuit.
#[tokio::test(start_paused = true)]
async fn an_error_that_is_no_outage_is_not_answered_by_the_failure_policy() {
    let store = Wrapped::new(Duration::from_millis(1));
    store.refusing.store(true, Ordering::SeqCst);
    let quota = Quota::per_second(1_000).unwrap();
    let limiter = HybridLimiter::builder("acl", quota, store.clone())
        .on_store_failure(FailurePolicy::FailOpen)
        .build()
        .unwrap();
    let err = limiter.ready().await.unwrap_err();
    assert!(
        matches!(err, AcquireError::Store(StoreError::NoPermission(_))),
        "{err:?}"
    );
    for _ in 0..10 {
        assert!(!limiter.try_acquire(1).unwrap().is_allowed());
    }
    let waited = tokio::time::timeout(Duration::from_secs(5), limiter.acquire(1)).await;
    assert!(
        matches!(
            waited,
            Ok(Err(AcquireError::Store(StoreError::NoPermission(_))))
        ),
        "{waited:?}"
    );
    let stats = limiter.stats();
    assert!(!stats.circuit_open && stats.store_errors >= 1, "{stats:?}");
    assert_eq!(stats.tokens_admitted_degraded, 0, "{stats:?}");
    // An outage is answered by the policy: FailOpen admits (a denial asks for a lease, which
    // times out).
    store.refusing.store(false, Ordering::SeqCst);
    store.failing.store(true, Ordering::SeqCst);
    assert!(!limiter.try_acquire(1).unwrap().is_allowed());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(limiter.stats().circuit_open, "{:?}", limiter.stats());
    assert!(limiter.try_acquire(1).unwrap().is_allowed());
    // The store back, but refusing (its ACL lost in the restart): the circuit closes, and
    // FailOpen admits no more.
    store.failing.store(false, Ordering::SeqCst);
    store.refusing.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stats = limiter.stats();
    assert!(!stats.circuit_open, "{stats:?}");
    for _ in 0..10 {
        assert!(!limiter.try_acquire(1).unwrap().is_allowed(), "{stats:?}");
    }
}

/// A lease whose minimum is above a stored config's smaller burst is refused by the store
/// before it touches the node's record (no renewal): the node must not read the reply as one.
/// It extended its local expiry by a ttl from that call, and spent its tokens after the store
/// had forgotten them.
#[tokio::test(start_paused = true)]
async fn a_lease_refused_for_a_minimum_above_the_stored_burst_renews_nothing() {
    use ratelease::ConfigStore;

    let store = Wrapped::new(Duration::from_micros(100));
    let quota = Quota::per_second(10).unwrap().with_burst(100).unwrap();
    let limiter = HybridLimiter::builder("shrinks", quota, store.clone())
        // (Not idle within the test: an idle give-back would empty the bucket on its own.)
        .policy(
            AdaptiveLease::new()
                .ttl(Duration::from_secs(1))
                .idle_after(Duration::from_secs(10)),
        )
        .build()
        .unwrap();
    limiter.ready().await.unwrap();
    let held = limiter.available();
    assert!(held > 0 && held < 90, "{:?}", limiter.stats());
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(limiter.available(), held, "{:?}", limiter.stats());
    let smaller = Quota::per_second(10).unwrap().with_burst(5).unwrap();
    store.inner.init_config("shrinks", &smaller).await.unwrap();
    // More than it holds, less than the builder's burst: a lease with that minimum.
    assert!(!limiter.try_acquire(held + 10).unwrap().is_allowed());
    tokio::time::sleep(Duration::from_millis(50)).await;
    let stats = limiter.stats();
    assert_eq!(stats.leases, 2, "{stats:?}");
    // The store forgets the first lease at 1 s: the node drops its tokens at 0.9 s.
    tokio::time::sleep(Duration::from_millis(450)).await;
    let stats = limiter.stats();
    assert_eq!(stats.local_tokens, 0, "{stats:?}");
}

/// The default policy, deciding every miss in the store (per request).
struct PerRequest;

impl LeasePolicy for PerRequest {
    fn ask(&self, ctx: &LeaseContext) -> LeaseAsk {
        AdaptiveLease::new().ask(ctx)
    }
    fn terms(&self, quota: &Quota) -> Option<LeaseTerms> {
        AdaptiveLease::new().terms(quota)
    }
    fn per_request(&self, _ctx: &LeaseContext, _deciding: bool) -> bool {
        true
    }
}

/// A wait of `Duration::MAX` in a store's reply (a refusal, a grant's pacing, a fixed window's
/// end) is read as "not for a long time": no panic in the background task (which would leave
/// `ready` waiting for good and the limiter denying for good) nor on the caller's thread.
#[tokio::test(start_paused = true)]
async fn a_store_reply_that_says_never_panics_nothing() {
    let quota = Quota::per_second(1_000).unwrap();
    fn bounded<F: std::future::Future>(f: F) -> tokio::time::Timeout<F> {
        tokio::time::timeout(Duration::from_secs(1), f)
    }
    for (granted, algorithm) in [
        (0, ratelease::Algorithm::TokenBucket),
        (5, ratelease::Algorithm::TokenBucket),
        (5, ratelease::Algorithm::FixedWindow),
    ] {
        let limiter = HybridLimiter::builder("never", quota, Never { granted })
            .algorithm(algorithm)
            .build()
            .unwrap();
        let ready = bounded(limiter.ready()).await;
        assert!(ready.is_ok(), "{granted} {algorithm:?}: ready hung");
        // The task is alive: it answers a shutdown.
        bounded(limiter.shutdown())
            .await
            .unwrap_or_else(|_| panic!("{granted} {algorithm:?}: no shutdown"));
    }
    // Deciding per request: the refusal's wait blocks the node, on the caller's thread.
    let limiter = HybridLimiter::builder("never", quota, Never { granted: 0 })
        .policy(PerRequest)
        .build()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1)).await;
    for _ in 0..3 {
        let decision = bounded(limiter.acquire_now(1)).await.expect("hung");
        assert!(!decision.unwrap().is_allowed());
    }
    assert!(limiter.stats().decisions > 0, "{:?}", limiter.stats());
    bounded(limiter.shutdown()).await.expect("no shutdown");
}

/// A policy that decides per request from the start leases nothing, the first lease included:
/// `ready` returns at once rather than wait for a lease that never comes (it waited for good),
/// and the first request is decided in the store.
#[tokio::test(start_paused = true)]
async fn ready_returns_for_a_node_that_decides_per_request_from_the_start() {
    let store = MemoryStore::with_clock(ratelease::TokioClock::new());
    let quota = Quota::per_second(10).unwrap();
    for prefetch in [true, false] {
        let limiter = HybridLimiter::builder("per-request-ready", quota, store.clone())
            .policy(PerRequest)
            .prefetch(prefetch)
            .build()
            .unwrap();
        tokio::time::timeout(Duration::from_secs(1), limiter.ready())
            .await
            .unwrap_or_else(|_| panic!("prefetch {prefetch}: ready hung"))
            .unwrap();
        assert!(limiter.acquire_now(1).await.unwrap().is_allowed());
        let stats = limiter.stats();
        assert_eq!((stats.leases, stats.decisions), (0, 1), "{stats:?}");
    }
}

/// Deciding per request, a refusal of a large request holds back only requests the bucket
/// could not cover: a smaller one is still the store's to decide, as in pure mode.
#[tokio::test(start_paused = true)]
async fn a_refused_large_decision_does_not_deny_a_smaller_one() {
    let store = MemoryStore::with_clock(ratelease::TokioClock::new());
    let quota = Quota::per_second(10).unwrap().with_burst(3).unwrap();
    let limiter = HybridLimiter::builder("sizes", quota, store)
        .policy(PerRequest)
        .build()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(limiter.acquire_now(2).await.unwrap().is_allowed());
    // One token left: three are 200 ms away.
    let Decision::Denied { retry_after } = limiter.acquire_now(3).await.unwrap() else {
        panic!("three tokens with one in the bucket");
    };
    assert!(retry_after >= Duration::from_millis(150), "{retry_after:?}");
    let decisions = limiter.stats().decisions;
    assert!(limiter.acquire_now(1).await.unwrap().is_allowed());
    assert_eq!(
        limiter.stats().decisions,
        decisions + 1,
        "decided in the store"
    );
    // The bucket is empty now: a request of one is refused, and the next held back by it.
    assert!(!limiter.acquire_now(1).await.unwrap().is_allowed());
    let decisions = limiter.stats().decisions;
    assert!(!limiter.acquire_now(1).await.unwrap().is_allowed());
    assert_eq!(limiter.stats().decisions, decisions, "a known refusal");
}

/// `try_acquire_for` returns a refusal at once when the store says no token comes before its
/// timeout, instead of waiting the timeout out.
#[tokio::test(start_paused = true)]
async fn try_acquire_for_returns_a_refusal_that_outlasts_its_timeout() {
    let store = Wrapped::new(Duration::from_millis(1));
    let quota = Quota::per_minute(1).unwrap();
    let anonymous = LeaseRequest::exact(1);
    assert_eq!(
        store
            .inner
            .lease("late", &quota, &anonymous)
            .await
            .unwrap()
            .granted,
        1
    );
    let limiter = HybridLimiter::builder("late", quota, store)
        .prefetch(false)
        .build()
        .unwrap();
    let started = tokio::time::Instant::now();
    let decision = limiter
        .try_acquire_for(1, Duration::from_secs(1))
        .await
        .unwrap();
    let Decision::Denied { retry_after } = decision else {
        panic!("the bucket is empty for a minute");
    };
    assert!(retry_after > Duration::from_secs(1), "{retry_after:?}");
    assert!(
        started.elapsed() < Duration::from_millis(100),
        "answered after {:?}",
        started.elapsed()
    );
}

/// A store's answer that the name has no config (under `Unconfigured::Error`) renews nothing:
/// the tokens leased under the deleted config go at their lease's expiry, as a failed call's
/// would, instead of being kept spendable by every recheck.
#[tokio::test(start_paused = true)]
async fn tokens_leased_under_a_deleted_config_expire() {
    use ratelease::{ConfigStore, Unconfigured};
    let store = MemoryStore::with_clock(ratelease::TokioClock::new());
    let quota = Quota::per_second(100).unwrap();
    store.init_config("gone", &quota).await.unwrap();
    let node = HybridLimiter::builder("gone", quota, store.clone())
        .if_unconfigured(Unconfigured::Error)
        .policy(
            AdaptiveLease::new()
                .horizon(Duration::from_millis(250)) // so the ttl is 2.5 s, past a recheck
                .idle_after(Duration::from_secs(60)),
        )
        .build()
        .unwrap();
    node.ready().await.unwrap();
    for _ in 0..20 {
        let _ = node.try_acquire(1).unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let held = node.available();
    assert!(held > 0, "it holds a lease");
    assert!(store.delete_config("gone").await.unwrap());
    // A miss asks the store, which answers that the name has no config.
    let _ = node.try_acquire(held + 1);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(node.stats().leases >= 2, "{:?}", node.stats());
    // Callers keep asking for more than it holds (each miss asks the store again at its
    // recheck, a second apart), for twice the ttl: the tokens go at the lease's expiry, and
    // none of them is spent after it.
    for _ in 0..50 {
        assert!(node.try_acquire(held + 1).is_err(), "unconfigured");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(node.stats().leases >= 4, "rechecks: {:?}", node.stats());
    assert_eq!(node.available(), 0, "{:?}", node.stats());
    assert!(
        !matches!(node.try_acquire(1), Ok(d) if d.is_allowed()),
        "no token of the old config is spent"
    );
}

/// A node's first lease waits 200 ms in the store's queue (as at a start of 10 000 nodes,
/// where Redis hears every first lease in turn), then the store answers in 1 ms. Its
/// low-water mark is three round trips of its demand: while the round-trip estimate still
/// read the queue, the mark stood above the lease it asked for, and each reply left it under
/// the mark — the node called again as each reply landed (35 lease calls in the next second,
/// the estimate falling by an eighth a call; 21 once it forgets the drained queue, about a
/// call per 50 ms horizon at 8 000 requests a second).
#[tokio::test(start_paused = true)]
async fn a_first_lease_that_waited_in_a_queue_does_not_leave_the_node_calling_at_every_reply() {
    let store = Wrapped::new(Duration::from_millis(1));
    store.stall_us.store(200_000, Ordering::SeqCst);
    let quota = Quota::per_second(10_000).unwrap();
    let start = tokio::time::Instant::now();
    let limiter = HybridLimiter::builder("queued", quota, store.clone())
        .policy(AdaptiveLease::new().horizon(Duration::from_millis(50)))
        .build()
        .unwrap();
    limiter.ready().await.unwrap();
    assert!(start.elapsed() >= Duration::from_millis(200), "no queue");
    let before = limiter.stats().leases;
    for _ in 0..1_000 {
        for _ in 0..8 {
            let _ = limiter.try_acquire(1).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let stats = limiter.stats();
    let calls = stats.leases - before;
    assert!(calls <= 25, "{calls} lease calls in a second: {stats:?}");
}
