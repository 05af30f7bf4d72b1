//! The builder of a [`ConcurrencyLimiter`]: mode, ttl and batch settings checked, the
//! background task started.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;

use super::permit::Local;
use super::store::ConcurrencyStore;
use super::task;
use crate::builder_knobs::{knob_setters, CommonKnobs};
use crate::error::BuildError;
use crate::failure::Circuit;
#[cfg(doc)]
use crate::failure::FailurePolicy;
use crate::key;
use crate::protocol::node_key;
use crate::quota::MAX_VALUE;
use crate::telemetry;
use crate::time::micros;

use super::limiter::{publisher, ConcurrencyLimiter, Counters, Handle, Shared};
use super::metrics::ConcurrencyMetrics;

/// Default time a holder's record lives without a renewal: how long the slots of a crashed
/// process stay taken. Renewals go out every third of it.
pub const DEFAULT_HOLDER_TTL: Duration = Duration::from_secs(10);

/// Default time a hybrid limiter keeps leased slots that nobody uses before giving them back.
pub const DEFAULT_IDLE_RETURN: Duration = Duration::from_millis(100);

/// How a [`ConcurrencyLimiter`] uses the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConcurrencyMode {
    /// One script call per acquire (all or nothing), and one per batch of drops: exact, and
    /// fleet-wide first come, first served.
    Pure,
    /// Lease `batch` slots at a time and hand them out from a local lock-free pool; slots
    /// nobody uses are given back when idle and on shutdown.
    Hybrid {
        /// Slots leased per store call (and kept in the pool at most).
        batch: u64,
    },
}

/// Configures a [`ConcurrencyLimiter`].
#[must_use]
pub struct ConcurrencyBuilder<S> {
    pub(super) name: String,
    pub(super) limit: u64,
    pub(super) store: S,
    pub(super) ttl: Duration,
    pub(super) mode: ConcurrencyMode,
    pub(super) holder_id: Option<u64>,
    pub(super) idle_return: Duration,
    pub(super) knobs: CommonKnobs,
}

impl<S> ConcurrencyBuilder<S> {
    /// The builder [`ConcurrencyLimiter::builder`] returns: every setting at its default.
    pub(super) fn new(name: String, limit: u64, store: S) -> Self {
        ConcurrencyBuilder {
            name,
            limit,
            store,
            ttl: DEFAULT_HOLDER_TTL,
            mode: ConcurrencyMode::Pure,
            holder_id: None,
            idle_return: DEFAULT_IDLE_RETURN,
            knobs: CommonKnobs::default(),
        }
    }
}

impl<S: ConcurrencyStore> ConcurrencyBuilder<S> {
    knob_setters! {
        /// The default is [`FailurePolicy::LastKnownShare`] with one node if unknown, i.e. each
        /// process may hold up to the limit: the concurrency store gives no share. Permits it
        /// admits are counted locally only: `LocalFallback { expected_nodes }` admits at most
        /// `max(1, limit / expected_nodes)` of them per process, and `LastKnownShare {
        /// nodes_if_unknown }` as many for its node count.
        on_store_failure,
        runtime,
    }

    /// How long this process's record lives without a renewal (default
    /// [`DEFAULT_HOLDER_TTL`]): the slots of a crashed process come back this long after its
    /// last renewal, and never sooner. Renewals are sent every third of it.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// One store call per acquire (the default).
    pub fn pure(mut self) -> Self {
        self.mode = ConcurrencyMode::Pure;
        self
    }

    /// Lease `batch` slots per store call and hand them out locally.
    pub fn hybrid(mut self, batch: u64) -> Self {
        self.mode = ConcurrencyMode::Hybrid { batch };
        self
    }

    /// This process's holder id in the store (default: random). Ids must be unique among the
    /// processes sharing a name.
    pub fn holder_id(mut self, id: u64) -> Self {
        self.holder_id = Some(id);
        self
    }

    /// Hybrid: how long leased slots may sit unused before they are given back (default
    /// [`DEFAULT_IDLE_RETURN`]).
    pub fn idle_return(mut self, after: Duration) -> Self {
        self.idle_return = after;
        self
    }

    /// Builds the limiter and starts its background task.
    ///
    /// # Errors
    /// [`BuildError::Config`] for a bad name, a limit of 0 or above 2^52, a ttl under 3 ms or above
    /// 2^52 µs, a hybrid batch of 0 or above the limit; [`BuildError::NoRuntime`] outside a tokio
    /// runtime.
    pub fn build(self) -> Result<ConcurrencyLimiter<S>, BuildError> {
        key::validate_name(&self.name)?;
        let batch = check_settings(self.limit, self.ttl, self.mode)?;
        let runtime = self.knobs.runtime_or_current()?;
        let failure = self.knobs.failure_or_default();
        let holder_id = self.holder_id.unwrap_or_else(|| fastrand::u64(..));
        let metrics = ConcurrencyMetrics::new(&self.name, batch > 0);
        let shared = Arc::new(Shared {
            local: Arc::new(Local::new(batch > 0)),
            store: self.store,
            holder: node_key(holder_id),
            holder_id,
            name: self.name,
            limit: self.limit,
            ttl: self.ttl,
            batch,
            low_water: batch / 4,
            idle_return: self.idle_return,
            failure,
            // No share is learnt for permits: `LastKnownShare` divides by its node count.
            fallback_share: match failure.fallback_nodes() {
                Some(nodes) => (self.limit / u64::from(nodes.get())).max(1),
                None => 0,
            },
            circuit: Circuit::default(),
            claimed: AtomicU64::new(0),
            aseq: AtomicU64::new(0),
            rseq_sent: AtomicU64::new(0),
            gate: AtomicBool::new(false),
            gate_open: Notify::new(),
            in_flight: AtomicU64::new(0),
            drained: Notify::new(),
            dirty: AtomicBool::new(false),
            touched: AtomicBool::new(false),
            leased: AtomicU64::new(0),
            counters: Counters::default(),
            metrics,
        });
        let task = runtime.spawn(telemetry::publishing(
            task::run(shared.clone()),
            publisher(shared.clone()),
        ));
        Ok(ConcurrencyLimiter {
            handle: Arc::new(Handle {
                shared,
                task: Mutex::new(Some(task)),
            }),
        })
    }
}

/// Checks a limit, a holder ttl and a mode as [`ConcurrencyBuilder::build`] does, without a
/// runtime or a store (the TOML loader checks files with it); returns the hybrid batch (0 in
/// pure mode).
pub(crate) fn check_settings(
    limit: u64,
    ttl: Duration,
    mode: ConcurrencyMode,
) -> Result<u64, BuildError> {
    let config = |msg: String| Err(BuildError::Config(msg));
    if !(1..=MAX_VALUE).contains(&limit) {
        return config(format!("concurrency limit {limit} must be in 1..=2^52"));
    }
    if ttl < Duration::from_millis(3) || micros(ttl) > MAX_VALUE {
        return config(format!(
            "holder ttl {ttl:?} must be between 3 ms and 2^52 µs"
        ));
    }
    match mode {
        ConcurrencyMode::Pure => Ok(0),
        ConcurrencyMode::Hybrid { batch } if (1..=limit).contains(&batch) => Ok(batch),
        ConcurrencyMode::Hybrid { batch } => config(format!(
            "hybrid batch {batch} must be in 1..=limit ({limit})"
        )),
    }
}
