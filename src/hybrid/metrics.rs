//! A hybrid limiter's metrics handles (the metric names and labels are in [`crate::telemetry`]).

use std::time::Duration;

use metrics::Gauge;

use crate::telemetry::{labels, LeaseMetrics, LeaseTotals, DEMAND, FAIR_SHARE};

use super::HybridStats;

/// A hybrid limiter's handles.
#[derive(Debug)]
pub(crate) struct HybridMetrics {
    lease: LeaseMetrics,
    demand: Gauge,
    share: Gauge,
}

/// The totals published so far (what the next publication subtracts).
#[derive(Debug, Default)]
pub(crate) struct Published(LeaseTotals);

impl HybridMetrics {
    /// Handles for `limiter`, whose failure policy is named `policy`.
    pub(crate) fn new(limiter: &str, policy: &'static str) -> Self {
        let lease = LeaseMetrics::new(limiter, "hybrid", policy);
        let name = labels(limiter, &[("mode", "hybrid")]);
        HybridMetrics {
            lease,
            demand: metrics::gauge!(DEMAND, &name),
            share: metrics::gauge!(FAIR_SHARE, &name),
        }
    }

    /// A lease call took `rtt` (recorded by the background task as it returns).
    pub(crate) fn lease_returned(&self, rtt: Duration) {
        self.lease.lease_returned(rtt);
    }

    /// A lease granted `tokens` (> 0).
    pub(crate) fn granted(&self, tokens: u64) {
        self.lease.granted(tokens);
    }

    /// Publishes `stats` and `admitted` (cumulative totals): counters by what they grew since
    /// `last`, gauges as they are. A total that reads lower than before publishes nothing.
    pub(crate) fn publish(&self, last: &mut Published, stats: &HybridStats, admitted: u64) {
        let now = LeaseTotals {
            admitted,
            denied: stats.tokens_denied,
            leases: stats.leases,
            store_errors: stats.store_errors,
            leased: stats.tokens_leased,
            over_limit: stats.over_limit,
            releases: stats.releases,
            released: stats.tokens_released,
            expired: stats.tokens_expired,
            degraded: stats.tokens_admitted_degraded,
        };
        self.lease.publish(&mut last.0, &now);
        self.lease.local.set(stats.local_tokens as f64);
        self.lease.set_circuit(stats.circuit_open);
        self.demand.set(stats.demand_mtps as f64 / 1_000.0);
        self.share.set(stats.share_mtps as f64 / 1_000.0);
    }
}
