//! One name, one quota: limiters of one process that would share a bucket under different
//! quotas are reported with a `tracing` warning, once per bucket and quota; the same quota
//! (in any mode), another store, another algorithm or client budget, a builder whose quota is
//! never used, and a name whose last limiter is gone are not. Against a real redis-server, and
//! the in-memory store for the keyed and scope cases.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

use ratelease::{
    Algorithm, Budget, HybridLimiter, KeyedHybridLimiter, KeyedRedisLimiter, MemoryStore, Quota,
    RedisLimiter, RedisStore, Unconfigured,
};
use support::RedisServer;
use tracing::field::{Field, Visit};
use tracing::{Event, Level};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// The `limiter` field of every warning, from a global subscriber installed on first use (a
/// thread-local one would miss events whose callsite another thread hit first).
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<String>>>);

struct LimiterField<'a>(&'a mut BTreeMap<&'static str, String>);

impl Visit for LimiterField<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name(), format!("{value:?}"));
    }
}

impl<S: tracing::Subscriber> Layer<S> for Warnings {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        if *event.metadata().level() != Level::WARN {
            return;
        }
        let mut fields = BTreeMap::new();
        event.record(&mut LimiterField(&mut fields));
        let same_name = fields
            .get("message")
            .is_some_and(|m| m.contains("uses this name on the same store"));
        if let (true, Some(limiter)) = (same_name, fields.remove("limiter")) {
            self.0.lock().unwrap().push(limiter);
        }
    }
}

/// How many same-name warnings named limiter `name` so far. Each test calls it before it
/// builds a limiter, so that the subscriber is there for every warning.
fn warnings(name: &str) -> usize {
    static GLOBAL: OnceLock<Warnings> = OnceLock::new();
    let warnings = GLOBAL.get_or_init(|| {
        let warnings = Warnings::default();
        let subscriber = tracing_subscriber::registry().with(warnings.clone());
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other global subscriber in this test binary");
        warnings
    });
    let seen = warnings.0.lock().unwrap();
    seen.iter().filter(|limiter| *limiter == name).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_quota_on_one_name_of_one_store_is_reported_once() {
    let name = "same-name-redis";
    assert_eq!(warnings(name), 0);
    let server = RedisServer::start();
    let store = RedisStore::connect(server.url()).await.unwrap();
    let quota = |rate| Quota::per_second(rate).unwrap();
    let first = HybridLimiter::new(name, quota(10), store.clone()).unwrap();
    let same = RedisLimiter::new(name, quota(10), store.clone()).unwrap();
    assert_eq!(
        warnings(name),
        0,
        "one quota, two modes: one bucket, rightly shared"
    );
    let other = RedisLimiter::new(name, quota(20), store.clone()).unwrap();
    assert_eq!(warnings(name), 1, "a second quota on the bucket");
    let again = HybridLimiter::new(name, quota(20), store.clone()).unwrap();
    let third = RedisLimiter::new(name, quota(20), store.clone()).unwrap();
    assert_eq!(warnings(name), 1, "once per quota");

    // A store connected on its own is another instance, even on the same server: not compared
    // (the check is per store instance; `ratelease::config` says what a fleet needs).
    let elsewhere = RedisStore::builder(server.url())
        .prefix("elsewhere:")
        .connect()
        .await
        .unwrap();
    let _apart = RedisLimiter::new(name, quota(30), elsewhere).unwrap();
    assert_eq!(warnings(name), 1, "another store");

    // Once every limiter under 10/s is gone, 20/s is the bucket's only quota: a third is a
    // second quota again; when all are gone, any quota is the first.
    drop((first, same));
    let _fourth = RedisLimiter::new(name, quota(40), store.clone()).unwrap();
    assert_eq!(warnings(name), 2);
    drop((other, again, third, _fourth));
    let _fresh = HybridLimiter::new(name, quota(50), store.clone()).unwrap();
    assert_eq!(
        warnings(name),
        2,
        "a name whose limiters are all gone is free"
    );
}

#[tokio::test]
async fn keyed_limiters_algorithms_budgets_and_unused_quotas_are_told_apart() {
    // First: installs the subscriber before anything can warn.
    assert_eq!(warnings("same-keyed"), 0);
    let store = MemoryStore::new();
    let quota = |rate| Quota::per_second(rate).unwrap();

    // Keyed limiters of one name share every key's bucket, in either mode.
    let _hybrid =
        KeyedHybridLimiter::<String, _>::new("same-keyed", quota(1), store.clone()).unwrap();
    let _pure = KeyedRedisLimiter::new("same-keyed", quota(2), store.clone()).unwrap();
    assert_eq!(warnings("same-keyed"), 1);
    // A plain limiter of that name has a bucket of its own.
    let _plain = RedisLimiter::new("same-keyed", quota(3), store.clone()).unwrap();
    assert_eq!(warnings("same-keyed"), 1);

    // Each algorithm runs on keys of its own.
    let window = RedisLimiter::builder("same-algo", quota(1), store.clone())
        .algorithm(Algorithm::FixedWindow)
        .build()
        .unwrap();
    let _bucket = RedisLimiter::new("same-algo", quota(2), store.clone()).unwrap();
    assert_eq!(warnings("same-algo"), 0);
    drop(window);

    // Per-client budgets: a bucket per client id.
    let client = |id, rate| {
        RedisLimiter::builder("same-client", quota(rate), store.clone())
            .budget(Budget::PerClient)
            .client_id(id)
            .build()
            .unwrap()
    };
    let _one = client(1, 1);
    let _two = client(2, 2);
    assert_eq!(warnings("same-client"), 0);
    let _one_again = client(1, 3);
    assert_eq!(warnings("same-client"), 1, "one client id, two quotas");

    // A builder whose quota never applies (an unconfigured name is unlimited) is no conflict.
    let _used = RedisLimiter::new("same-unused", quota(1), store.clone()).unwrap();
    let _unused = RedisLimiter::builder("same-unused", quota(2), store.clone())
        .if_unconfigured(Unconfigured::Unlimited)
        .build()
        .unwrap();
    assert_eq!(warnings("same-unused"), 0);

    // Another store instance: its own buckets.
    let _apart = RedisLimiter::new("same-keyed", quota(4), MemoryStore::new()).unwrap();
    assert_eq!(warnings("same-keyed"), 1);
}
