//! Live mode against a real redis-server started by the test (see `tests/support/mod.rs` at
//! the workspace root; `scripts/test.sh` installs redis-server if it is missing).

#[path = "../../tests/support/mod.rs"]
mod support;

use std::path::Path;

use simulations::{live, Mode, Scenario};
use support::RedisServer;

#[test]
fn live_run_counts_store_calls_from_redis() {
    let server = RedisServer::start();
    let mut sc =
        Scenario::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/skewed.toml"))
            .unwrap()
            .with_overrides(None, Some(1.0), None)
            .unwrap();
    // This test checks counting, not timeouts: a busy test machine can take longer than the
    // scenario's 50 ms to answer 4 000 script calls a second, and timed-out calls would
    // count as rejections.
    sc.timeout_ms = 2_000.0;
    let report = live::run_all(&sc, &server.url(), "test".into(), &|_, _| {}).unwrap();
    assert_eq!(report.kind, "live");
    let get = |mode: Mode| {
        &report
            .modes
            .iter()
            .find(|m| m.mode == mode)
            .unwrap()
            .metrics
    };
    for m in &report.modes {
        let x = &m.metrics;
        assert_eq!(x.demand as usize, report.requests, "{}", m.mode);
        assert_eq!(x.admitted + x.rejected, x.demand, "{}", m.mode);
        assert!(x.admitted > 0, "{}: {x:?}", m.mode);
    }
    let pure = get(Mode::PureRedis);
    // One script run per request, as counted by Redis (the calls that met NOSCRIPT while the
    // script was first loaded ran nothing and are not counted; their retries are).
    assert_eq!(pure.store_calls, pure.demand, "{pure:?}");
    assert!(
        pure.utilization > 0.8,
        "demand is twice the limit: {pure:?}"
    );
    let hybrid = get(Mode::Hybrid);
    assert!(
        hybrid.store_calls >= 1 && hybrid.store_calls * 5 < pure.store_calls,
        "{hybrid:?}"
    );
    assert_eq!(get(Mode::StaticShare).store_calls, 0);
}
