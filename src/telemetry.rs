//! Metrics and traces: what the limiters report through the [`metrics`] facade and [`tracing`].
//!
//! Nothing is exported unless the application installs a `metrics` recorder (for example
//! `metrics-exporter-prometheus`, see `examples/prometheus.rs`) or a `tracing` subscriber;
//! without one every call below is a no-op on a handle.
//!
//! This module is a leaf: the metric names, their descriptions, and the handles every limiter
//! shares (`CallMetrics`, the leasing family's `LeaseMetrics`, the publishing loop). Each
//! limiter keeps its own handles beside it (`hybrid/metrics.rs`, `keyed/metrics.rs`,
//! `concurrency/metrics.rs`), so nothing here imports a limiter.
//!
//! # Metrics
//!
//! Every metric carries the labels `limiter` (the limiter's name) and `mode`: `hybrid` or `pure`
//! for [`HybridLimiter`](crate::HybridLimiter) and [`RedisLimiter`](crate::RedisLimiter),
//! `keyed-hybrid` or `keyed-pure` for [`KeyedHybridLimiter`](crate::KeyedHybridLimiter) and
//! [`KeyedRedisLimiter`](crate::KeyedRedisLimiter) (a keyed limiter is labelled by its own
//! name, never by key: keys are unbounded), `pure` or `hybrid` for the concurrency limiter. So
//! `sum by (limiter)` adds a name's modes up and a series never mixes two kinds of limiter. Two
//! limiters with the same name and mode in one process add up into the same series.
//!
//! | name | type | labels | meaning |
//! | --- | --- | --- | --- |
//! | `ratelease_admitted_tokens_total` | counter | `limiter`, `mode` | tokens admitted to callers (hybrid: spent from leases, plus those the failure policy admitted) |
//! | `ratelease_denied_tokens_total` | counter | `limiter`, `mode` | tokens denied to callers |
//! | `ratelease_leases_total` | counter | `limiter`, `mode` | lease calls to the store, failed ones included (pure mode: one per decision) |
//! | `ratelease_store_errors_total` | counter | `limiter`, `mode` | store calls (leases and releases) that failed |
//! | `ratelease_lease_duration_seconds` | histogram | `limiter`, `mode` | round trip of each lease call, as the limiter saw it |
//! | `ratelease_leased_tokens_total` | counter | `limiter`, `mode` | hybrid: tokens granted by leases |
//! | `ratelease_lease_size_tokens` | histogram | `limiter`, `mode` | hybrid: tokens granted per lease that granted any |
//! | `ratelease_over_limit_total` | counter | `limiter`, `mode` | hybrid: lease calls answered "not enough tokens" |
//! | `ratelease_releases_total` | counter | `limiter`, `mode` | hybrid: release calls (unspent tokens given back) |
//! | `ratelease_released_tokens_total` | counter | `limiter`, `mode` | hybrid: tokens given back |
//! | `ratelease_expired_tokens_total` | counter | `limiter`, `mode` | hybrid: tokens dropped unspent (their lease expired, or giving them back failed) |
//! | `ratelease_degraded_tokens_total` | counter | `limiter`, `mode`, `policy` | hybrid: tokens the [`FailurePolicy`](crate::FailurePolicy) admitted while the circuit was open (also counted as admitted) |
//! | `ratelease_local_tokens` | gauge | `limiter`, `mode` | hybrid: tokens in the local bucket |
//! | `ratelease_circuit_open` | gauge | `limiter`, `mode`, `policy` | hybrid: 1 while the circuit is open (the last lease failed), else 0 |
//! | `ratelease_demand_tokens_per_second` | gauge | `limiter`, `mode` | hybrid: measured demand (admitted and denied) |
//! | `ratelease_fair_share_tokens_per_second` | gauge | `limiter`, `mode` | hybrid: fair share the store last reported (0 if none) |
//! | `ratelease_live_keys` | gauge | `limiter`, `mode` | keyed hybrid: keys with local state |
//! | `ratelease_created_keys_total` | counter | `limiter`, `mode` | keyed hybrid: keys given local state |
//! | `ratelease_evicted_keys_total` | counter | `limiter`, `mode`, `reason` | keyed hybrid: keys evicted, `reason` `idle` (unused for the idle TTL) or `cap` (to make room at `max_keys`) |
//! | `ratelease_refused_keys_total` | counter | `limiter`, `mode`, `reason` | keyed hybrid: new keys turned away for a moment, `reason` `cap` (at `max_keys`) or `busy` (first-lease queue full) |
//! | `ratelease_acquired_permits_total` | counter | `limiter`, `mode` | concurrency: slots handed to callers in permits (those the failure policy admitted included) |
//! | `ratelease_denied_permits_total` | counter | `limiter`, `mode` | concurrency: slots refused to callers that would not wait (longer): `try_acquire`, `acquire_now` or `try_acquire_for` answering `None` |
//! | `ratelease_held_permits` | gauge | `limiter`, `mode` | concurrency: slots in this process's live permits |
//! | `ratelease_pooled_permits` | gauge | `limiter`, `mode` | concurrency, hybrid: leased slots waiting in the local pool |
//! | `ratelease_concurrency_calls_total` | counter | `limiter`, `mode`, `op` | concurrency: store calls, `op` `acquire`, `release` or `sync` (renewal) |
//! | `ratelease_concurrency_errors_total` | counter | `limiter`, `mode` | concurrency: store calls that failed |
//! | `ratelease_acquire_duration_seconds` | histogram | `limiter`, `mode` | concurrency, pure: round trip of each caller's acquire call |
//!
//! The hybrid counters are the [`HybridStats`](crate::HybridStats) fields of the same names;
//! `admitted` is `tokens_leased − tokens_released − tokens_expired − local_tokens +
//! tokens_admitted_degraded`. Admissions of a name that has no central config under
//! [`Unconfigured::Unlimited`](crate::Unconfigured::Unlimited) are not limited and not counted.
//!
//! The keyed hybrid limiter reports the hybrid rows (not demand and fair share, which it keeps
//! per key) from its [`KeyedStats`](crate::KeyedStats), summed over every key:
//! `ratelease_expired_tokens_total` is `tokens_lost` (tokens whose release failed), and
//! `ratelease_local_tokens` the tokens all keys hold. Admitted tokens are derived the same way:
//! `tokens_leased − returned − held + tokens_admitted_degraded`, where `returned` counts the
//! tokens its worker queued for release and `held` is the sum over the keys. The concurrency
//! limiter's counters are its [`ConcurrencyStats`](crate::ConcurrencyStats) (`acquires`,
//! `releases`, `syncs`, `store_errors`, `in_use`, `pooled`); its mode is `pure` or `hybrid`.
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
//! # The keyed hybrid and concurrency limiters
//!
//! Both publish the same way, through the same wrapper around their background task (the
//! keyed limiter's one worker; the concurrency limiter's task): nothing on a caller's thread
//! calls into `metrics`. The keyed hot path (a map read and a CAS) counts nothing new: admitted
//! tokens are derived as above, and the sum over the keys that needs is taken by the worker at
//! most once per [`PUBLISH_INTERVAL`] (it reads the whole map, as a sweep does), so admitted
//! tokens and `ratelease_local_tokens` lag by at most one interval plus one 100 ms tick while
//! keys are live; the other counters are published after every poll of the worker, and the
//! lease histograms recorded as leases return. A hybrid concurrency permit counts itself in a
//! word next to the pool's, on the cache line its CAS already owns; refusals are counted on
//! the denial path. A pure concurrency limiter's caller records its acquire's latency (it made
//! the store call) and wakes the task to publish. Either limiter stays active for one more
//! interval after any counter changed, so a count made just after a publication is published
//! within one interval; [`shutdown`](crate::KeyedHybridLimiter::shutdown) leaves exact totals.
//!
//! Admitted tokens are read with the local bucket at rest (no chunk of tokens in transit
//! between its words, which would otherwise read as spent; for the few loads that read takes,
//! callers that need a chunk take straight from the reserve instead), and a counter's
//! publication never goes backwards.
//!
//! # Pure mode
//!
//! [`RedisLimiter`](crate::RedisLimiter) makes a store call per decision anyway, so it updates
//! its handles on the caller's task after each call; so does
//! [`KeyedRedisLimiter`](crate::KeyedRedisLimiter), whose per-key limiters share its handles.
//!
//! # Traces
//!
//! Every store call runs in a `DEBUG` span named `store_call`: [`RedisStore`](crate::RedisStore)
//! records `store = "redis"`, `key` (the script's first key), `op` (the script's first
//! argument: `lease`, `release`, `config_get`, …; a node's lease and release, which go packed,
//! `node_lease` and `node_release`), `script` (its SHA-1) and, if the call failed,
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
//! let quota = Quota::per_second(10)?;
//! let limiter = metrics::with_local_recorder(&recorder, || {
//!     RedisLimiter::new("api", quota, MemoryStore::new())
//! })?;
//! limiter.acquire_now(3).await?;
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

