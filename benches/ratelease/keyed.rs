//! Group `keyed`: one decision on a keyed limiter.
//!
//! - `governor_keyed/1m`: governor's keyed limiter, a random key of a million (all present).
//! - `hybrid_try_acquire/1`: `HybridLimiter::try_acquire(1)` again, the baseline of the
//!   `hybrid_keyed/hot` ratio in the same run.
//! - `hybrid_keyed/hot`: `KeyedHybridLimiter::try_acquire(&key, 1)` on one existing key that
//!   holds tokens: the keyed hot path (a map read and a CAS) next to the plain one (a CAS).
//! - `hybrid_keyed/1k`, `hybrid_keyed/1m`: a random key of a thousand / a million, every key
//!   present and holding tokens (leased before the case; refills happen in the background).
//! - `hybrid_keyed/hot-foldhash`, `hybrid_keyed/1m-foldhash`: the same with a seeded
//!   `foldhash` hasher instead of std's SipHash (`KeyedHybridBuilder::hasher`).
//!
//! Keys are `u64`, drawn inside the measured loop (wyrand: about a nanosecond), as a server
//! would see them.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput};
use ratelease::{Decision, HybridLimiter, KeyedHybridLimiter, MemoryStore};

use crate::common::{is_bench_run, runtime, unbounded_quota, BENCH_LEASE};

/// Distinct keys in the `1m` cases.
const KEYS_1M: u64 = 1_000_000;

/// A keyed limiter whose keys `0..keys` each hold a batch of about `lease` tokens: the first
/// `acquire` of a key leases exactly one token, the second (its demand now measured) a batch.
fn filled<H: BuildHasher + Clone + Send + Sync + 'static>(
    rt: &tokio::runtime::Runtime,
    keys: u64,
    lease: u64,
    hasher: H,
) -> KeyedHybridLimiter<u64, MemoryStore, H> {
    let limiter = KeyedHybridLimiter::builder("bench-keyed", unbounded_quota(), MemoryStore::new())
        .hasher(hasher)
        .lease_size(lease)
        .max_keys(keys as usize)
        .max_in_flight(256)
        // Nothing goes back or is evicted while the cases run.
        .give_back_after(Duration::from_secs(3_600))
        .idle_ttl(Duration::from_secs(3_600))
        .runtime(rt.handle().clone())
        .build()
        .expect("keyed limiter");
    rt.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        const TASKS: u64 = 256;
        for t in 0..TASKS {
            let limiter = limiter.clone();
            tasks.spawn(async move {
                for key in (t..keys).step_by(TASKS as usize) {
                    limiter.acquire(&key, 1).await.expect("first lease");
                    limiter.acquire(&key, 1).await.expect("batch");
                }
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.expect("fill task");
        }
    });
    limiter
}

/// Benchmarks `limiter.try_acquire(&pick(), 1)` as `id` and prints what happened meanwhile.
fn bench_keyed<H: BuildHasher + Clone + Send + Sync + 'static>(
    group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>,
    id: &str,
    limiter: &KeyedHybridLimiter<u64, MemoryStore, H>,
    mut pick: impl FnMut() -> u64,
) {
    let (calls, denied) = (AtomicU64::new(0), AtomicU64::new(0));
    let leases_before = limiter.stats().leases;
    group.bench_function(BenchmarkId::new("hybrid_keyed", id), |b| {
        b.iter_custom(|iters| {
            calls.fetch_add(iters, Ordering::Relaxed);
            let start = Instant::now();
            for _ in 0..iters {
                let key = pick();
                if !matches!(limiter.try_acquire(&key, 1), Ok(Decision::Allowed)) {
                    denied.fetch_add(1, Ordering::Relaxed);
                }
            }
            start.elapsed()
        })
    });
    let calls = calls.into_inner();
    if calls > 0 {
        eprintln!(
            "keyed/hybrid_keyed/{id}: {calls} calls, {} denied, {} leases during the case, {} \
             live keys",
            denied.load(Ordering::Relaxed),
            limiter.stats().leases - leases_before,
            limiter.live_keys(),
        );
    }
}

pub fn benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("keyed");
    group.throughput(Throughput::Elements(1));

    let governor = governor::RateLimiter::keyed(governor::Quota::per_second(NonZeroU32::MAX));
    if is_bench_run() {
        // Measure the steady state, where the key's state already exists, not first inserts.
        for key in 0..KEYS_1M {
            let _ = governor.check_key(&key);
        }
    }
    let mut rng = fastrand::Rng::with_seed(5);
    group.bench_function(BenchmarkId::new("governor_keyed", "1m"), |b| {
        b.iter(|| {
            let key = rng.u64(0..KEYS_1M);
            governor.check_key(&key)
        })
    });
    drop(governor);

    let rt = runtime(1);
    let hybrid = HybridLimiter::builder("bench-plain", unbounded_quota(), MemoryStore::new())
        .lease_size(BENCH_LEASE)
        .runtime(rt.handle().clone())
        .build()
        .expect("hybrid limiter");
    rt.block_on(hybrid.acquire(1)).expect("first lease");
    group.bench_function(BenchmarkId::new("hybrid_try_acquire", 1), |b| {
        b.iter(|| black_box(hybrid.try_acquire(1)))
    });
    drop(hybrid);

    let hot = filled(&rt, 1, BENCH_LEASE, RandomState::new());
    bench_keyed(&mut group, "hot", &hot, || 0);
    drop(hot);
    let hot = filled(&rt, 1, BENCH_LEASE, foldhash::fast::RandomState::default());
    bench_keyed(&mut group, "hot-foldhash", &hot, || 0);
    drop(hot);

    // Without `cargo bench`, a small map: the smoke run only checks that the case runs.
    let million = if is_bench_run() { KEYS_1M } else { 1_000 };
    for (id, keys, lease) in [("1k", 1_000, BENCH_LEASE / 100), ("1m", million, 10_000)] {
        let limiter = filled(&rt, keys, lease, RandomState::new());
        let mut rng = fastrand::Rng::with_seed(7);
        bench_keyed(&mut group, id, &limiter, || rng.u64(0..keys));
    }
    let limiter = filled(&rt, million, 10_000, foldhash::fast::RandomState::default());
    let mut rng = fastrand::Rng::with_seed(7);
    bench_keyed(&mut group, "1m-foldhash", &limiter, || rng.u64(0..million));
    drop(limiter);
    group.finish();
    drop(rt);
}
