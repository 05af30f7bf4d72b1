//! The HTTP layer's admitted path allocates nothing: a counting global allocator watches
//! `Limit::call` and the poll of its response future, for a keyed limiter keyed by a header
//! (the key borrowed from the request) and for a global limiter.
//!
//! As in `tests/alloc.rs`: only allocations made by the measuring thread while a region is
//! open are counted, and a control region proves the counter works. The requests are built
//! before the region opens (building one allocates its header map).
#![cfg(feature = "http")]

mod counting;

use std::convert::Infallible;
use std::future::Future;
use std::task::{Context, Poll, Waker};

use counting::allocations;
use http::{HeaderName, Request, Response, StatusCode};
use ratelease::http::{HeaderKey, LimitLayer};
use ratelease::{HybridLimiter, KeyedHybridLimiter, MemoryStore, Quota};
use tower::{Layer, Service};

const API_KEY: HeaderName = HeaderName::from_static("x-api-key");

/// An inner service answering 200 at once, allocating nothing (an empty `String` body).
fn ok() -> impl Service<
    Request<()>,
    Response = Response<String>,
    Error = Infallible,
    Future = std::future::Ready<Result<Response<String>, Infallible>>,
> + Clone
       + Send
       + 'static {
    tower::service_fn(|_: Request<()>| std::future::ready(Ok(Response::new(String::new()))))
}

/// Sends `requests` through `svc` on this thread, each answered at once; returns how many
/// were 200, and the allocations made.
fn admitted<S>(svc: &mut S, requests: Vec<Request<()>>) -> (usize, u64)
where
    S: Service<Request<()>, Response = Response<String>, Error = Infallible>,
{
    let mut cx = Context::from_waker(Waker::noop());
    allocations(|| {
        let mut ok = 0;
        for request in requests {
            if !matches!(svc.poll_ready(&mut cx), Poll::Ready(Ok(()))) {
                continue;
            }
            let mut response = std::pin::pin!(svc.call(request));
            if let Poll::Ready(Ok(r)) = response.as_mut().poll(&mut cx) {
                ok += usize::from(r.status() == StatusCode::OK);
            }
        }
        ok
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn the_counter_sees_allocations() {
    let (v, n) = allocations(|| Vec::<u8>::with_capacity(1));
    drop(v);
    assert_eq!(n, 1, "the control allocation was not counted");
}

#[test]
fn an_admitted_keyed_request_allocates_nothing() {
    let rt = runtime();
    let quota = Quota::per_second(1_000_000).unwrap();
    let limiter = KeyedHybridLimiter::<String, _>::builder("http-alloc", quota, MemoryStore::new())
        .lease_size(1_000)
        .runtime(rt.handle().clone())
        .build()
        .unwrap();
    // Two grants: the key exists, holds tokens, and has measured demand.
    rt.block_on(limiter.acquire("alice", 1)).unwrap();
    rt.block_on(limiter.acquire("alice", 1)).unwrap();
    assert_eq!(limiter.available("alice"), 999);
    let mut svc = LimitLayer::keyed(limiter.clone(), HeaderKey::new(API_KEY)).layer(ok());
    let requests: Vec<_> = (0..300)
        .map(|_| Request::get("/").header(API_KEY, "alice").body(()).unwrap())
        .collect();
    let (served, n) = admitted(&mut svc, requests);
    assert_eq!(served, 300, "every request was admitted at once");
    assert_eq!(n, 0, "300 admitted keyed requests allocated {n} times");
    assert_eq!(limiter.available("alice"), 699);
}

#[test]
fn an_admitted_global_request_allocates_nothing() {
    let rt = runtime();
    let quota = Quota::per_second(1_000_000).unwrap();
    let limiter = HybridLimiter::builder("http-alloc-global", quota, MemoryStore::new())
        .lease_size(1_000)
        .runtime(rt.handle().clone())
        .build()
        .unwrap();
    rt.block_on(limiter.ready()).unwrap();
    let mut svc = LimitLayer::global(limiter.clone()).layer(ok());
    let requests: Vec<_> = (0..100)
        .map(|_| Request::get("/").body(()).unwrap())
        .collect();
    let (served, n) = admitted(&mut svc, requests);
    assert_eq!(served, 100, "every request was admitted at once");
    assert_eq!(n, 0, "100 admitted global requests allocated {n} times");
}
