//! The file as written: the TOML tables serde reads, before any check, and the checks that
//! turn a table's fields into a quota, a failure policy and the settings shared by every kind.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::error::BuildError;
use crate::failure::FailurePolicy;
use crate::quota::Quota;

use super::{ConfigFileError, Mode};

/// The failure policy's name in a file; `expected_nodes` is a key of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum FailureName {
    FailOpen,
    FailClosed,
    LocalFallback,
    LastKnownShare,
}

/// The keys `[defaults]`, `[limiters.*]` and `[keyed.*]` share; unset keys fall through.
#[derive(Debug, Clone, Default, Deserialize)]
pub(super) struct Shared {
    pub(super) mode: Option<Mode>,
    pub(super) on_store_failure: Option<FailureName>,
    pub(super) expected_nodes: Option<u32>,
    #[serde(default, with = "humantime_serde")]
    pub(super) horizon: Option<Duration>,
    pub(super) lease_size: Option<u64>,
}

/// The keys of each table kind whose struct flattens [`Shared`] into its own, its own before
/// [`SHARED_KEYS`], in serde's order: serde's "unknown field" error cannot list them for such
/// a table (it reads it as a map), so [`accepted_keys`] does, for `ParseError`. A test holds
/// each list to its struct's fields.
const DEFAULTS_KEYS: &[&str] = &["algorithm", "unconfigured", "budget", "prefetch"];
/// [`Table`]'s own keys (see [`DEFAULTS_KEYS`]).
const TABLE_KEYS: &[&str] = &[
    "rate",
    "period",
    "burst",
    "algorithm",
    "unconfigured",
    "budget",
    "prefetch",
];
/// [`KeyedTable`]'s own keys (see [`DEFAULTS_KEYS`]).
const KEYED_KEYS: &[&str] = &[
    "rate",
    "period",
    "burst",
    "max_keys",
    "idle_ttl",
    "give_back_after",
    "max_in_flight",
];
/// [`Shared`]'s keys, which each of the three flattens after its own.
const SHARED_KEYS: &[&str] = &[
    "mode",
    "on_store_failure",
    "expected_nodes",
    "horizon",
    "lease_size",
];

/// The keys `table` takes (as its header names it: `defaults`, `limiters.a`, `keyed.b`), for
/// the kinds whose unknown key serde reports without them; `None` for the others (serde lists
/// a `[concurrency.*]` table's keys itself).
pub(super) fn accepted_keys(table: &str) -> Option<Vec<&'static str>> {
    let own = match table.split('.').next()?.trim() {
        "defaults" => DEFAULTS_KEYS,
        "limiters" => TABLE_KEYS,
        "keyed" => KEYED_KEYS,
        _ => return None,
    };
    Some([own, SHARED_KEYS].concat())
}

/// `[defaults]`: the shared keys, and those of plain limiters only.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Defaults {
    pub(super) algorithm: Option<String>,
    pub(super) unconfigured: Option<UnconfiguredName>,
    pub(super) budget: Option<BudgetName>,
    pub(super) prefetch: Option<bool>,
    #[serde(flatten)]
    pub(super) shared: Shared,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum UnconfiguredName {
    UseQuota,
    Unlimited,
    Error,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum BudgetName {
    Overall,
    PerClient,
}

/// One `[limiters.<name>]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Table {
    pub(super) rate: u64,
    #[serde(default, with = "humantime_serde")]
    pub(super) period: Option<Duration>,
    pub(super) burst: Option<u64>,
    pub(super) algorithm: Option<String>,
    pub(super) unconfigured: Option<UnconfiguredName>,
    pub(super) budget: Option<BudgetName>,
    pub(super) prefetch: Option<bool>,
    #[serde(flatten)]
    pub(super) shared: Shared,
}

/// One `[keyed.<name>]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct KeyedTable {
    pub(super) rate: u64,
    #[serde(default, with = "humantime_serde")]
    pub(super) period: Option<Duration>,
    pub(super) burst: Option<u64>,
    pub(super) max_keys: Option<usize>,
    #[serde(default, with = "humantime_serde")]
    pub(super) idle_ttl: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub(super) give_back_after: Option<Duration>,
    pub(super) max_in_flight: Option<usize>,
    #[serde(flatten)]
    pub(super) shared: Shared,
}

