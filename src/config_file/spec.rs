//! One checked limiter definition per table ([`LimiterSpec`], [`KeyedSpec`],
//! [`ConcurrencySpec`]): everything a builder would refuse is refused here, and building one
//! cannot fail for a reason the file could have shown.

use std::fmt::Display;
use std::hash::Hash;
use std::time::Duration;

use crate::algorithm::Algorithm;
use crate::concurrency::{
    self, ConcurrencyBuilder, ConcurrencyLimiter, ConcurrencyMode, ConcurrencyStore,
    DEFAULT_HOLDER_TTL,
};
use crate::config::{Budget, Unconfigured};
use crate::error::BuildError;
use crate::failure::FailurePolicy;
use crate::hybrid::{HybridBuilder, HybridLimiter};
use crate::key;
use crate::keyed::{
    self, KeyedHybridBuilder, KeyedHybridLimiter, KeyedRedisLimiter, DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MAX_KEYS,
};
use crate::lease::policy::{AdaptiveLease, FixedLease};
use crate::pure::{RedisLimiter, RedisLimiterBuilder};
use crate::quota::Quota;
use crate::store::LeaseStore;

use super::built::{AnyKeyedLimiter, AnyLimiter};
use super::raw::{
    failure_policy, invalid, quota, reason, unused_expected_nodes, BudgetName, Common,
    ConcurrencyTable, Defaults, FailureName, KeyedTable, Lease, Table, UnconfiguredName,
};
use super::{ConfigFileError, Mode};

/// One limiter's settings, checked and with the defaults applied.
#[derive(Debug, Clone, PartialEq)]
pub struct LimiterSpec {
    name: String,
    quota: Quota,
    mode: Mode,
    algorithm: Algorithm,
    failure: FailurePolicy,
    /// Whether the file names the policy (a pure limiter returns store errors otherwise).
    failure_named: bool,
    unconfigured: Unconfigured,
    budget: Budget,
    lease: Lease,
    /// Whether a hybrid limiter leases its first batch when built (`prefetch`).
    prefetch: bool,
}

impl LimiterSpec {
    pub(super) fn resolve(
        name: &str,
        table: &Table,
        defaults: &Defaults,
    ) -> Result<Self, ConfigFileError> {
        let invalid = invalid(name);
        key::validate_name(name).map_err(|e| invalid(reason(e)))?;
        let quota = quota(table.rate, table.period, table.burst).map_err(&invalid)?;
        let Common {
            mode,
            failure,
            failure_named,
            lease,
        } = table
            .shared
            .resolve(&defaults.shared, &quota)
            .map_err(&invalid)?;
        table
            .shared
            .unused_expected_nodes(&defaults.shared, mode)
            .map_err(&invalid)?;
        let algorithm = match table.algorithm.as_ref().or(defaults.algorithm.as_ref()) {
            Some(name) => Algorithm::from_name(name).map_err(|e| invalid(e.to_string()))?,
            None => Algorithm::default(),
        };
        let unconfigured = match table.unconfigured.or(defaults.unconfigured) {
            Some(UnconfiguredName::UseQuota) | None => Unconfigured::UseQuota,
            Some(UnconfiguredName::Unlimited) => Unconfigured::Unlimited,
            Some(UnconfiguredName::Error) => Unconfigured::Error,
        };
        let budget = match table.budget.or(defaults.budget) {
            Some(BudgetName::Overall) | None => Budget::Overall,
            Some(BudgetName::PerClient) => Budget::PerClient,
        };
        // A pure limiter's own `prefetch` is a mistake; `[defaults]`' is for the hybrid ones.
        let prefetch = match mode {
            Mode::Hybrid => table.prefetch.or(defaults.prefetch).unwrap_or(true),
            Mode::Pure if table.prefetch.is_some() => {
                return Err(invalid(
                    "prefetch is for hybrid mode; this limiter is pure".into(),
                ))
            }
            Mode::Pure => true,
        };
        let spec = LimiterSpec {
            name: name.to_owned(),
            quota,
            mode,
            algorithm,
            failure,
            failure_named,
            unconfigured,
            budget,
            lease,
            prefetch,
        };
        // What the builders would refuse (a window whose burst is not its rate, leasing
        // batches of an algorithm that cannot, central config on another algorithm), refused
        // now, without a runtime or a store.
        let checked = match mode {
            Mode::Hybrid => algorithm.check_hybrid(&quota, unconfigured),
            Mode::Pure => algorithm.check(&quota, unconfigured),
        };
        checked.map_err(|e| invalid(e.to_string()))?;
        Ok(spec)
    }

    /// The limiter's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its quota.
    pub fn quota(&self) -> Quota {
        self.quota
    }

