//! What a limiter and a store say to each other: a lease or release request (with the node's
//! side of the lease protocol when it leases on terms) and the reply, plus how names and node
//! ids are written in keys. Plain data, shared by every store ([`crate::store`]) and every
//! algorithm's twin ([`crate::algorithm`]), so neither needs the other.

use std::time::Duration;

use crate::algorithm::token_bucket::{QuotaSource, StepReply};
use crate::algorithm::{Algorithm, Op, Reply};
use crate::config::Unconfigured;
use crate::error::StoreError;
use crate::quota::Quota;
use crate::time::micros;

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
    /// The rate it asks to hold until the lease expires or it asks again (a *rate lease*),
    /// millitokens per second; 0 for none. The store grants at most the node's share and the
    /// rate no other node holds ([`LeaseReply::rate_mtps`]); the node adds what the rate earns
    /// to its local bucket itself, between calls.
    pub rate_mtps: u64,
    /// The sequence number of the last release this node has sent ([`NodeRelease::seq`]), 0
    /// if none. Sending a release, the node has already taken its tokens out of what it holds,
    /// so this lease's `held` reports them gone: the store keeps the larger of this and the
    /// node's last applied seq, and ignores a release that runs after this lease with a seq
    /// not above it (late or retried, it would otherwise return tokens already counted as
    /// spent). 0 leaves the node's seq as it was, as a text-protocol lease without it does.
    pub release_seq: u64,
}

