//! [`LockError`]: what can go wrong with a [`RedisLock`](super::RedisLock).
//!
//! Not getting the lock is not an error: `try_lock` answers `Ok(None)`. Errors are for bad
//! configuration, a Redis that fails or does not answer, and releasing a lock that is no longer
//! held.

use std::time::Duration;

use thiserror::Error;

use crate::error::RedisFailure;

/// An error from a [`RedisLock`](super::RedisLock) or a [`LockGuard`](super::LockGuard).
#[derive(Debug, Clone, Error)]
#[non_exhaustive]
pub enum LockError {
    /// The configuration is invalid: empty or too long name, braces in the prefix, zero lease
    /// or poll interval, bad URL.
    #[error("invalid lock configuration: {0}")]
    Config(String),
    /// Redis returned an error or could not be reached.
    #[error("{0}")]
    Redis(RedisFailure),
    /// No answer within the configured response (or connect) timeout.
    #[error("lock call timed out after {0:?}")]
    Timeout(Duration),
    /// A lock script refused its arguments (a `RATELEASE …` error reply).
    #[error("lock script rejected the call: {0}")]
    Rejected(String),
    /// The Redis user's ACL does not allow the call; nothing was changed.
    #[error("redis ACL denied the lock call: {0}")]
    NoPermission(String),
    /// Redis answered something that is not a valid reply of the script.
    #[error("unexpected reply from a lock script: {0}")]
    BadReply(String),
    /// The owner released a lock it does not hold any more: its lease expired (and someone
    /// else may have taken the lock meanwhile). Nothing was changed in Redis.
    #[error("lock {name:?} is not held by {owner}: its lease expired")]
    NotHeld {
        /// The lock's name.
        name: String,
        /// The owner that tried to release it.
        owner: String,
    },
}

impl From<redis::RedisError> for LockError {
    fn from(e: redis::RedisError) -> Self {
        if e.code() == Some("RATELEASE") {
            return LockError::Rejected(e.detail().unwrap_or_default().to_string());
        }
        if let Some(detail) = crate::error::acl_denial(&e) {
            return LockError::NoPermission(detail);
        }
        LockError::Redis(RedisFailure::new(e))
    }
}

impl From<crate::error::Error> for LockError {
    fn from(e: crate::error::Error) -> Self {
        match e {
            crate::error::Error::Config(msg) => LockError::Config(msg),
            other => LockError::Config(other.to_string()),
        }
    }
}

/// A lock checks its name and prefix as a limiter's build does.
impl From<crate::error::BuildError> for LockError {
    fn from(e: crate::error::BuildError) -> Self {
        LockError::from(crate::error::Error::from(e))
    }
}
