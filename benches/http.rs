//! HTTP throughput under `wrk`: ratelease's `LimitLayer` beside tower_governor and beside no
//! limiter at all, in one run, on one axum server process.
//!
//! ```text
//! apt-get install -y wrk redis-server
//! cargo bench --bench http --features axum
//! HTTP_BENCH_SECS=5 HTTP_BENCH_ROUNDS=15 HTTP_BENCH_CONNECTIONS=64 cargo bench --bench http --features axum
//! ```
//!
//! One process serves five routers on five loopback ports, on a one-worker tokio runtime
//! (`wrk` gets the other core of a two-core machine):
//!
//! - **baseline**: the handler alone;
//! - **ratelease keyed**: `LimitLayer::keyed(KeyedHybridLimiter, PeerIp)` leasing from a
//!   `redis-server` started for the run — a fleet-wide limit per client address;
//! - **ratelease global**: `LimitLayer::global(HybridLimiter)` on the same Redis;
//! - **ratelease keyed, queue 50 ms**: the same with `.queue(50 ms)`, which is what
//!   `KeyedRateLimitLayer`'s single `max_wait` (default 50 ms) used to do: over-limit requests
//!   wait for the next token (issue 14, item 1);
//! - **tower_governor**: `GovernorLayer` keyed by peer IP (`PeerIpKeyExtractor`), a limit
//!   of this process only.
//!
//! Two scenarios, each target measured once per round for `HTTP_BENCH_ROUNDS` rounds (each
//! round starting with the next server, so none always runs first). Reported: each server's
//! median round, and its median ratio to the baseline *within a round* (with the lowest and
//! highest), which cancels load that drifts between rounds on a shared machine; and the
//! server process's median CPU time per request (with its difference to the baseline's),
//! which competing load hardly moves:
//!
//! - **under the limit** (10 M/s): what the layer costs an admitted request;
//! - **over the limit** (1 000/s for the one client `wrk` is): what shedding costs, and that
//!   the limit holds (admitted/s from `wrk`'s non-2xx count).
//!
//! First, in process (no network, no `wrk` needed): each layer's cost per admitted request
//! under the 10 M/s limit, and per refused request over the 1 000/s one (a 429 reads the quota
//! in force for its `RateLimit-Policy` header), by difference with the bare handler, called
//! and polled in place — the numbers the HTTP runs below are too noisy to resolve on a shared
//! machine.
//!
//! Under `cargo test --all-targets` (no `--bench` argument) it starts the servers, checks one
//! 200 and one 429 from each limiter over HTTP, and skips `wrk`. Without `redis-server` it
//! says so and exits successfully: benchmarks are optional tooling.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use ratelease::http::{LimitLayer, PeerIp};
use ratelease::{HybridLimiter, KeyedHybridLimiter, Quota, RedisStore};
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::GovernorLayer;

#[path = "../tests/support/mod.rs"]
mod support;

#[path = "../tests/support/http_client.rs"]
mod http_client;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A limit: `rate` per second with a burst of `burst`.
#[derive(Clone, Copy)]
struct Limit {
    name: &'static str,
    rate: u64,
    burst: u64,
}

const UNDER: Limit = Limit {
    name: "under the limit (10 M/s)",
    rate: 10_000_000,
    burst: 1_000_000,
};
const OVER: Limit = Limit {
    name: "over the limit (1 000/s, one client)",
    rate: 1_000,
    burst: 1_000,
};

async fn hello() -> &'static str {
    "hello\n"
}