/// One `[concurrency.<name>]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ConcurrencyTable {
    pub(super) limit: u64,
    #[serde(default, with = "humantime_serde")]
    pub(super) ttl: Option<Duration>,
    pub(super) mode: Option<Mode>,
    pub(super) batch: Option<u64>,
    #[serde(default, with = "humantime_serde")]
    pub(super) idle_return: Option<Duration>,
    pub(super) on_store_failure: Option<FailureName>,
    pub(super) expected_nodes: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct File {
    #[serde(default)]
    pub(super) defaults: Defaults,
    #[serde(default)]
    pub(super) limiters: BTreeMap<String, Table>,
    #[serde(default)]
    pub(super) keyed: BTreeMap<String, KeyedTable>,
    #[serde(default)]
    pub(super) concurrency: BTreeMap<String, ConcurrencyTable>,
}

/// How leases are sized.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Lease {
    Adaptive(Option<Duration>),
    Fixed(u64),
}

/// A [`BuildError::Config`]'s message alone, any other error's display.
pub(super) fn reason(e: BuildError) -> String {
    match e {
        BuildError::Config(message) => message,
        e => e.to_string(),
    }
}

/// `rate` tokens per `period` (default 1 s) with `burst` (default `rate`).
pub(super) fn quota(
    rate: u64,
    period: Option<Duration>,
    burst: Option<u64>,
) -> Result<Quota, String> {
    let period = period.unwrap_or(Duration::from_secs(1));
    Quota::with_parts(rate, period, burst.unwrap_or(rate))
        .map_err(|e| format!("invalid quota: {e}"))
}

/// The failure policy a table's (or `[defaults]`') keys name; the last known share by default.
pub(super) fn failure_policy(
    name: Option<FailureName>,
    nodes: Option<u32>,
) -> Result<FailurePolicy, String> {
    if nodes == Some(0) {
        return Err("expected_nodes must be at least 1".into());
    }
    Ok(match name {
        Some(FailureName::FailOpen) => FailurePolicy::FailOpen,
        Some(FailureName::FailClosed) => FailurePolicy::FailClosed,
        Some(FailureName::LocalFallback) => FailurePolicy::local_fallback(nodes.unwrap_or(1)),
        Some(FailureName::LastKnownShare) | None => {
            FailurePolicy::last_known_share(nodes.unwrap_or(1))
        }
    })
}

/// Refuses a table's own `expected_nodes` (`own_nodes`; `[defaults]`' falls through) where
/// the failure policy it resolves to (`failure`: the table's name, else `[defaults]`') keeps no
/// local rate for it to size: fail open or closed, or no policy named where that means none
/// (`unnamed_sizes` false: a pure limiter's calls return the store's errors). Set, it would be
/// ignored.
pub(super) fn unused_expected_nodes(
    own_nodes: Option<u32>,
    failure: Option<FailureName>,
    unnamed_sizes: bool,
) -> Result<(), String> {
    let sizes_a_rate = match failure {
        Some(FailureName::LocalFallback | FailureName::LastKnownShare) => true,
        Some(FailureName::FailOpen | FailureName::FailClosed) => false,
        None => unnamed_sizes,
    };
    if own_nodes.is_some() && !sizes_a_rate {
        return Err(
            "expected_nodes sizes the local rate of on_store_failure = \"last-known-share\" or \
             \"local-fallback\" (a hybrid limiter's default); this limiter's policy keeps none \
             and would ignore it"
                .into(),
        );
    }
    Ok(())
}

/// What the shared keys of a plain or keyed limiter's table resolve to.
pub(super) struct Common {
    pub(super) mode: Mode,
    pub(super) failure: FailurePolicy,
    /// Whether `on_store_failure` is set (a pure limiter returns store errors otherwise).
    pub(super) failure_named: bool,
    pub(super) lease: Lease,
}

