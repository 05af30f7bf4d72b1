//! Errors. Being limited is not an error: it is [`Decision::Denied`](crate::Decision::Denied).
//! Errors are for requests that can never succeed, broken configuration, and stores that fail.
//!
//! Every error's `Display` is one line that says what failed and why: the Redis server (its URL
//! with the password elided) and the key of the call, the offending field or value. A wrapping
//! variant prints what it wraps and does not return it again from `source()`, so a chain
//! printer (anyhow's `{:#}`, eyre's report: each `source()` joined with ": ") prints each fact
//! once. What is kept out of the text: passwords, and Redis's own cause chain beyond its
//! message.

use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

use crate::quota::QuotaError;

/// An error from a limiter.
#[derive(Debug, Clone, Error)]
#[non_exhaustive]
pub enum Error {
    /// Asked for zero tokens.
    #[error("cannot acquire zero tokens")]
    ZeroTokens,
    /// Asked for more tokens than the bucket can ever hold; waiting would not help.
    #[error("requested {requested} tokens but the burst is {burst}: this can never succeed")]
    ExceedsBurst {
        /// Tokens requested.
        requested: u64,
        /// The quota's burst.
        burst: u64,
    },
    /// Asked for more permits than a concurrency limit allows at once; waiting would not help.
    #[error("requested {requested} permits but the concurrency limit is {limit}: this can never succeed")]
    ExceedsLimit {
        /// Permits requested.
        requested: u64,
        /// The concurrency limit.
        limit: u64,
    },
    /// The quota is invalid.
    #[error("invalid quota: {0}")]
    Quota(QuotaError),
    /// The limiter configuration is invalid (bad name, prefix, or lease settings).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The limiter was built outside a tokio runtime and none was given.
    #[error("a HybridLimiter needs a tokio runtime: build it inside one or pass a runtime handle")]
    NoRuntime,
    /// The name has no quota stored centrally and the limiter was built to refuse such names
    /// ([`Unconfigured::Error`](crate::Unconfigured::Error)).
    #[error("no quota is configured for limiter {0:?}")]
    Unconfigured(String),
    /// The limiter was shut down.
    #[error("the limiter has shut down")]
    Closed,
    /// The store failed.
    #[error("store failed: {0}")]
    Store(StoreError),
}

impl From<QuotaError> for Error {
    fn from(e: QuotaError) -> Self {
        Error::Quota(e)
    }
}

impl From<StoreError> for Error {
    fn from(e: StoreError) -> Self {
        Error::Store(e)
    }
}

/// An error from a [`LeaseStore`](crate::LeaseStore).
#[derive(Debug, Clone, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Redis returned an error or could not be reached.
    #[error("{0}")]
    Redis(RedisFailure),
    /// No answer within the configured response timeout.
    #[error("store call timed out after {0:?}")]
    Timeout(Duration),
    /// The script refused its arguments (`RATELEASE …` error reply).
    #[error("script rejected the call: {0}")]
    Rejected(String),
    /// The store answered something that is not a valid reply.
    #[error("unexpected reply from store: {0}")]
    BadReply(String),
    /// The Redis user's ACL does not allow the call (a key outside its patterns, or a command
    /// the script runs); nothing was changed. See RELIABILITY.md, "Security".
    #[error("redis ACL denied the call: {0}")]
    NoPermission(String),
}

impl StoreError {
    /// Whether this is an outage — Redis could not be reached, failed the call, or did not
    /// answer in time — which a [`FailurePolicy`](crate::FailurePolicy) answers for. ACL
    /// denials and rejected or malformed replies are not: the store answered, and retrying
    /// will not help.
    pub fn is_outage(&self) -> bool {
        matches!(self, StoreError::Redis(_) | StoreError::Timeout(_))
    }
}

/// The message of an ACL denial, if `e` is one: `NOPERM …` for a command or key the user may
/// not use, or Redis 7's `ERR The user executing the script can't run this command …` for a
/// command called inside a script.
pub(crate) fn acl_denial(e: &redis::RedisError) -> Option<String> {
    let detail = e.detail().unwrap_or_default();
    let denied = e.code() == Some("NOPERM")
        || (e.code() == Some("ERR") && detail.starts_with("The user executing the script"));
    denied.then(|| detail.to_string())
}

/// An error from Redis, with where it happened: the server (its URL with the password
/// elided) and the key of the call, when known. `Display` is one line: `redis at <server>
/// (key <key>): <redis's message>`; the redis-rs error itself is [`redis_error`](Self::redis_error)
/// (and reachable through `Deref`), not a `source()`, as its message is already in the line.
#[derive(Debug, Clone)]
pub struct RedisFailure {
    error: Arc<redis::RedisError>,
    server: Option<Arc<str>>,
    key: Option<String>,
}

impl RedisFailure {
    /// `error`, from no server in particular.
    pub fn new(error: redis::RedisError) -> Self {
        RedisFailure {
            error: Arc::new(error),
            server: None,
            key: None,
        }
    }

    /// The same failure, at `server` (a description, its password already elided) and `key`.
    pub(crate) fn at(mut self, server: &Arc<str>, key: Option<&str>) -> Self {
        self.server = Some(server.clone());
        self.key = key.map(str::to_owned);
        self
    }

    /// The server the call went to (URL with the password elided), if known.
    pub fn server(&self) -> Option<&str> {
        self.server.as_deref()
    }

    /// The key of the call (it names the limiter), if known.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// The redis-rs error.
    pub fn redis_error(&self) -> &redis::RedisError {
        &self.error
    }
}

impl std::ops::Deref for RedisFailure {
    type Target = redis::RedisError;

    fn deref(&self) -> &redis::RedisError {
        &self.error
    }
}

impl std::fmt::Display for RedisFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.server {
            Some(server) => write!(f, "redis at {server}")?,
            None => write!(f, "redis")?,
        }
        if let Some(key) = &self.key {
            write!(f, " (key {key})")?;
        }
        write!(f, ": {}", self.error)
    }
}

impl StoreError {
    /// The same error, located at `server` and `key` if it is a Redis error.
    pub(crate) fn at(self, server: &Arc<str>, key: Option<&str>) -> Self {
        match self {
            StoreError::Redis(e) => StoreError::Redis(e.at(server, key)),
            other => other,
        }
    }
}

impl From<redis::RedisError> for StoreError {
    fn from(e: redis::RedisError) -> Self {
        if e.code() == Some("RATELEASE") {
            let detail = e.detail().unwrap_or_default().to_string();
            return StoreError::Rejected(detail);
        }
        if let Some(detail) = acl_denial(&e) {
            return StoreError::NoPermission(detail);
        }
        StoreError::Redis(RedisFailure::new(e))
    }
}
