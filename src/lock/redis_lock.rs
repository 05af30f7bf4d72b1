//! [`RedisLock`]: a handle on one named lock, and its builder.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_core::Stream;
use redis::aio::{ConnectionManager, PubSubSink, PubSubStream};
use tokio::time::Instant;

use super::error::LockError;
use super::guard::LockGuard;
use super::owner::LockOwner;
use super::script::{self, Attempt, LockKeys};
use crate::connect::{connection_manager, ConnectError, ConnectSettings};
use crate::key;
use crate::store::RedisStore;
use crate::time;

/// Default lease: how long a lock outlives a holder that stops renewing it (Redisson's 30 s).
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// Default fallback poll of a waiting [`RedisLock::lock`], in case an unlock message is lost.
pub const DEFAULT_POLL: Duration = Duration::from_millis(100);
/// Default key prefix of locks.
pub const DEFAULT_LOCK_PREFIX: &str = "ratelease:";

/// Task ids drawn by [`RedisLock::new_owner`] have this bit set, so they never collide with
/// small explicit ids given to [`RedisLock::owner`].
const AUTO_TASK_BIT: u64 = 1 << 63;

/// What every handle made from one builder shares.
pub(crate) struct Shared {
    pub(crate) conn: ConnectionManager,
    /// For unlock subscriptions; without one (a lock on a bare connection manager) waiters
    /// poll.
    client: Option<redis::Client>,
    pub(crate) prefix: String,
    process: u64,
    next_task: AtomicU64,
    pub(crate) lease: Duration,
    poll: Duration,
    pub(crate) watchdog: bool,
    connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
}

/// A re-entrant distributed lock in Redis, after Redisson's `RLock`. See the
/// [module docs](crate::lock) for the design.
///
/// Cheap to clone: clones share the connection and the process id.
///
/// Needs a single Redis (primary), not a Redis Cluster: waiters subscribe to the unlock
/// channel on one node, and there is no cluster builder. (Its keys would hash to one slot,
/// like a limiter's.)
///
/// ```no_run
/// # async fn demo() -> Result<(), ratelease::LockError> {
/// use ratelease::RedisLock;
///
/// let lock = RedisLock::connect("redis://127.0.0.1:6379/", "invoice-42").await?;
/// let me = lock.new_owner();
/// let guard = lock.lock(&me).await?;
/// // … write downstream, passing guard.fencing_token() along …
/// guard.unlock().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisLock {
    pub(crate) shared: Arc<Shared>,
    pub(crate) name: Arc<str>,
    pub(crate) keys: Arc<LockKeys>,
}

impl std::fmt::Debug for RedisLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLock")
            .field("name", &self.name)
            .field("key", &self.keys.lock)
            .field("process", &format_args!("{:016x}", self.shared.process))
            .field("lease", &self.shared.lease)
            .field("watchdog", &self.shared.watchdog)
            .finish()
    }
}

/// Configures and connects a [`RedisLock`].
#[must_use]
#[derive(Debug, Clone)]
pub struct RedisLockBuilder {
    target: LockTarget,
    name: String,
    prefix: String,
    lease: Duration,
    poll: Duration,
    watchdog: bool,
    connect_timeout: Duration,
    response_timeout: Duration,
    #[cfg(feature = "tls")]
    tls_root: Option<Vec<u8>>,
}

/// What a lock builder connects to.
#[derive(Clone)]
enum LockTarget {
    /// A URL: the builder opens a connection.
    Url(String),
    /// The caller's client: the builder opens a connection manager on it.
    Client(redis::Client),
    /// An open connection manager (a store's, or the caller's), its client if known, and what
    /// errors call its server.
    Manager(ConnectionManager, Option<redis::Client>, Arc<str>),
    /// A store whose connection a lock cannot use; the message says why.
    Unusable(&'static str),
}

impl std::fmt::Debug for LockTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockTarget::Url(url) => f.debug_tuple("Url").field(&key::redact_url(url)).finish(),
            LockTarget::Client(c) => f
                .debug_tuple("Client")
                .field(&c.get_connection_info().addr().to_string())
                .finish(),
            LockTarget::Manager(_, client, _) => f
                .debug_tuple("Manager")
                .field(
                    &client
                        .as_ref()
                        .map(|c| c.get_connection_info().addr().to_string()),
                )
                .finish(),
            LockTarget::Unusable(why) => f.debug_tuple("Unusable").field(why).finish(),
        }
    }
}

