//! Errors. Being limited is not an error: it is [`Decision::Denied`](crate::Decision::Denied).
//! Errors are for requests that can never succeed, broken configuration, and stores that fail.
//!
//! # Shape: one error type per kind of call
//!
//! A call returns the error type of its kind, whose variants are the failures that kind of call
//! can have, so a `match` on its result names no case that cannot happen:
//!
//! | calls | error | variants |
//! | --- | --- | --- |
//! | building: the limiters' `build` and `new`, a limiters file's `build`, [`RedisStore::connect`](crate::RedisStore::connect), [`Algorithm::from_name`](crate::Algorithm::from_name) | [`BuildError`] | `Config`, `NoRuntime`, `Store` (only a store's connect calls the store) |
//! | deciding: `try_acquire`, `acquire_now`, `acquire`, `try_acquire_for`, `try_acquire_or_lease`, `try_acquire_local`, `check`, `available_permits`, `ready`, keyed and concurrency calls, the [`Limiter`](crate::Limiter) and [`KeyedLimiter`](crate::KeyedLimiter) methods | [`AcquireError`] | `ZeroTokens`, `ExceedsBurst`, `ExceedsLimit`, `Config` (a pure-mode concurrency limiter's `try_acquire`), `Unconfigured`, `Closed`, `Store` |
//! | anything: the umbrella | [`Error`] | every variant of both, and `Quota` (from [`QuotaError`]) |
//!
//! Both convert into [`Error`] variant for variant (the same name, the same fields, the same
//! text), so `?` in a function returning `Result<_, ratelease::Error>`, `Box<dyn Error>` or
//! `anyhow::Result` works across all of them, and a `match` on an [`Error`] keeps working after
//! the conversion. The setup errors of the optional layers convert too, each into `Config`
//! with its text as the message: the HTTP layer's `InvalidProxy` (`TrustedProxies::new`) and
//! `InvalidPolicyName` (`LimitLayer::policy_name`), feature `http`, and a limiters file's
//! `ConfigFileError`, feature `toml` (the impls live beside those types: this module imports
//! nothing above it). [`StoreError`] is what a store call returns; it reaches callers inside
//! the `Store` variants.
//!
//! # Text
//!
//! Every error's `Display` is one line that says what failed and why: the Redis server (its URL
//! with the password elided) and the key of the call, the offending field or value. Each text is
//! written once (in `text` below) and shared by the variants of every type that can report it.
//! A wrapping variant prints what it wraps and does not return it again from `source()`, so a
//! chain printer (anyhow's `{:#}`, eyre's report: each `source()` joined with ": ") prints each
//! fact once. What is kept out of the text: passwords, and Redis's own cause chain beyond its
//! message.

use std::sync::Arc;
use std::time::Duration;

use crate::quota::QuotaError;

/// What building a limiter or connecting a store can fail with: invalid settings, no tokio
/// runtime to run on, or (only [`RedisStore::connect`](crate::RedisStore::connect) calls the
/// store) a store that cannot be reached. A limiter's build never calls its store, and a
/// [`Quota`](crate::Quota) is valid by construction, so neither is a build's failure.
/// Converts into [`Error`] (`?` works), variant for variant.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A setting is invalid: a bad name, prefix, URL or TLS PEM, an algorithm the limiter
    /// cannot run or a quota it cannot run under (a window whose burst is not its rate),
    /// lease or concurrency settings out of range.
    #[error(fmt = text::config)]
    Config(String),
    /// A limiter that runs a background task (hybrid, keyed hybrid, concurrency) was built
    /// outside a tokio runtime, and no runtime handle was given to its builder's `runtime`.
    #[error(fmt = text::no_runtime)]
    NoRuntime,
    /// Connecting the store failed (never with `lazy_connect`).
    #[error(fmt = text::store)]
    Store(StoreError),
}

