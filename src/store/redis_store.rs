//! [`RedisStore`]: the shared bucket in Redis, stepped by `lua/token_bucket.lua`.
//!
//! The script (`lua/helpers.lua` + `lua/token_bucket.lua`) is embedded with `include_str!` and
//! sent with EVALSHA; redis-rs reloads it on NOSCRIPT (after `SCRIPT FLUSH` or a restart), so
//! callers never see that error. The connection
//! is a redis-rs `ConnectionManager` (one server) or cluster connection (feature `cluster`,
//! [`RedisStore::cluster_builder`]), see `src/connect/`: cheap to clone, reconnecting in the
//! background, and given explicit connect and response timeouts so a slow Redis costs a bounded
//! wait. Every key of one limiter carries the same hash tag ([`crate::key`]), so on a cluster a
//! script call touches one slot. Time comes from the Redis server's clock (`TIME` inside the
//! script) unless an explicit [`Clock`] is set for deterministic tests. The other algorithms'
//! scripts ([`crate::algorithm`]) go through the same path (`redis_store/algorithms.rs`).

mod algorithms;
mod builder;
mod config_cache;

use builder::Target;
pub use builder::{
    RedisStoreBuilder, DEFAULT_CONNECT_TIMEOUT, DEFAULT_RESPONSE_TIMEOUT, LEASE_TIMEOUT_FACTOR,
};
use config_cache::ConfigCache;
pub use config_cache::DEFAULT_CONFIG_REFRESH;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use tracing::Instrument;

use redis::aio::ConnectionManager;

use crate::connect::Connection;

use super::LeaseStore;
use crate::algorithm::token_bucket::QuotaSource;
use crate::algorithm::Algorithm;
use crate::algorithm::TOKEN_BUCKET_LUA;
use crate::clock::Clock;
use crate::config::ConfigStore;
use crate::error::{BuildError, StoreError};
use crate::key;
use crate::protocol;
use crate::protocol::{budget_suffix, node_key, LeaseReply, LeaseRequest, ReleaseRequest};
use crate::quota::{Quota, MAX_VALUE};
use crate::time::micros;

static SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(TOKEN_BUCKET_LUA));

/// Default key prefix.
pub const DEFAULT_PREFIX: &str = "ratelease:";

/// A [`LeaseStore`] backed by Redis. Clones share one connection.
///
/// ```no_run
/// # async fn demo() -> Result<(), ratelease::Error> {
/// use std::time::Duration;
/// use ratelease::RedisStore;
///
/// let store = RedisStore::builder("redis://127.0.0.1:6379/")
///     .prefix("myapp:rl:")
///     .response_timeout(Duration::from_millis(50))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    conn: Connection,
    /// The client of a one-server store, for a [`RedisLock`](crate::RedisLock) sharing it
    /// (its unlock subscriptions need a client); `None` for a cluster, a Sentinel group, or a
    /// store made from a connection manager.
    client: Option<redis::Client>,
    /// The server(s), for error messages: the URL with its password elided, the nodes, or
    /// the Sentinel group.
    server: Arc<str>,
    prefix: Arc<str>,
    /// What bounds each call of this handle (see [`patient`](Self::patient)).
    response_timeout: Duration,
    /// What bounds a node's lease or release call (at least the response timeout).
    lease_timeout: Duration,
    /// Added to the bound of a call that may first have to (re)connect.
    connect_timeout: Duration,
    /// Whether the connection answered the last call (else the next call may include a
    /// connect: a lazy store's first, or the reconnect after an error). Shared by clones.
    up: Arc<AtomicBool>,
    clock: Option<Arc<dyn Clock>>,
    /// Each name's central config as last read, for one-key pure-mode calls.
    configs: Arc<ConfigCache>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("response_timeout", &self.response_timeout)
            .field("lease_timeout", &self.lease_timeout)
            .field("explicit_clock", &self.clock.is_some())
            .finish()
    }
}

