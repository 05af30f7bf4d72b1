//! What a limiter does when the store cannot be reached.
//!
//! A limiter that stalls when Redis stalls takes its service down with it. The circuit is
//! **open** from the first failed store call until one succeeds again; while it is open the
//! store is probed with jittered exponential back-off (10 ms to 500 ms), and callers are
//! answered by the [`FailurePolicy`] without waiting for the store:
//!
//! - [`FailurePolicy::FailOpen`]: admit. The service stays up; the limit is not enforced.
//! - [`FailurePolicy::FailClosed`]: deny. The limit holds; the service is limited to zero.
//! - [`FailurePolicy::LastKnownShare`] (the default): each node enforces the share of the rate
//!   the store last gave it, with a local GCRA bucket (one atomic word) — Doorman's "safe
//!   capacity", learnt rather than configured. The store splits the rate among the live
//!   leasers in proportion to their demand (`LeaseReply::share_mtps`), so the shares sum to
//!   the rate and the fleet stays near its limit through an outage, whatever its size. The
//!   burst is the same fraction of the quota's burst (at least 1). A node that has no share
//!   yet (it never reached the store, or reported no demand) falls back to
//!   `rate / nodes_if_unknown`.
//! - [`FailurePolicy::LocalFallback`]: the same local bucket at a configured share,
//!   `rate / expected_nodes` with a burst of `burst / expected_nodes` (at least 1): for a fleet
//!   of known, fixed size, or to hold the fallback still whatever the store last said.
//!
//! Where the share comes from depends on the limiter. A [`HybridLimiter`] takes it from each
//! lease reply. A [`RedisLimiter`] (pure mode) makes anonymous calls, which the store gives no
//! share; it measures its own: the rate it was granted over the last second before the
//! outage. Under load the fleet's grants sum to the rate, so this too keeps the fleet near its
//! limit; a node idle before the outage has no share and uses `rate / nodes_if_unknown`. A
//! keyed limiter's keys share one fallback rate, so it uses `rate / nodes_if_unknown` per key.
//!
//! In hybrid mode tokens leased before the failure are always spent first, and the probes
//! are the background task's leases. In pure mode the circuit lets one caller at a time probe
//! (when the back-off has passed); everyone else is answered by the policy at once, instead of
//! waiting a timeout per call. The limiters' stats, a `tracing` event on each change, and (for
//! the leasing limiters) the `metrics` gauge `ratelease_circuit_open` (labelled with the
//! policy) show the state; `ratelease_store_errors_total` counts failed calls and
//! `ratelease_degraded_tokens_total` what the policy admitted (see [`crate::telemetry`]).
//! RELIABILITY.md ("Outage defaults") measures each policy's fleet-wide rate.
//!
//! [`HybridLimiter`]: crate::HybridLimiter
//! [`RedisLimiter`]: crate::RedisLimiter

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::error::StoreError;
use crate::quota::Quota;
use crate::retry::Backoff;
use crate::time::Origin;

/// What to answer when local tokens are spent and the store is failing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailurePolicy {
    /// Admit every request while the store is failing.
    FailOpen,
    /// Deny every request (beyond the tokens already leased, and a held rate until the node's
    /// next store call fails: both were granted by the store before it failed) while the store
    /// is failing.
    FailClosed,
    /// Enforce `rate / expected_nodes` locally while the store is failing (with the same part
    /// of the burst: a request larger than that is never served locally — it is denied until
    /// the store answers, the retry hint the store's back-off, and a keyed limiter's waiter
    /// gets the store's error; so under [`LastKnownShare`](Self::LastKnownShare)).
    LocalFallback {
        /// How many nodes share the limit.
        expected_nodes: NonZeroU32,
    },
    /// Enforce this node's last known share of the rate locally while the store is failing
    /// (see the [module docs](self) for where the share comes from); `rate /
    /// nodes_if_unknown` until a share is known. The default, with `nodes_if_unknown` 1.
    LastKnownShare {
        /// How many nodes to assume before the node has a share.
        nodes_if_unknown: NonZeroU32,
    },
}

impl Default for FailurePolicy {
    fn default() -> Self {
        FailurePolicy::LastKnownShare {
            nodes_if_unknown: NonZeroU32::MIN,
        }
    }
}

impl FailurePolicy {
    /// A local fallback for a fleet of `nodes` (0 is read as 1).
    pub fn local_fallback(nodes: u32) -> Self {
        FailurePolicy::LocalFallback {
            expected_nodes: NonZeroU32::new(nodes).unwrap_or(NonZeroU32::MIN),
        }
    }

