//! The knobs the limiter builders share, each written once: its value and default
//! ([`CommonKnobs`], a field `knobs` of every builder) and its documented setter
//! ([`knob_setters!`], which writes the setters a builder names into its `impl`). The lease
//! policy is the one shared knob kept in a field of the builder's own (`policy`, see
//! [`knob_setters!`]).
//!
//! | knob | [`HybridBuilder`](crate::HybridBuilder) | [`RedisLimiterBuilder`](crate::RedisLimiterBuilder) | [`KeyedHybridBuilder`](crate::KeyedHybridBuilder) | [`ConcurrencyBuilder`](crate::ConcurrencyBuilder) |
//! | --- | --- | --- | --- | --- |
//! | `algorithm` | ✓ | ✓ | | |
//! | `budget` | ✓ | ✓ | | |
//! | `if_unconfigured` | ✓ | ✓ | | |
//! | `on_store_failure` | ✓ | ✓ | ✓ | ✓ |
//! | `seed` | ✓ | ✓ | ✓ | |
//! | `runtime` | ✓ | | ✓ | ✓ |
//! | `policy`, `lease_size` | ✓ | | ✓ | |
//!
//! A builder reads only the knobs it offers; the others stay at their defaults. Settings of one
//! builder alone (a node id, a holder ttl, the most keys, …) stay in that builder.

use crate::algorithm::Algorithm;
use crate::config::{Budget, Unconfigured};
use crate::error::BuildError;
use crate::failure::FailurePolicy;

/// The values of the shared knobs, at their defaults until a setter changes them.
#[derive(Debug)]
pub(crate) struct CommonKnobs {
    /// How to count.
    pub(crate) algorithm: Algorithm,
    /// Whose budget to spend.
    pub(crate) budget: Budget,
    /// What to do if the name has no quota stored centrally.
    pub(crate) unconfigured: Unconfigured,
    /// What answers while the store is failing; `None` until set, read as the builder's
    /// default ([`failure_or_default`](Self::failure_or_default), or none for a
    /// [`RedisLimiter`](crate::RedisLimiter)).
    pub(crate) failure: Option<FailurePolicy>,
    /// The seed of the limiter's random draws; `None`: a random one.
    pub(crate) seed: Option<u64>,
    /// Where the background task runs; `None`: the runtime `build` is called on.
    pub(crate) runtime: Option<tokio::runtime::Handle>,
}

impl Default for CommonKnobs {
    fn default() -> Self {
        CommonKnobs {
            algorithm: Algorithm::TokenBucket,
            budget: Budget::Overall,
            unconfigured: Unconfigured::UseQuota,
            failure: None,
            seed: None,
            runtime: None,
        }
    }
}

impl CommonKnobs {
    /// The failure policy set, else [`FailurePolicy::default`] (the default of every builder
    /// but [`RedisLimiterBuilder`](crate::RedisLimiterBuilder)'s).
    pub(crate) fn failure_or_default(&self) -> FailurePolicy {
        self.failure.unwrap_or_default()
    }

    /// The seed set, else a random one.
    pub(crate) fn seed_or_random(&self) -> u64 {
        self.seed.unwrap_or_else(|| fastrand::u64(..))
    }

    /// The runtime set, else the one this is called on.
    ///
    /// # Errors
    /// [`BuildError::NoRuntime`] if none was set and this is called outside a tokio runtime.
    pub(crate) fn runtime_or_current(&self) -> Result<tokio::runtime::Handle, BuildError> {
        match &self.runtime {
            Some(rt) => Ok(rt.clone()),
            None => tokio::runtime::Handle::try_current().map_err(|_| BuildError::NoRuntime),
        }
    }
}

/// Writes the setters of the shared knobs a builder names, in its `impl` block; the builder
/// keeps a [`CommonKnobs`] in a field `knobs`, and a builder that offers `policy` its lease
/// policy in a field `policy: Box<dyn LeasePolicy>` (not in [`CommonKnobs`]: a boxed policy
/// need not be unwind-safe, and the builders that lease nothing stay so). Each knob may be
/// preceded by doc lines of the builder's own, added after the shared ones:
///
/// ```text
/// impl<S: LeaseStore> HybridBuilder<S> {
///     knob_setters! {
///         /// Batches are leased under the token bucket and the fixed window.
///         algorithm,
///         runtime,
///     }
/// }
/// ```
macro_rules! knob_setters {
    ($($(#[$doc:meta])* $knob:ident),* $(,)?) => {
        $($crate::builder_knobs::knob_setters!(@knob $knob $(#[$doc])*);)*
    };
    (@knob algorithm $(#[$doc:meta])*) => {
        /// How to count (default [`Algorithm::TokenBucket`](crate::Algorithm::TokenBucket)).
        $(#[$doc])*
        pub fn algorithm(mut self, algorithm: $crate::Algorithm) -> Self {
            self.knobs.algorithm = algorithm;
            self
        }
    };
    (@knob budget $(#[$doc:meta])*) => {
        /// Whose budget to spend (default [`Budget::Overall`](crate::Budget::Overall)).
        $(#[$doc])*
        pub fn budget(mut self, budget: $crate::Budget) -> Self {
            self.knobs.budget = budget;
            self
        }
    };
    (@knob if_unconfigured $(#[$doc:meta])*) => {
        /// What to do if the name has no quota stored centrally (default: use the builder's).
        $(#[$doc])*
        pub fn if_unconfigured(mut self, what: $crate::Unconfigured) -> Self {
            self.knobs.unconfigured = what;
            self
        }
    };
    (@knob on_store_failure $(#[$doc:meta])*) => {
        /// What to answer while the store is failing (see [`crate::failure`]).
        $(#[$doc])*
        pub fn on_store_failure(mut self, policy: $crate::FailurePolicy) -> Self {
            self.knobs.failure = Some(policy);
            self
        }
    };
    (@knob seed $(#[$doc:meta])*) => {
        /// Seeds the limiter's random draws (default: random). Set it for reproducible
        /// simulations.
        $(#[$doc])*
        pub fn seed(mut self, seed: u64) -> Self {
            self.knobs.seed = Some(seed);
            self
        }
    };
    (@knob runtime $(#[$doc:meta])*) => {
        /// Runs the background task on `runtime` (default: the runtime `build` is called on).
        $(#[$doc])*
        pub fn runtime(mut self, runtime: tokio::runtime::Handle) -> Self {
            self.knobs.runtime = Some(runtime);
            self
        }
    };
    (@knob policy $(#[$doc:meta])*) => {
        /// Sizes leases with `policy` (default: [`AdaptiveLease`](crate::AdaptiveLease)).
        $(#[$doc])*
        pub fn policy(mut self, policy: impl $crate::LeasePolicy) -> Self {
            self.policy = Box::new(policy);
            self
        }
    };
    (@knob lease_size $(#[$doc:meta])*) => {
        /// Shorthand for `.policy(FixedLease::new(size))`.
        $(#[$doc])*
        pub fn lease_size(self, size: u64) -> Self {
            self.policy($crate::FixedLease::new(size))
        }
    };
    (@knob $other:ident $($doc:tt)*) => {
        compile_error!(concat!("`", stringify!($other), "` is no shared builder knob"));
    };
}

pub(crate) use knob_setters;
