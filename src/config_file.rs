//! Limiters defined in a TOML file (crate feature `toml`), so a service can load them at start.
//!
//! # Design
//!
//! A file has optional `[defaults]` and one table per limiter: `[limiters.<name>]` for a
//! single budget ([`HybridLimiter`] / [`RedisLimiter`]), `[keyed.<name>]` for one budget per
//! key ([`KeyedHybridLimiter`] / [`KeyedRedisLimiter`]) and `[concurrency.<name>]` for a
//! fleet-wide number of permits ([`ConcurrencyLimiter`]). Every key of `[defaults]` may also be
//! set per limiter, which wins. Parsing checks everything a builder would refuse — names,
//! quotas, lease settings, limits — so a file that loads builds, and a bad file is a
//! [`ConfigFileError`] naming the limiter and the field, never a panic:
//!
//! ```toml
//! [defaults]
//! mode = "hybrid"                     # "hybrid" (default) or "pure"
//! on_store_failure = "local-fallback" # "fail-open", "fail-closed", "local-fallback" (default)
//! expected_nodes = 10                 # the fleet size, for local-fallback (default 1)
//! unconfigured = "use-quota"          # "use-quota" (default), "unlimited", "error"
//! budget = "overall"                  # "overall" (default) or "per-client"
//!
//! [limiters.partner-api]
//! rate = 1000        # tokens per period
//! period = "1s"      # humantime: "250ms", "1m", "1h 30m"; default "1s"
//! burst = 100        # default: rate
//! horizon = "25ms"   # adaptive leasing (the default policy): how long a lease lasts
//!
//! [limiters.sms]
//! rate = 1
//! period = "30m"
//! mode = "pure"
//! algorithm = "sliding-window" # "token-bucket" (default), "fixed-window", "sliding-window",
//!                              # "leaky-bucket" (see `Algorithm`)
//!
//! [limiters.search]
//! rate = 200
//! lease_size = 20    # fixed batches instead of adaptive leasing
//!
//! [keyed.per-user]   # one budget per key, every key with this quota (token bucket)
//! rate = 5
//! period = "1m"
//! max_keys = 100000        # keys held in memory at most (default 100000)
//! idle_ttl = "2m"          # evict a key unused this long (default: fill time + 10s; >= 200ms)
//! give_back_after = "1s"   # return unused tokens after (default: the policy's, else 500ms)
//! max_in_flight = 32       # store calls in flight at once (default 32)
//!
//! [concurrency.exports]
//! limit = 20         # permits held across the fleet at once
//! ttl = "10s"        # a crashed process's permits come back this long after (default 10s)
//! batch = 4          # hybrid: lease 4 slots per store call (default: pure mode, no batch)
//! idle_return = "100ms" # hybrid: give leased slots nobody uses back after (default 100ms)
//! ```
//!
//! [`LimitersConfig::build`] turns a file into running limiters on one store, looked up by
//! name in the [`Limiters`]: [`AnyLimiter`]s (hybrid or pure, both [`Limiter`]s),
//! [`AnyKeyedLimiter`]s (both [`KeyedLimiter`]s) and [`ConcurrencyLimiter`]s. Or take one
//! spec — [`LimiterSpec`], [`KeyedSpec`], [`ConcurrencySpec`] — and call its builder method
//! ([`LimiterSpec::hybrid`], [`KeyedSpec::hybrid`], [`ConcurrencySpec::builder`], …) to add
//! settings the file does not cover (a seed, a runtime, a custom [`LeasePolicy`], a hasher).
//!
//! ## Choices
//!
//! - **Names are unique across the three kinds.** A name defined in two kinds is
//!   [`ConfigFileError::Invalid`]: errors, metrics and lookups name a limiter by its name
//!   alone, and a service reading `sms` should not have to ask which `sms`. (The store would
//!   keep them apart — keyed buckets are `name#key`, concurrency records `{name}:conc` — so
//!   this is for people, not for Redis.)
//! - **`[defaults]` applies where the key means something, and is ignored elsewhere.**
//!   `on_store_failure` and `expected_nodes` apply to every kind. `mode`, `horizon` and
//!   `lease_size` apply to plain and keyed limiters. `algorithm`, `unconfigured` and `budget`
//!   apply to plain limiters only: keyed limiters are token buckets under their own quota.
//!   A concurrency limiter ignores `[defaults]`' `mode`, `horizon` and `lease_size`: its
//!   hybrid mode needs a `batch` and trades fairness for speed, so it is chosen per table.
//!   Ignoring (rather than rejecting) lets one `[defaults]` serve a file with every kind; a
//!   key that does not apply to a kind is still a [`ConfigFileError::Parse`] error in that
//!   kind's own table (`deny_unknown_fields`), as is any misspelt key.
//! - **Settings of hybrid mode in a pure limiter's table are refused**, not ignored: a table
//!   that sets `lease_size`, `horizon`, `max_keys`, `idle_ttl`, `give_back_after`,
//!   `max_in_flight`, `batch` or `idle_return` on a pure limiter asks for something it would
//!   not get. Such keys in `[defaults]` are skipped for pure limiters.
//! - **Values a builder would quietly raise are refused**: `max_keys = 0`,
//!   `max_in_flight = 0`, an `idle_ttl` under 200 ms — the file would say one thing and the
//!   limiter do another.
//! - **A concurrency limiter's mode follows `batch`**: `batch = n` makes it hybrid, no batch
//!   pure; `mode = "hybrid"` without a batch, or `mode = "pure"` with one, is refused.
//! - **Keyed limiters are generic over their key type `K`**, which a file cannot name.
//!   [`LimitersConfig::build`] builds them with `String` keys (which take `&str` lookups and,
//!   since buckets are named by a key's `Display` form, share budgets with any other key type
//!   that prints alike); [`LimitersConfig::build_with_keys`] picks another `K` for all of
//!   them, and [`KeyedSpec::build`] builds one with its own `K`.
//!
//! [`LeasePolicy`]: crate::LeasePolicy

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::fmt::Display;
use std::hash::Hash;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::algorithm::Algorithm;
use crate::concurrency::{
    self, ConcurrencyBuilder, ConcurrencyLimiter, ConcurrencyMode, ConcurrencyStore,
    DEFAULT_HOLDER_TTL,
};
use crate::config::{Budget, Unconfigured};
use crate::error::Error;
use crate::failure::FailurePolicy;
use crate::hybrid::{HybridBuilder, HybridLimiter};
use crate::key;
use crate::keyed::{
    self, KeyedHybridBuilder, KeyedHybridLimiter, KeyedRedisLimiter, DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_MAX_KEYS,
};
use crate::lease::policy::{AdaptiveLease, FixedLease};
use crate::limiter::{Decision, KeyRef, KeyedLimiter, Limiter};
use crate::pure::{RedisLimiter, RedisLimiterBuilder};
use crate::quota::Quota;
use crate::store::LeaseStore;