impl RedisStore {
    /// An identity its clones share and no other live store has: the address of its prefix,
    /// which each connected store allocates once and its clones share (see
    /// [`names`](super::names)).
    pub(crate) fn instance_id(&self) -> usize {
        Arc::as_ptr(&self.prefix).cast::<u8>() as usize
    }

    /// A builder for a store at `url` (`redis://`, `rediss://` or `redis+unix://`).
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder::new(Target::Url(url.into()))
    }

    /// A builder for a store on the server `client` points at, sharing the caller's
    /// `redis::Client` (its URL, credentials and TLS settings). [`connect`](RedisStoreBuilder::connect)
    /// opens one connection manager on it with the builder's timeouts, as for a URL; a
    /// [`RedisLock`](crate::RedisLock) built with
    /// [`RedisLock::builder_on_store`](crate::RedisLock::builder_on_store) shares that
    /// connection. TLS certificates are the client's: setting them on the builder is an
    /// [`BuildError::Config`]. So are its TCP settings: a store on a URL sets keepalive and a
    /// user timeout so that a connection to a server gone silent is closed within seconds
    /// (RELIABILITY.md, "Known limitations"); a client opened without them
    /// (`redis::ConnectionInfo::set_tcp_settings`) keeps such a connection until its kernel
    /// gives up.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::Client::open("redis://127.0.0.1:6379/")?;
    /// let store = ratelease::RedisStore::with_client(client.clone()).connect().await?;
    /// # Ok(()) }
    /// ```
    pub fn with_client(client: redis::Client) -> RedisStoreBuilder {
        RedisStoreBuilder::new(Target::Client(client))
    }

    /// A builder for a store on the caller's `ConnectionManager`: script calls share it with
    /// the rest of the service, and no connection is opened. The manager keeps its own connect
    /// and reconnect settings; the builder's [`response_timeout`](RedisStoreBuilder::response_timeout)
    /// still bounds every call of the store (a manager built without a response timeout would
    /// otherwise let a hung server hold a caller indefinitely). Without a `redis::Client`, a
    /// [`RedisLock`](crate::RedisLock) on this store polls instead of subscribing to unlocks.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redis::Client::open("redis://127.0.0.1:6379/")?;
    /// let manager = redis::aio::ConnectionManager::new(client).await?;
    /// let store = ratelease::RedisStore::with_connection_manager(manager.clone())
    ///     .prefix("myapp:rl:")
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn with_connection_manager(manager: ConnectionManager) -> RedisStoreBuilder {
        RedisStoreBuilder::new(Target::Manager(manager))
    }

    /// A builder for a store on the caller's Redis Cluster connection (redis-rs's
    /// `cluster_async::ClusterConnection`), shared with the rest of the service. As for
    /// [`with_connection_manager`](Self::with_connection_manager), the builder's response
    /// timeout bounds every call; the connection's own settings govern the rest.
    #[cfg(feature = "cluster")]
    pub fn with_cluster_connection(
        connection: redis::cluster_async::ClusterConnection,
    ) -> RedisStoreBuilder {
        RedisStoreBuilder::new(Target::ClusterConnection(connection))
    }

    /// The `redis::Client` of a one-server store made from a URL or
    /// [`with_client`](Self::with_client), for sharing with other parts of a service.
    pub fn client(&self) -> Option<&redis::Client> {
        self.client.as_ref()
    }

    /// What error messages call the store's server(s): URLs with their passwords elided.
    pub(crate) fn server(&self) -> &str {
        &self.server
    }

    /// The connection manager of a one-server store (from a URL, a client or a manager), for
    /// sending other commands on the same connection; `None` for a cluster or Sentinel store.
    pub fn connection_manager(&self) -> Option<&ConnectionManager> {
        match &self.conn {
            Connection::Single(m) => Some(m),
            _ => None,
        }
    }

    /// A builder for a store on the Redis Cluster that `nodes` belong to (URLs of one or more
    /// of its nodes, `redis://` or `rediss://`; the rest are discovered).
    ///
    /// Every key of one limiter hashes to one slot, so the script runs on one primary; limiters
    /// with different names spread across the cluster. Slot migrations are followed (MOVED/ASK)
    /// within the response timeout. [`RedisLock`](crate::RedisLock) needs a single Redis.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), ratelease::Error> {
    /// let store = ratelease::RedisStore::cluster_builder(["redis://10.0.0.1:7000/"])
    ///     .prefix("myapp:rl:")
    ///     .connect()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "cluster")]
    pub fn cluster_builder(
        nodes: impl IntoIterator<Item = impl Into<String>>,
    ) -> RedisStoreBuilder {
        RedisStoreBuilder::new(Target::Cluster(nodes.into_iter().map(Into::into).collect()))
    }

    /// A builder for a store on the master of the Sentinel-managed group `master_name`, found
    /// by asking the Sentinels at `sentinels` (`redis://host:26379/` or `rediss://…`; one
    /// reachable sentinel is enough) and followed across failovers: a call that finds the
    /// master gone or demoted makes the store ask the sentinels again, so the next call goes
    /// to the replica they promoted.
    ///
    /// The master is reached with the first sentinel URL's scheme, username, password and
    /// database unless [`sentinel_master_url`](RedisStoreBuilder::sentinel_master_url) says
    /// otherwise, and the builder's timeouts and TLS settings. What a failover can cost
    /// (writes the replica had not received yet) and how to bound it is in RELIABILITY.md,
    /// "Failover".
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), ratelease::Error> {
    /// let store = ratelease::RedisStore::sentinel_builder(
    ///     ["redis://10.0.0.1:26379/", "redis://10.0.0.2:26379/", "redis://10.0.0.3:26379/"],
    ///     "mymaster",
    /// )
    /// .lazy_connect()
    /// .connect()
    /// .await?;
    /// # Ok(()) }
    /// ```
    pub fn sentinel_builder(
        sentinels: impl IntoIterator<Item = impl Into<String>>,
        master_name: impl Into<String>,
    ) -> RedisStoreBuilder {
        RedisStoreBuilder::new(Target::Sentinel {
            sentinels: sentinels.into_iter().map(Into::into).collect(),
            master: master_name.into(),
            master_url: None,
        })
    }

    /// Connects to `url` with default settings.
    ///
    /// # Errors
    /// As [`RedisStoreBuilder::connect`].
    pub async fn connect(url: impl Into<String>) -> Result<Self, BuildError> {
        Self::builder(url).connect().await
    }

    /// The Redis key holding `name`'s bucket (its leasers live at `…:leasers` and
    /// `…:expiry`, under the same hash tag).
    pub fn key(&self, name: &str) -> String {
        key::bucket_key(&self.prefix, name)
    }

    /// The Redis hash holding `name`'s central config (fields `rate`, `period_us`, `burst`).
    pub fn config_key(&self, name: &str) -> String {
        format!("{}:config", self.key(name))
    }

    /// The script's four keys for `name`'s bucket of `client` (or its fleet-wide one).
    fn keys(&self, name: &str, client: Option<u64>) -> [String; 4] {
        let config = self.config_key(name);
        let bucket = self.bucket_key(name, client);
        let (leasers, expiry) = (format!("{bucket}:leasers"), format!("{bucket}:expiry"));
        [bucket, leasers, expiry, config]
    }

    /// The key of `name`'s bucket of `client` (or its fleet-wide one).
    fn bucket_key(&self, name: &str, client: Option<u64>) -> String {
        format!("{}{}", self.key(name), budget_suffix(client))
    }

    /// Runs the script: `op`, then the arguments after `burst`. An anonymous call the script
    /// will accept (`anonymous`) sends the bucket's key alone, under the name's config as read
    /// within the refresh time (see `config_cache.rs`); every other call, one that refreshes
    /// the config and one on a bucket with leasers, every key. A call that read the config
    /// updates what is known.
    async fn run(
        &self,
        name: &str,
        client: Option<u64>,
        quota: &Quota,
        op: &str,
        anonymous: Option<Anonymous>,
        args: [String; 10],
    ) -> Result<LeaseReply, StoreError> {
        // Trailing empty arguments read as absent: a pure-mode call sends six, not thirteen
        // (every argument is a string the server makes for the script).
        let used = args
            .iter()
            .rposition(|a| !a.is_empty())
            .map_or(0, |i| i + 1);
        let args = &args[..used];
        if let Some(Anonymous {
            min,
            configured_only,
        }) = anonymous.filter(|_| self.configs.enabled())
        {
            let bucket = self.bucket_key(name, client);
            // `None`: this call reads the config (every key) and refreshes what is known — or
            // the bucket's one-key call found leasers lately: every key at once.
            let config = if self.configs.has_leasers(&bucket) {
                None
            } else {
                self.configs.fresh(name)
            };
            // The script checks `min` against the caller's burst (a request above it is an
            // error) and grants nothing above the stored one: one key passes the stored quota
            // as the caller's, so such a request goes with every key.
            if let Some(config) =
                config.filter(|c| min <= c.map_or(quota.burst(), |c| c.burst().min(quota.burst())))
            {
                // An anonymous call's arguments: want, min, now (the rest are empty).
                if let Some(reply) = self
                    .run_one_key(
                        std::slice::from_ref(&bucket),
                        quota,
                        config,
                        configured_only,
                        op,
                        &args[..used.min(3)],
                    )
                    .await?
                {
                    return Ok(reply);
                }
                self.configs.found_leasers(&bucket);
            }
        }
        let keys = self.keys(name, client);
        let head = quota_args(op, quota);
        let reply = self
            .eval_counts(&SCRIPT, &keys, head.iter().chain(args))
            .await?;
        four_key_reply(&reply).inspect(|reply| self.learn(name, reply))
    }

    /// A node's lease or release as a packed call (see "Packed node calls" in
    /// `lua/token_bucket.lua`): the text protocol's ARGV[2..7], ARGV[9..12], ARGV[14] and
    /// ARGV[15] — the quota, `asked` (want and min, or the tokens returned and 0), the time
    /// (-1 for the server's clock) and `node`'s six numbers (the rate -1 for none; a
    /// release's last four 0) — sent as one string of twelve little-endian doubles, and
    /// answered as one. Every value is at most [`MAX_VALUE`] or
    /// refused by the script (a larger integer does not round below it), so the doubles carry
    /// them exactly.
    #[allow(clippy::too_many_arguments)]
    async fn run_packed(
        &self,
        name: &str,
        client: Option<u64>,
        quota: &Quota,
        op: &str,
        asked: [f64; 2],
        node: [f64; 6],
        id: u64,
        unconfigured: &str,
    ) -> Result<LeaseReply, StoreError> {
        let now = self.now_us().map_or(-1.0, |t| t as f64);
        let head = [
            quota.rate() as f64,
            quota.period_us() as f64,
            quota.burst() as f64,
        ];
        let keys = self.keys(name, client);
        let packed = head
            .into_iter()
            .chain(asked)
            .chain([now])
            .chain(node)
            .flat_map(f64::to_le_bytes)
            .collect();
        let args = [
            op.as_bytes().to_vec(),
            packed,
            node_key(id).into_bytes(),
            unconfigured.as_bytes().to_vec(),
        ];
        let reply: Vec<u8> = self.eval(&SCRIPT, &keys, &args).await?;
        four_key_reply(&unpacked(&reply)?).inspect(|reply| self.learn(name, reply))
    }

    /// Remembers the stored config a reply ran under (or its absence).
    fn learn(&self, name: &str, reply: &LeaseReply) {
        self.configs.learn(name, config_cache::stored_config(reply));
    }

    /// An anonymous call with the bucket's key (`bucket`, the one key) alone, under `config` (the name's
    /// stored quota) or the caller's `quota` if it has none; `None` if the bucket has leasers on
    /// record and the call must be sent with every key.
    async fn run_one_key(
        &self,
        bucket: &[String],
        quota: &Quota,
        config: Option<Quota>,
        configured_only: bool,
        op: &str,
        args: &[String],
    ) -> Result<Option<LeaseReply>, StoreError> {
        let (quota, source) = match config {
            Some(stored) => (stored, QuotaSource::Stored),
            // What the script answers when told not to fall back: nothing done.
            None if configured_only => {
                return Ok(Some(LeaseReply::empty(*quota, QuotaSource::Absent)))
            }
            None => (*quota, QuotaSource::Caller),
        };
        let head = quota_args(op, &quota);
        let reply = self
            .eval_counts(&SCRIPT, bucket, head.iter().chain(args))
            .await?;
        match reply[..] {
            [0] => Ok(None),
            [granted, remaining, retry_us, reset_us, share_mtps] => Ok(Some(LeaseReply {
                granted,
                remaining,
                retry_after: Duration::from_micros(retry_us),
                reset_after: Duration::from_micros(reset_us),
                share_mtps,
                rate_mtps: 0,
                leasers: 0,
                quota,
                source,
                at: None,
            })),
            _ => Err(StoreError::BadReply(format!(
                "expected 1 or 5 integers, got {reply:?}"
            ))),
        }
    }

    /// Runs a config operation; the reply is the config now stored (if any) and the flag.
    async fn config_op(
        &self,
        name: &str,
        op: &str,
        quota: Option<&Quota>,
    ) -> Result<(Option<Quota>, bool), StoreError> {
        // A read sends the config hash alone (one key: never TRYAGAIN while its slot
        // migrates); a write every key.
        let keys = if op == "config_get" {
            vec![self.config_key(name)]
        } else {
            self.keys(name, None).to_vec()
        };
        let one = Quota::per_second(1).expect("valid");
        let head = quota_args(op, quota.unwrap_or(&one));
        let reply = self.eval_counts(&SCRIPT, &keys, head.iter()).await?;
        let bad = || StoreError::BadReply(format!("expected 4 integers, got {reply:?}"));
        let [rate, period, burst, flag] = reply[..] else {
            return Err(bad());
        };
        let quota = match (rate, period, burst) {
            (0, 0, 0) => None,
            _ => Some(
                Quota::with_parts(rate, Duration::from_micros(period), burst).map_err(|_| bad())?,
            ),
        };
        // Every reply is the config now stored, but a delete's (the one it removed), a get's
        // of an invalid config (none, flag 1) and an init's over one (none: it wrote nothing).
        match op {
            "config_delete" => self.configs.learn(name, None),
            "config_get" if quota.is_none() && flag == 1 => {}
            "config_init" if quota.is_none() => {}
            _ => self.configs.learn(name, quota),
        }
        Ok((quota, flag == 1))
    }

    /// This store, bounding each call by the lease timeout: for a node's lease or release,
    /// which no caller waits on (see [`RedisStoreBuilder::lease_timeout`]).
    fn patient(&self) -> Self {
        RedisStore {
            response_timeout: self.lease_timeout,
            ..self.clone()
        }
    }

    /// [`eval`](Self::eval) of a script that answers an array of integers, each read as a
    /// count: a negative one is a [`StoreError::BadReply`] (redis-rs reads `-1` as a `u64` by
    /// wrapping it to 2^64 − 1: a grant of every token there is).
    pub(crate) async fn eval_counts<A: redis::ToRedisArgs + AsRef<[u8]>>(
        &self,
        script: &redis::Script,
        keys: &[String],
        args: impl IntoIterator<Item = A>,
    ) -> Result<Vec<u64>, StoreError> {
        counts(self.eval(script, keys, args).await?)
    }

    /// Runs `script` with `keys` and `args` (EVALSHA, reloading on NOSCRIPT), mapping a reply
    /// slower than the response timeout to [`StoreError::Timeout`] and a reply that is not a
    /// `T` to [`StoreError::BadReply`] (no outage: the server answered, with something this
    /// crate cannot read). Every script this crate ships goes through here, in a `store_call`
    /// span ([`crate::telemetry`]).
    pub(crate) async fn eval<T: redis::FromRedisValue, A: redis::ToRedisArgs + AsRef<[u8]>>(
        &self,
        script: &redis::Script,
        keys: &[String],
        args: impl IntoIterator<Item = A>,
    ) -> Result<T, StoreError> {
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(key);
        }
        let span = tracing::debug_span!(
            "store_call",
            store = "redis",
            key = keys.first().map_or("", String::as_str),
            op = tracing::field::Empty,
            script = script.get_hash(),
            error = tracing::field::Empty,
        );
        for (i, arg) in args.into_iter().enumerate() {
            if i == 0 {
                span.record("op", String::from_utf8_lossy(arg.as_ref()).as_ref());
            }
            invocation.arg(arg);
        }
        let mut conn = self.conn.clone();
        let call = invocation.invoke_async(&mut conn).instrument(span.clone());
        // Bounded here: a connection this crate opened waits up to the lease timeout (the
        // longest of its calls), a caller's connection as its owner set it. A call that may
        // have to connect first has the connect timeout for that too, as the connection's own
        // reply timer starts once it is connected.
        // Relaxed: a hint about the connection; nothing is published through it.
        let bound = if self.up.load(Ordering::Relaxed) {
            self.response_timeout
        } else {
            self.response_timeout.saturating_add(self.connect_timeout)
        };
        let result = tokio::time::timeout(bound, call).await.unwrap_or_else(|_| {
            Err(redis::RedisError::from(std::io::Error::from(
                std::io::ErrorKind::TimedOut,
            )))
        });
        // A reply (an error reply too) says the connection is up; a lost or refused connection
        // that the next call may have to open again; a timeout leaves it as it was. Written
        // only when it changes: every pure-mode call passes here, and a store on each would
        // bounce the flag's cache line between the cores running them.
        let up = match &result {
            Err(e) if e.is_timeout() => None,
            Err(e) => {
                Some(!(e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal()))
            }
            Ok(_) => Some(true),
        };
        if let Some(up) = up.filter(|&up| up != self.up.load(Ordering::Relaxed)) {
            self.up.store(up, Ordering::Relaxed);
        }
        let result = result
            .map_err(|e| {
                if e.is_timeout() {
                    StoreError::Timeout(self.response_timeout)
                } else {
                    StoreError::from(e).at(&self.server, keys.first().map(String::as_str))
                }
            })
            .and_then(|value| read_reply(value, script));
        if let Err(e) = &result {
            span.record("error", tracing::field::display(e));
        }
        result
    }

    /// The time to pass the scripts, µs: the explicit clock's, or `None` for the server's.
    fn now_us(&self) -> Option<u128> {
        self.clock.as_ref().map(|c| c.now().as_micros())
    }

    /// [`now_us`](Self::now_us) as a text argument ("" for the server's clock).
    pub(crate) fn now_arg(&self) -> String {
        self.now_us().map_or_else(String::new, |t| t.to_string())
    }
}

