//! The HTTP layer (feature `http`): shedding with 429 + `Retry-After` + `RateLimit` headers
//! for keyed and global limits, a new key's first request admitted (lease wait) while
//! over-limit requests are never queued (unless asked), key extractors over a real TCP
//! connection, and every limiter failure a response.
#![cfg(feature = "axum")]

#[path = "support/http_client.rs"]
mod http_client;
mod wrapped;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use http::{HeaderName, Request, Response, StatusCode};
use ratelease::http::{
    ForwardedIp, HeaderKey, InvalidPolicyName, KeyError, KeyFn, LimitLayer, PeerIp, Rejection,
    TrustedProxies,
};
use ratelease::{HybridLimiter, KeyedHybridLimiter, KeyedRedisLimiter, MemoryStore, Quota};
use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};
use wrapped::Wrapped;

/// The store of the virtual-time tests: a 1 ms round trip, so that waiting for a lease takes
/// (virtual) time and shows.
fn slow_store() -> Wrapped {
    Wrapped::new(Duration::from_millis(1))
}

const API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// An inner service that counts its calls and answers 200.
fn counting(
    calls: Arc<AtomicU64>,
) -> impl Service<Request<()>, Response = Response<String>, Error = Infallible, Future: Send>
       + Clone
       + Send
       + 'static {
    tower::service_fn(move |_: Request<()>| {
        calls.fetch_add(1, Ordering::Relaxed);
        async { Ok::<_, Infallible>(Response::new("ok".to_owned())) }
    })
}

fn as_key(key: &str) -> Request<()> {
    Request::get("/").header(API_KEY, key).body(()).unwrap()
}

fn keyed(quota: Quota, store: MemoryStore) -> KeyedHybridLimiter<String, MemoryStore> {
    KeyedHybridLimiter::new("http-test", quota, store).unwrap()
}

#[tokio::test]
async fn a_new_keys_first_request_is_admitted_and_with_lease_wait_zero_it_is_not() {
    let quota = Quota::per_minute(10).unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    let waits = ServiceBuilder::new()
        .layer(LimitLayer::keyed(
            keyed(quota, MemoryStore::new()),
            HeaderKey::new(API_KEY),
        ))
        .service(counting(calls.clone()));
    for key in ["a", "b", "c"] {
        let response = waits.clone().oneshot(as_key(key)).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "new key {key}");
    }
    assert_eq!(calls.load(Ordering::Relaxed), 3);

    // The old behaviour, now opt-in: no lease wait sheds a new key's first request (for a
    // round trip's `Retry-After`, rounded up to 1 s), and the lease it started serves the
    // retry.
    let sheds = ServiceBuilder::new()
        .layer(
            LimitLayer::keyed(keyed(quota, MemoryStore::new()), HeaderKey::new(API_KEY))
                .lease_wait(Duration::ZERO),
        )
        .service(counting(calls.clone()));
    let first = sheds.clone().oneshot(as_key("a")).await.unwrap();
    assert_eq!(first.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(first.headers()["retry-after"], "1");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let retry = sheds.oneshot(as_key("a")).await.unwrap();
    assert_eq!(retry.status(), StatusCode::OK);
}

/// What [`hot_key`] saw.
struct HotKey {
    admitted: u64,
    shed: u64,
    /// Virtual time spent inside requests.
    inside: Duration,
    /// Virtual time the whole run took.
    elapsed: Duration,
}