/// What a decision can fail with: a request that can never succeed, a limiter that cannot
/// answer (shut down, or refusing an unconfigured name), or a store that failed while no
/// [`FailurePolicy`](crate::FailurePolicy) answers for it. Returned by every call that takes
/// tokens or permits, or reads what is left, and by the [`Limiter`](crate::Limiter) and
/// [`KeyedLimiter`](crate::KeyedLimiter) traits. Converts into [`Error`] (`?` works), variant
/// for variant.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum AcquireError {
    /// The call asked for zero tokens (or permits).
    #[error(fmt = text::zero_tokens)]
    ZeroTokens,
    /// The call asked for more tokens than the bucket can ever hold (the quota's burst, or a
    /// central config's); waiting would not help.
    #[error(fmt = text::exceeds_burst)]
    ExceedsBurst {
        /// Tokens asked for.
        requested: u64,
        /// The burst in force.
        burst: u64,
    },
    /// The call asked a [`ConcurrencyLimiter`](crate::ConcurrencyLimiter) for more permits than
    /// its limit; waiting would not help.
    #[error(fmt = text::exceeds_limit)]
    ExceedsLimit {
        /// Permits asked for.
        requested: u64,
        /// The limit.
        limit: u64,
    },
    /// The call does not fit the limiter's configuration: the synchronous `try_acquire` of a
    /// pure-mode [`ConcurrencyLimiter`](crate::ConcurrencyLimiter), which keeps no local pool.
    #[error(fmt = text::config)]
    Config(String),
    /// The name has no quota stored centrally and the limiter was built to refuse such names
    /// ([`Unconfigured::Error`](crate::Unconfigured::Error)). Store one with
    /// [`ConfigStore::init_config`](crate::ConfigStore::init_config), or build the limiter
    /// with another [`Unconfigured`](crate::Unconfigured).
    #[error(fmt = text::unconfigured)]
    Unconfigured(String),
    /// The limiter was shut down.
    #[error(fmt = text::closed)]
    Closed,
    /// The store failed, and no failure policy answered for it.
    #[error(fmt = text::store)]
    Store(StoreError),
}

impl AcquireError {
    /// This error without the Redis key it happened at, for a log line: a keyed limiter's
    /// key holds the caller's key (an API key, say), which the error's text shows.
    // Read by the HTTP layer's log lines only.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn without_key(&self) -> Self {
        match self {
            AcquireError::Store(e) => AcquireError::Store(e.without_key()),
            other => other.clone(),
        }
    }
}

/// Any error of this crate's limiters: what a [`BuildError`] or an [`AcquireError`] converts
/// into (each variant into its namesake), an invalid [`Quota`](crate::Quota)'s
/// [`QuotaError`], and the HTTP layer's and a limiters file's setup errors (into `Config`).
/// For code that mixes calls of every kind under one `?`.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// From a decision: [`AcquireError::ZeroTokens`].
    #[error(fmt = text::zero_tokens)]
    ZeroTokens,
    /// From a decision: [`AcquireError::ExceedsBurst`].
    #[error(fmt = text::exceeds_burst)]
    ExceedsBurst {
        /// Tokens requested.
        requested: u64,
        /// The quota's burst.
        burst: u64,
    },
    /// From a decision: [`AcquireError::ExceedsLimit`].
    #[error(fmt = text::exceeds_limit)]
    ExceedsLimit {
        /// Permits requested.
        requested: u64,
        /// The concurrency limit.
        limit: u64,
    },
    /// The quota is invalid (a [`QuotaError`] under `?`).
    #[error(fmt = text::quota)]
    Quota(QuotaError),
    /// From a build ([`BuildError::Config`]) or a decision ([`AcquireError::Config`]); also
    /// from the optional layers' setup errors, their text the message: the HTTP layer's
    /// `InvalidProxy` and `InvalidPolicyName` (feature `http`), a limiters file's
    /// `ConfigFileError` (feature `toml`).
    #[error(fmt = text::config)]
    Config(String),
    /// From a build: [`BuildError::NoRuntime`].
    #[error(fmt = text::no_runtime)]
    NoRuntime,
    /// From a decision: [`AcquireError::Unconfigured`].
    #[error(fmt = text::unconfigured)]
    Unconfigured(String),
    /// From a decision: [`AcquireError::Closed`].
    #[error(fmt = text::closed)]
    Closed,
    /// From a store's connect ([`BuildError::Store`]) or a decision ([`AcquireError::Store`]).
    #[error(fmt = text::store)]
    Store(StoreError),
}

