//! Helpers shared by the benchmark groups.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use ratelease::Quota;

/// A quota that never binds during a benchmark: 10^12 tokens/s with a burst of 10^9
/// (`burst × scale = 10^9 × 1 ≤ 2^52`, see [`Quota`]). The shared bucket refills a 10^7 lease
/// in 10 µs, so the benchmarks measure the limiter, not the limit.
pub fn unbounded_quota() -> Quota {
    Quota::per_second(1_000_000_000_000)
        .and_then(|q| q.with_burst(1_000_000_000))
        .expect("valid benchmark quota")
}

/// Tokens per lease in the hybrid benchmarks: at ~10^8 decisions/s a lease lasts ~0.1 s, so a
/// 5 s measurement sees dozens of refills, while the refill path stays off the measured mean.
pub const BENCH_LEASE: u64 = 10_000_000;

/// A multi-thread tokio runtime with `workers` threads and the timer enabled, for limiters'
/// background tasks and Redis connections.
pub fn runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Runs `op` `iters` times on each of `threads` fresh threads started together, and returns the
/// wall time from the first thread's start to the last thread's end.
///
/// Each thread reads the clock itself right after a common barrier and right after its loop,
/// so neither spawning nor the main thread's wake-up and joins are measured (with a clock read
/// on the main thread, short samples would look faster than they are: the workers can be done
/// before the main thread has even woken from the barrier). `op` gets the iteration number.
pub fn on_threads(threads: usize, iters: u64, op: impl Fn(u64) + Sync) -> Duration {
    let barrier = Barrier::new(threads);
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    let start = Instant::now();
                    for i in 0..iters {
                        op(i);
                    }
                    (start, Instant::now())
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("benchmark thread panicked"))
            .collect()
    });
    let first_start = spans
        .iter()
        .map(|s| s.0)
        .min()
        .expect("at least one thread");
    let last_end = spans
        .iter()
        .map(|s| s.1)
        .max()
        .expect("at least one thread");
    last_end - first_start
}

/// Whether criterion was started by `cargo bench` (as opposed to the one-shot smoke run of
/// `cargo test --all-targets`), to skip set-up that only matters for real measurements.
pub fn is_bench_run() -> bool {
    std::env::args().any(|arg| arg == "--bench")
}
