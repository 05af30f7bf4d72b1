//! [`MemoryStore`]: the shared bucket in process memory.
//!
//! It runs the same [`token_bucket::step`] the Lua script mirrors, one key at a time under the
//! key's `dashmap` shard lock, reading time from an injectable [`Clock`]. Like the script, a
//! step that rejects its arguments changes nothing. Expiry is modelled
//! like Redis's TTL (an expired entry reads as absent, that is, full), so replies match the
//! script's even for keys that went idle. Futures it returns are ready at once.
//!
//! Central configs ([`ConfigStore`]) live in a map of their own, never expire, and are read by
//! every step as the script reads its config key. Per-client budgets are buckets keyed by
//! name and client, as the script's `…:client:<id>` keys.
//!
//! The other algorithms ([`crate::algorithm`]) run their twins on a map of their own
//! (`memory/algorithms.rs`).

mod algorithms;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dashmap::DashMap;

use super::LeaseStore;
use crate::algorithm::holders::Holders;
use crate::algorithm::token_bucket::{
    self, Effective, NodeLeaseArgs, NodeReleaseArgs, Op, QuotaSource, Stored,
};
use crate::algorithm::Algorithm;
use crate::clock::{Clock, MonotonicClock};
use crate::config::ConfigStore;
use crate::error::StoreError;
use crate::protocol;
use crate::protocol::{budget_suffix, node_key, LeaseReply, LeaseRequest, ReleaseRequest};
use crate::quota::Quota;
use crate::time::micros;

/// How many writes between sweeps of expired entries.
const SWEEP_EVERY: u64 = 4096;

/// An in-process [`LeaseStore`] with the same contract as the Redis script.
///
/// Clones share the same buckets.
///
/// ```
/// # tokio_test_block_on(async {
/// use ratelease::{FakeClock, LeaseRequest, LeaseStore, MemoryStore, Quota};
///
/// let clock = FakeClock::new();
/// let store = MemoryStore::with_clock(clock.clone());
/// let quota = Quota::per_second(10)?;
/// let reply = store.lease("api", &quota, &LeaseRequest::new(4, 1)).await?;
/// assert_eq!((reply.granted, reply.remaining), (4, 6));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    buckets: DashMap<String, Entry>,
    configs: DashMap<String, Quota>,
    algorithms: DashMap<String, algorithms::Entry>,
    /// Concurrency limiters' holder records, by name ([`crate::concurrency`]).
    holders: DashMap<String, Holders>,
    clock: Box<dyn Clock>,
    calls: AtomicU64,
}

struct Entry {
    stored: Stored,
    expires_at_us: u64,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("buckets", &self.inner.buckets.len())
            .field("calls", &self.calls())
            .finish()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An identity its clones share and no other live store has: the address of the shared
    /// state (see [`names`](super::names)).
    pub(crate) fn instance_id(&self) -> usize {
        Arc::as_ptr(&self.inner) as usize
    }

    /// A store on real monotonic time.
    pub fn new() -> Self {
        Self::with_clock(MonotonicClock::new())
    }

    /// A store on the given clock.
    pub fn with_clock(clock: impl Clock) -> Self {
        MemoryStore {
            inner: Arc::new(Inner {
                buckets: DashMap::new(),
                configs: DashMap::new(),
                algorithms: DashMap::new(),
                holders: DashMap::new(),
                clock: Box::new(clock),
                calls: AtomicU64::new(0),
            }),
        }
    }

    /// Store calls served so far (every script call: lease, release, config, concurrency), as
    /// Redis would count them.
    pub fn calls(&self) -> u64 {
        self.inner.calls.load(Ordering::Relaxed)
    }

    /// Buckets (and other algorithms' states) currently stored (full buckets are not stored).
    pub fn len(&self) -> usize {
        self.inner.buckets.len() + self.inner.algorithms.len()
    }

