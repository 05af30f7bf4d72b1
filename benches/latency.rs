//! Latency of `HybridLimiter::try_acquire` across real refills from a real `redis-server`.
//!
//! ```text
//! cargo bench --bench latency                         # 2 000 refills of 10 000 tokens
//! LATENCY_REFILLS=5000 LATENCY_LEASE=100000 cargo bench --bench latency
//! ```
//!
//! One thread calls `try_acquire(1)` as fast as it can and times every call with two
//! `Instant::now()` reads; the limiter's background task leases from a `redis-server` started
//! for the run (the tests' harness), on a one-worker tokio runtime. The run stops after
//! `LATENCY_REFILLS` leases. It prints p50 / p90 / p99 / p99.9 / p99.99 / max, raw and minus
//! the median cost of the timer itself (measured first, the same way, around nothing), the
//! number of denials, and store calls per million admitted.
//!
//! Under `cargo test --all-targets` (no `--bench` argument) it does a short smoke run. Without
//! `redis-server` it says so and exits successfully: benchmarks are optional tooling.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ratelease::{Decision, HybridLimiter, Quota, RedisStore};

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "support/histogram.rs"]
mod histogram;
use histogram::Histogram;

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

fn redis_server_available() -> bool {
    let bin = std::env::var(support::REDIS_SERVER_BIN_ENV)
        .ok()
        .filter(|bin| !bin.is_empty())
        .unwrap_or_else(|| "redis-server".to_string());
    let ok = Command::new(&bin)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!(
            "SKIPPING the latency benchmark: cannot run {bin:?}. Install it with \
             `apt-get install redis-server` (scripts/test.sh does) or set {}.",
            support::REDIS_SERVER_BIN_ENV
        );
    }
    ok
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let refills = env_u64("LATENCY_REFILLS", if bench { 2_000 } else { 20 });
    let lease = env_u64("LATENCY_LEASE", 10_000);
    if !redis_server_available() {
        return;
    }
    let server = support::RedisServer::start();

    // A quota that never binds (10^12/s, burst 10^9): the run measures the limiter.
    let quota = Quota::per_second(1_000_000_000_000)
        .and_then(|q| q.with_burst(1_000_000_000))
        .expect("valid quota");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let limiter = rt.block_on(async {
        let store = RedisStore::connect(server.url()).await.expect("connect");
        let limiter = HybridLimiter::builder("latency", quota, store)
            .lease_size(lease)
            .build()
            .expect("limiter");
        limiter.acquire(1).await.expect("first lease");
        limiter
    });

    // The timer's own cost: the same two reads around nothing.
    let mut timer = Histogram::new();
    for _ in 0..1_000_000 {
        let t0 = Instant::now();
        let t1 = Instant::now();
        timer.record((t1 - t0).as_nanos() as u64);
    }
    let timer_p50 = timer.quantile(0.5);

    let mut hist = Histogram::new();
    let (mut admitted, mut denied) = (0u64, 0u64);
    let start_stats = limiter.stats();
    let started = Instant::now();
    'run: loop {
        for _ in 0..4_096 {
            let t0 = Instant::now();
            let decision = limiter.try_acquire(1);
            let t1 = Instant::now();
            hist.record((t1 - t0).as_nanos() as u64);
            match decision {
                Ok(Decision::Allowed) => admitted += 1,
                Ok(Decision::Denied { .. }) => denied += 1,
                Err(e) => panic!("try_acquire failed: {e}"),
            }
        }
        if limiter.stats().leases - start_stats.leases >= refills {
            break 'run;
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "no {refills} refills in 10 minutes"
        );
    }
    let elapsed = started.elapsed();
    let stats = limiter.stats();
    let leases = stats.leases - start_stats.leases;
    let store_calls = stats.store_calls() - start_stats.store_calls();

    println!("latency: try_acquire(1) on one thread, HybridLimiter on a real redis-server");
    println!(
        "  lease {lease} tokens, {leases} refills ({} over limit, {} errors), {:.2} s, {} calls",
        stats.over_limit - start_stats.over_limit,
        stats.store_errors - start_stats.store_errors,
        elapsed.as_secs_f64(),
        hist.count
    );
    println!(
        "  admitted {admitted}, denied {denied} ({:.4} %)",
        100.0 * denied as f64 / hist.count as f64
    );
    println!(
        "  store calls per 1 M admitted: {:.1}",
        store_calls as f64 * 1e6 / admitted.max(1) as f64
    );
    println!(
        "  timer (Instant::now() pair) overhead: p50 {} ns, p99 {} ns, max {} ns",
        timer_p50,
        timer.quantile(0.99),
        timer.max()
    );
    println!(
        "  calls of 1 µs or more: {} (one refill request, which wakes the background task, \
         per {lease} tokens: {leases} in the run)",
        hist.at_least(1_000)
    );
    println!("  {:>8} {:>10} {:>16}", "", "raw ns", "minus timer ns");
    for (label, q) in [
        ("p50", 0.5),
        ("p90", 0.9),
        ("p99", 0.99),
        ("p99.9", 0.999),
        ("p99.99", 0.9999),
        ("max", 1.0),
    ] {
        let raw = hist.quantile(q);
        println!(
            "  {label:>8} {raw:>10} {:>16}",
            raw.saturating_sub(timer_p50)
        );
    }

    rt.block_on(limiter.shutdown());
    drop(limiter);
    drop(rt);
    drop(server);
}
