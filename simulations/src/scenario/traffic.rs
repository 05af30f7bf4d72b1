//! What a scenario's fleet is asked to do: the demand (rate, skew, pattern over time) and
//! the fleet events (start, restarts, scale-out and scale-in, crashes, outages).

use serde::{Deserialize, Serialize};

/// How traffic is spread over nodes and time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Demand {
    /// The spread.
    pub pattern: Pattern,
    /// Fleet-wide requests per second (the long-run mean for `on_off`).
    pub total_rps: f64,
    /// Zipf exponent: node `k` (1-based) gets weight `1 / k^s`.
    #[serde(default = "default_zipf_s")]
    pub zipf_s: f64,
    /// Share of all traffic on the hot node (`hot_node`, `moving_hotspot`).
    #[serde(default = "default_hot_share")]
    pub hot_share: f64,
    /// Seconds between hot-node moves (`moving_hotspot`).
    #[serde(default = "default_move_every_s")]
    pub move_every_s: f64,
    /// Seconds each node is on (`on_off`).
    #[serde(default = "default_on_s")]
    pub on_s: f64,
    /// Seconds each node is off (`on_off`).
    #[serde(default = "default_off_s")]
    pub off_s: f64,
}

/// Traffic patterns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pattern {
    /// Every node gets the same share.
    Uniform,
    /// Node `k` gets a share proportional to `1 / k^zipf_s`.
    Zipf,
    /// Node 0 gets `hot_share`, the others split the rest evenly.
    HotNode,
    /// Like `hot_node`, but the hot node changes every `move_every_s` (0, 1, 2, …).
    MovingHotspot,
    /// Each node alternates `on_s` on and `off_s` off, phases spread evenly over the fleet.
    OnOff,
}

impl Pattern {
    /// The pattern's name in scenario files.
    pub fn as_str(self) -> &'static str {
        match self {
            Pattern::Uniform => "uniform",
            Pattern::Zipf => "zipf",
            Pattern::HotNode => "hot_node",
            Pattern::MovingHotspot => "moving_hotspot",
            Pattern::OnOff => "on_off",
        }
    }
}

/// A timed fault or fleet change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Event {
    /// When, in seconds from the start.
    pub at_s: f64,
    /// What.
    pub kind: EventKind,
    /// The node (`node_crash`, `node_join`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<usize>,
    /// How many nodes (`scale_out`, `scale_in`: the last `count` nodes of the fleet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<usize>,
    /// How long (`store_outage`, `latency_spike`); for the fleet events (`fleet_start`,
    /// `rolling_restart`, `scale_out`, `scale_in`), the period their nodes are spread evenly
    /// over (default 0: all at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<f64>,
    /// Milliseconds added to every round trip (`latency_spike`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_ms: Option<f64>,
}

/// Kinds of [`Event`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// The node's process dies: its limiter is aborted (leased tokens are lost) and its traffic
    /// moves to the surviving nodes.
    NodeCrash,
    /// The node starts at `at_s`: no limiter and no traffic before.
    NodeJoin,
    /// Every node starts at `at_s` (spread over `duration_s`), as when a whole fleet is
    /// deployed or fails over at once.
    FleetStart,
    /// Every node's process is replaced, one after another over `duration_s`: the old one
    /// shuts down (gives its tokens back), a new one starts cold; traffic goes on.
    RollingRestart,
    /// The last `count` nodes start at `at_s` (spread over `duration_s`).
    ScaleOut,
    /// The last `count` nodes shut down at `at_s` (spread over `duration_s`), giving their
    /// tokens back; their traffic moves to the others.
    ScaleIn,
    /// Store calls arriving during the outage get no answer; clients time out.
    StoreOutage,
    /// `extra_ms` is added to every round trip during the spike.
    LatencySpike,
}

/// When one node runs: from its start to its end, and whether its process is replaced in
/// between. Worked out from the scenario's events.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct NodeLife {
    /// When it starts, s (`None`: at time zero, before any traffic).
    pub join_s: Option<f64>,
    /// When it stops, s (`None`: it runs to the end).
    pub leave_s: Option<f64>,
    /// Whether it stops by shutting down (giving its tokens back, `scale_in`) rather than by
    /// crashing (`node_crash`).
    pub graceful: bool,
    /// When its process is replaced by a new one (`rolling_restart`): the old one shuts down,
    /// the new one starts cold with a new node id; its traffic goes on.
    pub restart_s: Option<f64>,
}

pub(super) fn default_zipf_s() -> f64 {
    1.0
}

pub(super) fn default_hot_share() -> f64 {
    0.5
}

pub(super) fn default_move_every_s() -> f64 {
    10.0
}

pub(super) fn default_on_s() -> f64 {
    1.0
}

pub(super) fn default_off_s() -> f64 {
    1.0
}
