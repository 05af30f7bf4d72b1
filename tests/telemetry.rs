//! Metrics and traces, read back from real in-process recorders: `metrics-util`'s
//! `DebuggingRecorder` (one per test, scoped to the limiter's build with
//! `metrics::with_local_recorder`, so tests running in parallel do not mix) and a `tracing`
//! layer that captures spans (`set_default`: this thread only).
//!
//! The hybrid limiter's counters are checked against its own [`HybridStats`] and against
//! exact values on virtual time; store errors against a redis-server the test stops. The
//! keyed and concurrency limiters likewise, against their [`KeyedStats`] and
//! [`ConcurrencyStats`].

mod support;
mod wrapped;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;
use ratelease::telemetry::{self, PUBLISH_INTERVAL};
use ratelease::{
    ConcurrencyLimiter, ConcurrencyStats, Decision, FailurePolicy, FakeClock, HybridLimiter,
    HybridStats, KeyedHybridLimiter, KeyedRedisLimiter, KeyedStats, MemoryStore, Quota,
    RedisLimiter, RedisStore, TokioClock,
};
use support::RedisServer;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;
use wrapped::Wrapped;

/// A metric: kind, name and sorted labels.
type Key = (MetricKind, String, Vec<(String, String)>);

/// What a recorder has seen: counters and histogram samples summed over snapshots (taking a
/// snapshot drains them), gauges as of the last snapshot (which resets them to 0, so read each
/// gauge once per publication).
struct Recorded {
    snapshotter: Snapshotter,
    seen: Mutex<HashMap<Key, Seen>>,
}

#[derive(Debug, Clone, Default)]
struct Seen {
    counter: u64,
    gauge: f64,
    samples: Vec<f64>,
    described: bool,
}

/// Everything seen up to one snapshot.
struct Reading(HashMap<Key, Seen>);

impl Recorded {
    /// Runs `build` with a fresh recorder in force, so the handles it registers report to it.
    fn build<T>(build: impl FnOnce() -> T) -> (T, Recorded) {
        let recorder = DebuggingRecorder::new();
        let built = metrics::with_local_recorder(&recorder, build);
        let recorded = Recorded {
            snapshotter: recorder.snapshotter(),
            seen: Mutex::default(),
        };
        (built, recorded)
    }

    /// Takes a snapshot and returns everything seen so far.
    fn read(&self) -> Reading {
        let mut seen = self.seen.lock().unwrap();
        for (key, _unit, description, value) in self.snapshotter.snapshot().into_vec() {
            let (kind, key) = key.into_parts();
            let mut labels: Vec<_> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            let entry = seen
                .entry((kind, key.name().to_owned(), labels))
                .or_default();
            entry.described = description.is_some();
            match value {
                DebugValue::Counter(n) => entry.counter += n,
                DebugValue::Gauge(v) => entry.gauge = v.into_inner(),
                DebugValue::Histogram(v) => entry.samples.extend(v.into_iter().map(|x| x.0)),
            }
        }
        Reading(seen.clone())
    }
}

impl Reading {
    fn get(&self, kind: MetricKind, name: &str, labels: &[(&str, &str)]) -> &Seen {
        let mut labels: Vec<_> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        labels.sort();
        let key = (kind, name.to_owned(), labels);
        self.0
            .get(&key)
            .unwrap_or_else(|| panic!("no {key:?} in {:?}", self.0.keys()))
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.get(MetricKind::Counter, name, labels).counter
    }

    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(MetricKind::Gauge, name, labels).gauge
    }

    fn samples(&self, name: &str, labels: &[(&str, &str)]) -> &[f64] {
        &self.get(MetricKind::Histogram, name, labels).samples
    }
}

/// A hybrid limiter's counters, read from the recorder, in [`HybridStats`]' terms.
fn published(m: &Reading, name: &str) -> (HybridStats, u64) {
    let both = [("limiter", name), ("mode", "hybrid")];
    let mut s = HybridStats::default();
    s.leases = m.counter(telemetry::LEASES, &both);
    s.store_errors = m.counter(telemetry::STORE_ERRORS, &both);
    s.tokens_denied = m.counter(telemetry::DENIED_TOKENS, &both);
    s.tokens_leased = m.counter(telemetry::LEASED_TOKENS, &both);
    s.over_limit = m.counter(telemetry::OVER_LIMIT, &both);
    s.releases = m.counter(telemetry::RELEASES, &both);
    s.tokens_released = m.counter(telemetry::RELEASED_TOKENS, &both);
    s.tokens_expired = m.counter(telemetry::EXPIRED_TOKENS, &both);
    s.local_tokens = m.gauge(telemetry::LOCAL_TOKENS, &both) as u64;
    (s, m.counter(telemetry::ADMITTED_TOKENS, &both))
}

/// The counters `published` reads, as the limiter's own stats have them, and the admitted
/// tokens derived from them.
fn expected(s: &HybridStats) -> (HybridStats, u64) {
    let mut e = HybridStats::default();
    e.leases = s.leases;
    e.store_errors = s.store_errors;
    e.tokens_denied = s.tokens_denied;
    e.tokens_leased = s.tokens_leased;
    e.over_limit = s.over_limit;
    e.releases = s.releases;
    e.tokens_released = s.tokens_released;
    e.tokens_expired = s.tokens_expired;
    e.local_tokens = s.local_tokens;
    let admitted = s.tokens_leased - s.tokens_released - s.tokens_expired - s.local_tokens
        + s.tokens_admitted_degraded;
    (e, admitted)
}

