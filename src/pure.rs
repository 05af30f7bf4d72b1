//! Pure-Redis mode: one atomic script call per decision.
//!
//! This is the classic design — one atomic script per decision — and the reference every
//! other mode is measured against: exact, fair by construction, and one network round trip per
//! decision. It runs on any [`LeaseStore`], so the simulator can run it on a
//! [`MemoryStore`](crate::MemoryStore).
//!
//! With central configuration ([`crate::config`]) every reply carries the quota the store ran
//! under; the limiter keeps the last one (for [`Limiter::quota`] and the burst check: a
//! request above the smaller of its burst and the builder's is refused before any call, since
//! the store checks a call's arguments against the caller's quota), behind a mutex that is
//! only touched next to a store call, and the local rate of its failure policy
//! follows it (as a hybrid limiter's does), so an outage is answered at the share of the quota
//! in force, not of the builder's. An unconfigured name answered
//! [`QuotaSource::Absent`] is remembered for [`Unconfigured::RECHECK`] in one atomic word, so an
//! unlimited name costs no store calls in between.
//!
//! **Store failures** open a circuit ([`crate::failure`]): while it is open, one caller at a
//! time probes the store after a jittered back-off (10 ms to 500 ms) and every other caller is
//! answered at once, instead of waiting a timeout per call. By default the answer is the
//! store's last error ([`AcquireError::Store`]: the caller decides, as with any failed call); with
//! [`RedisLimiterBuilder::on_store_failure`] it is the [`FailurePolicy`]'s.
//! [`FailurePolicy::LastKnownShare`] enforces locally the rate this node was granted over the
//! last window of at least a second before the outage (pure-mode calls are anonymous, so the
//! store names no share): a fleet at its limit keeps to it. A window closes at its first grant
//! a second or more after it opened, so it spans any idle time before that grant: a node idle
//! for an hour whose store fails within a second of its first request enforces about its
//! hour's rate through the outage. A `GrantMeter` measures that rate with two atomic
//! words, next to the store call. Errors that are no outage (an ACL denial, a rejected or
//! malformed reply: [`StoreError::is_outage`](crate::StoreError::is_outage) is false) are
//! always returned and open no circuit.
//!
//! Every [`Algorithm`] runs in pure mode. [`RedisLimiter::check`] answers with the budget left
//! ([`Verdict`]), and [`RedisLimiter::available_permits`] reads it without taking anything (a
//! release of 0 tokens: the window and leaky-bucket scripts' `peek`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::algorithm::token_bucket::QuotaSource;
use crate::algorithm::Algorithm;
use crate::builder_knobs::{knob_setters, CommonKnobs};
use crate::config::{Budget, Unconfigured};
use crate::error::{AcquireError, BuildError, StoreError};
use crate::failure::{Circuit, FailurePolicy, LocalRate, ProbeGate};
use crate::key;
use crate::limiter::{check_request, check_tokens, Decision, Limiter};
use crate::quota::Quota;
use crate::store::names::{self, Registration, Scope};
use crate::store::{LeaseReply, LeaseRequest, LeaseStore, RedisStore, ReleaseRequest};
use crate::telemetry::CallMetrics;
use crate::time;
use crate::time::Origin;
use crate::verdict::Verdict;

/// Configures a [`RedisLimiter`].
#[must_use]
#[derive(Debug)]
pub struct RedisLimiterBuilder<S> {
    name: String,
    quota: Quota,
    store: S,
    client_id: Option<u64>,
    knobs: CommonKnobs,
    /// The circuit to share instead of one of the limiter's own (a keyed limiter's).
    outage: Option<Arc<Outage>>,
    /// Handles to report to instead of the limiter's own (a keyed limiter's, shared by its
    /// keys).
    metrics: Option<Arc<CallMetrics>>,
}

impl<S: LeaseStore> RedisLimiterBuilder<S> {
    /// Shares `outage` (a keyed limiter's circuit) instead of a circuit of the limiter's own.
    pub(crate) fn outage(mut self, outage: Arc<Outage>) -> Self {
        self.outage = Some(outage);
        self
    }