impl RedisLockBuilder {
    /// Key prefix (default [`DEFAULT_LOCK_PREFIX`]); must not contain braces.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Lease time (default [`DEFAULT_LEASE`], 1 ms to 2^52 ms, else
    /// [`connect`](Self::connect) says [`LockError::Config`]): how long the lock stays held if
    /// its holder dies. With the watchdog on, a live holder renews it every third of it.
    pub fn lease_time(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Fallback poll of a waiting [`RedisLock::lock`] (default [`DEFAULT_POLL`]). Waiters wake
    /// on the unlock message; the poll only bounds the wait if a message is lost.
    pub fn poll_interval(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// Whether a guard renews its lease while it lives (default `true`). Off, a lock is held
    /// for one lease time from its last acquisition, re-entry or partial release (each of
    /// which renews the lease, as in Redisson) unless released earlier.
    pub fn watchdog(mut self, on: bool) -> Self {
        self.watchdog = on;
        self
    }

    /// Time allowed to open a connection (default 1 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Time allowed for one reply (default 250 ms).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Trusts the PEM root certificate(s) `pem` for `rediss://` instead of the system's roots
    /// (as [`RedisStoreBuilder::tls_root_certificate`](crate::RedisStoreBuilder::tls_root_certificate)).
    #[cfg(feature = "tls")]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root = Some(pem.into());
        self
    }

    /// Validates the configuration and connects.
    ///
    /// # Errors
    /// [`LockError::Config`] for a bad name, prefix, URL, zero lease, zero poll interval or
    /// zero timeout;
    /// [`LockError::Redis`] or [`LockError::Timeout`] if Redis cannot be reached.
    pub async fn connect(self) -> Result<RedisLock, LockError> {
        key::validate_prefix(&self.prefix)?;
        let server: Arc<str> = match &self.target {
            LockTarget::Url(url) => key::redact_url(url),
            LockTarget::Client(c) => c.get_connection_info().addr().to_string(),
            LockTarget::Manager(_, _, server) => server.to_string(),
            LockTarget::Unusable(_) => String::new(),
        }
        .into();
        let keys = LockKeys::new(&self.prefix, &self.name, server.clone())?;
        if self.lease.as_millis() == 0 {
            return Err(LockError::Config(format!(
                "lease time {:?} is below the 1 ms resolution of PEXPIRE",
                self.lease
            )));
        }
        if self.lease.as_millis() > u128::from(crate::MAX_VALUE) {
            // The script refuses it: every acquisition would fail.
            return Err(LockError::Config(format!(
                "lease time {:?} is above the longest Redis keeps (2^52 ms); \
                 the watchdog renews a shorter one for as long as the guard lives",
                self.lease
            )));
        }
        if self.poll.is_zero() {
            return Err(LockError::Config("poll interval must not be zero".into()));
        }
        #[allow(unused_mut)] // mutated only with feature `tls`
        let mut settings = ConnectSettings::new(self.connect_timeout, self.response_timeout);
        #[cfg(feature = "tls")]
        {
            let own = matches!(self.target, LockTarget::Url(_));
            if self.tls_root.is_some() && !own {
                return Err(LockError::Config(
                    "tls_root_certificate applies to a URL only: configure TLS on the \
                     redis::Client of a shared connection"
                        .into(),
                ));
            }
            settings.tls_root = self.tls_root;
        }
        let connect_error = |e| match e {
            ConnectError::Url(msg) => LockError::Config(msg),
            ConnectError::Redis(e) => match LockError::from(e) {
                LockError::Redis(e) => LockError::Redis(e.at(&server, None)),
                other => other,
            },
        };
        // A bad PEM is a configuration error that names it, as for a store.
        settings.validate().map_err(connect_error)?;
        let (client, conn) = match self.target {
            LockTarget::Url(url) => connection_manager(&url, &settings)
                .await
                .map(|(client, conn)| (Some(client), conn))
                .map_err(connect_error)?,
            LockTarget::Client(client) => {
                let conn = crate::connect::manager_for(client.clone(), &settings)
                    .await
                    .map_err(connect_error)?;
                (Some(client), conn)
            }
            LockTarget::Manager(conn, client, _) => (client, conn),
            LockTarget::Unusable(why) => return Err(LockError::Config(why.into())),
        };
        let shared = Shared {
            conn,
            client,
            prefix: self.prefix,
            process: fastrand::u64(..),
            next_task: AtomicU64::new(0),
            lease: self.lease,
            poll: self.poll,
            watchdog: self.watchdog,
            connect_timeout: self.connect_timeout,
            response_timeout: self.response_timeout,
        };
        Ok(RedisLock {
            shared: Arc::new(shared),
            name: self.name.into(),
            keys: Arc::new(keys),
        })
    }
}

impl RedisLock {
    /// A builder for lock `name` on the Redis at `url`.
    pub fn builder(url: impl Into<String>, name: impl Into<String>) -> RedisLockBuilder {
        Self::builder_at(LockTarget::Url(url.into()), name.into())
    }