/// The text of each failure, written once for every type that reports it.
mod text {
    use std::fmt::{Display, Formatter, Result};

    pub(super) fn zero_tokens(f: &mut Formatter<'_>) -> Result {
        f.write_str("cannot acquire zero tokens")
    }

    pub(super) fn exceeds_burst(requested: &u64, burst: &u64, f: &mut Formatter<'_>) -> Result {
        write!(
            f,
            "requested {requested} tokens but the burst is {burst}: this can never succeed"
        )
    }

    pub(super) fn exceeds_limit(requested: &u64, limit: &u64, f: &mut Formatter<'_>) -> Result {
        write!(
            f,
            "requested {requested} permits but the concurrency limit is {limit}: this can never \
             succeed"
        )
    }

    pub(super) fn quota(e: &impl Display, f: &mut Formatter<'_>) -> Result {
        write!(f, "invalid quota: {e}")
    }

    pub(super) fn config(message: &impl Display, f: &mut Formatter<'_>) -> Result {
        write!(f, "invalid configuration: {message}")
    }

    pub(super) fn no_runtime(f: &mut Formatter<'_>) -> Result {
        f.write_str(
            "this limiter runs a background task and needs a tokio runtime: build it inside one, \
             or pass a handle to its builder's .runtime(handle)",
        )
    }

    pub(super) fn unconfigured(name: &impl std::fmt::Debug, f: &mut Formatter<'_>) -> Result {
        write!(
            f,
            "no quota is configured for limiter {name:?}: store one with \
             ConfigStore::init_config, or build the limiter with \
             .if_unconfigured(Unconfigured::UseQuota) to run under its own quota"
        )
    }

    pub(super) fn closed(f: &mut Formatter<'_>) -> Result {
        f.write_str("the limiter has shut down")
    }

    pub(super) fn store(e: &impl Display, f: &mut Formatter<'_>) -> Result {
        write!(f, "store failed: {e}")
    }
}

/// `impl From<$from> for Error`, each listed variant of `$from` into its namesake; the match is
/// exhaustive, so a variant added to `$from` must be listed here.
macro_rules! into_error {
    ($from:ident: $($variant:ident $(($value:ident))? $({ $($field:ident),* })?),* $(,)?) => {
        impl From<$from> for Error {
            fn from(e: $from) -> Self {
                match e {
                    $($from::$variant $(($value))? $({ $($field),* })?
                        => Error::$variant $(($value))? $({ $($field),* })?,)*
                }
            }
        }
    };
}

into_error!(BuildError: Config(message), NoRuntime, Store(e));
into_error!(AcquireError:
    ZeroTokens,
    ExceedsBurst { requested, burst },
    ExceedsLimit { requested, limit },
    Config(message),
    Unconfigured(name),
    Closed,
    Store(e),
);

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

impl From<StoreError> for BuildError {
    fn from(e: StoreError) -> Self {
        BuildError::Store(e)
    }
}

impl From<StoreError> for AcquireError {
    fn from(e: StoreError) -> Self {
        AcquireError::Store(e)
    }
}

