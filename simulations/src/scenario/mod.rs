//! Scenario files: what fleet to simulate, under what traffic, with which faults.
//!
//! A scenario is a TOML file (see `simulations/scenarios/`). Every key has a documented default
//! except `name`, `duration_s`, `rate`, `nodes` and `[demand] total_rps`; unknown keys are
//! rejected so a typo cannot silently fall back to a default.
//!
//! ```toml
//! name = "skewed"
//! seed = 42
//! duration_s = 60
//! rate = 2000          # tokens per second, fleet-wide
//! burst = 200          # bucket capacity
//! nodes = 10
//! window_ms = 1000     # metric window
//! modes = ["pure-redis", "hybrid", "hybrid-fixed", "static-share"]
//!
//! [demand]
//! pattern = "zipf"     # uniform | zipf | hot_node | moving_hotspot | on_off
//! total_rps = 4000
//! zipf_s = 1.2
//!
//! [[events]]
//! at_s = 20
//! kind = "node_crash"  # node_crash | node_join | store_outage | latency_spike
//! node = 0
//! ```
//!
//! Store-model extensions: `rtt_us` (mean round trip, default 90), `rtt_min_us` (its floor,
//! default two thirds of the mean; the rest is an exponential tail), the Redis server time of
//! each kind of call — `service_us` (a node's lease on terms), `service_pure_us` (an anonymous
//! lease: a pure-mode decision or a fixed batch), `service_release_us` (a release) and
//! `service_command_us` (a plain command of the lock-based mode), defaults measured on a real
//! redis-server (see [`MEASURED_SERVICE_US`]) — `timeout_ms` (client response timeout, default
//! 50), `lease_timeout_ms` (a node's lease and release calls, default 3 × `timeout_ms` as in
//! `RedisStore`) and `batch` (the `hybrid-fixed` lease size, default `burst / nodes`, at least 1).
//!
//! `prefetch = false` builds the hybrid modes' limiters with `HybridBuilder::prefetch(false)`:
//! each node leases on first demand instead of when it is built (default `true`, the library's
//! default).
//!
//! `try_acquire = true` has the hybrid modes' nodes ask with the synchronous `try_acquire`
//! instead of `acquire_now` (default `false`): the call a hot path that cannot await makes,
//! which never decides in the store (see `AdaptiveLease::per_request_below`).
//!
//! `on_store_failure` (a policy's name as in a limiters file: `"fail-open"`, `"fail-closed"`,
//! `"local-fallback"`, `"last-known-share"`) and `expected_nodes` (default `nodes`) set the
//! failure policy of every mode that has one. By default the hybrid modes fall back to
//! `local-fallback` with `expected_nodes = nodes` (each node enforces its part of the rate, as
//! the failure-policy docs tell users to size it) and `pure-redis` returns the store's error;
//! set one policy to compare the modes through an outage on the same terms. A `[lease]` table
//! sets the `hybrid` and `hybrid-rate` modes' `AdaptiveLease`: `horizon_ms`, `rate_leases`
//! (`hybrid` only), `per_request_below`, `idle_after_ms`.
//!
//! `pure_share` (default 0) makes that part of the nodes run pure-mode limiters in the hybrid
//! modes, on the same bucket: a fleet part-way through a move from pure mode to leasing, or
//! clients in another language beside leasing nodes. The pure nodes are spread evenly over the
//! node indices (every other node at 0.5), so over the demand ranks too; reports give each
//! group's acceptance.
//!
//! `algorithm` picks what every limiter counts with: `token-bucket` (the default),
//! `fixed-window` or `sliding-window` (both need `burst = rate`: one-second windows), or
//! `leaky-bucket`. The hybrid modes need one that leases in batches (the token bucket or the
//! fixed window); `lock-based` is a token bucket of its own.

mod defaults;
mod mode;
mod traffic;

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use ratelease::{AdaptiveLease, Algorithm, FailurePolicy, Quota};
use serde::{Deserialize, Serialize};

