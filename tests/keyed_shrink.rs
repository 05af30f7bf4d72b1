//! A keyed limiter gives back the memory of a flood of keys once the flood's keys are swept
//! away: the key map's shards shrink (`src/keyed/map.rs`) and the worker's queue of releases
//! is trimmed. Live heap bytes are counted by a global allocator (this binary's own), as in
//! `benches/key_memory.rs`.

use std::time::{Duration, Instant};

use ratelease::{KeyedHybridLimiter, Quota};

#[path = "../benches/support/grant_all.rs"]
mod grant_all;
use grant_all::GrantAll;

#[path = "../benches/support/live_bytes.rs"]
mod live_bytes;
use live_bytes::live;

#[test]
fn a_swept_flood_gives_its_memory_back() {
    const CAP: usize = 200_000;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let quota = Quota::per_second(1_000).unwrap();
    let keys: Vec<u64> = (0..CAP as u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .collect();
    let base = live();
    let limiter = KeyedHybridLimiter::<u64, GrantAll>::builder("shrink", quota, GrantAll)
        .max_keys(CAP)
        .idle_ttl(Duration::from_secs(2))
        .give_back_after(Duration::from_secs(2))
        .runtime(rt.handle().clone())
        .build()
        .unwrap();
    // The flood: a first call on every key (repeated while the bounded queue of first leases
    // turns some away), until most of the cap is live.
    rt.block_on(async {
        for _ in 0..20 {
            for chunk in keys.chunks(1_024) {
                for key in chunk {
                    let _ = limiter.try_acquire(key, 1);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            if limiter.live_keys() >= CAP * 3 / 4 {
                break;
            }
        }
    });
    let flooded = limiter.live_keys();
    let peak = live() - base;
    // A quarter of the cap at least: on a loaded machine the first keys may idle out while
    // the flood is still going (2 s), and 50 000 keys are plenty to see the memory come back.
    assert!(flooded >= CAP / 4, "the flood made {flooded} keys live");
    // Nobody calls any more: the sweeps evict every key, then shrink the tables.
    let deadline = Instant::now() + Duration::from_secs(30);
    while limiter.live_keys() > 0 {
        assert!(Instant::now() < deadline, "{:?}", limiter.stats());
        std::thread::sleep(Duration::from_millis(50));
    }
    // A sweep after the last eviction (the sweep that evicted them shrinks too; this is slack).
    std::thread::sleep(Duration::from_millis(2_500));
    let after = live() - base;
    println!(
        "{flooded} keys live: {peak} bytes ({:.1} per key); swept: {after} bytes",
        peak as f64 / flooded as f64
    );
    assert!(
        after * 10 < peak,
        "the limiter kept {after} of the {peak} bytes its {flooded} keys took"
    );
    rt.block_on(limiter.shutdown());
}
