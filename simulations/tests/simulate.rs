//! End-to-end simulation tests: determinism, the pure-Redis reference, the store model, and
//! the command line. Durations are short: these run in debug builds.

use std::path::Path;
use std::process::Command;

use simulations::metrics::{self, ModeMetrics};
use simulations::{demand, sim, Mode, Scenario};

fn shipped(name: &str) -> Scenario {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(format!("{name}.toml"));
    Scenario::load(&path).unwrap()
}

fn run(sc: &Scenario, mode: Mode) -> ModeMetrics {
    let trace = demand::generate(sc, sc.seed);
    let log = sim::run_mode(sc, &trace, mode, &|_| {}).unwrap();
    metrics::compute(sc, &log)
}

/// Four nodes, every kind of event, all modes: a run that touches every code path.
fn eventful(seed: u64) -> Scenario {
    Scenario::parse(&format!(
        r#"
        name = "eventful"
        seed = {seed}
        duration_s = 3
        rate = 400
        burst = 40
        nodes = 4
        [demand]
        pattern = "zipf"
        total_rps = 600
        [[events]]
        at_s = 0.5
        kind = "node_join"
        node = 3
        [[events]]
        at_s = 1.5
        kind = "node_crash"
        node = 0
        [[events]]
        at_s = 2.0
        kind = "store_outage"
        duration_s = 0.2
        [[events]]
        at_s = 2.5
        kind = "latency_spike"
        duration_s = 0.2
        extra_ms = 5
        "#
    ))
    .unwrap()
}

#[test]
fn same_seed_same_trace_hash_different_seed_different_hash() {
    let a = eventful(1);
    let b = eventful(2);
    for mode in Mode::all() {
        let first = run(&a, mode);
        let again = run(&a, mode);
        let other = run(&b, mode);
        assert_eq!(first.trace_hash, again.trace_hash, "{mode}: same seed");
        assert_eq!(
            first,
            ModeMetrics {
                wall_ms: first.wall_ms,
                ..again
            },
            "{mode}"
        );
        assert_ne!(first.trace_hash, other.trace_hash, "{mode}: different seed");
        assert_eq!(first.admitted + first.rejected, first.demand);
    }
}

#[test]
fn pure_redis_on_uniform_is_exact_and_fair() {
    let sc = shipped("uniform")
        .with_overrides(None, Some(4.0), Some(vec![Mode::PureRedis]))
        .unwrap();
    let m = run(&sc, Mode::PureRedis);
    assert_eq!(m.max_window_overshoot, 0, "{m:?}");
    assert!(m.jain_acceptance >= 0.99, "{m:?}");
    assert!(m.utilization >= 0.99, "demand is 1.5× the limit: {m:?}");
    assert_eq!(m.store_calls, m.demand, "one store call per request");
    // Each call, an anonymous lease, cost the server its service time.
    let busy = m.store_calls as f64 * sc.service_pure_us * 1e3;
    assert!(
        (m.redis_cpu - busy / sc.duration_ns() as f64).abs() < 1e-9,
        "{m:?}"
    );
    assert_eq!(m.rejected_while_tokens_idle, 0);
    // Latency is a modelled round trip (≥ 60 µs floor) plus the service time of one call.
    assert!(m.latency_us.p50 > 66.0 && m.latency_us.p50 < 150.0, "{m:?}");
}

#[test]
fn a_busy_redis_queues_pure_redis_calls() {
    // 400 µs of server time per call caps Redis at 2 500 calls/s; 3 000 requests/s overload it.
    let sc = Scenario::parse(
        r#"
        name = "saturated"
        duration_s = 2
        rate = 100000
        nodes = 2
        service_pure_us = 400
        [demand]
        pattern = "uniform"
        total_rps = 3000
        "#,
    )
    .unwrap();
    let m = run(&sc, Mode::PureRedis);
    assert!(m.latency_us.p99 > 10_000.0, "the queue grows: {m:?}");
    assert!(m.redis_cpu > 0.95, "Redis is busy all the time: {m:?}");
    assert!(
        m.store_errors > 0,
        "calls queued past the 50 ms timeout fail: {m:?}"
    );
}

