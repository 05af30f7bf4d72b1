//! Group `hot_path`: one decision with tokens at hand, on one thread and on two threads sharing
//! one limiter.
//!
//! - `atomic_fetch_sub`: `AtomicI64::fetch_sub` on one cache-padded word — the physical limit
//!   of any shared counter.
//! - `governor_check`: governor's direct (unkeyed) GCRA limiter with a quota that never binds.
//! - `hybrid_try_acquire`: `HybridLimiter::try_acquire(1)` on a [`MemoryStore`], with a quota
//!   that never binds and large leases. Its background task runs on a one-worker multi-thread
//!   runtime kept alive for the whole group, and refills really happen during the measurement
//!   (the number of leases is printed after each case).

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Instant;

use criterion::{BenchmarkId, Criterion, Throughput};
use ratelease::{Decision, HybridLimiter, MemoryStore};

use crate::common::{on_threads, runtime, unbounded_quota, BENCH_LEASE};

/// Keeps the benchmarked counter on cache lines of its own.
#[repr(align(128))]
struct Padded<T>(T);

pub fn benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("hot_path");

    // The physical limit: one atomic RMW.
    let counter = Padded(AtomicI64::new(i64::MAX));
    group.throughput(Throughput::Elements(1));
    group.bench_function(BenchmarkId::new("atomic_fetch_sub", 1), |b| {
        b.iter(|| counter.0.fetch_sub(1, Ordering::SeqCst))
    });
    group.throughput(Throughput::Elements(2));
    group.bench_function(BenchmarkId::new("atomic_fetch_sub", 2), |b| {
        b.iter_custom(|iters| {
            on_threads(2, iters, |_| {
                black_box(counter.0.fetch_sub(1, Ordering::SeqCst));
            })
        })
    });

    // governor: a quota of u32::MAX per second (and as much burst) never denies here.
    let governor = governor::RateLimiter::direct(governor::Quota::per_second(NonZeroU32::MAX));
    group.throughput(Throughput::Elements(1));
    group.bench_function(BenchmarkId::new("governor_check", 1), |b| {
        b.iter(|| governor.check())
    });
    group.throughput(Throughput::Elements(2));
    group.bench_function(BenchmarkId::new("governor_check", 2), |b| {
        b.iter_custom(|iters| {
            on_threads(2, iters, |_| {
                let _ = black_box(governor.check());
            })
        })
    });

    // ratelease's hybrid limiter on the in-process store.
    let rt = runtime(1);
    let limiter = HybridLimiter::builder("bench-hot-path", unbounded_quota(), MemoryStore::new())
        .lease_size(BENCH_LEASE)
        .runtime(rt.handle().clone())
        .build()
        .expect("hybrid limiter");
    rt.block_on(limiter.acquire(1)).expect("first lease");
    for threads in [1, 2] {
        let calls = AtomicU64::new(0);
        let denied = AtomicU64::new(0);
        let leases_before = limiter.stats().leases;
        group.throughput(Throughput::Elements(threads));
        group.bench_function(BenchmarkId::new("hybrid_try_acquire", threads), |b| {
            b.iter_custom(|iters| {
                calls.fetch_add(iters * threads, Ordering::Relaxed);
                if threads == 1 {
                    let start = Instant::now();
                    for _ in 0..iters {
                        if !matches!(limiter.try_acquire(1), Ok(Decision::Allowed)) {
                            denied.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    start.elapsed()
                } else {
                    on_threads(threads as usize, iters, |_| {
                        if !matches!(limiter.try_acquire(1), Ok(Decision::Allowed)) {
                            denied.fetch_add(1, Ordering::Relaxed);
                        }
                    })
                }
            })
        });
        // Proof that the case measured what it claims (skipped when filtered out).
        let calls = calls.into_inner();
        if calls > 0 {
            eprintln!(
                "hot_path/hybrid_try_acquire/{threads}: {calls} calls, {} denied, {} leases \
                 during the case",
                denied.load(Ordering::Relaxed),
                limiter.stats().leases - leases_before,
            );
        }
    }
    group.finish();
    drop(limiter);
    drop(rt);
}
