//! Regression test for the leasing policy's targets (issue 4), on short runs so it fits CI in
//! debug builds. A change that breaks fairness, exactness or store load fails here.
//!
//! The full-length numbers are in SIMULATIONS.md.

use std::path::Path;

use simulations::metrics::{self, ModeMetrics};
use simulations::{demand, sim, Mode, Scenario};

fn shipped(name: &str, duration_s: f64) -> Scenario {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(format!("{name}.toml"));
    Scenario::load(&path)
        .unwrap()
        .with_overrides(None, Some(duration_s), None)
        .unwrap()
}

fn run(sc: &Scenario, mode: Mode) -> ModeMetrics {
    let trace = demand::generate(sc, sc.seed);
    let log = sim::run_mode(sc, &trace, mode, &|_| {}).unwrap();
    metrics::compute(sc, &log)
}

#[test]
fn skewed_hybrid_is_as_fair_and_exact_as_pure_redis_at_a_fiftieth_of_the_calls() {
    let sc = shipped("skewed", 12.0);
    let pure = run(&sc, Mode::PureRedis);
    let hybrid = run(&sc, Mode::Hybrid);
    assert_eq!(hybrid.max_window_overshoot, 0, "{hybrid:?}");
    assert!(hybrid.jain_acceptance >= 0.98, "{hybrid:?}");
    assert!(
        hybrid.jain_acceptance >= pure.jain_acceptance - 0.02,
        "hybrid {hybrid:?}\npure {pure:?}"
    );
    assert!(hybrid.utilization >= 0.97, "{hybrid:?}");
    assert!(
        hybrid.store_calls as f64 <= 0.02 * pure.store_calls as f64,
        "{} calls vs pure's {}",
        hybrid.store_calls,
        pure.store_calls
    );
    assert!(hybrid.store_calls_per_s_per_node_max <= 20.0, "{hybrid:?}");
}

#[test]
fn fixed_window_hybrid_is_as_exact_as_pure_redis_at_a_fraction_of_the_calls() {
    let sc = shipped("fixed-window", 8.0);
    let pure = run(&sc, Mode::PureRedis);
    let hybrid = run(&sc, Mode::Hybrid);
    let fixed = run(&sc, Mode::HybridFixed);
    for m in [&pure, &hybrid, &fixed] {
        // At most two windows' worth (2 × rate = burst + rate × 1 s) in any second.
        assert_eq!(m.max_window_overshoot, 0, "{m:?}");
    }
    assert!(
        hybrid.admitted as f64 >= 0.99 * pure.admitted as f64,
        "hybrid {hybrid:?}\npure {pure:?}"
    );
    assert!(hybrid.jain_acceptance >= 0.95, "{hybrid:?}");
    assert!(
        hybrid.store_calls as f64 <= 0.05 * pure.store_calls as f64,
        "{} calls vs pure's {}",
        hybrid.store_calls,
        pure.store_calls
    );
}

#[test]
fn hybrid_never_overshoots_in_any_shipped_scenario() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut checked = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let sc = Scenario::load(&path).unwrap();
        // Keep each scenario's events: run up to just past the end of the last one.
        let last_event = sc
            .events
            .iter()
            .map(|e| e.at_s + e.duration_s.unwrap_or(0.0))
            .fold(0.0, f64::max);
        let sc = sc
            .with_overrides(None, Some((last_event + 3.0).max(5.0)), None)
            .unwrap();
        let m = run(&sc, Mode::Hybrid);
        assert_eq!(m.max_window_overshoot, 0, "{}: {m:?}", sc.name);
        assert!(m.admitted > 0, "{}: {m:?}", sc.name);
        checked += 1;
    }
    assert!(checked >= 17, "only {checked} scenarios found");
}

/// A fleet of 100 that starts at once, cold, under Zipf traffic at twice the limit: it fills
/// most of its first second and polls the store gently while it does. (Before the cold-start
/// changes the same run admitted under half of its first second, and starved nodes polled
/// the store every millisecond.) Full-length numbers, and 10 to 10 000 nodes: SIMULATIONS.md.
#[test]
fn a_cold_fleet_fills_its_first_second_without_hammering_the_store() {
    let sc = shipped("fleet-start", 3.0);
    let m = run(&sc, Mode::Hybrid);
    assert_eq!(m.max_window_overshoot, 0, "{m:?}");
    assert!(m.first_second_admission >= 0.7, "{m:?}");
    assert!(m.store_calls_per_s_per_node_max <= 20.0, "{m:?}");
    assert!(m.jain_acceptance >= 0.99, "{m:?}");
}

