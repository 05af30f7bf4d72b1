//! Group `keyed`: one decision on a keyed limiter, ratelease's `KeyedHybridLimiter` next to
//! governor's keyed limiter (its default `DashMap` store), with `u64` keys.
//!
//! - `hybrid_try_acquire/1`: `HybridLimiter::try_acquire(1)`, the baseline of the
//!   `hybrid_keyed/hot` ratio in the same run.
//! - `{hybrid,governor}_keyed/hot`: one existing key, again and again.
//! - `{hybrid,governor}_keyed/{1k,1m,10m}-{uniform,zipf}`: a key of a thousand, a million or
//!   ten million live keys, drawn uniformly or by Zipf's law (exponent 1: rank `r` is drawn
//!   with probability ∝ 1/r, so a few keys are hot and most are cold), every key present and
//!   holding tokens. Both limiters see the same key sequence, read from a precomputed buffer
//!   of 2^20 draws.
//! - `{hybrid,governor}_keyed/new-key`: a miss that creates a key (a key never seen). For
//!   ratelease that is the denial that creates the key's state and queues its first lease;
//!   batches of 1 024 are timed, and the worker catches up between batches (untimed), as it
//!   does between bursts of new keys. Each sample starts from an empty limiter.
//!
//! Ratelease's store grants every lease and keeps nothing (`benches/support/grant_all.rs`):
//! the store is never on a hit's path, and ten million buckets in a `MemoryStore` would only
//! cost memory. The eviction sweep is measured by `benches/sweep.rs` (caller latency during a
//! sweep of a million keys).

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput};
use ratelease::{Decision, HybridLimiter, KeyedHybridLimiter, MemoryStore};

use crate::common::{is_bench_run, runtime, unbounded_quota, BENCH_LEASE};
use crate::grant_all::GrantAll;

type Group<'a> = BenchmarkGroup<'a, criterion::measurement::WallTime>;
type Governor = governor::DefaultKeyedRateLimiter<u64>;

/// Draws in a key buffer (a power of two).
const DRAWS: usize = 1 << 20;

/// A keyed limiter whose keys `0..keys` each hold a batch of `lease` tokens: the first
/// `acquire` of a key leases exactly one token, the second (its demand now measured) a batch.
fn filled(
    rt: &tokio::runtime::Runtime,
    keys: u64,
    lease: u64,
) -> KeyedHybridLimiter<u64, GrantAll> {
    let limiter = KeyedHybridLimiter::builder("bench-keyed", unbounded_quota(), GrantAll)
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

/// Governor's keyed limiter with keys `0..keys` present (a quota that never binds).
fn governor_filled(keys: u64) -> Governor {
    let governor = governor::RateLimiter::keyed(governor::Quota::per_second(NonZeroU32::MAX));
    for key in 0..keys {
        let _ = governor.check_key(&key);
    }
    governor
}

/// `DRAWS` keys of `0..keys`: uniform, or Zipf with exponent 1 (continuous inversion:
/// `rank = keys^u`, so `P(rank ≤ x) = ln x / ln keys`).
fn draws(keys: u64, zipf: bool, seed: u64) -> Vec<u64> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..DRAWS)
        .map(|_| {
            if zipf {
                let rank = (keys as f64).powf(rng.f64()) as u64;
                rank.clamp(1, keys) - 1
            } else {
                rng.u64(0..keys)
            }
        })
        .collect()
}

/// Times `op` on the keys of `draws`, in order, as `name/id`.
fn bench_draws(group: &mut Group<'_>, name: &str, id: &str, draws: &[u64], op: impl Fn(u64)) {
    let mask = draws.len() - 1;
    group.bench_function(BenchmarkId::new(name, id), |b| {
        let mut i = 0;
        b.iter(|| {
            let key = draws[i & mask];
            i = i.wrapping_add(1);
            op(key)
        })
    });
}

