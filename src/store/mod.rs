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

mod memory;
mod redis_store;

use std::future::Future;
use std::time::Duration;

pub use memory::MemoryStore;
pub use redis_store::{
    RedisStore, RedisStoreBuilder, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX,
    DEFAULT_RESPONSE_TIMEOUT, TOKEN_BUCKET_LUA,
};

use crate::bucket::StepReply;
use crate::error::StoreError;
use crate::quota::Quota;

/// The reply to a lease or release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseReply {
    /// Tokens granted (0 for a release, and for a lease that could not reach `min`).
    pub granted: u64,
    /// Whole tokens left in the shared bucket.
    pub remaining: u64,
    /// How long until `min` tokens are available (zero if they are now).
    pub retry_after: Duration,
    /// How long until the shared bucket is full again.
    pub reset_after: Duration,
}

impl From<StepReply> for LeaseReply {
    fn from(r: StepReply) -> Self {
        LeaseReply {
            granted: r.granted,
            remaining: r.remaining,
            retry_after: Duration::from_micros(r.retry_after_us),
            reset_after: Duration::from_micros(r.reset_after_us),
        }
    }
}

/// A shared token bucket, addressed by limiter name.
///
/// Implementations must be atomic per name: concurrent calls behave as if run one at a time.
pub trait LeaseStore: Send + Sync + 'static {
    /// Takes up to `want` tokens from `name`'s bucket if at least `min` are there.
    ///
    /// Requires `1 ≤ min ≤ want` and `min ≤ quota.burst()`; the store rejects anything else
    /// with [`StoreError::Rejected`].
    fn lease(
        &self,
        name: &str,
        quota: &Quota,
        want: u64,
        min: u64,
    ) -> impl Future<Output = Result<LeaseReply, StoreError>> + Send;

    /// Returns `tokens` unused tokens to `name`'s bucket, capped at capacity.
    fn release(
        &self,
        name: &str,
        quota: &Quota,
        tokens: u64,
    ) -> impl Future<Output = Result<LeaseReply, StoreError>> + Send;
}
