//! The modes: what each node of the fleet runs, and what happens to each request.
//!
//! A [`Fleet`] holds one limiter per node, built from the real library types:
//!
//! - `pure-redis`: a [`RedisLimiter`] per node over the node's store handle. Every request is
//!   an `acquire_now(1).await`, i.e. one store call. Requests are **open-loop and concurrent**:
//!   each one runs in its own tokio task, started at its arrival time, as a server handling
//!   requests concurrently over a multiplexed connection would. So requests overlap, queue at
//!   the Redis service model, and their decision latency is the virtual time they waited.
//! - `hybrid`: a [`HybridLimiter`] per node with the builder's defaults (whatever lease policy
//!   the library ships) and a seed derived from the master seed. Requests call
//!   `acquire_now(1)` from the driver itself, as a request handler would (`try_acquire(1)`
//!   under the scenario's `try_acquire = true`: answered at once, never by the store). Answered from the
//!   local bucket (the common case) it is ready at once: no task, no waiting, decision latency
//!   zero. Where leasing buys the node nothing (a part of the burst of a token or two, see
//!   `AdaptiveLease::per_request_below`) a miss is a decision in the store: that request then
//!   runs in its own task, as pure-Redis requests do, and its tokens count when the script ran.
//! - `hybrid-rate`: the same with rate leases on (`AdaptiveLease::new().rate_leases(true)`).
//!   In the hybrid modes a scenario's `pure_share` makes some nodes run a [`RedisLimiter`]
//!   instead, served as in `pure-redis`, on the same bucket as the leasing nodes.
//! - `hybrid-fixed`: the same with `FixedLease::new(batch)`.
//! - `static-share`: a [`RedisLimiter`] per node over a private, zero-latency [`MemoryStore`]
//!   with quota `rate / N` per second and burst `burst / N`: an exact local token bucket with no
//!   coordination and no store calls.
//!
//! - `lock-based`: a Redis lock around a client-side bucket, one store call per Redis command
//!   (see [`crate::lock_mode`]); concurrent tasks like pure-Redis. Simulator only: it needs the
//!   [`SimStore`]'s plain commands.
//!
//! Fleet changes: a crash calls [`HybridLimiter::abort`] (the tokens it held are lost and
//! counted as stranded); a start builds the node's hybrid limiter only then (so a new process
//! leases its first batch when it starts, or on its first request under `prefetch = false`); a
//! scale-in's stop calls
//! [`HybridLimiter::shutdown`] (its tokens go back to the store); a rolling restart's
//! replacement shuts the old limiter down and builds a new one at once, with a new node id
//! (a new process, cold). Pure-Redis and static-share nodes need no action: their traffic
//! simply stops or starts.
//!
//! `rejected_while_tokens_idle` counts denials while another live node held unused tokens: for
//! the hybrid modes, another limiter's `available() ≥ 1` (denials answered at once; a
//! decision in the store is not looked at); for static-share, another node's
//! private bucket holding a whole token; never for pure-Redis, which holds nothing locally.
//! Which nodes hold tokens is looked up at most once per millisecond of the run's time (a scan
//! of every node), so a fleet of 100 000 nodes does not scan itself per denial.
//!
//! The fleet is generic over the store, so live mode runs exactly this code against Redis.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use anyhow::{Context as _, Result};
use ratelease::{
    AdaptiveLease, Algorithm, Decision, FailurePolicy, FixedLease, HybridLimiter, LeaseStore,
    MemoryStore, Quota, RedisLimiter, TokioClock,
};

use crate::demand::Arrival;
pub use crate::exec::NowFn;
use crate::exec::{ready, REQUEST};
use crate::lock_mode;
use crate::record::{Outcome, RequestRecord};
use crate::rng::derive_seed;
use crate::scenario::{LeaseSettings, Mode, Scenario};
use crate::sim::{ChangeKind, FleetChange};
use crate::store_model::SimStore;

/// The limiter name every node uses (one shared bucket).
pub const LIMITER_NAME: &str = "sim";

enum Nodes<S: LeaseStore> {
    Pure(Vec<RedisLimiter<S>>),
    Hybrid {
        /// `None` before the node joins, and for the nodes that run pure mode.
        live: Vec<Option<HybridLimiter<S>>>,
        /// The pure-mode limiters of the nodes that run one (`Scenario::pure_share`).
        pure: Vec<Option<RedisLimiter<S>>>,
        /// The store handles of nodes that have not joined yet.
        waiting: Vec<Option<S>>,
        /// Every node's store handle, for the process that replaces it at a restart.
        stores: Vec<S>,
        /// Aborted limiters, kept for their counters.
        dead: Vec<HybridLimiter<S>>,
    },
    Static {
        limiters: Vec<RedisLimiter<MemoryStore>>,
    },
    Lock {
        stores: Vec<SimStore>,
        data: lock_mode::Shared,
        lease_ns: u64,
        timeout_ns: u64,
    },
}