/// The scenario key `prefetch = false` builds the hybrid nodes to lease on first demand: of
/// 50 nodes that see about ten requests in half a second, every one makes a store call if they
/// lease when built, only those asked for tokens if not.
#[test]
fn nodes_built_without_prefetch_lease_only_when_asked() {
    let run_with = |prefetch: bool| {
        let sc = Scenario::parse(&format!(
            "name = \"t\"\nduration_s = 0.5\nrate = 1000\nnodes = 50\nprefetch = {prefetch}\n\
             [demand]\npattern = \"uniform\"\ntotal_rps = 20\n"
        ))
        .unwrap();
        run(&sc, Mode::Hybrid)
    };
    let built = run_with(true);
    let on_demand = run_with(false);
    assert!(built.store_calls >= 50, "{built:?}");
    assert!(on_demand.store_calls >= 1, "{on_demand:?}");
    assert!(
        on_demand.store_calls <= on_demand.demand,
        "a lease per request at most: {on_demand:?}"
    );
}

/// Bursty traffic on 1 000 nodes with a burst of half a second: a node back from idle, its
/// share small and its horizon stretched, is not held to its credit by a reserve sized for that
/// horizon (the reserve is at most a quarter of the burst). These 6 s admit 0.951 of their
/// budget, 0.752 without the cap.
/// Nodes in pure mode beside leasing nodes on one bucket: each half accepts its part of its
/// requests, neither takes the other's (taking the whole level while leasers reached the
/// reserve only against credit, the pure half accepted 0.996 and the leasing half 0.188).
#[test]
fn pure_mode_nodes_beside_leasing_ones_are_served_alike() {
    let sc = shipped("mixed-fleet", 6.0);
    for mode in [Mode::Hybrid, Mode::HybridRate] {
        let m = run(&sc, mode);
        let mixed = m.mixed.expect("a mixed fleet");
        assert!(
            (mixed.pure - mixed.leasing).abs() <= 0.03,
            "{mode}: {mixed:?}"
        );
        assert!(m.utilization >= 0.98, "{mode}: {m:?}");
        assert_eq!(m.max_window_overshoot, 0, "{mode}: {m:?}");
    }
}

#[test]
fn a_node_back_from_idle_is_not_held_back_by_a_reserve_of_its_own() {
    let sc = shipped("bursty-fleet", 6.0);
    let hybrid = run(&sc, Mode::Hybrid);
    assert_eq!(hybrid.max_window_overshoot, 0, "{hybrid:?}");
    assert!(hybrid.utilization >= 0.9, "{hybrid:?}");
}

/// A fleet whose nodes are each busy one second in twenty, under a tight burst: a rate lease
/// ends with its node's busy second, so the rate is not held by nodes with no demand. (Ended
/// only by renewals at a decaying demand estimate, rate leases admitted 0.56 of these 4 s;
/// now 0.93.)
#[test]
fn rate_leases_end_with_a_nodes_busy_second() {
    let sc = shipped("sparse-tight-fleet", 4.0);
    let rated = run(&sc, Mode::HybridRate);
    assert_eq!(rated.max_window_overshoot, 0, "{rated:?}");
    assert!(rated.utilization >= 0.85, "{rated:?}");
}

/// A hot spot that moves in a fleet of 1 000 under a tight burst: the node that becomes hot
/// must take its part of the burst back from the many small shares. The default (token leases
/// in a fleet this size) follows it within a few hundred milliseconds; rate leases by default
/// here (tried) left the new hot node at a third of its share — the small shares' rooms for
/// their rates held the burst — and read utilization 0.88 over these 7 s, never recovered.
#[test]
fn a_hot_spot_that_moves_in_a_large_fleet_under_a_tight_burst_is_followed() {
    let sc = shipped("moving-hotspot-fleet", 7.0);
    let hybrid = run(&sc, Mode::Hybrid);
    assert_eq!(hybrid.max_window_overshoot, 0, "{hybrid:?}");
    assert!(hybrid.utilization >= 0.98, "{hybrid:?}");
    let recovery = hybrid.recovery_s.expect("the hot spot moves");
    assert!(recovery <= 0.5, "{hybrid:?}");
}