    /// True when no bucket is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every stored bucket and config, as `FLUSHALL` would.
    pub fn clear(&self) {
        self.inner.buckets.clear();
        self.inner.configs.clear();
        self.inner.algorithms.clear();
        self.inner.holders.clear();
    }

    /// The concurrency limiters' holder records, by name.
    pub(crate) fn holders(&self) -> &DashMap<String, Holders> {
        &self.inner.holders
    }

    /// Counts one store call; returns the count so far.
    pub(crate) fn count_call(&self) -> u64 {
        self.inner.calls.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn now_us(&self) -> u64 {
        micros(self.inner.clock.now())
    }

    /// One atomic step on `name`'s fleet-wide bucket, under the caller's quota.
    #[cfg(test)]
    fn run(&self, name: &str, quota: &Quota, op: Op<'_>) -> Result<LeaseReply, StoreError> {
        self.run_on(name, None, quota, true, op)
    }

    /// One atomic step on `name`'s bucket for `client` (or its fleet-wide one), under the
    /// name's stored config, else the caller's quota if `fallback`.
    fn run_on(
        &self,
        name: &str,
        client: Option<u64>,
        quota: &Quota,
        fallback: bool,
        op: Op<'_>,
    ) -> Result<LeaseReply, StoreError> {
        let effective = Effective {
            stored: self.inner.configs.get(name).map(|q| *q),
            fallback_to_caller: fallback,
        };
        // Length-prefixed: no name can collide with another name's client bucket.
        let key = format!("{}:{name}{}", name.len(), budget_suffix(client));
        let op_name = match op {
            Op::Lease { .. } => "lease",
            Op::Release { .. } => "release",
        };
        // Synchronous: the span is entered for the step and closed before returning.
        let _span =
            tracing::debug_span!("store_call", store = "memory", limiter = name, op = op_name)
                .entered();
        let now = self.now_us();
        let calls = self.inner.calls.fetch_add(1, Ordering::Relaxed) + 1;
        if calls.is_multiple_of(SWEEP_EVERY) {
            self.inner.buckets.retain(|_, e| e.expires_at_us > now);
        }
        let reject = |e: token_bucket::InvalidArgument| StoreError::Rejected(e.to_string());
        let mut slot = self
            .inner
            .buckets
            .entry(key.clone())
            .or_insert_with(|| Entry {
                stored: Stored::default(),
                expires_at_us: 0,
            });
        if slot.expires_at_us <= now {
            slot.stored = Stored::default();
        }
        // `step` checks its arguments before it changes anything.
        let result = token_bucket::step_with(&mut slot.stored, quota, effective, op, now);
        let empty = slot.stored.bucket.is_none() && slot.stored.leasers.is_empty();
        let (reply, keep_ms) = match result {
            // Nothing was read or written: leave the entry's expiry alone.
            Ok((reply, _)) if reply.source == QuotaSource::Absent => {
                drop(slot);
                if empty {
                    self.inner.buckets.remove(&key);
                }
                return Ok(reply.into());
            }
            Ok(ok) => ok,
            Err(e) => {
                drop(slot);
                if empty {
                    self.inner.buckets.remove(&key);
                }
                return Err(reject(e));
            }
        };
        match keep_ms {
            Some(ms) => slot.expires_at_us = now.saturating_add(ms.saturating_mul(1_000)),
            None => {
                drop(slot);
                self.inner.buckets.remove(&key);
            }
        }
        Ok(reply.into())
    }
}

impl LeaseStore for MemoryStore {
    async fn lease(
        &self,
        name: &str,
        quota: &Quota,
        req: &LeaseRequest,
    ) -> Result<LeaseReply, StoreError> {
        if req.algorithm != Algorithm::TokenBucket {
            let op = protocol::lease_op(req)?;
            return self.run_algorithm(name, req.client, quota, req.algorithm, op);
        }
        let id = req.node.map(|n| node_key(n.id));
        let node = req.node.zip(id.as_deref()).map(|(n, id)| NodeLeaseArgs {
            id,
            held: n.held,
            demand_mtps: n.demand_mtps,
            horizon_us: micros(n.horizon),
            ttl_us: micros(n.ttl),
            rate_mtps: n.rate_mtps,
            release_seq: n.release_seq,
        });
        self.run_on(
            name,
            req.client,
            quota,
            req.fallback_to_caller,
            Op::Lease {
                want: req.want,
                min: req.min,
                node,
            },
        )
    }