/// A node's side of a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeRelease {
    /// The node's id.
    pub id: u64,
    /// Strictly increasing per node, from 1: a repeated sequence number is ignored, and so is
    /// one at or below the [`NodeLease::release_seq`] of a lease the store ran before it.
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

    /// The same request with what a limiter sends on every call: its client budget, whether
    /// an unconfigured name falls back to the caller's quota, and its algorithm.
    pub(crate) fn with_limiter_settings(
        self,
        client: Option<u64>,
        unconfigured: Unconfigured,
        algorithm: Algorithm,
    ) -> Self {
        self.for_client(client)
            .configured_only(!unconfigured.falls_back())
            .algorithm(algorithm)
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
    /// The rate the node now holds (a rate lease, see [`NodeLease::rate_mtps`]), millitokens
    /// per second (0 if none, and for anonymous calls).
    pub rate_mtps: u64,
    /// Claimants of the bucket after the call, for a node's lease (0 for anonymous calls and
    /// releases, and from a store that does not count them): the nodes holding a lease, and
    /// the anonymous callers beside them (pure-mode clients, nodes deciding per request) as
    /// one more while they ask. A policy may size leases by it:
    /// [`AdaptiveLease`](crate::AdaptiveLease) shortens the largest shares' horizons in a
    /// large fleet, and a rate lease's room in the burst is at most the burst over it.
    pub leasers: u64,
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
    /// A reply that grants nothing and says nothing (every count 0, no wait) under `quota`,
    /// from `source`: what a store answers when it did nothing ([`QuotaSource::Absent`]), and
    /// the rest of a reply built from a few fields (`LeaseReply { granted, ..empty }`).
    pub fn empty(quota: Quota, source: QuotaSource) -> Self {
        LeaseReply {
            granted: 0,
            remaining: 0,
            retry_after: Duration::ZERO,
            reset_after: Duration::ZERO,
            share_mtps: 0,
            rate_mtps: 0,
            leasers: 0,
            quota,
            source,
            at: None,
        }
    }

    /// Refuses a reply that grants more than `request` wanted, tokens or rate, or some tokens
    /// but fewer than its minimum: a store (or a wrapper around one) that did would have
    /// limiters count tokens the bucket never had, or hand a waiter fewer than it asked for.
    pub(crate) fn within(self, request: &LeaseRequest) -> Result<Self, StoreError> {
        if self.granted > request.want {
            return Err(StoreError::BadReply(format!(
                "granted {} of a lease that wanted at most {}",
                self.granted, request.want
            )));
        }
        if self.granted > 0 && self.granted < request.min {
            return Err(StoreError::BadReply(format!(
                "granted {} of a lease that needed at least {}",
                self.granted, request.min
            )));
        }
        let asked = request.node.map_or(0, |n| n.rate_mtps);
        if self.rate_mtps > asked {
            return Err(StoreError::BadReply(format!(
                "granted a rate of {} mtps to a lease that asked for at most {asked}",
                self.rate_mtps
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
            rate_mtps: r.rate_mtps,
            leasers: r.leasers,
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

/// The key of `algorithm`'s state for the budget of `client` (or the fleet-wide one) of the
/// name whose bucket key is `bucket`: the algorithm's suffix, then the client's.
pub(crate) fn algorithm_key(bucket: &str, algorithm: Algorithm, client: Option<u64>) -> String {
    format!(
        "{bucket}{}{}",
        algorithm.key_suffix(),
        budget_suffix(client)
    )
}

/// Formats a node id as stored (16 hex digits).
pub(crate) fn node_key(id: u64) -> String {
    format!("{id:016x}")
}

impl Reply {
    /// The reply as a store answers it: under the caller's quota.
    pub(crate) fn into_lease_reply(self, quota: &Quota) -> LeaseReply {
        LeaseReply {
            granted: self.granted,
            remaining: self.remaining,
            retry_after: Duration::from_micros(self.retry_after_us),
            reset_after: Duration::from_micros(self.reset_after_us),
            share_mtps: 0,
            rate_mtps: 0,
            leasers: 0,
            quota: *quota,
            source: crate::QuotaSource::Caller,
            at: Some(Duration::from_micros(self.at_us)),
        }
    }
}

/// A rejected request, as both stores report it.
fn rejected(what: &str) -> StoreError {
    StoreError::Rejected(format!("invalid argument {what}"))
}

/// The operation of a lease request under a new algorithm: anonymous, under the caller's
/// quota (lease terms and central configuration are the token bucket's).
pub(crate) fn lease_op(req: &LeaseRequest) -> Result<Op, StoreError> {
    if req.node.is_some() {
        return Err(rejected("node: lease terms are for the token bucket only"));
    }
    if !req.fallback_to_caller {
        return Err(rejected(
            "unconfigured: central configuration is for the token bucket only",
        ));
    }
    Ok(Op::Lease {
        want: req.want,
        min: req.min,
    })
}

/// The operation of a release request under a new algorithm: a peek for 0 tokens.
pub(crate) fn release_op(req: &ReleaseRequest) -> Result<Op, StoreError> {
    if req.node.is_some() {
        return Err(rejected("node: lease terms are for the token bucket only"));
    }
    Ok(match req.tokens {
        0 => Op::Peek,
        tokens => Op::Release {
            tokens,
            at: req.leased_at.map(micros),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_granting_more_than_the_lease_asked_is_refused() {
        let q = Quota::per_second(10).unwrap();
        let node = NodeLease {
            id: 1,
            held: 0,
            demand_mtps: 1_000,
            horizon: Duration::from_millis(100),
            ttl: Duration::from_secs(1),
            rate_mtps: 500,
            release_seq: 0,
        };
        let asking = LeaseRequest::new(5, 1).by(node);
        let anonymous = LeaseRequest::new(5, 1);
        let reply = |granted, rate_mtps| LeaseReply {
            granted,
            rate_mtps,
            ..LeaseReply::empty(q, QuotaSource::Caller)
        };
        assert!(reply(5, 500).within(&asking).is_ok());
        for (r, req) in [
            (reply(6, 0), &asking),
            (reply(1, 501), &asking),
            (reply(1, 1), &anonymous),
        ] {
            assert!(
                matches!(r.within(req), Err(StoreError::BadReply(_))),
                "{r:?}"
            );
        }
    }
}
