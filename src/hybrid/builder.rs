//! The builder of a [`HybridLimiter`]: settings checked, the background task started.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::builder_knobs::{knob_setters, CommonKnobs};
use crate::config::Budget;
use crate::error::BuildError;
use crate::failure::Circuit;
#[cfg(doc)]
use crate::failure::FailurePolicy;
use crate::key;
use crate::lease::local::LocalBucket;
use crate::lease::policy::{AdaptiveLease, LeaseContext, LeasePolicy, LeaseTerms};
use crate::lease::refill::RefillSignal;
use crate::quota::Quota;
use crate::retry::{RttEstimate, DEFAULT_RTT};
use crate::store::names::{self, Scope};
use crate::store::LeaseStore;
use crate::telemetry;
use crate::time::Origin;

use super::metrics::HybridMetrics;

use super::shared::{publisher, Counters, Handle, Shared};
use super::task::refill_loop;
use super::HybridLimiter;

/// Configures a [`HybridLimiter`].
#[must_use]
pub struct HybridBuilder<S> {
    pub(super) name: String,
    pub(super) quota: Quota,
    pub(super) store: S,
    pub(super) policy: Box<dyn LeasePolicy>,
    pub(super) prefetch: bool,
    pub(super) node_id: Option<u64>,
    pub(super) knobs: CommonKnobs,
}

impl<S> HybridBuilder<S> {
    /// The builder [`HybridLimiter::builder`] returns: every setting at its default.
    pub(super) fn new(name: String, quota: Quota, store: S) -> Self {
        HybridBuilder {
            name,
            quota,
            store,
            policy: Box::new(AdaptiveLease::default()),
            prefetch: true,
            node_id: None,
            knobs: CommonKnobs::default(),
        }
    }
}

impl<S: LeaseStore> HybridBuilder<S> {
    knob_setters! {
        /// Batches are leased under the token bucket and the fixed window; the others are an
        /// [`BuildError::Config`] at build.
        algorithm,
        policy,
        lease_size,
        /// It draws the jitter of retries and the node id.
        seed,
        /// It answers once local tokens are spent (default: [`FailurePolicy::LastKnownShare`]:
        /// the share of the rate the store last gave this node).
        on_store_failure,
        /// [`Budget::PerClient`] gives this instance a bucket of its own, keyed by its
        /// [`node_id`](Self::node_id).
        budget,
        if_unconfigured,
        runtime,
    }

    /// Whether to lease the first batch at once, when the limiter is built (default true). The
    /// first calls still find the local bucket empty until that lease is answered, a round
    /// trip later: await [`HybridLimiter::ready`] before serving traffic for a warm start.
    ///
    /// `false` leases on first demand: the first check that finds the local bucket empty (or
    /// [`ready`](HybridLimiter::ready)) starts the first lease. Turn it off in a fleet of
    /// thousands of processes that start together and take traffic at once. Built at the same
    /// instant, every node's first lease reaches the store at once, before any node knows its
    /// demand: one Redis core takes about a third of a second to hear 10 000 of them, the
    /// busiest nodes' second leases wait behind the rest, and the first batches go to nodes in
    /// arrival order, traffic or not — tokens idle nodes hold, which the store cannot refill.
    /// Leasing on first demand, the busiest nodes ask first (their requests come first) and
    /// idle ones not at all. Measured (SIMULATIONS.md, "Leasing on first demand"; Zipf
    /// traffic at twice the limit from the first instant): 10 000 nodes admit 0.725 of the
    /// first second's budget instead of 0.549 and 0.969 of the limit over 10 s instead of
    /// 0.950, with 7 % fewer store calls; 1 000 nodes 0.911 instead of 0.902. The costs: a
    /// node's first check is denied (it starts the lease), which matters where a node sees a
    /// request or two a second (20 nodes sharing 20/s admitted 0.48 of the first second
    /// instead of 0.70; [`try_acquire_or_lease`](HybridLimiter::try_acquire_or_lease), as
    /// the HTTP layer calls it, waits for that lease instead); up to 100 nodes it changes
    /// little (first second 0.899 instead of 0.909 with 10 nodes); and the busiest node of a
    /// 10 000-node start makes 26 store calls in its busiest second instead of 16. (Measured
    /// with the default [`AdaptiveLease`](crate::AdaptiveLease); under rate leases the
    /// 10 000-node start gains nothing.) Such a fleet does not await
    /// [`ready`](HybridLimiter::ready) either: it starts the first lease at once, which brings
    /// back the same herd a little later.
    pub fn prefetch(mut self, prefetch: bool) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// This node's id in the store's lease records (default: random). Ids must be unique among
    /// the instances sharing a limiter name; the id of a restarted process may be reused.
    pub fn node_id(mut self, id: u64) -> Self {
        self.node_id = Some(id);
        self
    }

