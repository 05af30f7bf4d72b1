//! Keyed limiters: one fleet-wide budget per key (user, API key, phone number).
//!
//! [`KeyedHybridLimiter`] gives every key its own token bucket in the store, with the same
//! quota, and spends leased tokens locally like a [`HybridLimiter`](crate::HybridLimiter);
//! [`KeyedRedisLimiter`] is the pure-Redis form, one store call per decision.
//!
//! # Implementation details
//!
//! **Buckets.** Key `k` of limiter `name` lives in the store as the bucket named `name#k`
//! (see `src/keyed/name.rs`: encoded so that a key cannot break the `{hash tag}` or escape the
//! prefix, long keys hashed, every key in a hash tag of its own so keys spread over a
//! cluster).
//!
//! **Per-key state is small.** A `HybridLimiter` is about 1.2 KiB of cache-padded slots plus a
//! tokio task: fine for a few limiters, far too heavy for 100 000 keys. Here a key is 32 bytes
//! of plain integers, reached only under its shard's lock (`src/keyed/state.rs`) stored inline beside the key in the key map (below;
//! BENCHMARKS.md measures bytes per key with the map's overhead), and **one background worker**
//! serves every key: callers put lease requests on bounded queues, the worker runs up to
//! [`max_in_flight`](KeyedHybridBuilder::max_in_flight) store calls at a time (a `RedisStore`
//! pipelines them), and it runs the eviction sweeps.
//!
//! **The hot path** for a key that has tokens is a map lookup (below, "The key map": hash the
//! key with foldhash, take its shard's mutex: one atomic read-modify-write, and one to let go;
//! one group of control bytes, then the entry, key and state side by side), a load and a store of the
//! key's token word under that lock, and on a hit the coarse time of use (a load, and a store
//! once per 100 ms tick). No clock read, no allocation, no I/O — but for the hit that leaves
//! the key below its low-water mark: it queues the key's refill for the worker, a copy of the
//! key (an allocation for an owned key such as `String`), a slot of the worker's queue (tokio's
//! channel takes a new block of 32 slots now and then) and a wake-up of the worker, at most
//! once per refill. A call waits only while another holds its shard: another call on a key of
//! that shard (nanoseconds), an insert or removal of one key, a shard's resize (a few thousand
//! keys at most), a sweep's look at 256 buckets of it, or, once per
//! [`PUBLISH_INTERVAL`](crate::telemetry::PUBLISH_INTERVAL) while metrics are published, the
//! count of the tokens keys hold (each shard read whole). Nothing that holds a shard waits or
//! wakes a task.
//!
//! **A key without tokens.** A sync [`try_acquire`](KeyedHybridLimiter::try_acquire) cannot
//! wait, so the first call on a new key (or on a key whose tokens are spent) answers
//! `Denied { retry_after }` of about one store round trip and queues a lease for the key (at
//! most one queued per key); a retry then finds the tokens.
//! [`acquire`](KeyedHybridLimiter::acquire) and
//! [`try_acquire_for`](KeyedHybridLimiter::try_acquire_for) send their own request with a
//! reply channel and get their tokens straight from the grant, one round trip later; while a
//! lease of the key is already queued or in flight (a refill, or another waiter's on a key at
//! its limit or with measured demand; a cold key's waiters lease side by side), the worker
//! holds such a request back and answers it once that lease is answered (from the key's new
//! tokens, with the store's wait, or with a lease of its own), so a waiter is woken by its
//! key's answer only, and waiters on a key at its limit make one store call per retry, not
//! one each. When the
//! store says the key's bucket is empty, its `retry_after` is kept in the key: callers are
//! denied locally until then, so an over-limit key costs one store call per `retry_after`.
//!
//! **Lease sizes: exact for cold keys, batches for hot ones.** Most keyed budgets are small
//! and their keys cold — 5 SMS per minute per phone number — where leasing a batch buys
//! nothing and strands tokens. So a key's lease is **exact** (`min = want = n`, what pure mode
//! would ask) until the key has spent tokens between two leases. From then on the worker
//! measures the key's demand with no counter on the hot path — tokens spent since the last
//! grant over the time since — and the limiter's [`LeasePolicy`](crate::LeasePolicy) sizes `want` and the
//! low-water mark from it, with the quota's rate as the cap ([`AdaptiveLease`], the default:
//! about one horizon of demand). `min` is always the request in hand. With `AdaptiveLease` a
//! key that spends a token now and then keeps leasing exactly one (the policy's target rounds
//! to one token), while a key at 1 000/s leases batches of about a horizon's worth and
//! refills before it runs dry. Tokens idle for
//! [`give_back_after`](KeyedHybridBuilder::give_back_after) go back to the store.
//!
//! Keyed leases are **anonymous** (no lease terms, whatever the policy says): terms would keep
//! a leaser record per key and node in the store (two more Redis keys per key) and a lease
//! expiry per key here. The cost is the conservation of terms: tokens a node holds are not
//! counted in the store while it holds them, so in a window `W` a key admits at most
//! `burst + rate × W` **plus what the nodes held when the window opened** — for exact leases
//! nothing beyond the request in hand, for a hot key at most one batch per node (with
//! `AdaptiveLease` capped at the rate, about `1.25 × rate × horizon`: a third of the burst at
//! most with the automatic horizon).
//! Over a whole run the fleet never exceeds `burst + rate × elapsed` per key.
//!
//! **Eviction.** The worker keeps a coarse clock (a 100 ms tick in one atomic word that callers
//! read) and sweeps the map about once a second (more often for short TTLs): a key unused for
//! [`idle_ttl`](KeyedHybridBuilder::idle_ttl) (default: the time the bucket takes to fill
//! plus 10 s, as Redis funnel limiters keep theirs, so a key is never forgotten while its store answer
//! could still differ from a fresh bucket's) is removed, and its tokens are returned to the
//! store. A key with a refill queued or in flight is never evicted (a waiter's own lease does
//! not hold its key: if the key is evicted meanwhile, what the lease brings beyond the
//! waiter's tokens goes back to the store). Eviction removes the state
//! under the shard's lock, which no caller can hold at the same time, so no token is spent
//! after it was given back. The sweep evicts one key per hold of a shard's lock and looks at
//! 256 buckets per hold, so a caller waits for it about a microsecond at most while the worker
//! runs (`benches/sweep.rs`: p99.9 of 0.3–0.6 µs during a sweep of a million keys).
//! After its evictions the sweep shrinks the map's shards that fell below a quarter full
//! (`map.rs`), so the memory of a flood of keys goes back once its keys are gone.
//!
//! **The cap.** At most [`max_keys`](KeyedHybridBuilder::max_keys) keys are live (an atomic
//! counter reserved before every insert: the cap is exact). A new key at the cap is not
//! refused for long: the caller is denied (`retry_after` of one round trip) and wakes the
//! worker, which evicts the least recently used sixteenth of the cap — keys never used first
//! (the one-shot keys of a flood), then by last use. Refusing new keys instead would let a
//! flood of unique keys lock legitimate users out; evicting is safe because the truth is in the
//! store and eviction returns the key's tokens. The eviction pass reads the map twice (a
//! histogram of last-use ticks, then the victims): O(cap) work per `cap / 16` new keys, in
//! the worker, never on a caller's thread. Async callers at the cap are still served: their
//! lease is exact and handed to them without creating state.
//!
//! **Under a flood** of unique keys the worker stays ahead of what it keeps in memory. First
//! leases have a queue of their own (a quarter of the cap long, since a key waiting for its
//! first lease cannot be evicted), served only after the queue of keys that were granted
//! tokens before, so a flood cannot delay the refills of keys in use; a new key whose queue is
//! full is denied without state. Releases (an evicted flood key gives back its one leased
//! token) use at most half of the calls in flight, and first leases pause while more than a
//! few thousand releases wait, so neither can pile up. The cap counts keys, not bytes: a key's
//! memory includes the key itself, so bound key length where keys come in (or key by a hash).
//!
//! **Store failures** are the limiter-wide circuit of [`crate::failure`]: the first failed
//! lease opens it, the worker then makes one probe per back-off (10 ms to 500 ms, jittered;
//! from twice the timeout after a timeout)
//! and answers other requests at once, and callers without tokens are answered by the
//! [`FailurePolicy`] — [`LocalFallback`](FailurePolicy::LocalFallback) keeps one GCRA word per
//! key, at the key's share of the quota.
//!
//! **Central configuration.** A keyed limiter runs every key under its builder's quota. A
//! config stored under a key's bucket name ([`KeyedHybridLimiter::bucket_name`]) applies to
//! that key alone; there is no name-wide config, since one script call can only read keys of
//! one cluster slot and every key has a slot of its own.
//!
//! # The key map
//!
//! `map.rs`: hashbrown's `HashTable` (SIMD control bytes, entries inline) under one
//! `parking_lot::Mutex` per shard, shards chosen by the cap, keys hashed with foldhash seeded
//! at random per limiter ([`DefaultKeyHasher`]). What decided it (numbers in BENCHMARKS.md,
//! issue 15; ratios taken within one criterion run, against governor's keyed limiter):
//!
//! - **Lookups that touch few lines.** A hit reads the shard header (lock and table pointer:
//!   a thousand shards fit in 128 KiB, so they stay cached), a control group and the entry:
//!   for `u64` keys a 40-byte entry. Maps that box each entry (papaya, flurry) add a dependent
//!   load to every hit and an allocation per key; they were ruled out on that ground, not
//!   measured (neither is in the tree); nor was scc's `HashMap`.
//! - **The hasher.** std's SipHash was about half of a hot hit on a `u64` key (DashMap: 19.6 ns
//!   against 11.2 ns with foldhash in one run). foldhash, already in the tree through
//!   hashbrown, with a random seed, is hashbrown's own default.
//! - **Memory.** DashMap picks its shard count from the cores (8 here), so each shard is a
//!   power-of-two table whose fill at a given key count is luck: 119.5 bytes per key at a
//!   million `u64` keys with the 48-byte state. Here the shard count comes from
//!   [`max_keys`](KeyedHybridBuilder::max_keys): at the cap every shard holds about 80 % of a
//!   4 096-bucket table, so a full limiter spends about `(entry + 1) / 0.8` bytes per key —
//!   about 52 for `u64` (goal: 64), 63 for `IpAddr` (a 17-byte key beside the byte-aligned
//!   state makes a 49-byte entry; governor: 69). Below the cap the tables are part-grown, as
//!   any hashbrown table (up to about 77 bytes per `u64` key at two thirds of the cap).
//! - **A mutex per shard, not a read-write lock, not lock-free reads.** Lock-free reads would
//!   need epochs or entries that never move, and this crate has no `unsafe` code; a lock is
//!   also what makes eviction exact (no token is spent after the worker took a key's tokens
//!   back). A read lock costs the same two atomic operations as a mutex but leaves the token
//!   word shared, so taking tokens needs a CAS, a third; under the mutex it is a load and a
//!   store. Measured in one pair of runs, one right after the other (BENCHMARKS.md), read
//!   lock then mutex: a hot key 13.2 ns (2.35× the plain limiter in its run) then 12.6 ns
//!   (1.77×); a random key of a million 90.5 then 83.8 ns (0.30× and 0.32× governor); of ten
//!   million 318 then 147 ns (0.76× and 0.34× governor). With ten million keys every entry is
//!   fetched from memory, and there the CAS cost far more than a load and a store (why, exactly,
//!   was not isolated). Even so a hot key costs 1.8–2.5× the plain limiter's one CAS (issue
//!   15 asked for 2×): the lock's two atomic operations, and the hash and probe, are the rest.
//!
//! # Where things are
//!
//! This file is the front of the hybrid keyed limiter; `builder.rs` checks settings and starts
//! the worker; `shared.rs` holds what callers and the worker share and the callers' slow
//! paths; `worker.rs` is the background worker that leases for every key; `map.rs` the key
//! map; `state.rs` one key's state; `name.rs` key validation and bucket names; `stats.rs`,
//! `metrics.rs` what it reports; `pure.rs` the pure keyed limiter.

