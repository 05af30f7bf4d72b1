//! Opening a Redis connection with explicit timeouts: one piece for every Redis-backed type
//! ([`RedisStore`](crate::RedisStore), [`RedisLock`](crate::RedisLock)).
//!
//! [`Connection`] is what every script call is sent on: one server through redis-rs's
//! `ConnectionManager`, (feature `cluster`) a Redis Cluster through redis-rs's cluster
//! connection, or the master of a Sentinel-managed group, followed across failovers
//! ([`SentinelConnection`], `src/connect/sentinel.rs`). All implement redis-rs's
//! `aio::ConnectionLike`, so the script path above
//! (`RedisStore::eval`, EVALSHA with NOSCRIPT reload) is the same for all; the cluster
//! connection routes each EVALSHA by the slot of its keys, follows MOVED/ASK redirections and
//! retries TRYAGAIN while a slot migrates, and sends `SCRIPT LOAD` to every primary.
//!
//! The `ConnectionManager` reconnects in the background and returns the error of a failed
//! command to its caller without retrying; each type owns what happens next. Both timeouts are
//! always set: without them a hung server would hold a caller for as long as TCP allows. On a
//! cluster the response timeout bounds a whole request, redirections and retries included.
//!
//! With feature `tls`, `rediss://` URLs are served by rustls; [`ConnectSettings::tls_root`]
//! trusts a private CA instead of the system's roots, and [`ConnectSettings::tls_client`] is the
//! client's own certificate and key for a server that requires one (mutual TLS,
//! `tls-auth-clients yes`).
//!
//! A *lazy* connection ([`ConnectSettings::lazy`]) is created without contacting Redis: the
//! `ConnectionManager` is built with `new_lazy_with_config`, its first command opens the
//! connection, and while Redis is unreachable each command fails with the connect error after
//! at most two attempts (one retry: a back-off of 10–20 ms; about 15 ms for a refused
//! connection) instead of waiting — or, where the host does not answer, with a timeout once
//! the store's bound on the call (its timeout plus the connect timeout) runs out. This is
//! what lets a service start while Redis is down: the store exists, the limiters' failure
//! policy answers, and the first command after Redis appears connects.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

mod sentinel;

pub(crate) use sentinel::SentinelConnection;

/// Why a connection could not be opened.
pub(crate) enum ConnectError {
    /// The settings are invalid (a URL that does not parse, a zero timeout, unusable TLS
    /// material); the message says why.
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
    /// Time allowed for a reply to a call no caller waits on (a node's lease), if longer; the
    /// connection is opened with the longer of the two, and calls with the response timeout
    /// are bounded by it on top.
    pub(crate) lease_timeout: Option<Duration>,
    /// Create the connection without contacting Redis; the first command opens it.
    pub(crate) lazy: bool,
    /// PEM root certificate(s) trusted for `rediss://` instead of the system's roots.
    #[cfg(feature = "tls")]
    pub(crate) tls_root: Option<Vec<u8>>,
    /// The client's PEM certificate chain and PEM private key, presented to a server that
    /// asks for one (mutual TLS).
    #[cfg(feature = "tls")]
    pub(crate) tls_client: Option<(Vec<u8>, Vec<u8>)>,
}

impl ConnectSettings {
    /// Settings with these timeouts and the system's TLS roots.
    pub(crate) fn new(connect_timeout: Duration, response_timeout: Duration) -> Self {
        ConnectSettings {
            connect_timeout,
            response_timeout,
            lease_timeout: None,
            lazy: false,
            #[cfg(feature = "tls")]
            tls_root: None,
            #[cfg(feature = "tls")]
            tls_client: None,
        }
    }

    /// The longest reply any call on the connection may wait for: what connections are opened
    /// with.
    pub(crate) fn longest_reply(&self) -> Duration {
        self.lease_timeout
            .map_or(self.response_timeout, |l| l.max(self.response_timeout))
    }

    /// Whether TLS certificates were set (they apply only to connections this crate opens).
    pub(crate) fn has_tls_material(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls_root.is_some() || self.tls_client.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }

    /// The TLS material redis-rs needs, or `None` for the system's roots and no client identity.
    #[cfg(feature = "tls")]
    fn certificates(&self) -> Option<redis::TlsCertificates> {
        if self.tls_root.is_none() && self.tls_client.is_none() {
            return None;
        }
        Some(redis::TlsCertificates {
            client_tls: self
                .tls_client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.tls_root.clone(),
        })
    }