async fn settle() {
    tokio::time::sleep(Duration::from_millis(5)).await;
}

/// 30 tokens an hour, leased 10 at a time, and 50 callers one after another: exactly 30 are
/// admitted in three leases, the fourth lease is over the limit (the next 10 tokens are 20
/// minutes away), and 20 callers are denied locally meanwhile.
#[tokio::test(start_paused = true)]
async fn hybrid_counters_are_exact_on_virtual_time_and_match_the_stats() {
    let quota = Quota::new(30, Duration::from_secs(3_600)).unwrap();
    let store = MemoryStore::with_clock(TokioClock::new());
    let (limiter, m) = Recorded::build(|| {
        HybridLimiter::builder("exact", quota, store)
            .lease_size(10)
            .build()
            .unwrap()
    });
    settle().await;
    // Past the first interval tick, which fires whether or not the limiter is active.
    tokio::time::sleep(2 * PUBLISH_INTERVAL).await;
    let (mut allowed, mut denied) = (0, 0);
    for _ in 0..50 {
        match limiter.try_acquire(1).unwrap() {
            Decision::Allowed => allowed += 1,
            Decision::Denied { .. } => denied += 1,
        }
        settle().await;
    }
    assert_eq!((allowed, denied), (30, 20));
    // The task sleeps out the over-limit reply; the denials since it last ran are published
    // by the interval tick.
    tokio::time::sleep(PUBLISH_INTERVAL).await;
    let r = m.read();
    let (counted, admitted) = published(&r, "exact");
    assert_eq!((counted, admitted), expected(&limiter.stats()));
    assert_eq!(admitted, 30);
    assert_eq!(
        (counted.leases, counted.over_limit, counted.tokens_leased),
        (4, 1, 30)
    );
    assert_eq!(counted.tokens_denied, 20);
    assert_eq!(counted.local_tokens, 0);
    let both = [("limiter", "exact"), ("mode", "hybrid")];
    assert_eq!(r.samples(telemetry::LEASE_SIZE, &both), [10.0; 3]);
    // Virtual time stands still during a MemoryStore call.
    assert_eq!(r.samples(telemetry::LEASE_DURATION, &both), [0.0; 4]);
    let policy = [
        ("limiter", "exact"),
        ("mode", "hybrid"),
        ("policy", "last-known-share"),
    ];
    assert_eq!(r.gauge(telemetry::CIRCUIT_OPEN, &policy), 0.0);

    limiter.shutdown().await;
    let r = m.read();
    assert_eq!(published(&r, "exact"), expected(&limiter.stats()));
    assert_eq!(published(&r, "exact").1, 30, "nothing more was admitted");
}

/// Tokens spent without waking the background task show up within one interval, and
/// shutdown publishes the tokens given back — not as spent while the release is in flight.
#[tokio::test(start_paused = true)]
async fn local_spending_is_published_within_one_interval() {
    let quota = Quota::per_second(1_000).unwrap();
    let store = Wrapped::new(Duration::from_millis(2));
    let (limiter, m) = Recorded::build(|| {
        HybridLimiter::builder("lag", quota, store)
            .lease_size(100)
            .build()
            .unwrap()
    });
    settle().await;
    let both = [("limiter", "lag"), ("mode", "hybrid")];
    let r = m.read();
    assert_eq!(
        r.gauge(telemetry::LOCAL_TOKENS, &both),
        100.0,
        "published after the lease"
    );
    // Past the first interval tick, which fires whether or not the limiter is active.
    tokio::time::sleep(2 * PUBLISH_INTERVAL + Duration::from_millis(500)).await;
    // Ten hits above the low-water mark (50): no refill, no wake-up, nothing published yet.
    for _ in 0..10 {
        assert!(limiter.try_acquire(1).unwrap().is_allowed());
    }
    settle().await;
    assert_eq!(limiter.stats().leases, 1);
    let r = m.read();
    assert_eq!(
        r.counter(telemetry::ADMITTED_TOKENS, &both),
        0,
        "not yet published"
    );
    tokio::time::sleep(PUBLISH_INTERVAL).await;
    let r = m.read();
    assert_eq!(r.counter(telemetry::ADMITTED_TOKENS, &both), 10);
    assert_eq!(r.gauge(telemetry::LOCAL_TOKENS, &both), 90.0);

    limiter.shutdown().await;
    let stats = limiter.stats();
    assert_eq!((stats.releases, stats.tokens_released), (1, 90));
    let r = m.read();
    assert_eq!(published(&r, "lag"), expected(&stats));
    assert_eq!(r.counter(telemetry::RELEASED_TOKENS, &both), 90);
}