/// Why a limiters file could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigFileError {
    /// The file could not be read.
    #[error("cannot read {path}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML, or has an unknown key or a value of the wrong type.
    #[error("invalid limiters file: {0}")]
    Parse(#[from] toml::de::Error),
    /// A limiter's settings are invalid (of any kind: plain, keyed or concurrency).
    #[error("limiter {limiter:?}: {reason}")]
    Invalid {
        /// The limiter's name.
        limiter: String,
        /// What is wrong.
        reason: String,
    },
}

/// How a limiter decides: leasing batches, or one store call per decision.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Mode {
    /// [`HybridLimiter`] or [`KeyedHybridLimiter`] (the default); for a concurrency limiter,
    /// [`ConcurrencyMode::Hybrid`].
    #[default]
    Hybrid,
    /// [`RedisLimiter`] or [`KeyedRedisLimiter`]; for a concurrency limiter,
    /// [`ConcurrencyMode::Pure`].
    Pure,
}

/// The failure policy's name in a file; `expected_nodes` is a key of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum FailureName {
    FailOpen,
    FailClosed,
    LocalFallback,
}

/// The keys `[defaults]`, `[limiters.*]` and `[keyed.*]` share; unset keys fall through.
#[derive(Debug, Clone, Default, Deserialize)]
struct Shared {
    mode: Option<Mode>,
    on_store_failure: Option<FailureName>,
    expected_nodes: Option<u32>,
    #[serde(default, with = "humantime_serde")]
    horizon: Option<Duration>,
    lease_size: Option<u64>,
}

