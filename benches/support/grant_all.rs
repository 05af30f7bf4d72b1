//! A store for keyed benchmarks that grants every lease in full and keeps nothing: only the
//! limiter's own map and worker are measured (with Redis the buckets live in Redis).

use ratelease::{
    LeaseReply, LeaseRequest, LeaseStore, Quota, QuotaSource, ReleaseRequest, StoreError,
};

/// Grants every lease in full and stores nothing: the limiter's own memory is all there is.
#[derive(Clone, Copy)]
pub struct GrantAll;

impl LeaseStore for GrantAll {
    async fn lease(
        &self,
        _name: &str,
        quota: &Quota,
        req: &LeaseRequest,
    ) -> Result<LeaseReply, StoreError> {
        Ok(reply(quota, req.want))
    }

    async fn release(
        &self,
        _name: &str,
        quota: &Quota,
        _req: &ReleaseRequest,
    ) -> Result<LeaseReply, StoreError> {
        Ok(reply(quota, 0))
    }
}

fn reply(quota: &Quota, granted: u64) -> LeaseReply {
    LeaseReply {
        granted,
        remaining: quota.burst(),
        ..LeaseReply::empty(*quota, QuotaSource::Caller)
    }
}
