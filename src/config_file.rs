//! Limiters defined in a TOML file (crate feature `toml`), so a service can load them at start.
//!
//! # Design
//!
//! A file has optional `[defaults]` and one `[limiters.<name>]` table per limiter. Every key
//! of `[defaults]` may also be set per limiter, which wins. Parsing checks everything a
//! builder would refuse — names, quotas, lease settings — so a file that loads builds, and a
//! bad file is a [`ConfigFileError`] naming the limiter and the field, never a panic:
//!
//! ```toml
//! [defaults]
//! mode = "hybrid"                     # "hybrid" (default) or "pure"
//! on_store_failure = "local_fallback" # "fail_open", "fail_closed", "local_fallback" (default)
//! expected_nodes = 10                 # the fleet size, for local_fallback (default 1)
//! unconfigured = "use_quota"          # "use_quota" (default), "unlimited", "error"
//! budget = "overall"                  # "overall" (default) or "per_client"
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
//!
//! [limiters.search]
//! rate = 200
//! lease_size = 20    # fixed batches instead of adaptive leasing
//! ```
//!
//! [`LimitersConfig::build`] turns a file into running limiters on one store, as
//! [`AnyLimiter`]s (hybrid or pure, both [`Limiter`]s) looked up by name; or take one
//! [`LimiterSpec`] and call [`LimiterSpec::hybrid`] / [`LimiterSpec::pure`] for its builder, to
//! add settings the file does not cover (a seed, a runtime, a custom [`LeasePolicy`]).
//!
//! [`LeasePolicy`]: crate::LeasePolicy

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::config::{Budget, Unconfigured};
use crate::error::Error;
use crate::failure::FailurePolicy;
use crate::hybrid::{HybridBuilder, HybridLimiter};
use crate::key;
use crate::limiter::{Decision, Limiter};
use crate::policy::{AdaptiveLease, FixedLease};
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
    /// A limiter's settings are invalid.
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
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Mode {
    /// [`HybridLimiter`] (the default).
    #[default]
    Hybrid,
    /// [`RedisLimiter`].
    Pure,
}

/// The failure policy's name in a file; `expected_nodes` is a key of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum FailureName {
    FailOpen,
    FailClosed,
    LocalFallback,
}

/// The settings a limiter table and `[defaults]` share; unset keys fall through.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    mode: Option<Mode>,
    on_store_failure: Option<FailureName>,
    expected_nodes: Option<u32>,
    unconfigured: Option<UnconfiguredName>,
    budget: Option<BudgetName>,
    #[serde(default, with = "humantime_serde")]
    horizon: Option<Duration>,
    lease_size: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum UnconfiguredName {
    UseQuota,
    Unlimited,
    Error,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
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
    #[serde(flatten)]
    settings: Settings,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    defaults: Settings,
    #[serde(default)]
    limiters: BTreeMap<String, Table>,
}

/// How leases are sized.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Lease {
    Adaptive(Option<Duration>),
    Fixed(u64),
}

/// One limiter's settings, checked and with the defaults applied.
#[derive(Debug, Clone, PartialEq)]
pub struct LimiterSpec {
    name: String,
    quota: Quota,
    mode: Mode,
    failure: FailurePolicy,
    unconfigured: Unconfigured,
    budget: Budget,
    lease: Lease,
}