/// `[defaults]`: the shared keys, and those of plain limiters only.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Defaults {
    algorithm: Option<String>,
    unconfigured: Option<UnconfiguredName>,
    budget: Option<BudgetName>,
    #[serde(flatten)]
    shared: Shared,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum UnconfiguredName {
    UseQuota,
    Unlimited,
    Error,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum BudgetName {
    Overall,
    PerClient,
}

/// One `[limiters.<name>]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Table {
    rate: u64,
    #[serde(default, with = "humantime_serde")]
    period: Option<Duration>,
    burst: Option<u64>,
    algorithm: Option<String>,
    unconfigured: Option<UnconfiguredName>,
    budget: Option<BudgetName>,
    #[serde(flatten)]
    shared: Shared,
}

/// One `[keyed.<name>]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyedTable {
    rate: u64,
    #[serde(default, with = "humantime_serde")]
    period: Option<Duration>,
    burst: Option<u64>,
    max_keys: Option<usize>,
    #[serde(default, with = "humantime_serde")]
    idle_ttl: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    give_back_after: Option<Duration>,
    max_in_flight: Option<usize>,
    #[serde(flatten)]
    shared: Shared,
}

/// One `[concurrency.<name>]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConcurrencyTable {
    limit: u64,
    #[serde(default, with = "humantime_serde")]
    ttl: Option<Duration>,
    mode: Option<Mode>,
    batch: Option<u64>,
    #[serde(default, with = "humantime_serde")]
    idle_return: Option<Duration>,
    on_store_failure: Option<FailureName>,
    expected_nodes: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    defaults: Defaults,
    #[serde(default)]
    limiters: BTreeMap<String, Table>,
    #[serde(default)]
    keyed: BTreeMap<String, KeyedTable>,
    #[serde(default)]
    concurrency: BTreeMap<String, ConcurrencyTable>,
}

/// How leases are sized.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Lease {
    Adaptive(Option<Duration>),
    Fixed(u64),
}

/// An [`Error::Config`]'s message alone, any other error's display.
fn reason(e: Error) -> String {
    match e {
        Error::Config(message) => message,
        e => e.to_string(),
    }
}

/// `rate` tokens per `period` (default 1 s) with `burst` (default `rate`).
fn quota(rate: u64, period: Option<Duration>, burst: Option<u64>) -> Result<Quota, String> {
    let period = period.unwrap_or(Duration::from_secs(1));
    Quota::with_parts(rate, period, burst.unwrap_or(rate))
        .map_err(|e| format!("invalid quota: {e}"))
}

/// The failure policy a table's (or `[defaults]`') keys name; local fallback by default.
fn failure_policy(name: Option<FailureName>, nodes: Option<u32>) -> Result<FailurePolicy, String> {
    if nodes == Some(0) {
        return Err("expected_nodes must be at least 1".into());
    }
    Ok(match name {
        Some(FailureName::FailOpen) => FailurePolicy::FailOpen,
        Some(FailureName::FailClosed) => FailurePolicy::FailClosed,
        Some(FailureName::LocalFallback) | None => {
            FailurePolicy::local_fallback(nodes.unwrap_or(1))
        }
    })
}

/// What the shared keys of a plain or keyed limiter's table resolve to.
struct Common {
    mode: Mode,
    failure: FailurePolicy,
    lease: Lease,
}