/// One mode's nodes, and the records of the requests they served.
pub struct Fleet<S: LeaseStore + Clone> {
    mode: Mode,
    quota: Quota,
    algorithm: Algorithm,
    seed: u64,
    batch: u64,
    prefetch: bool,
    /// Hybrid nodes ask with `try_acquire`, not `acquire_now`.
    try_acquire: bool,
    /// The scenario's failure policy, if it sets one.
    failure: Option<FailurePolicy>,
    /// The fleet the hybrid modes' default fallback divides the quota by (`expected_nodes`,
    /// else `nodes`).
    fallback_nodes: u32,
    /// The `hybrid` and `hybrid-rate` modes' lease settings.
    lease: LeaseSettings,
    nodes: Nodes<S>,
    up: Vec<bool>,
    records: Arc<Mutex<Vec<RequestRecord>>>,
    in_flight: Arc<AtomicUsize>,
    now: NowFn,
    stranded: u64,
    idle_denials: u64,
    holders: Holders,
}

/// Two nodes that held unused tokens at the last scan (`ms` of the run's clock), enough to
/// answer "does a node other than this one hold tokens" for any node.
#[derive(Debug, Default, Clone, Copy)]
struct Holders {
    ms: Option<u64>,
    found: [Option<usize>; 2],
}

impl Holders {
    /// Whether a live node other than `node` holds tokens, rescanning with `holds` (node →
    /// holds tokens) if the last scan is from an earlier millisecond than `now_ns`.
    fn other_than(
        &mut self,
        node: usize,
        now_ns: u64,
        n: usize,
        holds: impl Fn(usize) -> bool,
    ) -> bool {
        let ms = now_ns / 1_000_000;
        if self.ms != Some(ms) {
            let mut it = (0..n).filter(|&j| holds(j));
            self.found = [it.next(), it.next()];
            self.ms = Some(ms);
        }
        self.found.iter().flatten().any(|&j| j != node)
    }
}