// The `#[serde(default = "…")]` functions.
use defaults::*;
pub use defaults::{ServiceUs, MEASURED_SERVICE_US};
pub use mode::Mode;
pub use traffic::{Demand, Event, EventKind, NodeLife, Pattern};

/// The largest fleet a scenario may have.
pub const MAX_NODES: usize = 1_000_000;

/// One simulated fleet and its traffic, as read from a scenario file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Name; also the default report directory `target/sim/<name>/`.
    pub name: String,
    /// One line shown in the summary.
    #[serde(default)]
    pub description: String,
    /// Master seed of every random choice (overridden by `--seed`).
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Simulated time, in seconds.
    pub duration_s: f64,
    /// Fleet-wide rate, tokens per second.
    pub rate: u64,
    /// Bucket capacity (default: `rate`, a second of traffic, as `Quota::per_second(rate)`
    /// has: the library's default).
    #[serde(default)]
    pub burst: Option<u64>,
    /// Number of nodes (processes sharing the limit), including nodes that join later.
    pub nodes: usize,
    /// Metric window, in milliseconds.
    #[serde(default = "default_window_ms")]
    pub window_ms: u64,
    /// Traffic pattern.
    pub demand: Demand,
    /// Faults and fleet changes.
    #[serde(default)]
    pub events: Vec<Event>,
    /// Modes compared, in this order.
    #[serde(default = "Mode::all")]
    pub modes: Vec<Mode>,
    /// Mean store round trip, µs.
    #[serde(default = "default_rtt_us")]
    pub rtt_us: f64,
    /// Shortest store round trip, µs (default two thirds of `rtt_us`).
    #[serde(default)]
    pub rtt_min_us: Option<f64>,
    /// Redis server time of a node's lease on terms, µs.
    #[serde(default = "default_service_us")]
    pub service_us: f64,
    /// Redis server time of an anonymous lease (a pure-mode decision, a fixed batch), µs.
    #[serde(default = "default_service_pure_us")]
    pub service_pure_us: f64,
    /// Redis server time of a release, µs.
    #[serde(default = "default_service_release_us")]
    pub service_release_us: f64,
    /// Redis server time of a plain command (lock-based mode), µs.
    #[serde(default = "default_service_command_us")]
    pub service_command_us: f64,
    /// Client response timeout of a store call, ms.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: f64,
    /// Client timeout of a node's lease or release call, ms (default
    /// [`ratelease::LEASE_TIMEOUT_FACTOR`] × `timeout_ms`, as `RedisStore`'s).
    #[serde(default)]
    pub lease_timeout_ms: Option<f64>,
    /// Lease size of `hybrid-fixed` (default `burst / nodes`, at least 1).
    #[serde(default)]
    pub batch: Option<u64>,
    /// Whether hybrid nodes lease their first batch when they are built (`true`, the
    /// library's default) or on first demand (`false`: `HybridBuilder::prefetch(false)`).
    #[serde(default = "default_prefetch", skip_serializing_if = "is_true")]
    pub prefetch: bool,
    /// Whether hybrid nodes ask with the synchronous `try_acquire` (`true`) rather than
    /// `acquire_now` (`false`, the default).
    #[serde(default, skip_serializing_if = "is_false")]
    pub try_acquire: bool,
    /// The failure policy of every mode that has one, by its name in a limiters file
    /// (`"fail-open"`, `"fail-closed"`, `"local-fallback"`, `"last-known-share"`; see the
    /// module docs for the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_store_failure: Option<String>,
    /// The fleet the failure policy divides the quota by (default `nodes`): the named
    /// policy's, or the hybrid modes' default `local-fallback`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_nodes: Option<u32>,
    /// The `hybrid` and `hybrid-rate` modes' lease settings (default: the library's).
    #[serde(default, skip_serializing_if = "LeaseSettings::is_default")]
    pub lease: LeaseSettings,
    /// The part of the nodes that run pure-mode limiters in the hybrid modes (default 0;
    /// see the module docs).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pure_share: f64,
    /// What every limiter counts with (default the token bucket).
    #[serde(
        default,
        with = "algorithm_name",
        skip_serializing_if = "algorithm_name::is_default"
    )]
    pub algorithm: Algorithm,
    /// Every node's life, worked out from `events` once (see [`Scenario::lives`]).
    #[serde(skip)]
    lives: OnceLock<Vec<NodeLife>>,
}

