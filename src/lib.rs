//! # ratelease
//!
//! One rate limit shared by a fleet of processes, for the price of a local atomic.
//!
//! A token bucket lives in Redis and is stepped by one atomic Lua script
//! (`lua/token_bucket.lua`). Each process **leases a batch of tokens** from it and hands them out
//! from an **in-memory lock-free bucket**, fetching the next batch before the current one runs
//! dry. A check on the hot path is a compare-and-swap on an atomic word of this thread's own —
//! nanoseconds, not a Redis round trip.
//!
//! The same script called once per request is **pure-Redis mode**, the exact reference every
//! other mode is compared against.
//!
//! ## Start here
//!
//! | you want | use |
//! | --- | --- |
//! | one limit for the whole fleet, checked in nanoseconds | [`HybridLimiter`] on a [`RedisStore`], with a [`Quota`]; answers are [`Decision`]s |
//! | the exact reference: one Redis call per decision | [`RedisLimiter`] (its [`check`](RedisLimiter::check) returns a [`Verdict`] for `RateLimit` headers) |
//! | a limit per user, API key or IP | [`KeyedHybridLimiter`], [`KeyedRedisLimiter`] |
//! | at most N things in flight across the fleet | [`ConcurrencyLimiter`]; mutual exclusion: [`RedisLock`] |
//! | limiters defined in a file (feature `toml`) | `LimitersConfig` |
//! | to limit an HTTP server: axum (feature `axum`), hyper or any tower HTTP stack (feature `http`) | `http::LimitLayer`: per key (client address, API key …) or global; sheds with `429`, `Retry-After` and `RateLimit` headers |
//! | to limit any other tower service (feature `tower`) | `middleware`: back-pressure in `poll_ready`, or shedding with a `Limited` error; no HTTP responses |
//! | to choose what happens when Redis fails | [`FailurePolicy`] |
//! | to change a limit at run time, fleet-wide | [`ConfigStore`] |
//! | metrics and traces | [`telemetry`] |
//! | tests and simulations without Redis | [`MemoryStore`] (with a [`FakeClock`] or [`TokioClock`]) |
//! | which method to call: `try_acquire`, `acquire_now`, `acquire` … | [One name, one shape](#one-name-one-shape) |
//! | your own store or lease sizing | [`LeaseStore`] (requests and replies: [`LeaseRequest`], [`LeaseReply`]), [`LeasePolicy`] ([`AdaptiveLease`], [`FixedLease`]) |
//!
//! ## Modes
//!
//! - [`HybridLimiter`]: leases batches through a [`LeasePolicy`]; `try_acquire` is synchronous.
//! - [`RedisLimiter`]: one store call per decision (`acquire_now`).
//!
//! [`ConcurrencyLimiter`] caps how many permits the fleet holds at once (in pure or hybrid
//! mode), with the slots of a crashed process returned after a ttl.
//!
//! Both implement [`Limiter`], and both run on any [`LeaseStore`]: [`RedisStore`] in
//! production, [`MemoryStore`] in tests and in the simulator.
//!
//! ## One name, one shape
//!
//! A method name means the same thing on every limiter that has it, and on the [`Limiter`] and
//! [`KeyedLimiter`] traits: the same sync or async shape, the same return type. Synchronous
//! names never do I/O and never wait; async names may. A rate limiter answers a [`Decision`];
//! a [`ConcurrencyLimiter`] answers with the [`Permit`] to hold instead (`Option<Permit>`
//! where the table says `Decision`, `None`: refused; `acquire` returns the `Permit`). Keyed
//! limiters take the key first (`try_acquire(key, n)`).
//!
//! | name | shape | what it does | on |
//! | --- | --- | --- | --- |
//! | `try_acquire(n)` | sync → `Result<Decision>` | takes `n` tokens from local state or says when to retry: no I/O, no wait | [`HybridLimiter`], [`KeyedHybridLimiter`] |
//! | `try_acquire(n)` | sync → `Result<Option<Permit>>` | takes `n` permits from the local pool (`None`: refused): no I/O, no wait | [`ConcurrencyLimiter`] (hybrid mode) |
//! | `try_acquire_local(n)` | sync → `Result<LocalAnswer>` | `try_acquire`, telling the store's refusal from "no answer yet" ([`LocalAnswer::NeedsLease`]) | [`HybridLimiter`], [`KeyedHybridLimiter`] |
//! | `local_answer(n)` | sync → `Option<Result<LocalAnswer>>` | `try_acquire_local` if the limiter keeps local state; `None` if it must ask the store | the traits |
//! | `acquire_now(n)` | async → `Result<Decision>` | one decision, never a wait for tokens: a pure limiter's store call, a hybrid limiter's local answer (or, where a node's part of the burst is a token or two, a store decision: see [`AdaptiveLease::per_request_below`]) | every limiter, the traits |
//! | `try_acquire_or_lease(n, lease_wait)` | async → `Result<Decision>` | `acquire_now`, but waits up to `lease_wait` while a hybrid limiter has no answer from the store yet; never for tokens | every rate limiter, the traits |
//! | `try_acquire_for(n, timeout)` | async → `Result<Decision>` | waits at most `timeout` | every limiter, the traits |
//! | `acquire(n)` | async → `Result<()>` | waits until admitted | every limiter, the traits |
//! | `ready()` | async → `Result<()>` | a warm start: waits until the store has answered once (a hybrid limiter's first lease, a pure limiter's call that takes nothing) and reports a store that does not answer | [`HybridLimiter`], [`RedisLimiter`], [`Limiter`] |
//! | `check(n)` | async → `Result<Verdict>` | `acquire_now` with the budget left, for `RateLimit` headers | [`RedisLimiter`] |
//!
//! So code that moves between [`HybridLimiter`] and [`RedisLimiter`] (or the keyed pair, or
//! is written against a trait) calls the async names, and needs no edit; `try_acquire` is the
//! nanosecond path of the limiters that have local state, and a pure limiter has none (a
//! pure-mode [`ConcurrencyLimiter`] answers it with [`AcquireError::Config`]).
//!
//! ## Errors
//!
//! Being limited is an answer ([`Decision::Denied`]), not an error. Errors are shaped by the
//! kind of call: building a limiter (or connecting a [`RedisStore`]) returns a [`BuildError`]
//! (invalid settings, no tokio runtime, a store that cannot be reached); a decision (every name
//! in the table above, and the traits' methods) returns an [`AcquireError`] (a request that can
//! never succeed, a closed limiter, an unconfigured name, a failed store). Both convert into
//! the umbrella [`Error`] variant for variant, so `?` into `ratelease::Error`, `Box<dyn Error>`
//! or `anyhow::Error` works across them, and a `match` names only what the call can return.
//!
//! ## HTTP
//!
//! With the `http` feature, `http::LimitLayer` limits any tower HTTP stack per key (client
//! address, forwarded address behind trusted proxies, API key) or globally, and sheds the excess
//! with `429`, `Retry-After` and the IETF `RateLimit` headers. With axum, enable `axum`
//! instead: it also reads axum's `ConnectInfo`, the client address a server sets up with
//! `into_make_service_with_connect_info` (with `http` alone, keying by it fails every request).