/// Longest time a limiter's published metrics lag behind while it is active (hybrid, keyed
/// hybrid and concurrency limiters, which publish from their background task).
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
/// `ratelease_live_keys`.
pub const LIVE_KEYS: &str = "ratelease_live_keys";
/// `ratelease_created_keys_total`.
pub const CREATED_KEYS: &str = "ratelease_created_keys_total";
/// `ratelease_evicted_keys_total`.
pub const EVICTED_KEYS: &str = "ratelease_evicted_keys_total";
/// `ratelease_refused_keys_total`.
pub const REFUSED_KEYS: &str = "ratelease_refused_keys_total";
/// `ratelease_acquired_permits_total`.
pub const ACQUIRED_PERMITS: &str = "ratelease_acquired_permits_total";
/// `ratelease_denied_permits_total`.
pub const DENIED_PERMITS: &str = "ratelease_denied_permits_total";
/// `ratelease_held_permits`.
pub const HELD_PERMITS: &str = "ratelease_held_permits";
/// `ratelease_pooled_permits`.
pub const POOLED_PERMITS: &str = "ratelease_pooled_permits";
/// `ratelease_concurrency_calls_total`.
pub const CONCURRENCY_CALLS: &str = "ratelease_concurrency_calls_total";
/// `ratelease_concurrency_errors_total`.
pub const CONCURRENCY_ERRORS: &str = "ratelease_concurrency_errors_total";
/// `ratelease_acquire_duration_seconds`.
pub const ACQUIRE_DURATION: &str = "ratelease_acquire_duration_seconds";

