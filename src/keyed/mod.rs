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
//! tokio task: fine for a few limiters, far too heavy for 100 000 keys. Here a key is 48 bytes
//! of atomics (`src/keyed/state.rs`) stored inline in a [`DashMap`] (plus the key itself and
//! the map's own overhead; RELIABILITY.md measures the total), and **one background worker**
//! serves every key: callers put lease requests on bounded queues, the worker runs up to
//! [`max_in_flight`](KeyedHybridBuilder::max_in_flight) store calls at a time (a `RedisStore`
//! pipelines them), and it runs the eviction sweeps.
//!
//! **The hot path** for a key that has tokens is a `DashMap` read (hash the key, take its
//! shard's read lock: one atomic add and sub) and one CAS on the key's token word; on a hit it
//! also records the coarse time of use (a load, and a store once per 100 ms tick). No clock
//! read, no allocation, no I/O. The shard lock is reader-preferring: hits never wait for a
//! writer; only inserts and evictions in the same shard wait, for each other and for the
//! worker's sweep of that shard.
//!
//! **A key without tokens.** A sync [`try_acquire`](KeyedHybridLimiter::try_acquire) cannot
//! wait, so the first call on a new key (or on a key whose tokens are spent) answers
//! `Denied { retry_after }` of about one store round trip and queues a lease for the key (at
//! most one queued per key); a retry then finds the tokens.
//! [`acquire`](KeyedHybridLimiter::acquire) and
//! [`try_acquire_for`](KeyedHybridLimiter::try_acquire_for) send their own request with a
//! reply channel and get their tokens straight from the grant, one round trip later. When the
//! store says the key's bucket is empty, its `retry_after` is kept in the key: callers are
//! denied locally until then, so an over-limit key costs one store call per `retry_after`.
//!
//! **Lease sizes: exact for cold keys, batches for hot ones.** Most keyed budgets are small
//! and their keys cold — 5 SMS per minute per phone number — where leasing a batch buys
//! nothing and strands tokens. So a key's lease is **exact** (`min = want = n`, what pure mode
//! would ask) until the key has spent tokens between two leases. From then on the worker
//! measures the key's demand with no counter on the hot path — tokens spent since the last
//! grant over the time since — and the limiter's [`LeasePolicy`] sizes `want` and the
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
//! plus 10 s, like document 004's funnels, so a key is never forgotten while its store answer
//! could still differ from a fresh bucket's) is removed, and its tokens are returned to the
//! store. A key with a lease queued or in flight is never evicted. Eviction removes the state
//! under the shard's write lock, which no caller can hold at the same time, so no token is
//! spent after it was given back.
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
//! lease opens it, the worker then makes one probe per back-off (10 ms to 500 ms, jittered)
//! and answers other requests at once, and callers without tokens are answered by the
//! [`FailurePolicy`] — [`LocalFallback`](FailurePolicy::LocalFallback) keeps one GCRA word per
//! key, at the key's share of the quota.
//!
//! **Central configuration.** A keyed limiter runs every key under its builder's quota. A
//! config stored under a key's bucket name ([`KeyedHybridLimiter::bucket_name`]) applies to
//! that key alone; there is no name-wide config, since one script call can only read keys of
//! one cluster slot and every key has a slot of its own.

mod lease_wait;
mod name;
mod pure;
mod state;
mod worker;

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::fmt::Display;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::mapref::entry::Entry;
use dashmap::DashMap;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::deadline;
use crate::error::{Error, StoreError};
use crate::failure::{Circuit, FailurePolicy, LocalRate};
use crate::hybrid::DEFAULT_RTT;
use crate::limiter::{check_tokens, Decision, KeyRef, KeyedLimiter, LocalAnswer};
use crate::policy::{AdaptiveLease, FixedLease, LeasePolicy};
use crate::quota::Quota;
use crate::store::{LeaseStore, RedisStore};
use crate::telemetry::{self, KeyedMetrics, KeyedPublished, PUBLISH_INTERVAL};

#[cfg(feature = "toml")]
pub(crate) use name::validate_keyed_name;
pub use name::MAX_KEY_BYTES;
pub use pure::KeyedRedisLimiter;