/// What a fleet reports when the run ends.
#[derive(Debug)]
pub struct FleetResult {
    /// One record per request, in trace order.
    pub requests: Vec<RequestRecord>,
    /// Tokens held by nodes when they crashed.
    pub stranded_local: u64,
    /// See the module docs.
    pub rejected_while_tokens_idle: u64,
    /// Store errors the hybrid limiters saw (0 for other modes).
    pub limiter_store_errors: u64,
    /// Tokens the hybrid limiters' rate leases dripped (0 for other modes).
    pub tokens_dripped: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<S: LeaseStore + Clone + 'static> Fleet<S> {
    /// Builds `mode`'s nodes over `stores` (one per node). Must run inside a tokio runtime.
    ///
    /// # Errors
    /// If a limiter cannot be built (invalid quota share).
    pub fn new(
        mode: Mode,
        sc: &Scenario,
        seed: u64,
        stores: Vec<S>,
        trace: &[Arrival],
        now: NowFn,
    ) -> Result<Self> {
        let n = sc.nodes;
        assert_eq!(stores.len(), n, "one store per node");
        let quota = sc.quota()?;
        let mut fleet = Fleet {
            mode,
            quota,
            algorithm: sc.algorithm,
            seed,
            batch: sc.batch(),
            prefetch: sc.prefetch,
            try_acquire: sc.try_acquire,
            failure: sc.failure_policy()?,
            fallback_nodes: sc.fallback_nodes(),
            lease: sc.lease.clone(),
            nodes: Nodes::Pure(Vec::new()),
            up: (0..n).map(|i| sc.join_s(i).is_none()).collect(),
            records: Arc::new(Mutex::new(
                trace
                    .iter()
                    .map(|a| RequestRecord::pending(a.t_ns, a.node))
                    .collect(),
            )),
            in_flight: Arc::new(AtomicUsize::new(0)),
            now,
            stranded: 0,
            idle_denials: 0,
            holders: Holders::default(),
        };
        fleet.nodes = match mode {
            Mode::PureRedis => Nodes::Pure(
                stores
                    .into_iter()
                    .enumerate()
                    .map(|(node, s)| fleet.build_pure(node, s))
                    .collect::<Result<_, _>>()?,
            ),
            Mode::Hybrid | Mode::HybridRate | Mode::HybridFixed => {
                let all = stores.clone();
                let mut live = Vec::with_capacity(n);
                let mut pure = Vec::with_capacity(n);
                let mut waiting = Vec::with_capacity(n);
                for (i, store) in stores.into_iter().enumerate() {
                    if sc.runs_pure(i) {
                        // A pure node needs no action at fleet events: its traffic starts and
                        // stops with its life.
                        live.push(None);
                        pure.push(Some(fleet.build_pure(i, store)?));
                        waiting.push(None);
                    } else if fleet.up[i] {
                        live.push(Some(fleet.build_hybrid(i, store)?));
                        pure.push(None);
                        waiting.push(None);
                    } else {
                        live.push(None);
                        pure.push(None);
                        waiting.push(Some(store));
                    }
                }
                Nodes::Hybrid {
                    live,
                    pure,
                    waiting,
                    stores: all,
                    dead: Vec::new(),
                }
            }
            Mode::StaticShare => {
                // rate/N per second is `rate` tokens per N seconds: exact, no rounding. A
                // window's share is rate/N (rounded down) per window of the same length.
                let share = match sc.algorithm {
                    Algorithm::FixedWindow | Algorithm::SlidingWindow => {
                        Quota::new((quota.rate() / n as u64).max(1), quota.period())
                    }
                    _ => Quota::with_parts(
                        quota.rate(),
                        quota.period() * u32::try_from(n)?,
                        (quota.burst() / n as u64).max(1),
                    ),
                }
                .context("static share of the quota")?;
                let limiters = (0..n)
                    .map(|_| {
                        let store = MemoryStore::with_clock(TokioClock::new());
                        RedisLimiter::builder(LIMITER_NAME, share, store)
                            .algorithm(sc.algorithm)
                            .build()
                    })
                    .collect::<Result<_, _>>()?;
                Nodes::Static { limiters }
            }
            Mode::LockBased => {
                let stores = stores
                    .into_iter()
                    .map(|s| {
                        (Box::new(s) as Box<dyn std::any::Any>)
                            .downcast::<SimStore>()
                            .map(|b| *b)
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| anyhow::anyhow!("lock-based mode runs only in the simulator"))?;
                let timeout_ns = (sc.timeout_ms * 1e6).round() as u64;
                Nodes::Lock {
                    stores,
                    data: Default::default(),
                    lease_ns: 4 * timeout_ns,
                    timeout_ns,
                }
            }
        };
        Ok(fleet)
    }

    fn build_pure(&self, node: usize, store: S) -> Result<RedisLimiter<S>, ratelease::BuildError> {
        // The circuit's probe jitter, reproducible like everything else.
        let builder = RedisLimiter::builder(LIMITER_NAME, self.quota, store)
            .algorithm(self.algorithm)
            .seed(derive_seed(self.seed, "pure", node as u64));
        match self.failure {
            Some(policy) => builder.on_store_failure(policy).build(),
            None => builder.build(),
        }
    }

    fn build_hybrid(&self, node: usize, store: S) -> Result<HybridLimiter<S>> {
        self.build_hybrid_seeded(store, derive_seed(self.seed, "hybrid", node as u64))
    }

    fn build_hybrid_seeded(&self, store: S, seed: u64) -> Result<HybridLimiter<S>> {
        let builder = HybridLimiter::builder(LIMITER_NAME, self.quota, store)
            .algorithm(self.algorithm)
            .prefetch(self.prefetch)
            .seed(seed);
        // The scenario's policy, else as the failure-policy docs tell users: size the local
        // fallback to the fleet, so a store outage does not multiply the limit by the number
        // of nodes.
        let failure = self
            .failure
            .unwrap_or(FailurePolicy::local_fallback(self.fallback_nodes));
        let builder = builder.on_store_failure(failure);
        let builder = match self.mode {
            Mode::HybridFixed => builder.policy(FixedLease::new(self.batch)),
            Mode::HybridRate => builder.policy(
                self.lease
                    .apply(AdaptiveLease::new(), false)
                    .rate_leases(true),
            ),
            _ if self.lease.is_default() => builder,
            _ => builder.policy(self.lease.apply(AdaptiveLease::new(), true)),
        };
        Ok(builder.build()?)
    }

    /// Serves request `index` of the trace, arriving now.
    pub fn arrival(&mut self, index: usize, a: Arrival) {
        let node = a.node as usize;
        // Latency is measured from when the request is handled: in the simulation that is its
        // arrival time exactly; live, it leaves out how late the driver was.
        let started = (self.now)();
        if let Nodes::Hybrid { pure, .. } = &self.nodes {
            if let Some(limiter) = &pure[node] {
                self.spawn_pure(index, a, started, limiter.clone());
                return;
            }
        }
        let outcome = match &self.nodes {
            Nodes::Pure(limiters) => {
                self.spawn_pure(index, a, started, limiters[node].clone());
                return;
            }
            Nodes::Lock {
                stores,
                data,
                lease_ns,
                timeout_ns,
            } => {
                let store = stores[node].clone();
                let data = data.clone();
                let (quota, lease_ns, deadline) = (self.quota, *lease_ns, started + timeout_ns);
                let records = self.records.clone();
                let in_flight = self.in_flight.clone();
                let clock = self.now.clone();
                in_flight.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    let owner = index as u64 + 1;
                    let (outcome, decided) =
                        lock_mode::serve(&store, &data, quota, owner, lease_ns, deadline, &*clock)
                            .await;
                    let t = clock();
                    lock(&records)[index] = RequestRecord {
                        arrival_ns: a.t_ns,
                        node: a.node,
                        outcome,
                        decided_ns: decided,
                        latency_ns: t.saturating_sub(started),
                    };
                    in_flight.fetch_sub(1, Ordering::Relaxed);
                });
                return;
            }
            Nodes::Hybrid { live, .. } => match live[node].clone().map(|l| {
                if self.try_acquire {
                    // `try_acquire`: the local bucket alone, answered at once.
                    return Some(l.try_acquire(1));
                }
                // `acquire_now`: the local bucket, or (where leasing buys nothing) a decision
                // in the store, in which case the request waits for it as in pure-Redis mode.
                let mut decision =
                    Box::pin(REQUEST.scope(index, async move { l.acquire_now(1).await }));
                match decision
                    .as_mut()
                    .poll(&mut Context::from_waker(Waker::noop()))
                {
                    Poll::Ready(result) => Some(result),
                    Poll::Pending => {
                        self.spawn_decision(index, a, started, decision);
                        None
                    }
                }
            }) {
                Some(None) => return,
                Some(Some(Ok(Decision::Allowed))) => Outcome::Admitted,
                Some(Some(Ok(Decision::Denied { .. }))) => {
                    let up = &self.up;
                    let idle = self.holders.other_than(node, started, live.len(), |j| {
                        up[j] && live[j].as_ref().is_some_and(|l| l.available() >= 1)
                    });
                    self.idle_denials += u64::from(idle);
                    Outcome::Rejected
                }
                Some(Some(Err(_))) | None => Outcome::Error,
            },
            Nodes::Static { limiters } => match ready(limiters[node].acquire_now(1)) {
                Ok(Decision::Allowed) => Outcome::Admitted,
                Ok(Decision::Denied { .. }) => {
                    let up = &self.up;
                    let idle = self.holders.other_than(node, started, limiters.len(), |j| {
                        // Reads the (refilled) budget; takes nothing.
                        up[j] && ready(limiters[j].available_permits()).is_ok_and(|r| r >= 1)
                    });
                    self.idle_denials += u64::from(idle);
                    Outcome::Rejected
                }
                Err(_) => Outcome::Error,
            },
        };
        let decided = (self.now)();
        lock(&self.records)[index] = RequestRecord {
            arrival_ns: a.t_ns,
            node: a.node,
            outcome,
            decided_ns: decided,
            latency_ns: decided.saturating_sub(started),
        };
    }

    /// A pure-mode decision: one store call, as its own task.
    fn spawn_pure(&self, index: usize, a: Arrival, started: u64, limiter: RedisLimiter<S>) {
        self.spawn_decision(
            index,
            a,
            started,
            async move { limiter.acquire_now(1).await },
        );
    }

    /// Runs one decision that waits for the store (a pure-Redis call, or a hybrid node's
    /// decision in the store) as its own task, and records its outcome when it is answered.
    /// `decision` runs in the request's [`REQUEST`] scope, so the store model notes when the
    /// script ran for it (the time its tokens count at).
    fn spawn_decision<F>(&self, index: usize, a: Arrival, started: u64, decision: F)
    where
        F: Future<Output = Result<Decision, ratelease::AcquireError>> + Send + 'static,
    {
        let records = self.records.clone();
        let in_flight = self.in_flight.clone();
        let clock = self.now.clone();
        in_flight.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(REQUEST.scope(index, async move {
            let result = decision.await;
            let t = clock();
            let outcome = match result {
                Ok(Decision::Allowed) => Outcome::Admitted,
                Ok(Decision::Denied { .. }) => Outcome::Rejected,
                Err(_) => Outcome::Error,
            };
            lock(&records)[index] = RequestRecord {
                arrival_ns: a.t_ns,
                node: a.node,
                outcome,
                decided_ns: t,
                latency_ns: t.saturating_sub(started),
            };
            in_flight.fetch_sub(1, Ordering::Relaxed);
        }));
    }

    /// Applies one change to the fleet, now.
    ///
    /// # Errors
    /// If a new hybrid limiter cannot be built.
    pub fn change(&mut self, c: &FleetChange) -> Result<()> {
        match c.kind {
            ChangeKind::Join => self.join(c.node),
            ChangeKind::Crash => {
                self.crash(c.node);
                Ok(())
            }
            ChangeKind::Leave => {
                self.leave(c.node);
                Ok(())
            }
            ChangeKind::Restart => self.restart(c.node),
        }
    }

    /// Node `node` shuts down now: its limiter gives its tokens back (in the background, as a
    /// process exiting would).
    pub fn leave(&mut self, node: usize) {
        self.up[node] = false;
        self.holders = Holders::default();
        self.shut_down(node);
    }

    /// Takes node `node`'s hybrid limiter out and shuts it down in the background.
    fn shut_down(&mut self, node: usize) {
        if let Nodes::Hybrid { live, dead, .. } = &mut self.nodes {
            if let Some(limiter) = live[node].take() {
                let closing = limiter.clone();
                tokio::spawn(async move { closing.shutdown().await });
                dead.push(limiter);
            }
        }
    }

    /// Node `node`'s process is replaced now: the old limiter shuts down, a new one (a new
    /// node id, no tokens, no demand measured) takes its traffic.
    ///
    /// # Errors
    /// If the new limiter cannot be built.
    pub fn restart(&mut self, node: usize) -> Result<()> {
        self.holders = Holders::default();
        let Nodes::Hybrid { live, stores, .. } = &self.nodes else {
            return Ok(());
        };
        if live[node].is_none() {
            return Ok(());
        }
        let store = stores[node].clone();
        self.shut_down(node);
        let seed = derive_seed(self.seed, "hybrid-restart", node as u64);
        let limiter = self.build_hybrid_seeded(store, seed)?;
        if let Nodes::Hybrid { live, .. } = &mut self.nodes {
            live[node] = Some(limiter);
        }
        Ok(())
    }

    /// Node `node` crashes now.
    pub fn crash(&mut self, node: usize) {
        self.up[node] = false;
        self.holders = Holders::default();
        if let Nodes::Hybrid { live, dead, .. } = &mut self.nodes {
            if let Some(limiter) = live[node].take() {
                self.stranded += limiter.available();
                limiter.abort();
                dead.push(limiter);
            }
        }
    }

    /// Node `node` starts now.
    ///
    /// # Errors
    /// If its hybrid limiter cannot be built.
    pub fn join(&mut self, node: usize) -> Result<()> {
        self.up[node] = true;
        self.holders = Holders::default();
        if let Nodes::Hybrid { waiting, .. } = &mut self.nodes {
            if let Some(store) = waiting[node].take() {
                let limiter = self.build_hybrid(node, store)?;
                if let Nodes::Hybrid { live, .. } = &mut self.nodes {
                    live[node] = Some(limiter);
                }
            }
        }
        Ok(())
    }

    /// Requests whose decision is still awaited (pure-Redis only).
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Stops every limiter at once (as `abort`, without giving tokens back: the run is over
    /// and what happens after it is not measured) and returns the records.
    pub fn finish(self) -> FleetResult {
        let mut limiter_store_errors = 0;
        let mut expired = 0;
        let mut tokens_dripped = 0;
        if let Nodes::Hybrid { live, dead, .. } = &self.nodes {
            for l in live.iter().flatten().chain(dead) {
                let stats = l.stats();
                limiter_store_errors += stats.store_errors;
                tokens_dripped += stats.tokens_dripped;
                // Leased tokens dropped unspent at lease expiry are stranded too.
                expired += stats.tokens_expired;
                l.abort();
            }
        }
        let requests = std::mem::take(&mut *lock(&self.records));
        FleetResult {
            requests,
            stranded_local: self.stranded + expired,
            rejected_while_tokens_idle: self.idle_denials,
            limiter_store_errors,
            tokens_dripped,
        }
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }
}

/// How long a run may go on after its end to let in-flight pure-Redis requests finish.
pub fn drain_limit(sc: &Scenario) -> Duration {
    Duration::from_secs_f64(sc.timeout_ms / 1e3) + Duration::from_secs(1)
}