/// The routers for `limit`, named; the baseline first.
async fn routers(
    limit: Limit,
    redis: &str,
    tag: &str,
) -> Result<Vec<(&'static str, Router)>, BoxError> {
    let quota = Quota::per_second(limit.rate)?.with_burst(limit.burst)?;
    let store = RedisStore::builder(redis).connect().await?;
    let keyed = KeyedHybridLimiter::new(format!("bench-keyed-{tag}"), quota, store.clone())?;
    let queued = KeyedHybridLimiter::new(format!("bench-queued-{tag}"), quota, store.clone())?;
    let global = HybridLimiter::new(format!("bench-global-{tag}"), quota, store)?;
    global.ready().await?;
    let period = Duration::from_nanos(1_000_000_000 / limit.rate);
    let governor = GovernorConfigBuilder::default()
        .period(period)
        .burst_size(u32::try_from(limit.burst)?)
        .finish()
        .ok_or("tower_governor config")?;
    let base = || Router::new().route("/", get(hello));
    Ok(vec![
        ("baseline (no limiter)", base()),
        (
            "ratelease keyed (PeerIp, Redis)",
            base().layer(LimitLayer::keyed(keyed, PeerIp::new())),
        ),
        (
            "ratelease global (Redis)",
            base().layer(LimitLayer::global(global)),
        ),
        (
            "ratelease keyed, queue 50 ms (the old max_wait)",
            base().layer(LimitLayer::keyed(queued, PeerIp::new()).queue(Duration::from_millis(50))),
        ),
        (
            "tower_governor keyed (peer IP)",
            base().layer(GovernorLayer::new(governor)),
        ),
    ])
}

/// Serves `router` on a free loopback port (with the peer address in `ConnectInfo`).
async fn serve(router: Router) -> Result<SocketAddr, BoxError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        let app = router.into_make_service_with_connect_info::<SocketAddr>();
        let _ = axum::serve(listener, app).await;
    });
    Ok(addr)
}

/// One `wrk` run's numbers.
#[derive(Debug, Clone, Copy, Default)]
struct Run {
    rps: f64,
    admitted_rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// This process's CPU time per request (all threads: the server's worker, the limiters'
    /// tasks, the Redis client; not `redis-server`), µs. Unlike req/s, it hardly moves when
    /// other processes compete for the cores.
    cpu_us: f64,
}

/// CPU time of this process so far, ns: the sum over its threads (`/proc/self/task/*/
/// schedstat`, Linux); `None` elsewhere.
fn cpu_ns() -> Option<u64> {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        total += stat.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// `1.23ms`, `456.00us`, `1.10s` in milliseconds.
fn millis(s: &str) -> Option<f64> {
    let (num, scale) = if let Some(n) = s.strip_suffix("us") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1e3)
    } else {
        return None;
    };
    num.parse::<f64>().ok().map(|v| v * scale)
}

fn wrk(addr: SocketAddr, secs: u64, connections: u32) -> Result<Run, BoxError> {
    let cpu_before = cpu_ns();
    let out = Command::new("wrk")
        .args([
            "-t1",
            &format!("-c{connections}"),
            &format!("-d{secs}s"),
            "--latency",
        ])
        .arg(format!("http://{addr}/"))
        .output()?;
    if !out.status.success() {
        return Err(format!("wrk failed: {}", String::from_utf8_lossy(&out.stderr)).into());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut run = Run::default();
    let mut total = 0.0;
    let mut non_2xx = 0.0;
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["Requests/sec:", n] => run.rps = n.parse()?,
            ["50%", t] => run.p50_ms = millis(t).unwrap_or(f64::NAN),
            ["99%", t] => run.p99_ms = millis(t).unwrap_or(f64::NAN),
            ["Non-2xx", "or", "3xx", "responses:", n] => non_2xx = n.parse()?,
            [n, "requests", "in", ..] => total = n.parse()?,
            _ => {}
        }
    }
    run.admitted_rps = run.rps * (total - non_2xx) / total.max(1.0);
    run.cpu_us = match (cpu_before, cpu_ns()) {
        (Some(before), Some(after)) => (after - before) as f64 / 1e3 / total.max(1.0),
        _ => f64::NAN,
    };
    Ok(run)
}

fn median(mut runs: Vec<Run>) -> Run {
    runs.sort_by(|a, b| a.rps.total_cmp(&b.rps));
    runs[runs.len() / 2]
}

/// The median of `values`, and their smallest and largest.
fn spread(mut values: Vec<f64>) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    (
        values[values.len() / 2],
        values[0],
        values[values.len() - 1],
    )
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Requests as the server hands them to the layers: from 127.0.0.1, with axum's `ConnectInfo`.
fn requests(n: usize) -> Vec<axum::extract::Request> {
    let peer: SocketAddr = "127.0.0.1:40000".parse().expect("an address");
    (0..n)
        .map(|_| {
            let mut request = axum::extract::Request::new(axum::body::Body::empty());
            request
                .extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            request
        })
        .collect()
}