mod builder;
mod lease_wait;
mod map;
mod metrics;
mod name;
mod pure;
mod shared;
mod state;
mod stats;
mod worker;

use std::borrow::Borrow;
use std::fmt::Display;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{AcquireError, BuildError};
#[cfg(doc)]
use crate::failure::FailurePolicy;
#[cfg(doc)]
use crate::lease::policy::AdaptiveLease;
use crate::limiter::{bounded, Decision, KeyRef, KeyedLimiter, LocalAnswer, Patience};
use crate::quota::Quota;
use crate::store::{LeaseStore, RedisStore};
use crate::time;

pub use builder::{KeyedHybridBuilder, DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_KEYS};
#[cfg(feature = "toml")]
pub(crate) use name::validate_keyed_name;
pub use name::MAX_KEY_BYTES;
pub use pure::KeyedRedisLimiter;
use shared::{Handle, Outcome};
pub use stats::KeyedStats;

/// The default hasher of keyed limiters: foldhash (the hasher hashbrown and std-free maps
/// default to), seeded at random for each limiter. It is not a cryptographic hash: its seed
/// keeps keys chosen from outside from colliding on purpose unless the attacker can learn it
/// by timing a long-running process (see foldhash's documentation); pass std's `RandomState`
/// to [`KeyedHybridBuilder::hasher`] for SipHash instead, at about 10 ns more per call.
pub type DefaultKeyHasher = foldhash::fast::RandomState;

