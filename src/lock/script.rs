//! The lock script (`lua/lock.lua`, one script with three operations) and the keys it touches.
//!
//! Every key of one lock shares the hash tag of its name, as the limiter's keys do
//! ([`crate::key`]): `<prefix>{<name>}:lock` (the owner hash), `…:fence` (the fencing counter)
//! and the channel `…:unlock`. Scripts are sent with EVALSHA; redis-rs reloads them on NOSCRIPT.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::aio::ConnectionManager;

use super::error::LockError;
use super::owner::LockOwner;
use crate::key;

/// `lua/lock.lua`: acquire (or re-enter, returning the fencing token), release and extend.
pub const LOCK_LUA: &str = include_str!("../../lua/lock.lua");

static LOCK: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(LOCK_LUA));

/// The keys and channel of one lock.
#[derive(Debug, Clone)]
pub(crate) struct LockKeys {
    pub(crate) lock: String,
    pub(crate) fence: String,
    pub(crate) channel: String,
    /// The server the lock lives on (password elided), for error messages.
    pub(crate) server: Arc<str>,
}

impl LockKeys {
    /// Validates `name` and builds its keys under `prefix` (validated by the builder), on
    /// `server`.
    pub(crate) fn new(prefix: &str, name: &str, server: Arc<str>) -> Result<Self, LockError> {
        key::validate_name(name)?;
        let base = key::bucket_key(prefix, name);
        Ok(LockKeys {
            lock: format!("{base}:lock"),
            fence: format!("{base}:fence"),
            channel: format!("{base}:unlock"),
            server,
        })
    }

    /// `e`, located at this lock's server and key if it is a Redis error.
    pub(crate) fn locate(&self, e: LockError) -> LockError {
        match e {
            LockError::Redis(e) => LockError::Redis(e.at(&self.server, Some(&self.lock))),
            other => other,
        }
    }
}

/// What an acquisition attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// Acquired (or re-entered): the hold's fencing token and the re-entry count now.
    Acquired { fence: u64, count: u64 },
    /// Held by another owner, whose lease ends in this long (`None`: no expiry set).
    Held { ttl: Option<Duration> },
}

/// Runs one script invocation under `timeout`.
async fn invoke<T: redis::FromRedisValue>(
    conn: &ConnectionManager,
    invocation: &redis::ScriptInvocation<'_>,
    timeout: Duration,
) -> Result<T, LockError> {
    let mut conn = conn.clone();
    invocation.invoke_async(&mut conn).await.map_err(|e| {
        if e.is_timeout() {
            LockError::Timeout(timeout)
        } else {
            LockError::from(e)
        }
    })
}

fn lease_ms(lease: Duration) -> u128 {
    lease.as_millis().max(1)
}

pub(crate) async fn acquire(
    conn: &ConnectionManager,
    keys: &LockKeys,
    owner: &LockOwner,
    lease: Duration,
    timeout: Duration,
) -> Result<Attempt, LockError> {
    let mut inv = LOCK.key(&keys.lock);
    inv.key(&keys.fence)
        .arg("acquire")
        .arg(owner.field())
        .arg(lease_ms(lease).to_string());
    let reply: Vec<i64> = invoke(conn, &inv, timeout)
        .await
        .map_err(|e| keys.locate(e))?;
    match reply[..] {
        [1, fence, count] if fence > 0 && count > 0 => Ok(Attempt::Acquired {
            fence: fence as u64,
            count: count as u64,
        }),
        [0, pttl] => Ok(Attempt::Held {
            ttl: u64::try_from(pttl).ok().map(Duration::from_millis),
        }),
        _ => Err(LockError::BadReply(format!("lock acquire: {reply:?}"))),
    }
}

/// Releases one hold of the hold whose fencing token is `fence`: `Some(count left)`, or
/// `None` if `owner` does not hold the lock (or holds it in a later hold).
pub(crate) async fn release(
    conn: &ConnectionManager,
    keys: &LockKeys,
    owner: &LockOwner,
    fence: u64,
    lease: Duration,
    timeout: Duration,
) -> Result<Option<u64>, LockError> {
    let mut inv = LOCK.key(&keys.lock);
    inv.key(&keys.fence)
        .arg("release")
        .arg(owner.field())
        .arg(lease_ms(lease).to_string())
        .arg(&keys.channel)
        .arg(fence.to_string());
    let reply: i64 = invoke(conn, &inv, timeout)
        .await
        .map_err(|e| keys.locate(e))?;
    match reply {
        -1 => Ok(None),
        n if n >= 0 => Ok(Some(n as u64)),
        n => Err(LockError::BadReply(format!("lock release: {n}"))),
    }
}

/// Renews the lease of the hold whose fencing token is `fence`: whether `owner` still holds
/// the lock in it.
pub(crate) async fn extend(
    conn: &ConnectionManager,
    keys: &LockKeys,
    owner: &LockOwner,
    fence: u64,
    lease: Duration,
    timeout: Duration,
) -> Result<bool, LockError> {
    let mut inv = LOCK.key(&keys.lock);
    inv.key(&keys.fence)
        .arg("extend")
        .arg(owner.field())
        .arg(lease_ms(lease).to_string())
        .arg("")
        .arg(fence.to_string());
    let reply: i64 = invoke(conn, &inv, timeout)
        .await
        .map_err(|e| keys.locate(e))?;
    match reply {
        0 => Ok(false),
        1 => Ok(true),
        n => Err(LockError::BadReply(format!("lock extend: {n}"))),
    }
}