/// Nanoseconds per request through `svc`, called and polled in place on this thread (no
/// network, no scheduler): the layer's own cost, by difference with the bare handler; and the
/// share of requests answered 2xx on the first poll (the rest waited for a lease: calls
/// made this fast outrun a keyed limiter's refills now and then).
fn ns_per_call<S>(mut svc: S, n: usize) -> (f64, f64)
where
    S: tower::Service<axum::extract::Request, Response = axum::response::Response>,
{
    use std::future::Future;
    use std::task::{Context, Poll, Waker};
    let mut cx = Context::from_waker(Waker::noop());
    let batch = requests(n);
    let start = std::time::Instant::now();
    let mut ok = 0usize;
    for request in batch {
        if let Poll::Ready(Ok(())) = svc.poll_ready(&mut cx) {
            let mut response = std::pin::pin!(svc.call(request));
            if let Poll::Ready(Ok(r)) = response.as_mut().poll(&mut cx) {
                ok += usize::from(r.status().is_success());
            }
        }
    }
    let ns = start.elapsed().as_nanos() as f64 / n as f64;
    (ns, ok as f64 / n as f64)
}

/// The layers' cost per request, in process: the median of `rounds` runs of 200 000
/// requests each, per layer, under `limit`: under the 10 M/s limit, per admitted request;
/// over the 1 000/s one (nearly every request refused: a 429 with its headers), per refusal.
async fn layer_costs(redis: &str, limit: Limit, rounds: usize) -> Result<(), BoxError> {
    use tower::Layer;
    let quota = Quota::per_second(limit.rate)?.with_burst(limit.burst)?;
    let store = RedisStore::builder(redis).connect().await?;
    let tag = limit.rate;
    let keyed = KeyedHybridLimiter::new(format!("bench-cost-keyed-{tag}"), quota, store.clone())?;
    let global = HybridLimiter::new(format!("bench-cost-global-{tag}"), quota, store)?;
    global.ready().await?;
    let governor = GovernorConfigBuilder::default()
        .period(Duration::from_nanos(1_000_000_000 / limit.rate))
        .burst_size(u32::try_from(limit.burst)?)
        .finish()
        .ok_or("tower_governor config")?;
    let handler = || {
        tower::service_fn(|_: axum::extract::Request| async {
            Ok::<_, std::convert::Infallible>(axum::response::Response::new(
                axum::body::Body::empty(),
            ))
        })
    };
    let keyed_layer = LimitLayer::keyed(keyed.clone(), PeerIp::new());
    let global_layer = LimitLayer::global(global);
    let governor_layer = GovernorLayer::new(governor);
    // A first pass warms the keyed limiter's key up (its first leases are exact); over the
    // limit, it and a pass of each other layer spend their bursts.
    ns_per_call(keyed_layer.layer(handler()), 200_000);
    ns_per_call(global_layer.layer(handler()), 200_000);
    ns_per_call(governor_layer.layer(handler()), 200_000);
    let n = 200_000;
    let mut costs: Vec<(&str, Vec<(f64, f64)>)> = vec![
        ("bare handler", vec![]),
        ("ratelease keyed (PeerIp)", vec![]),
        ("ratelease global", vec![]),
        ("tower_governor keyed (peer IP)", vec![]),
    ];
    for _ in 0..rounds {
        costs[0].1.push(ns_per_call(handler(), n));
        costs[1]
            .1
            .push(ns_per_call(keyed_layer.layer(handler()), n));
        costs[2]
            .1
            .push(ns_per_call(global_layer.layer(handler()), n));
        costs[3]
            .1
            .push(ns_per_call(governor_layer.layer(handler()), n));
        // Let the limiters' tasks run their refills between passes.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for (name, runs) in &costs[1..] {
        let admitted = spread(runs.iter().map(|c| c.1).collect()).0;
        let expected = if limit.rate == UNDER.rate {
            admitted > 0.0
        } else {
            admitted < 0.05
        };
        assert!(expected, "{name}: {admitted} admitted under {}", limit.name);
    }
    println!(
        "\nin process, {}, per request (median of {rounds} x {n}):\n",
        limit.name
    );
    println!("| layer | ns/request | layer's own cost | admitted on first poll |");
    println!("| --- | ---: | ---: | ---: |");
    let bare = spread(costs[0].1.iter().map(|c| c.0).collect()).0;
    for (name, runs) in costs {
        let ns = spread(runs.iter().map(|c| c.0).collect()).0;
        let at_once = spread(runs.iter().map(|c| c.1).collect()).0;
        println!(
            "| {name} | {ns:.0} | {:+.0} ns | {:.3} % |",
            ns - bare,
            at_once * 100.0
        );
    }
    Ok(())
}

