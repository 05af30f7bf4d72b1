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
