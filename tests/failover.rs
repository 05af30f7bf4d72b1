//! Failover under load (issue 16, item 1), with real processes as a user runs them: a primary,
//! a replica (`--replicaof`), and three `redis-server --sentinel` processes (quorum 2). A fleet
//! of three hybrid limiters, each on its own [`RedisStore::sentinel_builder`] store (three
//! processes' worth of connections), overloads one quota; the primary is SIGKILLed; the
//! sentinels promote the replica; the fleet follows.
//!
//! Measured and asserted: the promotion is followed (the bucket is written on the new
//! primary), leasing resumes on every node within 2 s of the promotion, and no window admits
//! more than `burst + rate × window` plus one burst plus what the fleet held leased when the
//! primary died (the bound for asynchronous replication: the replica may miss the last
//! leases). The printed figures are in RELIABILITY.md ("Failover").

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelease::{AcquireError, BuildError, FailurePolicy, HybridLimiter, Quota, RedisStore};
use support::{max_in_window, BucketState, RedisSentinel, RedisServer};

/// The sentinels' name for the group.
const MASTER: &str = "ratelease-test";

/// A primary, its replica, and three sentinels that know each other and the replica.
struct Group {
    primary: RedisServer,
    replica: RedisServer,
    sentinels: Vec<RedisSentinel>,
}

impl Group {
    fn start() -> Group {
        let primary = RedisServer::start();
        let port = primary.port().unwrap().to_string();
        let replica = RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &port]);
        wait_for(Duration::from_secs(10), "the replica to sync", || {
            let info: String = replica.cmd(&["INFO", "replication"]);
            info.contains("master_link_status:up")
        });
        // Down after 500 ms without a reply; 2 of 3 sentinels must agree.
        let sentinels: Vec<_> = (0..3)
            .map(|_| RedisSentinel::start(MASTER, &primary, 2, Duration::from_millis(500)))
            .collect();
        for sentinel in &sentinels {
            sentinel.wait_until_aware(MASTER, 2, 1);
        }
        Group {
            primary,
            replica,
            sentinels,
        }
    }

    fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisSentinel::url).collect()
    }
}

/// Polls `done` every 10 ms until it holds; panics with `what` after `limit`.
fn wait_for(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether `sentinel` names the server on `port` as the master.
fn names(sentinel: &RedisSentinel, port: u16) -> bool {
    let named: Option<(String, u16)> = sentinel
        .cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER])
        .unwrap_or(None);
    named.is_some_and(|(_, p)| p == port)
}

