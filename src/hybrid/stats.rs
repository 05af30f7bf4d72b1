//! A hybrid limiter's counters, as its users read them.

/// Counters of one limiter's store traffic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct HybridStats {
    /// Lease calls made to the store (including failed ones).
    pub leases: u64,
    /// Tokens granted by those calls.
    pub tokens_leased: u64,
    /// Lease calls answered "not enough tokens".
    pub over_limit: u64,
    /// Release calls made to the store.
    pub releases: u64,
    /// Tokens given back.
    pub tokens_released: u64,
    /// Store calls that failed.
    pub store_errors: u64,
    /// Tokens dropped unspent: a release of them failed (at their lease's expiry, when idle,
    /// or on shutdown; a release given up on may still have run in the store, which then has
    /// them back), their fixed window ended, or they were above a rate lease's cap.
    pub tokens_expired: u64,
    /// Tokens denied to callers.
    pub tokens_denied: u64,
    /// Tokens admitted by the failure policy while the store was failing.
    pub tokens_admitted_degraded: u64,
    /// Whether the circuit is open: the last lease failed and the failure policy is in force.
    pub circuit_open: bool,
    /// Measured demand, millitokens per second (admitted and denied).
    pub demand_mtps: u64,
    /// Fair share last reported by the store, millitokens per second (0 if none).
    pub share_mtps: u64,
    /// The rate this node holds (a rate lease), millitokens per second (0 if none).
    pub rate_mtps: u64,
    /// Tokens a rate lease added to the local bucket (counted in `tokens_leased` too).
    pub tokens_dripped: u64,
    /// Tokens in the local bucket now.
    pub local_tokens: u64,
    /// Decisions made in the store for one request each, while leasing bought nothing (see
    /// [`AdaptiveLease::per_request_below`](crate::AdaptiveLease::per_request_below)),
    /// including failed ones.
    pub decisions: u64,
    /// Tokens those decisions admitted.
    pub tokens_decided: u64,
    /// Whether a miss in `acquire_now` is a decision in the store now.
    pub per_request: bool,
}

impl HybridStats {
    /// Every call made to the store.
    pub fn store_calls(&self) -> u64 {
        self.leases + self.releases + self.decisions
    }
}