/// The coarse clock's tick: last-use times and idle ages are counted in these.
const TICK: Duration = Duration::from_millis(100);
/// Shortest [`KeyedHybridBuilder::idle_ttl`]: two ticks.
pub(crate) const MIN_IDLE_TTL: Duration = Duration::from_millis(200);
/// Most leases queued at once in each of the two queues (fewer with a smaller cap).
const MAX_QUEUE: usize = 4096;

/// One budget per key, shared by the fleet, spent locally like a
/// [`HybridLimiter`](crate::HybridLimiter). See the [module docs](crate::keyed) for the design.
///
/// Keys are any `K: Hash + Eq + Clone + Display`; methods take any borrowed form (`&str` for
/// `String` keys), so looking up a key allocates nothing. The key's `Display` form names its
/// bucket in the store: keys that print alike share a budget.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), ratelease::Error> {
/// use std::time::Duration;
/// use ratelease::{KeyedHybridLimiter, MemoryStore, Quota};
///
/// // 5 SMS per minute per phone number, across the fleet.
/// let quota = Quota::per_minute(5)?;
/// let sms = KeyedHybridLimiter::<String, _>::builder("sms", quota, MemoryStore::new())
///     .max_keys(100_000)
///     .build()?;
/// assert!(sms.try_acquire_for("+4912345", 1, Duration::from_millis(50)).await?.is_allowed());
/// // The first sync call on a new key is denied while its lease is fetched.
/// assert!(!sms.try_acquire("+4967890", 1)?.is_allowed());
/// # Ok(()) }
/// ```
pub struct KeyedHybridLimiter<K, S: LeaseStore = RedisStore, H = DefaultKeyHasher> {
    handle: Arc<Handle<K, S, H>>,
}

