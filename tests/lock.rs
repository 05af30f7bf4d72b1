//! `RedisLock` against a real redis-server: exclusion, re-entry, the watchdog, safe unlock,
//! wake-up on unlock, fencing tokens and bad input.

mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelease::{LockError, LockGuard, LockOwner, RedisLock};
use support::RedisServer;

async fn lock_on(server: &RedisServer, name: &str) -> RedisLock {
    RedisLock::builder(server.url(), name)
        .lease_time(Duration::from_secs(2))
        .connect()
        .await
        .expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutual_exclusion_under_contention() {
    let server = RedisServer::start();
    // Three handles = three connections and three process ids.
    let mut handles = Vec::new();
    for _ in 0..3 {
        handles.push(lock_on(&server, "counter").await);
    }
    let counter = Arc::new(AtomicU64::new(0));
    let failed_tries = Arc::new(AtomicU64::new(0));
    const TASKS: u64 = 24;
    const ROUNDS: u64 = 10;
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let lock = handles[(t % 3) as usize].clone();
        let counter = counter.clone();
        let failed_tries = failed_tries.clone();
        tasks.push(tokio::spawn(async move {
            let me = lock.new_owner();
            for round in 0..ROUNDS {
                let guard = if round % 2 == 0 {
                    // Count how often the lock was busy, then wait for it.
                    match lock.try_lock(&me).await.unwrap() {
                        Some(g) => g,
                        None => {
                            failed_tries.fetch_add(1, Ordering::Relaxed);
                            lock.lock(&me).await.unwrap()
                        }
                    }
                } else {
                    lock.lock(&me).await.unwrap()
                };
                // Not atomic: read, yield, write. Lost updates unless the lock excludes.
                let v = counter.load(Ordering::Relaxed);
                tokio::time::sleep(Duration::from_micros(200)).await;
                counter.store(v + 1, Ordering::Relaxed);
                guard.unlock().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(counter.load(Ordering::Relaxed), TASKS * ROUNDS);
    assert!(
        failed_tries.load(Ordering::Relaxed) > 0,
        "no try_lock ever failed: the test did not create contention"
    );
    assert!(!handles[0].is_locked().await.unwrap());
}

#[tokio::test]
async fn reentry_counts_down() {
    let server = RedisServer::start();
    let lock = lock_on(&server, "re").await;
    let other = lock_on(&server, "re").await;
    let (me, them) = (lock.new_owner(), other.new_owner());

    let outer = lock.try_lock(&me).await.unwrap().expect("free");
    let inner = lock.try_lock(&me).await.unwrap().expect("re-entry");
    assert_eq!((outer.hold_count(), inner.hold_count()), (1, 2));
    assert_eq!(outer.fencing_token(), inner.fencing_token());
    assert_eq!(lock.hold_count(&me).await.unwrap(), 2);

    inner.unlock().await.unwrap();
    assert_eq!(lock.hold_count(&me).await.unwrap(), 1);
    assert!(other.try_lock(&them).await.unwrap().is_none(), "still held");

    outer.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
    let theirs = other.try_lock(&them).await.unwrap().expect("free now");
    theirs.unlock().await.unwrap();
}

#[tokio::test]
async fn drop_releases() {
    let server = RedisServer::start();
    let lock = lock_on(&server, "drop").await;
    let me = lock.new_owner();
    drop(lock.try_lock(&me).await.unwrap().unwrap());
    let other = lock.new_owner();
    let g = lock
        .try_lock_for(&other, Duration::from_secs(1))
        .await
        .unwrap()
        .expect("the drop released the lock");
    g.unlock().await.unwrap();
}

#[tokio::test]
async fn watchdog_keeps_the_lock_and_stops_on_drop() {
    let server = RedisServer::start();
    let lock = RedisLock::builder(server.url(), "wd")
        .lease_time(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let me = lock.new_owner();
    let guard = lock.try_lock(&me).await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(900)).await; // three leases
    assert!(
        lock.is_locked().await.unwrap(),
        "the watchdog renewed the lease"
    );
    assert!(!guard.lease_lost());
    let pttl: i64 = server.cmd(&["PTTL", lock.key()]);
    assert!(pttl > 0 && pttl <= 300, "lease renewed, pttl {pttl}");

    // Drop it on a thread outside the runtime: no release can be spawned there, so only the
    // watchdog stopping lets the key expire.
    std::thread::spawn(move || drop(guard)).join().unwrap();
    assert!(lock.is_locked().await.unwrap());
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert!(
        !lock.is_locked().await.unwrap(),
        "the watchdog stopped: the lease ran out"
    );

    // A holder that stops renewing (watchdog off) loses the lock after one lease.
    let bare = RedisLock::builder(server.url(), "wd")
        .lease_time(Duration::from_millis(300))
        .watchdog(false)
        .connect()
        .await
        .unwrap();
    let g = bare.try_lock(&bare.new_owner()).await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert!(
        !bare.is_locked().await.unwrap(),
        "no watchdog, lease ran out"
    );
    assert!(matches!(g.unlock().await, Err(LockError::NotHeld { .. })));
}

/// A lock `name` with a 150 ms lease and no watchdog, two owners, and the first owner's guard
/// of a hold whose lease has run out.
async fn an_expired_hold(
    server: &RedisServer,
    name: &str,
) -> (RedisLock, LockOwner, LockOwner, LockGuard) {
    let lock = RedisLock::builder(server.url(), name)
        .lease_time(Duration::from_millis(150))
        .watchdog(false)
        .connect()
        .await
        .unwrap();
    let (a, b) = (lock.new_owner(), lock.new_owner());
    let stale = lock.try_lock(&a).await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    (lock, a, b, stale)
}

#[tokio::test]
async fn expired_holder_cannot_unlock_the_next_one() {
    let server = RedisServer::start();
    let (lock, a, b, stale) = an_expired_hold(&server, "exp").await;
    let fresh = lock.try_lock(&b).await.unwrap().expect("a's lease expired");
    assert!(fresh.fencing_token() > stale.fencing_token());
    match stale.unlock().await {
        Err(LockError::NotHeld { owner, .. }) => assert_eq!(owner, a.to_string()),
        other => panic!("expected NotHeld, got {other:?}"),
    }
    assert_eq!(lock.hold_count(&b).await.unwrap(), 1, "b still holds it");
    fresh.unlock().await.unwrap();
}

/// The same owner's guard of an earlier hold, whose lease ran out, neither releases nor renews
/// the owner's later hold: the release found the owner present and ended the later hold
/// (another owner could then take the lock while its holder still worked under it), and its
/// watchdog renewed the later hold as its own.
#[tokio::test]
async fn a_stale_guard_cannot_release_or_renew_its_owners_later_hold() {
    let server = RedisServer::start();
    let (lock, a, b, stale) = an_expired_hold(&server, "later").await;
    let later = lock
        .try_lock(&a)
        .await
        .unwrap()
        .expect("the first hold expired");
    assert_eq!(later.hold_count(), 1, "a new hold, not a re-entry");
    assert!(later.fencing_token() > stale.fencing_token());
    assert!(matches!(
        stale.unlock().await,
        Err(LockError::NotHeld { .. })
    ));
    assert_eq!(
        lock.hold_count(&a).await.unwrap(),
        1,
        "the later hold stands"
    );
    assert!(
        lock.try_lock(&b).await.unwrap().is_none(),
        "b must not get it"
    );

    // A watchdog of the earlier hold (on a lock that renews) finds it gone, not the later one.
    let renewing = RedisLock::builder(server.url(), "later-wd")
        .lease_time(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let first = renewing.try_lock(&a).await.unwrap().unwrap();
    let token = first.fencing_token();
    // The hold ends behind the guard's back (its lease ran out while the process was cut off,
    // say) and the owner takes the lock again.
    let mut con = server.connection();
    let _: () = redis::cmd("DEL")
        .arg(renewing.key())
        .query(&mut con)
        .unwrap();
    let second = renewing.try_lock(&a).await.unwrap().unwrap();
    assert!(second.fencing_token() > token);
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(first.lease_lost(), "the first guard's hold is gone");
    drop(first);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        renewing.hold_count(&a).await.unwrap(),
        1,
        "dropping it released nothing"
    );
    second.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiter_wakes_on_unlock_not_on_poll() {
    let server = RedisServer::start();
    let lock = RedisLock::builder(server.url(), "wake")
        .lease_time(Duration::from_secs(30))
        .poll_interval(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let holder = lock.try_lock(&lock.new_owner()).await.unwrap().unwrap();
    let waiter_lock = lock.clone();
    let waiter = tokio::spawn(async move {
        let me = waiter_lock.new_owner();
        let g = waiter_lock.lock(&me).await.unwrap();
        let woke = Instant::now();
        g.unlock().await.unwrap();
        woke
    });
    // Let the waiter subscribe and fall asleep on the channel.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished());
    let released = Instant::now();
    holder.unlock().await.unwrap();
    let woke = tokio::time::timeout(Duration::from_secs(3), waiter)
        .await
        .expect("waiter did not wake before the 5 s poll")
        .unwrap();
    let delay = woke - released;
    assert!(delay < Duration::from_secs(1), "woke after {delay:?}");
}

#[tokio::test]
async fn try_lock_for_times_out() {
    let server = RedisServer::start();
    let lock = lock_on(&server, "busy").await;
    let _held = lock.try_lock(&lock.new_owner()).await.unwrap().unwrap();
    let t0 = Instant::now();
    let got = lock
        .try_lock_for(&lock.new_owner(), Duration::from_millis(200))
        .await
        .unwrap();
    assert!(got.is_none());
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_secs(1),
        "{waited:?}"
    );
}

#[tokio::test]
async fn fencing_tokens_strictly_increase() {
    let server = RedisServer::start();
    let a = lock_on(&server, "fence").await;
    let b = lock_on(&server, "fence").await;
    let mut last = 0;
    for i in 0..20 {
        let lock = if i % 2 == 0 { &a } else { &b };
        let g = lock.try_lock(&lock.new_owner()).await.unwrap().unwrap();
        assert!(
            g.fencing_token() > last,
            "{} after {last}",
            g.fencing_token()
        );
        last = g.fencing_token();
        g.unlock().await.unwrap();
    }
    // Another lock name has its own counter.
    let other = a.named("fence-2").unwrap();
    let g = other.try_lock(&other.new_owner()).await.unwrap().unwrap();
    assert_eq!(g.fencing_token(), 1);
    g.unlock().await.unwrap();
}

#[tokio::test]
async fn bad_input_is_a_typed_error() {
    let server = RedisServer::start();
    let err = RedisLock::connect(server.url(), "").await.unwrap_err();
    assert!(matches!(err, LockError::Config(_)), "{err:?}");
    let err = RedisLock::builder(server.url(), "x")
        .lease_time(Duration::ZERO)
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Config(_)), "{err:?}");
    let err = RedisLock::builder(server.url(), "x")
        .prefix("a{b")
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Config(_)), "{err:?}");
    let lock = lock_on(&server, "x").await;
    assert!(matches!(lock.named(""), Err(LockError::Config(_))));
    // "No expiry" is a configuration error at build time, not a refusal of every acquisition.
    let err = RedisLock::builder(server.url(), "x")
        .lease_time(Duration::MAX)
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Config(_)), "{err:?}");
    // Unlock messages only (no polling): a contended wait times out, it does not panic.
    let unpolled = RedisLock::builder(server.url(), "unpolled")
        .poll_interval(Duration::MAX)
        .connect()
        .await
        .unwrap();
    let _held = unpolled
        .try_lock(&unpolled.new_owner())
        .await
        .unwrap()
        .unwrap();
    let waited = unpolled
        .try_lock_for(&unpolled.new_owner(), Duration::from_millis(50))
        .await
        .unwrap();
    assert!(waited.is_none());
    // A zero timeout is one attempt: no subscription opened, no second script call.
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut server.connection())
        .unwrap();
    let waited = unpolled
        .try_lock_for(&unpolled.new_owner(), Duration::ZERO)
        .await
        .unwrap();
    assert!(waited.is_none());
    assert_eq!(server.command_calls("evalsha"), 1);
    assert_eq!(server.command_calls("subscribe"), 0);

    // The scripts reject bad arguments with typed replies, not Lua errors.
    let mut con = server.connection();
    let reply: redis::RedisResult<i64> = redis::cmd("EVAL")
        .arg(ratelease::LOCK_LUA)
        .arg(2)
        .arg("k")
        .arg("f")
        .arg("acquire")
        .arg("owner")
        .arg("0")
        .query(&mut con);
    let e = reply.unwrap_err();
    assert_eq!(e.code(), Some("RATELEASE"), "{e:?}");
    let reply: redis::RedisResult<i64> = redis::cmd("EVAL")
        .arg(ratelease::LOCK_LUA)
        .arg(2)
        .arg("k")
        .arg("f")
        .arg("release")
        .arg("")
        .arg("10")
        .arg("ch")
        .query(&mut con);
    assert_eq!(reply.unwrap_err().code(), Some("RATELEASE"));
}

#[tokio::test]
async fn keys_share_the_name_hash_tag() {
    let server = RedisServer::start();
    let lock = RedisLock::builder(server.url(), "a}b")
        .prefix("app:")
        .connect()
        .await
        .unwrap();
    assert_eq!(lock.key(), "app:{a%7Db}:lock");
    let g = lock.try_lock(&lock.owner(7)).await.unwrap().unwrap();
    let fence: String = server.cmd(&["GET", "app:{a%7Db}:fence"]);
    assert_eq!(fence, "1");
    g.unlock().await.unwrap();
}
