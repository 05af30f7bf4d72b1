//! Group `redis`: decisions against a real `redis-server` that the group starts for itself
//! (the integration tests' harness, `tests/support/mod.rs`), on a free loopback port.
//!
//! - `pure_redis/seq`: `RedisLimiter::acquire_now(1)` awaited one at a time — one EVALSHA round
//!   trip per decision.
//! - `hybrid_redis/seq`: `HybridLimiter::try_acquire(1)` one at a time on the bench thread, its
//!   leases coming from the same server.
//! - `pure_{fixed_window,sliding_window,leaky_bucket}/seq`: the same as `pure_redis/seq` under
//!   the other algorithms (their own scripts; a window of 10^12 tokens per second).
//! - `…/64tasks`: 64 tokio tasks deciding concurrently on a two-worker runtime; an iteration is
//!   one decision of the aggregate. Pure-Redis tasks share one multiplexed connection, so their
//!   round trips are pipelined. The hybrid limiter's background task runs on a runtime of its
//!   own, so that tasks that never yield (a hybrid decision never awaits) cannot starve it.
//!
//! If `redis-server` is not installed the group is skipped with a message: benchmarks are
//! optional tooling. (Tests never skip: they fail with the install step.)

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput};
use ratelease::{Algorithm, Decision, HybridLimiter, Quota, RedisLimiter, RedisStore};

use crate::common::{runtime, unbounded_quota, BENCH_LEASE};
use crate::support::{RedisServer, REDIS_SERVER_BIN_ENV};

/// Concurrent tasks in the `64tasks` cases.
const TASKS: u64 = 64;

/// A redis-server of its own and a criterion group `name` set up for round trips (~0.1 ms
/// each: fewer, longer samples keep a group to about a minute), or `None` (and why, printed)
/// if no redis-server can be run.
pub fn redis_group<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> Option<(RedisServer, BenchmarkGroup<'a, WallTime>)> {
    if !redis_server_available() {
        return None;
    }
    let server = RedisServer::start();
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(1));
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(5));
    Some((server, group))
}

/// Whether the `redis-server` the harness would start can be run; prints why not.
pub fn redis_server_available() -> bool {
    let bin = std::env::var(REDIS_SERVER_BIN_ENV)
        .ok()
        .filter(|bin| !bin.is_empty())
        .unwrap_or_else(|| "redis-server".to_string());
    match Command::new(&bin)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(status) if status.success() => true,
        outcome => {
            eprintln!(
                "SKIPPING the redis benchmarks: cannot run {bin:?} ({outcome:?}). Install it with \
                 `apt-get install redis-server` (scripts/test.sh does) or set {REDIS_SERVER_BIN_ENV}."
            );
            false
        }
    }
}