impl<K, S: LeaseStore, H> Clone for KeyedHybridLimiter<K, S, H> {
    fn clone(&self) -> Self {
        KeyedHybridLimiter {
            handle: self.handle.clone(),
        }
    }
}

impl<K, S: LeaseStore, H> std::fmt::Debug for KeyedHybridLimiter<K, S, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = &self.handle.shared;
        f.debug_struct("KeyedHybridLimiter")
            .field("name", &s.name)
            .field("quota", &s.quota)
            .field("live_keys", &s.live.load(Ordering::Relaxed))
            .field("max_keys", &s.max_keys)
            .finish_non_exhaustive()
    }
}

impl<K, S> KeyedHybridLimiter<K, S>
where
    K: Hash + Eq + Clone + Display + Send + Sync + 'static,
    S: LeaseStore,
{
    /// A builder for keyed limiter `name`: every key gets `quota`, leased from `store`.
    pub fn builder(name: impl Into<String>, quota: Quota, store: S) -> KeyedHybridBuilder<K, S> {
        KeyedHybridBuilder::new(name.into(), quota, store)
    }

    /// A keyed limiter with default settings, on the current tokio runtime.
    ///
    /// # Errors
    /// As [`KeyedHybridBuilder::build`].
    pub fn new(name: impl Into<String>, quota: Quota, store: S) -> Result<Self, BuildError> {
        Self::builder(name, quota, store).build()
    }
}