    /// Reports to `metrics` instead of registering handles of the limiter's own.
    pub(crate) fn metrics(mut self, metrics: Arc<CallMetrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    knob_setters! {
        algorithm,
        /// [`Budget::PerClient`] spends the budget of this builder's
        /// [`client_id`](Self::client_id).
        budget,
        /// By default none answers: each call returns [`AcquireError::Store`], at once while the
        /// circuit is open. [`FailurePolicy::LastKnownShare`] enforces the rate this node was
        /// granted over the last window of at least a second before the failure (see the
        /// module docs).
        on_store_failure,
        /// It draws the jitter of the circuit's probes.
        seed,
        if_unconfigured,
    }

    /// This client's id for [`Budget::PerClient`] (default: random). Instances that should
    /// share one client budget use the same id.
    pub fn client_id(mut self, id: u64) -> Self {
        self.client_id = Some(id);
        self
    }

    /// Builds the limiter.
    ///
    /// Another limiter of this process on the same store, name, algorithm and budget shares
    /// this one's bucket; if it was built with a different quota, this logs a warning (see
    /// [`crate::config`], "One name, one quota").
    ///
    /// # Errors
    /// [`BuildError::Config`] for an empty or overlong name; for a window whose burst is not its
    /// rate; for an algorithm other than the token bucket with an [`Unconfigured`] other than
    /// [`Unconfigured::UseQuota`] (central configuration is the token bucket's).
    pub fn build(self) -> Result<RedisLimiter<S>, BuildError> {
        key::validate_name(&self.name)?;
        self.knobs
            .algorithm
            .check(&self.quota, self.knobs.unconfigured)?;
        let client = match self.knobs.budget {
            Budget::Overall => None,
            Budget::PerClient => Some(self.client_id.unwrap_or_else(|| fastrand::u64(..))),
        };
        let metrics = match self.metrics {
            Some(metrics) => metrics,
            None => Arc::new(CallMetrics::pure(&self.name)),
        };
        // A key's limiter of a keyed limiter (which shares its circuit) is made per call: the
        // keyed limiter registers its name instead. The builder's quota matters only where an
        // unconfigured name runs under it.
        let registration =
            (self.outage.is_none() && self.knobs.unconfigured.falls_back()).then(|| {
                let scope = Scope::Named {
                    algorithm: self.knobs.algorithm,
                    client,
                };
                names::register(&self.store, &self.name, scope, self.quota)
            });
        Ok(RedisLimiter {
            name: self.name.into(),
            quota: self.quota,
            store: self.store,
            client,
            unconfigured: self.knobs.unconfigured,
            algorithm: self.knobs.algorithm,
            failure: self.knobs.failure,
            state: Arc::new(State {
                effective: Mutex::new(self.quota),
                origin: Origin::now(),
                absent_until_ns: AtomicU64::new(0),
                metrics,
                fallback: self.knobs.failure.and_then(|f| f.local_rate(&self.quota)),
                outage: self
                    .outage
                    .unwrap_or_else(|| Arc::new(Outage::new(self.knobs.seed))),
                meter: GrantMeter::default(),
                share_mtps: AtomicU64::new(0),
                _registration: registration.flatten(),
            }),
        })
    }
}

/// Whether the store is failing, and who may probe it: one limiter's, or every key's of a
/// keyed limiter.
#[derive(Debug)]
pub(crate) struct Outage {
    /// Open while the store is failing.
    circuit: Circuit,
    /// Who may call the store while the circuit is open, and when.
    probe: ProbeGate,
}

impl Outage {
    /// A closed circuit; its probes' jitter drawn from `seed` (random if `None`).
    pub(crate) fn new(seed: Option<u64>) -> Self {
        Outage {
            circuit: Circuit::default(),
            probe: ProbeGate::new(seed.unwrap_or_else(|| fastrand::u64(..))),
        }
    }
}

/// What the clones of one limiter share.
#[derive(Debug)]
struct State {
    /// The quota of the last reply (the builder's until then).
    effective: Mutex<Quota>,
    origin: Origin,
    /// Until when (ns since `origin`) the name is known to be unconfigured.
    absent_until_ns: AtomicU64,
    /// Metric handles, updated after each store call ([`crate::telemetry`]).
    metrics: Arc<CallMetrics>,
    /// The local rate of a fallback policy.
    fallback: Option<LocalRate>,
    /// The circuit, and who may probe it (shared by a keyed limiter's keys).
    outage: Arc<Outage>,
    /// The rate this node is granted: its share, for [`FailurePolicy::LastKnownShare`].
    meter: GrantMeter,
    /// The share last measured by `meter`, millitokens per second (0: none yet): what the
    /// fallback keeps when the quota changes.
    share_mtps: AtomicU64,
    /// The limiter's name in the process's registry ([`crate::store::names`]), left with the
    /// last clone.
    _registration: Option<Registration>,
}

/// The rate a pure-mode node is granted, over windows of at least [`GrantMeter::WINDOW`]:
/// tokens granted since the window started, and when it started. A window closes at the first
/// grant after it is long enough; the caller that closes it gets its rate.
#[derive(Debug, Default)]
struct GrantMeter {
    /// ns since the limiter's origin.
    start_ns: AtomicU64,
    tokens: AtomicU64,
}

impl GrantMeter {
    const WINDOW: Duration = Duration::from_secs(1);