impl Shared {
    /// Resolves a table's shared keys (`self`) over `[defaults]`' for a limiter of `quota`.
    fn resolve(&self, defaults: &Shared, quota: &Quota) -> Result<Common, String> {
        let mode = self.mode.or(defaults.mode).unwrap_or_default();
        let failure = failure_policy(
            self.on_store_failure.or(defaults.on_store_failure),
            self.expected_nodes.or(defaults.expected_nodes),
        )?;
        let own_lease = self.horizon.is_some() || self.lease_size.is_some();
        if mode == Mode::Pure {
            // `[defaults]`' lease settings are for the hybrid limiters; a pure one's own are
            // a mistake.
            if own_lease {
                return Err(
                    "horizon and lease_size are for hybrid mode; this limiter is pure".into(),
                );
            }
            let lease = Lease::Adaptive(None);
            return Ok(Common {
                mode,
                failure,
                lease,
            });
        }
        // A limiter's own lease setting replaces the default one, whichever kind it is.
        let (horizon, size) = if own_lease {
            (self.horizon, self.lease_size)
        } else {
            (defaults.horizon, defaults.lease_size)
        };
        let lease = match (horizon, size) {
            (Some(_), Some(_)) => {
                return Err(
                    "set horizon (adaptive leasing) or lease_size (fixed batches), not both".into(),
                )
            }
            (_, Some(0)) => return Err("lease_size must be at least 1".into()),
            (_, Some(n)) if n > quota.burst() => {
                return Err(format!(
                    "lease_size {n} exceeds the burst {}",
                    quota.burst()
                ))
            }
            (_, Some(n)) => Lease::Fixed(n),
            (Some(h), None) if h < Duration::from_millis(1) => {
                return Err("horizon must be at least 1ms".into())
            }
            (h, None) => Lease::Adaptive(h),
        };
        Ok(Common {
            mode,
            failure,
            lease,
        })
    }
}

/// Wraps a reason as [`ConfigFileError::Invalid`] about limiter `name`.
fn invalid(name: &str) -> impl Fn(String) -> ConfigFileError + '_ {
    move |reason| ConfigFileError::Invalid {
        limiter: name.to_owned(),
        reason,
    }
}

/// One limiter's settings, checked and with the defaults applied.
#[derive(Debug, Clone, PartialEq)]
pub struct LimiterSpec {
    name: String,
    quota: Quota,
    mode: Mode,
    algorithm: Algorithm,
    failure: FailurePolicy,
    unconfigured: Unconfigured,
    budget: Budget,
    lease: Lease,
}

