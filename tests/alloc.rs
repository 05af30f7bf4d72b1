//! The hot path allocates nothing: a counting global allocator watches
//! `HybridLimiter::try_acquire` (and `KeyedHybridLimiter::try_acquire` on an existing key) on
//! the calling thread.
//!
//! Only allocations made *by the measuring thread* while a region is open are counted (a
//! thread-local switch), so the limiter's background task, the tokio workers and tests running
//! in parallel cannot add to — or hide behind — the count. A control region that allocates one
//! `Vec` proves the counter works, so the zero-allocation assertions cannot pass vacuously.

mod counting;

use std::time::{Duration, Instant};

use counting::allocations;
use ratelease::{Decision, HybridLimiter, KeyRef, KeyedHybridLimiter, MemoryStore, Quota};

/// A multi-thread runtime with one worker, for limiters' background tasks.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// A limiter whose first lease of `lease` tokens has arrived and whose refill flag is down
/// again, with its background task on a multi-thread runtime (so a refill request from this
/// thread really wakes another thread).
fn ready_limiter(lease: u64) -> (tokio::runtime::Runtime, HybridLimiter<MemoryStore>) {
    let rt = runtime();
    let quota = Quota::per_second(1_000_000).unwrap();
    let limiter = HybridLimiter::builder("alloc", quota, MemoryStore::new())
        .lease_size(lease)
        .runtime(rt.handle().clone())
        .build()
        .unwrap();
    rt.block_on(limiter.acquire(1)).unwrap();
    // `acquire` returns once the grant is in; the task lowers the flag right after.
    wait_for(
        || limiter.stats().leases == 1,
        || format!("the first lease: {:?}", limiter.stats()),
    );
    std::thread::sleep(Duration::from_millis(20));
    (rt, limiter)
}

fn wait_for<W: std::fmt::Display>(mut done: impl FnMut() -> bool, what: impl Fn() -> W) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {}",
            what()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn the_counter_sees_allocations() {
    let (v, n) = allocations(|| Vec::<u8>::with_capacity(1));
    drop(v);
    assert_eq!(
        n, 1,
        "the control allocation was not counted: the other tests prove nothing"
    );
}

/// Lease sizes that exercise both modes of the local bucket: 1 000 tokens stay in one word,
/// 100 000 are sharded into per-thread slots (chunks of 3 125, so the run below also moves
/// chunks from the reserve into the caller's slot, on the out-of-line path).
const LEASES: [u64; 2] = [1_000, 100_000];

#[test]
fn local_hit_without_refill_allocates_nothing() {
    for lease in LEASES {
        let (_rt, limiter) = ready_limiter(lease);
        let low_water = limiter.low_water();
        assert_eq!(limiter.available(), lease - 1);
        // Stay above the low-water mark: no refill is requested.
        let calls = lease - 1 - low_water - 1;
        let (allowed, n) = allocations(|| {
            (0..calls)
                .filter(|_| matches!(limiter.try_acquire(1), Ok(Decision::Allowed)))
                .count() as u64
        });
        assert_eq!(allowed, calls, "lease {lease}: every call was a local hit");
        assert_eq!(
            n, 0,
            "lease {lease}: {calls} local hits allocated {n} times"
        );
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            limiter.stats().leases,
            1,
            "lease {lease}: no refill was triggered"
        );
        // The control, in the same kind of region, on the same thread.
        let (v, n) = allocations(|| Vec::<u8>::with_capacity(1));
        drop(v);
        assert_eq!(n, 1);
    }
}

