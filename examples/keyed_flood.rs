//! A flood of unique keys against a `KeyedHybridLimiter` with a cap: memory stays bounded.
//!
//! ```sh
//! cargo run --release --example keyed_flood                  # 10 M keys, cap 100 000
//! cargo run --release --example keyed_flood -- 1000000 10000 # keys, cap
//! ```
//!
//! Two threads call `try_acquire` with a new `String` key each time (`flood-<n>`, never
//! reused: the flood never comes back for its tokens) while a third keeps using one
//! legitimate key. The store is an in-process `MemoryStore` whose buckets refill in a
//! microsecond, so they expire at once and only the limiter's own memory is measured. Resident
//! memory (`VmRSS`, `VmHWM` from `/proc/self/status`) is read before the flood, when the live
//! keys first reach the cap, once two caps' worth of keys have been created (the map has
//! churned through its whole cap at least once), and at the end. The run fails if the live keys ever
//! exceed the cap, if the cap is never reached, or if memory grows past the bound derived
//! from the cap. (Resident memory climbs to about twice its size at the cap while the map's
//! tables double under churn and the allocator settles, then stays: see RELIABILITY.md.)
//! `tests/keyed_flood.rs` runs a smaller flood through the same code.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelease::{KeyedHybridLimiter, KeyedStats, MemoryStore, Quota};

/// Bytes of one key's state (`KeyState`, see `src/keyed/state.rs`).
const STATE_BYTES: usize = 48;
/// Flooding threads.
const THREADS: u64 = 2;

/// What a flood did.
#[derive(Debug)]
pub struct FloodReport {
    /// Unique keys offered.
    pub keys: u64,
    /// The cap.
    pub cap: usize,
    /// Wall time of the flood.
    pub elapsed: Duration,
    /// Most live keys seen.
    pub max_live: usize,
    /// `VmRSS` before the flood, KiB.
    pub rss_before_kib: u64,
    /// `VmRSS` when the live keys first reached the cap, KiB (0 if they never did).
    pub rss_at_cap_kib: u64,
    /// `VmRSS` once `2 × cap` keys were created, KiB (0 if never).
    pub rss_churned_kib: u64,
    /// `VmRSS` at the end, KiB.
    pub rss_after_kib: u64,
    /// `VmHWM` (peak) at the end, KiB.
    pub hwm_kib: u64,
    /// Budget per live key, bytes: its map entry (key + 48-byte state + control byte) at the
    /// map's lowest load factor (7/16, right after a shard's table doubles) is 167 bytes for a
    /// `String` key; twice that while a doubled table's old copy is still resident in the
    /// allocator; the key's heap block (32 bytes) in the map and in a queued request; the
    /// store's bucket for a key just leased; rounded up to 1 KiB for allocator slack.
    pub per_key_bytes: u64,
    /// The bound on growth (`VmHWM − VmRSS before`), KiB: the cap times the per-key budget,
    /// plus 16 MiB for the runtime, the bounded queue and the store's unswept buckets.
    pub bound_kib: u64,
    /// Calls on the legitimate key, and how many were allowed.
    pub legit: (u64, u64),
    /// The limiter's counters at the end.
    pub stats: KeyedStats,
}

