//! Stores: where the shared token bucket lives.
//!
//! A [`LeaseStore`] runs the bucket step of [`crate::algorithm::token_bucket`] atomically for one limiter name:
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
//!
//! `names.rs` is the process's registry of which limiter spends which bucket under which
//! quota: builders register, and a second quota on one bucket is a warning.

mod memory;
pub(crate) mod names;
mod redis_store;

use std::future::Future;

pub use memory::MemoryStore;

pub use redis_store::{
    RedisStore, RedisStoreBuilder, DEFAULT_CONFIG_REFRESH, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PREFIX,
    DEFAULT_RESPONSE_TIMEOUT, LEASE_TIMEOUT_FACTOR,
};

use crate::error::StoreError;
pub use crate::protocol::{LeaseReply, LeaseRequest, NodeLease, NodeRelease, ReleaseRequest};
use crate::quota::Quota;

/// A store call made by a limiter's background task: one that panics is a failed call
/// ([`StoreError::BadReply`]: whether it changed the store is unknown, as for any failed
/// call), so the task lives on — its failure policy answers, and its bookkeeping of calls in
/// flight stays whole — where the panic would have ended it, and with it every lease.
pub(crate) async fn unwinding<T>(
    call: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    use futures_util::FutureExt;

    std::panic::AssertUnwindSafe(call)
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(StoreError::BadReply(format!("the store panicked: {what}")))
        })
}

/// A shared token bucket (or another [`Algorithm`](crate::Algorithm)'s budget), addressed by limiter name.
///
/// Implementations must be atomic per name: concurrent calls behave as if run one at a time.
/// A call that panics is a failed call to the limiters' background tasks
/// ([`StoreError::BadReply`]), and a panic to the caller of a decision made on its own task
/// (a pure limiter's, or a hybrid one's per-request decision).
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
