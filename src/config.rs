//! Central configuration: a limiter's quota stored next to its bucket, and budgets.
//!
//! # Design
//!
//! A name's quota can be stored in the store (in Redis, the hash `<prefix>{name}:config`, in
//! the bucket's hash tag so the script can read it on Redis Cluster). The token-bucket script
//! reads it on every call: when it is there it wins over the caller's quota, and every reply
//! carries the quota the call ran under ([`LeaseReply::quota`](crate::LeaseReply::quota) and
//! [`source`](crate::LeaseReply::source)). So every process picks up a change at its next
//! lease, with no pub/sub: [`HybridLimiter`](crate::HybridLimiter) re-derives its lease
//! sizing, horizon and fallback rate from the reply. A pure-mode call
//! ([`RedisLimiter`](crate::RedisLimiter)) sends the bucket's key alone, under the config as
//! its store read it within [`RedisStoreBuilder::config_refresh`](crate::RedisStoreBuilder::config_refresh)
//! (1 s by default; a change made through the same store at once): one key is never split
//! between two cluster nodes while a slot migrates, and Redis reads no config per decision.
//!
//! A change never resets the bucket. The config operations only write the config; the next
//! lease or release first brings the bucket up to its own time under the quota it was written
//! with, then rescales its fixed-point level to the new quota's units (whole tokens are kept
//! exactly; the fraction of a token is floored) and goes on under the new quota. So a fleet
//! admits at most `burst_old + rate_old × t1 + rate_new × t2` over a run, where `t1` runs up to
//! the first store call under the new config and `t2` after it (an active hybrid fleet makes
//! one per lease horizon, so `t1` ends within one horizon of the change; pure-mode callers
//! within the config refresh). A node holding a rate lease keeps its old rate until its own
//! next call, its renewal (at most half a ttl away): for rates `t1` runs to each rated
//! node's renewal.
//!
//! Tokens leased out (outstanding) stay counted across a change. If a new capacity is below
//! what is outstanding, nothing is taken back: those tokens were granted under the old quota
//! and may still be spent, but the bucket stays empty — no refill, no grant — until enough of
//! them are spent, returned or expired to get back under the new capacity. So
//! `level + outstanding ≤ max(old capacity, new capacity)` at every step, and
//! `level + outstanding ≤ new capacity` again once the old leases are gone.
//!
//! # Names without a stored quota
//!
//! What a limiter does for a name nobody configured is its builder's choice,
//! [`Unconfigured`]: use the builder's quota (the default, and the behaviour without central
//! configuration), treat the name as unlimited (admit without store calls and look again every
//! [`Unconfigured::RECHECK`] — a `NO_LIMIT` marker), or fail with
//! [`AcquireError::Unconfigured`](crate::AcquireError::Unconfigured).
//!
//! # One name, one quota
//!
//! Limiters are matched to buckets by name alone: every limiter built with one name (and one
//! algorithm and budget) on one Redis spends the same bucket, in any mode. Without a stored
//! config each call runs under its caller's quota, so limiters built with different quotas
//! share a bucket that answers none of them: one with a larger burst can take what the others
//! count on. The store cannot tell, and is not asked to: a bucket written under one quota and
//! read under another is exactly how a central change takes effect.
//!
//! A stored config is what makes one quota hold across a fleet: every call on the name runs
//! under it, whatever the builders say (their quota is then only the fallback for a name
//! whose config is deleted). Store it with [`ConfigStore::init_config`] when a fleet starts,
//! change it with [`ConfigStore::modify_config`].
//!
//! Within one process the builders check: a limiter built on a store instance (or a clone of
//! it) where a live limiter already spends the same bucket under a different quota logs a
//! `tracing` warning, once per bucket and quota (a warning, not an error: a reload may build
//! the new limiter before it drops the old one). Limiters in other processes, stores connected
//! separately (even to the same server), stores other than [`RedisStore`](crate::RedisStore)
//! and [`MemoryStore`](crate::MemoryStore), builders whose quota never applies
//! ([`Unconfigured::Unlimited`] or [`Unconfigured::Error`]) and concurrency limiters are not
//! compared: across processes only a shared config file, or the stored config, keeps one
//! quota.
//!
//! # Budgets
//!
//! [`Budget::Overall`] (the default) is one bucket per name for the whole fleet.
//! [`Budget::PerClient`] gives every client its own bucket with the name's quota (like
//! Redisson's `RRateLimiter` `PER_CLIENT`): key `<prefix>{name}:client:<id>`, in the same hash
//! tag, so the name's central config applies to every client's bucket. A *client* here is a
//! limiter instance — in practice a process — not a caller of your API: for a limit per user,
//! API key or address, use a keyed limiter ([`KeyedHybridLimiter`](crate::KeyedHybridLimiter)).

use std::future::Future;
use std::time::Duration;

use crate::error::StoreError;
use crate::quota::Quota;

/// Whose budget a limiter spends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Budget {
    /// One budget for the whole fleet (the default).
    #[default]
    Overall,
    /// One budget per client: each limiter instance (a hybrid limiter's node id, a
    /// [`RedisLimiter`](crate::RedisLimiter)'s client id) gets the full quota of its own. A
    /// client is a limiter instance (in practice a process, as in Redisson's `PER_CLIENT`),
    /// not a caller of your API: a limit per user, API key or address is a keyed limiter's.
    PerClient,
}

/// What a limiter does with a name that has no quota stored centrally.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Unconfigured {
    /// Use the builder's quota (the default).
    #[default]
    UseQuota,
    /// No limit: admit without store calls, checking for a config every
    /// [`Unconfigured::RECHECK`].
    Unlimited,
    /// Fail every request with
    /// [`AcquireError::Unconfigured`](crate::AcquireError::Unconfigured) (checking again every
    /// [`Unconfigured::RECHECK`]).
    Error,
}

impl Unconfigured {
    /// How often an unlimited or failing limiter looks for a config again.
    pub const RECHECK: Duration = Duration::from_secs(1);

    /// Whether the store should run unconfigured names under the caller's quota.
    pub(crate) fn falls_back(self) -> bool {
        self == Unconfigured::UseQuota
    }
}

/// A store that keeps quotas centrally: [`RedisStore`](crate::RedisStore) and its twin
/// [`MemoryStore`](crate::MemoryStore).
///
/// Quotas are valid by construction ([`Quota`] checks its values), and the script checks them
/// again, so a stored config is always usable; a config corrupted by hand makes every call on
/// the name fail with [`StoreError::Rejected`] (`invalid stored config`) and changes nothing.
pub trait ConfigStore: Send + Sync + 'static {
    /// Stores `quota` for `name` unless a config exists. Returns the config now in effect and
    /// whether it was written.
    fn init_config(
        &self,
        name: &str,
        quota: &Quota,
    ) -> impl Future<Output = Result<(Quota, bool), StoreError>> + Send;

    /// Stores `quota` for `name`, replacing any config; returns whether one was replaced.
    fn modify_config(
        &self,
        name: &str,
        quota: &Quota,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Removes `name`'s config; returns whether there was one.
    fn delete_config(&self, name: &str) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// `name`'s config, if any.
    fn get_config(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<Quota>, StoreError>> + Send;
}
