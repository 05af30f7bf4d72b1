//! Metrics and traces: what the limiters report through the [`metrics`] facade and [`tracing`].
//!
//! Nothing is exported unless the application installs a `metrics` recorder (for example
//! `metrics-exporter-prometheus`, see `examples/prometheus.rs`) or a `tracing` subscriber;
//! without one every call below is a no-op on a handle.
//!
//! # Metrics
//!
//! Every metric carries the label `limiter` (the limiter's name); those both modes report also
//! carry `mode` (`hybrid` or `pure`). Two limiters with the same name and mode in one process
//! add up into the same series.
//!
//! | name | type | labels | meaning |
//! | --- | --- | --- | --- |
//! | `ratelease_admitted_tokens_total` | counter | `limiter`, `mode` | tokens admitted to callers (hybrid: spent from leases, plus those the failure policy admitted) |
//! | `ratelease_denied_tokens_total` | counter | `limiter`, `mode` | tokens denied to callers |
//! | `ratelease_leases_total` | counter | `limiter`, `mode` | lease calls to the store, failed ones included (pure mode: one per decision) |
//! | `ratelease_store_errors_total` | counter | `limiter`, `mode` | store calls (leases and releases) that failed |
//! | `ratelease_lease_duration_seconds` | histogram | `limiter`, `mode` | round trip of each lease call, as the limiter saw it |
//! | `ratelease_leased_tokens_total` | counter | `limiter` | hybrid: tokens granted by leases |
//! | `ratelease_lease_size_tokens` | histogram | `limiter` | hybrid: tokens granted per lease that granted any |
//! | `ratelease_over_limit_total` | counter | `limiter` | hybrid: lease calls answered "not enough tokens" |
//! | `ratelease_releases_total` | counter | `limiter` | hybrid: release calls (unspent tokens given back) |
//! | `ratelease_released_tokens_total` | counter | `limiter` | hybrid: tokens given back |
//! | `ratelease_expired_tokens_total` | counter | `limiter` | hybrid: tokens dropped unspent (their lease expired, or giving them back failed) |
//! | `ratelease_degraded_tokens_total` | counter | `limiter`, `policy` | hybrid: tokens the [`FailurePolicy`](crate::FailurePolicy) admitted while the circuit was open (also counted as admitted) |
//! | `ratelease_local_tokens` | gauge | `limiter` | hybrid: tokens in the local bucket |
//! | `ratelease_circuit_open` | gauge | `limiter`, `policy` | hybrid: 1 while the circuit is open (the last lease failed), else 0 |
//! | `ratelease_demand_tokens_per_second` | gauge | `limiter` | hybrid: measured demand (admitted and denied) |
//! | `ratelease_fair_share_tokens_per_second` | gauge | `limiter` | hybrid: fair share the store last reported (0 if none) |
//!
//! The hybrid counters are the [`HybridStats`] fields of the same names;
//! `admitted` is `tokens_leased − tokens_released − tokens_expired − local_tokens +
//! tokens_admitted_degraded`. Admissions of a name that has no central config under
//! [`Unconfigured::Unlimited`](crate::Unconfigured::Unlimited) are not limited and not counted.
//!
//! # How the hybrid limiter publishes, and how stale it is
//!
//! The hot path ([`HybridLimiter::try_acquire`](crate::HybridLimiter::try_acquire)) touches no
//! metric: a shared counter incremented per call would cost the cross-core contention the local
//! bucket is sharded to avoid. The limiter already keeps every total it needs in its own
//! atomics (admitted tokens are derived, see above), so its **background task publishes the
//! differences** since its last publication: a wrapper around the task's future publishes
//! after each time it is polled (every wake: a refill request, a store reply, a timer) and,
//! while the limiter is active — it holds tokens, is blocked by an over-limit reply or an error
//! back-off, or its circuit is open — at least every [`PUBLISH_INTERVAL`]; once more when the
//! task ends, so [`shutdown`](crate::HybridLimiter::shutdown) leaves exact totals
//! ([`abort`](crate::HybridLimiter::abort), a simulated crash, publishes nothing more).
//! Counters and gauges therefore **lag by at most one interval** (one second) while the limiter
//! is active. An inactive limiter holds no tokens, so its callers can only be denied, and a
//! denial wakes the task (or a lease in flight does when it returns), which publishes. The two
//! histograms are recorded by the task as each lease returns.
//!
//! Admitted tokens are read with the local bucket at rest (no chunk of tokens in transit
//! between its words, which would otherwise read as spent; for the few loads that read takes,
//! callers that need a chunk take straight from the reserve instead), and a counter's
//! publication never goes backwards.
//!
//! # Pure mode
//!
//! [`RedisLimiter`](crate::RedisLimiter) makes a store call per decision anyway, so it updates
//! its handles on the caller's task after each call.
//!
//! # Traces
//!
//! Every store call runs in a `DEBUG` span named `store_call`: [`RedisStore`](crate::RedisStore)
//! records `store = "redis"`, `key` (the script's first key), `op` (the script's first
//! argument: `lease`, `release`, `config_get`, …), `script` (its SHA-1) and, if the call failed,
//! `error`; [`MemoryStore`](crate::MemoryStore) records `store = "memory"`, `limiter` and `op`.
//!
//! # Recorders
//!
//! Handles are registered once, when a limiter is built, with the recorder in force then
//! (the global one, or a [`metrics::with_local_recorder`] scope around the build): install the
//! recorder first. Reading the metrics back in a test:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), ratelease::Error> {
//! use metrics_util::debugging::{DebugValue, DebuggingRecorder};
//! use ratelease::{telemetry, MemoryStore, Quota, RedisLimiter};
//!
//! let recorder = DebuggingRecorder::new();
//! let snapshotter = recorder.snapshotter();
//! let limiter = metrics::with_local_recorder(&recorder, || {
//!     RedisLimiter::new("api", Quota::per_second(10)?, MemoryStore::new())
//! })?;
//! limiter.try_acquire(3).await?;
//! let admitted = snapshotter.snapshot().into_vec().into_iter().find_map(|(key, _, _, value)| {
//!     (key.key().name() == telemetry::ADMITTED_TOKENS).then_some(value)
//! });
//! assert_eq!(admitted, Some(DebugValue::Counter(3)));
//! # Ok(()) }
//! ```