#[test]
fn a_crashed_leasing_node_strands_its_tokens() {
    // Demand well under the limit: every node holds a batch when node 0 crashes.
    let sc = Scenario::parse(
        r#"
        name = "crash"
        duration_s = 2
        rate = 1000
        burst = 100
        nodes = 4
        [demand]
        pattern = "uniform"
        total_rps = 200
        [[events]]
        at_s = 1
        kind = "node_crash"
        node = 0
        "#,
    )
    .unwrap();
    let fixed = run(&sc, Mode::HybridFixed);
    assert!(fixed.tokens_stranded >= 1, "{fixed:?}");
    assert_eq!(fixed.rejected, 0, "{fixed:?}");
    assert_eq!(run(&sc, Mode::PureRedis).tokens_stranded, 0);
}

#[test]
fn the_command_writes_the_report_directory() {
    let out = tempfile::tempdir().unwrap();
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/skewed.toml");
    let output = Command::new(env!("CARGO_BIN_EXE_simulate"))
        .arg(&scenario)
        .args(["--duration-s", "2", "--seed", "7", "--quiet", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("seed 7"), "the seed is printed: {stdout}");
    // The printed table leaves out what a comparison does not turn on (summary.md has it).
    let header = stdout.lines().find(|l| l.starts_with("mode ")).unwrap();
    assert!(
        header.contains("util") && header.contains("trace hash"),
        "{header}"
    );
    assert!(
        !header.contains("p999") && !header.contains("admitted"),
        "{header}"
    );
    assert!(
        header.chars().count() <= 125,
        "{} wide: {header}",
        header.len()
    );
    for mode in Mode::all() {
        assert!(stdout.contains(mode.as_str()), "{stdout}");
    }
    for file in [
        "report.json",
        "windows.csv",
        "summary.md",
        "admitted.svg",
        "acceptance.svg",
        "store_calls.svg",
    ] {
        let path = out.path().join(file);
        assert!(path.metadata().is_ok_and(|m| m.len() > 0), "{file} missing");
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("report.json")).unwrap())
            .unwrap();
    assert_eq!(json["seed"], 7);
    let hybrid = &json["modes"]["hybrid"];
    for field in [
        "admitted",
        "rejected",
        "demand",
        "max_window_overshoot",
        "utilization",
        "jain_acceptance",
        "min_max_acceptance_ratio",
        "store_calls",
        "store_calls_per_s_per_node_max",
        "tokens_stranded",
        "latency_us",
        "rejected_while_tokens_idle",
        "trace_hash",
    ] {
        assert!(
            !hybrid[field].is_null(),
            "modes.hybrid.{field} missing: {hybrid}"
        );
    }
    for q in ["p50", "p99", "p999"] {
        assert!(hybrid["latency_us"][q].is_number());
    }
    let summary = std::fs::read_to_string(out.path().join("summary.md")).unwrap();
    assert!(
        summary.contains("--seed 7") && summary.contains("| pure-redis |"),
        "{summary}"
    );
}

