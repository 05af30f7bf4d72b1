//! A real fleet: eight OS processes, each with its own `HybridLimiter` and Redis connection,
//! share one limit on one redis-server under uneven (Zipf) demand. What they admitted is
//! counted from outside the limiter — each process reports the wall-clock time of every request
//! it let through and every one it turned away — and checked against the bound of one shared
//! token bucket, for utilization and for fairness.
//!
//! The processes are this test binary run again with [`CHILD`] set, executing the ignored test
//! [`fleet_process`] alone (the usual way to spawn a copy of a test without a second binary).
//! The fleet runs twice: with the default token leases, and with rate leases
//! (`AdaptiveLease::rate_leases`), which must keep the same bound with far fewer store calls.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ratelease::{AdaptiveLease, HybridLimiter, Quota, RedisStore};
use support::{max_in_window, RedisServer};

/// Set in a child: `url node rps duration_ms start_unix_us rate_leases`.
const CHILD: &str = "RATELEASE_FLEET_CHILD";
const NODES: usize = 8;
const RATE: u64 = 2_000;
const BURST: u64 = 400;
const DEMAND_RPS: f64 = 4_000.0;
const DURATION: Duration = Duration::from_secs(3);

fn unix_us() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros(),
    )
    .unwrap()
}

/// One process of the fleet (run only as a child, see the module docs): Poisson requests at
/// its rate from the shared start instant for the duration, one line per request on stdout,
/// `A <unix µs>` admitted or `D <unix µs>` denied, then `S <store calls> <tokens dripped>`.
#[test]
#[ignore = "a child process of eight_processes_share_one_limit"]
fn fleet_process() {
    let spec = std::env::var(CHILD).expect("run by eight_processes_share_one_limit");
    let f: Vec<&str> = spec.split(' ').collect();
    let (url, node) = (f[0].to_owned(), f[1].parse::<u64>().unwrap());
    let rps: f64 = f[2].parse().unwrap();
    let duration = Duration::from_millis(f[3].parse().unwrap());
    let start: u64 = f[4].parse().unwrap();
    let rate_leases = f[5] == "true";
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let store = RedisStore::builder(url)
            .response_timeout(Duration::from_secs(1))
            .connect()
            .await
            .unwrap();
        let quota = Quota::per_second(RATE).unwrap().with_burst(BURST).unwrap();
        let limiter = HybridLimiter::builder("os-fleet", quota, store)
            .policy(AdaptiveLease::new().rate_leases(rate_leases))
            .node_id(node)
            .seed(node)
            .build()
            .unwrap();
        limiter.ready().await.unwrap();
        let mut rng = fastrand::Rng::with_seed(node);
        let mut lines = String::new();
        // Everyone starts at the same wall-clock instant.
        while unix_us() < start {
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        let end = start + u64::try_from(duration.as_micros()).unwrap();
        let mut next = start as f64;
        loop {
            next += -(rng.f64().max(1e-12)).ln() * 1e6 / rps;
            let now = unix_us();
            if next > now as f64 {
                tokio::time::sleep(Duration::from_micros(next as u64 - now)).await;
            }
            if next >= end as f64 {
                break;
            }
            let verdict = if limiter.try_acquire(1).unwrap().is_allowed() {
                'A'
            } else {
                'D'
            };
            lines.push_str(&format!("{verdict} {}\n", unix_us()));
        }
        let stats = limiter.stats();
        lines.push_str(&format!(
            "S {} {}\n",
            stats.leases + stats.releases,
            stats.tokens_dripped
        ));
        limiter.shutdown().await;
        print!("{lines}");
    });
}

#[test]
fn eight_processes_share_one_limit() {
    let tokens = fleet(false);
    let rates = fleet(true);
    // Rate leases: the same bound (checked in `fleet`), a good part of the tokens by drip
    // (61–66 % in runs on an idle machine), far fewer calls (122–166 against 471–501), and
    // as fair (Jain 0.989–0.998 in 18 runs; 0.948 before a young rate was renewed soon).
    assert!(
        rates.dripped * 3 > rates.admitted,
        "{} of {} admitted tokens came by drip",
        rates.dripped,
        rates.admitted
    );
    assert!(
        rates.calls * 2 < tokens.calls,
        "{} store calls with rate leases, {} with token leases",
        rates.calls,
        tokens.calls
    );
}