#[tokio::test(start_paused = true)]
async fn failure_policy_admissions_store_errors_and_the_circuit_are_published() {
    let store = Wrapped::new(Duration::ZERO);
    let failing = store.failing.clone();
    failing.store(true, Ordering::SeqCst);
    let quota = Quota::per_second(100).unwrap();
    let (limiter, m) = Recorded::build(|| {
        HybridLimiter::builder("down", quota, store)
            .lease_size(10)
            .on_store_failure(FailurePolicy::FailOpen)
            .build()
            .unwrap()
    });
    settle().await;
    for _ in 0..7 {
        assert!(limiter.try_acquire(1).unwrap().is_allowed(), "fail open");
    }
    tokio::time::sleep(PUBLISH_INTERVAL).await;
    let stats = limiter.stats();
    assert!(stats.circuit_open && stats.store_errors >= 1, "{stats:?}");
    let r = m.read();
    assert_eq!(published(&r, "down"), expected(&stats));
    let policy = [
        ("limiter", "down"),
        ("mode", "hybrid"),
        ("policy", "fail-open"),
    ];
    assert_eq!(r.counter(telemetry::DEGRADED_TOKENS, &policy), 7);
    assert_eq!(stats.tokens_admitted_degraded, 7);
    assert_eq!(r.gauge(telemetry::CIRCUIT_OPEN, &policy), 1.0);
    let both = [("limiter", "down"), ("mode", "hybrid")];
    assert_eq!(r.counter(telemetry::ADMITTED_TOKENS, &both), 7);
    assert_eq!(
        r.counter(telemetry::STORE_ERRORS, &both),
        stats.store_errors
    );
    assert_eq!(
        r.counter(telemetry::LEASES, &both),
        stats.leases,
        "failed leases count"
    );

    failing.store(false, Ordering::SeqCst);
    // The task probes again on demand; the probe succeeds and closes the circuit.
    assert!(limiter.try_acquire(1).unwrap().is_allowed());
    tokio::time::sleep(PUBLISH_INTERVAL).await;
    let stats = limiter.stats();
    assert!(!stats.circuit_open, "{stats:?}");
    let r = m.read();
    assert_eq!(published(&r, "down"), expected(&stats));
    assert!(
        r.gauge(
            telemetry::LOCAL_TOKENS,
            &[("limiter", "down"), ("mode", "hybrid")]
        ) > 0.0
    );
    limiter.shutdown().await;
}

#[tokio::test]
async fn pure_mode_counts_every_call() {
    let store = MemoryStore::with_clock(FakeClock::new());
    let quota = Quota::new(5, Duration::from_secs(3_600)).unwrap();
    let (limiter, m) = Recorded::build(|| RedisLimiter::new("pure", quota, store).unwrap());
    let mut allowed = 0;
    for _ in 0..8 {
        allowed += u64::from(limiter.acquire_now(2).await.unwrap().is_allowed());
    }
    assert_eq!(allowed, 2, "5 tokens serve two requests of 2");
    let both = [("limiter", "pure"), ("mode", "pure")];
    let r = m.read();
    assert_eq!(r.counter(telemetry::ADMITTED_TOKENS, &both), 4);
    assert_eq!(r.counter(telemetry::DENIED_TOKENS, &both), 12);
    assert_eq!(r.counter(telemetry::LEASES, &both), 8);
    assert_eq!(r.counter(telemetry::STORE_ERRORS, &both), 0);
    assert_eq!(r.samples(telemetry::LEASE_DURATION, &both).len(), 8);
}

#[tokio::test]
async fn every_metric_is_registered_and_described() {
    let (limiters, m) = Recorded::build(|| {
        let store = MemoryStore::new();
        let quota = Quota::per_second(10).unwrap();
        (
            HybridLimiter::new("all", quota, store.clone()).unwrap(),
            RedisLimiter::new("all", quota, store).unwrap(),
        )
    });
    let seen = m.read().0;
    let names = [
        telemetry::ADMITTED_TOKENS,
        telemetry::DENIED_TOKENS,
        telemetry::LEASES,
        telemetry::STORE_ERRORS,
        telemetry::LEASE_DURATION,
        telemetry::LEASED_TOKENS,
        telemetry::LEASE_SIZE,
        telemetry::OVER_LIMIT,
        telemetry::RELEASES,
        telemetry::RELEASED_TOKENS,
        telemetry::EXPIRED_TOKENS,
        telemetry::DEGRADED_TOKENS,
        telemetry::LOCAL_TOKENS,
        telemetry::CIRCUIT_OPEN,
        telemetry::DEMAND,
        telemetry::FAIR_SHARE,
    ];
    for name in names {
        let found: Vec<_> = seen.iter().filter(|(k, _)| k.1 == name).collect();
        assert!(!found.is_empty(), "{name} not registered");
        for ((_, _, labels), s) in found {
            assert!(s.described, "{name} has no description");
            assert_eq!(
                labels[0],
                ("limiter".to_owned(), "all".to_owned()),
                "{name}"
            );
            // Every series says which kind of limiter it counts.
            assert_eq!(labels[1].0, "mode", "{name}: {labels:?}");
        }
    }
    let modes: Vec<_> = seen
        .keys()
        .filter(|k| k.1 == telemetry::LEASES)
        .map(|k| k.2[1].1.clone())
        .collect();
    assert_eq!(modes.len(), 2, "one series per mode: {modes:?}");
    assert_eq!(
        seen.len(),
        names.len() + 5,
        "the five shared metrics have a series per mode"
    );
    limiters.0.shutdown().await;
}

