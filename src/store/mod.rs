//! Stores: where the shared token bucket lives.
//!
//! A [`LeaseStore`] runs the bucket step of [`crate::bucket`] atomically for one limiter name:
//! [`lease`](LeaseStore::lease) takes between `min` and `want` tokens (or none), and
//! [`release`](LeaseStore::release) gives unused tokens back without ever raising the bucket above
//! its capacity. Pure-Redis mode calls `lease` once per decision with `min = want = n`; hybrid
//! mode calls it once per batch.
//!
//! - [`RedisStore`]: the real thing; runs `lua/token_bucket.lua` with EVALSHA.
//! - [`MemoryStore`]: the same contract in process, over an injectable [`Clock`](crate::Clock),
//!   for tests and the simulator. A differential test holds it to the script.
//!
//! A request names its [`Algorithm`] (default the token bucket); the others run their own
//! scripts and twins ([`crate::algorithm`]) on keys of their own.

mod memory;
mod redis_store;

pub(crate) use redis_store::sentinel;

use std::future::Future;
use std::time::Duration;

pub use memory::MemoryStore;

pub use redis_store::{
    RedisStore, RedisStoreBuilder, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX,
    DEFAULT_RESPONSE_TIMEOUT, TOKEN_BUCKET_LUA,
};

use crate::algorithm::Algorithm;
use crate::bucket::{QuotaSource, StepReply};
use crate::error::StoreError;
use crate::quota::Quota;

/// A node's side of a lease (hybrid mode): who it is, what it holds, what it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeLease {
    /// The node's id (unique per limiter instance).
    pub id: u64,
    /// Tokens it still holds unspent.
    pub held: u64,
    /// Its demand estimate, millitokens per second.
    pub demand_mtps: u64,
    /// How long one lease should last; sets the size of fair-share grants.
    pub horizon: Duration,
    /// How long the lease is valid; the node must stop spending its tokens before then.
    pub ttl: Duration,
}

/// A node's side of a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeRelease {
    /// The node's id.
    pub id: u64,
    /// Strictly increasing per node: a repeated sequence number is ignored.
    pub seq: u64,
    /// Whether the node stops leasing (its record is removed).
    pub leaving: bool,
}

/// A lease request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseRequest {
    /// Most tokens to take.
    pub want: u64,
    /// Fewest acceptable.
    pub min: u64,
    /// The leasing node, or `None` for an anonymous (pure-mode) call.
    pub node: Option<NodeLease>,
    /// The budget: `None` for the name's fleet-wide bucket, `Some(client)` for that client's
    /// own bucket ([`Budget::PerClient`](crate::Budget::PerClient)).
    pub client: Option<u64>,
    /// Without a stored config for the name, run under the caller's quota (`true`, the
    /// default) or do nothing and answer [`QuotaSource::Absent`].
    pub fallback_to_caller: bool,
    /// The algorithm (default [`Algorithm::TokenBucket`]); each has keys of its own.
    pub algorithm: Algorithm,
}

impl LeaseRequest {
    /// Exactly `n` tokens or none (pure mode).
    pub fn exact(n: u64) -> Self {
        LeaseRequest {
            want: n,
            min: n,
            node: None,
            client: None,
            fallback_to_caller: true,
            algorithm: Algorithm::TokenBucket,
        }
    }

    /// Between `min` and `want` tokens, anonymously.
    pub fn new(want: u64, min: u64) -> Self {
        LeaseRequest {
            want,
            min,
            node: None,
            client: None,
            fallback_to_caller: true,
            algorithm: Algorithm::TokenBucket,
        }
    }

    /// The same request made by `node`.
    pub fn by(mut self, node: NodeLease) -> Self {
        self.node = Some(node);
        self
    }

    /// The same request on `client`'s own budget.
    pub fn for_client(mut self, client: Option<u64>) -> Self {
        self.client = client;
        self
    }

    /// The same request, doing nothing if the name has no stored config.
    pub fn configured_only(mut self, only: bool) -> Self {
        self.fallback_to_caller = !only;
        self
    }

    /// The same request under `algorithm`.
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }
}

/// A release request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleaseRequest {
    /// Tokens given back.
    pub tokens: u64,
    /// The releasing node, or `None`.
    pub node: Option<NodeRelease>,
    /// The budget, as in [`LeaseRequest::client`].
    pub client: Option<u64>,
    /// The algorithm, as in [`LeaseRequest::algorithm`].
    pub algorithm: Algorithm,
    /// Where the lease that got these tokens was counted ([`LeaseReply::at`]): the fixed and
    /// sliding windows take tokens back only there, so a late release never raises a later
    /// window's budget. Required by them for a release of more than 0 tokens.
    pub leased_at: Option<Duration>,
}

