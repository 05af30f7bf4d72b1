//! A concurrency limiter's counters, as its users read them.

/// Counters of one limiter's store traffic and local state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConcurrencyStats {
    /// Acquire calls made to the store (pure: one per attempt; hybrid: one per lease).
    pub acquires: u64,
    /// Slots those calls were granted.
    pub granted: u64,
    /// Acquire calls answered "the fleet is full".
    pub full: u64,
    /// Release calls made to the store.
    pub releases: u64,
    /// Renewals (syncs) made to the store.
    pub syncs: u64,
    /// Store calls that failed.
    pub store_errors: u64,
    /// Permits admitted by the failure policy while the store was failing.
    pub degraded: u64,
    /// Whether the circuit is open: the last store call failed.
    pub circuit_open: bool,
    /// Slots in this process's live permits.
    pub in_use: u64,
    /// Hybrid: leased slots waiting in the local pool.
    pub pooled: u64,
}

impl ConcurrencyStats {
    /// Every call made to the store.
    pub fn store_calls(&self) -> u64 {
        self.acquires + self.releases + self.syncs
    }
}