    async fn release(
        &self,
        name: &str,
        quota: &Quota,
        req: &ReleaseRequest,
    ) -> Result<LeaseReply, StoreError> {
        if req.algorithm != Algorithm::TokenBucket {
            let op = protocol::release_op(req)?;
            return self.run_algorithm(name, req.client, quota, req.algorithm, op);
        }
        let id = req.node.map(|n| node_key(n.id));
        let node = req.node.zip(id.as_deref()).map(|(n, id)| NodeReleaseArgs {
            id,
            seq: n.seq,
            leaving: n.leaving,
        });
        self.run_on(
            name,
            req.client,
            quota,
            true,
            Op::Release {
                tokens: req.tokens,
                node,
            },
        )
    }
}

impl ConfigStore for MemoryStore {
    async fn init_config(&self, name: &str, quota: &Quota) -> Result<(Quota, bool), StoreError> {
        self.inner.calls.fetch_add(1, Ordering::Relaxed);
        let mut written = false;
        let q = *self
            .inner
            .configs
            .entry(name.to_owned())
            .or_insert_with(|| {
                written = true;
                *quota
            });
        Ok((q, written))
    }

    async fn modify_config(&self, name: &str, quota: &Quota) -> Result<bool, StoreError> {
        self.inner.calls.fetch_add(1, Ordering::Relaxed);
        Ok(self.inner.configs.insert(name.to_owned(), *quota).is_some())
    }

    async fn delete_config(&self, name: &str) -> Result<bool, StoreError> {
        self.inner.calls.fetch_add(1, Ordering::Relaxed);
        Ok(self.inner.configs.remove(name).is_some())
    }

    async fn get_config(&self, name: &str) -> Result<Option<Quota>, StoreError> {
        self.inner.calls.fetch_add(1, Ordering::Relaxed);
        Ok(self.inner.configs.get(name).map(|q| *q))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::clock::FakeClock;

    fn lease(want: u64, min: u64) -> Op<'static> {
        Op::Lease {
            want,
            min,
            node: None,
        }
    }

    #[test]
    fn expired_entries_read_as_full_and_are_swept() {
        let clock = FakeClock::new();
        let store = MemoryStore::with_clock(clock.clone());
        let q = Quota::per_second(10).unwrap();
        let r = store.run("k", &q, lease(10, 1)).unwrap();
        assert_eq!(r.granted, 10);
        assert_eq!(store.len(), 1);
        clock.advance(Duration::from_secs(1));
        let r = store.run("k", &q, lease(10, 10)).unwrap();
        assert_eq!(r.granted, 10, "refilled after one period");
        clock.advance(Duration::from_secs(12));
        for i in 0..SWEEP_EVERY {
            let _ = store.run(
                &format!("other{i}"),
                &q,
                Op::Release {
                    tokens: 0,
                    node: None,
                },
            );
        }
        assert_eq!(
            store.len(),
            0,
            "expired entry swept, full buckets never stored"
        );
        assert_eq!(store.calls(), SWEEP_EVERY + 2);
    }

    #[test]
    fn rejects_invalid_arguments_without_writing() {
        let store = MemoryStore::with_clock(FakeClock::new());
        let q = Quota::per_second(10).unwrap();
        let err = store.run("k", &q, lease(5, 11)).unwrap_err();
        assert!(matches!(err, StoreError::Rejected(ref m) if m == "invalid argument min"));
        assert!(store.is_empty());
    }
}
