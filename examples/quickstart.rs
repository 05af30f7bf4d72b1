//! Quick start: one limit shared by every process that uses the same Redis key.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example quickstart
//! ```
//!
//! Without `REDIS_URL` it runs on the in-process `MemoryStore`, so it works anywhere.

use std::time::{Duration, Instant};

use ratelease::{Decision, HybridLimiter, LeaseStore, MemoryStore, Quota, RedisStore};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 1 000 requests per second across the fleet, bursts of up to 100.
    let quota = Quota::per_second(1_000)?.with_burst(100)?;
    match std::env::var("REDIS_URL") {
        Ok(url) => {
            println!("using Redis at {url}");
            run(quota, RedisStore::connect(url).await?).await
        }
        Err(_) => {
            println!("REDIS_URL not set: using the in-process MemoryStore");
            run(quota, MemoryStore::new()).await
        }
    }
}

async fn run<S: LeaseStore>(quota: Quota, store: S) -> Result<(), Box<dyn std::error::Error>> {
    // The default policy (AdaptiveLease) sizes leases to this process's demand.
    let limiter = HybridLimiter::new("quickstart", quota, store)?;
    // A warm start: the first lease is in before the first check.
    limiter.ready().await?;

    // The hot path: a synchronous check against the local bucket.
    let start = Instant::now();
    let (mut allowed, mut denied) = (0u64, 0u64);
    while start.elapsed() < Duration::from_secs(1) {
        match limiter.try_acquire(1)? {
            Decision::Allowed => allowed += 1,
            Decision::Denied { retry_after } => {
                denied += 1;
                tokio::time::sleep(retry_after.min(Duration::from_millis(5))).await;
            }
        }
    }
    let stats = limiter.stats();
    println!(
        "1 s: {allowed} allowed, {denied} denied, {} store calls ({} tokens leased)",
        stats.store_calls(),
        stats.tokens_leased
    );

    // Waiting for a permit instead of being turned away.
    limiter.acquire(5).await?;
    println!("acquired 5 more after waiting");

    // Give unspent tokens back to the fleet.
    limiter.shutdown().await;
    Ok(())
}
