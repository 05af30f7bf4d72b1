//! Bytes per live key of a keyed limiter, measured with a byte-counting global allocator (not
//! estimated): ratelease's `KeyedHybridLimiter` next to governor's keyed limiter (its default
//! `DashMap` state store), for `u64` keys at 100 000, 1 000 000 and 10 000 000 keys and
//! `IpAddr` keys at the first two; ratelease with its cap (`max_keys`) at the key count, which
//! its map is sized for, and at 1.5 times it (the tables part-grown).
//!
//! ```sh
//! cargo bench --bench key_memory
//! ```
//!
//! Under `cargo test --all-targets` it makes a smoke run at 10 000 keys.
//!
//! Not criterion: memory is a count, not a time, and one pass gives it exactly. The store is a
//! test store that grants every lease and keeps nothing, so only the process's own map is
//! counted (with Redis the buckets live in Redis). Keys are created the way a server meets
//! them: the first `try_acquire` of each key; the count is taken once every key holds a lease.

use std::hash::Hash;
use std::net::{IpAddr, Ipv4Addr};
use std::num::NonZeroU32;
use std::time::Duration;

use ratelease::{KeyedHybridLimiter, Quota};

#[path = "support/grant_all.rs"]
mod grant_all;
use grant_all::GrantAll;

#[path = "support/live_bytes.rs"]
mod live_bytes;
use live_bytes::live;

fn quota() -> Quota {
    Quota::per_second(1_000)
        .and_then(|q| q.with_burst(1_000))
        .expect("valid quota")
}

/// Bytes per key of ratelease's keyed hybrid limiter holding `keys` live keys, with a cap of
/// `max_keys`.
fn ratelease_bytes<K>(rt: &tokio::runtime::Runtime, keys: &[K], max_keys: usize) -> f64
where
    K: Hash + Eq + Clone + std::fmt::Display + Send + Sync + 'static,
{
    let before = live();
    let limiter = KeyedHybridLimiter::<K, GrantAll>::builder("memory", quota(), GrantAll)
        .max_keys(max_keys)
        .idle_ttl(Duration::from_secs(3_600))
        .give_back_after(Duration::from_secs(3_600))
        .runtime(rt.handle().clone())
        .build()
        .expect("keyed limiter");
    rt.block_on(async {
        // A new key whose lease cannot be queued (the worker's queue is bounded) is refused
        // and not kept: ask again until every key is live.
        for _ in 0..1_000 {
            for chunk in keys.chunks(1_024) {
                for key in chunk {
                    let _ = limiter.try_acquire(key, 1);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            if limiter.stats().live_keys >= keys.len() as u64 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    });
    let stats = limiter.stats();
    assert_eq!(stats.live_keys, keys.len() as u64, "{stats:?}");
    let bytes = (live() - before) as f64 / keys.len() as f64;
    // Gone before the next count starts: the worker holds the map until it ends.
    rt.block_on(async {
        limiter.shutdown().await;
        drop(limiter);
        tokio::time::sleep(Duration::from_millis(200)).await;
    });
    bytes
}

/// Bytes per key of governor's keyed limiter (default `DashMap` store) holding `keys` keys.
fn governor_bytes<K: Hash + Eq + Clone>(keys: &[K]) -> f64 {
    let before = live();
    let limiter = governor::RateLimiter::<K, _, _>::keyed(governor::Quota::per_second(
        NonZeroU32::new(1_000).expect("non-zero"),
    ));
    for key in keys {
        let _ = limiter.check_key(key);
    }
    assert_eq!(limiter.len(), keys.len());
    let bytes = (live() - before) as f64 / keys.len() as f64;
    drop(limiter);
    bytes
}

fn main() {
    // `cargo bench` passes `--bench`; under `cargo test --all-targets` (no `--bench`) this is
    // a smoke run with a few keys, which still checks every count.
    let bench = std::env::args().any(|a| a == "--bench");
    let sizes: &[usize] = if bench {
        &[100_000, 1_000_000, 10_000_000]
    } else {
        &[10_000]
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    println!(
        "| keys | key type | cap (`max_keys`) | ratelease keyed hybrid, bytes/key | governor \
         keyed, bytes/key | ratio |"
    );
    println!("| ---: | --- | ---: | ---: | ---: | ---: |");
    for &n in sizes {
        let ints: Vec<u64> = (0..n as u64)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect();
        let ips: Vec<IpAddr> = (0..n as u32)
            .map(|i| IpAddr::V4(Ipv4Addr::from(i.wrapping_mul(2_654_435_761))))
            .collect();
        let g = governor_bytes(&ints);
        // At the cap (the map is sized for it), and at two thirds of it (tables part-grown:
        // near the worst case of a power-of-two table).
        for cap in [n, n * 3 / 2] {
            let r = ratelease_bytes(&rt, &ints, cap);
            println!("| {n} | u64 | {cap} | {r:.1} | {g:.1} | {:.2}× |", r / g);
        }
        drop(ints);
        if n > 1_000_000 {
            continue; // IpAddr at 10M: the u64 rows show the scaling
        }
        let (r, g) = (ratelease_bytes(&rt, &ips, n), governor_bytes(&ips));
        println!("| {n} | IpAddr | {n} | {r:.1} | {g:.1} | {:.2}× |", r / g);
    }
}
