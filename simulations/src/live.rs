//! Live mode: the same scenario in real time against a real Redis.
//!
//! `simulate live --redis URL scenario.toml` replays the scenario's demand trace (the same
//! seed gives the same requests) on a multi-threaded tokio runtime, with each node holding its
//! own [`RedisStore`] connection, and computes the same metrics from the same kind of log. The
//! fleet code is [`crate::modes::Fleet`], exactly as in the simulation; only the store and the
//! clock differ:
//!
//! - Each mode uses its own key prefix (`ratelease-sim:<pid>:<mode>:<nanos>:`), so modes and
//!   repeated runs never share a bucket. Keys expire on their own.
//! - `store_calls` is read from Redis itself: the `cmdstat_evalsha` and `cmdstat_eval` call
//!   counts of `INFO commandstats` (less their failed calls: NOSCRIPT, which ran no script),
//!   before and after each mode. (Run against a Redis nobody
//!   else is using, or the count includes their calls.) Per-node and per-window call counts
//!   come from the client side. `redis_cpu` is read the same way, from their `usec` totals.
//! - Faults are injected on the client side, by a wrapper around each node's store: during a
//!   `store_outage` calls wait `timeout_ms` (`lease_timeout_ms` for a node's lease or release)
//!   and fail with a timeout; during a `latency_spike` they are delayed by `extra_ms`.
//! - Pure-Redis admissions are timed when their reply arrives (the server's execution time is
//!   not observable), so window metrics can see reply-time jitter that the simulation does
//!   not.
//!
//! Real time is expensive, so live runs default to at most 5 s.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ratelease::{
    LeaseReply, LeaseRequest, LeaseStore, Quota, RedisStore, ReleaseRequest, StoreError,
};

use crate::calibrate::{command_stat_field, parse_command_stat};
use crate::demand::{self, Arrival};
use crate::metrics;
use crate::modes::{drain_limit, Fleet, NowFn};
use crate::record::{CallKind, CallRecord, RunLog};
use crate::report::{ModeResult, Report};
use crate::scenario::{Mode, Scenario};
use crate::sim::fleet_changes;
use crate::store_model::NetModel;

/// Default cap on a live run's duration, s.
pub const DEFAULT_LIVE_DURATION_S: f64 = 5.0;

/// Script calls that ran and the server time of all (µs): the sums of `calls=` less
/// `failed_calls=`, and of `usec=`, of `cmdstat_evalsha` and `cmdstat_eval` in an
/// `INFO commandstats` reply. A failed call ran no script: NOSCRIPT, met by the calls a node
/// sends while the script is first loaded (each is sent again once it is), as many as it has
/// in flight then.
pub fn parse_script_calls(info: &str) -> (u64, u64) {
    ["evalsha", "eval"]
        .iter()
        .filter_map(|name| {
            let (calls, usec) = parse_command_stat(info, name)?;
            let failed = command_stat_field(info, name, "failed_calls").unwrap_or(0);
            Some((calls.saturating_sub(failed), usec))
        })
        .fold((0, 0), |(c, u), (calls, usec)| (c + calls, u + usec))
}

async fn script_calls(conn: &mut redis::aio::MultiplexedConnection) -> Result<(u64, u64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .context("INFO commandstats failed")?;
    Ok(parse_script_calls(&info))
}

/// One node's Redis connection, counting calls and injecting the scenario's faults.
#[derive(Clone)]
pub struct LiveStore {
    inner: RedisStore,
    node: u32,
    start: Instant,
    faults: Arc<NetModel>,
    calls: Arc<Mutex<Vec<CallRecord>>>,
    errors: Arc<AtomicU64>,
}

impl LiveStore {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Records the call and applies the fault in force; `Err` if the call must fail.
    async fn before(&self, kind: CallKind, node: bool) -> Result<(), StoreError> {
        let now = self.now_ns();
        self.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(CallRecord {
                t_ns: now,
                node: self.node,
                kind,
            });
        if self.faults.in_outage(now) {
            let timeout = self.faults.timeout_of(node);
            tokio::time::sleep(timeout).await;
            self.errors.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::Timeout(timeout));
        }
        let extra = self.faults.extra_ns(now);
        if extra > 0 {
            tokio::time::sleep(Duration::from_nanos(extra)).await;
        }
        Ok(())
    }

    fn after(&self, r: Result<LeaseReply, StoreError>) -> Result<LeaseReply, StoreError> {
        if r.is_err() {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        r
    }
}

impl LeaseStore for LiveStore {
    async fn lease(
        &self,
        name: &str,
        quota: &Quota,
        req: &LeaseRequest,
    ) -> Result<LeaseReply, StoreError> {
        self.before(CallKind::Lease, req.node.is_some()).await?;
        self.after(self.inner.lease(name, quota, req).await)
    }

    async fn release(
        &self,
        name: &str,
        quota: &Quota,
        req: &ReleaseRequest,
    ) -> Result<LeaseReply, StoreError> {
        self.before(CallKind::Release, req.node.is_some()).await?;
        self.after(self.inner.release(name, quota, req).await)
    }
}

