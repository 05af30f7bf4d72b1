//! A fleet-wide concurrency limit: at most `limit` permits held at once across every process
//! sharing a name (an instantaneous concurrency limit), with the slots of a crashed
//! process coming back after a ttl.
//!
//! ```no_run
//! # async fn demo(store: ratelease::RedisStore) -> Result<(), ratelease::Error> {
//! use std::time::Duration;
//! use ratelease::ConcurrencyLimiter;
//!
//! // At most 20 exports across the fleet; a crashed process's slots come back after 10 s.
//! let exports = ConcurrencyLimiter::builder("exports", 20, store)
//!     .ttl(Duration::from_secs(10))
//!     .build()?; // or .hybrid(4): lease 4 slots per store call, hand them out locally
//! let permit = exports.acquire(1).await?; // waits while the fleet is full
//! /* ... run the export ... */
//! drop(permit); // the slot goes back
//! if let Some(_permit) = exports.try_acquire_for(1, Duration::from_millis(100)).await? {
//!     /* ... */
//! }
//! # Ok(()) }
//! ```
//!
//! # Implementation details
//!
//! **Holders, not permits.** The store keeps one record per *holder* — one
//! [`ConcurrencyLimiter`] instance, i.e. one process, with a random 64-bit id — counting the
//! slots it holds, plus the fleet's total, under the limiter's `{hash tag}` with a suffix of
//! their own (`<prefix>{<name>}:conc`, `…:conc:expiry`), so a token bucket of the same name
//! is untouched. Each record has an expiry; every script call first reclaims the records whose
//! expiry has passed, so their slots come back lazily, with no sweeper. A live process renews
//! its record every third of the ttl from its one background task; a crashed one stops, and its
//! slots return one ttl after its last renewal — never sooner, never later (the call that
//! finds them expired reclaims them). This is what Redisson's `RSemaphore` lacks (a permit
//! taken by a process that dies is gone for good: redisson#2045, and issue 7's #4176 and
//! #7342); keeping one
//! record per process rather than per permit (as `RPermitExpirableSemaphore` does) makes a
//! renewal one call whatever the number of permits.
//!
//! **One protocol, two modes.** `lua/concurrency.lua` (and its Rust twin,
//! [`holders::step`]) has four operations: *acquire* between `min` and `want` slots (all or
//! nothing below `min`), *release* some of the holder's slots (never below zero, never another
//! holder's, each release number applied once), *sync* (renew, and set the holder's count), and
//! *peek*. [`ConcurrencyMode::Pure`] sends one acquire per [`ConcurrencyLimiter::acquire_now`]
//! (`min = want = n`); [`ConcurrencyMode::Hybrid`] leases a batch at once and hands the slots
//! out from a local lock-free pool (one atomic word), so a permit costs no store call; slots
//! come back to the pool on drop, the pool above one batch goes back to the store at once, and
//! all of it once no permit has been held for the idle time, or on shutdown.
//!
//! **Lost replies cannot leak slots for long.** A call whose reply is lost (a timeout, a
//! dropped connection, a cancelled future) may or may not have been applied. If an acquire was,
//! the store counts slots the process does not know it has — a leak that renewals would keep
//! alive for ever. So a renewal is a *sync*: the process sends the count it really claims, and
//! the store sets the record to it. Counting is made safe against acquires still in flight with
//! acquire sequence numbers: a sync carries the last number whose slots its count includes, and
//! is only applied if no acquire with a larger number got there first (pure mode also holds new
//! acquires back while it counts, so a sync is never refused for that; see `task.rs`). Release
//! numbers keep a release from being applied after a sync that already left its slots out.
//! A holder that believes it holds nothing stops renewing, so anything left over expires.
//!
//! **Dropping a permit** touches atomics only (see [`Permit`]): Drop cannot await, and a task
//! per drop would cost an allocation. Pure mode's background task sends one release for all the
//! permits dropped since its last one.
//!
//! **Waiting.** [`ConcurrencyLimiter::acquire`] is woken when a permit of its own process comes
//! back (hybrid: at once; pure: once the task has released it) and otherwise polls the store
//! with jittered back-off from 1 ms to 50 ms; waiters are not queued (first come, first served
//! at each attempt, as Redisson's non-fair semaphore).
//!
//! # Guarantees
//!
//! - While the store keeps its state and every live holder renews within its ttl, the slots
//!   held across the fleet never exceed the limit (all callers must use the same limit: each
//!   acquire is checked against the caller's own).
//! - A holder that stops calling (crash, `abort`) keeps its slots exactly one ttl after its
//!   last renewal or acquire.
//! - A holder that cannot renew stops handing out pooled slots (hybrid) at 90 % of the ttl;
//!   permits already handed out cannot be revoked, and are counted again by the first renewal
//!   that succeeds.
//! - State loss (a flushed or failed-over Redis that lost writes) loses the records: up to the
//!   slots held at that moment can be granted twice until those permits end; each holder
//!   re-registers what it holds at its next renewal.
//! - Permits admitted by the failure policy while the store fails are not recorded in it.
//!
//! Hybrid mode trades fairness for speed: a busy process keeps reusing its leased slots while
//! others wait. Use it when the limit is large compared with `processes × batch`.

mod builder;
/// The concurrency limit's Rust twin (it lives beside the other twins in [`crate::algorithm`]).
pub use crate::algorithm::holders;
mod limiter;
mod metrics;
mod permit;
mod stats;
mod store;
mod task;

#[cfg(feature = "toml")]
pub(crate) use builder::check_settings;
pub use builder::{ConcurrencyBuilder, ConcurrencyMode, DEFAULT_HOLDER_TTL, DEFAULT_IDLE_RETURN};
pub use limiter::ConcurrencyLimiter;
pub use permit::Permit;
pub use stats::ConcurrencyStats;
pub use store::{ConcurrencyStore, CONCURRENCY_LUA};