/// A fleet of equal small shares under its limit admits its demand: each share is a thousandth
/// of the rate, small beside the rate but not beside the others, so a node stretches its
/// horizon only as far as a fleet of nodes like it can carry (3 s: utilization 0.996).
/// Stretched as for a small share of a skewed fleet, the tokens in flight held the whole burst
/// and the fleet denied requests under its limit (0.927).
#[test]
fn a_fleet_of_equal_small_shares_under_its_limit_admits_its_demand() {
    let sc = shipped("even-fleet", 3.0);
    let hybrid = run(&sc, Mode::Hybrid);
    assert_eq!(hybrid.max_window_overshoot, 0, "{hybrid:?}");
    assert!(hybrid.utilization >= 0.99, "{hybrid:?}");
}

/// A horizon set longer than the burst carries is shortened to half the fill time: tokens
/// count against the burst until their node's next call, so 1 000 nodes sharing a burst of
/// 50 ms of the rate on leases of 100 ms could be granted at most half the rate, and the
/// busiest nodes, whose steps the bucket never held, got nothing (2 s: utilization 0.50, the
/// busiest node 0.0001; shortened, 0.94 and 0.48).
#[test]
fn a_horizon_the_burst_cannot_carry_starves_no_node() {
    let mut sc = shipped("tight-burst-fleet", 2.0);
    sc.lease.horizon_ms = Some(100.0);
    let hybrid = run(&sc, Mode::Hybrid);
    assert_eq!(hybrid.max_window_overshoot, 0, "{hybrid:?}");
    assert!(hybrid.utilization >= 0.9, "{hybrid:?}");
    let busiest = &hybrid.by_demand_rank[0];
    assert_eq!(busiest.first, 1);
    assert!(busiest.acceptance >= 0.3, "{busiest:?}");
}

/// A node told, at a share of a token a second, to come back in a second asks again once its
/// demand surges: under a tight burst, small shares lease for longer (a hundredth of the rate
/// is small there), and without the early call a node of sparse-tight-fleet whose busy second
/// began during such a pause admitted almost nothing of it. Every node with a whole busy
/// second in the run (4 000 requests) is served a fair part of it.
#[test]
fn a_node_whose_demand_surges_asks_again_before_its_retry() {
    let sc = shipped("sparse-tight-fleet", 5.0);
    let trace = demand::generate(&sc, sc.seed);
    let log = sim::run_mode(&sc, &trace, Mode::Hybrid, &|_| {}).unwrap();
    let (asked, admitted) = metrics::per_node_requests(sc.nodes, &log);
    let busy: Vec<f64> = (0..asked.len())
        .filter(|&i| asked[i] >= 3_000)
        .map(|i| admitted[i] as f64 / asked[i] as f64)
        .collect();
    assert!(busy.len() >= 100, "{} busy nodes", busy.len());
    let worst = busy.iter().copied().fold(1.0, f64::min);
    assert!(worst >= 0.2, "worst busy node accepted {worst}");
}

/// A burst of 5 ms of the rate (2 000/s, burst 10) over 10 nodes: leasing buys nothing, and
/// hybrid must serve it as pure-Redis mode does — its utilization within 0.02, its first
/// second too, no more store calls. (Before, the nodes deciding per request kept their spent
/// first leases counted and admitted 0.31 of their first second: 20 s read 0.9531 against
/// pure's 0.9999; SIMULATIONS.md, "A burst of a few milliseconds".)
#[test]
fn a_burst_of_a_few_milliseconds_is_served_as_pure_redis_serves_it() {
    let sc = shipped("tiny-burst", 5.0);
    let pure = run(&sc, Mode::PureRedis);
    let hybrid = run(&sc, Mode::Hybrid);
    assert_eq!(hybrid.max_window_overshoot, 0, "{hybrid:?}");
    assert!(
        hybrid.utilization >= pure.utilization - 0.02,
        "hybrid {hybrid:?}\npure {pure:?}"
    );
    assert!(
        hybrid.first_second_admission >= pure.first_second_admission - 0.05,
        "hybrid {hybrid:?}\npure {pure:?}"
    );
    assert!(hybrid.jain_acceptance >= 0.98, "{hybrid:?}");
    assert!(
        hybrid.store_calls <= pure.store_calls,
        "{} calls vs pure's {}",
        hybrid.store_calls,
        pure.store_calls
    );
}