    /// The node's last known share, assuming a fleet of `nodes` until a share is known (0 is
    /// read as 1). `last_known_share(1)` is the default.
    pub fn last_known_share(nodes_if_unknown: u32) -> Self {
        FailurePolicy::LastKnownShare {
            nodes_if_unknown: NonZeroU32::new(nodes_if_unknown).unwrap_or(NonZeroU32::MIN),
        }
    }

    /// The policy a limiters file names (`"fail-open"`, `"fail-closed"`, `"local-fallback"`,
    /// `"last-known-share"`: [`name`](Self::name)'s spelling), with `nodes` for the policies
    /// that divide the quota by a fleet (`expected_nodes`; 0 is read as 1); `None` for any
    /// other name.
    ///
    /// ```
    /// use ratelease::FailurePolicy;
    ///
    /// let p = FailurePolicy::named("local-fallback", 4).unwrap();
    /// assert_eq!(p, FailurePolicy::local_fallback(4));
    /// assert_eq!(FailurePolicy::named(p.name(), 4), Some(p));
    /// assert_eq!(FailurePolicy::named("fail_open", 1), None);
    /// ```
    pub fn named(name: &str, nodes: u32) -> Option<Self> {
        Some(match name {
            "fail-open" => FailurePolicy::FailOpen,
            "fail-closed" => FailurePolicy::FailClosed,
            "local-fallback" => FailurePolicy::local_fallback(nodes),
            "last-known-share" => FailurePolicy::last_known_share(nodes),
            _ => return None,
        })
    }

    /// The policy's name in metrics and logs: as a limiters file spells it
    /// (`on_store_failure = "last-known-share"`).
    pub fn name(&self) -> &'static str {
        match self {
            FailurePolicy::FailOpen => "fail-open",
            FailurePolicy::FailClosed => "fail-closed",
            FailurePolicy::LocalFallback { .. } => "local-fallback",
            FailurePolicy::LastKnownShare { .. } => "last-known-share",
        }
    }

    /// For the policies that enforce a local rate: the node count its starting share divides
    /// the quota by.
    pub(crate) fn fallback_nodes(&self) -> Option<NonZeroU32> {
        match *self {
            FailurePolicy::LocalFallback { expected_nodes } => Some(expected_nodes),
            FailurePolicy::LastKnownShare { nodes_if_unknown } => Some(nodes_if_unknown),
            FailurePolicy::FailOpen | FailurePolicy::FailClosed => None,
        }
    }

    /// Whether the local rate follows the share the node learns.
    /// Whether `error`, met by a caller waiting for tokens, ends its wait with the error:
    /// under `FailClosed`, and whatever the policy for an error that is no outage (see
    /// [`Circuit::fail`]); otherwise the policy answers the next try.
    pub(crate) fn ends_wait(self, error: &StoreError) -> bool {
        self == FailurePolicy::FailClosed || !error.is_outage()
    }

    pub(crate) fn learns_share(&self) -> bool {
        matches!(self, FailurePolicy::LastKnownShare { .. })
    }

    /// The local rate this policy starts with for `quota`, if it enforces one.
    pub(crate) fn local_rate(&self, quota: &Quota) -> Option<LocalRate> {
        self.fallback_nodes()
            .map(|nodes| LocalRate::share_of(quota, nodes))
    }
}

/// A lock-free local GCRA bucket: one atomic word, the theoretical arrival time.
#[derive(Debug)]
pub(crate) struct LocalRate {
    origin: Origin,
    /// Nanoseconds per token.
    emission_ns: AtomicU64,
    /// How far ahead of now the arrival time may run: the burst, in nanoseconds.
    tolerance_ns: AtomicU64,
    /// Theoretical arrival time, ns since `origin`.
    tat: AtomicU64,
}

impl LocalRate {
    /// This node's share of `quota` among `nodes`.
    pub(crate) fn share_of(quota: &Quota, nodes: NonZeroU32) -> Self {
        let rate = LocalRate {
            origin: Origin::now(),
            emission_ns: AtomicU64::new(0),
            tolerance_ns: AtomicU64::new(0),
            tat: AtomicU64::new(0),
        };
        rate.set_share_of(quota, nodes);
        rate
    }

