//! The builder of a [`RedisStore`]: where Redis is (one server, a cluster, the master of a
//! Sentinel group, or a connection the service already has), timeouts, TLS and the key prefix.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManager;

use crate::clock::Clock;
use crate::connect::{connection_manager, ConnectError, ConnectSettings, Connection};
use crate::error::{BuildError, StoreError};
use crate::key;

use super::{ConfigCache, RedisStore, DEFAULT_CONFIG_REFRESH, DEFAULT_PREFIX};

/// Default time allowed to open a connection. Short: a hybrid limiter never waits for it on a
/// caller's thread, but a slow connect delays recovery.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_millis(250);
/// Default time allowed for one reply. A script call on a healthy Redis takes about 0.1 ms; a
/// reply slower than this is treated as a failure (see [`crate::failure`]).
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_millis(50);
/// By default a node's lease or release call — which a limiter's background task makes while
/// its callers are served from the local bucket — may take this many response timeouts (see
/// [`RedisStoreBuilder::lease_timeout`]).
pub const LEASE_TIMEOUT_FACTOR: u32 = 3;

/// Configures and connects a [`RedisStore`].
#[must_use]
pub struct RedisStoreBuilder {
    target: Target,
    prefix: String,
    settings: ConnectSettings,
    clock: Option<Arc<dyn Clock>>,
    config_refresh: Duration,
    /// A setting that does not apply to this kind of store, reported by `connect`.
    misplaced: Option<&'static str>,
}

/// What a builder connects to.
pub(super) enum Target {
    /// One server.
    Url(String),
    /// One server, through the caller's client.
    Client(redis::Client),
    /// One server, on the caller's connection manager.
    Manager(ConnectionManager),
    /// A cluster, on the caller's connection.
    #[cfg(feature = "cluster")]
    ClusterConnection(redis::cluster_async::ClusterConnection),
    /// Some nodes of a cluster.
    #[cfg(feature = "cluster")]
    Cluster(Vec<String>),
    /// The master the sentinels name.
    Sentinel {
        sentinels: Vec<String>,
        master: String,
        /// How to reach the master, if not as the first sentinel URL says.
        master_url: Option<String>,
    },
}

impl Target {
    /// What errors name as the server: URLs with their passwords elided.
    fn describe(&self) -> String {
        let urls = |urls: &[String]| {
            urls.iter()
                .map(|u| key::redact_url(u))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            Target::Url(url) => key::redact_url(url),
            Target::Client(c) => c.get_connection_info().addr().to_string(),
            Target::Manager(_) => "a shared connection manager".into(),
            #[cfg(feature = "cluster")]
            Target::ClusterConnection(_) => "a shared cluster connection".into(),
            #[cfg(feature = "cluster")]
            Target::Cluster(nodes) => format!("cluster {}", urls(nodes)),
            Target::Sentinel {
                sentinels, master, ..
            } => format!("master {master:?} of sentinels {}", urls(sentinels)),
        }
    }

    /// Whether the caller gave an open connection (no URL or client to connect with).
    fn is_connection(&self) -> bool {
        match self {
            Target::Manager(_) => true,
            #[cfg(feature = "cluster")]
            Target::ClusterConnection(_) => true,
            _ => false,
        }
    }
}

impl RedisStoreBuilder {
    pub(super) fn new(target: Target) -> Self {
        RedisStoreBuilder {
            target,
            prefix: DEFAULT_PREFIX.to_owned(),
            settings: ConnectSettings::new(DEFAULT_CONNECT_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT),
            clock: None,
            config_refresh: DEFAULT_CONFIG_REFRESH,
            misplaced: None,
        }
    }