/// The call that crosses the low-water mark raises the refill flag and wakes the background
/// task on another thread: that allocates nothing either (tokio's wake-up queue is intrusive).
#[test]
fn local_hit_that_requests_a_refill_allocates_nothing() {
    for lease in LEASES {
        let (_rt, limiter) = ready_limiter(lease);
        let low_water = limiter.low_water();
        // Down to exactly the mark: the next call leaves `low_water - 1` and requests a refill.
        while limiter.available() > low_water {
            assert!(limiter.try_acquire(1).unwrap().is_allowed());
        }
        assert_eq!(limiter.stats().leases, 1, "lease {lease}: no refill yet");
        let (decision, n) = allocations(|| limiter.try_acquire(1));
        assert!(
            matches!(decision, Ok(Decision::Allowed)),
            "lease {lease}: expected a hit, got {decision:?}"
        );
        assert_eq!(
            n, 0,
            "lease {lease}: the refill-requesting hit allocated {n} times"
        );
        wait_for(|| limiter.stats().leases == 2, || "the requested refill");
    }
}

/// For completeness: a denial (empty bucket) asks for a refill and computes a retry hint,
/// still without allocating.
#[test]
fn local_denial_allocates_nothing() {
    let rt = runtime();
    // One token per hour: after the first lease the store cannot serve another.
    let quota = Quota::new(1, Duration::from_secs(3_600)).unwrap();
    let limiter = HybridLimiter::builder("alloc-denied", quota, MemoryStore::new())
        .runtime(rt.handle().clone())
        .build()
        .unwrap();
    rt.block_on(limiter.acquire(1)).unwrap();
    let (decision, n) = allocations(|| limiter.try_acquire(1));
    assert!(
        matches!(decision, Ok(Decision::Denied { .. })),
        "expected a denial, got {decision:?}"
    );
    assert_eq!(n, 0, "a local denial allocated {n} times");
}

/// A hybrid concurrency permit: taken from the pool, dropped back into it, and refused when the
/// pool is empty (which asks the background task for a lease) — no allocation on any of them.
#[test]
fn hybrid_concurrency_permits_allocate_nothing() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let limiter = ratelease::ConcurrencyLimiter::builder("alloc-conc", 4, MemoryStore::new())
        .hybrid(4)
        .runtime(rt.handle().clone())
        .build()
        .unwrap();
    drop(rt.block_on(limiter.acquire(1)).unwrap());
    wait_for(|| limiter.stats().pooled == 4, || "the first lease");
    let (taken, n) = allocations(|| {
        let mut taken = 0;
        for _ in 0..1_000 {
            let a = limiter.try_acquire(2).unwrap();
            let b = limiter.try_acquire(2).unwrap();
            let refused = limiter.try_acquire(1).unwrap();
            taken += u64::from(a.is_some()) + u64::from(b.is_some()) + u64::from(refused.is_some());
        }
        taken
    });
    assert_eq!(
        taken, 2_000,
        "every pair from the pool, every third call refused"
    );
    assert_eq!(n, 0, "permits allocated {n} times");
    assert_eq!(
        limiter.stats().store_calls(),
        1,
        "the pool served everything"
    );
}

/// Sends requests `0..requests` through `svc` (an echo service behind a layer), each polled
/// ready and then called and polled once; returns how many were answered at once, and the
/// allocations that took.
#[cfg(feature = "tower")]
fn served_at_once<S>(svc: &mut S, requests: u64) -> (u64, u64)
where
    S: tower::Service<u64, Response = u64>,
{
    use std::future::Future;
    use std::task::{Context, Poll, Waker};

    let mut cx = Context::from_waker(Waker::noop());
    let (served, n) = allocations(|| {
        (0..requests)
            .filter(|&i| {
                if !matches!(svc.poll_ready(&mut cx), Poll::Ready(Ok(()))) {
                    return false;
                }
                let mut response = std::pin::pin!(svc.call(i));
                matches!(response.as_mut().poll(&mut cx), Poll::Ready(Ok(x)) if x == i)
            })
            .count()
    });
    (served as u64, n)
}

/// An inner service that answers every request at once with the request.
#[cfg(feature = "tower")]
fn echo() -> impl tower::Service<
    u64,
    Response = u64,
    Error = std::convert::Infallible,
    Future = std::future::Ready<Result<u64, std::convert::Infallible>>,
> + Clone
       + Send
       + 'static {
    tower::service_fn(|x: u64| std::future::ready(Ok(x)))
}

