//! Opening a Redis connection with explicit timeouts: one piece for every Redis-backed type
//! ([`RedisStore`](crate::RedisStore), [`RedisLock`](crate::RedisLock)).
//!
//! redis-rs's `ConnectionManager` reconnects in the background and returns the error of a failed
//! command to its caller without retrying; each type owns what happens next. Both timeouts are
//! always set: without them a hung server would hold a caller for as long as TCP allows.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

/// Why a connection could not be opened.
pub(crate) enum ConnectError {
    /// The URL does not parse; the message says why.
    Url(String),
    /// Redis could not be reached in time.
    Redis(redis::RedisError),
}

/// A client for `url` and a connection manager on it.
pub(crate) async fn connection_manager(
    url: &str,
    connect_timeout: Duration,
    response_timeout: Duration,
) -> Result<(redis::Client, ConnectionManager), ConnectError> {
    let client = redis::Client::open(url)
        .map_err(|e| ConnectError::Url(format!("invalid redis url {url:?}: {e}")))?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(connect_timeout))
        .set_response_timeout(Some(response_timeout))
        .set_number_of_retries(1);
    let conn = ConnectionManager::new_with_config(client.clone(), config)
        .await
        .map_err(ConnectError::Redis)?;
    Ok((client, conn))
}