    /// `n` tokens were granted at `now_ns`; the rate of the window this closes, if it does,
    /// in millitokens per second.
    fn granted(&self, now_ns: u64, n: u64) -> Option<u64> {
        // Relaxed: a statistic; the CAS below decides who closes a window.
        self.tokens.fetch_add(n, Ordering::Relaxed);
        let start = self.start_ns.load(Ordering::Relaxed);
        let elapsed = now_ns.saturating_sub(start);
        if elapsed < time::nanos(Self::WINDOW) {
            return None;
        }
        self.start_ns
            .compare_exchange(start, now_ns, Ordering::Relaxed, Ordering::Relaxed)
            .ok()?;
        let tokens = self.tokens.swap(0, Ordering::Relaxed);
        let mtps = u128::from(tokens) * 1_000_000_000_000 / u128::from(elapsed);
        Some(u64::try_from(mtps).unwrap_or(u64::MAX))
    }
}

/// A limiter that asks the store for every decision (`min = want = n`).
///
/// ```no_run
/// # async fn demo() -> Result<(), ratelease::Error> {
/// use ratelease::{Quota, RedisLimiter, RedisStore};
///
/// let store = RedisStore::connect("redis://127.0.0.1:6379/").await?;
/// let limiter = RedisLimiter::new("api", Quota::per_second(100)?, store)?;
/// if limiter.acquire_now(1).await?.is_allowed() {
///     // serve the request
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RedisLimiter<S = RedisStore> {
    name: Arc<str>,
    quota: Quota,
    store: S,
    client: Option<u64>,
    unconfigured: Unconfigured,
    algorithm: Algorithm,
    failure: Option<FailurePolicy>,
    state: Arc<State>,
}

impl<S: Clone> Clone for RedisLimiter<S> {
    fn clone(&self) -> Self {
        RedisLimiter {
            name: self.name.clone(),
            quota: self.quota,
            store: self.store.clone(),
            client: self.client,
            unconfigured: self.unconfigured,
            algorithm: self.algorithm,
            failure: self.failure,
            state: self.state.clone(),
        }
    }
}

impl<S: LeaseStore> RedisLimiter<S> {
    /// A limiter for `name` with `quota` on `store`.
    ///
    /// # Errors
    /// [`BuildError::Config`] for an empty or overlong name.
    pub fn new(name: impl Into<String>, quota: Quota, store: S) -> Result<Self, BuildError> {
        Self::builder(name, quota, store).build()
    }

    /// A builder for limiter `name` with `quota` on `store`.
    pub fn builder(name: impl Into<String>, quota: Quota, store: S) -> RedisLimiterBuilder<S> {
        RedisLimiterBuilder {
            name: name.into(),
            quota,
            store,
            client_id: None,
            knobs: CommonKnobs::default(),
            outage: None,
            metrics: None,
        }
    }

    /// The policy that answers while the store is failing (`None`: its error is returned).
    pub fn failure_policy(&self) -> Option<FailurePolicy> {
        self.failure
    }

    /// Whether the circuit is open: the last store call failed, and the failure policy
    /// answers until a probe succeeds.
    pub fn circuit_open(&self) -> bool {
        self.state.outage.circuit.is_open()
    }

    /// The quota in effect: from the last store reply (a central config, or the builder's).
    pub fn quota(&self) -> Quota {
        *self.state.effective.lock()
    }

    /// How this limiter counts.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// This limiter's client id for [`Budget::PerClient`] (`None` for the fleet budget).
    pub fn client_id(&self) -> Option<u64> {
        self.client
    }

    fn now_ns(&self) -> u64 {
        self.state.origin.elapsed_ns()
    }

    /// The answer for a name known to be unconfigured, without a store call.
    fn absent(&self) -> Result<Verdict, AcquireError> {
        match self.unconfigured {
            Unconfigured::Error => Err(AcquireError::Unconfigured(self.name.to_string())),
            _ => Ok(Verdict::UNLIMITED),
        }
    }