/// Whether `server` says it is a master.
fn is_master(server: &RedisServer) -> bool {
    // A promoting sentinel drops the replica's clients (CLIENT KILL): a poll that meets that
    // reads as "not yet", and the next one, 10 ms later, sees the new role.
    let Ok(mut con) = server
        .client()
        .get_connection_with_timeout(Duration::from_secs(1))
    else {
        return false;
    };
    let role: redis::RedisResult<Vec<redis::Value>> = redis::cmd("ROLE").query(&mut con);
    matches!(
        role.as_deref().ok().and_then(<[redis::Value]>::first),
        Some(redis::Value::BulkString(b)) if b.as_slice() == b"master"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_follows_a_sentinel_failover_within_the_bound() {
    let t_setup = Instant::now();
    let mut group = Group::start();
    let setup = t_setup.elapsed();
    let (rate, burst) = (2_000u64, 200u64);
    let quota = Quota::per_second(rate).unwrap().with_burst(burst).unwrap();
    let origin = Instant::now();
    let mut nodes = Vec::new();
    for _ in 0..3 {
        let store = RedisStore::sentinel_builder(group.sentinel_urls(), MASTER)
            .connect_timeout(Duration::from_millis(100))
            .response_timeout(Duration::from_millis(100))
            .connect()
            .await
            .unwrap();
        let limiter = HybridLimiter::builder("failover", quota, store)
            .on_store_failure(FailurePolicy::FailClosed)
            .build()
            .unwrap();
        limiter.ready().await.unwrap();
        nodes.push(Arc::new(limiter));
    }

    // Each node's callers: ten calls a millisecond, far above its share. Admissions are
    // recorded as (µs since `origin`, 1).
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = Vec::new();
    for node in &nodes {
        let (node, stop) = (node.clone(), stop.clone());
        load.push(tokio::spawn(async move {
            let mut admitted = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..10 {
                    if node.try_acquire(1).unwrap().is_allowed() {
                        admitted.push((origin.elapsed().as_micros() as u64, 1));
                    }
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            admitted
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;

    // What the fleet holds leased, then the primary dies. A watcher notes when each node
    // leases again: its leased total grows past what it had at the kill, and its circuit is
    // closed.
    let outstanding: u64 = nodes.iter().map(|n| n.stats().local_tokens).sum();
    let leased_before: Vec<u64> = nodes.iter().map(|n| n.stats().tokens_leased).collect();
    let watcher = {
        let nodes = nodes.clone();
        tokio::spawn(async move {
            let mut resumed = vec![None; nodes.len()];
            let start = Instant::now();
            while resumed.iter().any(Option::is_none) && start.elapsed() < Duration::from_secs(25) {
                for (i, node) in nodes.iter().enumerate() {
                    let s = node.stats();
                    if resumed[i].is_none() && s.tokens_leased > leased_before[i] && !s.circuit_open
                    {
                        resumed[i] = Some(Instant::now());
                    }
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            resumed
        })
    };
    group.primary.stop();
    let killed = Instant::now();

    // The promotion, as the replica sees it, and when a sentinel first names it.
    let replica_port = group.replica.port().unwrap();
    let (replica, sentinels) = (&group.replica, &group.sentinels);
    let (mut promoted, mut named_at) = (None, None);
    tokio::task::block_in_place(|| {
        wait_for(Duration::from_secs(20), "the replica's promotion", || {
            if promoted.is_none() && is_master(replica) {
                promoted = Some(Instant::now());
            }
            if named_at.is_none() && sentinels.iter().any(|s| names(s, replica_port)) {
                named_at = Some(Instant::now());
            }
            promoted.is_some() && named_at.is_some()
        })
    });
    let (promoted, named_at) = (promoted.unwrap(), named_at.unwrap());
    let resumed = watcher.await.unwrap();
    // Since the promotion as the test saw it (its ROLE polls are 10 ms apart, so a node that
    // followed the sentinels' announcement at once may show 0).
    let resumed: Vec<Duration> = resumed
        .iter()
        .map(|at| {
            let at = at.unwrap_or_else(|| panic!("a node never leased again: {resumed:?}"));
            at.saturating_duration_since(promoted)
        })
        .collect();
    // A second under load on the new primary.
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    let mut admissions = Vec::new();
    for task in load {
        admissions.extend(task.await.unwrap());
    }
    admissions.sort_unstable();
    let elapsed = origin.elapsed();

    // The fleet followed: the bucket is on the promoted replica, which the sentinels name.
    assert!(BucketState::read(&group.replica, "ratelease:{failover}").is_some());
    let named: Option<(String, u16)> = group.sentinels[0]
        .cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER])
        .unwrap();
    assert_eq!(named.map(|(_, port)| port), Some(replica_port));

    let slowest = resumed.iter().max().copied().unwrap();
    let failover = promoted - killed;
    let mut report = Vec::new();
    for window_ms in [250u64, 1_000] {
        let most = max_in_window(&admissions, window_ms * 1_000);
        let limit = burst + rate * window_ms / 1_000;
        let overshoot = most.saturating_sub(limit);
        report.push(format!(
            "{window_ms} ms window: most {most}, limit {limit}, overshoot {overshoot}"
        ));
        assert!(
            overshoot <= burst + outstanding,
            "{window_ms} ms window admitted {most} > {limit} + burst {burst} + outstanding \
             {outstanding}"
        );
    }
    let total: u64 = admissions.iter().map(|a| a.1).sum();
    println!(
        "setup {setup:?}; killed -> promoted {failover:?}, a sentinel names it {:?} after the \
         kill; leasing resumed after the promotion \
         {resumed:?} (slowest {slowest:?}); outstanding at the kill {outstanding}; admitted \
         {total} in {elapsed:?} (limit {}); {}",
        named_at - killed,
        burst + rate * elapsed.as_millis() as u64 / 1_000,
        report.join("; ")
    );
    assert!(
        slowest <= Duration::from_secs(2),
        "leasing resumed {slowest:?} after the promotion"
    );
}

/// The builder's bad input is a configuration error, and with no sentinel reachable an eager
/// connect fails with the store error while a lazy one builds.
#[tokio::test]
async fn sentinel_builder_input_and_unreachable_sentinels() {
    let err = RedisStore::sentinel_builder(Vec::<String>::new(), MASTER)
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, BuildError::Config(m) if m.contains("at least one sentinel")),
        "{err:?}"
    );
    let err = RedisStore::sentinel_builder(["redis://127.0.0.1:1/"], "")
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, BuildError::Config(m) if m.contains("master name")),
        "{err:?}"
    );
    let err = RedisStore::sentinel_builder(["not a url"], MASTER)
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, BuildError::Config(_)), "{err:?}");

    let nobody = RedisServer::reserve(&[]).url();
    let err = RedisStore::sentinel_builder([nobody.clone()], MASTER)
        .connect_timeout(Duration::from_millis(100))
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, BuildError::Store(_)), "{err:?}");
    let store = RedisStore::sentinel_builder([nobody], MASTER)
        .connect_timeout(Duration::from_millis(100))
        .lazy_connect()
        .connect()
        .await
        .unwrap();
    let limiter = ratelease::RedisLimiter::new("x", Quota::per_second(1).unwrap(), store).unwrap();
    let err = limiter.acquire_now(1).await.unwrap_err();
    assert!(matches!(err, AcquireError::Store(_)), "{err:?}");
}