    /// Switches to this node's share of `quota` (a quota changed centrally). Callers racing
    /// the switch may pair the old emission with the new tolerance for one decision.
    pub(crate) fn set_share_of(&self, quota: &Quota, nodes: NonZeroU32) {
        let nodes = u64::from(nodes.get());
        let period_ns = u128::from(quota.period_us()) * 1_000;
        let emission = (period_ns * u128::from(nodes) / u128::from(quota.rate())).max(1);
        let emission_ns = u64::try_from(emission).unwrap_or(u64::MAX);
        let burst = (quota.burst() / nodes).max(1);
        // Relaxed: two independent parameters; see above.
        self.emission_ns.store(emission_ns, Ordering::Relaxed);
        self.tolerance_ns
            .store(emission_ns.saturating_mul(burst), Ordering::Relaxed);
    }

    /// Switches to a share of `share_mtps` millitokens per second of `quota`'s rate, with the
    /// same fraction of its burst (at least 1). A share of 0 is ignored (nothing is known).
    pub(crate) fn set_share_mtps(&self, quota: &Quota, share_mtps: u64) {
        if share_mtps == 0 {
            return;
        }
        // 10^12 ns·millitokens per token·second.
        let emission = (1_000_000_000_000u128 / u128::from(share_mtps)).max(1);
        let emission_ns = u64::try_from(emission).unwrap_or(u64::MAX);
        // The fraction of the rate: share_mtps / (rate × 10^9 / period_us) in millitokens/s.
        let full_mtps = u128::from(quota.rate()) * 1_000_000_000;
        let burst =
            u128::from(quota.burst()) * u128::from(share_mtps) * u128::from(quota.period_us())
                / full_mtps;
        let burst = u64::try_from(burst)
            .unwrap_or(u64::MAX)
            .clamp(1, quota.burst());
        // Relaxed: two independent parameters; see `set_share_of`.
        self.emission_ns.store(emission_ns, Ordering::Relaxed);
        self.tolerance_ns
            .store(emission_ns.saturating_mul(burst), Ordering::Relaxed);
    }

    /// Follows a quota changed centrally, as `policy` says: a share learnt from the store
    /// (`share_mtps`, 0 if none) keeps its rate and takes the new quota's burst fraction;
    /// otherwise the policy's starting share of the new quota.
    pub(crate) fn follow(&self, policy: FailurePolicy, quota: &Quota, share_mtps: u64) {
        let Some(nodes) = policy.fallback_nodes() else {
            return;
        };
        if share_mtps > 0 && policy.learns_share() {
            self.set_share_mtps(quota, share_mtps);
        } else {
            self.set_share_of(quota, nodes);
        }
    }

    /// Whether `n` tokens fit in this rate's burst at all: a request for more is refused
    /// however long it waits, so its wait is not this rate's to tell (the store, once it
    /// answers again, may serve it).
    pub(crate) fn fits(&self, n: u64) -> bool {
        // Relaxed: as in `try_take_at`.
        let emission = self.emission_ns.load(Ordering::Relaxed);
        n.saturating_mul(emission) <= self.tolerance_ns.load(Ordering::Relaxed)
    }

    /// Takes `n` tokens, or says how long until it could.
    pub(crate) fn try_take(&self, n: u64) -> Result<(), Duration> {
        self.try_take_at(&self.tat, n)
    }

    /// [`try_take`](Self::try_take) at this rate on another arrival-time word: a keyed limiter
    /// keeps one word per key and shares the rate (`tat` starts at 0).
    pub(crate) fn try_take_at(&self, tat_word: &AtomicU64, n: u64) -> Result<(), Duration> {
        let now = self.origin.elapsed_ns();
        let cost = n.saturating_mul(self.emission_ns.load(Ordering::Relaxed));
        let tolerance = self.tolerance_ns.load(Ordering::Relaxed);
        // Relaxed: the word publishes nothing else; the CAS orders the updates among callers.
        let mut tat = tat_word.load(Ordering::Relaxed);
        loop {
            let new = tat.max(now).saturating_add(cost);
            let ahead = new - now;
            if ahead > tolerance {
                return Err(Duration::from_nanos(ahead - tolerance));
            }
            match tat_word.compare_exchange_weak(tat, new, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(actual) => tat = actual,
            }
        }
    }
}

/// Whether a limiter's store is failing: open from a failed lease until a lease succeeds, with
/// the last error for waiters. Each change is a `tracing` event (the metrics are
/// [`telemetry`](crate::telemetry)'s).
#[derive(Debug, Default)]
pub(crate) struct Circuit {
    open: AtomicBool,
    error: Mutex<Option<StoreError>>,
    /// Failures so far; bumped after `error` is written.
    seq: AtomicU64,
}

impl Circuit {
    /// Whether the circuit is open.
    pub(crate) fn is_open(&self) -> bool {
        // Relaxed: a state flag; a caller that reads it a little late answers as before.
        self.open.load(Ordering::Relaxed)
    }