    /// Checks the timeouts (none zero) and the TLS material before any connection is tried,
    /// so that a bad setting is a configuration error that names the culprit rather than a
    /// connect error, or calls that all time out.
    pub(crate) fn validate(&self) -> Result<(), ConnectError> {
        let timeouts = [
            ("connect timeout", Some(self.connect_timeout)),
            ("response timeout", Some(self.response_timeout)),
            ("lease timeout", self.lease_timeout),
        ];
        for (what, timeout) in timeouts {
            if timeout.is_some_and(|t| t.is_zero()) {
                // Every call would time out at once.
                return Err(ConnectError::Url(format!("the {what} must be above zero")));
            }
        }
        #[cfg(feature = "tls")]
        {
            use rustls::pki_types::pem::PemObject;
            use rustls::pki_types::{CertificateDer, PrivateKeyDer};

            let certs = |what: &str, pem: &[u8]| {
                let parsed: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(pem).collect();
                match parsed {
                    Ok(certs) if !certs.is_empty() => Ok(()),
                    Ok(_) => Err(ConnectError::Url(format!(
                        "{what}: no PEM certificate (-----BEGIN CERTIFICATE-----) found"
                    ))),
                    Err(e) => Err(ConnectError::Url(format!("{what}: invalid PEM: {e}"))),
                }
            };
            if let Some(root) = &self.tls_root {
                certs("tls root certificate", root)?;
            }
            if let Some((cert, key)) = &self.tls_client {
                certs("tls client certificate", cert)?;
                let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| {
                    ConnectError::Url(format!("tls client key: no PEM private key found ({e})"))
                })?;
                // The PEM framing can hold anything: load the key as the handshake would.
                rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| {
                    ConnectError::Url(format!("tls client key: unusable private key ({e})"))
                })?;
            }
        }
        Ok(())
    }

    /// A client for `url`, trusting [`tls_root`](Self::tls_root) if set, its connections with
    /// [`tcp_settings`].
    pub(crate) fn client(&self, url: &str) -> Result<redis::Client, ConnectError> {
        let invalid = |e: redis::RedisError| {
            let url = crate::key::redact_url(url);
            ConnectError::Url(format!(
                "invalid redis url {url:?}: {e} (expected redis://[user:password@]host[:port][/db], \
                 rediss:// for TLS, or redis+unix:///path/to/socket)"
            ))
        };
        let info = redis::IntoConnectionInfo::into_connection_info(url)
            .map_err(invalid)?
            .set_tcp_settings(tcp_settings());
        #[cfg(feature = "tls")]
        let client = match self.certificates() {
            Some(certs) => redis::Client::build_with_tls(info, certs),
            None => redis::Client::open(info),
        };
        #[cfg(not(feature = "tls"))]
        let client = redis::Client::open(info);
        client.map_err(invalid)
    }
}

/// How long a connection may go without a sign of life from the server before the kernel
/// closes it (on Linux): data sent and not acknowledged for this long (`TCP_USER_TIMEOUT`), or
/// an idle connection unanswered this long after a keepalive probe (the first probe after
/// this long idle, then one a second). Elsewhere only keepalive is set: the first probe after
/// this long idle, then the system's interval and count (minutes on macOS).
///
/// Where packets vanish — the server's host died or was replaced, a partition, a middlebox
/// that forgot the flow — no error ever reaches a connection that only times out: its calls
/// time out one by one, and TCP retransmits with a back-off that doubles up to two minutes,
/// so the kernel alone gives the connection up after about fifteen minutes (`tcp_retries2`).
/// Closed, its next call is an I/O error and redis-rs opens a new connection (or fails fast
/// while the server is unreachable, so the failure policy answers). Ten seconds is long past
/// any acknowledgement a healthy network delays and far below what an outage of the store
/// costs a fleet on its fallback.
pub(crate) const DEAD_PEER_AFTER: Duration = Duration::from_secs(10);

