//! A concurrency limiter's metrics handles (the metric names and labels are in
//! [`crate::telemetry`]).

use std::time::Duration;

use metrics::{Counter, Gauge, Histogram};

use crate::telemetry::{
    bump, describe, labels, ACQUIRED_PERMITS, ACQUIRE_DURATION, CONCURRENCY_CALLS,
    CONCURRENCY_ERRORS, DENIED_PERMITS, HELD_PERMITS, POOLED_PERMITS,
};

use super::ConcurrencyStats;

/// A concurrency limiter's handles (`mode` is `pure` or `hybrid`).
#[derive(Debug)]
pub(crate) struct ConcurrencyMetrics {
    acquired: Counter,
    denied: Counter,
    held: Gauge,
    /// Hybrid only.
    pooled: Option<Gauge>,
    acquire_calls: Counter,
    release_calls: Counter,
    sync_calls: Counter,
    errors: Counter,
    acquire_duration: Histogram,
}

/// What a concurrency limiter published so far.
#[derive(Debug, Default)]
pub(crate) struct ConcurrencyPublished {
    acquired: u64,
    denied: u64,
    acquires: u64,
    releases: u64,
    syncs: u64,
    errors: u64,
}

impl ConcurrencyMetrics {
    /// Handles for concurrency limiter `limiter`, hybrid or pure.
    pub(crate) fn new(limiter: &str, hybrid: bool) -> Self {
        describe();
        let mode = if hybrid { "hybrid" } else { "pure" };
        let name = labels(limiter, &[("mode", mode)]);
        let op = |op| labels(limiter, &[("mode", mode), ("op", op)]);
        ConcurrencyMetrics {
            acquired: metrics::counter!(ACQUIRED_PERMITS, &name),
            denied: metrics::counter!(DENIED_PERMITS, &name),
            held: metrics::gauge!(HELD_PERMITS, &name),
            pooled: hybrid.then(|| metrics::gauge!(POOLED_PERMITS, &name)),
            acquire_calls: metrics::counter!(CONCURRENCY_CALLS, &op("acquire")),
            release_calls: metrics::counter!(CONCURRENCY_CALLS, &op("release")),
            sync_calls: metrics::counter!(CONCURRENCY_CALLS, &op("sync")),
            errors: metrics::counter!(CONCURRENCY_ERRORS, &name),
            acquire_duration: metrics::histogram!(ACQUIRE_DURATION, &name),
        }
    }

    /// Pure mode: an acquire call returned after `elapsed` (recorded on the caller's task,
    /// which made the call).
    pub(crate) fn acquire_returned(&self, elapsed: Duration) {
        self.acquire_duration.record(elapsed);
    }

    /// Publishes `stats`, `acquired` and `denied` (cumulative totals) by what they grew since
    /// `last`, and the gauges. Says whether any counter grew.
    pub(crate) fn publish(
        &self,
        last: &mut ConcurrencyPublished,
        stats: &ConcurrencyStats,
        acquired: u64,
        denied: u64,
    ) -> bool {
        let grew = bump(&self.acquired, &mut last.acquired, acquired)
            | bump(&self.denied, &mut last.denied, denied)
            | bump(&self.acquire_calls, &mut last.acquires, stats.acquires)
            | bump(&self.release_calls, &mut last.releases, stats.releases)
            | bump(&self.sync_calls, &mut last.syncs, stats.syncs)
            | bump(&self.errors, &mut last.errors, stats.store_errors);
        self.held.set(stats.in_use as f64);
        if let Some(pooled) = &self.pooled {
            pooled.set(stats.pooled as f64);
        }
        grew
    }
}