    /// Builds the limiter and starts its background task.
    ///
    /// Another limiter of this process on the same store, name, algorithm and budget shares
    /// this one's bucket; if it was built with a different quota, this logs a warning (see
    /// [`crate::config`], "One name, one quota").
    ///
    /// # Errors
    /// [`BuildError::Config`] for a bad name, or an algorithm it cannot lease (see
    /// [`algorithm`](Self::algorithm)) or combine with the builder's settings (as
    /// [`RedisLimiterBuilder::build`](crate::RedisLimiterBuilder::build));
    /// [`BuildError::NoRuntime`] outside a tokio runtime.
    pub fn build(self) -> Result<HybridLimiter<S>, BuildError> {
        key::validate_name(&self.name)?;
        let (algorithm, unconfigured) = (self.knobs.algorithm, self.knobs.unconfigured);
        algorithm.check_hybrid(&self.quota, unconfigured)?;
        let runtime = self.knobs.runtime_or_current()?;
        let failure = self.knobs.failure_or_default();
        let seed = self.knobs.seed_or_random();
        let mut rng = fastrand::Rng::with_seed(seed);
        let node_id = self.node_id.unwrap_or_else(|| rng.u64(..));
        let low_water = self
            .policy
            .ask(&LeaseContext {
                quota: self.quota,
                local: 0,
                denied: 0,
                demand: 0.0,
                share: None,
                rtt: DEFAULT_RTT,
                rate_held: 0.0,
                horizon: None,
                leasers: 0,
                fleet: 0,
            })
            .low_water
            .min(self.quota.burst());
        let terms = self.policy.terms(&self.quota).map(LeaseTerms::sendable);
        let metrics = HybridMetrics::new(&self.name, failure.name());
        let client = (self.knobs.budget == Budget::PerClient).then_some(node_id);
        // The builder's quota matters only where an unconfigured name runs under it.
        let registration = unconfigured.falls_back().then(|| {
            let scope = Scope::Named { algorithm, client };
            names::register(&self.store, &self.name, scope, self.quota)
        });
        let shared = Arc::new(Shared {
            local: LocalBucket::default(),
            signal: RefillSignal::new(self.prefetch),
            low_water: AtomicU64::new(low_water),
            quota: self.quota,
            burst: AtomicU64::new(self.quota.burst()),
            effective: Mutex::new(self.quota),
            client,
            unconfigured,
            algorithm,
            absent: AtomicBool::new(false),
            name: self.name,
            store: self.store,
            policy: self.policy,
            node_id,
            denied_total: AtomicU64::new(0),
            failure,
            fallback: failure.local_rate(&self.quota),
            circuit: Circuit::default(),
            origin: Origin::now(),
            blocked_until_ns: AtomicU64::new(0),
            blocked_above: AtomicU64::new(0),
            refused_until_ns: AtomicU64::new(0),
            round_trip: RttEstimate::default(),
            finished: Notify::new(),
            answered: AtomicBool::new(false),
            per_request: AtomicBool::new(false),
            counters: Counters::default(),
            metrics,
        });
        let task = runtime.spawn(telemetry::publishing(
            refill_loop(shared.clone(), rng, self.quota, terms),
            publisher(shared.clone()),
        ));
        Ok(HybridLimiter {
            handle: Arc::new(Handle {
                shared,
                task: Mutex::new(Some(task)),
                _registration: registration.flatten(),
            }),
        })
    }
}
