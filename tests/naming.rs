//! One name, one shape (the crate's front page): the same call sites compile, with the same
//! types, on the hybrid and the pure limiter, keyed or not, through the inherent methods and
//! through the traits; a concurrency limiter's `try_acquire` is synchronous as theirs is.

use std::time::Duration;

use ratelease::{
    AcquireError, ConcurrencyLimiter, Decision, HybridLimiter, KeyedHybridLimiter,
    KeyedRedisLimiter, LocalAnswer, MemoryStore, Permit, Quota, RedisLimiter,
};

const WAIT: Duration = Duration::from_millis(50);

fn quota() -> Quota {
    Quota::per_second(1_000).unwrap().with_burst(100).unwrap()
}

/// A hybrid limiter that holds 100 tokens once ready.
async fn hybrid() -> HybridLimiter<MemoryStore> {
    let limiter = HybridLimiter::builder("h", quota(), MemoryStore::new())
        .lease_size(100)
        .build()
        .unwrap();
    limiter.ready().await.unwrap();
    limiter
}

/// The async calls every rate limiter has, written once: the inherent methods (no trait is in
/// scope in this module), with their result types spelt out.
macro_rules! portable {
    ($limiter:expr) => {{
        let limiter = $limiter;
        let now: Result<Decision, AcquireError> = limiter.acquire_now(1).await;
        assert!(now.unwrap().is_allowed());
        let waited: Result<(), AcquireError> = limiter.acquire(1).await;
        waited.unwrap();
        let bounded: Result<Decision, AcquireError> = limiter.try_acquire_for(1, WAIT).await;
        assert!(bounded.unwrap().is_allowed());
        let leased: Result<Decision, AcquireError> = limiter.try_acquire_or_lease(1, WAIT).await;
        assert!(leased.unwrap().is_allowed());
    }};
}

/// The same, keyed.
macro_rules! portable_keyed {
    ($limiter:expr) => {{
        let limiter = $limiter;
        let now: Result<Decision, AcquireError> = limiter.acquire_now("k", 1).await;
        // A hybrid limiter has no tokens for a new key yet: its answer may be a denial.
        let _ = now.unwrap();
        let waited: Result<(), AcquireError> = limiter.acquire("k", 1).await;
        waited.unwrap();
        let bounded: Result<Decision, AcquireError> = limiter.try_acquire_for("k", 1, WAIT).await;
        assert!(bounded.unwrap().is_allowed());
        let leased: Result<Decision, AcquireError> =
            limiter.try_acquire_or_lease("k", 1, WAIT).await;
        assert!(leased.unwrap().is_allowed());
    }};
}

#[tokio::test]
async fn hybrid_and_pure_take_the_same_call_sites() {
    let hybrid = hybrid().await;
    portable!(&hybrid);
    portable!(&RedisLimiter::new("p", quota(), MemoryStore::new()).unwrap());

    let keyed = KeyedHybridLimiter::<String, _>::new("kh", quota(), MemoryStore::new()).unwrap();
    portable_keyed!(&keyed);
    portable_keyed!(&KeyedRedisLimiter::new("kp", quota(), MemoryStore::new()).unwrap());

    // The synchronous names, where there is local state to answer from.
    let sync: Result<Decision, AcquireError> = hybrid.try_acquire(1);
    assert!(sync.unwrap().is_allowed());
    let local: Result<LocalAnswer, AcquireError> = hybrid.try_acquire_local(1);
    assert_eq!(local.unwrap(), LocalAnswer::Allowed);
    // A key leases exactly what it is asked until it runs hot: no tokens may be left here.
    let sync: Result<Decision, AcquireError> = keyed.try_acquire("k", 1);
    let _ = sync.unwrap();
    let local: Result<LocalAnswer, AcquireError> = keyed.try_acquire_local("k", 1);
    let _ = local.unwrap();
}

mod through_the_traits {
    use super::*;
    use ratelease::{KeyedLimiter, Limiter};

    async fn portable(limiter: &impl Limiter) -> Option<Result<LocalAnswer, AcquireError>> {
        assert!(limiter.acquire_now(1).await.unwrap().is_allowed());
        limiter.acquire(1).await.unwrap();
        assert!(limiter.try_acquire_for(1, WAIT).await.unwrap().is_allowed());
        assert!(limiter
            .try_acquire_or_lease(1, WAIT)
            .await
            .unwrap()
            .is_allowed());
        limiter.local_answer(1)
    }

    async fn portable_keyed(limiter: &impl KeyedLimiter<String>) {
        limiter.acquire("k", 1).await.unwrap();
        // A hybrid limiter's key leases exactly what it is asked at first: this may be denied.
        let _ = limiter.acquire_now("k", 1).await.unwrap();
        assert!(limiter
            .try_acquire_for("k", 1, WAIT)
            .await
            .unwrap()
            .is_allowed());
        assert!(limiter
            .try_acquire_or_lease("k", 1, WAIT)
            .await
            .unwrap()
            .is_allowed());
    }

    #[tokio::test]
    async fn both_modes_answer_the_trait() {
        let local = portable(&hybrid().await).await;
        assert_eq!(local.unwrap().unwrap(), LocalAnswer::Allowed);
        let pure = RedisLimiter::new("p", quota(), MemoryStore::new()).unwrap();
        assert!(portable(&pure).await.is_none(), "a pure limiter must ask");

        let keyed = KeyedHybridLimiter::<String, _>::new("kh", quota(), MemoryStore::new());
        portable_keyed(&keyed.unwrap()).await;
        let keyed_pure = KeyedRedisLimiter::new("kp", quota(), MemoryStore::new()).unwrap();
        portable_keyed(&keyed_pure).await;
        assert!(KeyedLimiter::<String>::local_answer(&keyed_pure, "k", 1).is_none());
    }
}

#[tokio::test]
async fn a_concurrency_limiter_has_the_same_shapes() {
    for hybrid in [false, true] {
        let builder = ConcurrencyLimiter::builder("c", 4, MemoryStore::new());
        let limiter = match hybrid {
            true => builder.hybrid(2),
            false => builder,
        }
        .build()
        .unwrap();
        // Waits for the first lease in hybrid mode.
        let waited: Result<Permit, AcquireError> = limiter.acquire(1).await;
        drop(waited.unwrap());
        let now: Result<Option<Permit>, AcquireError> = limiter.acquire_now(1).await;
        assert!(now.unwrap().is_some());
        let bounded: Result<Option<Permit>, AcquireError> = limiter.try_acquire_for(1, WAIT).await;
        assert!(bounded.unwrap().is_some());
        // Synchronous, from the local pool: a pure-mode limiter has none.
        let sync: Result<Option<Permit>, AcquireError> = limiter.try_acquire(1);
        match hybrid {
            true => assert!(sync.unwrap().is_some(), "the pool has slots"),
            false => assert!(matches!(sync, Err(AcquireError::Config(_)))),
        }
    }
}