impl Shared {
    /// [`unused_expected_nodes`] for a plain or keyed table (these keys, `[defaults]`' under
    /// them), whose limiter runs in `mode`.
    pub(super) fn unused_expected_nodes(
        &self,
        defaults: &Shared,
        mode: Mode,
    ) -> Result<(), String> {
        unused_expected_nodes(
            self.expected_nodes,
            self.on_store_failure.or(defaults.on_store_failure),
            mode == Mode::Hybrid,
        )
    }

    /// Resolves a table's shared keys (`self`) over `[defaults]`' for a limiter of `quota`.
    pub(super) fn resolve(&self, defaults: &Shared, quota: &Quota) -> Result<Common, String> {
        let mode = self.mode.or(defaults.mode).unwrap_or_default();
        let failure_named = self
            .on_store_failure
            .or(defaults.on_store_failure)
            .is_some();
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
                failure_named,
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
            failure_named,
            lease,
        })
    }
}

/// Wraps a reason as [`ConfigFileError::Invalid`] about limiter `name`.
pub(super) fn invalid(name: &str) -> impl Fn(String) -> ConfigFileError + '_ {
    move |reason| ConfigFileError::Invalid {
        limiter: name.to_owned(),
        reason,
        path: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file's policy names and [`FailurePolicy::named`] (the simulator's, any caller's) are
    /// one mapping.
    #[test]
    fn a_files_policy_names_are_failure_policy_named() {
        for (name, file) in [
            ("fail-open", FailureName::FailOpen),
            ("fail-closed", FailureName::FailClosed),
            ("local-fallback", FailureName::LocalFallback),
            ("last-known-share", FailureName::LastKnownShare),
        ] {
            let parsed: FailureName =
                serde::Deserialize::deserialize(serde::de::value::StrDeserializer::<
                    serde::de::value::Error,
                >::new(name))
                .unwrap();
            assert_eq!(parsed, file, "{name}");
            let policy = failure_policy(Some(file), Some(3)).unwrap();
            assert_eq!(FailurePolicy::named(name, 3), Some(policy), "{name}");
            assert_eq!(policy.name(), name);
        }
    }

    /// The field names in a table's `Debug`, the flattened `shared` in its place: the keys
    /// serde takes.
    fn debug_fields(debug: &str) -> Vec<&str> {
        debug
            .match_indices(": ")
            .map(|(i, _)| {
                let before = &debug[..i];
                let start = before
                    .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
                    .map_or(0, |j| j + 1);
                &before[start..]
            })
            .filter(|name| *name != "shared")
            .collect()
    }

    /// Each list of keys an unknown key's error shows is its struct's fields, in order, and
    /// serde takes every one of them (a value of the wrong type is not an unknown field); and
    /// serde itself names an unknown key alone in these tables, which is why the lists exist.
    #[test]
    fn the_keys_an_error_lists_are_the_tables_fields() {
        let table: Table = toml::from_str("rate = 1").unwrap();
        let keyed: KeyedTable = toml::from_str("rate = 1").unwrap();
        let kinds = [
            ("defaults", format!("{:?}", Defaults::default())),
            ("limiters.a", format!("{table:?}")),
            ("keyed.a", format!("{keyed:?}")),
        ];
        for (header, debug) in kinds {
            let keys = accepted_keys(header).unwrap();
            assert_eq!(debug_fields(&debug), keys, "{header}");
            // `rate`, where the table requires it.
            let rate = |key: &str| match keys.contains(&"rate") && key != "rate" {
                true => "rate = 1\n",
                false => "",
            };
            for key in &keys {
                let text = format!("[{header}]\n{}{key} = [1, 2]\n", rate(key));
                let error = toml::from_str::<File>(&text).unwrap_err();
                assert!(
                    !error.message().starts_with("unknown field"),
                    "{header}: {key}: {}",
                    error.message()
                );
            }
            let text = format!("[{header}]\n{}rat = 1\n", rate("rat"));
            let error = toml::from_str::<File>(&text).unwrap_err();
            assert_eq!(error.message(), "unknown field `rat`", "{header}");
        }
        assert_eq!(accepted_keys("concurrency.c"), None);
    }
}
