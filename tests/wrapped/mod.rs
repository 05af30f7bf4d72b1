//! A test store: the real [`MemoryStore`] on tokio's paused clock, with a network delay, an
//! on/off failure switch, and a count of overlapping calls; and [`Never`], a store whose
//! replies say the next token comes in `Duration::MAX`. Shared by the test binaries that
//! `mod wrapped;`.

// Each test binary uses part of it.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ratelease::{
    LeaseReply, LeaseRequest, LeaseStore, MemoryStore, Quota, ReleaseRequest, StoreError,
    TokioClock,
};

#[derive(Clone, Debug)]
pub struct Wrapped {
    pub inner: MemoryStore,
    pub delay: Duration,
    /// While true, every call fails with a timeout.
    pub failing: Arc<AtomicBool>,
    /// While true, every call is refused by the ACL (an error that is no outage).
    pub refusing: Arc<AtomicBool>,
    pub in_flight: Arc<AtomicU64>,
    /// Most calls seen in flight at once.
    pub max_in_flight: Arc<AtomicU64>,
    /// Releases of nodes leaving (their record removed): a lease given back, not renewed.
    pub leaving: Arc<AtomicU64>,
    /// Microseconds the next call waits on its way to the store, beyond `delay` (once).
    pub stall_us: Arc<AtomicU64>,
}

impl Wrapped {
    pub fn new(delay: Duration) -> Self {
        Wrapped {
            inner: MemoryStore::with_clock(TokioClock::new()),
            delay,
            failing: Arc::default(),
            refusing: Arc::default(),
            in_flight: Arc::default(),
            max_in_flight: Arc::default(),
            leaving: Arc::default(),
            stall_us: Arc::default(),
        }
    }

    async fn call<F>(&self, f: F) -> Result<LeaseReply, StoreError>
    where
        F: std::future::Future<Output = Result<LeaseReply, StoreError>>,
    {
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(self.delay / 2).await;
        let stall = self.stall_us.swap(0, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_micros(stall)).await;
        let result = if self.failing.load(Ordering::SeqCst) {
            Err(StoreError::Timeout(self.delay))
        } else if self.refusing.load(Ordering::SeqCst) {
            Err(StoreError::NoPermission(
                "NOPERM this user has no permissions".into(),
            ))
        } else {
            f.await
        };
        tokio::time::sleep(self.delay / 2).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        result
    }
}

impl LeaseStore for Wrapped {
    async fn lease(
        &self,
        name: &str,
        quota: &Quota,
        req: &LeaseRequest,
    ) -> Result<LeaseReply, StoreError> {
        self.call(self.inner.lease(name, quota, req)).await
    }

    async fn release(
        &self,
        name: &str,
        quota: &Quota,
        req: &ReleaseRequest,
    ) -> Result<LeaseReply, StoreError> {
        if req.node.is_some_and(|n| n.leaving) {
            self.leaving.fetch_add(1, Ordering::SeqCst);
        }
        self.call(self.inner.release(name, quota, req)).await
    }
}

impl ratelease::ConcurrencyStore for Wrapped {
    async fn concurrency(
        &self,
        name: &str,
        op: &ratelease::concurrency::holders::Op<'_>,
    ) -> Result<ratelease::concurrency::holders::Reply, StoreError> {
        tokio::time::sleep(self.delay).await;
        self.inner.concurrency(name, op).await
    }
}

/// A store whose every reply grants `granted` tokens (at most what is asked; 0 is a refusal)
/// and says the next will come, or the window end, in `Duration::MAX`: a store outside this
/// crate may say "never" so.
#[derive(Clone)]
pub struct Never {
    pub granted: u64,
}

impl LeaseStore for Never {
    async fn lease(
        &self,
        _name: &str,
        quota: &Quota,
        req: &LeaseRequest,
    ) -> Result<LeaseReply, StoreError> {
        let granted = self.granted.min(req.want);
        Ok(LeaseReply {
            granted: if granted >= req.min { granted } else { 0 },
            retry_after: Duration::MAX,
            reset_after: Duration::MAX,
            at: Some(Duration::ZERO),
            ..LeaseReply::empty(*quota, ratelease::QuotaSource::Caller)
        })
    }

    async fn release(
        &self,
        _name: &str,
        quota: &Quota,
        _req: &ReleaseRequest,
    ) -> Result<LeaseReply, StoreError> {
        Ok(LeaseReply::empty(*quota, ratelease::QuotaSource::Caller))
    }
}