    /// The limiter's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Takes `n` tokens now, or says when to retry. One store call (see
    /// [`check`](Self::check) for a failing store). A pure limiter keeps no local state, so it
    /// has no synchronous `try_acquire`: this is its one decision, under the name every limiter
    /// gives it ([`HybridLimiter::acquire_now`](crate::HybridLimiter::acquire_now) answers
    /// locally).
    ///
    /// # Errors
    /// [`AcquireError::ZeroTokens`], [`AcquireError::ExceedsBurst`],
    /// [`AcquireError::Unconfigured`] (under [`Unconfigured::Error`]), or
    /// [`AcquireError::Store`]: an outage's only with no [`FailurePolicy`] set (the default).
    pub async fn acquire_now(&self, n: u64) -> Result<Decision, AcquireError> {
        Ok(self.check(n).await?.decision)
    }

    /// The old name of [`acquire_now`](Self::acquire_now).
    ///
    /// # Errors
    /// As [`acquire_now`](Self::acquire_now).
    #[deprecated(
        note = "use `acquire_now` (the same store call): `try_acquire` names the synchronous \
                local check, which a pure limiter cannot make"
    )]
    pub async fn try_acquire(&self, n: u64) -> Result<Decision, AcquireError> {
        self.acquire_now(n).await
    }

    /// As [`acquire_now`](Self::acquire_now): a pure limiter has no lease to wait for. Here so
    /// that code written for a [`HybridLimiter`](crate::HybridLimiter) runs unchanged.
    ///
    /// # Errors
    /// As [`acquire_now`](Self::acquire_now).
    pub async fn try_acquire_or_lease(
        &self,
        n: u64,
        lease_wait: Duration,
    ) -> Result<Decision, AcquireError> {
        let _ = lease_wait;
        self.acquire_now(n).await
    }

    /// Takes `n` tokens now, or says when to retry, and reports the budget left (for
    /// `X-RateLimit-*` headers). One store call; none while the circuit is open, except one
    /// probe at a time: the [`FailurePolicy`] answers then (with `remaining` 0).
    ///
    /// # Errors
    /// As [`acquire_now`](Self::acquire_now).
    pub async fn check(&self, n: u64) -> Result<Verdict, AcquireError> {
        // The burst in force, and never above the builder's: the store checks a call's
        // arguments against the caller's quota (a request above it is not a valid call).
        check_tokens(n, self.quota().burst().min(self.quota.burst()))?;
        // Relaxed: a cache of the store's answer; nothing else is published through it. The
        // clock is read only while such an answer is cached.
        let absent_until = self.state.absent_until_ns.load(Ordering::Relaxed);
        if absent_until != 0 && self.now_ns() < absent_until {
            return self.absent();
        }
        let s = &*self.state;
        let probe = if s.outage.circuit.is_open() {
            match s.outage.probe.try_probe() {
                Some(probe) => Some(probe),
                None => return self.degraded(n, None),
            }
        } else {
            None
        };
        let request = LeaseRequest::exact(n).with_limiter_settings(
            self.client,
            self.unconfigured,
            self.algorithm,
        );
        let sent = Instant::now();
        let reply = self.store.lease(&self.name, &self.quota, &request).await;
        s.metrics.lease_call(sent.elapsed(), reply.is_ok());
        let reply = match reply {
            Ok(reply) => {
                let closed = s.outage.circuit.recovered(&self.name);
                match probe {
                    Some(probe) => probe.succeeded(),
                    // A call sent before the circuit opened closed it: start the back-off over.
                    None if closed => s.outage.probe.reset(),
                    None => {}
                }
                reply
            }
            Err(error) if !error.is_outage() => {
                // Not an outage: the store answered, so it is reachable.
                if let Some(probe) = probe {
                    probe.succeeded();
                }
                s.outage.circuit.recovered(&self.name);
                return Err(error.into());
            }
            Err(error) => {
                self.outage(&error, probe.is_some());
                // A probe's ticket reschedules when dropped.
                drop(probe);
                return self.degraded(n, Some(error));
            }
        };
        if !self.adopt(&reply) {
            return self.absent();
        }
        check_request(&reply.quota, n)?;
        self.state.metrics.decided(n, reply.granted >= n);
        // Only a policy that falls back to the learnt share measures it: no clock read and no
        // shared counter on a granted call otherwise.
        if let (true, Some(local)) = (reply.granted >= n, &s.fallback) {
            if self.failure.is_some_and(|f| f.learns_share()) {
                if let Some(share) = s.meter.granted(self.now_ns(), n) {
                    s.share_mtps.store(share, Ordering::Relaxed);
                    local.set_share_mtps(&reply.quota, share);
                }
            }
        }
        let decision = if reply.granted >= n {
            Decision::Allowed
        } else {
            Decision::Denied {
                retry_after: reply.retry_after,
            }
        };
        Ok(Verdict {
            decision,
            limit: reply.quota.burst(),
            remaining: reply.remaining,
            reset_after: reply.reset_after,
        })
    }

    /// Takes up what a store reply says of the name's config: an unconfigured name is
    /// answered without a store call until it is checked again (false then); a central
    /// change of its quota becomes the quota in effect, and the fallback follows it.
    fn adopt(&self, reply: &LeaseReply) -> bool {
        let s = &*self.state;
        if reply.source == QuotaSource::Absent {
            let until = self
                .now_ns()
                .saturating_add(time::nanos(Unconfigured::RECHECK));
            // Relaxed: a cache of the store's answer, as read in `check`.
            s.absent_until_ns.store(until, Ordering::Relaxed);
            return false;
        }
        let changed = std::mem::replace(&mut *s.effective.lock(), reply.quota) != reply.quota;
        if let (true, Some(failure), Some(local)) = (changed, self.failure, &s.fallback) {
            // A central change: the fallback follows it (as the hybrid task's `adopt` does).
            // Relaxed: a hint; a share measured at this moment is taken up by its own call.
            local.follow(failure, &reply.quota, s.share_mtps.load(Ordering::Relaxed));
        }
        true
    }

    /// The answer for `n` tokens while the store is failing (with `error`, or the last one):
    /// the policy's, or the error.
    fn degraded(&self, n: u64, error: Option<StoreError>) -> Result<Verdict, AcquireError> {
        let s = &*self.state;
        let Some(failure) = self.failure else {
            let error = error.or_else(|| s.outage.circuit.last_error());
            // The circuit is open only after an error was recorded.
            return Err(AcquireError::Store(
                error.unwrap_or(StoreError::Timeout(Duration::ZERO)),
            ));
        };
        let decision = match (failure, &s.fallback) {
            (FailurePolicy::FailOpen, _) => Ok(()),
            (_, Some(local)) if local.fits(n) => local.try_take(n),
            // Fail closed, or more than the local rate's burst (its wait would never come
            // true): ask again when the next probe may go.
            _ => Err(s.outage.probe.wait()),
        };
        let decision = match decision {
            Ok(()) => Decision::Allowed,
            Err(wait) => Decision::Denied {
                retry_after: wait.max(crate::retry::MIN_RETRY),
            },
        };
        s.metrics.decided(n, decision.is_allowed());
        Ok(Verdict {
            decision,
            limit: self.quota().burst(),
            remaining: 0,
            reset_after: Duration::ZERO,
        })
    }

    /// The store's last error, if the circuit is open and the policy fails closed: what a
    /// waiting caller returns instead of waiting for the store.
    fn closed_error(&self) -> Option<AcquireError> {
        let s = &*self.state;
        (self.failure == Some(FailurePolicy::FailClosed) && s.outage.circuit.is_open())
            .then(|| s.outage.circuit.last_error())
            .flatten()
            .map(AcquireError::Store)
    }

    /// A store outage met by a call (`probing`: the circuit's probe): the circuit opens; the
    /// call that opens it schedules the first probe unless it is one (calls failing alongside
    /// it do not stretch the back-off).
    fn outage(&self, error: &StoreError, probing: bool) {
        let s = &*self.state;
        let policy = self.failure.unwrap_or(FailurePolicy::FailClosed);
        let opened = s.outage.circuit.fail(&self.name, policy, error.clone());
        if opened && !probing {
            s.outage.probe.failed();
        }
    }

    /// A warm start, as [`HybridLimiter::ready`](crate::HybridLimiter::ready) is for a hybrid
    /// limiter: one store call that takes nothing (a release of 0 tokens), so the first
    /// decision pays neither the connection nor the script's load, and a store that does not
    /// answer is reported before traffic is served. It also reads the name's stored quota
    /// ([`quota`](Self::quota) is the store's from then on). Call it once after building;
    /// each call makes one store call, whatever the circuit.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), ratelease::Error> {
    /// use ratelease::{MemoryStore, Quota, RedisLimiter};
    ///
    /// let limiter = RedisLimiter::new("api", Quota::per_second(100)?, MemoryStore::new())?;
    /// limiter.ready().await?;
    /// assert!(limiter.acquire_now(1).await?.is_allowed());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`AcquireError::Store`] if the store did not answer. Like a failed decision, that opens
    /// the circuit: decisions are the failure policy's at once, each without a store call,
    /// until a probe finds the store again (after 10–500 ms of back-off), so a service may
    /// start anyway and call `ready` again later.
    /// [`AcquireError::Unconfigured`] under [`Unconfigured::Error`] for a name with no stored
    /// quota.
    pub async fn ready(&self) -> Result<(), AcquireError> {
        let reply = match self.peek().await {
            Err(AcquireError::Store(error)) if error.is_outage() => {
                self.outage(&error, false);
                return Err(AcquireError::Store(error));
            }
            reply => reply?,
        };
        // The call runs under the builder's quota where the name has none stored: a limiter
        // that must refuse such a name says so now, as its decisions will.
        if reply.source == QuotaSource::Caller && self.unconfigured == Unconfigured::Error {
            return Err(AcquireError::Unconfigured(self.name.to_string()));
        }
        let s = &*self.state;
        if s.outage.circuit.recovered(&self.name) {
            // As a decision that closes the circuit: the back-off starts over.
            s.outage.probe.reset();
        }
        self.adopt(&reply);
        Ok(())
    }

    /// Tokens that could be taken now, without taking any (a release of 0 tokens). For the
    /// token bucket, under the name's stored quota if it has one, else the builder's.
    ///
    /// # Errors
    /// [`AcquireError::Store`].
    pub async fn available_permits(&self) -> Result<u64, AcquireError> {
        Ok(self.peek().await?.remaining)
    }

    /// One store call that takes nothing (a release of 0 tokens): the bucket as it is now.
    async fn peek(&self) -> Result<LeaseReply, AcquireError> {
        let request = ReleaseRequest::new(0)
            .for_client(self.client)
            .algorithm(self.algorithm);
        Ok(self
            .store
            .release(&self.name, &self.quota, &request)
            .await?)
    }

    /// Waits until `n` tokens are taken, sleeping for each reply's `retry_after`.
    ///
    /// # Errors
    /// As [`acquire_now`](Self::acquire_now), and [`AcquireError::Store`] while the store is
    /// failing under [`FailurePolicy::FailClosed`] (waiting would wait for the store).
    pub async fn acquire(&self, n: u64) -> Result<(), AcquireError> {
        loop {
            match self.acquire_now(n).await? {
                Decision::Allowed => return Ok(()),
                Decision::Denied { retry_after } => {
                    if let Some(e) = self.closed_error() {
                        return Err(e);
                    }
                    tokio::time::sleep(retry_after).await;
                }
            }
        }
    }

    /// Waits at most `timeout` for `n` tokens; gives up at once if the store says the wait
    /// would be longer.
    ///
    /// # Errors
    /// As [`acquire_now`](Self::acquire_now).
    pub async fn try_acquire_for(
        &self,
        n: u64,
        timeout: Duration,
    ) -> Result<Decision, AcquireError> {
        let deadline = time::from_now(timeout);
        loop {
            match self.acquire_now(n).await? {
                Decision::Allowed => return Ok(Decision::Allowed),
                Decision::Denied { retry_after } => {
                    if let Some(e) = self.closed_error() {
                        return Err(e);
                    }
                    if time::from_now(retry_after) > deadline {
                        return Ok(Decision::Denied { retry_after });
                    }
                    tokio::time::sleep(retry_after).await;
                }
            }
        }
    }
}

impl<S: LeaseStore> Limiter for RedisLimiter<S> {
    fn quota(&self) -> Quota {
        RedisLimiter::quota(self)
    }

    async fn ready(&self) -> Result<(), AcquireError> {
        RedisLimiter::ready(self).await
    }

    async fn acquire_now(&self, n: u64) -> Result<Decision, AcquireError> {
        RedisLimiter::acquire_now(self, n).await
    }

    async fn acquire(&self, n: u64) -> Result<(), AcquireError> {
        RedisLimiter::acquire(self, n).await
    }

    async fn try_acquire_for(&self, n: u64, timeout: Duration) -> Result<Decision, AcquireError> {
        RedisLimiter::try_acquire_for(self, n, timeout).await
    }
}