/// The smoke run: every limiter admits, then (over the limit) refuses, over real HTTP.
async fn smoke(redis: &str) -> Result<(), BoxError> {
    let tiny = Limit {
        name: "smoke",
        rate: 1,
        burst: 1,
    };
    for (name, router) in routers(tiny, redis, "smoke").await? {
        let addr = serve(router).await?;
        let first = http_client::get(addr, "/", &[]).await?.status;
        let second = http_client::get(addr, "/", &[]).await?.status;
        let expected = if name.starts_with("baseline") {
            200
        } else {
            429
        };
        assert_eq!((first, second), (200, expected), "{name}");
    }
    println!("http bench smoke run: ok (run with `cargo bench --bench http --features axum`)");
    Ok(())
}

fn main() -> Result<(), BoxError> {
    if Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        println!("redis-server not found: skipping the HTTP benchmark");
        return Ok(());
    }
    let redis = support::RedisServer::start();
    let url = redis.url();
    // The servers: one worker thread, so `wrk` has the other core.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    if !std::env::args().any(|a| a == "--bench") {
        return runtime.block_on(smoke(&url));
    }
    for limit in [UNDER, OVER] {
        runtime.block_on(layer_costs(&url, limit, 9))?;
    }
    if Command::new("wrk").arg("--version").output().is_err() {
        println!("wrk not found (apt-get install -y wrk): skipping the HTTP runs");
        return Ok(());
    }
    let secs = env("HTTP_BENCH_SECS", 2);
    let rounds = env("HTTP_BENCH_ROUNDS", 9).max(1);
    let connections = env("HTTP_BENCH_CONNECTIONS", 64) as u32;
    println!(
        "wrk -t1 -c{connections} -d{secs}s per server and round, {rounds} rounds; server: one tokio worker"
    );
    for limit in [UNDER, OVER] {
        let servers = runtime.block_on(async {
            let mut servers = Vec::new();
            for (name, router) in routers(limit, &url, &limit.rate.to_string()).await? {
                servers.push((name, serve(router).await?));
            }
            Ok::<_, BoxError>(servers)
        })?;
        // Each round measures every server once, starting from a different one each round;
        // a server's ratio to the baseline is taken within the round, so load that drifts
        // between rounds (a shared machine) cancels out of it.
        let n = servers.len();
        let mut runs = vec![Vec::new(); n];
        let mut ratios = vec![Vec::new(); n];
        let mut cpu = vec![Vec::new(); n];
        for round in 0..rounds as usize {
            let mut this = vec![Run::default(); n];
            for k in 0..n {
                let i = (round + k) % n;
                this[i] = wrk(servers[i].1, secs, connections)?;
            }
            for i in 0..n {
                ratios[i].push(this[i].rps / this[0].rps);
                cpu[i].push(this[i].cpu_us);
                runs[i].push(this[i]);
            }
        }
        println!("\n{}:\n", limit.name);
        println!(
            "| server | req/s | 2xx/s | p50 | p99 | req/s vs baseline, paired (range) | CPU µs/request |"
        );
        println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
        let base_cpu = spread(cpu[0].clone()).0;
        for ((((name, _), runs), ratios), cpu) in servers.iter().zip(runs).zip(ratios).zip(cpu) {
            let run = median(runs);
            let (ratio, low, high) = spread(ratios);
            let (cpu, _, _) = spread(cpu);
            println!(
                "| {name} | {:.0} | {:.0} | {:.2} ms | {:.2} ms | {ratio:.2}x ({low:.2}-{high:.2}) | {cpu:.1} ({:+.1}) |",
                run.rps,
                run.admitted_rps,
                run.p50_ms,
                run.p99_ms,
                cpu - base_cpu
            );
        }
    }
    Ok(())
}