impl ReleaseRequest {
    /// Gives `tokens` back anonymously.
    pub fn new(tokens: u64) -> Self {
        ReleaseRequest {
            tokens,
            node: None,
            client: None,
            algorithm: Algorithm::TokenBucket,
            leased_at: None,
        }
    }

    /// The same release to `client`'s own budget.
    pub fn for_client(mut self, client: Option<u64>) -> Self {
        self.client = client;
        self
    }

    /// The same release made by `node`.
    pub fn by(mut self, node: NodeRelease) -> Self {
        self.node = Some(node);
        self
    }

    /// The same release under `algorithm`.
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// The same release of tokens leased at `at` ([`LeaseReply::at`]).
    pub fn leased_at(mut self, at: Option<Duration>) -> Self {
        self.leased_at = at;
        self
    }
}

/// The reply to a lease or release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseReply {
    /// Tokens granted (0 for a release, and for a lease that could not reach its minimum).
    pub granted: u64,
    /// Whole tokens left in the shared bucket.
    pub remaining: u64,
    /// How long until a lease like this one could succeed (zero if it could now). Sent with
    /// grants too: a node leasing on terms uses it to pace itself.
    pub retry_after: Duration,
    /// How long until the shared bucket stops refilling.
    pub reset_after: Duration,
    /// The node's fair share of the rate, millitokens per second (0 for anonymous calls).
    pub share_mtps: u64,
    /// The quota the call ran under: the name's stored config, or the caller's.
    pub quota: Quota,
    /// Where that quota came from ([`QuotaSource::Absent`]: nothing was done).
    pub source: QuotaSource,
    /// Where a grant was counted, on the store's clock (`None` from the token bucket): the
    /// fixed window's start, the sliding window's log time, the leaky bucket's `now`. Pass it
    /// back with a release ([`ReleaseRequest::leased_at`]).
    pub at: Option<Duration>,
}

impl LeaseReply {
    /// Refuses a reply that grants more than `request` wanted: a store (or a wrapper around
    /// one) that did would have limiters count tokens the bucket never had.
    pub(crate) fn within(self, request: &LeaseRequest) -> Result<Self, StoreError> {
        if self.granted > request.want {
            return Err(StoreError::BadReply(format!(
                "granted {} of a lease that wanted at most {}",
                self.granted, request.want
            )));
        }
        Ok(self)
    }
}

impl From<StepReply> for LeaseReply {
    fn from(r: StepReply) -> Self {
        LeaseReply {
            granted: r.granted,
            remaining: r.remaining,
            retry_after: Duration::from_micros(r.retry_after_us),
            reset_after: Duration::from_micros(r.reset_after_us),
            share_mtps: r.share_mtps,
            quota: r.quota,
            source: r.source,
            at: None,
        }
    }
}

/// The bucket name of a budget: the name itself, or the name and a client id.
pub(crate) fn budget_suffix(client: Option<u64>) -> String {
    client.map_or_else(String::new, |c| format!(":client:{c:016x}"))
}

/// Formats a node id as stored (16 hex digits).
pub(crate) fn node_key(id: u64) -> String {
    format!("{id:016x}")
}

/// Microseconds of a duration, saturating.
pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A shared token bucket (or another [`Algorithm`]'s budget), addressed by limiter name.
///
/// Implementations must be atomic per name: concurrent calls behave as if run one at a time.
pub trait LeaseStore: Send + Sync + 'static {
    /// Takes between `min` and `want` tokens from `name`'s bucket, or none.
    ///
    /// Requires `1 ≤ min ≤ want` and `min ≤ quota.burst()`; the store rejects anything else
    /// with [`StoreError::Rejected`].
    fn lease(
        &self,
        name: &str,
        quota: &Quota,
        req: &LeaseRequest,
    ) -> impl Future<Output = Result<LeaseReply, StoreError>> + Send;

    /// Returns unused tokens to `name`'s bucket, capped at capacity.
    fn release(
        &self,
        name: &str,
        quota: &Quota,
        req: &ReleaseRequest,
    ) -> impl Future<Output = Result<LeaseReply, StoreError>> + Send;
}