    /// A store call of `limiter` (answering by `policy`) failed: the error is kept for
    /// waiters, and an outage opens the circuit. True if this call opened it (it was closed).
    ///
    /// Only an outage is answered by the failure policy ([`StoreError::is_outage`]): an ACL
    /// denial, a rejected or a malformed reply is the store answering, and retrying will not
    /// help. Such an error closes the circuit (the store is reachable): callers are denied (no
    /// tokens came) and waits end with the error — under `FailOpen` an ACL mistake admitted
    /// everything.
    pub(crate) fn fail(&self, limiter: &str, policy: FailurePolicy, error: StoreError) -> bool {
        let policy = policy.name();
        // The error first: a caller that finds the circuit open finds an error in the slot.
        let previous = self.error.lock().replace(error.clone());
        let opened = error.is_outage() && !self.open.swap(true, Ordering::Relaxed);
        if opened {
            tracing::warn!(limiter = %limiter, %error, policy, "store failing: circuit open");
        } else if !error.is_outage() {
            // The store answered: it is reachable, and an open circuit closes (a store back
            // from an outage with its ACL lost must not leave `FailOpen` admitting everything).
            self.recovered(limiter);
            if previous.is_none_or(|p| p.to_string() != error.to_string()) {
                // Once per error, not once per retry of the background task.
                tracing::warn!(limiter = %limiter, %error, "store refused the call");
            }
        }
        // Release: publishes the error slot to waiters that see the new sequence number.
        self.seq.fetch_add(1, Ordering::Release);
        opened
    }

    /// A store call succeeded: close the circuit. True if this call closed it.
    pub(crate) fn recovered(&self, limiter: &str) -> bool {
        // A load first: the common case (closed) writes nothing to the shared word.
        let closed = self.is_open() && self.open.swap(false, Ordering::Relaxed);
        if closed {
            tracing::info!(limiter = %limiter, "store answering again: circuit closed");
        }
        closed
    }

    /// Failures so far, to compare with later in [`error_since`](Self::error_since).
    pub(crate) fn failures(&self) -> u64 {
        // Acquire: pairs with the Release increment in `fail`, so the error slot is visible.
        self.seq.load(Ordering::Acquire)
    }

    /// The last error, if any.
    pub(crate) fn last_error(&self) -> Option<StoreError> {
        self.error.lock().clone()
    }

    /// The last error, if a failure happened since [`failures`](Self::failures) said `seen`.
    pub(crate) fn error_since(&self, seen: u64) -> Option<StoreError> {
        if self.failures() == seen {
            return None;
        }
        self.error.lock().clone()
    }

    /// The error since [`failures`](Self::failures) read `seen` that ends a wait under
    /// `policy` ([`FailurePolicy::ends_wait`]), if any.
    pub(crate) fn error_ending_wait(&self, seen: u64, policy: FailurePolicy) -> Option<StoreError> {
        self.error_since(seen).filter(|e| policy.ends_wait(e))
    }
}

/// When a limiter without a background task (pure mode) may call a failing store again: one
/// caller at a time, after a jittered exponential back-off since the last failure. The others
/// are answered by the policy without waiting for the store.
#[derive(Debug)]
pub(crate) struct ProbeGate {
    origin: Origin,
    /// No probe before this, ns since `origin`.
    next_ns: AtomicU64,
    /// A probe is in flight.
    busy: AtomicBool,
    backoff: Mutex<(Backoff, fastrand::Rng)>,
}

impl ProbeGate {
    /// A gate whose back-off jitter is drawn from `seed`.
    pub(crate) fn new(seed: u64) -> Self {
        ProbeGate {
            origin: Origin::now(),
            next_ns: AtomicU64::new(0),
            busy: AtomicBool::new(false),
            backoff: Mutex::new((Backoff::for_errors(), fastrand::Rng::with_seed(seed))),
        }
    }