use state::KeyState;
use worker::{Answer, Request};

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
pub struct KeyedHybridLimiter<K, S: LeaseStore = RedisStore, H = RandomState> {
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

#[derive(Default)]
struct Counters {
    keys_created: AtomicU64,
    evicted_idle: AtomicU64,
    evicted_at_cap: AtomicU64,
    refused_at_cap: AtomicU64,
    refused_busy: AtomicU64,
    leases: AtomicU64,
    tokens_leased: AtomicU64,
    over_limit: AtomicU64,
    releases: AtomicU64,
    tokens_released: AtomicU64,
    tokens_lost: AtomicU64,
    store_errors: AtomicU64,
    tokens_denied: AtomicU64,
    admitted_degraded: AtomicU64,
    /// Leased tokens that went back to the store's way instead of to a caller: queued for
    /// release (whether the release then succeeds or not). Written by the worker only.
    returned: AtomicU64,
}

/// Configures a [`KeyedHybridLimiter`].
#[must_use]
pub struct KeyedHybridBuilder<K, S, H = RandomState> {
    name: String,
    quota: Quota,
    store: S,
    policy: Box<dyn LeasePolicy>,
    max_keys: usize,
    idle_ttl: Option<Duration>,
    give_back_after: Option<Duration>,
    max_in_flight: usize,
    failure: FailurePolicy,
    seed: Option<u64>,
    runtime: Option<tokio::runtime::Handle>,
    hasher: H,
    _key: std::marker::PhantomData<fn(K)>,
}

/// Default [`KeyedHybridBuilder::max_keys`].
pub const DEFAULT_MAX_KEYS: usize = 100_000;
/// Default [`KeyedHybridBuilder::max_in_flight`].
pub const DEFAULT_MAX_IN_FLIGHT: usize = 32;

impl<K, S, H> KeyedHybridBuilder<K, S, H>
where
    K: Hash + Eq + Clone + Display + Send + Sync + 'static,
    S: LeaseStore,
    H: BuildHasher + Clone + Send + Sync + 'static,
{
    /// Sizes the leases of keys with measured demand (default: [`AdaptiveLease`]). Its
    /// `want` and low-water mark are used, `min` is the request in hand, and its terms are
    /// ignored: keyed leases are anonymous (see the module docs).
    pub fn policy(mut self, policy: impl LeasePolicy) -> Self {
        self.policy = Box::new(policy);
        self
    }

    /// Shorthand for `.policy(FixedLease::new(size))`: keys with measured demand lease
    /// batches of `size`.
    pub fn lease_size(self, size: u64) -> Self {
        self.policy(FixedLease::new(size))
    }

    /// Most keys with local state (default [`DEFAULT_MAX_KEYS`], at least 1). Memory is about
    /// this many times the per-key size (see `BENCHMARKS.md`); at the cap the least recently
    /// used keys are evicted.
    pub fn max_keys(mut self, max: usize) -> Self {
        self.max_keys = max.max(1);
        self
    }

    /// Evict a key after this long without use (default: the time the bucket takes to fill,
    /// plus 10 s; at least 200 ms). Shorter is safe — the truth is in the store — but a
    /// key's next call after eviction starts cold.
    pub fn idle_ttl(mut self, ttl: Duration) -> Self {
        self.idle_ttl = Some(ttl.max(MIN_IDLE_TTL));
        self
    }

    /// Give a key's tokens back to the store after this long without use (default: the
    /// policy's `idle_after`, else 500 ms), so tokens do not sit where nobody spends them.
    pub fn give_back_after(mut self, after: Duration) -> Self {
        self.give_back_after = Some(after);
        self
    }

    /// Most store calls in flight at once (default [`DEFAULT_MAX_IN_FLIGHT`], at least 1).
    /// A `RedisStore` pipelines them on one connection.
    pub fn max_in_flight(mut self, max: usize) -> Self {
        self.max_in_flight = max.max(1);
        self
    }

    /// What to answer when a key's tokens are spent and the store is failing (default:
    /// [`FailurePolicy::LocalFallback`] with one expected node, per key).
    pub fn on_store_failure(mut self, policy: FailurePolicy) -> Self {
        self.failure = policy;
        self
    }

    /// Seeds the jitter of retries (default: random).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Hashes keys with `hasher` (default: std's `RandomState`, SipHash with a random key).
    /// Hashing is about a third of a hit on a `u64` key; a faster hasher (such as
    /// `foldhash::fast::RandomState`) is fine where keys cannot be chosen by an attacker, or
    /// if it is seeded at random too — an unseeded one lets crafted keys collide in one shard.
    pub fn hasher<H2>(self, hasher: H2) -> KeyedHybridBuilder<K, S, H2> {
        KeyedHybridBuilder {
            name: self.name,
            quota: self.quota,
            store: self.store,
            policy: self.policy,
            max_keys: self.max_keys,
            idle_ttl: self.idle_ttl,
            give_back_after: self.give_back_after,
            max_in_flight: self.max_in_flight,
            failure: self.failure,
            seed: self.seed,
            runtime: self.runtime,
            hasher,
            _key: std::marker::PhantomData,
        }
    }

    /// Runs the worker on `runtime` (default: the runtime `build` is called on).
    pub fn runtime(mut self, runtime: tokio::runtime::Handle) -> Self {
        self.runtime = Some(runtime);
        self
    }

    /// Builds the limiter and starts its worker.
    ///
    /// # Errors
    /// [`Error::Config`] for a bad name (at most [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) −
    /// [`MAX_KEY_BYTES`] − 1 bytes), [`Error::NoRuntime`] outside a tokio runtime.
    pub fn build(self) -> Result<KeyedHybridLimiter<K, S, H>, Error> {
        name::validate_keyed_name(&self.name)?;
        let runtime = match self.runtime {
            Some(rt) => rt,
            None => tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?,
        };
        let terms = self.policy.terms(&self.quota);
        let idle_ttl = self
            .idle_ttl
            .unwrap_or_else(|| self.quota.time_for(self.quota.burst()) + Duration::from_secs(10));
        let give_back_after = self
            .give_back_after
            .or(terms.map(|t| t.idle_after))
            .unwrap_or(Duration::from_millis(500));
        // New keys wait for their first lease with the request flag set, which keeps them
        // from being evicted: a quarter of the cap at most, so there is always room to make.
        let (known, known_requests) = mpsc::channel(self.max_keys.min(MAX_QUEUE));
        let (fresh, fresh_requests) = mpsc::channel((self.max_keys / 4).clamp(1, MAX_QUEUE));
        let shared = Arc::new(Shared {
            map: DashMap::with_hasher(self.hasher),
            live: AtomicUsize::new(0),
            tick: AtomicU32::new(0),
            origin: Instant::now(),
            max_keys: self.max_keys,
            ttl_ticks: ticks(idle_ttl),
            give_back_ticks: ticks(give_back_after),
            sweep_every: (idle_ttl.min(give_back_after) / 2).clamp(TICK, Duration::from_secs(1)),
            max_in_flight: self.max_in_flight,
            known,
            fresh,
            fallback: match self.failure {
                FailurePolicy::LocalFallback { expected_nodes } => {
                    Some(LocalRate::share_of(&self.quota, expected_nodes))
                }
                _ => None,
            },
            failure: self.failure,
            circuit: Circuit::default(),
            rtt_ns: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            pressure: AtomicBool::new(false),
            wake: Notify::new(),
            leased: Notify::new(),
            counters: Counters::default(),
            metrics: KeyedMetrics::new(&self.name, self.failure.name()),
            name: self.name,
            quota: self.quota,
            store: self.store,
            policy: self.policy,
        });
        let seed = self.seed.unwrap_or_else(|| fastrand::u64(..));
        let requests = worker::Requests {
            known: known_requests,
            fresh: fresh_requests,
        };
        let task = runtime.spawn(telemetry::publishing(
            worker::run(shared.clone(), requests, seed),
            publisher(shared.clone()),
        ));
        Ok(KeyedHybridLimiter {
            handle: Arc::new(Handle {
                shared,
                task: Mutex::new(Some(task)),
            }),
        })
    }
}

/// Adds `n` to a statistics counter.
fn count(counter: &AtomicU64, n: u64) {
    // Relaxed: statistics.
    counter.fetch_add(n, Ordering::Relaxed);
}

/// Publishes a keyed limiter's metrics from its worker's task, between the worker's polls (see
/// [`crate::telemetry`]); says whether the limiter is active.
///
/// Admitted tokens are derived, with no counter on the hot path: every token a lease brought
/// went to a waiting caller, into a key (where callers spend it) or back to the store, so
/// `admitted = leased − returned − held + degraded`, where `held` is the sum of every key's
/// tokens. That sum reads the whole map, so it is taken at most once per
/// [`PUBLISH_INTERVAL`] (and is 0 without keys, as after shutdown); admitted tokens and the
/// local tokens gauge are published with it. Between the worker's polls nothing adds tokens
/// to a key or moves them out, so only callers' spending can change the sum while it is
/// read, and it never reads below what the keys hold once it is done: the derived count
/// never runs ahead of what callers took.
fn publisher<K, S, H>(s: Arc<Shared<K, S, H>>) -> impl FnMut() -> bool
where
    K: Hash + Eq + Clone + Display + Send + Sync + 'static,
    S: LeaseStore,
    H: BuildHasher + Clone + Send + Sync + 'static,
{
    let mut last = KeyedPublished::default();
    let mut summed_at: Option<Instant> = None;
    move || {
        let stats = s.stats();
        let now = Instant::now();
        let held = if stats.live_keys == 0 {
            Some(0)
        } else if summed_at.is_none_or(|at| now >= at + PUBLISH_INTERVAL) {
            summed_at = Some(now);
            Some(s.map.iter().map(|state| state.tokens()).sum::<u64>())
        } else {
            None
        };
        let held = held.map(|held| {
            let returned = s.counters.returned.load(Ordering::Relaxed);
            let admitted = stats
                .tokens_leased
                .saturating_sub(returned)
                .saturating_sub(held)
                + stats.tokens_admitted_degraded;
            (admitted, held)
        });
        let grew = s.metrics.publish(&mut last, &stats, held);
        // Active while any key lives (the worker ticks then anyway) or the circuit is open;
        // and once more after anything changed, so a count made just after this publication
        // (a caller counts its denial after queueing the request that woke the worker) is
        // published within one interval.
        grew || stats.live_keys > 0 || stats.circuit_open
    }
}

/// Whole ticks in `d`, rounded up, at least one.
fn ticks(d: Duration) -> u32 {
    let n = d.as_nanos().div_ceil(TICK.as_nanos()).max(1);
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// What the user holds; dropping the last one closes the limiter.
struct Handle<K, S, H> {
    shared: Arc<Shared<K, S, H>>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl<K, S, H> Drop for Handle<K, S, H> {
    fn drop(&mut self) {
        self.shared.close();
    }
}

/// State shared by the callers and the worker.
struct Shared<K, S, H> {
    name: String,
    quota: Quota,
    store: S,
    policy: Box<dyn LeasePolicy>,
    map: DashMap<K, KeyState, H>,
    /// Keys in `map`, reserved before each insert (so never above `max_keys`).
    live: AtomicUsize,
    max_keys: usize,
    /// The coarse clock: ticks since `origin`, advanced by the worker.
    tick: AtomicU32,
    origin: Instant,
    ttl_ticks: u32,
    give_back_ticks: u32,
    sweep_every: Duration,
    max_in_flight: usize,
    /// Leases for keys that were granted tokens before: served first.
    known: mpsc::Sender<Request<K>>,
    /// First leases (new keys, and keys never granted yet).
    fresh: mpsc::Sender<Request<K>>,
    failure: FailurePolicy,
    /// The per-key rate of [`FailurePolicy::LocalFallback`] (each key has its own word).
    fallback: Option<LocalRate>,
    circuit: Circuit,
    /// Smoothed store round trip, ns.
    rtt_ns: AtomicU64,
    closed: AtomicBool,
    /// A new key was refused at the cap: the worker should make room.
    pressure: AtomicBool,
    /// Wakes the worker for `closed` and `pressure`.
    wake: Notify,
    /// Woken by the worker whenever a key's lease is answered (granted, refused, failed):
    /// callers waiting for a lease queued by someone else (`lease_wait.rs`).
    leased: Notify,
    counters: Counters,
    /// Metric handles, published by the worker's task ([`publisher`]).
    metrics: KeyedMetrics,
}

/// The outcome of a local check.
enum Outcome {
    Allowed,
    Denied { retry_after: Duration, why: Why },
}

/// Why a local check denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    /// No tokens yet: a lease may bring some.
    Pending,
    /// The store said when the key's bucket can serve again (or the circuit said when to
    /// probe): waiting is the answer.
    Blocked,
    /// The failure policy's local rate said to wait.
    Policy,
    /// The store is failing and the policy is to fail closed.
    Failing,
}

impl<K, S, H> Shared<K, S, H> {
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.wake.notify_one();
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    fn tick(&self) -> u32 {
        // Relaxed: a coarse clock; a stale tick only makes a key look a tick older.
        self.tick.load(Ordering::Relaxed)
    }

    /// The coarse clock brought up to the time since the origin, and returned. The worker
    /// keeps time only while keys are live, so a key created after an idle spell reads this,
    /// not `tick` (which could be the idle spell old and get the new key evicted at once).
    fn fresh_tick(&self) -> u32 {
        let ticks = self.origin.elapsed().as_nanos() / TICK.as_nanos();
        let now = u32::try_from(ticks).unwrap_or(u32::MAX);
        // Relaxed: see `tick`; `fetch_max`, so concurrent updates never move it back.
        self.tick.fetch_max(now, Ordering::Relaxed).max(now)
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn rtt(&self) -> Duration {
        match self.rtt_ns.load(Ordering::Relaxed) {
            0 => DEFAULT_RTT,
            ns => Duration::from_nanos(ns),
        }
    }

    /// Counters of this limiter (`Relaxed` loads: statistics, each read on its own).
    fn stats(&self) -> KeyedStats {
        let s = self;
        let c = &s.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        KeyedStats {
            live_keys: s.live.load(Ordering::Relaxed) as u64,
            keys_created: get(&c.keys_created),
            evicted_idle: get(&c.evicted_idle),
            evicted_at_cap: get(&c.evicted_at_cap),
            refused_at_cap: get(&c.refused_at_cap),
            refused_busy: get(&c.refused_busy),
            leases: get(&c.leases),
            tokens_leased: get(&c.tokens_leased),
            over_limit: get(&c.over_limit),
            releases: get(&c.releases),
            tokens_released: get(&c.tokens_released),
            tokens_lost: get(&c.tokens_lost),
            store_errors: get(&c.store_errors),
            tokens_denied: get(&c.tokens_denied),
            tokens_admitted_degraded: get(&c.admitted_degraded),
            circuit_open: s.circuit.is_open(),
        }
    }
}

impl<K, S, H> Shared<K, S, H>
where
    K: Hash + Eq + Clone + Display + Send + Sync + 'static,
    S: LeaseStore,
    H: BuildHasher + Clone + Send + Sync + 'static,
{
    /// Takes `n` tokens of `key` locally; on a miss, applies the failure policy and (if
    /// `queue`) queues a lease. Never waits.
    #[inline]
    fn take<Q>(&self, key: &Q, n: u64, queue: bool) -> Result<Outcome, Error>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        check_tokens(n, self.quota.burst())?;
        if let Some(state) = self.map.get(key) {
            if let Some(left) = self.take_held(&state, n) {
                if state.below_low_water(left) {
                    self.request(key, &state, 0);
                }
                return Ok(Outcome::Allowed);
            }
            return self.miss(key, Some(&state), n, queue);
        }
        self.miss(key, None, n, queue)
    }

    /// Whether a lease of `key` is queued or in flight.
    fn lease_queued<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map
            .get(key)
            .is_some_and(|state| state.flags() & state::QUEUED != 0)
    }

    /// Takes `n` of `key`'s local tokens if it holds them; no lease, no denial counted.
    fn take_local<Q>(&self, key: &Q, n: u64) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map
            .get(key)
            .is_some_and(|state| self.take_held(&state, n).is_some())
    }

