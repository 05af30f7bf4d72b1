//! Prometheus metrics: a hybrid and a pure-Redis limiter report through the `metrics` facade;
//! `metrics-exporter-prometheus` renders the text exposition that a `/metrics` endpoint would
//! serve.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example prometheus
//! ```
//!
//! Without `REDIS_URL` it runs on the in-process `MemoryStore`, so it works anywhere. The
//! exporter is used without its HTTP listener: serve `handle.render()` from your own web
//! framework's `/metrics` route (or enable the exporter's `http-listener` feature).

use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use ratelease::telemetry::{LEASE_DURATION, LEASE_SIZE, PUBLISH_INTERVAL};
use ratelease::{HybridLimiter, LeaseStore, MemoryStore, Quota, RedisLimiter, RedisStore};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Install the recorder before building limiters: they register their handles at build.
    // With buckets set, the two histograms render as Prometheus histograms (else summaries).
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(LEASE_DURATION.to_owned()),
            &[
                0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05,
            ],
        )?
        .set_buckets_for_metric(
            Matcher::Full(LEASE_SIZE.to_owned()),
            &[1.0, 10.0, 100.0, 1_000.0, 10_000.0],
        )?
        .install_recorder()?;

    match std::env::var("REDIS_URL") {
        Ok(url) => {
            println!("# using Redis at {url}");
            run(RedisStore::connect(url).await?).await?;
        }
        Err(_) => {
            println!("# REDIS_URL not set: using the in-process MemoryStore");
            run(MemoryStore::new()).await?;
        }
    }
    // What a scrape of `/metrics` returns.
    println!("{}", handle.render());
    Ok(())
}

async fn run<S: LeaseStore + Clone>(store: S) -> Result<(), Box<dyn std::error::Error>> {
    let quota = Quota::per_second(1_000)?.with_burst(100)?;
    let hybrid = HybridLimiter::new("prometheus-hybrid", quota, store.clone())?;
    let pure = RedisLimiter::new("prometheus-pure", Quota::per_second(50)?, store)?;

    // Half a second of demand above both limits: some admitted, some denied.
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(500) {
        for _ in 0..10 {
            let _ = hybrid.try_acquire(1)?;
        }
        let _ = pure.acquire_now(1).await?;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // The hybrid limiter's background task publishes what its callers did within
    // PUBLISH_INTERVAL; shutting down publishes the final totals at once.
    println!("# hybrid limiter metrics lag by at most {PUBLISH_INTERVAL:?} while it is active");
    hybrid.shutdown().await;
    Ok(())
}