use std::future::{poll_fn, Future};
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Unit};

use crate::hybrid::HybridStats;

/// Longest time a hybrid limiter's published metrics lag behind while it is active.
pub const PUBLISH_INTERVAL: Duration = Duration::from_secs(1);

/// `ratelease_admitted_tokens_total`.
pub const ADMITTED_TOKENS: &str = "ratelease_admitted_tokens_total";
/// `ratelease_denied_tokens_total`.
pub const DENIED_TOKENS: &str = "ratelease_denied_tokens_total";
/// `ratelease_leases_total`.
pub const LEASES: &str = "ratelease_leases_total";
/// `ratelease_store_errors_total`.
pub const STORE_ERRORS: &str = "ratelease_store_errors_total";
/// `ratelease_lease_duration_seconds`.
pub const LEASE_DURATION: &str = "ratelease_lease_duration_seconds";
/// `ratelease_leased_tokens_total`.
pub const LEASED_TOKENS: &str = "ratelease_leased_tokens_total";
/// `ratelease_lease_size_tokens`.
pub const LEASE_SIZE: &str = "ratelease_lease_size_tokens";
/// `ratelease_over_limit_total`.
pub const OVER_LIMIT: &str = "ratelease_over_limit_total";
/// `ratelease_releases_total`.
pub const RELEASES: &str = "ratelease_releases_total";
/// `ratelease_released_tokens_total`.
pub const RELEASED_TOKENS: &str = "ratelease_released_tokens_total";
/// `ratelease_expired_tokens_total`.
pub const EXPIRED_TOKENS: &str = "ratelease_expired_tokens_total";
/// `ratelease_degraded_tokens_total`.
pub const DEGRADED_TOKENS: &str = "ratelease_degraded_tokens_total";
/// `ratelease_local_tokens`.
pub const LOCAL_TOKENS: &str = "ratelease_local_tokens";
/// `ratelease_circuit_open`.
pub const CIRCUIT_OPEN: &str = "ratelease_circuit_open";
/// `ratelease_demand_tokens_per_second`.
pub const DEMAND: &str = "ratelease_demand_tokens_per_second";
/// `ratelease_fair_share_tokens_per_second`.
pub const FAIR_SHARE: &str = "ratelease_fair_share_tokens_per_second";

