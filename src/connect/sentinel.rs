//! The master of a Sentinel-managed Redis, followed across failovers
//! ([`RedisStore::sentinel_builder`](crate::RedisStore::sentinel_builder)).
//!
//! # Design
//!
//! Redis Sentinel watches a primary and its replicas; when the primary fails, the sentinels
//! agree on it, promote a replica, and answer `SENTINEL GET-MASTER-ADDR-BY-NAME <name>` with
//! the new address. A client has to ask again whenever the master it talks to stops being one.
//!
//! redis-rs's own sentinel client (feature `sentinel`) finds the master once and hands out a
//! plain connection: it does not follow a failover, and a `ConnectionManager` built on its
//! answer would keep reconnecting to the old address. So [`SentinelConnection`] keeps one
//! `ConnectionManager` on the current master (with the store's timeouts, reconnecting in the
//! background as for one server) and replaces it when a call shows the master is gone:
//!
//! - A call that fails with a connection error, a timeout, or `READONLY` (the server was
//!   demoted to a replica) triggers a **discovery** before its error is returned, so the next
//!   call goes to the new master as soon as the sentinels name one. The failed call itself is
//!   not retried: a script call whose reply was lost may have run, and running a lease or a
//!   release twice is not harmless.
//! - A discovery asks every sentinel at once (each within the connect and response timeouts)
//!   for the master's address and its replicas, then checks the candidates with `ROLE`, the
//!   named masters first (most-named first), then the replicas: the first that says `master`
//!   wins. A sentinel that has not heard of the promotion yet cannot send the fleet back to a
//!   dead or demoted server, and a single reachable sentinel is enough. Checking the replicas
//!   finds a promoted one as soon as it is promoted (`REPLICAOF NO ONE` from the sentinels),
//!   up to a second before the sentinels name it: they learn of the promotion from its `INFO`.
//! - Discoveries are single-flight: callers that fail together wait for one discovery, and one
//!   that finished after a caller's failure counts for it. While no master is found (the
//!   sentinels have not promoted anyone yet), failing calls keep asking, at most once per
//!   [`REDISCOVER_EVERY`].
//!
//! - Each sentinel is also watched: the store subscribes to its `+failover-state-wait-promotion`
//!   and `+switch-master` channels and switches to the replica being promoted, or the announced
//!   master, as soon as it says `ROLE` master (see [`watch_switches`]). In a graceful failover
//!   the old primary keeps answering, as a master, until the sentinels demote it — seconds
//!   later — so no call fails and only the announcement tells the store to move; every lease
//!   the old primary grants meanwhile is lost to the new one.
//!
//! A hybrid limiter's background task probes a failing store every 10–500 ms, so leasing
//! resumes within one probe of the promotion; see RELIABILITY.md ("Failover") for the measured
//! figures and for what asynchronous replication can lose.
//!
//! The master is reached at the address the sentinels give, with the scheme (`redis://` or
//! `rediss://`, with the store's TLS settings), username, password and database of
//! [`sentinel_master_url`](crate::RedisStoreBuilder::sentinel_master_url), or by default of the
//! first sentinel URL.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisError, RedisResult};
use tokio::time::Instant;

use crate::connect::{ConnectError, ConnectSettings};

/// Least time between two discoveries while no master is found.
pub(crate) const REDISCOVER_EVERY: Duration = Duration::from_millis(100);

/// The longest a discovery started by a failed call may take (less where twice the connect
/// timeout is less).
const DISCOVERY_BOUND: Duration = Duration::from_secs(10);

/// A connection to the current master of a Sentinel-managed group. Cheap to clone; clones
/// share the master connection and the discoveries.
#[derive(Clone)]
pub(crate) struct SentinelConnection {
    inner: Arc<Inner>,
}