impl LimiterSpec {
    fn resolve(name: &str, table: &Table, defaults: &Defaults) -> Result<Self, ConfigFileError> {
        let invalid = invalid(name);
        key::validate_name(name).map_err(|e| invalid(reason(e)))?;
        let quota = quota(table.rate, table.period, table.burst).map_err(&invalid)?;
        let Common {
            mode,
            failure,
            lease,
        } = table
            .shared
            .resolve(&defaults.shared, &quota)
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
        let spec = LimiterSpec {
            name: name.to_owned(),
            quota,
            mode,
            algorithm,
            failure,
            unconfigured,
            budget,
            lease,
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

    /// Its failure policy (hybrid mode).
    pub fn failure_policy(&self) -> FailurePolicy {
        self.failure
    }

    /// A hybrid builder with every setting of the file, whatever the spec's mode.
    pub fn hybrid<S: LeaseStore>(&self, store: S) -> HybridBuilder<S> {
        let builder = HybridLimiter::builder(self.name.clone(), self.quota, store)
            .algorithm(self.algorithm)
            .on_store_failure(self.failure)
            .if_unconfigured(self.unconfigured)
            .budget(self.budget);
        match self.lease {
            Lease::Adaptive(None) => builder,
            Lease::Adaptive(Some(h)) => builder.policy(AdaptiveLease::new().horizon(h)),
            Lease::Fixed(n) => builder.policy(FixedLease::new(n)),
        }
    }

    /// A pure-mode builder with the file's settings, whatever the spec's mode.
    pub fn pure<S: LeaseStore>(&self, store: S) -> RedisLimiterBuilder<S> {
        RedisLimiter::builder(self.name.clone(), self.quota, store)
            .algorithm(self.algorithm)
            .if_unconfigured(self.unconfigured)
            .budget(self.budget)
    }

    /// Builds the limiter in its mode.
    ///
    /// # Errors
    /// As [`HybridBuilder::build`] (a hybrid limiter needs a tokio runtime) and
    /// [`RedisLimiterBuilder::build`].
    pub fn build<S: LeaseStore>(&self, store: S) -> Result<AnyLimiter<S>, Error> {
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
    lease: Lease,
    max_keys: usize,
    idle_ttl: Option<Duration>,
    give_back_after: Option<Duration>,
    max_in_flight: usize,
}

impl KeyedSpec {
    fn resolve(
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
        if mode == Mode::Pure {
            if let Some((key, _)) = hybrid_only.iter().find(|(_, set)| *set) {
                return Err(invalid(format!(
                    "{key} is for hybrid mode; this keyed limiter is pure (it keeps no keys)"
                )));
            }
        }
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

    /// Its failure policy (hybrid mode).
    pub fn failure_policy(&self) -> FailurePolicy {
        self.failure
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
    /// builder: a name, a quota and a store are all they take).
    ///
    /// # Errors
    /// As [`KeyedRedisLimiter::new`] (the name was checked at load, so in practice none).
    pub fn pure<S: LeaseStore + Clone>(&self, store: S) -> Result<KeyedRedisLimiter<S>, Error> {
        KeyedRedisLimiter::new(self.name.clone(), self.quota, store)
    }

    /// Builds the keyed limiter in its mode, with keys of type `K`.
    ///
    /// # Errors
    /// As [`KeyedHybridBuilder::build`] (a hybrid keyed limiter needs a tokio runtime) and
    /// [`KeyedRedisLimiter::new`].
    pub fn build<K, S>(&self, store: S) -> Result<AnyKeyedLimiter<K, S>, Error>
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
    fn resolve(
        name: &str,
        table: &ConcurrencyTable,
        defaults: &Defaults,
    ) -> Result<Self, ConfigFileError> {
        let invalid = invalid(name);
        key::validate_name(name).map_err(|e| invalid(reason(e)))?;
        let d = &defaults.shared;
        let failure = failure_policy(
            table.on_store_failure.or(d.on_store_failure),
            table.expected_nodes.or(d.expected_nodes),
        )
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
    pub fn build<S: ConcurrencyStore>(&self, store: S) -> Result<ConcurrencyLimiter<S>, Error> {
        self.builder(store).build()
    }
}

/// A parsed, checked limiters file.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitersConfig {
    specs: BTreeMap<String, LimiterSpec>,
    keyed: BTreeMap<String, KeyedSpec>,
    concurrency: BTreeMap<String, ConcurrencySpec>,
}

/// Resolves every table of one kind.
fn resolve_all<T, Spec>(
    tables: &BTreeMap<String, T>,
    defaults: &Defaults,
    resolve: impl Fn(&str, &T, &Defaults) -> Result<Spec, ConfigFileError>,
) -> Result<BTreeMap<String, Spec>, ConfigFileError> {
    tables
        .iter()
        .map(|(name, table)| resolve(name, table, defaults).map(|s| (name.clone(), s)))
        .collect()
}

impl LimitersConfig {
    /// Parses a limiters file.
    ///
    /// # Errors
    /// [`ConfigFileError::Parse`] for bad TOML, unknown keys or wrongly typed values;
    /// [`ConfigFileError::Invalid`] for settings a builder would refuse, and for a name
    /// defined in two kinds of table.
    pub fn from_toml(text: &str) -> Result<Self, ConfigFileError> {
        let file: File = toml::from_str(text)?;
        let kinds = [
            ("limiters", file.limiters.keys().collect::<Vec<_>>()),
            ("keyed", file.keyed.keys().collect()),
            ("concurrency", file.concurrency.keys().collect()),
        ];
        let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
        for (kind, names) in &kinds {
            for name in names {
                if let Some(first) = seen.insert(name.as_str(), kind) {
                    return Err(invalid(name)(format!(
                        "defined as both [{first}.{name}] and [{kind}.{name}]; \
                         names are unique across kinds"
                    )));
                }
            }
        }
        Ok(LimitersConfig {
            specs: resolve_all(&file.limiters, &file.defaults, LimiterSpec::resolve)?,
            keyed: resolve_all(&file.keyed, &file.defaults, KeyedSpec::resolve)?,
            concurrency: resolve_all(&file.concurrency, &file.defaults, ConcurrencySpec::resolve)?,
        })
    }

    /// Reads and parses a limiters file.
    ///
    /// # Errors
    /// [`ConfigFileError::Io`] if it cannot be read, else as [`from_toml`](Self::from_toml).
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ConfigFileError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigFileError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml(&text)
    }

    /// The limiter called `name` (a `[limiters.<name>]` table), if the file defines it.
    pub fn get(&self, name: &str) -> Option<&LimiterSpec> {
        self.specs.get(name)
    }

    /// Every `[limiters.*]` limiter, by name.
    pub fn iter(&self) -> impl Iterator<Item = &LimiterSpec> {
        self.specs.values()
    }

    /// The keyed limiter called `name` (a `[keyed.<name>]` table), if the file defines it.
    pub fn keyed(&self, name: &str) -> Option<&KeyedSpec> {
        self.keyed.get(name)
    }

    /// Every keyed limiter, by name.
    pub fn iter_keyed(&self) -> impl Iterator<Item = &KeyedSpec> {
        self.keyed.values()
    }

    /// The concurrency limiter called `name` (a `[concurrency.<name>]` table), if the file
    /// defines it.
    pub fn concurrency(&self, name: &str) -> Option<&ConcurrencySpec> {
        self.concurrency.get(name)
    }

    /// Every concurrency limiter, by name.
    pub fn iter_concurrency(&self) -> impl Iterator<Item = &ConcurrencySpec> {
        self.concurrency.values()
    }

    /// How many limiters the file defines, of every kind.
    pub fn len(&self) -> usize {
        self.specs.len() + self.keyed.len() + self.concurrency.len()
    }

    /// True when the file defines none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Builds every limiter on `store` (cloned for each), keyed ones with `String` keys. The
    /// store serves concurrency limits too ([`ConcurrencyStore`]: [`RedisStore`] and
    /// [`MemoryStore`] do), whether or not the file has any.
    ///
    /// [`RedisStore`]: crate::RedisStore
    /// [`MemoryStore`]: crate::MemoryStore
    ///
    /// # Errors
    /// As [`LimiterSpec::build`], [`KeyedSpec::build`] and [`ConcurrencySpec::build`]: a
    /// tokio runtime is needed for hybrid and concurrency limiters.
    pub fn build<S>(&self, store: &S) -> Result<Limiters<S>, Error>
    where
        S: LeaseStore + ConcurrencyStore + Clone,
    {
        self.build_with_keys(store)
    }

    /// As [`build`](Self::build), with keyed limiters keyed by `K`. (For keyed limiters of
    /// different key types, build each from its [`KeyedSpec`].)
    ///
    /// # Errors
    /// As [`build`](Self::build).
    pub fn build_with_keys<K, S>(&self, store: &S) -> Result<Limiters<S, K>, Error>
    where
        K: Hash + Eq + Clone + Display + Send + Sync + 'static,
        S: LeaseStore + ConcurrencyStore + Clone,
    {
        let limiters = self
            .specs
            .iter()
            .map(|(name, spec)| Ok((name.clone(), spec.build(store.clone())?)))
            .collect::<Result<_, Error>>()?;
        let keyed = self
            .keyed
            .iter()
            .map(|(name, spec)| Ok((name.clone(), spec.build(store.clone())?)))
            .collect::<Result<_, Error>>()?;
        let concurrency = self
            .concurrency
            .iter()
            .map(|(name, spec)| Ok((name.clone(), spec.build(store.clone())?)))
            .collect::<Result<_, Error>>()?;
        Ok(Limiters {
            limiters,
            keyed,
            concurrency,
        })
    }
}

/// A limiter in either mode.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum AnyLimiter<S: LeaseStore> {
    /// Leasing batches.
    Hybrid(HybridLimiter<S>),
    /// One store call per decision.
    Pure(RedisLimiter<S>),
}

impl<S: LeaseStore + Clone> Limiter for AnyLimiter<S> {
    fn quota(&self) -> Quota {
        match self {
            AnyLimiter::Hybrid(l) => l.quota(),
            AnyLimiter::Pure(l) => l.quota(),
        }
    }

    async fn try_acquire(&self, n: u64) -> Result<Decision, Error> {
        match self {
            AnyLimiter::Hybrid(l) => l.try_acquire(n),
            AnyLimiter::Pure(l) => l.try_acquire(n).await,
        }
    }

    async fn acquire(&self, n: u64) -> Result<(), Error> {
        match self {
            AnyLimiter::Hybrid(l) => l.acquire(n).await,
            AnyLimiter::Pure(l) => l.acquire(n).await,
        }
    }

    async fn try_acquire_for(&self, n: u64, timeout: Duration) -> Result<Decision, Error> {
        match self {
            AnyLimiter::Hybrid(l) => l.try_acquire_for(n, timeout).await,
            AnyLimiter::Pure(l) => l.try_acquire_for(n, timeout).await,
        }
    }

    fn try_acquire_now(&self, n: u64) -> Option<Result<Decision, Error>> {
        match self {
            AnyLimiter::Hybrid(l) => Some(l.try_acquire(n)),
            AnyLimiter::Pure(_) => None,
        }
    }
}

impl<S: LeaseStore> AnyLimiter<S> {
    /// Waits until the limiter can answer its first check without a lease still in flight:
    /// [`HybridLimiter::ready`] for a hybrid one; a pure one is always ready.
    ///
    /// # Errors
    /// As [`HybridLimiter::ready`].
    pub async fn ready(&self) -> Result<(), Error> {
        match self {
            AnyLimiter::Hybrid(l) => l.ready().await,
            AnyLimiter::Pure(_) => Ok(()),
        }
    }
}

/// A keyed limiter in either mode, keyed by `K`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum AnyKeyedLimiter<K, S: LeaseStore> {
    /// Leasing batches per key.
    Hybrid(KeyedHybridLimiter<K, S>),
    /// One store call per decision.
    Pure(KeyedRedisLimiter<S>),
}

impl<K, S> AnyKeyedLimiter<K, S>
where
    K: Hash + Eq + Clone + Display + Send + Sync + 'static,
    S: LeaseStore + Clone,
{
    /// The limiter's name.
    pub fn name(&self) -> &str {
        match self {
            AnyKeyedLimiter::Hybrid(l) => l.name(),
            AnyKeyedLimiter::Pure(l) => l.name(),
        }
    }

    /// The name of `key`'s bucket in the store.
    pub fn bucket_name<Q: Display + ?Sized>(&self, key: &Q) -> String {
        match self {
            AnyKeyedLimiter::Hybrid(l) => l.bucket_name(key),
            AnyKeyedLimiter::Pure(l) => l.bucket_name(key),
        }
    }

    /// Shuts a hybrid keyed limiter down, giving every key's tokens back; nothing to do for
    /// a pure one.
    pub async fn shutdown(&self) {
        if let AnyKeyedLimiter::Hybrid(l) = self {
            l.shutdown().await;
        }
    }
}

impl<K, S> KeyedLimiter<K> for AnyKeyedLimiter<K, S>
where
    K: Hash + Eq + Clone + Display + Send + Sync + 'static,
    S: LeaseStore + Clone,
{
    fn quota(&self) -> Quota {
        match self {
            AnyKeyedLimiter::Hybrid(l) => l.quota(),
            AnyKeyedLimiter::Pure(l) => l.quota(),
        }
    }

    async fn try_acquire<Q>(&self, key: &Q, n: u64) -> Result<Decision, Error>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        match self {
            AnyKeyedLimiter::Hybrid(l) => l.try_acquire(key, n),
            AnyKeyedLimiter::Pure(l) => l.try_acquire(key, n).await,
        }
    }

    async fn acquire<Q>(&self, key: &Q, n: u64) -> Result<(), Error>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        match self {
            AnyKeyedLimiter::Hybrid(l) => l.acquire(key, n).await,
            AnyKeyedLimiter::Pure(l) => l.acquire(key, n).await,
        }
    }