/// What kind of metric a name is.
#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Every metric: name, kind, unit, description (the recorder's HELP text).
const DESCRIPTIONS: [(&str, Kind, Unit, &str); 27] = [
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
        "Tokens held locally (the local bucket, or every key's tokens).",
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
    (
        LIVE_KEYS,
        Kind::Gauge,
        Unit::Count,
        "Keys with local state.",
    ),
    (
        CREATED_KEYS,
        Kind::Counter,
        Unit::Count,
        "Keys given local state.",
    ),
    (
        EVICTED_KEYS,
        Kind::Counter,
        Unit::Count,
        "Keys whose local state was evicted, by reason.",
    ),
    (
        REFUSED_KEYS,
        Kind::Counter,
        Unit::Count,
        "New keys turned away for a moment, by reason.",
    ),
    (
        ACQUIRED_PERMITS,
        Kind::Counter,
        Unit::Count,
        "Concurrency slots handed to callers in permits.",
    ),
    (
        DENIED_PERMITS,
        Kind::Counter,
        Unit::Count,
        "Concurrency slots refused to callers that would not wait (longer).",
    ),
    (
        HELD_PERMITS,
        Kind::Gauge,
        Unit::Count,
        "Concurrency slots in this process's live permits.",
    ),
    (
        POOLED_PERMITS,
        Kind::Gauge,
        Unit::Count,
        "Leased concurrency slots waiting in the local pool.",
    ),
    (
        CONCURRENCY_CALLS,
        Kind::Counter,
        Unit::Count,
        "Concurrency store calls, by operation.",
    ),
    (
        CONCURRENCY_ERRORS,
        Kind::Counter,
        Unit::Count,
        "Concurrency store calls that failed.",
    ),
    (
        ACQUIRE_DURATION,
        Kind::Histogram,
        Unit::Seconds,
        "Round trip of each pure-mode concurrency acquire call.",
    ),
];