/// The `[lease]` table: settings of `AdaptiveLease`, the `hybrid` and `hybrid-rate` modes'
/// policy, each unset by default (the library's default then).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseSettings {
    /// `AdaptiveLease::horizon`, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub horizon_ms: Option<f64>,
    /// `AdaptiveLease::rate_leases` (`hybrid` only: `hybrid-rate` forces them on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_leases: Option<bool>,
    /// `AdaptiveLease::per_request_below`, tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_request_below: Option<f64>,
    /// `AdaptiveLease::idle_after`, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_after_ms: Option<f64>,
}

impl LeaseSettings {
    /// Whether nothing is set.
    pub fn is_default(&self) -> bool {
        *self == LeaseSettings::default()
    }

    /// `policy` with these settings; `rate_leases` only if `rate_leases_too`.
    pub fn apply(&self, mut policy: AdaptiveLease, rate_leases_too: bool) -> AdaptiveLease {
        if let Some(ms) = self.horizon_ms {
            policy = policy.horizon(Duration::from_secs_f64(ms / 1e3));
        }
        if let (Some(on), true) = (self.rate_leases, rate_leases_too) {
            policy = policy.rate_leases(on);
        }
        if let Some(tokens) = self.per_request_below {
            policy = policy.per_request_below(tokens);
        }
        if let Some(ms) = self.idle_after_ms {
            policy = policy.idle_after(Duration::from_secs_f64(ms / 1e3));
        }
        policy
    }
}

/// An [`Algorithm`] in a scenario file: its name (`fixed-window`, …).
mod algorithm_name {
    use ratelease::Algorithm;
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn is_default(a: &Algorithm) -> bool {
        *a == Algorithm::default()
    }

