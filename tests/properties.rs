//! Properties of a fleet sharing one key, on virtual time:
//!
//! - any mix of limiters never admits more than `burst + rate × elapsed` in total;
//! - a fleet that leases on terms (the default [`AdaptiveLease`], plus pure-mode callers) never
//!   admits more than `burst + rate × W` in **any** window `W` — the bound of one shared bucket —
//!   even when nodes crash holding tokens.
//!
//! The fleet shares one [`MemoryStore`] on tokio's paused clock (the store reads it through
//! [`TokioClock`]), so time moves only when the test says. Random demand hits random nodes.

mod support;

use std::cell::Cell;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};
use ratelease::{
    AdaptiveLease, Clock, FixedLease, HybridLimiter, MemoryStore, Quota, RedisLimiter, TokioClock,
};
use support::max_in_window;

#[derive(Debug, Clone, Copy)]
enum Kind {
    /// A fixed batch lease: anonymous fixed batches.
    Fixed(u64),
    /// The default policy, leasing on terms.
    Adaptive,
    /// One store call per decision.
    Pure,
}

#[derive(Debug, Clone)]
enum Event {
    Request {
        node: usize,
        tokens: u64,
        after_us: u64,
    },
    Crash {
        node: usize,
    },
}

fn kind(allow_fixed: bool) -> impl Strategy<Value = Kind> {
    let fixed_weight = if allow_fixed { 2 } else { 0 };
    prop_oneof![
        fixed_weight => (1u64..64).prop_map(Kind::Fixed),
        3 => Just(Kind::Adaptive),
        1 => Just(Kind::Pure),
    ]
}

fn scenario(allow_fixed: bool) -> impl Strategy<Value = (Quota, Vec<Kind>, Vec<Event>)> {
    (
        1u64..2_000,
        1u64..200,
        prop::collection::vec(kind(allow_fixed), 1..6),
    )
        .prop_flat_map(|(rate, burst, kinds)| {
            let quota = Quota::with_parts(rate, Duration::from_millis(100), burst).unwrap();
            let nodes = kinds.len();
            let event = prop_oneof![
                100 => (0..nodes, 1..=burst.min(8), 0u64..20_000).prop_map(
                    |(node, tokens, after_us)| Event::Request { node, tokens, after_us }
                ),
                1 => (0..nodes).prop_map(|node| Event::Crash { node }),
            ];
            (
                Just(quota),
                Just(kinds),
                prop::collection::vec(event, 1..400),
            )
        })
}

/// Lets every ready task (refill tasks, whose store calls complete at once) run.
async fn settle() {
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
}

enum Node {
    Hybrid(HybridLimiter<MemoryStore>),
    Pure(RedisLimiter<MemoryStore>),
    Crashed,
}

struct Outcome {
    admitted: u64,
    demand: u64,
    bound: u128,
}

impl Outcome {
    /// Admitted as a share of what could have been: min(demand, bound).
    fn utilization(&self) -> f64 {
        self.admitted as f64 / (self.demand as f64).min(self.bound as f64).max(1.0)
    }
}