/// An anonymous token-bucket call whose arguments the script accepts: one that may go with the
/// bucket's key alone.
#[derive(Debug, Clone, Copy)]
struct Anonymous {
    /// The lease's fewest acceptable tokens (0 for a release).
    min: u64,
    /// Do nothing if the name has no stored config (else run under the caller's quota).
    configured_only: bool,
}

/// A 4-key reply of the token-bucket script: nine integers, eleven for a node's lease (the
/// rate it holds and the leasers on record after them).
fn four_key_reply(reply: &[u64]) -> Result<LeaseReply, StoreError> {
    let bad = || StoreError::BadReply(format!("expected 9 or 11 values, got {reply:?}"));
    let (head, rate_mtps, leasers) = match reply.split_at_checked(9) {
        Some((head, [])) => (head, 0, 0),
        Some((head, &[rate_mtps, leasers])) => (head, rate_mtps, leasers),
        _ => return Err(bad()),
    };
    let &[granted, remaining, retry_us, reset_us, share_mtps, rate, period, burst, source] = head
    else {
        return Err(bad());
    };
    Ok(LeaseReply {
        granted,
        remaining,
        retry_after: Duration::from_micros(retry_us),
        reset_after: Duration::from_micros(reset_us),
        share_mtps,
        rate_mtps,
        leasers,
        quota: Quota::with_parts(rate, Duration::from_micros(period), burst).map_err(|_| bad())?,
        source: QuotaSource::from_code(source).ok_or_else(bad)?,
        at: None,
    })
}