    /// A builder for lock `name` on the server the caller's `client` points at (its URL,
    /// credentials and TLS settings); [`connect`](RedisLockBuilder::connect) opens one
    /// connection manager on it with the builder's timeouts.
    pub fn builder_with_client(client: redis::Client, name: impl Into<String>) -> RedisLockBuilder {
        Self::builder_at(LockTarget::Client(client), name.into())
    }

    /// A builder for lock `name` on the caller's connection manager: lock calls share it and
    /// no connection is opened. With no `redis::Client` to subscribe with, a waiting
    /// [`lock`](Self::lock) polls every [`poll_interval`](RedisLockBuilder::poll_interval)
    /// instead of waking on the unlock message; pass the client too
    /// ([`builder_with_client`](Self::builder_with_client) opens its own manager instead).
    pub fn builder_with_connection_manager(
        manager: ConnectionManager,
        client: Option<redis::Client>,
        name: impl Into<String>,
    ) -> RedisLockBuilder {
        let server = match &client {
            Some(c) => c.get_connection_info().addr().to_string(),
            None => "a shared connection manager".to_owned(),
        };
        Self::builder_at(
            LockTarget::Manager(manager, client, server.into()),
            name.into(),
        )
    }

    /// A builder for lock `name` sharing `store`'s connection (and its client, for unlock
    /// subscriptions), so a service that limits and locks holds one connection to Redis. Its
    /// calls wait as long as that connection's reply timeout, the store's longest: its
    /// [lease timeout](crate::RedisStoreBuilder::lease_timeout).
    /// The store must be on one server: for a cluster or Sentinel store,
    /// [`connect`](RedisLockBuilder::connect) fails with [`LockError::Config`].
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use ratelease::{RedisLock, RedisStore};
    ///
    /// let store = RedisStore::connect("redis://127.0.0.1:6379/").await?;
    /// let lock = RedisLock::builder_on_store(&store, "invoice-42").connect().await?;
    /// # Ok(()) }
    /// ```
    pub fn builder_on_store(store: &RedisStore, name: impl Into<String>) -> RedisLockBuilder {
        let target = match store.connection_manager() {
            Some(manager) => LockTarget::Manager(
                manager.clone(),
                store.client().cloned(),
                store.server().into(),
            ),
            None => LockTarget::Unusable(
                "a lock needs a single Redis: this store is on a cluster or a Sentinel group",
            ),
        };
        Self::builder_at(target, name.into())
    }