/// Runs every mode of `sc` live against `url`. `progress` is told (mode index, ns elapsed).
///
/// # Errors
/// If Redis cannot be reached or a limiter cannot be built.
pub fn run_all(
    sc: &Scenario,
    url: &str,
    command: String,
    progress: &(dyn Fn(usize, u64) + Sync),
) -> Result<Report> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let trace = demand::generate(sc, sc.seed);
    let mut modes = Vec::new();
    for (i, &mode) in sc.modes.iter().enumerate() {
        let log = runtime.block_on(run_mode(sc, url, &trace, mode, &|ns| progress(i, ns)))?;
        modes.push(ModeResult {
            mode,
            metrics: metrics::compute(sc, &log),
            windows: metrics::windows(sc, &log),
        });
    }
    Ok(Report {
        scenario: sc.clone(),
        command,
        kind: "live",
        requests: trace.len(),
        modes,
    })
}

/// Runs one mode live.
///
/// # Errors
/// As [`run_all`].
pub async fn run_mode(
    sc: &Scenario,
    url: &str,
    trace: &[Arrival],
    mode: Mode,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<RunLog> {
    let client = redis::Client::open(url).with_context(|| format!("invalid redis url {url}"))?;
    let mut admin = client
        .get_multiplexed_async_connection()
        .await
        .with_context(|| format!("cannot connect to {url}"))?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let prefix = format!("ratelease-sim:{}:{mode}:{nanos}:", std::process::id());
    let faults = Arc::new(NetModel::from_scenario(sc));
    let calls = Arc::new(Mutex::new(Vec::new()));
    let errors = Arc::new(AtomicU64::new(0));
    let mut stores = Vec::with_capacity(sc.nodes);
    let start = Instant::now();
    for node in 0..sc.nodes {
        let inner = RedisStore::builder(url)
            .prefix(prefix.clone())
            .response_timeout(faults.timeout().max(Duration::from_millis(1)))
            .lease_timeout(faults.lease_timeout().max(Duration::from_millis(1)))
            .connect()
            .await
            .with_context(|| format!("cannot connect node {node} to {url}"))?;
        stores.push(LiveStore {
            inner,
            node: node as u32,
            start,
            faults: faults.clone(),
            calls: calls.clone(),
            errors: errors.clone(),
        });
    }
    let before = script_calls(&mut admin).await?;

    // Time zero is now: rebase every store's clock.
    let start = Instant::now();
    for s in &mut stores {
        s.start = start;
    }
    let now: NowFn =
        Arc::new(move || u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX));
    let t0 = tokio::time::Instant::now();
    let wall = Instant::now();
    let mut fleet = Fleet::new(mode, sc, sc.seed, stores, trace, now)?;
    let changes = fleet_changes(sc);
    let (mut ai, mut ci) = (0, 0);
    while ai < trace.len() || ci < changes.len() {
        let change = changes.get(ci);
        let arrival = trace.get(ai);
        // Joins before arrivals before crashes at the same instant, as in the simulation.
        let take_change = match (change, arrival) {
            (Some(c), Some(a)) => c.t_ns < a.t_ns || (c.t_ns == a.t_ns && c.before_arrivals()),
            (Some(_), None) => true,
            _ => false,
        };
        if take_change {
            let c = changes[ci];
            tokio::time::sleep_until(t0 + Duration::from_nanos(c.t_ns)).await;
            fleet.change(&c)?;
            ci += 1;
        } else {
            let a = trace[ai];
            tokio::time::sleep_until(t0 + Duration::from_nanos(a.t_ns)).await;
            fleet.arrival(ai, a);
            ai += 1;
            if ai % 256 == 0 {
                progress(a.t_ns);
            }
        }
    }
    tokio::time::sleep_until(t0 + Duration::from_nanos(sc.duration_ns())).await;
    let drain_end = tokio::time::Instant::now() + drain_limit(sc);
    while fleet.in_flight() > 0 && tokio::time::Instant::now() < drain_end {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    progress(sc.duration_ns());
    let out = fleet.finish();
    let wall = wall.elapsed();
    let after = script_calls(&mut admin).await?;
    let calls = std::mem::take(&mut *calls.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(RunLog {
        mode,
        requests: out.requests,
        calls,
        store_calls: after.0.saturating_sub(before.0),
        redis_busy_ns: after.1.saturating_sub(before.1) * 1_000,
        tokens_stranded: out.stranded_local,
        store_errors: errors.load(Ordering::Relaxed),
        rejected_while_tokens_idle: out.rejected_while_tokens_idle,
        tokens_dripped: out.tokens_dripped,
        wall,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_script_calls_from_commandstats() {
        let info = "# Commandstats\r\n\
            cmdstat_evalsha:calls=120,usec=900,usec_per_call=7.50,rejected_calls=0,failed_calls=1\r\n\
            cmdstat_eval:calls=3,usec=40,usec_per_call=13.33,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_evalsha_ro:calls=1000,usec=1,usec_per_call=0.00,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_info:calls=2,usec=100,usec_per_call=50.00,rejected_calls=0,failed_calls=0\r\n";
        // The failed EVALSHA (NOSCRIPT) ran no script.
        assert_eq!(parse_script_calls(info), (122, 940));
        assert_eq!(parse_script_calls(""), (0, 0));
    }
}