    /// Key prefix for every limiter (default [`DEFAULT_PREFIX`]); must not contain braces.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Time allowed to open a connection (default [`DEFAULT_CONNECT_TIMEOUT`]; zero is refused
    /// by [`connect`](Self::connect), `Duration::MAX` waits as long as it takes). On a cluster,
    /// per node.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.settings.connect_timeout = timeout;
        self
    }

    /// Time allowed for one reply (default [`DEFAULT_RESPONSE_TIMEOUT`]). On a cluster, for
    /// one whole request, MOVED/ASK redirections and retries included.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.settings.response_timeout = timeout;
        self
    }

    /// Time allowed for a node's lease or release call (default [`LEASE_TIMEOUT_FACTOR`] ×
    /// the response timeout: 150 ms; never less than the response timeout). A hybrid or keyed
    /// limiter's background task makes these while its callers are served from the local
    /// bucket, so waiting out a busy store costs no caller anything, and a call given up on
    /// is worse than a late one: the store still runs it, and its grant is lost to the fleet
    /// until the lease expires. Every other call (pure-mode decisions, per-request decisions,
    /// config, concurrency) keeps the response timeout. The cost: a hung store is noticed
    /// this much later by the background task, so a caller that needs the store (local
    /// tokens spent) meets the failure policy this much later. At a 10 000-process start on one
    /// Redis core, 150 ms instead of 50 ms raised utilization from 0.886 to 0.944; 100, 200
    /// and 300 ms read 0.909, 0.938 and 0.929 (`SIMULATIONS.md`, "A lease waits longer than a
    /// caller").
    pub fn lease_timeout(mut self, timeout: Duration) -> Self {
        self.settings.lease_timeout = Some(timeout);
        self
    }

    /// Trusts the PEM root certificate(s) `pem` for `rediss://` connections instead of the
    /// system's roots: for a Redis whose certificate is signed by a private CA.
    #[cfg(feature = "tls")]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.settings.tls_root = Some(pem.into());
        self
    }

    /// Presents the PEM certificate chain `cert` and PEM private key `key` to a `rediss://`
    /// server that requires client certificates (mutual TLS, `tls-auth-clients yes`). Combine
    /// with [`tls_root_certificate`](Self::tls_root_certificate) for a private CA.
    ///
    /// A PEM that holds no certificate or no private key makes [`connect`](Self::connect) fail
    /// with [`BuildError::Config`]. So does a server that refuses the certificate, or requires one
    /// and none is set: the message says which, with the server's TLS alert
    /// (`CertificateRequired`, `UnknownCA`, …). With [`lazy_connect`](Self::lazy_connect) the
    /// refusal comes from each call instead, as [`StoreError::Redis`] with the alert
    /// (`received fatal alert: CertificateRequired`).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = ratelease::RedisStore::builder("rediss://redis.internal:6380/")
    ///     .tls_root_certificate(std::fs::read("ca.crt")?)
    ///     .tls_client_certificate(std::fs::read("client.crt")?, std::fs::read("client.key")?)
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls_client_certificate(
        mut self,
        cert: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> Self {
        self.settings.tls_client = Some((cert.into(), key.into()));
        self
    }

    /// For a [`sentinel_builder`](RedisStore::sentinel_builder) store: reach the master with
    /// the scheme, username, password and database of `url` (its host and port are ignored:
    /// the sentinels give the address). By default the first sentinel URL's are used, which
    /// suits sentinels that share the master's password; set this when they do not, e.g.
    /// `redis://:master-password@master/0` with `redis://sentinel-1:26379/` as sentinel URLs.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), ratelease::Error> {
    /// let store = ratelease::RedisStore::sentinel_builder(
    ///     ["redis://10.0.0.1:26379/", "redis://10.0.0.2:26379/", "redis://10.0.0.3:26379/"],
    ///     "mymaster",
    /// )
    /// .sentinel_master_url("redis://ratelease:secret@master/0")
    /// .connect()
    /// .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// On a store that is not a `sentinel_builder` one, [`connect`](Self::connect) fails with
    /// [`BuildError::Config`].
    pub fn sentinel_master_url(mut self, url: impl Into<String>) -> Self {
        let url = url.into();
        match &mut self.target {
            Target::Sentinel { master_url, .. } => *master_url = Some(url),
            _ => self.misplaced = Some("sentinel_master_url needs RedisStore::sentinel_builder"),
        }
        self
    }

    /// Makes [`connect`](Self::connect) return without contacting Redis: the connection is
    /// opened by the first call and reopened in the background after a failure, as always.
    ///
    /// For a service that must start while Redis is unreachable. Limiters on the store build
    /// at once; until Redis answers, each store call fails — at once with [`StoreError::Redis`]
    /// where the connection is refused, else with [`StoreError::Timeout`] after at most the
    /// call's timeout plus the connect timeout (a host that does not answer) — so a
    /// [`HybridLimiter`](crate::HybridLimiter)'s [`FailurePolicy`](crate::FailurePolicy)
    /// answers from its first failed lease and a [`RedisLimiter`](crate::RedisLimiter) call
    /// returns the error. Once Redis is up the next call connects and leasing resumes.
    /// Configuration errors (a bad URL, prefix or PEM) are still reported by `connect`.
    ///
    /// Without it, `connect` fails if Redis cannot be reached, which suits a service that
    /// would rather not start without its limits.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), ratelease::Error> {
    /// use ratelease::{FailurePolicy, HybridLimiter, Quota, RedisStore};
    ///
    /// // Succeeds even if nothing listens on 6379 yet.
    /// let store = RedisStore::builder("redis://127.0.0.1:6379/")
    ///     .lazy_connect()
    ///     .connect()
    ///     .await?;
    /// let limiter = HybridLimiter::builder("api", Quota::per_second(100)?, store)
    ///     .on_store_failure(FailurePolicy::local_fallback(4))
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn lazy_connect(mut self) -> Self {
        self.settings.lazy = true;
        self
    }

    /// How long a pure-mode call trusts what the store last read of a name's central config
    /// (default [`DEFAULT_CONFIG_REFRESH`], 1 s). In between it sends the bucket's key alone:
    /// one key, so a Redis Cluster slot migration redirects it instead of answering
    /// `TRYAGAIN` until the handover, and one read less per call. A config changed through
    /// this store applies at once; one changed by another process applies to pure-mode calls
    /// within this time (to a hybrid limiter's leases on terms, the default, at once; fixed batch
    /// leases are anonymous, like pure-mode calls). `Duration::ZERO` reads the config on every
    /// call.
    pub fn config_refresh(mut self, refresh: Duration) -> Self {
        self.config_refresh = refresh;
        self
    }

    /// Sends `now` from `clock` to the script instead of using the Redis server's clock.
    ///
    /// For deterministic tests and replays only: in production, client clocks differ and the
    /// server clock is the one every process agrees on.
    pub fn explicit_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Connects (within the connect timeout), or with [`lazy_connect`](Self::lazy_connect)
    /// only checks the configuration.
    ///
    /// # Errors
    /// [`BuildError::Config`] for a bad URL, prefix or TLS PEM, a zero timeout, a setting that
    /// does not apply to this kind of store, or a TLS client certificate the server refuses (or
    /// requires);
    /// [`BuildError::Store`] if Redis cannot be reached (never with `lazy_connect`).
    pub async fn connect(mut self) -> Result<RedisStore, BuildError> {
        key::validate_prefix(&self.prefix)?;
        if let Some(msg) = self.misplaced {
            return Err(BuildError::Config(msg.into()));
        }
        let external = self.target.is_connection();
        if external && self.settings.has_tls_material() {
            return Err(BuildError::Config(
                "TLS certificates do not apply to an existing connection: configure them on \
                 its redis::Client"
                    .into(),
            ));
        }
        let lease_timeout = self
            .settings
            .lease_timeout
            .unwrap_or(
                self.settings
                    .response_timeout
                    .saturating_mul(LEASE_TIMEOUT_FACTOR),
            )
            .max(self.settings.response_timeout);
        self.settings.lease_timeout = Some(lease_timeout);
        self.settings.validate().map_err(|e| match e {
            ConnectError::Url(msg) => BuildError::Config(msg),
            ConnectError::Redis(e) => BuildError::Store(e.into()),
        })?;
        let mut client = None;
        let conn = match &self.target {
            Target::Url(url) => connection_manager(url, &self.settings)
                .await
                .map(|(c, conn)| {
                    client = Some(c);
                    Connection::Single(conn)
                }),
            Target::Client(c) => {
                client = Some(c.clone());
                crate::connect::manager_for(c.clone(), &self.settings)
                    .await
                    .map(Connection::Single)
            }
            Target::Manager(m) => Ok(Connection::Single(m.clone())),
            #[cfg(feature = "cluster")]
            Target::ClusterConnection(c) => Ok(Connection::Cluster(c.clone())),
            #[cfg(feature = "cluster")]
            Target::Cluster(nodes) => {
                crate::connect::cluster_connection(nodes, &self.settings).await
            }
            Target::Sentinel {
                sentinels,
                master,
                master_url,
            } => {
                let master_url = master_url.as_deref();
                match crate::connect::SentinelConnection::new(
                    sentinels,
                    master,
                    master_url,
                    &self.settings,
                ) {
                    Ok(conn) if self.settings.lazy => Ok(Connection::Sentinel(conn)),
                    Ok(conn) => conn
                        .connect()
                        .await
                        .map(|()| Connection::Sentinel(conn))
                        .map_err(ConnectError::Redis),
                    Err(e) => Err(e),
                }
            }
        }
        .map_err(|e| match e {
            ConnectError::Url(msg) => BuildError::Config(msg),
            ConnectError::Redis(e) => self.connect_error(e),
        })?;
        Ok(RedisStore {
            conn,
            client,
            server: self.target.describe().into(),
            prefix: self.prefix.into(),
            response_timeout: self.settings.response_timeout,
            lease_timeout,
            connect_timeout: self.settings.connect_timeout,
            up: Arc::new(AtomicBool::new(!self.settings.lazy)),
            clock: self.clock,
            configs: Arc::new(ConfigCache::new(self.config_refresh)),
        })
    }
}

impl RedisStoreBuilder {
    /// The error for a failed connect: a TLS server refusing the client certificate (or its
    /// absence) is a configuration error that says so; anything else is the store's.
    fn connect_error(&self, e: redis::RedisError) -> BuildError {
        #[cfg(feature = "tls")]
        {
            let url = self.target.describe();
            if let Some(msg) = crate::connect::client_certificate_refused(&e, &url, &self.settings)
            {
                return BuildError::Config(msg);
            }
        }
        let server: Arc<str> = self.target.describe().into();
        BuildError::Store(StoreError::from(e).at(&server, None))
    }
}