impl LimiterSpec {
    fn resolve(name: &str, table: &Table, defaults: &Settings) -> Result<Self, ConfigFileError> {
        let invalid = |reason: String| ConfigFileError::Invalid {
            limiter: name.to_owned(),
            reason,
        };
        key::validate_name(name).map_err(|e| invalid(e.to_string()))?;
        let own = &table.settings;
        let period = table.period.unwrap_or(Duration::from_secs(1));
        let quota = Quota::with_parts(table.rate, period, table.burst.unwrap_or(table.rate))
            .map_err(|e| invalid(format!("invalid quota: {e}")))?;
        let mode = own.mode.or(defaults.mode).unwrap_or_default();
        let nodes = own.expected_nodes.or(defaults.expected_nodes);
        if nodes == Some(0) {
            return Err(invalid("expected_nodes must be at least 1".into()));
        }
        let failure = match own.on_store_failure.or(defaults.on_store_failure) {
            Some(FailureName::FailOpen) => FailurePolicy::FailOpen,
            Some(FailureName::FailClosed) => FailurePolicy::FailClosed,
            Some(FailureName::LocalFallback) | None => {
                FailurePolicy::local_fallback(nodes.unwrap_or(1))
            }
        };
        let unconfigured = match own.unconfigured.or(defaults.unconfigured) {
            Some(UnconfiguredName::UseQuota) | None => Unconfigured::UseQuota,
            Some(UnconfiguredName::Unlimited) => Unconfigured::Unlimited,
            Some(UnconfiguredName::Error) => Unconfigured::Error,
        };
        let budget = match own.budget.or(defaults.budget) {
            Some(BudgetName::Overall) | None => Budget::Overall,
            Some(BudgetName::PerClient) => Budget::PerClient,
        };
        // A limiter's own lease setting replaces the default one, whichever kind it is.
        let (horizon, size) = if own.horizon.is_some() || own.lease_size.is_some() {
            (own.horizon, own.lease_size)
        } else {
            (defaults.horizon, defaults.lease_size)
        };
        let lease = match (horizon, size) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "set horizon (adaptive leasing) or lease_size (fixed batches), not both".into(),
                ))
            }
            (_, Some(0)) => return Err(invalid("lease_size must be at least 1".into())),
            (_, Some(n)) if n > quota.burst() => {
                return Err(invalid(format!(
                    "lease_size {n} exceeds the burst {}",
                    quota.burst()
                )))
            }
            (_, Some(n)) => Lease::Fixed(n),
            (Some(h), None) if h < Duration::from_millis(1) => {
                return Err(invalid("horizon must be at least 1ms".into()))
            }
            (h, None) => Lease::Adaptive(h),
        };
        if mode == Mode::Pure && (own.horizon.is_some() || own.lease_size.is_some()) {
            return Err(invalid(
                "horizon and lease_size are for hybrid mode; this limiter is pure".into(),
            ));
        }
        Ok(LimiterSpec {
            name: name.to_owned(),
            quota,
            mode,
            failure,
            unconfigured,
            budget,
            lease,
        })
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

    /// Its failure policy (hybrid mode).
    pub fn failure_policy(&self) -> FailurePolicy {
        self.failure
    }

    /// A hybrid builder with every setting of the file, whatever the spec's mode.
    pub fn hybrid<S: LeaseStore>(&self, store: S) -> HybridBuilder<S> {
        let builder = HybridLimiter::builder(self.name.clone(), self.quota, store)
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

/// A parsed, checked limiters file.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitersConfig {
    specs: BTreeMap<String, LimiterSpec>,
}

impl LimitersConfig {
    /// Parses a limiters file.
    ///
    /// # Errors
    /// [`ConfigFileError::Parse`] for bad TOML, unknown keys or wrongly typed values;
    /// [`ConfigFileError::Invalid`] for settings a builder would refuse.
    pub fn from_toml(text: &str) -> Result<Self, ConfigFileError> {
        let file: File = toml::from_str(text)?;
        let specs = file
            .limiters
            .iter()
            .map(|(name, table)| {
                LimiterSpec::resolve(name, table, &file.defaults).map(|s| (name.clone(), s))
            })
            .collect::<Result<_, _>>()?;
        Ok(LimitersConfig { specs })
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

    /// The limiter called `name`, if the file defines it.
    pub fn get(&self, name: &str) -> Option<&LimiterSpec> {
        self.specs.get(name)
    }

    /// Every limiter, by name.
    pub fn iter(&self) -> impl Iterator<Item = &LimiterSpec> {
        self.specs.values()
    }

    /// How many limiters the file defines.
    pub fn len(&self) -> usize {
        self.specs.len()
    }

    /// True when the file defines none.
    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    /// Builds every limiter on `store` (cloned for each).
    ///
    /// # Errors
    /// As [`LimiterSpec::build`].
    pub fn build<S: LeaseStore + Clone>(&self, store: &S) -> Result<Limiters<S>, Error> {
        let limiters = self
            .specs
            .iter()
            .map(|(name, spec)| Ok((name.clone(), spec.build(store.clone())?)))
            .collect::<Result<_, Error>>()?;
        Ok(Limiters { limiters })
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

/// The limiters of a file, running, by name.
#[derive(Debug, Clone)]
pub struct Limiters<S: LeaseStore> {
    limiters: BTreeMap<String, AnyLimiter<S>>,
}

impl<S: LeaseStore> Limiters<S> {
    /// The limiter called `name`.
    pub fn get(&self, name: &str) -> Option<&AnyLimiter<S>> {
        self.limiters.get(name)
    }

    /// Every limiter with its name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &AnyLimiter<S>)> {
        self.limiters.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Shuts every hybrid limiter down, giving unused tokens back.
    pub async fn shutdown(&self) {
        for limiter in self.limiters.values() {
            if let AnyLimiter::Hybrid(l) = limiter {
                l.shutdown().await;
            }
        }
    }
}
