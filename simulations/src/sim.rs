//! Running one mode in virtual time.
//!
//! Each mode runs on a fresh current-thread tokio runtime with paused time, so no two modes
//! share any state and every run starts at virtual time zero. The runtime's `event_interval`
//! is raised so that one `yield_now` of the driver lets every ready task run to completion
//! before the driver continues: the driver's yield is the simulation's "let the world settle".
//!
//! # The driver loop
//!
//! The driver is the future given to `block_on`. It never waits on anything but
//! `tokio::time::advance` and `yield_now`, so tokio never auto-advances time behind its back.
//! Each step it picks the earliest of:
//!
//! - the next callback of the [`Scheduler`] (network and Redis-server events),
//! - the next request of the demand trace, or the next fleet change (crash, join),
//! - the next millisecond boundary (where tokio's own timers fire),
//!
//! moves the paused clock there exactly, runs everything due at that instant in a fixed order
//! (scheduler callbacks, joins, requests, crashes), and yields once so the tasks it woke run.
//! At a millisecond boundary it yields once more first, so tasks woken by tokio timers run
//! before the step's own events. Nothing depends on wall-clock time or thread timing, so the
//! same scenario and seed replay the same run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::demand::Arrival;
use crate::modes::{drain_limit, Fleet, NowFn};
use crate::record::RunLog;
use crate::scenario::{s_to_ns, Mode, Scenario};
use crate::scheduler::Scheduler;
use crate::store_model::{NetModel, SimStore, StoreModel};

/// Tokio's timer resolution.
const TICK_NS: u64 = 1_000_000;
/// Tasks the runtime may run between two polls of the driver: enough for any burst of wakes.
const EVENT_INTERVAL: u32 = 1 << 30;
/// Steps between two progress reports.
const PROGRESS_EVERY: u64 = 4096;

/// What happens to a node's process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ChangeKind {
    /// It starts.
    Join,
    /// It is replaced: the old process shuts down, a new one starts.
    Restart,
    /// It crashes.
    Crash,
    /// It shuts down (a scale-in).
    Leave,
}

/// A change to the fleet, at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetChange {
    /// When, ns.
    pub t_ns: u64,
    /// The node.
    pub node: usize,
    /// What.
    pub kind: ChangeKind,
}

impl FleetChange {
    /// Whether it takes effect before the requests arriving at the same instant (a start or a
    /// replacement serves them) or after (a node that stops still serves them).
    pub fn before_arrivals(&self) -> bool {
        matches!(self.kind, ChangeKind::Join | ChangeKind::Restart)
    }
}

/// The scenario's starts, stops and restarts, by time.
pub fn fleet_changes(sc: &Scenario) -> Vec<FleetChange> {
    let mut v = Vec::new();
    for (node, life) in sc.lives().iter().enumerate() {
        let mut push = |t: Option<f64>, kind| {
            if let Some(t) = t {
                v.push(FleetChange {
                    t_ns: s_to_ns(t),
                    node,
                    kind,
                });
            }
        };
        push(life.join_s, ChangeKind::Join);
        push(life.restart_s, ChangeKind::Restart);
        let stop = if life.graceful {
            ChangeKind::Leave
        } else {
            ChangeKind::Crash
        };
        push(life.leave_s, stop);
    }
    v.sort_by_key(|c| (c.t_ns, !c.before_arrivals(), c.node, c.kind));
    v
}

/// Runs `mode` over `trace` in virtual time. `progress` is told the virtual time (ns) now and
/// then.
///
/// # Errors
/// If the runtime or a limiter cannot be built.
pub fn run_mode(
    sc: &Scenario,
    trace: &[Arrival],
    mode: Mode,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<RunLog> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .event_interval(EVENT_INTERVAL)
        .build()?;
    let wall = Instant::now();
    let mut log = runtime.block_on(simulate(sc, trace, mode, progress))?;
    drop(runtime);
    log.wall = wall.elapsed();
    Ok(log)
}