/// A sentinel that does not know the master name is an error, not a hang; and a store whose
/// sentinels name a server that is only a replica is refused rather than sent to it.
#[tokio::test]
async fn unknown_master_names_are_reported() {
    let primary = RedisServer::start();
    let sentinel = RedisSentinel::start(MASTER, &primary, 1, Duration::from_millis(500));
    let err = RedisStore::sentinel_builder([sentinel.url()], "no-such-master")
        .connect()
        .await
        .unwrap_err();
    let BuildError::Store(e) = &err else {
        panic!("{err:?}")
    };
    let text = format!("{e:?}");
    assert!(text.contains("does not know the master name"), "{text}");
    // The known name works.
    let store = RedisStore::sentinel_builder([sentinel.url()], MASTER)
        .connect()
        .await
        .unwrap();
    let limiter =
        ratelease::RedisLimiter::new("known", Quota::per_second(5).unwrap(), store).unwrap();
    assert!(limiter.acquire_now(1).await.unwrap().is_allowed());
    assert!(BucketState::read(&primary, "ratelease:{known}").is_some());
}

/// A graceful failover (`SENTINEL FAILOVER`, as managed Redis does for maintenance): the
/// replica is promoted while the old primary keeps answering as a master (the sentinels demote
/// it seconds later), so no call fails and only the sentinels' announcements
/// (`+failover-state-wait-promotion`, `+switch-master`) tell the store to move. Measured: how long after the promotion the store's calls land on
/// the new primary, and how many calls the old primary served meanwhile (writes the new primary
/// never sees: the loss RELIABILITY.md bounds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_failover_is_followed_on_the_sentinels_announcement() {
    let group = Group::start();
    let store = RedisStore::sentinel_builder(group.sentinel_urls(), MASTER)
        .connect_timeout(Duration::from_millis(100))
        .response_timeout(Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    // Nothing refills during the test: the bucket counts every call that reached it.
    let quota = Quota::new(1, Duration::from_secs(3600))
        .unwrap()
        .with_burst(100_000)
        .unwrap();
    let limiter = ratelease::RedisLimiter::new("graceful", quota, store).unwrap();
    let taken_on = |server: &RedisServer| {
        BucketState::read(server, "ratelease:{graceful}").map_or(0.0, |b| 100_000.0 - b.v / b.s)
    };

    let ok: String = group.sentinels[0]
        .cmd(&["SENTINEL", "FAILOVER", MASTER])
        .unwrap();
    assert_eq!(ok, "OK");
    let started = Instant::now();
    let (mut served, mut errors) = (0u32, Vec::new());
    // The promotion and what the new primary had counted then (replication stops there).
    let mut promoted: Option<(Instant, f64)> = None;
    let followed = loop {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "not followed 10 s after SENTINEL FAILOVER (promoted: {:?}), errors {errors:?}",
            promoted.map(|p| p.0.elapsed())
        );
        match limiter.acquire_now(1).await {
            Ok(d) => {
                assert!(d.is_allowed());
                served += 1;
            }
            Err(e) => errors.push(format!("{e:?}")),
        }
        match promoted {
            None if is_master(&group.replica) => {
                promoted = Some((Instant::now(), taken_on(&group.replica)));
            }
            Some((at, counted)) if taken_on(&group.replica) > counted => break at.elapsed(),
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let (promoted_at, _) = promoted.unwrap();
    // The old primary still thinks it is the master.
    assert!(is_master(&group.primary));
    // Every served call reached one of the two; the old primary's since the promotion are lost.
    let taken = taken_on(&group.replica);
    let lost = f64::from(served) - taken;
    assert!(
        (0.0..=f64::from(served)).contains(&lost),
        "served {served}, the new primary counts {taken}"
    );
    println!(
        "graceful failover: promoted {:?} after SENTINEL FAILOVER; calls reached the new \
         primary {followed:?} after the promotion; {served} calls served, {} failed ({:?}); the \
         new primary counts {taken:.0}: {lost:.0} admissions were granted by the old primary \
         after the promotion",
        promoted_at - started,
        errors.len(),
        errors.first(),
    );
    assert!(
        followed <= Duration::from_secs(2),
        "calls reached the new primary {followed:?} after the promotion"
    );
}

/// Sentinels without a password in front of a master that needs one (the common layout):
/// `sentinel_master_url` gives the master's credentials, the sentinel URLs stay bare.
#[tokio::test]
async fn the_master_is_reached_with_its_own_credentials() {
    let primary = RedisServer::start();
    let _: () = primary.cmd(&[
        "ACL", "SETUSER", "app", "on", ">secret", "~*", "&*", "+@all",
    ]);
    let sentinel = RedisSentinel::start(MASTER, &primary, 1, Duration::from_millis(500));
    let store = RedisStore::sentinel_builder([sentinel.url()], MASTER)
        .sentinel_master_url("redis://app:secret@ignored.invalid:1/")
        .connect()
        .await
        .unwrap();
    let limiter =
        ratelease::RedisLimiter::new("creds", Quota::per_second(5).unwrap(), store).unwrap();
    assert!(limiter.acquire_now(1).await.unwrap().is_allowed());
    assert!(BucketState::read(&primary, "ratelease:{creds}").is_some());
    // The script ran as `app`.
    let clients: String = primary.cmd(&["CLIENT", "LIST"]);
    assert!(clients.contains("user=app"), "{clients}");

    // A wrong password is the master's refusal, reported by connect.
    let err = RedisStore::sentinel_builder([sentinel.url()], MASTER)
        .sentinel_master_url("redis://app:wrong@master/")
        .connect()
        .await
        .unwrap_err();
    let text = format!("{err:?}");
    assert!(
        matches!(err, BuildError::Store(_)) && text.to_lowercase().contains("pass"),
        "{text}"
    );
    // The master's credentials in the sentinel URL would be sent to the sentinel, which has
    // no such user: that is what the option is for.
    let with_creds = sentinel.url().replace("redis://", "redis://app:secret@");
    let err = RedisStore::sentinel_builder([with_creds], MASTER)
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, BuildError::Store(_)), "{err:?}");
    // Only a sentinel store takes it.
    let err = RedisStore::builder(primary.url())
        .sentinel_master_url("redis://app:secret@x/")
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, BuildError::Config(m) if m.contains("sentinel_builder")),
        "{err:?}"
    );
}
