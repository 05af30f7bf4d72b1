//! A pause on the store's answer ends when demand surges, end to end on virtual time.
//!
//! A node with a sliver of the rate holds a rate lease of that sliver and waits for its
//! renewal (half a ttl away) on the store's answer. If its demand then jumps, sleeping out
//! that answer leaves it on the sliver through the burst: the background task looks at the
//! callers every 20 ms while it waits, and once they ask at more than four times the rate the
//! answer was for (some of them denied), it asks the store again with its new demand.

use std::time::Duration;

use ratelease::{HybridLimiter, MemoryStore, Quota, TokioClock};

#[tokio::test(start_paused = true)]
async fn a_node_whose_demand_surges_asks_the_store_before_its_renewal() {
    let store = MemoryStore::with_clock(TokioClock::new());
    // 1 000/s with a burst of 50: a tight burst, so both nodes lease rates.
    let quota = Quota::per_second(1_000).unwrap().with_burst(50).unwrap();
    let build = |seed| {
        HybridLimiter::builder("surge", quota, store.clone())
            .seed(seed)
            .build()
            .unwrap()
    };
    let (busy, quiet) = (build(1), build(2));
    // 3 s: the busy node asks 2 000/s, the quiet one a request every 500 ms.
    for ms in 0..3_000u64 {
        for _ in 0..2 {
            let _ = busy.acquire_now(1).await.unwrap();
        }
        if ms % 500 == 0 {
            let _ = quiet.acquire_now(1).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let sliver = quiet.stats().rate_mtps;
    let calls_before = quiet.stats().store_calls();
    // Then the quiet node's demand jumps to 1 000/s for half a second.
    let (mut admitted, mut rate_at_200_ms) = (0u64, 0u64);
    for ms in 0..500u64 {
        for _ in 0..2 {
            let _ = busy.acquire_now(1).await.unwrap();
        }
        if quiet.acquire_now(1).await.unwrap().is_allowed() {
            admitted += 1;
        }
        if ms == 200 {
            rate_at_200_ms = quiet.stats().rate_mtps;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let calls = quiet.stats().store_calls() - calls_before;
    // The bucket was contended: the busy node was held below its demand throughout.
    assert!(busy.stats().tokens_denied > 1_000, "{:?}", busy.stats());
    // It held a sliver (measured: 0.8/s) and leased a rate well above it within 200 ms of the
    // surge (measured: 136/s; with the pause slept out, 29/s — the share first told).
    assert!(sliver < 5_000, "rate held before the surge: {sliver} mtps");
    assert!(
        rate_at_200_ms >= 100_000,
        "rate 200 ms into the surge: {rate_at_200_ms} mtps, {:?}",
        quiet.stats()
    );
    // Measured: 68 admitted in the half second (24 with the pause slept out), in 14 store
    // calls: a look every 20 ms, not a call per denial.
    assert!(admitted >= 50, "admitted {admitted}");
    assert!(calls <= 30, "{calls} store calls in 500 ms");
}