async fn simulate(
    sc: &Scenario,
    trace: &[Arrival],
    mode: Mode,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<RunLog> {
    let sched = Scheduler::new();
    let model = StoreModel::new(sched.clone(), NetModel::from_scenario(sc));
    let stores: Vec<SimStore> = (0..sc.nodes)
        .map(|i| model.handle(i as u32, sc.seed))
        .collect();
    let now: NowFn = {
        let sched = sched.clone();
        Arc::new(move || sched.now_ns())
    };
    let mut fleet = Fleet::new(mode, sc, sc.seed, stores, trace, now)?;
    let changes = fleet_changes(sc);
    let end = sc.duration_ns();
    let hard_end = end + u64::try_from(drain_limit(sc).as_nanos())?;
    drive(&sched, &mut fleet, trace, &changes, end, hard_end, progress).await?;
    let out = fleet.finish();
    sched.clear();

    let mut requests = out.requests;
    for (i, r) in requests.iter_mut().enumerate() {
        if let Some(t) = model.executed_at(i) {
            r.decided_ns = t;
        }
    }
    let calls = model.calls();
    Ok(RunLog {
        mode,
        requests,
        store_calls: calls.len() as u64,
        calls,
        tokens_stranded: out.stranded_local.saturating_sub(model.returned_late())
            + model.stranded(),
        store_errors: model.timeouts(),
        redis_busy_ns: model.busy_ns(),
        rejected_while_tokens_idle: out.rejected_while_tokens_idle,
        tokens_dripped: out.tokens_dripped,
        wall: Duration::ZERO,
    })
}

/// The driver loop (see the module docs).
async fn drive(
    sched: &Scheduler,
    fleet: &mut Fleet<SimStore>,
    trace: &[Arrival],
    changes: &[FleetChange],
    end: u64,
    hard_end: u64,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<()> {
    let (mut ai, mut ci) = (0, 0);
    let mut now = 0u64;
    let mut steps = 0u64;
    loop {
        let next_tick = (now / TICK_NS + 1) * TICK_NS;
        let mut t = next_tick;
        for c in [
            sched.next_at(),
            trace.get(ai).map(|a| a.t_ns),
            changes.get(ci).map(|c| c.t_ns),
        ]
        .into_iter()
        .flatten()
        {
            t = t.min(c);
        }
        let done = ai == trace.len() && ci == changes.len();
        if done && now >= end && (fleet.in_flight() == 0 || now >= hard_end) {
            break;
        }
        if t > now {
            tokio::time::advance(Duration::from_nanos(t - now)).await;
            now = t;
        }
        if now == next_tick {
            tokio::task::yield_now().await;
        }
        while let Some(callback) = sched.pop_due(now) {
            callback();
        }
        while let Some(c) = changes
            .get(ci)
            .filter(|c| c.t_ns == now && c.before_arrivals())
        {
            fleet.change(c)?;
            ci += 1;
        }
        while let Some(a) = trace.get(ai).filter(|a| a.t_ns == now) {
            fleet.arrival(ai, *a);
            ai += 1;
        }
        while let Some(c) = changes
            .get(ci)
            .filter(|c| c.t_ns == now && !c.before_arrivals())
        {
            fleet.change(c)?;
            ci += 1;
        }
        tokio::task::yield_now().await;
        steps += 1;
        if steps.is_multiple_of(PROGRESS_EVERY) {
            progress(now.min(end));
        }
    }
    progress(end);
    Ok(())
}

/// Runs every mode of `sc` on one demand trace and gathers the report. `progress` is told
/// (mode index, virtual ns) as the runs advance.
///
/// # Errors
/// If a run fails.
pub fn run_all(
    sc: &Scenario,
    command: String,
    progress: &(dyn Fn(usize, u64) + Sync),
) -> Result<crate::report::Report> {
    let trace = crate::demand::generate(sc, sc.seed);
    let mut modes = Vec::new();
    for (i, &mode) in sc.modes.iter().enumerate() {
        let log = run_mode(sc, &trace, mode, &|ns| progress(i, ns))?;
        modes.push(crate::report::ModeResult {
            mode,
            metrics: crate::metrics::compute(sc, &log),
            windows: crate::metrics::windows(sc, &log),
        });
    }
    Ok(crate::report::Report {
        scenario: sc.clone(),
        command,
        kind: "simulated",
        requests: trace.len(),
        modes,
    })
}