/// The tower middleware's admitted path over a hybrid limiter: `poll_ready` answers from the
/// synchronous check and `call` wraps the inner future without boxing it.
#[cfg(feature = "tower")]
#[test]
fn middleware_admission_allocates_nothing() {
    use ratelease::middleware::RateLimitLayer;
    use tower::Layer;

    let (_rt, limiter) = ready_limiter(1_000);
    let mut svc = RateLimitLayer::new(limiter.clone()).layer(echo());
    let requests = 100;
    let (served, n) = served_at_once(&mut svc, requests);
    assert_eq!(served, requests, "every request was admitted at once");
    assert_eq!(n, 0, "{requests} admitted requests allocated {n} times");
    assert_eq!(limiter.available(), 1_000 - 1 - requests);
}

/// A keyed limiter whose key `k` holds a batch of 999 tokens with a low-water mark of 500: the
/// first `acquire` leases exactly one token, the second (demand now measured) a batch of 1 000.
fn ready_keyed<K>(
    key: &K::Borrowed,
) -> (tokio::runtime::Runtime, KeyedHybridLimiter<K, MemoryStore>)
where
    K: KeyOf,
{
    let rt = runtime();
    let quota = Quota::per_second(1_000_000).unwrap();
    let limiter = KeyedHybridLimiter::builder("alloc-keyed", quota, MemoryStore::new())
        .lease_size(1_000)
        .runtime(rt.handle().clone())
        .build()
        .unwrap();
    rt.block_on(limiter.acquire(key, 1)).unwrap();
    rt.block_on(limiter.acquire(key, 1)).unwrap();
    assert_eq!(limiter.available(key), 999);
    (rt, limiter)
}

/// Key types the keyed test runs with, and the borrowed form callers look them up by.
trait KeyOf:
    std::borrow::Borrow<Self::Borrowed>
    + std::hash::Hash
    + Eq
    + Clone
    + std::fmt::Display
    + Send
    + Sync
    + 'static
{
    type Borrowed: KeyRef<Self> + ?Sized;
}

impl KeyOf for u64 {
    type Borrowed = u64;
}

impl KeyOf for String {
    type Borrowed = str;
}

fn keyed_hits_allocate_nothing<K: KeyOf>(key: &K::Borrowed) {
    let (_rt, limiter) = ready_keyed::<K>(key);
    let leases = limiter.stats().leases;
    // 998 → 500 tokens: above the low-water mark, so no refill is requested.
    let (allowed, n) = allocations(|| {
        (0..498)
            .filter(|_| matches!(limiter.try_acquire(key, 1), Ok(Decision::Allowed)))
            .count()
    });
    assert_eq!(allowed, 498, "every call was a local hit");
    assert_eq!(n, 0, "498 keyed hits allocated {n} times");
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(limiter.stats().leases, leases, "no refill was triggered");
}

#[test]
fn keyed_hit_on_an_existing_key_allocates_nothing() {
    keyed_hits_allocate_nothing::<u64>(&42);
    // A `String` key looked up by `&str`, as middleware holding a header value would.
    keyed_hits_allocate_nothing::<String>("api-key-42");
}

/// The keyed middleware's admitted path over a keyed hybrid limiter with `u64` keys: the
/// decision is synchronous and the inner future is wrapped without boxing.
#[cfg(feature = "tower")]
#[test]
fn keyed_middleware_admission_allocates_nothing() {
    use ratelease::middleware::KeyedRateLimitLayer;
    use tower::Layer;

    let (_rt, limiter) = ready_keyed::<u64>(&7);
    // Every request is for key 7.
    let mut svc = KeyedRateLimitLayer::new(limiter.clone(), |_: &u64| 7u64).layer(echo());
    let requests = 400;
    let (served, n) = served_at_once(&mut svc, requests);
    assert_eq!(served, requests, "every request was admitted at once");
    assert_eq!(
        n, 0,
        "{requests} admitted keyed requests allocated {n} times"
    );
    assert_eq!(limiter.available(&7), 999 - requests);
}