/// One captured span: its name and fields (`Debug`-formatted, strings unquoted).
#[derive(Debug, Clone)]
struct SpanRecord {
    name: &'static str,
    fields: BTreeMap<String, String>,
}

/// A layer that keeps every span it sees.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<SpanRecord>>>);

struct Index(usize);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let mut spans = self.0.lock().unwrap();
        spans.push(SpanRecord {
            name: attrs.metadata().name(),
            fields,
        });
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Index(spans.len() - 1));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(Index(i)) = span.extensions().get::<Index>() {
                values.record(&mut Fields(&mut self.0.lock().unwrap()[*i].fields));
            }
        }
    }
}

impl Spans {
    /// The spans of every thread of this test binary, from a global subscriber installed on
    /// first use. (A thread-local subscriber misses spans: a callsite first hit on a thread
    /// without one is cached as disabled for every thread.) Tests filter by their own names.
    fn capture() -> Spans {
        static GLOBAL: OnceLock<Spans> = OnceLock::new();
        GLOBAL
            .get_or_init(|| {
                let spans = Spans::default();
                let subscriber = tracing_subscriber::registry().with(spans.clone());
                tracing::subscriber::set_global_default(subscriber)
                    .expect("no other global subscriber in this test binary");
                spans
            })
            .clone()
    }

    /// The `store_call` spans whose field `field` contains `value`.
    fn store_calls(&self, field: &str, value: &str) -> Vec<SpanRecord> {
        let spans = self.0.lock().unwrap();
        spans
            .iter()
            .filter(|s| s.name == "store_call")
            .filter(|s| s.fields.get(field).is_some_and(|v| v.contains(value)))
            .cloned()
            .collect()
    }
}

#[tokio::test(start_paused = true)]
async fn memory_store_calls_run_in_spans() {
    let spans = Spans::capture();
    let store = MemoryStore::with_clock(TokioClock::new());
    let limiter = HybridLimiter::builder("traced", Quota::per_second(100).unwrap(), store)
        .lease_size(10)
        .build()
        .unwrap();
    limiter.acquire(1).await.unwrap();
    limiter.shutdown().await;
    let calls = spans.store_calls("limiter", "traced");
    let ops: Vec<_> = calls.iter().map(|s| s.fields["op"].as_str()).collect();
    assert_eq!(ops, ["lease", "release"], "{calls:?}");
    for call in &calls {
        assert_eq!(call.fields["store"], "memory");
        assert_eq!(call.fields["limiter"], "traced");
    }
}

/// Against a real redis-server: every script call runs in a span, and once the server is
/// stopped, failed calls are counted (both modes) and their spans carry the error.
#[tokio::test]
async fn store_errors_are_counted_and_traced_when_redis_dies() {
    let mut server = RedisServer::start();
    let spans = Spans::capture();
    let store = RedisStore::builder(server.url())
        .response_timeout(Duration::from_millis(50))
        .connect_timeout(Duration::from_millis(50))
        .connect()
        .await
        .unwrap();
    let quota = Quota::per_second(1_000).unwrap();
    let ((hybrid, pure), m) = Recorded::build(|| {
        (
            HybridLimiter::builder("dies", quota, store.clone())
                .lease_size(10)
                .on_store_failure(FailurePolicy::FailClosed)
                .build()
                .unwrap(),
            RedisLimiter::new("dies", quota, store.clone()).unwrap(),
        )
    });
    hybrid.acquire(1).await.unwrap();
    assert!(pure.acquire_now(1).await.unwrap().is_allowed());
    let healthy = spans.store_calls("key", "{dies}");
    let leases = hybrid.stats().leases;
    assert_eq!(healthy.len() as u64, leases + 1, "{healthy:?}");
    for call in &healthy {
        assert_eq!(call.fields["store"], "redis");
        assert_eq!(call.fields["op"], "lease");
        assert!(call.fields["key"].contains("{dies}"), "{call:?}");
        assert_eq!(call.fields["script"].len(), 40, "a SHA-1: {call:?}");
        assert!(!call.fields.contains_key("error"), "{call:?}");
    }

    server.stop();
    // The first call fails at the store and opens the circuit; the next two, at once, return
    // its error without a store call (the first probe waits 5–10 ms).
    for _ in 0..3 {
        assert!(pure.acquire_now(1).await.is_err());
    }
    assert!(pure.circuit_open());
    let pure_labels = [("limiter", "dies"), ("mode", "pure")];
    let r = m.read();
    assert_eq!(r.counter(telemetry::STORE_ERRORS, &pure_labels), 1);
    assert_eq!(r.counter(telemetry::LEASES, &pure_labels), 2);
    assert_eq!(r.counter(telemetry::ADMITTED_TOKENS, &pure_labels), 1);

    // Spend the hybrid limiter's tokens: its refills fail, the circuit opens.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !hybrid.stats().circuit_open {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            hybrid.stats()
        );
        let _ = hybrid.try_acquire(1);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    hybrid.shutdown().await;
    let stats = hybrid.stats();
    assert!(stats.store_errors >= 1, "{stats:?}");
    assert_eq!(published(&m.read(), "dies"), expected(&stats));
    let failed: Vec<_> = spans
        .store_calls("key", "{dies}")
        .into_iter()
        .filter(|s| s.fields.contains_key("error"))
        .collect();
    assert_eq!(
        failed.len() as u64,
        1 + stats.store_errors,
        "one span with an error per failed call: {failed:?}"
    );
}

