//! Criterion benchmarks for ratelease's hot path, against the physical limit (a raw atomic),
//! against governor (the usual local limiter) and against pure-Redis mode.
//!
//! ```text
//! cargo bench --bench ratelease                 # everything (the redis group needs redis-server)
//! cargo bench --bench ratelease -- hot_path     # one group
//! cargo bench --bench latency                   # p50/p99/p99.9/max of try_acquire over real refills
//! ```
//!
//! Results land in `target/criterion/<group>/<id>/`; the ids are fixed by issue 5 so runs can be
//! compared: `hot_path/{atomic_fetch_sub,governor_check,hybrid_try_acquire}/{1,2}`,
//! `keyed/{governor,hybrid}_keyed/{1k,1m,10m}-{uniform,zipf}` (issue 15; they replace issue 5's
//! `keyed/governor_keyed/1m` and `keyed/hybrid_keyed/{1k,1m}`),
//! `redis/{pure_redis,hybrid_redis}/{seq,64tasks}`,
//! `concurrency/{pure_redis,hybrid_redis}/acquire_drop`; besides those,
//! `keyed/hybrid_try_acquire/1` and `keyed/{governor,hybrid}_keyed/{hot,new-key}`.
//!
//! Multi-threaded cases use `iter_custom`: each worker thread does `iters` operations, and an
//! iteration is one operation *per thread*, so `Throughput::Elements(threads)` makes criterion
//! report aggregate throughput. The threads time themselves from a common barrier, so starting
//! and joining them is not measured (see `common::on_threads`).
//!
//! Under `cargo test --all-targets` criterion runs every case once, as a smoke test.
//!
//! See `BENCHMARKS.md` for the machine, the numbers and the ratios.

use criterion::{criterion_group, criterion_main};

#[path = "../../tests/support/mod.rs"]
mod support;

#[path = "../support/grant_all.rs"]
mod grant_all;

mod common;
mod concurrency;
mod hot_path;
mod keyed;
mod redis;

criterion_group!(
    benches,
    hot_path::benches,
    keyed::benches,
    redis::benches,
    concurrency::benches
);
criterion_main!(benches);