/// The TCP settings of every connection this crate opens: keepalive and, on Linux, a user
/// timeout, both [`DEAD_PEER_AFTER`] (see there); `TCP_NODELAY` as redis-rs sets it by
/// default.
pub(crate) fn tcp_settings() -> redis::io::tcp::TcpSettings {
    let keepalive = socket2::TcpKeepalive::new().with_time(DEAD_PEER_AFTER);
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "fuchsia"))]
    let keepalive = keepalive.with_interval(Duration::from_secs(1));
    let settings = redis::io::tcp::TcpSettings::default().set_keepalive(keepalive);
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "fuchsia"))]
    let settings = settings.set_user_timeout(DEAD_PEER_AFTER);
    settings
}

/// If `e` is a TLS server refusing this client's certificate (or its lack of one), a message
/// that says so and what to do: the server was started with `tls-auth-clients yes` (or
/// `optional` and a bad certificate was presented) and sent a fatal alert.
#[cfg(feature = "tls")]
pub(crate) fn client_certificate_refused(
    e: &redis::RedisError,
    url: &str,
    settings: &ConnectSettings,
) -> Option<String> {
    use rustls::AlertDescription as A;

    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    // redis-rs keeps the io::Error from tokio-rustls in an `Arc<dyn Error>` (its `source`),
    // and the io::Error wraps the rustls error.
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let alert = loop {
        let current = source?;
        let io = current.downcast_ref::<std::io::Error>().or_else(|| {
            current
                .downcast_ref::<Shared>()
                .and_then(|shared| shared.downcast_ref::<std::io::Error>())
        });
        let tls = current
            .downcast_ref::<rustls::Error>()
            .or_else(|| io?.get_ref()?.downcast_ref::<rustls::Error>());
        if let Some(rustls::Error::AlertReceived(alert)) = tls {
            break *alert;
        }
        source = current.source();
    };
    let refused = matches!(
        alert,
        A::CertificateRequired
            | A::BadCertificate
            | A::UnknownCA
            | A::CertificateUnknown
            | A::CertificateExpired
            | A::CertificateRevoked
            | A::UnsupportedCertificate
            | A::AccessDenied
    );
    if !refused {
        return None;
    }
    Some(if settings.tls_client.is_some() {
        format!(
            "redis at {url} refused this client's TLS certificate (TLS alert {alert:?}): \
             it must be signed by a CA the server trusts (tls-ca-cert-file) and be valid now"
        )
    } else {
        format!(
            "redis at {url} requires a TLS client certificate (mutual TLS, TLS alert \
             {alert:?}) and none is set: see RedisStoreBuilder::tls_client_certificate"
        )
    })
}

impl ConnectSettings {
    /// A client for the server `info` describes (TLS settings as for [`client`](Self::client)),
    /// its connections with [`tcp_settings`].
    pub(crate) fn client_at(
        &self,
        info: redis::ConnectionInfo,
    ) -> Result<redis::Client, ConnectError> {
        let info = info.set_tcp_settings(tcp_settings());
        let addr = info.addr().to_string();
        #[cfg(feature = "tls")]
        let client = match self.certificates() {
            Some(certs) if matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }) => {
                redis::Client::build_with_tls(info, certs)
            }
            _ => redis::Client::open(info),
        };
        #[cfg(not(feature = "tls"))]
        let client = redis::Client::open(info);
        client.map_err(|e| ConnectError::Url(format!("invalid redis address {addr}: {e}")))
    }

    /// A one-off multiplexed connection on `client` with both timeouts: for the few commands
    /// that are not script calls (asking a Sentinel, checking a server's role).
    pub(crate) async fn short_connection(
        &self,
        client: &redis::Client,
    ) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout));
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }
}

/// The connection script calls are sent on: one server, a cluster, or a Sentinel-managed
/// master. Cheap to clone; clones share the underlying connection(s).
#[derive(Clone)]
pub(crate) enum Connection {
    /// One Redis server.
    Single(ConnectionManager),
    /// A Redis Cluster.
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
    /// A Redis Cluster connected on first use ([`ConnectSettings::lazy`]).
    #[cfg(feature = "cluster")]
    LazyCluster(std::sync::Arc<LazyCluster>),
    /// The master of a Sentinel-managed group, followed across failovers.
    Sentinel(SentinelConnection),
}

/// A cluster connection opened by the first command that needs it. Concurrent commands share
/// one attempt; a failed attempt is returned to the commands that waited for it, and the next
/// command tries again.
#[cfg(feature = "cluster")]
pub(crate) struct LazyCluster {
    client: redis::cluster::ClusterClient,
    conn: tokio::sync::OnceCell<redis::cluster_async::ClusterConnection>,
}