/// A field of `/proc/self/status`, in KiB (0 where unavailable).
pub fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Floods a keyed limiter capped at `cap` with `keys` unique keys.
pub fn flood(keys: u64, cap: usize) -> FloodReport {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    // A flood key's bucket is full again a microsecond after its one-token lease, so the
    // store forgets it at once; the legitimate key can lease batches.
    let quota = Quota::per_second(1_000_000).unwrap();
    let store = MemoryStore::new();
    let limiter = KeyedHybridLimiter::<String, _>::builder("flood", quota, store.clone())
        .max_keys(cap)
        .runtime(rt.handle().clone())
        .build()
        .unwrap();
    rt.block_on(limiter.acquire("legit", 1)).unwrap();
    let rss_before_kib = status_kib("VmRSS");

    let next = Arc::new(AtomicU64::new(0));
    let max_live = Arc::new(AtomicUsize::new(0));
    let rss_at_cap = Arc::new(AtomicU64::new(0));
    let rss_churned = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let legit = {
        let (limiter, stop) = (limiter.clone(), stop.clone());
        std::thread::spawn(move || {
            let (mut calls, mut allowed) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                calls += 1;
                allowed += u64::from(limiter.try_acquire("legit", 1).unwrap().is_allowed());
                std::thread::sleep(Duration::from_micros(50));
            }
            (calls, allowed)
        })
    };
    let flooders: Vec<_> = (0..THREADS)
        .map(|_| {
            let (limiter, next) = (limiter.clone(), next.clone());
            let (max_live, rss_at_cap) = (max_live.clone(), rss_at_cap.clone());
            let rss_churned = rss_churned.clone();
            std::thread::spawn(move || loop {
                let start = next.fetch_add(4_096, Ordering::Relaxed);
                if start >= keys {
                    return;
                }
                for n in start..(start + 4_096).min(keys) {
                    let _ = limiter.try_acquire(&format!("flood-{n}"), 1).unwrap();
                }
                let live = limiter.live_keys();
                assert!(live <= cap, "{live} live keys, cap {cap}");
                max_live.fetch_max(live, Ordering::Relaxed);
                if live == cap && rss_at_cap.load(Ordering::Relaxed) == 0 {
                    rss_at_cap.store(status_kib("VmRSS"), Ordering::Relaxed);
                }
                let created = limiter.stats().keys_created;
                // Two caps: enough to churn through the whole cap once even on a busy machine,
                // where the first-lease queue turns most new keys away (a CI run under load
                // created 3.75 caps' worth from a million-key flood).
                if created >= 2 * cap as u64 && rss_churned.load(Ordering::Relaxed) == 0 {
                    rss_churned.store(status_kib("VmRSS"), Ordering::Relaxed);
                }
            })
        })
        .collect();
    for f in flooders {
        f.join().unwrap();
    }
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let legit = legit.join().unwrap();
    // Let the worker finish what is queued.
    std::thread::sleep(Duration::from_millis(200));
    let entry = (std::mem::size_of::<String>() + STATE_BYTES + 1) * 16 / 7;
    let per_key_bytes = (2 * entry + 2 * 32).next_multiple_of(1024) as u64;
    let report = FloodReport {
        keys,
        cap,
        elapsed,
        max_live: max_live.load(Ordering::Relaxed),
        rss_before_kib,
        rss_at_cap_kib: rss_at_cap.load(Ordering::Relaxed),
        rss_churned_kib: rss_churned.load(Ordering::Relaxed),
        rss_after_kib: status_kib("VmRSS"),
        hwm_kib: status_kib("VmHWM"),
        per_key_bytes,
        bound_kib: cap as u64 * per_key_bytes / 1024 + 16 * 1024,
        legit,
        stats: limiter.stats(),
    };
    rt.block_on(limiter.shutdown());
    report
}

/// Panics unless the flood kept the cap and the memory bound.
pub fn check(r: &FloodReport) {
    assert!(r.max_live <= r.cap, "{r:#?}");
    assert!(
        r.stats.keys_created > r.cap as u64 && r.stats.evicted_at_cap > 0,
        "the cap was never reached: {r:#?}"
    );
    let growth = r.hwm_kib.saturating_sub(r.rss_before_kib);
    assert!(growth <= r.bound_kib, "grew {growth} KiB: {r:#?}");
    assert!(r.rss_at_cap_kib > 0, "the cap was never reached: {r:#?}");
    // The legitimate key kept being served: its refills have a queue of their own, and keys
    // never admitted are evicted before it.
    let (calls, allowed) = r.legit;
    assert!(
        allowed * 100 >= calls * 95,
        "legitimate key: {allowed} of {calls}"
    );
}

fn main() {
    let mut args = std::env::args().skip(1);
    let keys = args.next().map_or(10_000_000, |a| a.parse().unwrap());
    let cap = args.next().map_or(100_000, |a| a.parse().unwrap());
    let r = flood(keys, cap);
    println!("{r:#?}");
    println!(
        "{} keys in {:.1} s ({:.0} k/s), {} created; RSS {} → {} KiB (at cap {}, after 2 caps {}), peak {} KiB; growth {} KiB, bound {} KiB",
        r.keys,
        r.elapsed.as_secs_f64(),
        r.keys as f64 / r.elapsed.as_secs_f64() / 1e3,
        r.stats.keys_created,
        r.rss_before_kib,
        r.rss_after_kib,
        r.rss_at_cap_kib,
        r.rss_churned_kib,
        r.hwm_kib,
        r.hwm_kib.saturating_sub(r.rss_before_kib),
        r.bound_kib,
    );
    check(&r);
}