    fn builder_at(target: LockTarget, name: String) -> RedisLockBuilder {
        RedisLockBuilder {
            target,
            name,
            prefix: DEFAULT_LOCK_PREFIX.to_owned(),
            lease: DEFAULT_LEASE,
            poll: DEFAULT_POLL,
            watchdog: true,
            connect_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_millis(250),
            #[cfg(feature = "tls")]
            tls_root: None,
        }
    }

    /// Connects to lock `name` on `url` with default settings.
    ///
    /// # Errors
    /// As [`RedisLockBuilder::connect`].
    pub async fn connect(
        url: impl Into<String>,
        name: impl Into<String>,
    ) -> Result<Self, LockError> {
        Self::builder(url, name).connect().await
    }

    /// Another lock on the same connection, with the same settings and process id.
    ///
    /// # Errors
    /// [`LockError::Config`] for an empty or too long name.
    pub fn named(&self, name: impl Into<String>) -> Result<Self, LockError> {
        let name: String = name.into();
        let keys = LockKeys::new(&self.shared.prefix, &name, self.keys.server.clone())?;
        Ok(RedisLock {
            shared: self.shared.clone(),
            name: name.into(),
            keys: Arc::new(keys),
        })
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The Redis hash holding the lock (`<prefix>{<name>}:lock`); the fencing counter is at
    /// `…:fence` and unlocks are published on `…:unlock`.
    pub fn key(&self) -> &str {
        &self.keys.lock
    }

    /// The lease time.
    pub fn lease_time(&self) -> Duration {
        self.shared.lease
    }

    /// The owner `task_id` of this handle's process.
    pub fn owner(&self, task_id: u64) -> LockOwner {
        LockOwner::new(self.shared.process, task_id)
    }

    /// A fresh owner of this handle's process, distinct from every other one it made.
    pub fn new_owner(&self) -> LockOwner {
        let task = self.shared.next_task.fetch_add(1, Ordering::Relaxed);
        self.owner(task | AUTO_TASK_BIT)
    }

    /// Tries once: the lock if it is free or already held by `owner` (re-entry), `None` if
    /// another owner holds it.
    ///
    /// # Errors
    /// If Redis fails or does not answer in time.
    pub async fn try_lock(&self, owner: &LockOwner) -> Result<Option<LockGuard>, LockError> {
        match self.attempt(owner).await? {
            Attempt::Acquired { fence, count } => Ok(Some(self.guard(owner, fence, count))),
            Attempt::Held { .. } => Ok(None),
        }
    }

    /// Waits for the lock at most `timeout`; `None` if it was not free in time.
    ///
    /// # Cancel safety
    /// Dropping the future before it completes is safe unless it was dropped while the
    /// acquiring script ran: then the lock may be taken without a guard and stays held until
    /// its lease ends.
    ///
    /// # Errors
    /// If Redis fails or does not answer in time.
    pub async fn try_lock_for(
        &self,
        owner: &LockOwner,
        timeout: Duration,
    ) -> Result<Option<LockGuard>, LockError> {
        self.wait(owner, Some(time::from_now(timeout))).await
    }

    /// Waits until the lock is acquired.
    ///
    /// The waiter subscribes to the unlock channel and retries when a release is published,
    /// when the holder's lease should have ended, or every poll interval, whichever comes
    /// first; so a lost message or a dead holder costs at most one poll interval.
    ///
    /// # Cancel safety
    /// As [`try_lock_for`](Self::try_lock_for).
    ///
    /// # Errors
    /// If Redis fails or does not answer in time.
    pub async fn lock(&self, owner: &LockOwner) -> Result<LockGuard, LockError> {
        match self.wait(owner, None).await? {
            Some(guard) => Ok(guard),
            None => unreachable!("a wait without deadline only ends with the lock"),
        }
    }

    /// How many times `owner` holds the lock now (0: not at all).
    ///
    /// # Errors
    /// If Redis fails.
    pub async fn hold_count(&self, owner: &LockOwner) -> Result<u64, LockError> {
        let mut conn = self.shared.conn.clone();
        let count: Option<u64> = redis::cmd("HGET")
            .arg(&self.keys.lock)
            .arg(owner.field())
            .query_async(&mut conn)
            .await
            .map_err(|e| self.keys.locate(e.into()))?;
        Ok(count.unwrap_or(0))
    }

    /// Whether anyone holds the lock now.
    ///
    /// # Errors
    /// If Redis fails.
    pub async fn is_locked(&self) -> Result<bool, LockError> {
        let mut conn = self.shared.conn.clone();
        let n: u64 = redis::cmd("EXISTS")
            .arg(&self.keys.lock)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.keys.locate(e.into()))?;
        Ok(n == 1)
    }

