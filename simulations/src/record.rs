//! What one run of one mode records, and its trace hash.
//!
//! A run produces a [`RunLog`]: one [`RequestRecord`] per request of the demand trace (same
//! order), one [`CallRecord`] per store call, and a few counters. Every metric is computed from
//! the log afterwards ([`crate::metrics`]), so the simulated and the live runs share all metric
//! code.
//!
//! The trace hash is FNV-1a over every record, in order. Two runs with the same seed must give
//! the same hash; the hash is printed and written to `report.json`, and a test compares it.

use std::time::Duration;

use crate::rng::Fnv64;
use crate::scenario::Mode;

/// What happened to one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Allowed.
    Admitted,
    /// Denied by the limiter.
    Rejected,
    /// The limiter returned an error (a store failure in pure-Redis mode); counted as rejected.
    Error,
    /// Not decided (still in flight when the run ended, or lost in a crash).
    Undecided,
}

impl Outcome {
    fn code(self) -> u8 {
        match self {
            Outcome::Admitted => 1,
            Outcome::Rejected => 2,
            Outcome::Error => 3,
            Outcome::Undecided => 4,
        }
    }
}

/// One request and its fate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestRecord {
    /// When it arrived at its node, ns.
    pub arrival_ns: u64,
    /// The node.
    pub node: u32,
    /// What happened.
    pub outcome: Outcome,
    /// When the decision took effect on the bucket, ns: the local spend for hybrid and
    /// static-share, the script's execution on the server for pure-Redis. Window metrics
    /// count admissions at this time.
    pub decided_ns: u64,
    /// Time the caller waited for the decision, ns.
    pub latency_ns: u64,
}

impl RequestRecord {
    /// A request not decided yet.
    pub fn pending(arrival_ns: u64, node: u32) -> Self {
        RequestRecord {
            arrival_ns,
            node,
            outcome: Outcome::Undecided,
            decided_ns: arrival_ns,
            latency_ns: 0,
        }
    }
}

/// Kinds of store call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    /// Take tokens.
    Lease,
    /// Give tokens back.
    Release,
    /// A plain command of the lock-based mode (lock, read, write or unlock).
    Command,
}

/// One store call, as the client issued it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallRecord {
    /// When the client sent it, ns.
    pub t_ns: u64,
    /// The calling node.
    pub node: u32,
    /// Lease or release.
    pub kind: CallKind,
}

/// Everything one mode's run recorded.
#[derive(Debug, Clone)]
pub struct RunLog {
    /// The mode.
    pub mode: Mode,
    /// One record per request of the demand trace, in trace order.
    pub requests: Vec<RequestRecord>,
    /// Store calls, in the order they were issued.
    pub calls: Vec<CallRecord>,
    /// Total store calls (`calls.len()` when simulated; from `INFO commandstats` when live).
    pub store_calls: u64,
    /// Tokens granted by the store that never served a request: held by a crashed node, or
    /// granted to a call whose reply never arrived (timeout, crash in flight).
    pub tokens_stranded: u64,
    /// Store calls that failed.
    pub store_errors: u64,
    /// Redis server time the run's calls took, ns (modelled when simulated; from `INFO
    /// commandstats` when live).
    pub redis_busy_ns: u64,
    /// Denials on one node while another live node held at least one unused token.
    pub rejected_while_tokens_idle: u64,
    /// Tokens the hybrid limiters' rate leases dripped into their local buckets (0 for other
    /// modes). Not in the trace hash: it follows from the run.
    pub tokens_dripped: u64,
    /// Wall-clock time the run took.
    pub wall: Duration,
}

impl RunLog {
    /// FNV-1a over every request and call record and the counters, in order.
    pub fn trace_hash(&self) -> u64 {
        let mut h = Fnv64::default();
        h.write(self.mode.as_str().as_bytes());
        for r in &self.requests {
            h.write_u64(r.arrival_ns);
            h.write_u64(u64::from(r.node));
            h.write(&[r.outcome.code()]);
            h.write_u64(r.decided_ns);
            h.write_u64(r.latency_ns);
        }
        for c in &self.calls {
            h.write_u64(c.t_ns);
            h.write_u64(u64::from(c.node));
            h.write(&[match c.kind {
                CallKind::Lease => 0,
                CallKind::Release => 1,
                CallKind::Command => 2,
            }]);
        }
        h.write_u64(self.store_calls);
        h.write_u64(self.tokens_stranded);
        h.write_u64(self.store_errors);
        h.write_u64(self.redis_busy_ns);
        h.write_u64(self.rejected_while_tokens_idle);
        h.finish()
    }
}