/// `script`'s reply as a `T`, or a [`StoreError::BadReply`] that says what came instead.
fn read_reply<T: redis::FromRedisValue>(
    value: redis::Value,
    script: &redis::Script,
) -> Result<T, StoreError> {
    T::from_redis_value(value)
        .map_err(|e| StoreError::BadReply(format!("{e} (script {})", script.get_hash())))
}

/// A reply's integers as counts: a negative one is a [`StoreError::BadReply`].
fn counts(reply: Vec<i64>) -> Result<Vec<u64>, StoreError> {
    reply
        .iter()
        .map(|&v| u64::try_from(v))
        .collect::<Result<_, _>>()
        .map_err(|_| StoreError::BadReply(format!("expected counts, got {reply:?}")))
}

/// A packed reply's integers: little-endian doubles, each truncated toward zero as Redis
/// truncates a Lua number it makes an integer reply of (so both protocols read the same).
fn unpacked(reply: &[u8]) -> Result<Vec<u64>, StoreError> {
    let bad = || StoreError::BadReply(format!("expected packed integers, got {reply:?}"));
    if !reply.len().is_multiple_of(8) {
        return Err(bad());
    }
    reply
        .chunks_exact(8)
        .map(|b| {
            let v = f64::from_le_bytes(b.try_into().expect("8 bytes"));
            // As a `u64` (Redis's integer is signed: a negative one fails to parse as one
            // there). NaN fails both comparisons.
            if v >= 0.0 && v < u64::MAX as f64 {
                Ok(v as u64)
            } else {
                Err(bad())
            }
        })
        .collect()
}