    /// Takes `n` of the tokens `state` holds and marks it used; returns what is left.
    #[inline]
    fn take_held(&self, state: &KeyState, n: u64) -> Option<u64> {
        let left = state.take(n)?;
        state.touch(self.tick());
        Some(left)
    }

    /// The slow half of `take`: `state` is the key's (held under its shard's read lock), or
    /// `None` if the key has no state.
    #[cold]
    #[inline(never)]
    fn miss<Q>(
        &self,
        key: &Q,
        state: Option<&KeyState>,
        n: u64,
        queue: bool,
    ) -> Result<Outcome, Error>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        if self.is_closed() {
            return Err(Error::Closed);
        }
        if let Some(state) = state {
            state.seen(self.tick());
        }
        let blocked = state.map_or(Duration::ZERO, |s| s.blocked_for(self.now_ns()));
        let mut outcome = None;
        if self.circuit.is_open() {
            let admit = match (self.failure, &self.fallback, state) {
                (FailurePolicy::FailOpen, _, _) => Ok(()),
                (FailurePolicy::LocalFallback { .. }, Some(rate), Some(s)) => rate
                    .try_take_at(&s.fallback_tat, n)
                    .map_err(|wait| (wait, Why::Policy)),
                (FailurePolicy::LocalFallback { .. }, _, _) => Err((self.rtt(), Why::Policy)),
                _ => Err((blocked.max(self.rtt()), Why::Failing)),
            };
            outcome = Some(match admit {
                Ok(()) => {
                    count(&self.counters.admitted_degraded, n);
                    Outcome::Allowed
                }
                Err((retry_after, why)) => Outcome::Denied { retry_after, why },
            });
        } else if !blocked.is_zero() {
            outcome = Some(Outcome::Denied {
                retry_after: blocked,
                why: Why::Blocked,
            });
        }
        // Ask for a lease (under an open circuit: a probe) unless the key is known to wait.
        if queue && blocked.is_zero() {
            match state {
                Some(s) => {
                    s.note_denied(n);
                    self.request(key, s, n);
                }
                None => self.admit(key, n),
            }
        }
        let outcome = outcome.unwrap_or(Outcome::Denied {
            retry_after: self.rtt(),
            why: Why::Pending,
        });
        if matches!(outcome, Outcome::Denied { .. }) {
            count(&self.counters.tokens_denied, n);
        }
        Ok(outcome)
    }

    /// Queues a lease for `key` unless one is queued already.
    fn request<Q>(&self, key: &Q, state: &KeyState, n: u64)
    where
        Q: ToOwned<Owned = K> + ?Sized,
    {
        if !state.mark_queued() {
            return;
        }
        match self.queue_for(Some(state)).try_reserve() {
            Ok(permit) => permit.send(Request {
                key: key.to_owned(),
                n,
                reply: None,
            }),
            // The queue is full (or closed): a later call asks again.
            Err(_) => state.unqueue(),
        }
    }

    /// The queue for a lease of a key in `state`: keys that were granted tokens before have a
    /// queue of their own, served first, so a flood of new keys cannot delay their refills.
    fn queue_for(&self, state: Option<&KeyState>) -> &mpsc::Sender<Request<K>> {
        match state {
            Some(state) if state.flags() & state::GRANTED != 0 => &self.known,
            _ => &self.fresh,
        }
    }

    /// Creates the state of a new key and queues its first lease, if the cap and the queue
    /// allow.
    fn admit<Q>(&self, key: &Q, n: u64)
    where
        Q: ToOwned<Owned = K> + ?Sized,
    {
        let Ok(permit) = self.fresh.try_reserve() else {
            count(&self.counters.refused_busy, 1);
            return;
        };
        if !self.reserve_slot() {
            return;
        }
        match self.map.entry(key.to_owned()) {
            Entry::Vacant(slot) => {
                let key = slot.key().clone();
                slot.insert(KeyState::new(self.fresh_tick(), state::QUEUED));
                count(&self.counters.keys_created, 1);
                permit.send(Request {
                    key,
                    n,
                    reply: None,
                });
            }
            // Another caller created it meanwhile.
            Entry::Occupied(_) => {
                self.live.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Creates `key`'s state if it has none and the cap allows (for async callers).
    fn ensure_state<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        if self.map.contains_key(key) || !self.reserve_slot() {
            return;
        }
        match self.map.entry(key.to_owned()) {
            Entry::Vacant(slot) => {
                slot.insert(KeyState::new(self.fresh_tick(), 0));
                count(&self.counters.keys_created, 1);
            }
            Entry::Occupied(_) => {
                self.live.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Reserves room for one more key; at the cap, counts the refusal and asks the worker to
    /// make room.
    fn reserve_slot(&self) -> bool {
        // Relaxed: a counter; a CAS, so it never reads above the cap even for a moment.
        let reserved = self
            .live
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |live| {
                (live < self.max_keys).then_some(live + 1)
            })
            .is_ok();
        if !reserved {
            count(&self.counters.refused_at_cap, 1);
            if !self.pressure.swap(true, Ordering::Relaxed) {
                self.wake.notify_one();
            }
        }
        reserved
    }

    /// Asks the worker for `n` tokens of `key` and waits for its answer.
    async fn ask<Q>(&self, key: &Q, n: u64) -> Result<Answer, Error>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        let (reply, answer) = oneshot::channel();
        let request = Request {
            key: key.to_owned(),
            n,
            reply: Some(reply),
        };
        let queue = self.queue_for(self.map.get(key).as_deref());
        queue.send(request).await.map_err(|_| Error::Closed)?;
        answer.await.map_err(|_| Error::Closed)
    }

    /// Waits for `n` tokens of `key`, until `deadline` if given.
    async fn wait<Q>(&self, key: &Q, n: u64, deadline: Option<Instant>) -> Result<Decision, Error>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        loop {
            // While the store is failing, a miss also queues a lease, as `try_acquire` does:
            // that is the probe that closes the circuit again (the worker sends it when the
            // back-off allows), else callers that only wait would never probe.
            let probe = self.circuit.is_open();
            let (retry_after, why) = match self.take(key, n, probe)? {
                Outcome::Allowed => return Ok(Decision::Allowed),
                Outcome::Denied { retry_after, why } => (retry_after, why),
            };
            let wait = match why {
                Why::Blocked | Why::Policy => retry_after,
                Why::Failing => match self.circuit.last_error() {
                    Some(e) => return Err(Error::Store(e)),
                    None => retry_after,
                },
                // A lease of this key is on its way (a refill, or the one a `try_acquire`
                // just queued): wait for it instead of leasing a second batch.
                Why::Pending if self.lease_queued(key) => self.rtt(),
                Why::Pending => {
                    self.ensure_state(key);
                    match self.ask(key, n).await? {
                        Answer::Granted => return Ok(Decision::Allowed),
                        // Another lease of this key (a refill) may have brought tokens while
                        // this one was refused: take them rather than wait out the refusal.
                        Answer::Denied(wait) if !self.take_local(key, n) => wait,
                        Answer::Denied(_) => return Ok(Decision::Allowed),
                        Answer::Failed(e) if self.failure == FailurePolicy::FailClosed => {
                            return Err(Error::Store(e))
                        }
                        // The circuit is open now: the next check answers by the policy.
                        Answer::Failed(_) => continue,
                        Answer::TooLarge(burst) => {
                            return Err(Error::ExceedsBurst {
                                requested: n,
                                burst,
                            })
                        }
                        Answer::Closed => return Err(Error::Closed),
                    }
                }
            };
            if deadline.is_some_and(|d| deadline::from_now(wait) > d) {
                return Ok(Decision::Denied { retry_after: wait });
            }
            tokio::time::sleep(wait).await;
        }
    }

    fn fail(&self, error: StoreError) {
        self.circuit.fail(&self.name, self.failure, error);
        count(&self.counters.store_errors, 1);
    }

    fn observe_rtt(&self, rtt: Duration) {
        let ns = u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX).max(1);
        let old = self.rtt_ns.load(Ordering::Relaxed);
        let new = if old == 0 { ns } else { (old * 7 + ns) / 8 };
        self.rtt_ns.store(new, Ordering::Relaxed);
    }
}