    pub fn serialize<S: Serializer>(a: &Algorithm, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(a.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Algorithm, D::Error> {
        let name = String::deserialize(d)?;
        Algorithm::from_name(&name).map_err(D::Error::custom)
    }
}

/// Nanoseconds in a second, as a float.
const NS_PER_S: f64 = 1e9;

/// Seconds (a scenario value) to whole nanoseconds.
pub fn s_to_ns(s: f64) -> u64 {
    (s * NS_PER_S).round() as u64
}

impl Scenario {
    /// Reads and validates a scenario file.
    ///
    /// # Errors
    /// If the file cannot be read, is not valid TOML for a scenario, or fails [`validate`](Self::validate).
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read scenario {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("invalid scenario {}", path.display()))
    }

    /// Parses and validates a scenario from TOML text.
    ///
    /// # Errors
    /// As [`load`](Self::load).
    pub fn parse(text: &str) -> Result<Self> {
        let scenario: Scenario = toml::from_str(text)?;
        scenario.validate()?;
        Ok(scenario)
    }

    /// Checks every value, so the simulation can rely on them.
    ///
    /// # Errors
    /// Names the first invalid key.
    pub fn validate(&self) -> Result<()> {
        ensure!(!self.name.is_empty(), "name must not be empty");
        ensure!(
            self.name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
            "name {:?} must be ASCII letters, digits, '-' or '_' (it names the report directory)",
            self.name
        );
        ensure!(
            self.duration_s.is_finite() && self.duration_s > 0.0 && self.duration_s <= 3600.0,
            "duration_s must be in (0, 3600]"
        );
        ensure!(
            self.nodes >= 1 && self.nodes <= MAX_NODES,
            "nodes must be in 1..={MAX_NODES}"
        );
        ensure!(self.window_ms >= 1, "window_ms must be at least 1");
        ensure!(!self.modes.is_empty(), "modes must not be empty");
        for (i, m) in self.modes.iter().enumerate() {
            ensure!(!self.modes[..i].contains(m), "mode {m} is listed twice");
        }
        self.quota()?;
        let a = self.algorithm;
        ensure!(
            !matches!(a, Algorithm::FixedWindow | Algorithm::SlidingWindow)
                || self.burst() == self.rate,
            "algorithm {a} needs burst = rate (a window's budget is its rate)"
        );
        for m in &self.modes {
            let hybrid = matches!(m, Mode::Hybrid | Mode::HybridFixed);
            ensure!(
                !hybrid || a.leases_in_batches(),
                "mode {m} cannot lease batches of algorithm {a}"
            );
            ensure!(
                *m != Mode::LockBased || a == Algorithm::TokenBucket,
                "mode {m} runs only the token bucket"
            );
        }
        ensure!(
            (0.0..1.0).contains(&self.pure_share),
            "pure_share must be in [0, 1): the part of the nodes that decide in pure mode"
        );
        self.failure_policy()?;
        for (key, ms) in [
            ("lease.horizon_ms", self.lease.horizon_ms),
            ("lease.idle_after_ms", self.lease.idle_after_ms),
        ] {
            ensure!(
                ms.is_none_or(|ms| ms.is_finite() && ms > 0.0 && ms <= 3_600_000.0),
                "{key} must be in (0, 3 600 000]"
            );
        }
        ensure!(
            self.lease
                .per_request_below
                .is_none_or(|t| t.is_finite() && t >= 0.0),
            "lease.per_request_below must be a number of tokens, at least 0"
        );
        ensure!(
            self.rtt_us.is_finite() && self.rtt_us >= 0.0,
            "rtt_us must be ≥ 0"
        );
        let min = self.rtt_min_us();
        ensure!(
            min.is_finite() && min >= 0.0 && min <= self.rtt_us,
            "rtt_min_us must be in [0, rtt_us]"
        );
        ensure!(
            [
                self.service_us,
                self.service_pure_us,
                self.service_release_us,
                self.service_command_us
            ]
            .iter()
            .all(|s| s.is_finite() && *s >= 0.0),
            "service_us, service_pure_us, service_release_us and service_command_us must be ≥ 0"
        );
        ensure!(
            self.timeout_ms.is_finite() && self.timeout_ms > 0.0,
            "timeout_ms must be > 0"
        );
        ensure!(
            self.lease_timeout_ms
                .is_none_or(|t| t.is_finite() && t >= self.timeout_ms),
            "lease_timeout_ms must be at least timeout_ms"
        );
        if let Some(b) = self.batch {
            ensure!(b >= 1, "batch must be at least 1");
        }
        let d = &self.demand;
        ensure!(
            d.total_rps.is_finite() && d.total_rps >= 0.0 && d.total_rps <= 10_000_000.0,
            "demand.total_rps must be in [0, 1e7]"
        );
        ensure!(
            d.zipf_s.is_finite() && d.zipf_s >= 0.0,
            "demand.zipf_s must be ≥ 0"
        );
        ensure!(
            (0.0..=1.0).contains(&d.hot_share),
            "demand.hot_share must be in [0, 1]"
        );
        ensure!(
            d.move_every_s.is_finite() && d.move_every_s > 0.0,
            "demand.move_every_s must be > 0"
        );
        ensure!(
            d.on_s.is_finite() && d.on_s > 0.0 && d.off_s.is_finite() && d.off_s >= 0.0,
            "demand.on_s must be > 0 and demand.off_s ≥ 0"
        );
        for (i, e) in self.events.iter().enumerate() {
            self.validate_event(e)
                .with_context(|| format!("events[{i}] ({:?} at {} s)", e.kind, e.at_s))?;
        }
        self.compute_lives()?;
        Ok(())
    }

    /// The instants (s) of a fleet event's nodes, in node order: `at_s`, spread evenly over
    /// `duration_s`.
    fn spread(e: &Event, nodes: std::ops::Range<usize>) -> impl Iterator<Item = (usize, f64)> {
        let n = nodes.len().max(1) as f64;
        let (at, step) = (e.at_s, e.duration_s.unwrap_or(0.0) / n);
        let start = nodes.start;
        nodes.map(move |i| (i, at + (i - start) as f64 * step))
    }

    /// Every node's life from the events; an error names the first conflict (two starts or
    /// two ends for one node, an end before the start, a restart outside the node's life).
    fn compute_lives(&self) -> Result<Vec<NodeLife>> {
        let n = self.nodes;
        let mut lives = vec![NodeLife::default(); n];
        let last = |e: &Event| n - e.count.unwrap_or(0).min(n)..n;
        for e in &self.events {
            let set = |slot: &mut Option<f64>, t: f64, node: usize, what: &str| -> Result<()> {
                ensure!(slot.is_none(), "node {node} has more than one {what}");
                *slot = Some(t);
                Ok(())
            };
            match e.kind {
                EventKind::NodeJoin => {
                    let node = e.node.unwrap_or(0);
                    set(&mut lives[node].join_s, e.at_s, node, "start")?;
                }
                EventKind::NodeCrash => {
                    let node = e.node.unwrap_or(0);
                    set(&mut lives[node].leave_s, e.at_s, node, "end")?;
                }
                EventKind::FleetStart => {
                    for (i, t) in Self::spread(e, 0..n) {
                        set(&mut lives[i].join_s, t, i, "start")?;
                    }
                }
                EventKind::ScaleOut => {
                    for (i, t) in Self::spread(e, last(e)) {
                        set(&mut lives[i].join_s, t, i, "start")?;
                    }
                }
                EventKind::ScaleIn => {
                    for (i, t) in Self::spread(e, last(e)) {
                        set(&mut lives[i].leave_s, t, i, "end")?;
                        lives[i].graceful = true;
                    }
                }
                EventKind::RollingRestart => {
                    for (i, t) in Self::spread(e, 0..n) {
                        set(&mut lives[i].restart_s, t, i, "restart")?;
                    }
                }
                EventKind::StoreOutage | EventKind::LatencySpike => {}
            }
        }
        for (i, l) in lives.iter().enumerate() {
            let start = l.join_s.unwrap_or(0.0);
            if let Some(end) = l.leave_s {
                ensure!(start < end, "node {i} ends before it starts");
            }
            if let Some(r) = l.restart_s {
                ensure!(
                    start < r && l.leave_s.is_none_or(|end| r < end),
                    "node {i} restarts outside its life"
                );
            }
        }
        Ok(lives)
    }

    /// Every node's life (see [`NodeLife`]), worked out once.
    pub fn lives(&self) -> &[NodeLife] {
        self.lives.get_or_init(|| {
            // A validated scenario has no conflicts; an unvalidated one reads as a fleet that
            // runs from start to end.
            self.compute_lives()
                .unwrap_or_else(|_| vec![NodeLife::default(); self.nodes])
        })
    }

    fn validate_event(&self, e: &Event) -> Result<()> {
        ensure!(
            e.at_s.is_finite() && e.at_s >= 0.0 && e.at_s < self.duration_s,
            "at_s must be in [0, duration_s)"
        );
        match e.kind {
            EventKind::NodeCrash | EventKind::NodeJoin => {
                let Some(node) = e.node else {
                    bail!("needs `node`");
                };
                ensure!(
                    node < self.nodes,
                    "node {node} does not exist (nodes = {})",
                    self.nodes
                );
            }
            EventKind::FleetStart
            | EventKind::RollingRestart
            | EventKind::ScaleOut
            | EventKind::ScaleIn => {
                if let Some(d) = e.duration_s {
                    ensure!(d.is_finite() && d >= 0.0, "duration_s must be ≥ 0");
                    ensure!(
                        e.at_s + d < self.duration_s,
                        "the event must end before the run does"
                    );
                }
                if matches!(e.kind, EventKind::ScaleOut | EventKind::ScaleIn) {
                    let Some(count) = e.count else {
                        bail!("needs `count`");
                    };
                    ensure!(
                        (1..=self.nodes).contains(&count),
                        "count must be in 1..=nodes ({})",
                        self.nodes
                    );
                }
            }
            EventKind::StoreOutage | EventKind::LatencySpike => {
                let Some(d) = e.duration_s else {
                    bail!("needs `duration_s`");
                };
                ensure!(d.is_finite() && d > 0.0, "duration_s must be > 0");
                if e.kind == EventKind::LatencySpike {
                    let Some(x) = e.extra_ms else {
                        bail!("needs `extra_ms`");
                    };
                    ensure!(x.is_finite() && x >= 0.0, "extra_ms must be ≥ 0");
                }
            }
        }
        Ok(())
    }

    /// The bucket capacity in effect.
    pub fn burst(&self) -> u64 {
        self.burst.unwrap_or(self.rate)
    }

    /// The fleet-wide quota.
    ///
    /// # Errors
    /// If `rate` or `burst` do not make a valid [`Quota`].
    pub fn quota(&self) -> Result<Quota> {
        Quota::with_parts(self.rate, Duration::from_secs(1), self.burst())
            .context("rate and burst do not make a valid quota")
    }

    /// The lease size of `hybrid-fixed`.
    pub fn batch(&self) -> u64 {
        self.batch
            .unwrap_or(self.burst() / self.nodes as u64)
            .max(1)
    }

    /// Shortest round trip, µs.
    pub fn rtt_min_us(&self) -> f64 {
        self.rtt_min_us.unwrap_or(self.rtt_us * 2.0 / 3.0)
    }

    /// Client timeout of a node's lease or release call, ms: as set, else as `RedisStore`'s
    /// default (a multiple of the response timeout); never below the response timeout.
    pub fn lease_timeout_ms(&self) -> f64 {
        self.lease_timeout_ms
            .unwrap_or(self.timeout_ms * f64::from(ratelease::LEASE_TIMEOUT_FACTOR))
            .max(self.timeout_ms)
    }

    /// Simulated time, ns.
    pub fn duration_ns(&self) -> u64 {
        s_to_ns(self.duration_s)
    }

    /// Metric window, ns.
    pub fn window_ns(&self) -> u64 {
        self.window_ms * 1_000_000
    }

    /// Most tokens the bucket allows in `ns` nanoseconds: `burst + rate × W`.
    pub fn allowed_in(&self, ns: u64) -> f64 {
        self.burst() as f64 + self.rate as f64 * ns as f64 / NS_PER_S
    }

    /// The failure policy `on_store_failure` names (with `expected_nodes`, default `nodes`),
    /// if set.
    ///
    /// # Errors
    /// For a name no policy has, or `expected_nodes = 0`.
    pub fn failure_policy(&self) -> Result<Option<FailurePolicy>> {
        let nodes = self.fallback_nodes();
        ensure!(nodes >= 1, "expected_nodes must be at least 1");
        let Some(name) = &self.on_store_failure else {
            return Ok(None);
        };
        FailurePolicy::named(name, nodes)
            .map(Some)
            .with_context(|| {
                format!(
                    "on_store_failure {name:?} is not a policy: fail-open, fail-closed, \
                 local-fallback or last-known-share"
                )
            })
    }

    /// The fleet a failure policy divides the quota by: `expected_nodes`, else `nodes`.
    pub fn fallback_nodes(&self) -> u32 {
        self.expected_nodes
            .unwrap_or(u32::try_from(self.nodes).unwrap_or(u32::MAX))
    }

    /// Whether `node` runs a pure-mode limiter in the hybrid modes (see `pure_share`): the
    /// nodes where `node × pure_share` passes a whole number, spread evenly.
    pub fn runs_pure(&self, node: usize) -> bool {
        let f = self.pure_share;
        f > 0.0 && ((node + 1) as f64 * f).floor() > (node as f64 * f).floor()
    }

    /// When `node` joins, if it has a `node_join` event.
    pub fn join_s(&self, node: usize) -> Option<f64> {
        self.lives().get(node).and_then(|l| l.join_s)
    }

    /// When `node` stops (a crash, or a shutdown at a scale-in), if it does.
    pub fn crash_s(&self, node: usize) -> Option<f64> {
        self.lives().get(node).and_then(|l| l.leave_s)
    }

    /// The same scenario with every defaulted value written out (`burst`, `rtt_min_us`,
    /// `batch`), as reports show it.
    pub fn resolved(mut self) -> Self {
        self.burst = Some(self.burst());
        self.rtt_min_us = Some(self.rtt_min_us());
        self.batch = Some(self.batch());
        self
    }

    /// Applies command-line overrides and re-validates.
    ///
    /// # Errors
    /// If the result is invalid (e.g. an event now lies beyond the shortened duration).
    pub fn with_overrides(
        mut self,
        seed: Option<u64>,
        duration_s: Option<f64>,
        modes: Option<Vec<Mode>>,
    ) -> Result<Self> {
        if let Some(seed) = seed {
            self.seed = seed;
        }
        if let Some(d) = duration_s {
            self.duration_s = d;
            // Events past the new end cannot happen; drop them rather than fail.
            self.events.retain(|e| e.at_s < d);
        }
        if let Some(modes) = modes {
            self.modes = modes;
        }
        self.lives = OnceLock::new();
        self.validate()?;
        Ok(self)
    }

    /// The same scenario with `nodes` nodes (the name gains `-<nodes>`, and the description
    /// says the fleet size it was written for): for sweeps over fleet size. Events that name
    /// a node beyond the new fleet are dropped.
    ///
    /// # Errors
    /// If the result is invalid.
    pub fn with_nodes(mut self, nodes: usize) -> Result<Self> {
        self.name = format!("{}-{nodes}", self.name);
        if nodes != self.nodes && !self.description.is_empty() {
            self.description = format!(
                "Run at {nodes} nodes; as written, for {}: {}",
                self.nodes, self.description
            );
        }
        self.nodes = nodes;
        self.events
            .retain(|e| e.node.is_none_or(|n| n < nodes) && e.count.is_none_or(|c| c <= nodes));
        self.lives = OnceLock::new();
        self.validate()?;
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
        name = "t"
        duration_s = 2
        rate = 100
        nodes = 3
        [demand]
        pattern = "uniform"
        total_rps = 50
    "#;

    #[test]
    fn defaults_fill_in() {
        let s = Scenario::parse(MINIMAL).unwrap();
        // The library's default burst: `Quota::per_second(rate)`'s.
        assert_eq!(s.burst(), 100);
        assert_eq!(
            s.quota().unwrap(),
            ratelease::Quota::per_second(100).unwrap()
        );
        assert_eq!(s.window_ms, 1000);
        assert_eq!(s.modes, Mode::all());
        assert_eq!(s.batch(), 33);
        assert!((s.rtt_min_us() - 60.0).abs() < 1e-9);
        assert_eq!(s.allowed_in(1_000_000_000), 200.0);
    }

    #[test]
    fn rejects_unknown_keys_and_bad_events() {
        let typo = MINIMAL.replace("nodes = 3", "nodes = 3\nnode = 3");
        assert!(Scenario::parse(&typo).is_err());
        let bad = format!("{MINIMAL}\n[[events]]\nat_s = 1\nkind = \"node_crash\"\nnode = 7\n");
        let err = format!("{:#}", Scenario::parse(&bad).unwrap_err());
        assert!(err.contains("node 7 does not exist"), "{err}");
    }

    #[test]
    fn modes_parse_from_cli_names() {
        assert_eq!("hybrid-fixed".parse::<Mode>(), Ok(Mode::HybridFixed));
        assert!("redis".parse::<Mode>().is_err());
    }

    #[test]
    fn overrides_drop_events_past_the_end() {
        let with_event =
            format!("{MINIMAL}\n[[events]]\nat_s = 1.5\nkind = \"node_crash\"\nnode = 0\n");
        let s = Scenario::parse(&with_event)
            .unwrap()
            .with_overrides(Some(9), Some(1.0), Some(vec![Mode::Hybrid]))
            .unwrap();
        assert_eq!((s.seed, s.events.len(), s.modes.len()), (9, 0, 1));
    }
}