/// A keyed hybrid limiter's counters, read from the recorder (every series labelled
/// `mode="keyed-hybrid"`), in [`KeyedStats`]' terms, and the admitted tokens.
fn keyed_published(m: &Reading, name: &str) -> (KeyedStats, u64) {
    let l = [("limiter", name), ("mode", "keyed-hybrid")];
    let reason = |r| [("limiter", name), ("mode", "keyed-hybrid"), ("reason", r)];
    let mut s = KeyedStats::default();
    s.live_keys = m.gauge(telemetry::LIVE_KEYS, &l) as u64;
    s.keys_created = m.counter(telemetry::CREATED_KEYS, &l);
    s.evicted_idle = m.counter(telemetry::EVICTED_KEYS, &reason("idle"));
    s.evicted_at_cap = m.counter(telemetry::EVICTED_KEYS, &reason("cap"));
    s.refused_at_cap = m.counter(telemetry::REFUSED_KEYS, &reason("cap"));
    s.refused_busy = m.counter(telemetry::REFUSED_KEYS, &reason("busy"));
    s.leases = m.counter(telemetry::LEASES, &l);
    s.tokens_leased = m.counter(telemetry::LEASED_TOKENS, &l);
    s.over_limit = m.counter(telemetry::OVER_LIMIT, &l);
    s.releases = m.counter(telemetry::RELEASES, &l);
    s.tokens_released = m.counter(telemetry::RELEASED_TOKENS, &l);
    s.tokens_lost = m.counter(telemetry::EXPIRED_TOKENS, &l);
    s.store_errors = m.counter(telemetry::STORE_ERRORS, &l);
    s.tokens_denied = m.counter(telemetry::DENIED_TOKENS, &l);
    (s, m.counter(telemetry::ADMITTED_TOKENS, &l))
}

/// The fields `keyed_published` reads, as the limiter's own stats have them.
fn keyed_expected(s: &KeyedStats) -> KeyedStats {
    let mut e = *s;
    e.tokens_admitted_degraded = 0;
    e.circuit_open = false;
    e
}

/// Three keys on a budget of 10 tokens an hour: `a` is denied 3 then spends its exact lease
/// of 3, `b` waits for 4 (handed straight from the grant), `c` leases 2 and spends one without
/// waking the worker, and `a` asks for 8 more than its bucket has (over the limit). Every
/// counter is published under the keyed limiter's name, with exact values; shutdown gives
/// `c`'s last token back and leaves the totals exact.
#[tokio::test(start_paused = true)]
async fn keyed_hybrid_counters_are_exact_and_published_by_the_worker() {
    let quota = Quota::new(10, Duration::from_secs(3_600)).unwrap();
    let store = MemoryStore::with_clock(TokioClock::new());
    let (limiter, m) = Recorded::build(|| {
        KeyedHybridLimiter::<String, _>::builder("keys", quota, store)
            .give_back_after(Duration::from_secs(3_600))
            .build()
            .unwrap()
    });
    assert!(!limiter.try_acquire("a", 3).unwrap().is_allowed());
    settle().await;
    assert!(limiter.try_acquire("a", 3).unwrap().is_allowed());
    limiter.acquire("b", 4).await.unwrap();
    assert!(!limiter.try_acquire("c", 2).unwrap().is_allowed());
    settle().await;
    assert_eq!(limiter.available("c"), 2);
    let over = limiter
        .try_acquire_for("a", 8, Duration::from_millis(10))
        .await
        .unwrap();
    assert!(!over.is_allowed(), "7 tokens left in a's bucket");
    // One hit on c, above its low-water mark (exact leases have none): nothing wakes the
    // worker; its tick publishes, and the admitted count waits for the next sum of the keys.
    assert!(limiter.try_acquire("c", 1).unwrap().is_allowed());
    tokio::time::sleep(PUBLISH_INTERVAL + Duration::from_millis(200)).await;
    let stats = limiter.stats();
    let r = m.read();
    let (counted, admitted) = keyed_published(&r, "keys");
    assert_eq!(counted, keyed_expected(&stats));
    assert_eq!(admitted, 3 + 4 + 1);
    assert_eq!(
        (counted.leases, counted.tokens_leased, counted.over_limit),
        (4, 9, 1)
    );
    assert_eq!((counted.keys_created, counted.live_keys), (3, 3));
    assert_eq!(
        counted.tokens_denied,
        3 + 4 + 2 + 8,
        "b waited after a denial too"
    );
    let l = [("limiter", "keys"), ("mode", "keyed-hybrid")];
    assert_eq!(r.gauge(telemetry::LOCAL_TOKENS, &l), 1.0, "c's last token");
    assert_eq!(r.samples(telemetry::LEASE_SIZE, &l), [3.0, 4.0, 2.0]);
    // Virtual time stands still during a MemoryStore call.
    assert_eq!(r.samples(telemetry::LEASE_DURATION, &l), [0.0; 4]);
    let policy = [
        ("limiter", "keys"),
        ("mode", "keyed-hybrid"),
        ("policy", "last-known-share"),
    ];
    assert_eq!(r.gauge(telemetry::CIRCUIT_OPEN, &policy), 0.0);
    assert!(
        r.0.keys()
            .all(|(_, _, labels)| labels.iter().all(|(k, v)| k != "key" && !v.contains('#'))),
        "no series names a key: {:?}",
        r.0.keys()
    );

    limiter.shutdown().await;
    let stats = limiter.stats();
    assert_eq!((stats.releases, stats.tokens_released), (1, 1));
    let r = m.read();
    let (counted, admitted) = keyed_published(&r, "keys");
    assert_eq!(counted, keyed_expected(&stats));
    assert_eq!(admitted, 8, "nothing more was admitted");
    assert_eq!(r.counter(telemetry::RELEASED_TOKENS, &l), 1);
    assert_eq!(r.gauge(telemetry::LOCAL_TOKENS, &l), 0.0);
    assert_eq!(r.gauge(telemetry::LIVE_KEYS, &l), 0.0);
}