    async fn try_acquire_for<Q>(
        &self,
        key: &Q,
        n: u64,
        timeout: Duration,
    ) -> Result<Decision, Error>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        match self {
            AnyKeyedLimiter::Hybrid(l) => l.try_acquire_for(key, n, timeout).await,
            AnyKeyedLimiter::Pure(l) => l.try_acquire_for(key, n, timeout).await,
        }
    }

    fn try_acquire_now<Q>(&self, key: &Q, n: u64) -> Option<Result<Decision, Error>>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        match self {
            AnyKeyedLimiter::Hybrid(l) => Some(l.try_acquire(key, n)),
            AnyKeyedLimiter::Pure(_) => None,
        }
    }
}

/// The limiters of a file, running, by name; keyed ones keyed by `K`.
#[derive(Debug, Clone)]
pub struct Limiters<S: LeaseStore + ConcurrencyStore, K = String> {
    limiters: BTreeMap<String, AnyLimiter<S>>,
    keyed: BTreeMap<String, AnyKeyedLimiter<K, S>>,
    concurrency: BTreeMap<String, ConcurrencyLimiter<S>>,
}

impl<S: LeaseStore + ConcurrencyStore, K> Limiters<S, K> {
    /// The limiter called `name` (from `[limiters.<name>]`).
    pub fn get(&self, name: &str) -> Option<&AnyLimiter<S>> {
        self.limiters.get(name)
    }

