//! A re-entrant distributed lock in Redis, after Redisson's `RLock`.
//!
//! # Design
//!
//! **One hash per lock.** `<prefix>{<name>}:lock` maps each owner to its re-entry count, as
//! Redisson does; a lock is held while the hash exists, and only by the owner found in it. The
//! hash carries a `PEXPIRE` lease, so a holder that dies loses the lock after one lease time.
//! Every key of a lock shares the `{name}` hash tag, so each script touches one cluster slot.
//!
//! **Owners are explicit.** Redisson identifies an owner by client id and thread id; tokio tasks
//! move between threads, so here an owner is a [`LockOwner`]: the random process id of the
//! [`RedisLock`] handle plus a task id the caller picks or draws ([`RedisLock::new_owner`]).
//!
//! **One script** (`lua/lock.lua`), three atomic operations (like the token bucket's script,
//! one file validates the arguments once for all of them):
//!
//! - *acquire*: if the hash does not exist, `INCR` the fencing counter `…:fence`, create the hash
//!   with `owner = 1` and the token, set the lease. If the owner is already in it, count up and
//!   renew the lease (re-entry). Otherwise answer the remaining lease of the holder.
//! - *release*: only an owner found in the hash may release; its count goes down by one, and at
//!   zero the hash is deleted and a message is `PUBLISH`ed on `…:unlock`. A holder whose lease
//!   expired finds itself absent and changes nothing — unlike a plain `DEL` (the common lock recipe),
//!   which lets one holder delete another's lock. A guard names its hold by its fencing token,
//!   so one whose hold expired does not release the same owner's later hold either.
//! - *extend*: renew the lease if the owner still holds the lock in the guard's hold (the
//!   watchdog).
//!
//! Scripts check their arguments and answer `RATELEASE …` error replies ([`LockError::Rejected`]),
//! never Lua runtime errors.
//!
//! **Fencing tokens.** A lease can run out under a holder that is paused (GC, swap, a stalled
//! network) while it still believes it holds the lock; no lock alone can prevent that. Each
//! first acquisition therefore takes a fresh value of a counter that never expires, strictly
//! greater than every earlier one ([`LockGuard::fencing_token`]); a downstream store that
//! rejects writes with a token smaller than the largest it has seen is safe from stale holders.
//!
//! **Waiting.** [`RedisLock::lock`] and [`RedisLock::try_lock_for`] subscribe to the unlock
//! channel (one pub/sub connection per waiting call), then retry whenever a release is
//! published, when the holder's lease should have run out, or every poll interval — the poll
//! only matters if a message is lost or the subscription cannot be made. Waiters are not queued:
//! whoever retries first after a release wins, as in Redisson's non-fair lock.
//!
//! **The guard.** Each acquisition returns a [`LockGuard`] whose watchdog renews the lease every
//! third of it while the guard lives (and reports a lost lease: [`LockGuard::lease_lost`]), and
//! which releases one hold when dropped or when [`LockGuard::unlock`] is awaited.

mod error;
mod guard;
mod owner;
mod redis_lock;
mod script;

pub use error::LockError;
pub use guard::LockGuard;
pub use owner::LockOwner;
pub use redis_lock::{
    RedisLock, RedisLockBuilder, DEFAULT_LEASE, DEFAULT_LOCK_PREFIX, DEFAULT_POLL,
};
pub use script::LOCK_LUA;