    /// Its mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Its algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Its failure policy. A pure limiter uses it only if the file names one
    /// (`on_store_failure`); otherwise its calls return the store's errors.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.failure
    }

    /// Whether it leases its first batch when built (hybrid mode; `true` unless the file says
    /// `prefetch = false`: see [`HybridBuilder::prefetch`]).
    pub fn prefetch(&self) -> bool {
        self.prefetch
    }

    /// A hybrid builder with every setting of the file, whatever the spec's mode.
    pub fn hybrid<S: LeaseStore>(&self, store: S) -> HybridBuilder<S> {
        let builder = HybridLimiter::builder(self.name.clone(), self.quota, store)
            .algorithm(self.algorithm)
            .on_store_failure(self.failure)
            .if_unconfigured(self.unconfigured)
            .budget(self.budget)
            .prefetch(self.prefetch);
        match self.lease {
            Lease::Adaptive(None) => builder,
            Lease::Adaptive(Some(h)) => builder.policy(AdaptiveLease::new().horizon(h)),
            Lease::Fixed(n) => builder.policy(FixedLease::new(n)),
        }
    }

    /// A pure-mode builder with the file's settings, whatever the spec's mode.
    pub fn pure<S: LeaseStore>(&self, store: S) -> RedisLimiterBuilder<S> {
        let builder = RedisLimiter::builder(self.name.clone(), self.quota, store)
            .algorithm(self.algorithm)
            .if_unconfigured(self.unconfigured)
            .budget(self.budget);
        match self.failure_named {
            true => builder.on_store_failure(self.failure),
            false => builder,
        }
    }

    /// Builds the limiter in its mode.
    ///
    /// # Errors
    /// As [`HybridBuilder::build`] (a hybrid limiter needs a tokio runtime) and
    /// [`RedisLimiterBuilder::build`].
    pub fn build<S: LeaseStore>(&self, store: S) -> Result<AnyLimiter<S>, BuildError> {
        Ok(match self.mode {
            Mode::Hybrid => AnyLimiter::Hybrid(self.hybrid(store).build()?),
            Mode::Pure => AnyLimiter::Pure(self.pure(store).build()?),
        })
    }
}

/// One keyed limiter's settings (a `[keyed.<name>]` table), checked and with the defaults
/// applied.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyedSpec {
    name: String,
    quota: Quota,
    mode: Mode,
    failure: FailurePolicy,
    /// A pure keyed limiter's policy, if its table or `[defaults]` names fail-open or
    /// fail-closed.
    pure_failure: Option<FailurePolicy>,
    lease: Lease,
    max_keys: usize,
    idle_ttl: Option<Duration>,
    give_back_after: Option<Duration>,
    max_in_flight: usize,
}

impl KeyedSpec {
    pub(super) fn resolve(
        name: &str,
        table: &KeyedTable,
        defaults: &Defaults,
    ) -> Result<Self, ConfigFileError> {
        let invalid = invalid(name);
        keyed::validate_keyed_name(name).map_err(|e| invalid(reason(e)))?;
        let quota = quota(table.rate, table.period, table.burst).map_err(&invalid)?;
        let Common {
            mode,
            failure,
            lease,
            ..
        } = table
            .shared
            .resolve(&defaults.shared, &quota)
            .map_err(&invalid)?;
        let hybrid_only = [
            ("max_keys", table.max_keys.is_some()),
            ("idle_ttl", table.idle_ttl.is_some()),
            ("give_back_after", table.give_back_after.is_some()),
            ("max_in_flight", table.max_in_flight.is_some()),
        ];
        // A pure keyed limiter keeps no per-key state for a fallback rate to live in: it takes
        // only the policies that need none, fail open or closed, from its own table or
        // `[defaults]` (a local-rate policy there is for the limiters that keep state, and is
        // skipped); otherwise its calls return the store's error while Redis is failing.
        let mut pure_failure = None;
        if mode == Mode::Pure {
            if let Some((key, _)) = hybrid_only.iter().find(|(_, set)| *set) {
                return Err(invalid(format!(
                    "{key} is for hybrid mode; this keyed limiter is pure (it keeps no keys)"
                )));
            }
            let own = table.shared.on_store_failure;
            let refused = if matches!(
                own,
                Some(FailureName::LocalFallback | FailureName::LastKnownShare)
            ) {
                Some("on_store_failure")
            } else {
                table.shared.expected_nodes.map(|_| "expected_nodes")
            };
            if let Some(key) = refused {
                return Err(invalid(format!(
                    "{key}: a pure keyed limiter keeps no per-key state for a local rate; it \
                     takes on_store_failure = \"fail-open\" or \"fail-closed\", or set mode = \
                     \"hybrid\""
                )));
            }
            // Fail open or closed, named as every other table's policy is; the table's own
            // name first, as for every other key `[defaults]` sets.
            let from_defaults = defaults
                .shared
                .on_store_failure
                .filter(|name| matches!(name, FailureName::FailOpen | FailureName::FailClosed));
            pure_failure = own
                .or(from_defaults)
                .map(|name| failure_policy(Some(name), None))
                .transpose()
                .map_err(&invalid)?;
        }
        table
            .shared
            .unused_expected_nodes(&defaults.shared, mode)
            .map_err(&invalid)?;
        if table.max_keys == Some(0) {
            return Err(invalid("max_keys must be at least 1".into()));
        }
        if table.max_in_flight == Some(0) {
            return Err(invalid("max_in_flight must be at least 1".into()));
        }
        if let Some(ttl) = table.idle_ttl.filter(|&t| t < keyed::MIN_IDLE_TTL) {
            return Err(invalid(format!(
                "idle_ttl {ttl:?} is below the shortest, {:?}",
                keyed::MIN_IDLE_TTL
            )));
        }
        Ok(KeyedSpec {
            name: name.to_owned(),
            quota,
            mode,
            failure,
            pure_failure,
            lease,
            max_keys: table.max_keys.unwrap_or(DEFAULT_MAX_KEYS),
            idle_ttl: table.idle_ttl,
            give_back_after: table.give_back_after,
            max_in_flight: table.max_in_flight.unwrap_or(DEFAULT_MAX_IN_FLIGHT),
        })
    }