/// Runs one scenario; checks the cumulative bound after every step, and the window bound at
/// the end when `windows` is set.
fn run(
    quota: Quota,
    kinds: &[Kind],
    events: &[Event],
    windows: bool,
) -> Result<Outcome, TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let clock = TokioClock::new();
        let store = MemoryStore::with_clock(clock);
        let mut nodes: Vec<Node> = kinds
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let builder = HybridLimiter::builder("shared", quota, store.clone()).seed(i as u64);
                match *k {
                    Kind::Fixed(size) => {
                        Node::Hybrid(builder.policy(FixedLease::new(size)).build().unwrap())
                    }
                    Kind::Adaptive => {
                        Node::Hybrid(builder.policy(AdaptiveLease::new()).build().unwrap())
                    }
                    Kind::Pure => {
                        Node::Pure(RedisLimiter::new("shared", quota, store.clone()).unwrap())
                    }
                }
            })
            .collect();
        let mut admissions = Vec::new();
        let mut admitted = 0u64;
        let mut demand = 0u64;
        let mut bound = 0u128;
        for e in events {
            let (node, tokens) = match *e {
                Event::Crash { node } => {
                    if let Node::Hybrid(h) = &nodes[node] {
                        h.abort();
                    }
                    nodes[node] = Node::Crashed;
                    continue;
                }
                Event::Request {
                    node,
                    tokens,
                    after_us,
                } => {
                    tokio::time::advance(Duration::from_micros(after_us)).await;
                    settle().await;
                    (node, tokens)
                }
            };
            let allowed = match &nodes[node] {
                Node::Hybrid(h) => h.try_acquire(tokens).unwrap().is_allowed(),
                Node::Pure(p) => p.acquire_now(tokens).await.unwrap().is_allowed(),
                Node::Crashed => continue,
            };
            demand += tokens;
            let now_us = clock.now().as_micros();
            if allowed {
                admitted += tokens;
                admissions.push((now_us as u64, tokens));
            }
            bound = u128::from(quota.burst())
                + u128::from(quota.rate()) * now_us / u128::from(quota.period_us());
            prop_assert!(
                u128::from(admitted) <= bound,
                "admitted {admitted} > bound {bound} after {now_us} µs"
            );
        }
        if windows {
            for window_us in [1_000, 10_000, 100_000, 250_000, 1_000_000] {
                let most = max_in_window(&admissions, window_us);
                let limit = quota.burst() + quota.rate() * window_us / quota.period_us();
                prop_assert!(
                    most <= limit,
                    "{most} admitted in a {window_us} µs window; the bound is {limit}"
                );
            }
        }
        Ok(Outcome {
            admitted,
            demand,
            bound,
        })
    })
}

/// Runs `cases` scenarios and checks that the property was not vacuous (a limiter that denies
/// everything satisfies any upper bound): utilization, admitted ÷ min(demand, bound), must be
/// high in the best case and reasonable on average.
fn check(allow_fixed: bool, windows: bool, cases: u32) {
    let (ran, total, best) = (Cell::new(0u32), Cell::new(0f64), Cell::new(0f64));
    let mut runner = TestRunner::new(ProptestConfig::with_cases(cases));
    let result = runner.run(&scenario(allow_fixed), |(quota, kinds, events)| {
        let u = run(quota, &kinds, &events, windows)?.utilization();
        ran.set(ran.get() + 1);
        total.set(total.get() + u);
        best.set(best.get().max(u));
        Ok(())
    });
    result.unwrap();
    let (mean, best) = (total.get() / f64::from(ran.get()), best.get());
    assert!(best >= 0.9, "best utilization {best:.2}");
    // The mean is low by nature: the synchronous `try_acquire` denies while a node's first
    // leases are in flight, and most scenarios are a few sparse requests per node. Measured
    // 0.54-0.56 for 768 windowed cases over 12 runs, 0.60-0.68 for the 64 others (a blind
    // lease of a thousandth of the rate; a tenth read about 0.03 more).
    assert!(mean >= 0.5, "mean utilization {mean:.2}");
}

#[test]
fn any_fleet_stays_within_burst_plus_rate_times_elapsed() {
    check(true, false, 64);
}

#[test]
fn a_fleet_leasing_on_terms_keeps_the_window_bound_even_through_crashes() {
    // Many cases, so the mean utilization checked in `check` varies little (96 read 0.50-0.59,
    // 384 0.52-0.57, 768 0.54-0.56).
    check(false, true, 768);
}

#[test]
fn window_check_counts_correctly() {
    let a = [(0, 5), (10, 5), (25, 5), (40, 1)];
    assert_eq!(max_in_window(&a, 20), 10);
    assert_eq!(max_in_window(&a, 16), 10);
    assert_eq!(max_in_window(&a, 15), 10);
    assert_eq!(max_in_window(&a, 10), 5);
    assert_eq!(max_in_window(&a, 100), 16);
}
