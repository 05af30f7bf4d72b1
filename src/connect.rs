//! Opening a Redis connection with explicit timeouts: one piece for every Redis-backed type
//! ([`RedisStore`](crate::RedisStore), [`RedisLock`](crate::RedisLock)).
//!
//! [`Connection`] is what every script call is sent on: either one server through redis-rs's
//! `ConnectionManager`, or (feature `cluster`) a Redis Cluster through redis-rs's cluster
//! connection. Both implement redis-rs's `aio::ConnectionLike`, so the script path above
//! (`RedisStore::eval`, EVALSHA with NOSCRIPT reload) is the same for both; the cluster
//! connection routes each EVALSHA by the slot of its keys, follows MOVED/ASK redirections and
//! retries TRYAGAIN while a slot migrates, and sends `SCRIPT LOAD` to every primary.
//!
//! The `ConnectionManager` reconnects in the background and returns the error of a failed
//! command to its caller without retrying; each type owns what happens next. Both timeouts are
//! always set: without them a hung server would hold a caller for as long as TCP allows. On a
//! cluster the response timeout bounds a whole request, redirections and retries included.
//!
//! With feature `tls`, `rediss://` URLs are served by rustls; [`ConnectSettings::tls_root`]
//! trusts a private CA instead of the system's roots.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

/// Why a connection could not be opened.
pub(crate) enum ConnectError {
    /// The URL does not parse; the message says why.
    Url(String),
    /// Redis could not be reached in time.
    Redis(redis::RedisError),
}

/// What every connection of one builder is opened with.
#[derive(Clone, Debug)]
pub(crate) struct ConnectSettings {
    /// Time allowed to open a connection (per node on a cluster).
    pub(crate) connect_timeout: Duration,
    /// Time allowed for one reply (one whole request on a cluster).
    pub(crate) response_timeout: Duration,
    /// PEM root certificate(s) trusted for `rediss://` instead of the system's roots.
    #[cfg(feature = "tls")]
    pub(crate) tls_root: Option<Vec<u8>>,
}

impl ConnectSettings {
    /// Settings with these timeouts and the system's TLS roots.
    pub(crate) fn new(connect_timeout: Duration, response_timeout: Duration) -> Self {
        ConnectSettings {
            connect_timeout,
            response_timeout,
            #[cfg(feature = "tls")]
            tls_root: None,
        }
    }

    #[cfg(feature = "tls")]
    fn certificates(&self) -> Option<redis::TlsCertificates> {
        self.tls_root.as_ref().map(|pem| redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem.clone()),
        })
    }

    /// A client for `url`, trusting [`tls_root`](Self::tls_root) if set.
    pub(crate) fn client(&self, url: &str) -> Result<redis::Client, ConnectError> {
        #[cfg(feature = "tls")]
        let client = match self.certificates() {
            Some(certs) => redis::Client::build_with_tls(url, certs),
            None => redis::Client::open(url),
        };
        #[cfg(not(feature = "tls"))]
        let client = redis::Client::open(url);
        client.map_err(|e| ConnectError::Url(format!("invalid redis url {url:?}: {e}")))
    }
}

/// The connection script calls are sent on: one server or a cluster. Cheap to clone; clones
/// share the underlying connection(s).
#[derive(Clone)]
pub(crate) enum Connection {
    /// One Redis server.
    Single(ConnectionManager),
    /// A Redis Cluster.
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl redis::aio::ConnectionLike for Connection {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Connection::Single(c) => c.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "cluster")]
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            #[cfg(feature = "cluster")]
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

/// A client for `url` and a connection manager on it.
pub(crate) async fn connection_manager(
    url: &str,
    settings: &ConnectSettings,
) -> Result<(redis::Client, ConnectionManager), ConnectError> {
    let client = settings.client(url)?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(settings.connect_timeout))
        .set_response_timeout(Some(settings.response_timeout))
        .set_number_of_retries(1);
    let conn = ConnectionManager::new_with_config(client.clone(), config)
        .await
        .map_err(ConnectError::Redis)?;
    Ok((client, conn))
}

/// A connection to the cluster that `nodes` (URLs of some of its nodes) belong to.
#[cfg(feature = "cluster")]
pub(crate) async fn cluster_connection(
    nodes: &[String],
    settings: &ConnectSettings,
) -> Result<Connection, ConnectError> {
    if nodes.is_empty() {
        return Err(ConnectError::Url(
            "a cluster needs at least one node url".into(),
        ));
    }
    #[allow(unused_mut)] // mutated only with feature `tls`
    let mut builder = redis::cluster::ClusterClientBuilder::new(nodes.iter().map(String::as_str))
        .connection_timeout(settings.connect_timeout)
        // Also the bound on a whole request, MOVED/ASK redirections and TRYAGAIN retries
        // included.
        .response_timeout(settings.response_timeout);
    #[cfg(feature = "tls")]
    if let Some(certs) = settings.certificates() {
        builder = builder.certs(certs);
    }
    let client = builder
        .build()
        .map_err(|e| ConnectError::Url(format!("invalid cluster nodes {nodes:?}: {e}")))?;
    let conn = client
        .get_async_connection()
        .await
        .map_err(ConnectError::Redis)?;
    Ok(Connection::Cluster(conn))
}