impl<K, S> KeyedHybridLimiter<K, S>
where
    K: Hash + Eq + Clone + Display + Send + Sync + 'static,
    S: LeaseStore,
{
    /// A builder for keyed limiter `name`: every key gets `quota`, leased from `store`.
    pub fn builder(name: impl Into<String>, quota: Quota, store: S) -> KeyedHybridBuilder<K, S> {
        KeyedHybridBuilder {
            name: name.into(),
            quota,
            store,
            policy: Box::new(AdaptiveLease::default()),
            max_keys: DEFAULT_MAX_KEYS,
            idle_ttl: None,
            give_back_after: None,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            failure: FailurePolicy::default(),
            seed: None,
            runtime: None,
            hasher: RandomState::new(),
            _key: std::marker::PhantomData,
        }
    }

    /// A keyed limiter with default settings, on the current tokio runtime.
    ///
    /// # Errors
    /// As [`KeyedHybridBuilder::build`].
    pub fn new(name: impl Into<String>, quota: Quota, store: S) -> Result<Self, Error> {
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
    /// The hot path: a map read and a CAS on the key's token word. A key without tokens (a new
    /// key, or one whose tokens are spent) is denied with a `retry_after` of about one store
    /// round trip while its lease is fetched; a key the store said is empty is denied until
    /// the store said it can serve.
    ///
    /// # Errors
    /// [`Error::ZeroTokens`], [`Error::ExceedsBurst`]; [`Error::Closed`] after shutdown.
    #[inline]
    pub fn try_acquire<Q>(&self, key: &Q, n: u64) -> Result<Decision, Error>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        Ok(match self.handle.shared.take(key, n, true)? {
            Outcome::Allowed => Decision::Allowed,
            Outcome::Denied { retry_after, .. } => Decision::Denied { retry_after },
        })
    }

    /// Waits until `n` tokens of `key` are taken: from local tokens, else from a lease made
    /// for this call (one store round trip), else after the store's `retry_after`.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire), plus [`Error::Store`] under
    /// [`FailurePolicy::FailClosed`] while the store is failing.
    ///
    /// # Cancel safety
    /// Cancel safe: tokens leased for a dropped call stay with the key for the next one —
    /// except in one narrow window: a call dropped after its grant was sent to it but before
    /// it was polled again loses those tokens (to this process: the store counted them, so
    /// the fleet admits less, never more).
    pub async fn acquire<Q>(&self, key: &Q, n: u64) -> Result<(), Error>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        self.handle.shared.wait(key, n, None).await.map(|_| ())
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
    ) -> Result<Decision, Error>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        let s = &*self.handle.shared;
        let deadline = deadline::from_now(timeout);
        match tokio::time::timeout_at(deadline, s.wait(key, n, Some(deadline))).await {
            Ok(result) => result,
            Err(_) => Ok(Decision::Denied {
                retry_after: s.rtt(),
            }),
        }
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
    /// [`Error::Closed`]. Dropping the last clone does the same without waiting.
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

    async fn try_acquire<Q>(&self, key: &Q, n: u64) -> Result<Decision, Error>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        KeyedHybridLimiter::try_acquire(self, key, n)
    }

    async fn acquire<Q>(&self, key: &Q, n: u64) -> Result<(), Error>
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
    ) -> Result<Decision, Error>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        KeyedHybridLimiter::try_acquire_for(self, key, n, timeout).await
    }

    fn try_acquire_now<Q>(&self, key: &Q, n: u64) -> Option<Result<Decision, Error>>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        Some(KeyedHybridLimiter::try_acquire(self, key, n))
    }

    fn try_acquire_local<Q>(&self, key: &Q, n: u64) -> Option<Result<LocalAnswer, Error>>
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
    ) -> Result<Decision, Error>
    where
        K: Borrow<Q>,
        Q: KeyRef<K> + ?Sized,
    {
        KeyedHybridLimiter::try_acquire_or_lease(self, key, n, lease_wait).await
    }
}