/// What one run of the fleet did.
struct Fleet {
    admitted: u64,
    calls: u64,
    dripped: u64,
}

/// Runs the eight processes (with rate leases or not) and checks the bound, utilization and
/// fairness, counted from outside the limiters.
fn fleet(rate_leases: bool) -> Fleet {
    let server = RedisServer::start();
    // Zipf(1.0) over the eight processes: the first gets ~37 % of the demand, the last ~5 %.
    let weights: Vec<f64> = (1..=NODES).map(|k| 1.0 / k as f64).collect();
    let total: f64 = weights.iter().sum();
    let start = unix_us() + 1_500_000;
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = weights
        .iter()
        .enumerate()
        .map(|(node, w)| {
            let spec = format!(
                "{} {node} {} {} {start} {rate_leases}",
                server.url(),
                DEMAND_RPS * w / total,
                DURATION.as_millis()
            );
            Command::new(&exe)
                .args(["--exact", "fleet_process", "--ignored", "--nocapture", "-q"])
                .env(CHILD, spec)
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut admitted: Vec<(u64, u64)> = Vec::new();
    let mut per_node = Vec::new();
    let (mut calls, mut dripped) = (0u64, 0u64);
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "a fleet process failed");
        let text = String::from_utf8(out.stdout).unwrap();
        let (mut yes, mut all) = (0u64, 0u64);
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("S ") {
                let (c, d) = rest.split_once(' ').unwrap();
                calls += c.parse::<u64>().unwrap();
                dripped += d.parse::<u64>().unwrap();
                continue;
            }
            let (verdict, t) = match line.split_once(' ') {
                Some((v @ ("A" | "D"), t)) => (v, t.parse::<u64>().unwrap()),
                _ => continue, // the test harness's own lines
            };
            all += 1;
            if verdict == "A" {
                yes += 1;
                admitted.push((t, 1));
            }
        }
        assert!(all > 0, "a process reported no request:\n{text}");
        per_node.push((yes, all));
    }
    admitted.sort_unstable();
    let demand: u64 = per_node.iter().map(|&(_, all)| all).sum();
    let total_admitted = admitted.len() as u64;
    eprintln!("per process (admitted, requests): {per_node:?}");

    // The bound of one shared bucket, in any one-second window of the processes' own clocks
    // (one machine, one clock). Admission times are taken just after each decision, so a
    // window can catch a few tokens late: allow 1 %.
    let worst = max_in_window(&admitted, 1_000_000);
    let bound = BURST + RATE;
    assert!(
        worst as f64 <= bound as f64 * 1.01,
        "{worst} admitted in one second, bound {bound}"
    );
    // Utilization against what one bucket would have admitted over the run (the processes
    // started cold a moment before, but `ready` gave each its first lease).
    let possible = (demand as f64).min(BURST as f64 + RATE as f64 * DURATION.as_secs_f64());
    let utilization = total_admitted as f64 / possible;
    assert!(
        utilization >= 0.9,
        "utilization {utilization:.3}: {total_admitted} of {possible}"
    );
    // Every process is served in about the same proportion (Jain's index of acceptance).
    let ratios: Vec<f64> = per_node
        .iter()
        .map(|&(yes, all)| yes as f64 / all as f64)
        .collect();
    let sum: f64 = ratios.iter().sum();
    let squares: f64 = ratios.iter().map(|r| r * r).sum();
    let jain = sum * sum / (ratios.len() as f64 * squares);
    assert!(jain >= 0.95, "Jain {jain:.4} over {ratios:?}");
    // Contention really happened: demand was well above the limit.
    assert!(
        demand as f64 > 1.5 * possible,
        "demand {demand} vs {possible}"
    );
    eprintln!(
        "rate leases {rate_leases}: admitted {total_admitted} of {demand} (possible {possible}), \
         utilization {utilization:.3}, worst second {worst} (bound {bound}), Jain {jain:.4}, \
         {calls} store calls, {dripped} tokens dripped"
    );
    Fleet {
        admitted: total_admitted,
        calls,
        dripped,
    }
}