/// `op` and the quota: the script's first four arguments.
fn quota_args(op: &str, quota: &Quota) -> [String; 4] {
    [
        op.to_owned(),
        quota.rate().to_string(),
        quota.period_us().to_string(),
        quota.burst().to_string(),
    ]
}

impl ConfigStore for RedisStore {
    async fn init_config(&self, name: &str, quota: &Quota) -> Result<(Quota, bool), StoreError> {
        match self.config_op(name, "config_init", Some(quota)).await? {
            (Some(q), written) => Ok((q, written)),
            (None, _) => Err(StoreError::Rejected("invalid stored config".into())),
        }
    }

    async fn modify_config(&self, name: &str, quota: &Quota) -> Result<bool, StoreError> {
        Ok(self.config_op(name, "config_set", Some(quota)).await?.1)
    }

    async fn delete_config(&self, name: &str) -> Result<bool, StoreError> {
        Ok(self.config_op(name, "config_delete", None).await?.1)
    }

    async fn get_config(&self, name: &str) -> Result<Option<Quota>, StoreError> {
        match self.config_op(name, "config_get", None).await? {
            (None, true) => Err(StoreError::Rejected("invalid stored config".into())),
            (q, _) => Ok(q),
        }
    }
}

impl LeaseStore for RedisStore {
    async fn lease(
        &self,
        name: &str,
        quota: &Quota,
        req: &LeaseRequest,
    ) -> Result<LeaseReply, StoreError> {
        match req.node {
            Some(_) => self.patient().lease_call(name, quota, req).await,
            None => self.lease_call(name, quota, req).await,
        }
    }