/// Drives one key at 50 requests per 10 ms of virtual time (5 000/s) for one virtual second.
async fn hot_key(layer: LimitLayer<impl ratelease::http::Gate>) -> HotKey {
    let run = Instant::now();
    let calls = Arc::new(AtomicU64::new(0));
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(counting(calls.clone()));
    let (mut shed, mut inside) = (0, Duration::ZERO);
    for _ in 0..100 {
        for _ in 0..50 {
            let start = Instant::now();
            let response = svc.clone().oneshot(as_key("hot")).await.unwrap();
            inside += start.elapsed();
            match response.status() {
                StatusCode::OK => {}
                StatusCode::TOO_MANY_REQUESTS => shed += 1,
                other => panic!("status {other}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    HotKey {
        admitted: calls.load(Ordering::Relaxed),
        shed,
        inside,
        elapsed: run.elapsed(),
    }
}

#[tokio::test(start_paused = true)]
async fn an_over_limit_key_is_shed_at_once_not_queued_unless_queueing_is_on() {
    // 100/s, burst 10: the key asks for 50 times its rate.
    let quota = Quota::per_second(100).unwrap().with_burst(10).unwrap();
    let limiter = || KeyedHybridLimiter::new("http-hot", quota, slow_store()).unwrap();
    let bound = |run: &HotKey| 10 + run.elapsed.as_millis() as u64 / 10;

    let run = hot_key(LimitLayer::keyed(limiter(), HeaderKey::new(API_KEY))).await;
    // The limit is served (burst + rate x elapsed at most) and the rest refused — and no
    // request waited for a token, nor for the small refills of a key the store just refused.
    // Time inside requests is the new key's start: its burst of 10 is leased a token at a
    // time (exact leases), one 1 ms round trip per request, until the store first says no.
    assert_eq!(run.admitted + run.shed, 5_000);
    assert!(run.admitted <= bound(&run), "admitted {}", run.admitted);
    assert!(run.admitted >= 90, "admitted {}", run.admitted);
    assert!(
        run.inside <= Duration::from_millis(15),
        "requests spent {:?} waiting",
        run.inside
    );

    // With queueing on, the same load waits for tokens instead: every request now waits its
    // turn (up to 20 ms each), and the run takes as long as the limit needs to serve them.
    let queued =
        LimitLayer::keyed(limiter(), HeaderKey::new(API_KEY)).queue(Duration::from_millis(20));
    let run = hot_key(queued).await;
    assert!(
        run.inside > Duration::from_secs(10),
        "queued requests spent only {:?}",
        run.inside
    );
    assert!(
        run.admitted > 1_000 && run.admitted <= bound(&run),
        "admitted {}",
        run.admitted
    );
}

#[tokio::test(start_paused = true)]
async fn an_over_limit_global_limit_is_shed_at_once_too() {
    let quota = Quota::per_second(100).unwrap().with_burst(10).unwrap();
    let limiter = HybridLimiter::new("http-global-hot", quota, slow_store()).unwrap();
    limiter.ready().await.unwrap();
    let run = hot_key(LimitLayer::global(limiter)).await;
    assert_eq!(run.admitted + run.shed, 5_000);
    let bound = 10 + run.elapsed.as_millis() as u64 / 10;
    assert!(
        (80..=bound).contains(&run.admitted),
        "admitted {}",
        run.admitted
    );
    // Misses between two small grants of a limiter the store just refused are refusals:
    // nobody waits for those refills.
    assert!(
        run.inside < Duration::from_millis(10),
        "requests spent {:?} waiting",
        run.inside
    );
}

#[tokio::test(start_paused = true)]
async fn a_key_under_its_limit_is_never_refused_while_its_leases_ramp_up() {
    // 10 000/s, burst 100, for a key asking 5 000/s from a standing start: its first leases
    // are exact (one token), then sized by measured demand. Every miss on the way is a lease
    // in flight, which the request waits for.
    let quota = Quota::per_second(10_000).unwrap().with_burst(100).unwrap();
    let limiter = KeyedHybridLimiter::new("http-ramp", quota, slow_store()).unwrap();
    let run = hot_key(LimitLayer::keyed(limiter.clone(), HeaderKey::new(API_KEY))).await;
    assert_eq!((run.admitted, run.shed), (5_000, 0));
    assert!(limiter.stats().leases < 500, "{:?}", limiter.stats());
}

/// Drives key `hot` (at [`hot_key`]'s rate) through an outage of `store`: 200 ms failing,
/// then until the limiter's circuit has closed again.
async fn through_an_outage(
    layer: LimitLayer<impl ratelease::http::Gate>,
    store: &Wrapped,
    circuit_open: impl Fn() -> bool,
) {
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(counting(Arc::default()));
    let burst = || async {
        for _ in 0..50 {
            svc.clone().oneshot(as_key("hot")).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    store.failing.store(true, Ordering::SeqCst);
    for _ in 0..20 {
        burst().await;
    }
    assert!(circuit_open(), "the outage opened the circuit");
    store.failing.store(false, Ordering::SeqCst);
    while circuit_open() {
        burst().await;
    }
}

/// Only the store's refusal makes a miss a refusal: once an outage is over, the back-off it
/// left behind does not, and a key under its limit is not shed while its leases ramp up again
/// (`tests/hybrid.rs` has the same for a global limit's `try_acquire_local`).
#[tokio::test(start_paused = true)]
async fn after_an_outage_a_key_far_from_its_limit_is_not_shed_while_its_leases_ramp_up() {
    let quota = Quota::per_second(10_000).unwrap().with_burst(100).unwrap();
    let store = slow_store();
    let keyed = KeyedHybridLimiter::new("http-outage", quota, store.clone()).unwrap();
    let layer = || LimitLayer::keyed(keyed.clone(), HeaderKey::new(API_KEY));
    through_an_outage(layer(), &store, || keyed.stats().circuit_open).await;
    let run = hot_key(layer()).await;
    assert_eq!((run.admitted, run.shed), (5_000, 0));
}

/// During an outage a key new to this process is answered by the failure policy at its first
/// request, as a key seen before is: the default policy (the whole rate per key until a share
/// is known) admits it. It was denied for want of the key's state, and the layer took that for
/// the store's refusal: every new client's first request was a 429.
#[tokio::test(start_paused = true)]
async fn in_an_outage_a_new_keys_first_request_is_answered_by_the_failure_policy() {
    let quota = Quota::per_second(10_000).unwrap().with_burst(100).unwrap();
    let store = slow_store();
    let keyed = KeyedHybridLimiter::new("http-outage-new", quota, store.clone()).unwrap();
    let svc = ServiceBuilder::new()
        .layer(LimitLayer::keyed(keyed.clone(), HeaderKey::new(API_KEY)))
        .service(counting(Arc::default()));
    store.failing.store(true, Ordering::SeqCst);
    for _ in 0..10 {
        svc.clone().oneshot(as_key("seen")).await.unwrap();
        if keyed.stats().circuit_open {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(keyed.stats().circuit_open, "{:?}", keyed.stats());
    let degraded = keyed.stats().tokens_admitted_degraded;
    for i in 0..8 {
        let response = svc
            .clone()
            .oneshot(as_key(&format!("new-{i}")))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "new key {i}");
    }
    assert_eq!(keyed.stats().tokens_admitted_degraded, degraded + 8);
}

#[tokio::test]
async fn a_global_limit_sheds_with_headers_and_its_first_request_waits_for_the_lease() {
    let quota = Quota::per_minute(3).unwrap();
    // No `ready()`: the first request finds no lease yet and waits for it.
    let limiter = HybridLimiter::new("http-global", quota, MemoryStore::new()).unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    let svc = ServiceBuilder::new()
        .layer(
            LimitLayer::global(limiter)
                .policy_name("site")
                .unwrap()
                .advertise_policy(true),
        )
        .service(counting(calls.clone()));
    for i in 0..3 {
        let response = svc.clone().oneshot(as_key("any")).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "request {i}");
        assert_eq!(response.headers()["ratelimit-policy"], "\"site\";q=3;w=60");
        assert!(response.headers().get("ratelimit").is_none());
    }
    let limited = svc.oneshot(as_key("any")).await.unwrap();
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    let secs: u64 = limited.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=20).contains(&secs), "Retry-After: {secs}");
    assert_eq!(
        limited.headers()["ratelimit"],
        format!("\"site\";r=0;t={secs}").as_str()
    );
    assert_eq!(limited.headers()["ratelimit-policy"], "\"site\";q=3;w=60");
    assert!(matches!(
        limited.extensions().get::<Rejection>(),
        Some(Rejection::Limited { retry_after }) if !retry_after.is_zero()
    ));
    assert_eq!(
        calls.load(Ordering::Relaxed),
        3,
        "the shed request never reached the service"
    );
}

/// Stacked layers: a per-client limit outside that advertises its policy, a global one
/// inside. When the global one refuses, its 429 names its own policy and the outer layer adds
/// the per-client one beside it (`RateLimit-Policy` is a list); it used to replace it, so the
/// refusal's `RateLimit` pointed at a policy the response no longer stated.
#[tokio::test]
async fn stacked_layers_each_add_their_policy_and_an_inner_429_keeps_its_own() {
    let store = MemoryStore::new();
    let global =
        HybridLimiter::new("http-stack", Quota::per_minute(2).unwrap(), store.clone()).unwrap();
    global.ready().await.unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    let svc = ServiceBuilder::new()
        .layer(
            LimitLayer::keyed(
                keyed(Quota::per_minute(10).unwrap(), store),
                HeaderKey::new(API_KEY),
            )
            .policy_name("per-client")
            .unwrap()
            .advertise_policy(true),
        )
        .layer(LimitLayer::global(global).policy_name("global").unwrap())
        .service(counting(calls.clone()));
    let policies = |response: &Response<String>| -> Vec<String> {
        let values = response.headers().get_all("ratelimit-policy");
        values
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    };
    for _ in 0..2 {
        let ok = svc.clone().oneshot(as_key("a")).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(policies(&ok), ["\"per-client\";q=10;w=60"]);
    }
    let limited = svc.oneshot(as_key("a")).await.unwrap();
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(
        limited.headers()["ratelimit"]
            .to_str()
            .unwrap()
            .starts_with("\"global\";r=0;"),
        "{:?}",
        limited.headers()
    );
    assert_eq!(
        policies(&limited),
        ["\"global\";q=2;w=60", "\"per-client\";q=10;w=60"]
    );
    assert_eq!(calls.load(Ordering::Relaxed), 2);
}

/// A global limit whose limiter decides per request (a burst of two tokens at 30/s, asked
/// twice a second: leasing buys nothing there), with no lease wait: a miss is one decision in
/// the store, awaited — not a 429 for want of a lease that never comes, which every request
/// got.
#[tokio::test(start_paused = true)]
async fn a_global_limit_deciding_per_request_admits_with_no_lease_wait() {
    let store = MemoryStore::with_clock(ratelease::TokioClock::new());
    let quota = Quota::with_parts(30, Duration::from_secs(1), 2).unwrap();
    let limiter = HybridLimiter::new("http-per-request", quota, store).unwrap();
    limiter.ready().await.unwrap();
    for _ in 0..limiter.available() {
        assert!(limiter.try_acquire(1).unwrap().is_allowed());
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(limiter.stats().per_request, "{:?}", limiter.stats());
    let svc = ServiceBuilder::new()
        .layer(LimitLayer::global(limiter.clone()).lease_wait(Duration::ZERO))
        .service(counting(Arc::default()));
    for i in 0..10 {
        let response = svc.clone().oneshot(as_key("any")).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "request {i}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(limiter.stats().decisions >= 10, "{:?}", limiter.stats());
}

/// The policy a 429 states counts requests (the quota's rate over the tokens a request
/// costs), under the quota the limiter has now: a stored config that differs from the one the
/// layer was built with. It stated the builder's 600 a minute, ignoring both.
#[tokio::test]
async fn the_policy_header_states_requests_under_the_quota_in_force() {
    use ratelease::ConfigStore;

    let store = MemoryStore::new();
    store
        .init_config("http-stored", &Quota::per_minute(10).unwrap())
        .await
        .unwrap();
    let limiter =
        HybridLimiter::new("http-stored", Quota::per_minute(600).unwrap(), store).unwrap();
    let svc = ServiceBuilder::new()
        .layer(LimitLayer::global(limiter.clone()).tokens(5).unwrap())
        .service(counting(Arc::default()));
    limiter.ready().await.unwrap();
    assert_eq!(limiter.quota(), Quota::per_minute(10).unwrap());
    // Ten tokens a minute at five a request: at most two requests, then a 429.
    let mut admitted = 0;
    let limited = loop {
        let response = svc.clone().oneshot(as_key("any")).await.unwrap();
        if response.status() != StatusCode::OK {
            break response;
        }
        admitted += 1;
        assert!(admitted <= 2, "{admitted} requests of 5 tokens admitted");
    };
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(admitted >= 1);
    assert_eq!(
        limited.headers()["ratelimit-policy"],
        "\"default\";q=2;w=60"
    );
}

#[tokio::test]
async fn a_pure_mode_limiter_decides_per_request_and_sheds() {
    let quota = Quota::per_minute(2).unwrap();
    let limiter = KeyedRedisLimiter::new("http-pure", quota, MemoryStore::new()).unwrap();
    let svc = ServiceBuilder::new()
        .layer(LimitLayer::keyed(limiter, HeaderKey::new(API_KEY)))
        .service(counting(Arc::default()));
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(svc.clone().oneshot(as_key("p")).await.unwrap().status());
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
}

/// A 503 says when to come back: `Retry-After: 1` (the circuit's back-off, 500 ms at most, in
/// whole seconds), for a store failure no policy answers and for a limiter shut down alike. A
/// 400 (the client's request lacks its key) has none.
#[tokio::test(start_paused = true)]
async fn a_503_carries_a_retry_after() {
    let quota = Quota::per_minute(5).unwrap();
    let retry_after = |response: &Response<String>| {
        let value = response.headers().get(http::header::RETRY_AFTER);
        value.map(|v| v.to_str().unwrap().to_owned())
    };
    // A pure keyed limiter without a failure policy, its store failing.
    let store = slow_store();
    store.failing.store(true, Ordering::SeqCst);
    let pure = KeyedRedisLimiter::new("http-503", quota, store).unwrap();
    let failing = ServiceBuilder::new()
        .layer(LimitLayer::keyed(pure, HeaderKey::new(API_KEY)))
        .service(counting(Arc::default()));
    let response = failing.oneshot(as_key("k")).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(matches!(
        response.extensions().get::<Rejection>(),
        Some(Rejection::Unavailable(ratelease::AcquireError::Store(_)))
    ));
    assert_eq!(retry_after(&response).as_deref(), Some("1"));

    // A limiter shut down.
    let limiter = keyed(quota, MemoryStore::new());
    limiter.shutdown().await;
    let closed = ServiceBuilder::new()
        .layer(LimitLayer::keyed(limiter, HeaderKey::new(API_KEY)))
        .service(counting(Arc::default()));
    let response = closed.oneshot(as_key("k")).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(retry_after(&response).as_deref(), Some("1"));

    // A request without its key: the client's fault, no retry hint.
    let by_header = ServiceBuilder::new()
        .layer(LimitLayer::keyed(
            keyed(quota, MemoryStore::new()),
            HeaderKey::new(API_KEY),
        ))
        .service(counting(Arc::default()));
    let response = by_header
        .oneshot(Request::get("/").body(()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(retry_after(&response), None);
}

#[tokio::test]
async fn limiter_failures_and_missing_keys_are_responses() {
    let quota = Quota::per_minute(5).unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    // More tokens per request than the burst: never admissible, refused at build.
    let err = LimitLayer::keyed(keyed(quota, MemoryStore::new()), HeaderKey::new(API_KEY))
        .tokens(6)
        .unwrap_err();
    assert!(
        matches!(&err, ratelease::BuildError::Config(m) if m.contains("6 tokens per request")),
        "{err}"
    );
    // A limiter shut down: 503.
    let limiter = keyed(quota, MemoryStore::new());
    limiter.shutdown().await;
    let closed = ServiceBuilder::new()
        .layer(LimitLayer::keyed(limiter, HeaderKey::new(API_KEY)))
        .service(counting(calls.clone()));
    let response = closed.oneshot(as_key("k")).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);

    // No key: 400 for a missing header, 500 for a server that records no peer address.
    let by_header = ServiceBuilder::new()
        .layer(LimitLayer::keyed(
            keyed(quota, MemoryStore::new()),
            HeaderKey::new(API_KEY),
        ))
        .service(counting(calls.clone()));
    let response = by_header
        .oneshot(Request::get("/").body(()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let limiter = KeyedHybridLimiter::new("http-peer", quota, MemoryStore::new()).unwrap();
    let by_peer = ServiceBuilder::new()
        .layer(LimitLayer::keyed(limiter, PeerIp::new()))
        .service(counting(calls.clone()));
    let response = by_peer
        .oneshot(Request::get("/").body(()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(matches!(
        response.extensions().get::<Rejection>(),
        Some(Rejection::NoKey(KeyError::NoPeerAddr))
    ));
    assert_eq!(calls.load(Ordering::Relaxed), 0);

    // A custom extractor's refusal carries its own status.
    let by_tenant = KeyFn::new(|head| {
        head.headers
            .get("x-tenant")
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .ok_or(KeyError::Other {
                status: StatusCode::UNAUTHORIZED,
                reason: "no tenant".into(),
            })
    });
    let limiter = KeyedHybridLimiter::new("http-tenant", quota, MemoryStore::new()).unwrap();
    let by_tenant = ServiceBuilder::new()
        .layer(LimitLayer::keyed(limiter, by_tenant))
        .service(counting(calls.clone()));
    let tenant = Request::get("/").header("x-tenant", "7").body(()).unwrap();
    let response = by_tenant.clone().oneshot(tenant).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let response = by_tenant
        .oneshot(Request::get("/").body(()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(calls.swap(0, Ordering::Relaxed), 1);

    // A policy name that cannot go in a header is a typed error.
    let layer = LimitLayer::keyed(keyed(quota, MemoryStore::new()), HeaderKey::new(API_KEY));
    assert_eq!(
        layer.policy_name("two words").unwrap_err(),
        InvalidPolicyName("two words".into())
    );
}

/// Serves `router` on a real port with axum's `ConnectInfo`; returns its address.
async fn serve(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let app = router.into_make_service_with_connect_info::<SocketAddr>();
        axum::serve(listener, app).await.unwrap();
    });
    addr
}

#[tokio::test]
async fn over_http_peer_ip_and_forwarded_ip_key_by_the_right_address() {
    let quota = Quota::per_minute(1).unwrap();
    let by_peer = KeyedHybridLimiter::new("http-peer-ip", quota, MemoryStore::new()).unwrap();
    let peer = serve(
        Router::new()
            .route("/", get(|| async { "hi" }))
            .layer(LimitLayer::keyed(by_peer.clone(), PeerIp::new())),
    )
    .await;
    // The peer is 127.0.0.1 whatever the client claims: one budget.
    let claims = [("x-forwarded-for", "203.0.113.1")];
    assert_eq!(
        http_client::get(peer, "/", &claims).await.unwrap().status,
        200
    );
    let again = [("x-forwarded-for", "203.0.113.2")];
    assert_eq!(
        http_client::get(peer, "/", &again).await.unwrap().status,
        429
    );

    // Behind a trusted proxy (here: loopback), the client is the address it appended.
    let by_client = KeyedHybridLimiter::new("http-fwd-ip", quota, MemoryStore::new()).unwrap();
    let proxy = TrustedProxies::new(["127.0.0.0/8"]).unwrap();
    let fwd = serve(
        Router::new()
            .route("/", get(|| async { "hi" }))
            .layer(LimitLayer::keyed(by_client, ForwardedIp::new(proxy))),
    )
    .await;
    let from = |xff: &'static str| async move {
        http_client::get(fwd, "/", &[("x-forwarded-for", xff)])
            .await
            .unwrap()
            .status
    };
    assert_eq!(from("203.0.113.1").await, 200);
    assert_eq!(from("203.0.113.1").await, 429);
    // A spoofed leftmost entry does not buy a new budget: the proxy saw 203.0.113.1.
    assert_eq!(from("198.51.100.77, 203.0.113.1").await, 429);
    // Another client behind the same proxy has its own.
    assert_eq!(from("203.0.113.2").await, 200);
}