/// `limiter.try_acquire(&key, 1)`, counting denials (a denial is a miss, not a hit).
fn hybrid_op<'a>(
    limiter: &'a KeyedHybridLimiter<u64, GrantAll>,
    denied: &'a AtomicU64,
) -> impl Fn(u64) + 'a {
    move |key| {
        if !matches!(limiter.try_acquire(&key, 1), Ok(Decision::Allowed)) {
            denied.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The hot key and the `{1k,1m,10m}-{uniform,zipf}` cases, governor's first.
fn live_keys(group: &mut Group<'_>, rt: &tokio::runtime::Runtime) {
    let bench = is_bench_run();
    let sizes: &[(&str, u64, u64)] = if bench {
        &[
            // Batches that no case runs through: these cases time hits, not refills.
            ("1k", 1_000, BENCH_LEASE),
            ("1m", 1_000_000, 100_000),
            ("10m", 10_000_000, 100_000),
        ]
    } else {
        &[("1k", 1_000, 1_000)]
    };
    for &(id, keys, lease) in sizes {
        let sequences = [
            ("uniform", draws(keys, false, 7)),
            ("zipf", draws(keys, true, 11)),
        ];
        let governor = governor_filled(keys);
        for (law, keys) in &sequences {
            bench_draws(group, "governor_keyed", &format!("{id}-{law}"), keys, |k| {
                let _ = black_box(governor.check_key(&k));
            });
        }
        if id == "1k" {
            bench_draws(group, "governor_keyed", "hot", &[0], |k| {
                let _ = black_box(governor.check_key(&k));
            });
        }
        drop(governor);
        let limiter = filled(rt, keys, lease);
        let denied = AtomicU64::new(0);
        let leases = limiter.stats().leases;
        for (law, keys) in &sequences {
            bench_draws(
                group,
                "hybrid_keyed",
                &format!("{id}-{law}"),
                keys,
                hybrid_op(&limiter, &denied),
            );
        }
        if id == "1k" {
            bench_draws(
                group,
                "hybrid_keyed",
                "hot",
                &[0],
                hybrid_op(&limiter, &denied),
            );
        }
        eprintln!(
            "keyed/hybrid_keyed/{id}-*: {} denied, {} leases during the cases, {} live keys",
            denied.load(Ordering::Relaxed),
            limiter.stats().leases - leases,
            limiter.live_keys(),
        );
    }
}

/// Keys created per timed batch in `new-key`.
const BATCH: u64 = 1_024;

/// The `new-key` cases: a miss that creates a key.
fn new_keys(group: &mut Group<'_>, rt: &tokio::runtime::Runtime) {
    group.bench_function(BenchmarkId::new("governor_keyed", "new-key"), |b| {
        b.iter_custom(|iters| {
            let governor: Governor =
                governor::RateLimiter::keyed(governor::Quota::per_second(NonZeroU32::MAX));
            let start = Instant::now();
            for key in 0..iters {
                let _ = black_box(governor.check_key(&key));
            }
            start.elapsed()
        })
    });
    group.bench_function(BenchmarkId::new("hybrid_keyed", "new-key"), |b| {
        b.iter_custom(|iters| {
            let limiter = KeyedHybridLimiter::builder("bench-new", unbounded_quota(), GrantAll)
                // The queue of first leases is a quarter of the cap long: room for a batch.
                .max_keys(iters.max(4 * BATCH) as usize)
                .idle_ttl(Duration::from_secs(3_600))
                .runtime(rt.handle().clone())
                .build()
                .expect("keyed limiter");
            let mut timed = Duration::ZERO;
            let mut key = 0;
            while key < iters {
                let end = (key + BATCH).min(iters);
                let start = Instant::now();
                for k in key..end {
                    let _ = black_box(limiter.try_acquire(&k, 1));
                }
                timed += start.elapsed();
                key = end;
                // Untimed: the worker leases for the batch, so the next one finds room in its
                // queue of first leases (a key refused there would not be created).
                while limiter.stats().leases < key {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
            let stats = limiter.stats();
            assert_eq!(stats.keys_created, iters, "{stats:?}");
            rt.block_on(limiter.shutdown());
            timed
        })
    });
}

pub fn benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("keyed");
    group.throughput(Throughput::Elements(1));
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

    live_keys(&mut group, &rt);
    new_keys(&mut group, &rt);
    group.finish();
    drop(rt);
}