    async fn release(
        &self,
        name: &str,
        quota: &Quota,
        req: &ReleaseRequest,
    ) -> Result<LeaseReply, StoreError> {
        match req.node {
            Some(_) => self.patient().release_call(name, quota, req).await,
            None => self.release_call(name, quota, req).await,
        }
    }
}

impl RedisStore {
    /// A lease call, bounded by this handle's timeout.
    async fn lease_call(
        &self,
        name: &str,
        quota: &Quota,
        req: &LeaseRequest,
    ) -> Result<LeaseReply, StoreError> {
        if req.algorithm != Algorithm::TokenBucket {
            let op = protocol::lease_op(req)?;
            return self
                .run_algorithm(name, req.client, quota, req.algorithm, op)
                .await;
        }
        let unconfigured = if req.fallback_to_caller { "" } else { "none" };
        if let Some(n) = req.node {
            let rate = match n.rate_mtps {
                0 => -1.0,
                r => r as f64,
            };
            let node = [
                n.held as f64,
                n.demand_mtps as f64,
                micros(n.horizon) as f64,
                micros(n.ttl) as f64,
                rate,
                n.release_seq as f64,
            ];
            let asked = [req.want as f64, req.min as f64];
            return self
                .run_packed(
                    name,
                    req.client,
                    quota,
                    "node_lease",
                    asked,
                    node,
                    n.id,
                    unconfigured,
                )
                .await;
        }
        // An anonymous lease: want, min, now, and ARGV[13] (the node's arguments empty).
        let mut args: [String; 10] = Default::default();
        args[0] = req.want.to_string();
        args[1] = req.min.to_string();
        args[2] = self.now_arg();
        args[8] = unconfigured.to_owned();
        // Arguments the script accepts (else every key: it answers the error).
        let valid = 1 <= req.min && req.min <= req.want && req.want <= MAX_VALUE;
        let anonymous = (valid && req.min <= quota.burst()).then_some(Anonymous {
            min: req.min,
            configured_only: !req.fallback_to_caller,
        });
        self.run(name, req.client, quota, "lease", anonymous, args)
            .await
    }

