//! Caller latency while the worker sweeps idle keys away: a million keys go idle at once, and
//! a thread calling `try_acquire` on 1 024 keys in use (spread over the same shards) times
//! every call before, during and after the sweep that evicts them. The "during" phase runs
//! from the keys' expiry to the last eviction, so it also holds up to a second of calls
//! before the sweep comes round: read its max and its count of calls over 10 µs, which that
//! does not dilute, beside its percentiles. Also the evictions' own cost per key.
//!
//! ```sh
//! cargo bench --bench sweep
//! SWEEP_ACTIVE=9000 cargo bench --bench sweep   # ~30 keys left per shard: each shrink moves them
//! ```
//!
//! **The worst window.** "During" runs from the keys' expiry, and the sweep that finds them
//! comes up to a second later, so the phase's percentiles mix calls that met the sweep with
//! calls that did not. The phase is therefore also cut into 100 ms windows (from the expiry),
//! each with its own histogram, and the worst window's p99.9 is printed: the window the sweep's
//! scan and evictions fell in cannot be diluted by the rest of the phase.
//!
//! **Shrinking.** After evicting, the sweep shrinks the map's shards that fell below a quarter
//! full and hold at most 32 entries (`src/keyed/map.rs`), moving those entries under the
//! shard's lock. With the default 1 024 keys in use a shard keeps about three; `SWEEP_ACTIVE`
//! sets the keys in use: with 9 000 beside the million idle ones, each of the 308 shards keeps
//! about 30, near the most one shrink moves, and the caller's keys are in those shards.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use ratelease::{Decision, KeyedHybridLimiter, Quota};

#[path = "support/grant_all.rs"]
mod grant_all;
#[path = "support/histogram.rs"]
mod histogram;
use grant_all::GrantAll;
use histogram::Histogram;

/// Keys in use throughout, timed by the caller thread (`SWEEP_ACTIVE` to change it).
const ACTIVE: u64 = 1_024;
/// The length of the windows the sweep phase is also cut into.
const WINDOW: Duration = Duration::from_millis(100);
/// Windows kept (the phase is about a second; later calls go to the last window).
const WINDOWS: usize = 40;
/// One row of the results table for a phase's latencies.
fn row(h: &mut Histogram, phase: &str) -> String {
    if h.count == 0 {
        return format!("| {phase} | 0 | | | | | | |");
    }
    let q = [0.5, 0.99, 0.999, 0.9999].map(|q| h.quantile(q));
    let (max, long) = (h.max(), h.at_least(10_000));
    format!(
        "| {phase} | {} | {} | {} | {} | {} | {max} | {long} |",
        h.count, q[0], q[1], q[2], q[3],
    )
}