    /// The keyed limiter's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The quota every key gets.
    pub fn quota(&self) -> Quota {
        self.quota
    }

    /// Its mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Its failure policy (hybrid mode). A pure keyed limiter's is
    /// [`pure_failure_policy`](Self::pure_failure_policy).
    pub fn failure_policy(&self) -> FailurePolicy {
        self.failure
    }

    /// A pure keyed limiter's failure policy: fail-open or fail-closed if its table names one
    /// (a pure `[keyed.*]` table that names another is refused), else if `[defaults]` does (a
    /// local-rate policy there is skipped for it); `None`, its calls return the store's error
    /// while Redis is failing.
    pub fn pure_failure_policy(&self) -> Option<FailurePolicy> {
        self.pure_failure
    }

    /// Most keys held in memory (hybrid mode; [`DEFAULT_MAX_KEYS`] unless the file says).
    pub fn max_keys(&self) -> usize {
        self.max_keys
    }

    /// How long an unused key is kept (hybrid mode), if the file says; else the builder's
    /// default.
    pub fn idle_ttl(&self) -> Option<Duration> {
        self.idle_ttl
    }

    /// How long a key's unused tokens are kept (hybrid mode), if the file says; else the
    /// builder's default.
    pub fn give_back_after(&self) -> Option<Duration> {
        self.give_back_after
    }

    /// Most store calls in flight (hybrid mode; [`DEFAULT_MAX_IN_FLIGHT`] unless the file
    /// says).
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    /// A hybrid keyed builder with every setting of the file, whatever the spec's mode. Add
    /// a seed, a runtime or a hasher before building.
    pub fn hybrid<K, S>(&self, store: S) -> KeyedHybridBuilder<K, S>
    where
        K: Hash + Eq + Clone + Display + Send + Sync + 'static,
        S: LeaseStore,
    {
        let mut builder = KeyedHybridLimiter::builder(self.name.clone(), self.quota, store)
            .on_store_failure(self.failure)
            .max_keys(self.max_keys)
            .max_in_flight(self.max_in_flight);
        if let Some(ttl) = self.idle_ttl {
            builder = builder.idle_ttl(ttl);
        }
        if let Some(after) = self.give_back_after {
            builder = builder.give_back_after(after);
        }
        match self.lease {
            Lease::Adaptive(None) => builder,
            Lease::Adaptive(Some(h)) => builder.policy(AdaptiveLease::new().horizon(h)),
            Lease::Fixed(n) => builder.lease_size(n),
        }
    }

    /// The pure keyed limiter of this spec, whatever its mode (pure keyed limiters have no
    /// builder: a name, a quota and a store, and the failure policy its table names).
    ///
    /// # Errors
    /// As [`KeyedRedisLimiter::new`] (the name was checked at load, so in practice none).
    pub fn pure<S: LeaseStore + Clone>(
        &self,
        store: S,
    ) -> Result<KeyedRedisLimiter<S>, BuildError> {
        let limiter = KeyedRedisLimiter::new(self.name.clone(), self.quota, store)?;
        match self.pure_failure {
            Some(policy) => limiter.on_store_failure(policy),
            None => Ok(limiter),
        }
    }

