//! The limiter modes a scenario compares.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The limiter modes compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// `RedisLimiter`: one store call per request.
    PureRedis,
    /// `HybridLimiter` with the library's default lease policy.
    Hybrid,
    /// `HybridLimiter` with rate leases on: `AdaptiveLease::new().rate_leases(true)`.
    HybridRate,
    /// `HybridLimiter` with `FixedLease::new(batch)`: a plain fixed batch lease.
    HybridFixed,
    /// Each node has a private bucket of `rate / N`, `burst / N`; no coordination.
    StaticShare,
    /// A Redis lock around a client-side bucket: lock, read, write, unlock (simulator only).
    LockBased,
}

impl Mode {
    /// Every mode, in report order.
    pub fn all() -> Vec<Mode> {
        vec![
            Mode::PureRedis,
            Mode::Hybrid,
            Mode::HybridRate,
            Mode::HybridFixed,
            Mode::StaticShare,
        ]
    }

    /// The mode's name in files and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::PureRedis => "pure-redis",
            Mode::Hybrid => "hybrid",
            Mode::HybridRate => "hybrid-rate",
            Mode::HybridFixed => "hybrid-fixed",
            Mode::StaticShare => "static-share",
            Mode::LockBased => "lock-based",
        }
    }

    /// What the mode is in a service's code, for a reader choosing one (the report's
    /// recommendation names it).
    pub fn in_code(self) -> &'static str {
        match self {
            Mode::PureRedis => "RedisLimiter",
            Mode::Hybrid => "HybridLimiter with the default policy",
            Mode::HybridRate => "HybridLimiter with AdaptiveLease::new().rate_leases(true)",
            Mode::HybridFixed => "HybridLimiter with FixedLease",
            Mode::StaticShare => "a local limiter per node at rate / nodes, no store",
            Mode::LockBased => "a lock around a client-side bucket (not in the library)",
        }
    }

    /// Whether the mode's nodes run a [`HybridLimiter`](ratelease::HybridLimiter) (the
    /// modes a scenario's `pure_share` mixes pure-mode nodes into).
    pub fn is_hybrid(self) -> bool {
        matches!(self, Mode::Hybrid | Mode::HybridRate | Mode::HybridFixed)
    }

    /// Every mode the command line and scenarios accept: [`Mode::all`] and `lock-based`,
    /// which runs only when asked for.
    pub fn accepted() -> Vec<Mode> {
        let mut v = Mode::all();
        v.push(Mode::LockBased);
        v
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Mode::accepted()
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown mode {s:?}: expected pure-redis, hybrid, hybrid-rate, hybrid-fixed, static-share or lock-based"
                )
            })
    }
}
