//! Group `keyed`: one decision on a random key.
//!
//! Only the baseline `governor_keyed/1m` is here. `hybrid_keyed/1k` and `hybrid_keyed/1m` need
//! `KeyedHybridLimiter` (issue 7), which does not exist yet; BENCHMARKS.md lists them as not
//! yet measurable.

use std::num::NonZeroU32;

use criterion::{BenchmarkId, Criterion, Throughput};

use crate::common::is_bench_run;

/// Distinct keys in the `1m` cases.
const KEYS_1M: u64 = 1_000_000;

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
    // The key is drawn inside the measured loop (wyrand: about a nanosecond), as a server would
    // see it, rather than walking a precomputed table.
    let mut rng = fastrand::Rng::with_seed(5);
    group.bench_function(BenchmarkId::new("governor_keyed", "1m"), |b| {
        b.iter(|| {
            let key = rng.u64(0..KEYS_1M);
            governor.check_key(&key)
        })
    });
    group.finish();
}