    /// Builds the keyed limiter in its mode, with keys of type `K`.
    ///
    /// # Errors
    /// As [`KeyedHybridBuilder::build`] (a hybrid keyed limiter needs a tokio runtime) and
    /// [`KeyedRedisLimiter::new`].
    pub fn build<K, S>(&self, store: S) -> Result<AnyKeyedLimiter<K, S>, BuildError>
    where
        K: Hash + Eq + Clone + Display + Send + Sync + 'static,
        S: LeaseStore + Clone,
    {
        Ok(match self.mode {
            Mode::Hybrid => AnyKeyedLimiter::Hybrid(self.hybrid(store).build()?),
            Mode::Pure => AnyKeyedLimiter::Pure(self.pure(store)?),
        })
    }
}

/// One concurrency limiter's settings (a `[concurrency.<name>]` table), checked and with the
/// defaults applied.
#[derive(Debug, Clone, PartialEq)]
pub struct ConcurrencySpec {
    name: String,
    limit: u64,
    ttl: Duration,
    mode: ConcurrencyMode,
    failure: FailurePolicy,
    idle_return: Option<Duration>,
}

impl ConcurrencySpec {
    pub(super) fn resolve(
        name: &str,
        table: &ConcurrencyTable,
        defaults: &Defaults,
    ) -> Result<Self, ConfigFileError> {
        let invalid = invalid(name);
        key::validate_name(name).map_err(|e| invalid(reason(e)))?;
        let d = &defaults.shared;
        let failure_name = table.on_store_failure.or(d.on_store_failure);
        // Both modes answer an outage with the policy, the last known share if none is named.
        unused_expected_nodes(table.expected_nodes, failure_name, true).map_err(&invalid)?;
        let failure = failure_policy(failure_name, table.expected_nodes.or(d.expected_nodes))
            .map_err(&invalid)?;
        // `[defaults]`' mode is not consulted: hybrid needs a batch (see the module docs).
        let mode = match (table.mode, table.batch) {
            (None | Some(Mode::Hybrid), Some(batch)) => ConcurrencyMode::Hybrid { batch },
            (Some(Mode::Hybrid), None) => {
                return Err(invalid(
                    "mode = \"hybrid\" needs a batch (slots leased per store call)".into(),
                ))
            }
            (None | Some(Mode::Pure), None) => ConcurrencyMode::Pure,
            (Some(Mode::Pure), Some(_)) => {
                return Err(invalid(
                    "batch is for hybrid mode; this concurrency limiter is pure".into(),
                ))
            }
        };
        if mode == ConcurrencyMode::Pure && table.idle_return.is_some() {
            return Err(invalid(
                "idle_return is for hybrid mode (set a batch); this concurrency limiter is pure"
                    .into(),
            ));
        }
        let ttl = table.ttl.unwrap_or(DEFAULT_HOLDER_TTL);
        // The builder's own checks of limit, ttl and batch, without a runtime or a store.
        concurrency::check_settings(table.limit, ttl, mode).map_err(|e| invalid(reason(e)))?;
        Ok(ConcurrencySpec {
            name: name.to_owned(),
            limit: table.limit,
            ttl,
            mode,
            failure,
            idle_return: table.idle_return,
        })
    }

    /// The concurrency limiter's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Most permits held across the fleet at once.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// How long a holder's record lives without a renewal ([`DEFAULT_HOLDER_TTL`] unless the
    /// file says).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Its mode: hybrid with the file's `batch`, else pure.
    pub fn mode(&self) -> ConcurrencyMode {
        self.mode
    }

    /// Its failure policy.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.failure
    }

    /// A builder with every setting of the file. Add a holder id or a runtime before
    /// building.
    pub fn builder<S: ConcurrencyStore>(&self, store: S) -> ConcurrencyBuilder<S> {
        let builder = ConcurrencyLimiter::builder(self.name.clone(), self.limit, store)
            .ttl(self.ttl)
            .on_store_failure(self.failure);
        let builder = match self.mode {
            ConcurrencyMode::Hybrid { batch } => builder.hybrid(batch),
            _ => builder.pure(),
        };
        match self.idle_return {
            Some(after) => builder.idle_return(after),
            None => builder,
        }
    }

    /// Builds the concurrency limiter.
    ///
    /// # Errors
    /// As [`ConcurrencyBuilder::build`] (it needs a tokio runtime).
    pub fn build<S: ConcurrencyStore>(
        &self,
        store: S,
    ) -> Result<ConcurrencyLimiter<S>, BuildError> {
        self.builder(store).build()
    }
}
