//! Group `concurrency`: a concurrency permit taken and dropped, against a real `redis-server`
//! the group starts for itself.
//!
//! - `pure_redis/acquire_drop`: `ConcurrencyLimiter::acquire_now(1)` in pure mode, awaited, then
//!   the permit dropped — one EVALSHA round trip per permit, plus the releases the background
//!   task sends (one per batch of drops, on the same runtime).
//! - `hybrid_redis/acquire_drop`: `try_acquire(1)` in hybrid mode (a lease of 64 slots from
//!   the same server), then the drop back into the local pool; the background task lives on a
//!   runtime of its own.
//!
//! The limit (10^6) never binds: the cases measure the limiter, not the limit. Skipped with a
//! message when `redis-server` is not installed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use criterion::{BenchmarkId, Criterion};
use ratelease::{ConcurrencyLimiter, RedisStore};

use crate::common::runtime;
use crate::redis::redis_group;

/// A limit that never binds.
const LIMIT: u64 = 1_000_000;
/// Slots per hybrid lease.
const BATCH: u64 = 64;

pub fn benches(c: &mut Criterion) {
    let Some((server, mut group)) = redis_group(c, "concurrency") else {
        return;
    };
    let url = server.url();

    let tasks_rt = runtime(2);
    let pure = tasks_rt.block_on(async {
        let store = RedisStore::connect(url.clone()).await.expect("connect");
        ConcurrencyLimiter::builder("bench-conc-pure", LIMIT, store)
            .build()
            .expect("pure limiter")
    });
    group.bench_function(BenchmarkId::new("pure_redis", "acquire_drop"), |b| {
        b.iter_custom(|iters| {
            tasks_rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    let permit = pure.acquire_now(1).await.expect("store call");
                    drop(permit.expect("the limit never binds"));
                }
                start.elapsed()
            })
        })
    });

    let bg_rt = runtime(1);
    let hybrid = bg_rt.block_on(async {
        let store = RedisStore::connect(url.clone()).await.expect("connect");
        let limiter = ConcurrencyLimiter::builder("bench-conc-hybrid", LIMIT, store)
            .hybrid(BATCH)
            .build()
            .expect("hybrid limiter");
        drop(limiter.acquire(1).await.expect("first lease"));
        limiter
    });
    let calls_before = hybrid.stats().store_calls();
    let (permits, refused) = (AtomicU64::new(0), AtomicU64::new(0));
    group.bench_function(BenchmarkId::new("hybrid_redis", "acquire_drop"), |b| {
        b.iter_custom(|iters| {
            permits.fetch_add(iters, Ordering::Relaxed);
            let start = Instant::now();
            for _ in 0..iters {
                match hybrid.try_acquire(1).expect("hybrid permit") {
                    Some(permit) => drop(permit),
                    None => {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            start.elapsed()
        })
    });
    // Proof that the case measured what it claims (skipped when filtered out).
    let permits = permits.into_inner();
    if permits > 0 {
        eprintln!(
            "concurrency/hybrid_redis: {permits} permits, {} refused, {} store calls during \
             the case; pure: {:?}",
            refused.load(Ordering::Relaxed),
            hybrid.stats().store_calls() - calls_before,
            pure.stats()
        );
    }
    group.finish();

    bg_rt.block_on(hybrid.shutdown());
    tasks_rt.block_on(pure.shutdown());
    drop((hybrid, bg_rt, pure, tasks_rt, server));
}