/// Keys evicted at the cap and after the idle TTL, and new keys refused at the cap, are
/// counted by reason; the live keys gauge follows.
#[tokio::test(start_paused = true)]
async fn keyed_evictions_refusals_and_live_keys_are_published() {
    let quota = Quota::per_second(1_000).unwrap();
    let store = MemoryStore::with_clock(TokioClock::new());
    let (limiter, m) = Recorded::build(|| {
        KeyedHybridLimiter::<String, _>::builder("evict", quota, store)
            .max_keys(4)
            .idle_ttl(Duration::from_secs(2))
            .build()
            .unwrap()
    });
    // One at a time: the queue of first leases is a quarter of the cap long.
    for k in ["k1", "k2", "k3", "k4"] {
        assert!(!limiter.try_acquire(k, 1).unwrap().is_allowed());
        settle().await;
    }
    let l = [("limiter", "evict"), ("mode", "keyed-hybrid")];
    assert_eq!(m.read().gauge(telemetry::LIVE_KEYS, &l), 4.0);
    // At the cap: refused, and the worker evicts one key to make room.
    assert!(!limiter.try_acquire("k5", 1).unwrap().is_allowed());
    settle().await;
    let stats = limiter.stats();
    assert_eq!((stats.refused_at_cap, stats.evicted_at_cap), (1, 1));
    let r = m.read();
    assert_eq!(keyed_published(&r, "evict").0, keyed_expected(&stats));
    assert_eq!(r.gauge(telemetry::LIVE_KEYS, &l), 3.0);
    let reason = |r| {
        [
            ("limiter", "evict"),
            ("mode", "keyed-hybrid"),
            ("reason", r),
        ]
    };
    assert_eq!(r.counter(telemetry::REFUSED_KEYS, &reason("cap")), 1);
    assert_eq!(r.counter(telemetry::EVICTED_KEYS, &reason("cap")), 1);
    // The other three go after the idle TTL, their tokens back to the store.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let stats = limiter.stats();
    assert_eq!((stats.live_keys, stats.evicted_idle), (0, 3), "{stats:?}");
    let r = m.read();
    assert_eq!(keyed_published(&r, "evict").0, keyed_expected(&stats));
    assert_eq!(r.counter(telemetry::EVICTED_KEYS, &reason("idle")), 3);
    assert_eq!(r.gauge(telemetry::LIVE_KEYS, &l), 0.0);
    assert_eq!(
        r.counter(telemetry::RELEASED_TOKENS, &l),
        4,
        "every key's token"
    );
    assert_eq!(keyed_published(&r, "evict").1, 0, "nothing was admitted");
    limiter.shutdown().await;
}

/// A keyed limiter on a failing store: the failure policy's admissions, the store errors and
/// the open circuit are published, with the policy label.
#[tokio::test(start_paused = true)]
async fn keyed_failure_policy_admissions_and_the_circuit_are_published() {
    let store = Wrapped::new(Duration::ZERO);
    store.failing.store(true, Ordering::SeqCst);
    let quota = Quota::per_second(100).unwrap();
    let (limiter, m) = Recorded::build(|| {
        KeyedHybridLimiter::<String, _>::builder("kdown", quota, store)
            .on_store_failure(FailurePolicy::FailOpen)
            .build()
            .unwrap()
    });
    assert!(
        !limiter.try_acquire("k", 1).unwrap().is_allowed(),
        "first lease"
    );
    settle().await;
    for _ in 0..5 {
        assert!(
            limiter.try_acquire("k", 1).unwrap().is_allowed(),
            "fail open"
        );
    }
    tokio::time::sleep(PUBLISH_INTERVAL).await;
    let stats = limiter.stats();
    assert!(stats.circuit_open && stats.store_errors >= 1, "{stats:?}");
    let r = m.read();
    assert_eq!(keyed_published(&r, "kdown").0, keyed_expected(&stats));
    let policy = [
        ("limiter", "kdown"),
        ("mode", "keyed-hybrid"),
        ("policy", "fail-open"),
    ];
    assert_eq!(r.counter(telemetry::DEGRADED_TOKENS, &policy), 5);
    assert_eq!(r.gauge(telemetry::CIRCUIT_OPEN, &policy), 1.0);
    assert_eq!(keyed_published(&r, "kdown").1, 5, "admitted, degraded");
    limiter.shutdown().await;
}

