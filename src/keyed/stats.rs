//! A keyed hybrid limiter's counters, as its users read them.

/// Counters of a keyed limiter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyedStats {
    /// Keys with local state now.
    pub live_keys: u64,
    /// Keys created so far.
    pub keys_created: u64,
    /// Keys evicted after `idle_ttl` without use.
    pub evicted_idle: u64,
    /// Keys evicted to make room for new ones at the cap.
    pub evicted_at_cap: u64,
    /// New keys turned away (for a moment) because the cap was reached.
    pub refused_at_cap: u64,
    /// New keys turned away (for a moment) because the queue of first leases was full.
    pub refused_busy: u64,
    /// Lease calls made to the store (including failed ones).
    pub leases: u64,
    /// Tokens granted by those calls.
    pub tokens_leased: u64,
    /// Lease calls answered "not enough tokens".
    pub over_limit: u64,
    /// Release calls made to the store (idle tokens, evictions, shutdown).
    pub releases: u64,
    /// Tokens given back.
    pub tokens_released: u64,
    /// Tokens that could not be given back (the release failed): lost to the fleet until
    /// the key's bucket refills.
    pub tokens_lost: u64,
    /// Store calls that failed.
    pub store_errors: u64,
    /// Tokens denied to callers.
    pub tokens_denied: u64,
    /// Tokens admitted by the failure policy while the store was failing.
    pub tokens_admitted_degraded: u64,
    /// Whether the circuit is open: the last lease failed and the failure policy is in force.
    pub circuit_open: bool,
}