    /// A release call, bounded by this handle's timeout.
    async fn release_call(
        &self,
        name: &str,
        quota: &Quota,
        req: &ReleaseRequest,
    ) -> Result<LeaseReply, StoreError> {
        if req.algorithm != Algorithm::TokenBucket {
            let op = protocol::release_op(req)?;
            return self
                .run_algorithm(name, req.client, quota, req.algorithm, op)
                .await;
        }
        if let Some(n) = req.node {
            let node = [
                n.seq as f64,
                f64::from(u8::from(n.leaving)),
                0.0,
                0.0,
                0.0,
                0.0,
            ];
            let asked = [req.tokens as f64, 0.0];
            return self
                .run_packed(
                    name,
                    req.client,
                    quota,
                    "node_release",
                    asked,
                    node,
                    n.id,
                    "",
                )
                .await;
        }
        // An anonymous release: tokens, 0, now (the node's arguments empty).
        let mut args: [String; 10] = Default::default();
        args[0] = req.tokens.to_string();
        args[1] = "0".to_owned();
        args[2] = self.now_arg();
        let anonymous = (req.tokens <= MAX_VALUE).then_some(Anonymous {
            min: 0,
            configured_only: false,
        });
        self.run(name, req.client, quota, "release", anonymous, args)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// redis-rs reads `-1` as a `u64` by wrapping it (a grant of 2^64 − 1 tokens); read as a
    /// count it is a bad reply, as is a reply of another type (a server answered: no outage).
    #[test]
    fn a_negative_or_wrong_typed_reply_is_a_bad_reply_not_a_wrapped_count() {
        let script = redis::Script::new("return 1");
        let ints =
            |v: &[i64]| redis::Value::Array(v.iter().map(|&i| redis::Value::Int(i)).collect());
        let read = |v| counts(read_reply(v, &script)?);
        assert_eq!(read(ints(&[0, 5, 7])).unwrap(), [0, 5, 7]);
        let wrapped: Vec<u64> = redis::FromRedisValue::from_redis_value(ints(&[-1])).unwrap();
        assert_eq!(wrapped, [u64::MAX], "what reading it as a u64 gives");
        for bad in [
            ints(&[3, -1, 2]),
            redis::Value::SimpleString("OK".into()),
            redis::Value::Array(vec![redis::Value::BulkString(b"x".to_vec())]),
        ] {
            let e = read(bad.clone()).unwrap_err();
            assert!(matches!(e, StoreError::BadReply(_)), "{bad:?}: {e:?}");
            assert!(!e.is_outage(), "{e}");
        }
    }
}