/// Describes every metric to the recorder in force (recorders keep the first description;
/// called at each build, so a recorder installed late still gets them).
pub(crate) fn describe() {
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

/// A label set: `limiter` first, then whatever else.
type Labels = Vec<(&'static str, String)>;

pub(crate) fn labels(limiter: &str, more: &[(&'static str, &str)]) -> Labels {
    let mut labels = vec![("limiter", limiter.to_owned())];
    labels.extend(more.iter().map(|&(k, v)| (k, v.to_owned())));
    labels
}

/// Adds to `counter` what the cumulative total `now` grew since `last` (the total published so
/// far), and records `now` as published. A total that reads lower than before publishes
/// nothing, so a counter never goes backwards. Says whether anything was added.
pub(crate) fn bump(counter: &Counter, last: &mut u64, now: u64) -> bool {
    if now > *last {
        counter.increment(now - *last);
        *last = now;
        return true;
    }
    false
}

/// The handles every rate limiter updates (pure mode: on the caller's task, per call).
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
        let labels = labels(limiter, &[("mode", mode)]);
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

    /// A pure keyed limiter's handles, shared by the limiters of all its keys (labelled by the
    /// keyed limiter's name: a label per key would be unbounded).
    pub(crate) fn keyed_pure(limiter: &str) -> Self {
        Self::new(limiter, "keyed-pure")
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

/// Cumulative totals of a limiter that leases batches (hybrid or keyed hybrid): what it
/// publishes, and (as [`Published`]) what it published so far.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct LeaseTotals {
    pub(crate) admitted: u64,
    pub(crate) denied: u64,
    pub(crate) leases: u64,
    pub(crate) store_errors: u64,
    pub(crate) leased: u64,
    pub(crate) over_limit: u64,
    pub(crate) releases: u64,
    pub(crate) released: u64,
    pub(crate) expired: u64,
    pub(crate) degraded: u64,
}

/// The handles of a limiter that leases batches and spends them locally: the hybrid limiter
/// and the keyed hybrid limiter, published by their background task as deltas.
#[derive(Debug)]
pub(crate) struct LeaseMetrics {
    calls: CallMetrics,
    leased: Counter,
    lease_size: Histogram,
    over_limit: Counter,
    releases: Counter,
    released: Counter,
    expired: Counter,
    degraded: Counter,
    pub(crate) local: Gauge,
    circuit_open: Gauge,
}

impl LeaseMetrics {
    /// Handles for `limiter` in `mode`, whose failure policy is named `policy` (a label of the
    /// two metrics the policy governs).
    pub(crate) fn new(limiter: &str, mode: &'static str, policy: &'static str) -> Self {
        let calls = CallMetrics::new(limiter, mode);
        let name = labels(limiter, &[("mode", mode)]);
        let mut with_policy = name.clone();
        with_policy.push(("policy", policy.to_owned()));
        LeaseMetrics {
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

    /// Publishes the counters of `now` by what they grew since `last`; says whether any grew.
    pub(crate) fn publish(&self, last: &mut LeaseTotals, now: &LeaseTotals) -> bool {
        let c = &self.calls;
        // Non-short-circuiting `|`: every counter is published.
        bump(&c.admitted, &mut last.admitted, now.admitted)
            | bump(&c.denied, &mut last.denied, now.denied)
            | bump(&c.leases, &mut last.leases, now.leases)
            | bump(&c.store_errors, &mut last.store_errors, now.store_errors)
            | bump(&self.leased, &mut last.leased, now.leased)
            | bump(&self.over_limit, &mut last.over_limit, now.over_limit)
            | bump(&self.releases, &mut last.releases, now.releases)
            | bump(&self.released, &mut last.released, now.released)
            | bump(&self.expired, &mut last.expired, now.expired)
            | bump(&self.degraded, &mut last.degraded, now.degraded)
    }

    pub(crate) fn set_circuit(&self, open: bool) {
        self.circuit_open.set(f64::from(u8::from(open)));
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