struct Inner {
    /// One client per sentinel, in the order given.
    sentinels: Vec<redis::Client>,
    /// The sentinels' name for the group.
    master_name: String,
    /// The first sentinel's connection info: the master's scheme, credentials and database.
    template: ConnectionInfo,
    settings: ConnectSettings,
    /// The master's address and a connection manager on it; `None` before the first discovery.
    current: Mutex<Option<Master>>,
    /// Single flight: held by the discovery under way; the time the last one finished.
    discovery: tokio::sync::Mutex<Option<Instant>>,
    /// Dropped with the last clone: stops the `+switch-master` watchers.
    _stop: tokio::sync::watch::Sender<()>,
}

#[derive(Clone)]
struct Master {
    addr: String,
    conn: ConnectionManager,
}

impl SentinelConnection {
    /// Checks the URLs and the master name; contacts nothing. The master is reached as
    /// `master_url` says (scheme, credentials, database; its host and port are ignored), or
    /// without it as the first sentinel URL says.
    pub(crate) fn new(
        sentinels: &[String],
        master_name: &str,
        master_url: Option<&str>,
        settings: &ConnectSettings,
    ) -> Result<Self, ConnectError> {
        let Some(first) = sentinels.first() else {
            return Err(ConnectError::Url(
                "sentinel: at least one sentinel url is needed".into(),
            ));
        };
        if master_name.is_empty() {
            return Err(ConnectError::Url(
                "sentinel: the master name is empty".into(),
            ));
        }
        for url in sentinels {
            let shown = crate::key::redact_url(url);
            let info = url
                .as_str()
                .into_connection_info()
                .map_err(|e| ConnectError::Url(format!("invalid sentinel url {shown:?}: {e}")))?;
            if matches!(info.addr(), ConnectionAddr::Unix(_)) {
                return Err(ConnectError::Url(format!(
                    "sentinel url {shown:?}: sentinels are reached over TCP"
                )));
            }
        }
        let (what, url) = match master_url {
            Some(url) => ("master url", url),
            None => ("sentinel url", first.as_str()),
        };
        let shown = crate::key::redact_url(url);
        let template = url
            .into_connection_info()
            .map_err(|e| ConnectError::Url(format!("invalid {what} {shown:?}: {e}")))?;
        if matches!(template.addr(), ConnectionAddr::Unix(_)) {
            return Err(ConnectError::Url(format!(
                "{what} {shown:?}: a sentinel-managed master is reached over TCP"
            )));
        }
        let sentinels = sentinels
            .iter()
            .map(|url| settings.client(url))
            .collect::<Result<Vec<_>, _>>()?;
        // The watchers below, like redis-rs's connections, run on the caller's tokio runtime.
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            ConnectError::Url("a sentinel store must be connected inside a tokio runtime".into())
        })?;
        let (stop, stopped) = tokio::sync::watch::channel(());
        let conn = SentinelConnection {
            inner: Arc::new(Inner {
                sentinels,
                master_name: master_name.to_owned(),
                template,
                settings: settings.clone(),
                current: Mutex::new(None),
                discovery: tokio::sync::Mutex::new(None),
                _stop: stop,
            }),
        };
        for sentinel in &conn.inner.sentinels {
            runtime.spawn(watch_switches(
                Arc::downgrade(&conn.inner),
                sentinel.clone(),
                stopped.clone(),
            ));
        }
        Ok(conn)
    }

    /// Switches to the server at `host:port` if it says it is a master; whether it is now the
    /// current one.
    async fn follow(&self, host: &str, port: u16) -> RedisResult<bool> {
        let addr = format!("{host}:{port}");
        let mut last = self.inner.discovery.lock().await;
        if self.inner.current.lock().as_ref().map(|m| &m.addr) == Some(&addr) {
            return Ok(true);
        }
        let client = self.client_at(host, port)?;
        if !is_master(&self.inner.settings, &client).await? {
            return Ok(false);
        }
        let conn = crate::connect::manager_on(client, &self.inner.settings)?;
        self.switch(Master { addr, conn });
        *last = Some(Instant::now());
        Ok(true)
    }

    /// Follows the replica at `host:port` once it says it is a master: a sentinel has just
    /// sent it `REPLICAOF NO ONE`. Gives up after [`PROMOTION_WAIT`] (the failover was aborted,
    /// or the announcement will come by `+switch-master`).
    async fn follow_promotion(self, host: String, port: u16) {
        let deadline = Instant::now() + PROMOTION_WAIT;
        while Instant::now() < deadline {
            match self.follow(&host, port).await {
                Ok(true) => return,
                Ok(false) | Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }

    /// Makes `master` the current one (logged if it replaces another).
    fn switch(&self, master: Master) {
        let mut current = self.inner.current.lock();
        if current.as_ref().map(|m| &m.addr) == Some(&master.addr) {
            return;
        }
        if let Some(old) = current.as_ref() {
            tracing::warn!(
                master = %self.inner.master_name,
                from = %old.addr,
                to = %master.addr,
                "sentinel: following the master to its new address"
            );
        }
        *current = Some(master);
    }

    /// Finds the master now (for a store that connects eagerly).
    pub(crate) async fn connect(&self) -> RedisResult<()> {
        self.master().await.map(drop)
    }

    /// The current master, discovering it first if there is none yet.
    async fn master(&self) -> RedisResult<Master> {
        if let Some(master) = self.inner.current.lock().clone() {
            return Ok(master);
        }
        self.rediscover(Instant::now()).await?;
        self.inner.current.lock().clone().ok_or_else(|| {
            RedisError::from((redis::ErrorKind::Client, "sentinel: no master found"))
        })
    }

    /// Runs a discovery for a failure seen at `failed_at`, unless one finished since then, or
    /// one finished less than [`REDISCOVER_EVERY`] ago: then its outcome stands (a master, or
    /// none yet).
    async fn rediscover(&self, failed_at: Instant) -> RedisResult<()> {
        let mut last = self.inner.discovery.lock().await;
        if let Some(done) = *last {
            if done >= failed_at || done.elapsed() < REDISCOVER_EVERY {
                if self.inner.current.lock().is_some() {
                    return Ok(());
                }
                return Err(RedisError::from((
                    redis::ErrorKind::Client,
                    "sentinel: no master found (the last discovery failed just now)",
                )));
            }
        }
        let result = self.discover().await;
        *last = Some(Instant::now());
        self.switch(result?);
        Ok(())
    }

    /// Asks the sentinels for the master and checks it; a connection manager on it (the current
    /// one if the address did not change).
    async fn discover(&self) -> RedisResult<Master> {
        let inner = &*self.inner;
        let mut asks = tokio::task::JoinSet::new();
        for (i, sentinel) in inner.sentinels.iter().enumerate() {
            let (sentinel, settings) = (sentinel.clone(), inner.settings.clone());
            let name = inner.master_name.clone();
            asks.spawn(async move {
                let mut conn = settings.short_connection(&sentinel).await?;
                let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(&name)
                    .query_async(&mut conn)
                    .await?;
                let replicas: Vec<HashMap<String, String>> = match addr {
                    Some(_) => redis::cmd("SENTINEL")
                        .arg("REPLICAS")
                        .arg(&name)
                        .query_async(&mut conn)
                        .await
                        .unwrap_or_default(),
                    None => Vec::new(),
                };
                Ok::<_, RedisError>((i, addr, replicas))
            });
        }
        // Candidates: the addresses the sentinels name as master, by how many name them (ties
        // in the sentinels' order), then the replicas they know. A replica is taken only if it
        // says it is a master: the sentinels promoted it and have not all said so yet (they
        // learn it from the replica's INFO, up to a second later).
        let mut named: HashMap<(String, u16), (usize, usize)> = HashMap::new();
        let mut last_error = None;
        while let Some(joined) = asks.join_next().await {
            match joined {
                Ok(Ok((i, Some(addr), replicas))) => {
                    let entry = named.entry(addr).or_insert((0, i));
                    entry.0 += 1;
                    entry.1 = entry.1.min(i);
                    for replica in replicas {
                        let flags = replica.get("flags").map_or("", String::as_str);
                        let port = replica.get("port").and_then(|p| p.parse::<u16>().ok());
                        let (Some(ip), Some(port)) = (replica.get("ip"), port) else {
                            continue;
                        };
                        if flags.contains("s_down") || flags.contains("disconnected") {
                            continue;
                        }
                        // Ranked after every named master (count 0), in the sentinels' order.
                        named
                            .entry((ip.clone(), port))
                            .or_insert((0, inner.sentinels.len() + i));
                    }
                }
                Ok(Ok((_, None, _))) => {
                    last_error = Some(RedisError::from((
                        redis::ErrorKind::Client,
                        "sentinel: a sentinel does not know the master name",
                        inner.master_name.clone(),
                    )));
                }
                Ok(Err(e)) => last_error = Some(e),
                Err(e) => last_error = Some(RedisError::from(std::io::Error::other(e.to_string()))),
            }
        }
        let mut candidates: Vec<_> = named.into_iter().collect();
        candidates.sort_by_key(|&(_, (count, first))| (std::cmp::Reverse(count), first));
        // The current master, kept if the sentinels still name it but it cannot be reached
        // (it reconnects by itself): nothing better is known yet.
        let mut keep = None;
        for ((host, port), _) in candidates {
            let addr = format!("{host}:{port}");
            let current = inner.current.lock().clone().filter(|m| m.addr == addr);
            let client = self.client_at(&host, port)?;
            match is_master(&inner.settings, &client).await {
                Ok(true) => {
                    return match current {
                        Some(current) => Ok(current),
                        None => {
                            let conn = crate::connect::manager_on(client, &inner.settings)?;
                            Ok(Master { addr, conn })
                        }
                    };
                }
                Ok(false) => {
                    last_error = Some(RedisError::from((
                        redis::ErrorKind::Client,
                        "sentinel: the address the sentinels name is not a master (yet)",
                        addr,
                    )));
                }
                Err(e) => {
                    keep = keep.or(current);
                    last_error = Some(e);
                }
            }
        }
        if let Some(current) = keep {
            return Ok(current);
        }
        Err(last_error.unwrap_or_else(|| {
            RedisError::from((redis::ErrorKind::Client, "sentinel: no master found"))
        }))
    }

    /// A client for the master candidate at `host:port`, as the template says.
    fn client_at(&self, host: &str, port: u16) -> RedisResult<redis::Client> {
        let template = &self.inner.template;
        let addr = match template.addr() {
            ConnectionAddr::TcpTls { insecure, .. } => ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: *insecure,
                tls_params: None,
            },
            _ => ConnectionAddr::Tcp(host.to_owned(), port),
        };
        self.inner
            .settings
            .client_at(template.clone().set_addr(addr))
            .map_err(|e| match e {
                ConnectError::Url(msg) => {
                    RedisError::from((redis::ErrorKind::InvalidClientConfig, "sentinel", msg))
                }
                ConnectError::Redis(e) => e,
            })
    }

    /// Sends `cmd` to the master; on an error that says the master is gone, discovers it again
    /// before returning the error.
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        Box::pin(async move {
            let mut master = self.master().await?;
            let result = master.conn.req_packed_command(cmd).await;
            self.after(&result);
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        Box::pin(async move {
            let mut master = self.master().await?;
            let result = master
                .conn
                .req_packed_commands(pipeline, offset, count)
                .await;
            self.after(&result);
            result
        })
    }

    /// After a call: a discovery if its error says the master may have moved, on a task of
    /// its own. The call is bounded by its caller's timeout (50 ms for a decision), which a
    /// discovery outlasts where a host does not answer (each sentinel is asked, for up to a
    /// connect timeout): run inside the call, it was cut short and never switched, and
    /// following a failover was left to the sentinels' announcements. Discoveries are single
    /// flight (`rediscover`).
    fn after<T>(&self, result: &RedisResult<T>) {
        let Err(e) = result else { return };
        // One at a time: a discovery under way answers the calls failing meanwhile.
        if master_may_have_moved(e) && self.inner.discovery.try_lock().is_ok() {
            let this = self.clone();
            let failed_at = Instant::now();
            // Bounded on its own (each sentinel is asked for up to a connect timeout, which
            // may be `Duration::MAX`): a discovery that never ends would hold every later one.
            let bound = this
                .inner
                .settings
                .connect_timeout
                .saturating_mul(2)
                .min(DISCOVERY_BOUND);
            tokio::spawn(async move {
                // Its own error is not the caller's: the call's error is returned either way.
                match tokio::time::timeout(bound, this.rediscover(failed_at)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => {
                        tracing::debug!(master = %this.inner.master_name, %error, "sentinel: no master yet");
                    }
                    Err(_) => {
                        tracing::debug!(master = %this.inner.master_name, "sentinel: discovery timed out");
                    }
                }
            });
        }
    }

    pub(crate) fn get_db(&self) -> i64 {
        self.inner.template.redis_settings().db()
    }
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        SentinelConnection::req_packed_command(self, cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        SentinelConnection::req_packed_commands(self, pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        SentinelConnection::get_db(self)
    }
}

/// How long a watcher waits before subscribing again after its sentinel could not be reached
/// or closed the subscription.
const RESUBSCRIBE_EVERY: Duration = Duration::from_secs(1);

/// How long a watcher polls a replica a sentinel is promoting before leaving it to
/// `+switch-master`.
const PROMOTION_WAIT: Duration = Duration::from_secs(2);

/// Subscribes to two of `sentinel`'s event channels and follows the group's master as they
/// announce it, until the connection `inner` belongs to is dropped (`stop` closes):
///
/// - `+failover-state-wait-promotion` (`slave <ip:port> <ip> <port> @ <name> <ip> <port>`):
///   the failover's leader has just sent the chosen replica `REPLICAOF NO ONE`. The replica is
///   polled with `ROLE` and followed once it says `master` — the earliest moment a client can
///   know.
/// - `+switch-master` (`<name> <old ip> <old port> <new ip> <new port>`): the sentinels' new
///   configuration, about a second after the promotion (they learn of it from the replica's
///   `INFO`); it covers a promotion whose first announcement was missed.
///
/// This is what follows a *graceful* failover (`SENTINEL FAILOVER`, or a replica promoted while
/// the old primary still answers): the old primary keeps accepting writes until the sentinels
/// get round to demoting it, which can take seconds, and every lease it grants meanwhile is
/// lost to the new one. A failed call cannot tell; the announcements can.
async fn watch_switches(
    inner: std::sync::Weak<Inner>,
    sentinel: redis::Client,
    mut stop: tokio::sync::watch::Receiver<()>,
) {
    use futures_core::Stream;
    use std::pin::Pin;

    loop {
        let Some((timeout, name)) = inner
            .upgrade()
            .map(|i| (i.settings.connect_timeout, i.master_name.clone()))
        else {
            return;
        };
        let subscribed = tokio::time::timeout(timeout, async {
            let mut pubsub = sentinel.get_async_pubsub().await?;
            pubsub
                .subscribe(&["+switch-master", "+failover-state-wait-promotion"])
                .await?;
            Ok::<_, RedisError>(pubsub.split())
        })
        .await;
        // Keep the sink: the stream alone would outlive its subscription's writer.
        if let Ok(Ok((_sink, mut stream))) = subscribed {
            loop {
                let next = std::future::poll_fn(|cx| Pin::new(&mut stream).poll_next(cx));
                let message = tokio::select! {
                    _ = stop.changed() => return,
                    message = next => message,
                };
                // `None`: the sentinel closed the connection.
                let Some(message) = message else { break };
                let payload: String = message.get_payload().unwrap_or_default();
                let Some(event) = Announcement::parse(&payload, &name) else {
                    continue;
                };
                let Some(inner) = inner.upgrade() else { return };
                let conn = SentinelConnection { inner };
                if event.promoting {
                    // Polled on a task of its own, so this watcher keeps reading.
                    tokio::spawn(conn.follow_promotion(event.host, event.port));
                } else if let Err(error) = conn.follow(&event.host, event.port).await {
                    tracing::debug!(master = %name, %error, "sentinel: cannot follow the switch yet");
                }
            }
        }
        tokio::select! {
            _ = stop.changed() => return,
            () = tokio::time::sleep(RESUBSCRIBE_EVERY) => {}
        }
    }
}

/// A sentinel event about the group's master.
#[derive(Debug, PartialEq, Eq)]
struct Announcement {
    /// Where the master is, or is being promoted.
    host: String,
    port: u16,
    /// `+failover-state-wait-promotion` (the replica is being promoted) rather than
    /// `+switch-master` (it has been).
    promoting: bool,
}

impl Announcement {
    /// Parses either event's payload; `None` for another group's, or anything else.
    fn parse(payload: &str, name: &str) -> Option<Self> {
        let fields: Vec<&str> = payload.split(' ').collect();
        let (announced, host, port, promoting) = match fields[..] {
            [announced, _, _, host, port] => (announced, host, port, false),
            ["slave", _, host, port, "@", announced, _, _] => (announced, host, port, true),
            _ => return None,
        };
        (announced == name).then_some(())?;
        Some(Announcement {
            host: host.to_owned(),
            port: port.parse().ok()?,
            promoting,
        })
    }
}

/// Whether `e` means the master may be gone or demoted: the connection failed or timed out, or
/// the server refused a write as a replica (`READONLY`, also inside a script).
fn master_may_have_moved(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
        || e.code() == Some("READONLY")
        || e.to_string().contains("READONLY")
}

/// Whether the server `client` reaches says `ROLE` is `master`.
async fn is_master(settings: &ConnectSettings, client: &redis::Client) -> RedisResult<bool> {
    let mut conn = settings.short_connection(client).await?;
    let role: redis::Value = redis::cmd("ROLE").query_async(&mut conn).await?;
    let first = match &role {
        redis::Value::Array(items) => items.first(),
        _ => None,
    };
    Ok(match first {
        Some(redis::Value::BulkString(b)) => b.as_slice() == b"master",
        Some(redis::Value::SimpleString(s)) => s == "master",
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcements_of_this_group_are_parsed_and_others_ignored() {
        let switch = "mymaster 10.0.0.1 6379 10.0.0.2 6380";
        assert_eq!(
            Announcement::parse(switch, "mymaster"),
            Some(Announcement {
                host: "10.0.0.2".into(),
                port: 6380,
                promoting: false
            })
        );
        let promotion = "slave 10.0.0.2:6380 10.0.0.2 6380 @ mymaster 10.0.0.1 6379";
        assert_eq!(
            Announcement::parse(promotion, "mymaster"),
            Some(Announcement {
                host: "10.0.0.2".into(),
                port: 6380,
                promoting: true
            })
        );
        assert_eq!(Announcement::parse(switch, "other"), None);
        assert_eq!(Announcement::parse(promotion, "other"), None);
        assert_eq!(
            Announcement::parse("mymaster a 1 b notaport", "mymaster"),
            None
        );
        assert_eq!(Announcement::parse("", "mymaster"), None);
        assert_eq!(Announcement::parse("mymaster 1 2 3", "mymaster"), None);
    }

    #[test]
    fn errors_that_send_the_store_back_to_the_sentinels() {
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(master_may_have_moved(&refused));
        let timeout = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(master_may_have_moved(&timeout));
        let script = RedisError::from((redis::ErrorKind::Client, "RATELEASE invalid argument"));
        assert!(!master_may_have_moved(&script));
    }
}
