//! A keyed hybrid limiter's metrics handles (the metric names and labels are in
//! [`crate::telemetry`]).

use std::time::Duration;

use metrics::{Counter, Gauge};

use crate::telemetry::{
    bump, labels, LeaseMetrics, LeaseTotals, CREATED_KEYS, EVICTED_KEYS, LIVE_KEYS, REFUSED_KEYS,
};

use super::KeyedStats;

/// A keyed hybrid limiter's handles: the leasing family with `mode="keyed-hybrid"` on every
/// metric (so they never add into a plain hybrid limiter's series of the same name), and the
/// keys' own. Nothing is labelled by key: the number of keys is unbounded.
#[derive(Debug)]
pub(crate) struct KeyedMetrics {
    lease: LeaseMetrics,
    live: Gauge,
    created: Counter,
    evicted_idle: Counter,
    evicted_at_cap: Counter,
    refused_at_cap: Counter,
    refused_busy: Counter,
}

/// What a keyed limiter published so far.
#[derive(Debug, Default)]
pub(crate) struct KeyedPublished {
    lease: LeaseTotals,
    created: u64,
    evicted_idle: u64,
    evicted_at_cap: u64,
    refused_at_cap: u64,
    refused_busy: u64,
}

/// The `mode` of a keyed hybrid limiter's metrics.
pub(crate) const KEYED_HYBRID: &str = "keyed-hybrid";

impl KeyedMetrics {
    /// Handles for keyed limiter `limiter`, whose failure policy is named `policy`.
    pub(crate) fn new(limiter: &str, policy: &'static str) -> Self {
        let mode = [("mode", KEYED_HYBRID)];
        let lease = LeaseMetrics::new(limiter, KEYED_HYBRID, policy);
        let name = labels(limiter, &mode);
        let reason = |r| labels(limiter, &[("mode", KEYED_HYBRID), ("reason", r)]);
        KeyedMetrics {
            lease,
            live: metrics::gauge!(LIVE_KEYS, &name),
            created: metrics::counter!(CREATED_KEYS, &name),
            evicted_idle: metrics::counter!(EVICTED_KEYS, &reason("idle")),
            evicted_at_cap: metrics::counter!(EVICTED_KEYS, &reason("cap")),
            refused_at_cap: metrics::counter!(REFUSED_KEYS, &reason("cap")),
            refused_busy: metrics::counter!(REFUSED_KEYS, &reason("busy")),
        }
    }

    /// A lease call took `rtt` (recorded by the worker as it returns).
    pub(crate) fn lease_returned(&self, rtt: Duration) {
        self.lease.lease_returned(rtt);
    }

    /// A lease granted `tokens` (> 0).
    pub(crate) fn granted(&self, tokens: u64) {
        self.lease.granted(tokens);
    }

    /// Publishes `stats` (cumulative totals) by what they grew since `last`, and the gauges.
    /// `held` is `Some((admitted, local tokens))` when the worker has just summed the tokens
    /// every key holds (admitted tokens are derived from that sum, see the module docs), else
    /// `None`: admitted tokens and the local tokens gauge then wait for the next sum. Says
    /// whether any counter grew.
    pub(crate) fn publish(
        &self,
        last: &mut KeyedPublished,
        stats: &KeyedStats,
        held: Option<(u64, u64)>,
    ) -> bool {
        let now = LeaseTotals {
            admitted: held.map_or(last.lease.admitted, |(admitted, _)| admitted),
            denied: stats.tokens_denied,
            leases: stats.leases,
            store_errors: stats.store_errors,
            leased: stats.tokens_leased,
            over_limit: stats.over_limit,
            releases: stats.releases,
            released: stats.tokens_released,
            expired: stats.tokens_lost,
            degraded: stats.tokens_admitted_degraded,
        };
        let grew = self.lease.publish(&mut last.lease, &now)
            | bump(&self.created, &mut last.created, stats.keys_created)
            | bump(
                &self.evicted_idle,
                &mut last.evicted_idle,
                stats.evicted_idle,
            )
            | bump(
                &self.evicted_at_cap,
                &mut last.evicted_at_cap,
                stats.evicted_at_cap,
            )
            | bump(
                &self.refused_at_cap,
                &mut last.refused_at_cap,
                stats.refused_at_cap,
            )
            | bump(
                &self.refused_busy,
                &mut last.refused_busy,
                stats.refused_busy,
            );
        if let Some((_, local)) = held {
            self.lease.local.set(local as f64);
        }
        self.lease.set_circuit(stats.circuit_open);
        self.live.set(stats.live_keys as f64);
        grew
    }
}