pub fn benches(c: &mut Criterion) {
    let Some((server, mut group)) = redis_group(c, "redis") else {
        return;
    };
    let url = server.url();
    let quota = unbounded_quota();

    // Pure-Redis mode: every decision is a store call, on the tasks' runtime.
    let tasks_rt = runtime(2);
    let pure = tasks_rt.block_on(async {
        let store = RedisStore::connect(url.clone()).await.expect("connect");
        Arc::new(RedisLimiter::new("bench-pure", quota, store).expect("pure limiter"))
    });
    pure_seq(&mut group, "pure_redis", &tasks_rt, &pure);
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::LeakyBucket,
    ] {
        let window = Quota::per_second(1_000_000_000_000).expect("valid benchmark quota");
        let limiter = tasks_rt.block_on(async {
            let store = RedisStore::connect(url.clone()).await.expect("connect");
            RedisLimiter::builder(format!("bench-{algorithm}"), window, store)
                .algorithm(algorithm)
                .build()
                .expect("pure limiter")
        });
        let id = format!("pure_{}", algorithm.name().replace('-', "_"));
        pure_seq(&mut group, &id, &tasks_rt, &limiter);
    }
    group.bench_function(BenchmarkId::new("pure_redis", "64tasks"), |b| {
        b.iter_custom(|iters| {
            let pure = pure.clone();
            let (elapsed, denied) = tasks_rt.block_on(on_tasks(iters, move || {
                let pure = pure.clone();
                async move {
                    let decision = pure.acquire_now(1).await.expect("redis decision");
                    decision.is_allowed()
                }
            }));
            assert_eq!(denied, 0, "the benchmark quota never binds");
            elapsed
        })
    });

    // Hybrid mode: leases from the same server; the background task and its connection live on
    // a one-worker runtime of their own.
    let bg_rt = runtime(1);
    let hybrid = bg_rt.block_on(async {
        let store = RedisStore::connect(url.clone()).await.expect("connect");
        let limiter = HybridLimiter::builder("bench-hybrid", quota, store)
            .lease_size(BENCH_LEASE)
            .build()
            .expect("hybrid limiter");
        limiter.acquire(1).await.expect("first lease");
        limiter
    });
    let leases_before = hybrid.stats().leases;
    let (calls, denied) = (AtomicU64::new(0), AtomicU64::new(0));
    group.bench_function(BenchmarkId::new("hybrid_redis", "seq"), |b| {
        b.iter_custom(|iters| {
            calls.fetch_add(iters, Ordering::Relaxed);
            let start = Instant::now();
            for _ in 0..iters {
                if !matches!(hybrid.try_acquire(1), Ok(Decision::Allowed)) {
                    denied.fetch_add(1, Ordering::Relaxed);
                }
            }
            start.elapsed()
        })
    });
    group.bench_function(BenchmarkId::new("hybrid_redis", "64tasks"), |b| {
        b.iter_custom(|iters| {
            calls.fetch_add(iters, Ordering::Relaxed);
            let hybrid = hybrid.clone();
            let (elapsed, denials) = tasks_rt.block_on(on_tasks(iters, move || {
                let decision = hybrid.try_acquire(1).expect("hybrid decision");
                std::future::ready(matches!(decision, Decision::Allowed))
            }));
            denied.fetch_add(denials, Ordering::Relaxed);
            elapsed
        })
    });
    let stats = hybrid.stats();
    // Proof that the cases measured what they claim (skipped when filtered out).
    let calls = calls.into_inner();
    if calls > 0 {
        eprintln!(
            "redis/hybrid_redis: {calls} calls, {} denied, {} leases ({} over limit, {} errors) \
             during the cases",
            denied.load(Ordering::Relaxed),
            stats.leases - leases_before,
            stats.over_limit,
            stats.store_errors
        );
    }
    group.finish();

    bg_rt.block_on(hybrid.shutdown());
    drop(hybrid);
    drop(bg_rt);
    drop(pure);
    drop(tasks_rt);
    drop(server);
}

/// Case `<id>/seq`: `limiter.acquire_now(1)` awaited one at a time on `rt`.
fn pure_seq(
    group: &mut BenchmarkGroup<'_, WallTime>,
    id: &str,
    rt: &tokio::runtime::Runtime,
    limiter: &RedisLimiter,
) {
    group.bench_function(BenchmarkId::new(id, "seq"), |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    let decision = limiter.acquire_now(1).await.expect("redis decision");
                    assert!(decision.is_allowed(), "the benchmark quota never binds");
                }
                start.elapsed()
            })
        })
    });
}

/// Runs `iters` decisions split over [`TASKS`] tasks; returns the wall time from before the
/// first spawn to the last task's end, and how many decisions were denied.
async fn on_tasks<D, F>(iters: u64, decide: D) -> (Duration, u64)
where
    D: Fn() -> F + Clone + Send + 'static,
    F: std::future::Future<Output = bool> + Send,
{
    let start = Instant::now();
    let handles: Vec<_> = (0..TASKS)
        .map(|task| {
            // The first `iters % TASKS` tasks take one extra decision.
            let mine = iters / TASKS + u64::from(task < iters % TASKS);
            let decide = decide.clone();
            tokio::spawn(async move {
                let mut denied = 0u64;
                for _ in 0..mine {
                    if !decide().await {
                        denied += 1;
                    }
                }
                denied
            })
        })
        .collect();
    let mut denied = 0;
    for handle in handles {
        denied += handle.await.expect("benchmark task panicked");
    }
    (start.elapsed(), denied)
}