#[cfg(feature = "cluster")]
impl LazyCluster {
    async fn get(&self) -> redis::RedisResult<redis::cluster_async::ClusterConnection> {
        self.conn
            .get_or_try_init(|| self.client.get_async_connection())
            .await
            .cloned()
    }
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
            #[cfg(feature = "cluster")]
            Connection::LazyCluster(lazy) => Box::pin(async move {
                let mut conn = lazy.get().await?;
                conn.req_packed_command(cmd).await
            }),
            Connection::Sentinel(c) => c.req_packed_command(cmd),
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
            #[cfg(feature = "cluster")]
            Connection::LazyCluster(lazy) => Box::pin(async move {
                let mut conn = lazy.get().await?;
                conn.req_packed_commands(pipeline, offset, count).await
            }),
            Connection::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            #[cfg(feature = "cluster")]
            Connection::Cluster(c) => c.get_db(),
            // A cluster has database 0 only.
            #[cfg(feature = "cluster")]
            Connection::LazyCluster(_) => 0,
            Connection::Sentinel(c) => c.get_db(),
        }
    }
}

/// How long a failed connect waits before its one retry, at least (at most twice this, by
/// redis-rs's jitter). redis-rs's default, 100 ms, made every call on a Redis that is down
/// take about 150 ms to fail (a refused connect and its retry): a service starting while Redis
/// was down refused its first requests as over the limit — a request waits 50 ms for its first
/// lease — before the failure policy could answer. The retry is for a connection lost a moment
/// ago (a restart, an idle connection closed); the limiters' own back-off handles an outage.
const CONNECT_RETRY_AFTER: Duration = Duration::from_millis(10);

/// The connection manager settings: both timeouts (the longest reply's), and one retry of a
/// failed connect, [`CONNECT_RETRY_AFTER`] later.
fn manager_config(settings: &ConnectSettings) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(settings.connect_timeout))
        .set_response_timeout(Some(settings.longest_reply()))
        .set_number_of_retries(1)
        .set_min_delay(CONNECT_RETRY_AFTER)
        .set_max_delay(CONNECT_RETRY_AFTER * 2)
}

/// A connection manager on `client` that connects on first use. (redis-rs refuses only
/// settings this crate never makes, such as resubscription without a push sender.)
pub(crate) fn manager_on(
    client: redis::Client,
    settings: &ConnectSettings,
) -> redis::RedisResult<ConnectionManager> {
    ConnectionManager::new_lazy_with_config(client, manager_config(settings))
}

/// A connection manager on `client`, with these settings (lazy or not).
pub(crate) async fn manager_for(
    client: redis::Client,
    settings: &ConnectSettings,
) -> Result<ConnectionManager, ConnectError> {
    if settings.lazy {
        // Fails only for a configuration redis-rs cannot use, never for an unreachable server.
        let addr = client.get_connection_info().addr().to_string();
        return manager_on(client, settings)
            .map_err(|e| ConnectError::Url(format!("cannot connect to {addr}: {e}")));
    }
    ConnectionManager::new_with_config(client, manager_config(settings))
        .await
        .map_err(ConnectError::Redis)
}

/// A client for `url` and a connection manager on it.
pub(crate) async fn connection_manager(
    url: &str,
    settings: &ConnectSettings,
) -> Result<(redis::Client, ConnectionManager), ConnectError> {
    let client = settings.client(url)?;
    let conn = manager_for(client.clone(), settings).await?;
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
        // included (the longest reply's: shorter calls are bounded on top).
        .response_timeout(settings.longest_reply())
        .tcp_settings(tcp_settings());
    #[cfg(feature = "tls")]
    if let Some(certs) = settings.certificates() {
        builder = builder.certs(certs);
    }
    let client = builder.build().map_err(|e| {
        let nodes: Vec<_> = nodes.iter().map(|n| crate::key::redact_url(n)).collect();
        ConnectError::Url(format!("invalid cluster nodes {nodes:?}: {e}"))
    })?;
    if settings.lazy {
        return Ok(Connection::LazyCluster(std::sync::Arc::new(LazyCluster {
            client,
            conn: tokio::sync::OnceCell::new(),
        })));
    }
    let conn = client
        .get_async_connection()
        .await
        .map_err(ConnectError::Redis)?;
    Ok(Connection::Cluster(conn))
}