    async fn attempt(&self, owner: &LockOwner) -> Result<Attempt, LockError> {
        let s = &self.shared;
        script::acquire(&s.conn, &self.keys, owner, s.lease, s.response_timeout).await
    }

    fn guard(&self, owner: &LockOwner, fence: u64, count: u64) -> LockGuard {
        LockGuard::new(self.clone(), *owner, fence, count)
    }

    async fn wait(
        &self,
        owner: &LockOwner,
        deadline: Option<Instant>,
    ) -> Result<Option<LockGuard>, LockError> {
        if let Attempt::Acquired { fence, count } = self.attempt(owner).await? {
            return Ok(Some(self.guard(owner, fence, count)));
        }
        // Out of time already (`try_lock_for` with a zero timeout): no subscription to open.
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(None);
        }
        // Subscribe before the next attempt, so an unlock between the two is not missed.
        let mut messages = self.subscribe(deadline).await;
        loop {
            let ttl = match self.attempt(owner).await? {
                Attempt::Acquired { fence, count } => {
                    return Ok(Some(self.guard(owner, fence, count)))
                }
                Attempt::Held { ttl } => ttl,
            };
            let now = Instant::now();
            // Saturating: a poll interval of `Duration::MAX` (unlocks only) is a valid setting.
            let mut wake = time::after(now, self.shared.poll);
            if let Some(ttl) = ttl {
                wake = wake.min(time::after(now, ttl));
            }
            if let Some(deadline) = deadline {
                if now >= deadline {
                    return Ok(None);
                }
                wake = wake.min(deadline);
            }
            match messages.as_mut() {
                Some((_, stream)) => {
                    let next = std::future::poll_fn(|cx| Pin::new(&mut *stream).poll_next(cx));
                    if let Ok(None) = tokio::time::timeout_at(wake, next).await {
                        // The subscription's connection closed: poll from now on.
                        tracing::debug!(lock = %self.name, "unlock subscription closed; polling");
                        messages = None;
                        tokio::time::sleep_until(wake).await;
                    }
                }
                None => tokio::time::sleep_until(wake).await,
            }
        }
    }

    /// A subscription to the unlock channel, or `None` (polling only) if it cannot be made
    /// within the connect timeout, or by `deadline` (the wait's).
    async fn subscribe(&self, deadline: Option<Instant>) -> Option<(PubSubSink, PubSubStream)> {
        let s = &self.shared;
        let client = s.client.as_ref()?;
        let connect_by = time::from_now(s.connect_timeout);
        let until = deadline.map_or(connect_by, |d| d.min(connect_by));
        let result = tokio::time::timeout_at(until, async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&self.keys.channel).await?;
            // Keep the sink too: the stream alone would outlive its subscription's writer.
            Ok::<_, redis::RedisError>(pubsub.split())
        })
        .await;
        match result {
            Ok(Ok(stream)) => Some(stream),
            Ok(Err(e)) => {
                tracing::warn!(lock = %self.name, error = %e, "cannot subscribe to unlocks; polling");
                None
            }
            // The wait's own deadline came first: nothing to warn about.
            Err(_) if until < connect_by => None,
            Err(_) => {
                tracing::warn!(lock = %self.name, "subscribing to unlocks timed out; polling");
                None
            }
        }
    }
}