/// The pure keyed limiter reports every key's calls under its own name, `mode="keyed-pure"`,
/// never under a key's bucket name.
#[tokio::test]
async fn keyed_pure_calls_are_counted_under_the_limiters_name() {
    let store = MemoryStore::with_clock(FakeClock::new());
    let quota = Quota::new(5, Duration::from_secs(3_600)).unwrap();
    let (limiter, m) = Recorded::build(|| KeyedRedisLimiter::new("kp", quota, store).unwrap());
    let mut allowed = 0;
    for key in ["alice", "bob", "carol"] {
        for _ in 0..3 {
            allowed += u64::from(limiter.acquire_now(key, 2).await.unwrap().is_allowed());
        }
    }
    assert_eq!(allowed, 6, "two requests of 2 per key");
    let l = [("limiter", "kp"), ("mode", "keyed-pure")];
    let r = m.read();
    assert_eq!(r.counter(telemetry::ADMITTED_TOKENS, &l), 12);
    assert_eq!(r.counter(telemetry::DENIED_TOKENS, &l), 6);
    assert_eq!(r.counter(telemetry::LEASES, &l), 9);
    assert_eq!(r.counter(telemetry::STORE_ERRORS, &l), 0);
    assert_eq!(r.samples(telemetry::LEASE_DURATION, &l).len(), 9);
    assert_eq!(r.0.len(), 5, "one series per metric: {:?}", r.0.keys());
}

/// A concurrency limiter's metrics, read from the recorder: acquired and denied permits,
/// store calls by operation, errors, and the held permits gauge.
fn conc_published(m: &Reading, name: &str, mode: &str) -> [u64; 7] {
    let l = [("limiter", name), ("mode", mode)];
    let op = |op| [("limiter", name), ("mode", mode), ("op", op)];
    [
        m.counter(telemetry::ACQUIRED_PERMITS, &l),
        m.counter(telemetry::DENIED_PERMITS, &l),
        m.counter(telemetry::CONCURRENCY_CALLS, &op("acquire")),
        m.counter(telemetry::CONCURRENCY_CALLS, &op("release")),
        m.counter(telemetry::CONCURRENCY_CALLS, &op("sync")),
        m.counter(telemetry::CONCURRENCY_ERRORS, &l),
        m.gauge(telemetry::HELD_PERMITS, &l) as u64,
    ]
}

/// What `conc_published` should read, from the limiter's stats and the permits the test
/// counted.
fn conc_expected(s: &ConcurrencyStats, acquired: u64, denied: u64) -> [u64; 7] {
    [
        acquired,
        denied,
        s.acquires,
        s.releases,
        s.syncs,
        s.store_errors,
        s.in_use,
    ]
}

/// Pure mode: a limit of 2, three callers, one refused; a permit dropped and released. The
/// callers' store calls are counted and timed, and published by the background task.
#[tokio::test(start_paused = true)]
async fn pure_concurrency_permits_calls_and_latency_are_published() {
    let store = MemoryStore::with_clock(TokioClock::new());
    let (limiter, m) = Recorded::build(|| {
        ConcurrencyLimiter::builder("conc", 2, store)
            .build()
            .unwrap()
    });
    let a = limiter.acquire_now(1).await.unwrap().expect("free");
    let b = limiter.acquire_now(1).await.unwrap().expect("free");
    assert!(limiter.acquire_now(1).await.unwrap().is_none(), "full");
    drop(a);
    settle().await;
    let stats = limiter.stats();
    assert_eq!((stats.acquires, stats.releases, stats.in_use), (3, 1, 1));
    let r = m.read();
    assert_eq!(
        conc_published(&r, "conc", "pure"),
        conc_expected(&stats, 2, 1)
    );
    let l = [("limiter", "conc"), ("mode", "pure")];
    assert_eq!(
        r.samples(telemetry::ACQUIRE_DURATION, &l),
        [0.0; 3],
        "one per acquire call"
    );

    drop(b);
    limiter.shutdown().await;
    let stats = limiter.stats();
    assert_eq!(stats.in_use, 0);
    let r = m.read();
    assert_eq!(
        conc_published(&r, "conc", "pure"),
        conc_expected(&stats, 2, 1)
    );
    assert!(stats.syncs >= 1, "the last renewal: {stats:?}");
}