    /// A probe, if it is time for one and no other is in flight. Dropping the ticket without
    /// [`Probe::succeeded`] counts as a failure (a cancelled call proves nothing).
    pub(crate) fn try_probe(&self) -> Option<Probe<'_>> {
        // Relaxed: a schedule; the swap below decides who probes.
        if self.origin.elapsed_ns() < self.next_ns.load(Ordering::Relaxed) {
            return None;
        }
        // Lazily: a ticket made and dropped would count as a failed probe.
        (!self.busy.swap(true, Ordering::Acquire)).then(|| Probe {
            gate: self,
            ok: false,
        })
    }

    /// How long until the next probe may be sent.
    pub(crate) fn wait(&self) -> Duration {
        let next = self.next_ns.load(Ordering::Relaxed);
        Duration::from_nanos(next.saturating_sub(self.origin.elapsed_ns()))
    }

    /// A call succeeded: the next failure starts the back-off over.
    pub(crate) fn reset(&self) {
        self.backoff.lock().0.reset();
        self.next_ns.store(0, Ordering::Relaxed);
    }

    /// A call failed: no probe before the next back-off step.
    pub(crate) fn failed(&self) {
        let wait = {
            let mut guard = self.backoff.lock();
            let (backoff, rng) = &mut *guard;
            backoff.next(rng)
        };
        let next = self
            .origin
            .elapsed_ns()
            .saturating_add(crate::time::nanos(wait));
        self.next_ns.store(next, Ordering::Relaxed);
    }
}

/// The right to probe a failing store once; see [`ProbeGate::try_probe`].
pub(crate) struct Probe<'a> {
    gate: &'a ProbeGate,
    ok: bool,
}

impl Probe<'_> {
    /// The probe was answered: the back-off starts over.
    pub(crate) fn succeeded(mut self) {
        self.ok = true;
        self.gate.reset();
    }
}

impl Drop for Probe<'_> {
    fn drop(&mut self) {
        if !self.ok {
            self.gate.failed();
        }
        self.gate.busy.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_fallback_enforces_its_share() {
        // 1 000/s over 4 nodes: 250/s each, burst 25.
        let q = Quota::per_second(1_000).unwrap().with_burst(100).unwrap();
        let local = LocalRate::share_of(&q, NonZeroU32::new(4).unwrap());
        let burst = (0..100).filter(|_| local.try_take(1).is_ok()).count();
        assert_eq!(burst, 25);
        let wait = local.try_take(1).unwrap_err();
        assert_eq!(wait, Duration::from_millis(4));
        let mut admitted = 0;
        for _ in 0..1_000 {
            tokio::time::advance(Duration::from_millis(1)).await;
            admitted += (0..10).filter(|_| local.try_take(1).is_ok()).count();
        }
        assert_eq!(admitted, 250, "one second at 250/s");
    }

    #[test]
    fn default_is_the_last_known_share() {
        assert_eq!(FailurePolicy::default(), FailurePolicy::last_known_share(1));
        assert_eq!(
            FailurePolicy::local_fallback(0),
            FailurePolicy::local_fallback(1)
        );
        assert_eq!(
            FailurePolicy::last_known_share(0),
            FailurePolicy::last_known_share(1)
        );
        assert_eq!(FailurePolicy::FailClosed.name(), "fail-closed");
        assert_eq!(FailurePolicy::default().name(), "last-known-share");
    }

    #[tokio::test(start_paused = true)]
    async fn a_learnt_share_sets_the_rate_and_the_same_fraction_of_the_burst() {
        // 1 000/s, burst 100; the store gave this node 150/s: burst 15, one token per 6.67 ms.
        let q = Quota::per_second(1_000).unwrap().with_burst(100).unwrap();
        let local = FailurePolicy::default().local_rate(&q).unwrap();
        local.set_share_mtps(&q, 150_000);
        let burst = (0..100).filter(|_| local.try_take(1).is_ok()).count();
        assert_eq!(burst, 15);
        let mut admitted = 0;
        for _ in 0..1_000 {
            tokio::time::advance(Duration::from_millis(1)).await;
            admitted += (0..10).filter(|_| local.try_take(1).is_ok()).count();
        }
        assert_eq!(admitted, 150, "one second at 150/s");
        // A zero share says nothing: the rate stays.
        local.set_share_mtps(&q, 0);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!((0..100).filter(|_| local.try_take(1).is_ok()).count(), 15);
        // A tiny share keeps a burst of 1.
        local.set_share_mtps(&q, 1);
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!((0..10).filter(|_| local.try_take(1).is_ok()).count(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn one_probe_at_a_time_after_the_back_off() {
        let gate = ProbeGate::new(7);
        let probe = gate.try_probe().expect("no failure yet: a probe may go");
        assert!(gate.try_probe().is_none(), "one at a time");
        drop(probe); // unanswered: a failure
        assert!(gate.try_probe().is_none(), "not before the back-off");
        let wait = gate.wait();
        assert!(
            wait >= Duration::from_millis(5) && wait <= Duration::from_millis(10),
            "{wait:?}"
        );
        tokio::time::advance(wait).await;
        gate.try_probe().expect("after the back-off").succeeded();
        assert!(gate.try_probe().is_some(), "answered: no back-off");
    }
}
