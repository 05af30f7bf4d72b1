//! Property: limiters sharing one key never admit more than `burst + rate × elapsed`.
//!
//! A fleet of hybrid and pure limiters shares one [`MemoryStore`] on tokio's paused clock (the
//! store reads it through [`TokioClock`]), so time moves only when the test says. Random demand
//! hits random nodes; after every step the fleet's total is checked against the bound.

use std::cell::Cell;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use ratelease::{Clock, HybridLimiter, MemoryStore, Quota, RedisLimiter, TokioClock};

#[derive(Debug, Clone)]
struct Request {
    node: usize,
    tokens: u64,
    after_us: u64,
}

fn scenario() -> impl Strategy<Value = (Quota, usize, usize, u64, Vec<Request>)> {
    (1u64..500, 1u64..200, 1usize..5, 0usize..3, 1u64..64).prop_flat_map(
        |(rate, burst, hybrids, pures, lease)| {
            let quota = Quota::with_parts(rate, Duration::from_millis(100), burst).unwrap();
            let nodes = hybrids + pures;
            let request =
                (0..nodes, 1..=burst.min(8), 0u64..30_000).prop_map(|(node, tokens, after_us)| {
                    Request {
                        node,
                        tokens,
                        after_us,
                    }
                });
            (
                Just(quota),
                Just(hybrids),
                Just(pures),
                Just(lease),
                prop::collection::vec(request, 1..300),
            )
        },
    )
}

/// Lets every ready task (refill tasks, whose store calls complete at once) run.
async fn settle() {
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
}

/// Runs one scenario; returns (admitted, bound at the end).
fn run(
    quota: Quota,
    hybrids: usize,
    pures: usize,
    lease: u64,
    requests: &[Request],
) -> Result<(u64, u128), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let clock = TokioClock::new();
        let store = MemoryStore::with_clock(clock);
        let hybrid: Vec<_> = (0..hybrids)
            .map(|i| {
                HybridLimiter::builder("shared", quota, store.clone())
                    .lease_size(lease)
                    .seed(i as u64)
                    .build()
                    .unwrap()
            })
            .collect();
        let pure: Vec<_> = (0..pures)
            .map(|_| RedisLimiter::new("shared", quota, store.clone()).unwrap())
            .collect();
        let mut admitted = 0u64;
        let mut bound = 0u128;
        for r in requests {
            tokio::time::advance(Duration::from_micros(r.after_us)).await;
            settle().await;
            let allowed = if r.node < hybrids {
                hybrid[r.node].try_acquire(r.tokens).unwrap().is_allowed()
            } else {
                let limiter = &pure[r.node - hybrids];
                limiter.try_acquire(r.tokens).await.unwrap().is_allowed()
            };
            if allowed {
                admitted += r.tokens;
            }
            let elapsed_us = clock.now().as_micros();
            bound = u128::from(quota.burst())
                + u128::from(quota.rate()) * elapsed_us / u128::from(quota.period_us());
            prop_assert!(
                u128::from(admitted) <= bound,
                "admitted {admitted} > bound {bound} after {elapsed_us} µs"
            );
        }
        Ok((admitted, bound))
    })
}

#[test]
fn fleet_never_exceeds_burst_plus_rate_times_elapsed() {
    let (cases, admitting, tightest) = (Cell::new(0u32), Cell::new(0u32), Cell::new(0f64));
    let mut runner = TestRunner::new(ProptestConfig::with_cases(96));
    let result = runner.run(&scenario(), |(quota, hybrids, pures, lease, requests)| {
        let (admitted, bound) = run(quota, hybrids, pures, lease, &requests)?;
        cases.set(cases.get() + 1);
        admitting.set(admitting.get() + u32::from(admitted > 0));
        tightest.set(tightest.get().max(admitted as f64 / bound as f64));
        Ok(())
    });
    result.unwrap();
    let (cases, admitting, tightest) = (cases.get(), admitting.get(), tightest.get());
    // Not vacuous: limiters that denied everything would satisfy the bound too.
    assert!(
        admitting * 10 >= cases * 8,
        "{admitting} of {cases} cases admitted anything"
    );
    assert!(
        tightest >= 0.8,
        "no case came near the bound (best {tightest:.2})"
    );
}