//! ## Algorithms
//!
//! The token bucket is the default; fixed window, sliding window and leaky bucket (GCRA) are
//! one builder call away (`.algorithm(…)`, see [`Algorithm`]), each one more script with its
//! Rust twin.
//!
//! ## Time
//!
//! The shared bucket runs on the Redis server's clock, so client clocks are never trusted.
//! Stores read time through a [`Clock`]; limiters wait on tokio's timer, so `tokio::time::pause`
//! plus a [`TokioClock`] put a whole fleet on virtual time.
//!
//! ## Example
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), ratelease::Error> {
//! use ratelease::{Decision, HybridLimiter, MemoryStore, Quota};
//!
//! let quota = Quota::per_second(500)?.with_burst(50)?;
//! let limiter = HybridLimiter::new("checkout", quota, MemoryStore::new())?;
//! limiter.acquire(1).await?;
//! match limiter.try_acquire(1)? {
//!     Decision::Allowed => { /* serve */ }
//!     Decision::Denied { retry_after } => { /* reject, Retry-After: retry_after */ }
//! }
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

// First: its `lua_script!` macro is used by the modules below.
#[macro_use]
mod lua;

pub mod algorithm;
mod builder_knobs;
mod clock;
pub mod concurrency;
pub mod config;
#[cfg(feature = "toml")]
pub mod config_file;
mod connect;
mod error;
pub mod failure;
#[cfg(feature = "http")]
pub mod http;
mod hybrid;
mod key;
pub mod keyed;
mod lease;
mod limiter;
pub mod lock;
#[cfg(feature = "tower")]
pub mod middleware;
mod protocol;
mod pure;
mod quota;
mod retry;
mod store;
pub mod telemetry;
mod time;
mod verdict;

pub use algorithm::token_bucket::QuotaSource;
pub use algorithm::{
    Algorithm, FIXED_WINDOW_LUA, LEAKY_BUCKET_LUA, SLIDING_WINDOW_LUA, TOKEN_BUCKET_LUA,
};
pub use clock::{Clock, FakeClock, MonotonicClock, TokioClock};
pub use concurrency::{
    ConcurrencyBuilder, ConcurrencyLimiter, ConcurrencyMode, ConcurrencyStats, ConcurrencyStore,
    Permit, CONCURRENCY_LUA, DEFAULT_HOLDER_TTL, DEFAULT_IDLE_RETURN,
};
pub use config::{Budget, ConfigStore, Unconfigured};
#[cfg(feature = "toml")]
pub use config_file::{
    AnyKeyedLimiter, AnyLimiter, ConcurrencySpec, ConfigFileError, KeyedSpec, LimiterSpec,
    Limiters, LimitersConfig, ParseError,
};
pub use error::{AcquireError, BuildError, Error, RedisFailure, StoreError};
pub use failure::FailurePolicy;
pub use hybrid::{HybridBuilder, HybridLimiter, HybridStats};
pub use key::MAX_NAME_LEN;
pub use keyed::{
    DefaultKeyHasher, KeyedHybridBuilder, KeyedHybridLimiter, KeyedRedisLimiter, KeyedStats,
    DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_KEYS, MAX_KEY_BYTES,
};
pub use lease::policy::{
    AdaptiveLease, CallContext, FixedLease, LeaseAsk, LeaseContext, LeasePolicy, LeaseTerms,
    MAX_AUTO_HORIZON, MIN_AUTO_HORIZON,
};
pub use limiter::{Decision, KeyRef, KeyedLimiter, Limiter, LocalAnswer};
pub use lock::{
    LockError, LockGuard, LockOwner, RedisLock, RedisLockBuilder, DEFAULT_LEASE,
    DEFAULT_LOCK_PREFIX, DEFAULT_POLL, LOCK_LUA,
};
pub use pure::{RedisLimiter, RedisLimiterBuilder};
pub use quota::{Quota, QuotaError, MAX_VALUE};
pub use store::{
    LeaseReply, LeaseRequest, LeaseStore, MemoryStore, NodeLease, NodeRelease, RedisStore,
    RedisStoreBuilder, ReleaseRequest, DEFAULT_CONFIG_REFRESH, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_PREFIX, DEFAULT_RESPONSE_TIMEOUT, LEASE_TIMEOUT_FACTOR,
};
pub use verdict::Verdict;

/// The README's examples, compiled as doctests (they use the `axum` and `toml` features).
#[cfg(all(doctest, feature = "axum", feature = "toml"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