/// What kind of metric a name is.
#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Every metric: name, kind, unit, description (the recorder's HELP text).
const DESCRIPTIONS: [(&str, Kind, Unit, &str); 16] = [
    (
        ADMITTED_TOKENS,
        Kind::Counter,
        Unit::Count,
        "Tokens admitted to callers.",
    ),
    (
        DENIED_TOKENS,
        Kind::Counter,
        Unit::Count,
        "Tokens denied to callers.",
    ),
    (
        LEASES,
        Kind::Counter,
        Unit::Count,
        "Lease calls to the store, failed ones included.",
    ),
    (
        STORE_ERRORS,
        Kind::Counter,
        Unit::Count,
        "Store calls that failed.",
    ),
    (
        LEASE_DURATION,
        Kind::Histogram,
        Unit::Seconds,
        "Round trip of each lease call.",
    ),
    (
        LEASED_TOKENS,
        Kind::Counter,
        Unit::Count,
        "Tokens granted by leases.",
    ),
    (
        LEASE_SIZE,
        Kind::Histogram,
        Unit::Count,
        "Tokens granted per lease that granted any.",
    ),
    (
        OVER_LIMIT,
        Kind::Counter,
        Unit::Count,
        "Lease calls answered 'not enough tokens'.",
    ),
    (
        RELEASES,
        Kind::Counter,
        Unit::Count,
        "Release calls (unspent tokens given back).",
    ),
    (
        RELEASED_TOKENS,
        Kind::Counter,
        Unit::Count,
        "Tokens given back to the store.",
    ),
    (
        EXPIRED_TOKENS,
        Kind::Counter,
        Unit::Count,
        "Tokens dropped unspent.",
    ),
    (
        DEGRADED_TOKENS,
        Kind::Counter,
        Unit::Count,
        "Tokens admitted by the failure policy while the store was failing.",
    ),
    (
        LOCAL_TOKENS,
        Kind::Gauge,
        Unit::Count,
        "Tokens in the local bucket.",
    ),
    (
        CIRCUIT_OPEN,
        Kind::Gauge,
        Unit::Count,
        "1 while the store is failing and the failure policy is in force.",
    ),
    (
        DEMAND,
        Kind::Gauge,
        Unit::CountPerSecond,
        "Measured demand, tokens per second.",
    ),
    (
        FAIR_SHARE,
        Kind::Gauge,
        Unit::CountPerSecond,
        "Fair share the store last reported, tokens per second.",
    ),
];

/// Describes every metric to the recorder in force (recorders keep the first description;
/// called at each build, so a recorder installed late still gets them).
fn describe() {
    metrics::with_recorder(|r| {
        for (name, kind, unit, help) in DESCRIPTIONS {
            let (name, unit, help) = (name.into(), Some(unit), help.into());
            match kind {
                Kind::Counter => r.describe_counter(name, unit, help),
                Kind::Gauge => r.describe_gauge(name, unit, help),
                Kind::Histogram => r.describe_histogram(name, unit, help),
            }
        }
    });
}

/// The handles both modes update.
#[derive(Debug)]
pub(crate) struct CallMetrics {
    admitted: Counter,
    denied: Counter,
    leases: Counter,
    store_errors: Counter,
    lease_duration: Histogram,
}

impl CallMetrics {
    fn new(limiter: &str, mode: &'static str) -> Self {
        describe();
        let labels = [("limiter", limiter.to_owned()), ("mode", mode.to_owned())];
        CallMetrics {
            admitted: metrics::counter!(ADMITTED_TOKENS, &labels),
            denied: metrics::counter!(DENIED_TOKENS, &labels),
            leases: metrics::counter!(LEASES, &labels),
            store_errors: metrics::counter!(STORE_ERRORS, &labels),
            lease_duration: metrics::histogram!(LEASE_DURATION, &labels),
        }
    }

    /// Pure mode's handles for `limiter`.
    pub(crate) fn pure(limiter: &str) -> Self {
        Self::new(limiter, "pure")
    }

    /// A lease call returned after `elapsed`, successfully or not.
    pub(crate) fn lease_call(&self, elapsed: Duration, ok: bool) {
        self.leases.increment(1);
        self.lease_duration.record(elapsed);
        if !ok {
            self.store_errors.increment(1);
        }
    }

    /// A decision on `n` tokens.
    pub(crate) fn decided(&self, n: u64, allowed: bool) {
        if allowed {
            self.admitted.increment(n);
        } else {
            self.denied.increment(n);
        }
    }
}

/// A hybrid limiter's handles.
#[derive(Debug)]
pub(crate) struct HybridMetrics {
    calls: CallMetrics,
    leased: Counter,
    lease_size: Histogram,
    over_limit: Counter,
    releases: Counter,
    released: Counter,
    expired: Counter,
    degraded: Counter,
    local: Gauge,
    circuit_open: Gauge,
    demand: Gauge,
    share: Gauge,
}