/// Without `--out` the report goes to `sim/<name>/` in cargo's target directory: the one
/// `CARGO_TARGET_DIR` names when set (where `cargo run` put the binary), not `./target`.
#[test]
fn without_out_the_report_goes_to_the_target_directory() {
    let target = tempfile::tempdir().unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/uniform.toml");
    let output = Command::new(env!("CARGO_BIN_EXE_simulate"))
        .arg(&scenario)
        .args(["--duration-s", "1", "--modes", "hybrid", "--quiet"])
        .current_dir(cwd.path())
        .env("CARGO_TARGET_DIR", target.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    let report = target.path().join("sim/uniform/report.json");
    assert!(report.exists(), "no {}: {stdout}", report.display());
    assert!(stdout.contains(&report.parent().unwrap().display().to_string()));
    assert!(!cwd.path().join("target").exists(), "a ./target was made");
}

/// `pure_share` runs that part of a hybrid mode's nodes in pure mode, on the same bucket: a
/// pure node makes a store call per request, a leasing node far fewer; the report gives each
/// group's acceptance, and only for the hybrid modes. Nodes that join late and crash, pure or
/// not, are handled as in any fleet.
#[test]
fn a_mixed_fleet_runs_pure_nodes_beside_leasing_ones() {
    let mut sc = eventful(5);
    sc.pure_share = 0.5;
    sc.validate().unwrap();
    let pure: Vec<bool> = (0..sc.nodes).map(|i| sc.runs_pure(i)).collect();
    assert_eq!(pure, [false, true, false, true]);
    let trace = demand::generate(&sc, sc.seed);
    let log = sim::run_mode(&sc, &trace, Mode::Hybrid, &|_| {}).unwrap();
    let count = |node: u32| {
        let asked = log.requests.iter().filter(|r| r.node == node).count();
        let calls = log.calls.iter().filter(|c| c.node == node).count();
        (asked, calls)
    };
    for node in 0..4u32 {
        let (asked, calls) = count(node);
        assert!(asked > 100, "node {node}: {asked} requests");
        if pure[node as usize] {
            // One call per request, but none while its circuit is open (the outage).
            assert!(
                calls * 10 >= asked * 9 && calls <= asked,
                "node {node}: {calls} calls, {asked} requests"
            );
        } else {
            assert!(
                calls * 5 < asked,
                "node {node}: {calls} calls, {asked} requests"
            );
        }
    }
    let m = metrics::compute(&sc, &log);
    let mixed = m.mixed.expect("a hybrid mode's mixed fleet");
    assert!(mixed.pure > 0.0 && mixed.pure <= 1.0, "{mixed:?}");
    assert!(mixed.leasing > 0.0 && mixed.leasing <= 1.0, "{mixed:?}");
    assert_eq!(run(&sc, Mode::PureRedis).mixed, None);
    sc.pure_share = 1.0;
    assert!(sc.validate().is_err(), "every node pure is pure-redis mode");
}

/// A scenario's `on_store_failure` is every mode's policy and its `[lease]` table the hybrid
/// modes' lease settings: failing open through an outage, pure-redis admits instead of
/// erroring; rate leases switched off, hybrid holds none.
#[test]
fn a_scenarios_policy_and_lease_settings_reach_the_limiters() {
    let mut sc = eventful(3);
    sc.modes = vec![Mode::PureRedis, Mode::Hybrid];
    let plain = run(&sc, Mode::PureRedis);
    assert!(plain.store_errors > 0, "the outage failed calls: {plain:?}");
    sc.on_store_failure = Some("fail-open".into());
    sc.validate().unwrap();
    let open = run(&sc, Mode::PureRedis);
    assert!(
        open.admitted > plain.admitted,
        "failing open admits more through the outage: {} vs {}",
        open.admitted,
        plain.admitted
    );
    sc.on_store_failure = Some("fail_open".into());
    let err = sc.validate().unwrap_err().to_string();
    assert!(err.contains("fail-open, fail-closed"), "{err}");
    sc.on_store_failure = None;
    // A tight burst (40 of 400/s) leases rates by default in so small a fleet, and the
    // report says how much came from them; with rate leases off, nothing does.
    let by_default = run(&sc, Mode::Hybrid);
    assert!(by_default.tokens_from_rates > 0, "{by_default:?}");
    assert!(by_default.tokens_from_rates <= by_default.admitted + 40);
    sc.lease = toml::from_str("rate_leases = false\nhorizon_ms = 20").unwrap();
    sc.validate().unwrap();
    let off = run(&sc, Mode::Hybrid);
    assert_eq!(off.tokens_from_rates, 0, "{off:?}");
    assert_eq!(run(&sc, Mode::PureRedis).tokens_from_rates, 0);
    sc.lease.horizon_ms = Some(0.0);
    assert!(sc.validate().is_err());
}

/// `try_acquire = true` has hybrid nodes ask with the synchronous `try_acquire`: on
/// tiny-burst (a burst of 10 on 2 000/s over 10 nodes) no request waits for a decision in the
/// store — every hybrid decision takes no time — where `acquire_now` decides misses in the store
/// (as pure-Redis mode does) and admits more of the budget. The scenario as run says so.
#[test]
fn a_scenario_can_ask_with_try_acquire() {
    let mut sc = shipped("tiny-burst");
    sc.duration_s = 5.0;
    sc.validate().unwrap();
    let now = run(&sc, Mode::Hybrid);
    assert!(
        now.latency_us.p99 > 0.0,
        "misses decided in the store: {now:?}"
    );
    sc.try_acquire = true;
    let sync = run(&sc, Mode::Hybrid);
    assert_eq!(sync.latency_us.p999, 0.0, "{sync:?}");
    assert_eq!(sync.max_window_overshoot, 0);
    assert!(
        sync.utilization < now.utilization - 0.1,
        "try_acquire {} against acquire_now {}",
        sync.utilization,
        now.utilization
    );
    assert!(toml::to_string(&sc).unwrap().contains("try_acquire = true"));
}

/// Lock-based mode runs, is exact, and pays four round trips (and more under contention) per
/// decision, against one for pure-Redis.
#[test]
fn lock_based_is_exact_and_costs_more_calls() {
    let sc = Scenario::parse(
        r#"
        name = "lock"
        duration_s = 2
        rate = 300
        burst = 30
        nodes = 4
        [demand]
        pattern = "zipf"
        total_rps = 500
        "#,
    )
    .unwrap();
    let lock = run(&sc, Mode::LockBased);
    let pure = run(&sc, Mode::PureRedis);
    assert!(lock.admitted > 0);
    assert_eq!(lock.max_window_overshoot, 0);
    assert!(
        lock.store_calls >= 3 * pure.store_calls,
        "lock-based {} calls, pure-redis {}",
        lock.store_calls,
        pure.store_calls
    );
    assert_eq!("lock-based".parse::<Mode>(), Ok(Mode::LockBased));
}

/// A fleet of `nodes` with one fleet event (`event`, TOML of one `[[events]]` table).
fn fleet_with(nodes: usize, event: &str) -> Scenario {
    Scenario::parse(&format!(
        r#"
        name = "fleet"
        duration_s = 3
        rate = 1000
        burst = 1000
        nodes = {nodes}
        [demand]
        pattern = "uniform"
        total_rps = 600
        [[events]]
        {event}
        "#
    ))
    .unwrap()
}

fn log_of(sc: &Scenario, mode: Mode) -> simulations::RunLog {
    sim::run_mode(sc, &demand::generate(sc, sc.seed), mode, &|_| {}).unwrap()
}

#[test]
fn a_fleet_start_has_no_traffic_before_it_and_is_measured_from_it() {
    let sc = fleet_with(20, "at_s = 1.0\nkind = \"fleet_start\"\nduration_s = 0.1");
    assert!(sc.lives().iter().all(|l| l.join_s.is_some()));
    let log = log_of(&sc, Mode::Hybrid);
    assert!(log.requests.iter().all(|r| r.arrival_ns >= 1_000_000_000));
    assert!(log.calls.iter().all(|c| c.t_ns >= 1_000_000_000));
    let m = metrics::compute(&sc, &log);
    // Demand (600/s) is far below what may be admitted (burst 1 000 + 1 000/s): a cold fleet
    // of 20 admits nearly all of its first second.
    assert!(m.first_second_admission > 0.9, "{m:?}");
    assert_eq!(m.max_window_overshoot, 0);
}

#[test]
fn a_rolling_restart_replaces_every_process_and_gives_tokens_back() {
    let sc = fleet_with(
        10,
        "at_s = 1.0\nkind = \"rolling_restart\"\nduration_s = 1.0",
    );
    let restarts: Vec<f64> = sc.lives().iter().filter_map(|l| l.restart_s).collect();
    assert_eq!(restarts.len(), 10);
    assert!((restarts[9] - 1.9).abs() < 1e-9, "{restarts:?}");
    let quiet = log_of(
        &fleet_with(10, "at_s = 2.9\nkind = \"store_outage\"\nduration_s = 0.01"),
        Mode::Hybrid,
    );
    let log = log_of(&sc, Mode::Hybrid);
    let releases = |l: &simulations::RunLog| {
        l.calls
            .iter()
            .filter(|c| c.kind == simulations::record::CallKind::Release)
            .count()
    };
    // Each old process returns its tokens on the way out: ten releases more than the same
    // fleet without restarts makes (it only gives back a first lease's excess).
    assert!(
        releases(&log) >= releases(&quiet) + 10,
        "{} releases with restarts, {} without",
        releases(&log),
        releases(&quiet)
    );
    let m = metrics::compute(&sc, &log);
    assert_eq!(m.max_window_overshoot, 0, "{m:?}");
    assert!(
        m.utilization > 0.95,
        "traffic goes on through the restarts: {m:?}"
    );
    assert_eq!(m.tokens_stranded, 0, "a shutdown strands nothing: {m:?}");
}

#[test]
fn scale_out_and_scale_in_move_the_last_nodes() {
    let out = fleet_with(10, "at_s = 1.0\nkind = \"scale_out\"\ncount = 4");
    let late: Vec<usize> = (0..10).filter(|&i| out.join_s(i).is_some()).collect();
    assert_eq!(late, [6, 7, 8, 9]);
    let log = log_of(&out, Mode::Hybrid);
    assert!(log
        .requests
        .iter()
        .all(|r| r.node < 6 || r.arrival_ns >= 1_000_000_000));

    let inn = fleet_with(
        10,
        "at_s = 1.0\nkind = \"scale_in\"\ncount = 3\nduration_s = 0.3",
    );
    assert!(inn.lives()[7..]
        .iter()
        .all(|l| l.graceful && l.leave_s.is_some()));
    let log = log_of(&inn, Mode::Hybrid);
    assert!(log
        .requests
        .iter()
        .all(|r| r.node < 7 || r.arrival_ns < 1_300_000_000));
    let m = metrics::compute(&inn, &log);
    assert_eq!(
        m.tokens_stranded, 0,
        "leaving nodes give their tokens back: {m:?}"
    );
    assert_eq!(m.max_window_overshoot, 0);
}

#[test]
fn conflicting_fleet_events_are_refused() {
    let two_starts = r#"
        name = "x"
        duration_s = 3
        rate = 10
        nodes = 2
        [demand]
        pattern = "uniform"
        total_rps = 5
        [[events]]
        at_s = 1
        kind = "fleet_start"
        [[events]]
        at_s = 2
        kind = "node_join"
        node = 1
    "#;
    let err = Scenario::parse(two_starts).unwrap_err();
    assert!(
        format!("{err:#}").contains("more than one start"),
        "{err:#}"
    );
    let gone_first = two_starts
        .replace("kind = \"node_join\"", "kind = \"node_crash\"")
        .replace("at_s = 2\n", "at_s = 0.5\n");
    let err = Scenario::parse(&gone_first).unwrap_err();
    assert!(
        format!("{err:#}").contains("ends before it starts"),
        "{err:#}"
    );
    let no_count = two_starts.replace(
        "kind = \"node_join\"\n        node = 1",
        "kind = \"scale_in\"",
    );
    let err = Scenario::parse(&no_count).unwrap_err();
    assert!(format!("{err:#}").contains("needs `count`"), "{err:#}");
}