fn quota() -> Quota {
    Quota::per_second(1_000_000_000_000)
        .and_then(|q| q.with_burst(1_000_000_000))
        .expect("valid quota")
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let (idle_keys, ttl) = if bench {
        (1_000_000u64, Duration::from_secs(20))
    } else {
        (10_000, Duration::from_secs(2))
    };
    let active: u64 = std::env::var("SWEEP_ACTIVE").ok().map_or(ACTIVE, |v| {
        v.parse().expect("SWEEP_ACTIVE: a number of keys")
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let limiter = KeyedHybridLimiter::<u64, GrantAll>::builder("sweep", quota(), GrantAll)
        .max_keys((idle_keys + active) as usize)
        .lease_size(10_000_000)
        .idle_ttl(ttl)
        .give_back_after(Duration::from_secs(3_600))
        .runtime(rt.handle().clone())
        .build()
        .expect("keyed limiter");
    let total = idle_keys + active;
    rt.block_on(async {
        // Active keys hold a batch (the second lease, once demand is measured).
        for key in idle_keys..total {
            limiter.acquire(&key, 1).await.expect("lease");
            limiter.acquire(&key, 1).await.expect("batch");
        }
        // Idle keys: created by a first call, which queues their first lease.
        while (limiter.live_keys() as u64) < total {
            for chunk in (0..idle_keys).collect::<Vec<_>>().chunks(1_024) {
                for key in chunk {
                    let _ = limiter.try_acquire(key, 1);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    });
    // One more call on every idle key, so they all go idle within a few ticks of each other.
    for key in 0..idle_keys {
        let _ = limiter.try_acquire(&key, 1);
    }
    let idle_since = Instant::now();
    let expiry = idle_since + ttl;
    eprintln!("sweep: {total} live keys; idle keys expire in {ttl:?}");

    // 0: before the sweep, 1: while keys are being evicted, 2: after.
    let phase = AtomicU8::new(0);
    let stop = AtomicBool::new(false);
    let (mut hists, mut windows) = std::thread::scope(|s| {
        let caller = s.spawn(|| {
            let mut hists = [Histogram::new(), Histogram::new(), Histogram::new()];
            // Allocated up front (the pages are touched only when used).
            let mut windows: Vec<Histogram> = (0..WINDOWS).map(|_| Histogram::new()).collect();
            let mut key = idle_keys;
            let mut denied = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let p = phase.load(Ordering::Relaxed) as usize;
                let start = Instant::now();
                let decision = limiter.try_acquire(&key, 1);
                let ns = start.elapsed().as_nanos() as u64;
                hists[p].record(ns);
                if p == 1 {
                    let w = start.saturating_duration_since(expiry).as_nanos() / WINDOW.as_nanos();
                    windows[(w as usize).min(WINDOWS - 1)].record(ns);
                }
                if !matches!(decision, Ok(Decision::Allowed)) {
                    denied += 1;
                }
                key = if key + 1 == total { idle_keys } else { key + 1 };
            }
            eprintln!("sweep: {denied} calls denied on the active keys");
            (hists, windows)
        });
        // The sweep phase runs from the moment the idle keys expire (the sweep that finds them
        // comes within a second: its scan is in the phase) until only the active keys are
        // left; the evictions themselves start when the live count first drops.
        let deadline = expiry + Duration::from_secs(30);
        let mut first_eviction = None;
        while Instant::now() < deadline {
            let live = limiter.live_keys() as u64;
            if phase.load(Ordering::Relaxed) == 0 && Instant::now() >= expiry {
                phase.store(1, Ordering::Relaxed);
            }
            if first_eviction.is_none() && live < total {
                first_eviction = Some(Instant::now());
            }
            if live <= active {
                phase.store(2, Ordering::Relaxed);
                let evicting = first_eviction.map_or(Duration::ZERO, |s| s.elapsed());
                eprintln!(
                    "sweep: phase lasted {:?}; {idle_keys} idle keys evicted in {evicting:?} \
                     from the first eviction ({:.0} ns per key, watched every 100 µs)",
                    expiry.elapsed(),
                    evicting.as_nanos() as f64 / idle_keys as f64
                );
                std::thread::sleep(Duration::from_secs(1));
                break;
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        stop.store(true, Ordering::Relaxed);
        caller.join().expect("caller thread")
    });
    assert_eq!(limiter.live_keys() as u64, active, "every idle key evicted");
    println!("| phase | calls | p50 ns | p99 ns | p99.9 ns | p99.99 ns | max ns | calls ≥ 10 µs |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (h, name) in
        hists
            .iter_mut()
            .zip(["before the sweep", "during the sweep", "after the sweep"])
    {
        println!("{}", row(h, name));
    }
    // The sweep's worst window, and every window's p99.9 for the record.
    let mut p999: Vec<(usize, u64)> = Vec::new();
    for (i, w) in windows
        .iter_mut()
        .enumerate()
        .filter(|(_, w)| w.count >= 10_000)
    {
        p999.push((i, w.quantile(0.999)));
    }
    eprintln!(
        "sweep: p99.9 ns of each {WINDOW:?} window of the sweep phase (from the expiry): {p999:?}"
    );
    if let Some(&(worst, _)) = p999.iter().max_by_key(|(_, ns)| *ns) {
        let name = format!(
            "worst {} ms window of it ({} ms after the expiry)",
            WINDOW.as_millis(),
            worst as u128 * WINDOW.as_millis()
        );
        println!("{}", row(&mut windows[worst], &name));
    }
    rt.block_on(limiter.shutdown());
}