impl<K, S, H> KeyedHybridLimiter<K, S, H>
where
    K: Hash + Eq + Clone + Display + Send + Sync + 'static,
    S: LeaseStore,
    H: BuildHasher + Clone + Send + Sync + 'static,
{
    /// Takes `n` tokens of `key` locally, or says when to retry. Never waits.
    ///
    /// The hot path: the key's shard locked, its entry found, its token count read and
    /// written (see the module docs). A key without tokens (a new key, one whose tokens are
    /// spent, or one idle for [`give_back_after`](KeyedHybridBuilder::give_back_after),
    /// 500 ms by default, whose tokens went back to the store) is denied with a `retry_after`
    /// of about one store round trip while its lease is fetched; a key the store said is empty
    /// is denied until the store said it can serve. So a key called every few seconds is
    /// denied nearly every time: to admit such callers, wait for the lease with
    /// [`try_acquire_or_lease`](Self::try_acquire_or_lease), as the HTTP layer does.
    ///
    /// # Errors
    /// [`AcquireError::ZeroTokens`], [`AcquireError::ExceedsBurst`] (more than the builder's
    /// burst); [`AcquireError::Closed`] after shutdown. A key whose stored config (central
    /// configuration) has a smaller burst than `n` is not known here: `try_acquire` answers
    /// it `Denied` (the key's leases still serve its smaller requests), while the waiting
    /// calls ([`acquire`](Self::acquire), [`try_acquire_for`](Self::try_acquire_for)) hear
    /// [`AcquireError::ExceedsBurst`] when they ask the store.
    #[inline]
    pub fn try_acquire<Q>(&self, key: &Q, n: u64) -> Result<Decision, AcquireError>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        Ok(match self.handle.shared.take(key, n, true)? {
            Outcome::Allowed => Decision::Allowed,
            Outcome::Denied { retry_after, .. } => Decision::Denied { retry_after },
        })
    }

    /// [`try_acquire`](Self::try_acquire) as a future, ready at once: the one-decision call
    /// every keyed limiter has (a [`KeyedRedisLimiter`] makes a store call for it), so code
    /// moving between modes needs no edit. Never waits for a lease: a key without tokens is
    /// denied while its lease is fetched, as with `try_acquire` (see
    /// [`try_acquire_or_lease`](Self::try_acquire_or_lease) to wait for it).
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn acquire_now<Q>(&self, key: &Q, n: u64) -> Result<Decision, AcquireError>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        self.try_acquire(key, n)
    }

    /// Waits until `n` tokens of `key` are taken: from local tokens, else from a lease made
    /// for this call (one store round trip), else after the store's `retry_after`.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire), plus [`AcquireError::Store`] under
    /// [`FailurePolicy::FailClosed`] while the store is failing.
    ///
    /// # Cancel safety
    /// Cancel safe: tokens leased for a dropped call stay with the key for the next one —
    /// except in one narrow window: a call dropped after its grant was sent to it but before
    /// it was polled again loses those tokens (to this process: the store counted them, so
    /// the fleet admits less, never more).
    pub async fn acquire<Q>(&self, key: &Q, n: u64) -> Result<(), AcquireError>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        let s = &*self.handle.shared;
        s.wait(key, n, Patience::Until(None)).await.map(|_| ())
    }

    /// Waits at most `timeout` for `n` tokens of `key`. Returns `Denied` at once when the
    /// store already said the key cannot serve within the timeout.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    pub async fn try_acquire_for<Q>(
        &self,
        key: &Q,
        n: u64,
        timeout: Duration,
    ) -> Result<Decision, AcquireError>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        let s = &*self.handle.shared;
        let deadline = time::from_now(timeout);
        let wait = s.wait(key, n, Patience::Until(Some(deadline)));
        bounded(deadline, wait, || s.rtt()).await
    }

    /// Tokens of `key` held locally now (0 for a key without state).
    pub fn available<Q>(&self, key: &Q) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.handle
            .shared
            .map
            .get(key)
            .map_or(0, |state| state.tokens())
    }

    /// Keys with local state now (never above [`max_keys`](KeyedHybridBuilder::max_keys)).
    pub fn live_keys(&self) -> usize {
        self.handle.shared.live.load(Ordering::Relaxed)
    }

    /// Counters of this limiter.
    pub fn stats(&self) -> KeyedStats {
        self.handle.shared.stats()
    }

    /// The limiter's name.
    pub fn name(&self) -> &str {
        &self.handle.shared.name
    }

    /// The quota every key gets.
    pub fn quota(&self) -> Quota {
        self.handle.shared.quota
    }

    /// The name of `key`'s bucket in the store: a plain limiter on this name shares the key's
    /// budget, and a central config stored under it applies to this key alone.
    pub fn bucket_name<Q: Display + ?Sized>(&self, key: &Q) -> String {
        name::bucket_name(&self.handle.shared.name, key)
    }

    /// Stops the worker and gives every key's tokens back to the store. Later calls return
    /// [`AcquireError::Closed`]. Dropping the last clone does the same without waiting.
    pub async fn shutdown(&self) {
        self.handle.shared.close();
        let task = self.handle.task.lock().take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

impl<K, S, H> KeyedLimiter<K> for KeyedHybridLimiter<K, S, H>
where
    K: Hash + Eq + Clone + Display + Send + Sync + 'static,
    S: LeaseStore,
    H: BuildHasher + Clone + Send + Sync + 'static,
{
    fn quota(&self) -> Quota {
        KeyedHybridLimiter::quota(self)
    }

    async fn acquire_now<Q>(&self, key: &Q, n: u64) -> Result<Decision, AcquireError>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        KeyedHybridLimiter::try_acquire(self, key, n)
    }

    async fn acquire<Q>(&self, key: &Q, n: u64) -> Result<(), AcquireError>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        KeyedHybridLimiter::acquire(self, key, n).await
    }

    async fn try_acquire_for<Q>(
        &self,
        key: &Q,
        n: u64,
        timeout: Duration,
    ) -> Result<Decision, AcquireError>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        KeyedHybridLimiter::try_acquire_for(self, key, n, timeout).await
    }

    fn local_answer<Q>(&self, key: &Q, n: u64) -> Option<Result<LocalAnswer, AcquireError>>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        Some(KeyedHybridLimiter::try_acquire_local(self, key, n))
    }

    async fn try_acquire_or_lease<Q>(
        &self,
        key: &Q,
        n: u64,
        lease_wait: Duration,
    ) -> Result<Decision, AcquireError>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        KeyedHybridLimiter::try_acquire_or_lease(self, key, n, lease_wait).await
    }
}