/// The totals published so far (what the next publication subtracts).
#[derive(Debug, Default)]
pub(crate) struct Published {
    admitted: u64,
    stats: HybridStats,
}

impl HybridMetrics {
    /// Handles for `limiter`, whose failure policy is named `policy`.
    pub(crate) fn new(limiter: &str, policy: &'static str) -> Self {
        let calls = CallMetrics::new(limiter, "hybrid");
        let name = [("limiter", limiter.to_owned())];
        let with_policy = [
            ("limiter", limiter.to_owned()),
            ("policy", policy.to_owned()),
        ];
        HybridMetrics {
            calls,
            leased: metrics::counter!(LEASED_TOKENS, &name),
            lease_size: metrics::histogram!(LEASE_SIZE, &name),
            over_limit: metrics::counter!(OVER_LIMIT, &name),
            releases: metrics::counter!(RELEASES, &name),
            released: metrics::counter!(RELEASED_TOKENS, &name),
            expired: metrics::counter!(EXPIRED_TOKENS, &name),
            degraded: metrics::counter!(DEGRADED_TOKENS, &with_policy),
            local: metrics::gauge!(LOCAL_TOKENS, &name),
            circuit_open: metrics::gauge!(CIRCUIT_OPEN, &with_policy),
            demand: metrics::gauge!(DEMAND, &name),
            share: metrics::gauge!(FAIR_SHARE, &name),
        }
    }

    /// A lease call took `rtt` (recorded by the background task as it returns).
    pub(crate) fn lease_returned(&self, rtt: Duration) {
        self.calls.lease_duration.record(rtt);
    }

    /// A lease granted `tokens` (> 0).
    pub(crate) fn granted(&self, tokens: u64) {
        self.lease_size.record(tokens as f64);
    }

    /// Publishes `stats` and `admitted` (cumulative totals): counters by what they grew since
    /// `last`, gauges as they are. A total that reads lower than before publishes nothing.
    pub(crate) fn publish(&self, last: &mut Published, stats: &HybridStats, admitted: u64) {
        let bump = |counter: &Counter, last: &mut u64, now: u64| {
            if now > *last {
                counter.increment(now - *last);
                *last = now;
            }
        };
        let (l, c) = (&mut last.stats, &self.calls);
        bump(&c.admitted, &mut last.admitted, admitted);
        bump(&c.denied, &mut l.tokens_denied, stats.tokens_denied);
        bump(&c.leases, &mut l.leases, stats.leases);
        bump(&c.store_errors, &mut l.store_errors, stats.store_errors);
        bump(&self.leased, &mut l.tokens_leased, stats.tokens_leased);
        bump(&self.over_limit, &mut l.over_limit, stats.over_limit);
        bump(&self.releases, &mut l.releases, stats.releases);
        bump(
            &self.released,
            &mut l.tokens_released,
            stats.tokens_released,
        );
        bump(&self.expired, &mut l.tokens_expired, stats.tokens_expired);
        let degraded = stats.tokens_admitted_degraded;
        bump(&self.degraded, &mut l.tokens_admitted_degraded, degraded);
        self.local.set(stats.local_tokens as f64);
        self.circuit_open
            .set(f64::from(u8::from(stats.circuit_open)));
        self.demand.set(stats.demand_mtps as f64 / 1_000.0);
        self.share.set(stats.share_mtps as f64 / 1_000.0);
    }
}

/// Runs `task` (a limiter's background task), calling `publish` after every poll of it, at
/// least every [`PUBLISH_INTERVAL`] while `publish` returns true (the limiter is active), and
/// once more when `task` ends.
///
/// The interval timer shares the task's waker, so a tick also polls `task`; futures allow
/// such spurious polls, and the limiter's task only re-checks its state.
pub(crate) async fn publishing<F: Future>(task: F, mut publish: impl FnMut() -> bool) -> F::Output {
    let mut task = pin!(task);
    let mut tick = pin!(tokio::time::sleep(PUBLISH_INTERVAL));
    let mut armed = true;
    poll_fn(|cx| {
        let done = task.as_mut().poll(cx);
        let active = publish();
        if done.is_ready() {
            return done;
        }
        if armed && tick.as_mut().poll(cx).is_ready() {
            armed = false;
        }
        if active && !armed {
            tick.as_mut()
                .reset(tokio::time::Instant::now() + PUBLISH_INTERVAL);
            armed = true;
            // Registers the waker; a deadline in the future cannot have passed.
            let _ = tick.as_mut().poll(cx);
        }
        Poll::Pending
    })
    .await
}