    /// Every `[limiters.*]` limiter with its name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &AnyLimiter<S>)> {
        self.limiters.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The keyed limiter called `name` (from `[keyed.<name>]`).
    pub fn keyed(&self, name: &str) -> Option<&AnyKeyedLimiter<K, S>> {
        self.keyed.get(name)
    }

    /// Every keyed limiter with its name.
    pub fn iter_keyed(&self) -> impl Iterator<Item = (&str, &AnyKeyedLimiter<K, S>)> {
        self.keyed.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The concurrency limiter called `name` (from `[concurrency.<name>]`).
    pub fn concurrency(&self, name: &str) -> Option<&ConcurrencyLimiter<S>> {
        self.concurrency.get(name)
    }

    /// Every concurrency limiter with its name.
    pub fn iter_concurrency(&self) -> impl Iterator<Item = (&str, &ConcurrencyLimiter<S>)> {
        self.concurrency.iter().map(|(k, v)| (k.as_str(), v))
    }
}

impl<S, K> Limiters<S, K>
where
    S: LeaseStore + ConcurrencyStore + Clone,
    K: Hash + Eq + Clone + Display + Send + Sync + 'static,
{
    /// Waits until every `[limiters.*]` limiter is ready (see [`AnyLimiter::ready`]): a warm
    /// start, before serving traffic. Their first leases were all asked for when they were
    /// built, so this waits about one round trip, not one per limiter. (Keyed limiters lease
    /// per key, when a key is first seen.)
    ///
    /// # Errors
    /// The first error: [`Error::Store`] if a first lease failed (the
    /// limiters keep running under their failure policies).
    pub async fn ready(&self) -> Result<(), Error> {
        for limiter in self.limiters.values() {
            limiter.ready().await?;
        }
        Ok(())
    }

    /// Shuts every limiter down: hybrid ones give unused tokens back, concurrency limiters
    /// give back what no permit holds.
    pub async fn shutdown(&self) {
        for limiter in self.limiters.values() {
            if let AnyLimiter::Hybrid(l) = limiter {
                l.shutdown().await;
            }
        }
        for limiter in self.keyed.values() {
            limiter.shutdown().await;
        }
        for limiter in self.concurrency.values() {
            limiter.shutdown().await;
        }
    }
}