/// Hybrid mode: permits taken from the pool (no store call, no metric call on the caller's
/// thread) are counted by the background task, which publishes them within one interval.
#[tokio::test(start_paused = true)]
async fn hybrid_concurrency_permits_are_published_by_the_task() {
    let store = MemoryStore::with_clock(TokioClock::new());
    let (limiter, m) = Recorded::build(|| {
        ConcurrencyLimiter::builder("hconc", 8, store)
            .hybrid(4)
            .idle_return(Duration::from_secs(60))
            .build()
            .unwrap()
    });
    let first = limiter.acquire(1).await.unwrap();
    let second = limiter.try_acquire(2).unwrap().expect("from the pool");
    assert!(
        limiter.try_acquire(2).unwrap().is_none(),
        "one slot left in the pool"
    );
    tokio::time::sleep(PUBLISH_INTERVAL + Duration::from_millis(100)).await;
    let stats = limiter.stats();
    assert_eq!(stats.in_use, 3, "{stats:?}");
    let r = m.read();
    assert_eq!(
        conc_published(&r, "hconc", "hybrid"),
        conc_expected(&stats, 3, 2)
    );
    let l = [("limiter", "hconc"), ("mode", "hybrid")];
    assert_eq!(
        r.gauge(telemetry::POOLED_PERMITS, &l),
        stats.pooled as f64,
        "{stats:?}"
    );
    assert!(
        r.samples(telemetry::ACQUIRE_DURATION, &l).is_empty(),
        "the task's leases are not callers' acquires"
    );

    drop((first, second));
    limiter.shutdown().await;
    let stats = limiter.stats();
    let r = m.read();
    assert_eq!(
        conc_published(&r, "hconc", "hybrid"),
        conc_expected(&stats, 3, 2)
    );
    assert_eq!(r.gauge(telemetry::HELD_PERMITS, &l), 0.0);
    assert_eq!(r.gauge(telemetry::POOLED_PERMITS, &l), 0.0);
}

/// Against a real redis-server that is then stopped: the pure keyed limiter and a pure
/// concurrency limiter count their failed store calls.
#[tokio::test]
async fn keyed_and_concurrency_store_errors_are_counted_when_redis_dies() {
    let mut server = RedisServer::start();
    let store = RedisStore::builder(server.url())
        .response_timeout(Duration::from_millis(50))
        .connect_timeout(Duration::from_millis(50))
        .connect()
        .await
        .unwrap();
    let quota = Quota::per_second(1_000).unwrap();
    let ((keyed, conc), m) = Recorded::build(|| {
        (
            KeyedRedisLimiter::new("kdies", quota, store.clone()).unwrap(),
            ConcurrencyLimiter::builder("cdies", 4, store.clone())
                .on_store_failure(FailurePolicy::FailClosed)
                .build()
                .unwrap(),
        )
    });
    assert!(keyed.acquire_now("u", 1).await.unwrap().is_allowed());
    let permit = conc.acquire_now(1).await.unwrap().expect("free");
    server.stop();
    for _ in 0..3 {
        assert!(keyed.acquire_now("u", 1).await.is_err());
        assert!(conc.acquire_now(1).await.is_err());
    }
    let kl = [("limiter", "kdies"), ("mode", "keyed-pure")];
    let r = m.read();
    // The keys' one circuit lets a call through once its back-off (5–40 ms) has passed; a
    // call inside it returns the last error without a store call, so is not counted.
    let errors = r.counter(telemetry::STORE_ERRORS, &kl);
    assert!((1..=3).contains(&errors), "{errors}");
    assert_eq!(r.counter(telemetry::LEASES, &kl), 1 + errors);
    drop(permit);
    conc.shutdown().await;
    let stats = conc.stats();
    assert!(stats.store_errors >= 3, "{stats:?}");
    let r = m.read();
    assert_eq!(
        conc_published(&r, "cdies", "pure"),
        conc_expected(&stats, 1, 0)
    );
}

#[tokio::test]
async fn keyed_and_concurrency_metrics_are_registered_and_described() {
    let (limiters, m) = Recorded::build(|| {
        let store = MemoryStore::new();
        let quota = Quota::per_second(10).unwrap();
        (
            KeyedHybridLimiter::<String, _>::new("new", quota, store.clone()).unwrap(),
            ConcurrencyLimiter::builder("new", 4, store.clone())
                .hybrid(2)
                .build()
                .unwrap(),
        )
    });
    let seen = m.read().0;
    let names = [
        telemetry::LIVE_KEYS,
        telemetry::CREATED_KEYS,
        telemetry::EVICTED_KEYS,
        telemetry::REFUSED_KEYS,
        telemetry::ACQUIRED_PERMITS,
        telemetry::DENIED_PERMITS,
        telemetry::HELD_PERMITS,
        telemetry::POOLED_PERMITS,
        telemetry::CONCURRENCY_CALLS,
        telemetry::CONCURRENCY_ERRORS,
        telemetry::ACQUIRE_DURATION,
        telemetry::ADMITTED_TOKENS,
        telemetry::LEASED_TOKENS,
    ];
    for name in names {
        let found: Vec<_> = seen.iter().filter(|(k, _)| k.1 == name).collect();
        assert!(!found.is_empty(), "{name} not registered");
        for ((_, _, labels), s) in found {
            assert!(s.described, "{name} has no description");
            assert_eq!(labels[0], ("limiter".to_owned(), "new".to_owned()));
            assert!(
                labels.iter().any(|(k, _)| k == "mode"),
                "{name}: {labels:?}"
            );
        }
    }
    assert!(
        !seen.keys().any(|k| k.1 == telemetry::DEMAND),
        "no limiter-wide demand for keyed limiters"
    );
    limiters.0.shutdown().await;
    limiters.1.shutdown().await;
}