/// An error from a [`LeaseStore`](crate::LeaseStore).
#[derive(Debug, Clone, thiserror::Error)]
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
    /// The store answered something that is not a valid reply: of another type than the
    /// script's, a negative count, values out of range.
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
/// (key <key>): <redis's message>` (its lines joined with "; "; a reply that could not be read
/// outside a call asks whether this is a Redis server's port); the redis-rs error itself is [`redis_error`](Self::redis_error)
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

    /// This failure without the key it happened at (see [`AcquireError::without_key`]).
    // Read by the HTTP layer's log lines only.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    fn without_key(&self) -> Self {
        RedisFailure {
            key: None,
            ..self.clone()
        }
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
        // One line, whatever redis-rs's message holds (a parser's lists the bytes it met, one
        // per line).
        let message = self.error.to_string();
        let mut lines = message.lines().map(str::trim).filter(|l| !l.is_empty());
        write!(f, ": {}", lines.next().unwrap_or_default())?;
        for line in lines {
            write!(f, "; {line}")?;
        }
        // A reply this client could not read, outside any limiter's call (a connect, its
        // handshake): most likely not a Redis server. (A call's reply of an unexpected type is
        // a parse error too, but has a key.)
        if self.error.kind() == redis::ErrorKind::Parse && self.key.is_none() {
            write!(
                f,
                " (a reply this client could not read: is this a Redis server's port?)"
            )?;
        }
        Ok(())
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

    /// This error without the key it happened at (see [`AcquireError::without_key`]).
    // Read by the HTTP layer's log lines only.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    fn without_key(&self) -> Self {
        match self {
            StoreError::Redis(e) => StoreError::Redis(e.without_key()),
            other => other.clone(),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A keyed limiter's Redis key holds the caller's key (an API key): the HTTP layer's
    /// operator warning prints the error without it, and keeps the rest.
    #[test]
    fn an_error_without_its_key_keeps_the_server_and_the_message() {
        let redis =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let server: Arc<str> = Arc::from("127.0.0.1:6379");
        let error =
            AcquireError::Store(StoreError::from(redis).at(&server, Some("rl:{api#sk_live_123}")));
        assert!(error.to_string().contains("sk_live_123"), "{error}");
        let shown = error.without_key().to_string();
        assert!(!shown.contains("sk_live_123"), "{shown}");
        assert!(shown.contains("redis at 127.0.0.1:6379"), "{shown}");
        assert_eq!(
            shown,
            error.to_string().replace(" (key rl:{api#sk_live_123})", "")
        );
    }

    /// Each text as it read before errors were shaped by call, and the same under every type
    /// that reports it.
    #[test]
    fn every_variant_prints_its_one_text_under_each_type() {
        let store = || StoreError::Timeout(Duration::from_millis(5));
        let acquire = [
            (AcquireError::ZeroTokens, "cannot acquire zero tokens"),
            (
                AcquireError::ExceedsBurst {
                    requested: 7,
                    burst: 5,
                },
                "requested 7 tokens but the burst is 5: this can never succeed",
            ),
            (
                AcquireError::ExceedsLimit {
                    requested: 7,
                    limit: 5,
                },
                "requested 7 permits but the concurrency limit is 5: this can never succeed",
            ),
            (AcquireError::Config("x".into()), "invalid configuration: x"),
            (
                AcquireError::Unconfigured("api".into()),
                "no quota is configured for limiter \"api\": store one with \
                 ConfigStore::init_config, or build the limiter with \
                 .if_unconfigured(Unconfigured::UseQuota) to run under its own quota",
            ),
            (AcquireError::Closed, "the limiter has shut down"),
            (
                AcquireError::Store(store()),
                "store failed: store call timed out after 5ms",
            ),
        ];
        for (e, text) in acquire {
            assert_eq!(e.to_string(), text);
            assert_eq!(Error::from(e).to_string(), text);
        }
        let build = [
            (BuildError::Config("x".into()), "invalid configuration: x"),
            (
                BuildError::NoRuntime,
                "this limiter runs a background task and needs a tokio runtime: build it \
                 inside one, or pass a handle to its builder's .runtime(handle)",
            ),
            (
                BuildError::Store(store()),
                "store failed: store call timed out after 5ms",
            ),
        ];
        for (e, text) in build {
            assert_eq!(e.to_string(), text);
            assert_eq!(Error::from(e).to_string(), text);
        }
        let quota = Error::from(QuotaError::ZeroRate);
        assert!(quota.to_string().starts_with("invalid quota: "), "{quota}");
        // A wrapping variant prints what it wraps and does not return it again.
        use std::error::Error as _;
        assert!(Error::from(store()).source().is_none());
        assert!(AcquireError::Store(store()).source().is_none());
        assert!(BuildError::Store(store()).source().is_none());
    }
}
