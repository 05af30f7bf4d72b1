//! Rate leases end to end: hybrid limiters on one store, on virtual time, under a tight burst
//! (2 000/s, burst 100) and uneven demand at twice the limit. With rate leases on, the fleet
//! keeps the bound `burst + rate × W` in every window, admits nearly its whole budget, and
//! makes a small fraction of the store calls token leases alone need. A rated node whose quota
//! changes renews its lease before it expires.

mod wrapped;

use std::sync::atomic::Ordering;
use std::time::Duration;

use ratelease::{AdaptiveLease, ConfigStore, HybridLimiter, MemoryStore, Quota, TokioClock};
use wrapped::Wrapped;

/// One run: per-millisecond admissions of the whole fleet, and store calls made.
struct Run {
    admitted: Vec<u64>,
    calls: u64,
    dripped: u64,
    rated_nodes: usize,
}

/// `n` limiters of one name on one in-memory store on tokio's clock, under a tight burst
/// (2 000/s, burst 100), with rate leases on or off.
fn tight_fleet(name: &str, n: u64, rate_leases: bool) -> Vec<HybridLimiter<MemoryStore>> {
    let store = MemoryStore::with_clock(TokioClock::new());
    let quota = Quota::with_parts(2_000, Duration::from_secs(1), 100).unwrap();
    (0..n)
        .map(|i| {
            HybridLimiter::builder(name, quota, store.clone())
                .policy(AdaptiveLease::new().rate_leases(rate_leases))
                .seed(i)
                .build()
                .unwrap()
        })
        .collect()
}

async fn run(rate_leases: bool) -> Run {
    let nodes = tight_fleet("rate-leases", 6, rate_leases);
    // Zipf-like demand, 4 000/s in all, with Poisson arrivals (a fixed-seed generator).
    let weights: Vec<f64> = (1..=nodes.len()).map(|k| 1.0 / k as f64).collect();
    let total: f64 = weights.iter().sum();
    let per_ms: Vec<f64> = weights.iter().map(|w| w / total * 4.0).collect();
    let mut seed = 7u64;
    let mut uniform = move || {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut next: Vec<f64> = vec![0.0; nodes.len()];
    let mut admitted = Vec::new();
    for ms in 0..8_000u64 {
        let mut now = 0;
        for (i, limiter) in nodes.iter().enumerate() {
            while next[i] <= ms as f64 {
                next[i] += -(1.0 - uniform()).ln() / per_ms[i];
                if limiter.try_acquire(1).unwrap().is_allowed() {
                    now += 1;
                }
            }
        }
        admitted.push(now);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let stats: Vec<_> = nodes.iter().map(|l| l.stats()).collect();
    Run {
        admitted,
        calls: stats.iter().map(|s| s.leases + s.releases).sum(),
        dripped: stats.iter().map(|s| s.tokens_dripped).sum(),
        rated_nodes: stats.iter().filter(|s| s.rate_mtps > 0).count(),
    }
}

/// Every window of whole milliseconds: at most burst + rate × W (one extra millisecond of
/// rate, since a window of n buckets spans up to n ms).
fn assert_bound(admitted: &[u64]) {
    let mut prefix = vec![0u64];
    for a in admitted {
        prefix.push(prefix.last().unwrap() + a);
    }
    for width in [1usize, 5, 20, 100, 1_000] {
        for start in 0..=admitted.len() - width {
            let n = prefix[start + width] - prefix[start];
            let bound = 100 + 2 * width as u64;
            assert!(
                n <= bound,
                "{n} admitted in {width} ms from {start} ms (bound {bound})"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn rate_leases_keep_the_bound_with_few_store_calls() {
    let with = run(true).await;
    let without = run(false).await;
    assert_bound(&with.admitted);
    assert_bound(&without.admitted);
    // Rate leases were really used: every node held one at the end, and most tokens came by
    // drip.
    assert_eq!(with.rated_nodes, 6, "every node holds a rate");
    let admitted: u64 = with.admitted.iter().sum();
    assert!(
        with.dripped > admitted / 2,
        "{} dripped of {admitted}",
        with.dripped
    );
    // Nearly the whole budget (100 + 2 000 × 8 s), with a fraction of the calls.
    let budget = 100 + 2_000 * 8;
    assert!(
        admitted as f64 >= 0.93 * budget as f64,
        "admitted {admitted} of {budget}"
    );
    assert!(
        with.calls * 4 < without.calls,
        "{} store calls with rate leases, {} without",
        with.calls,
        without.calls
    );
}

#[tokio::test(start_paused = true)]
async fn a_rated_node_renews_before_its_lease_expires_when_the_quota_changes() {
    // A tight burst (a rate lease by default, 1 s ttl) becomes a loose one (a second of the
    // rate: token leases, a longer ttl, whose half lies past the rated lease's local expiry).
    // The node must renew before that expiry, not give its lease back at it and leave.
    let store = Wrapped::new(Duration::ZERO);
    let tight = Quota::with_parts(2_000, Duration::from_secs(1), 100).unwrap();
    let loose = Quota::with_parts(2_000, Duration::from_secs(1), 2_000).unwrap();
    store.inner.init_config("q", &tight).await.unwrap();
    let fleet: Vec<_> = (0..3)
        .map(|i| {
            HybridLimiter::builder("q", tight, store.clone())
                .seed(i)
                .build()
                .unwrap()
        })
        .collect();
    // 3 000/s of demand in all, for `ms` milliseconds.
    let busy = |ms: u64| {
        let fleet = fleet.clone();
        async move {
            for _ in 0..ms {
                for limiter in &fleet {
                    let _ = limiter.try_acquire(1);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    };
    busy(2_000).await;
    let rated = fleet.iter().filter(|l| l.stats().rate_mtps > 0).count();
    assert!(rated > 0, "no node holds a rate");
    store.inner.modify_config("q", &loose).await.unwrap();
    busy(4_000).await;
    for limiter in &fleet {
        assert_eq!(limiter.quota(), loose);
    }
    assert_eq!(
        store.leaving.load(Ordering::SeqCst),
        0,
        "leases given back at expiry"
    );
}

/// When the quiet node's rate ended (ms after its last request), its lease calls and releases
/// by then, and the share the store told it then, millitokens a second.
struct Ended {
    after: u64,
    leases: u64,
    releases: u64,
    share_mtps: u64,
}

/// Two nodes under a tight burst with rate leases; the first is asked `quiet_per_s` times a
/// second, the second 1 500, for three seconds; then the first stops. Returns when the first's
/// rate ended, after checking that both held rates, that the busy node's rate never ended,
/// and that it grew once the quiet node's was free.
async fn quiet_node(quiet_per_s: u64) -> Ended {
    let fleet = tight_fleet("quiet", 2, true);
    let (quiet, busy) = (&fleet[0], &fleet[1]);
    // Requests in millisecond `ms`: 1 500/s for the busy node (two in odd milliseconds, one in
    // even ones), `quiet_per_s` spread evenly for the other.
    let busy_at = |ms: u64| 1 + ms % 2;
    let quiet_at = |ms: u64| (ms + 1) * quiet_per_s / 1_000 - ms * quiet_per_s / 1_000;
    let mut busy_rated_since = None;
    for ms in 0..3_000u64 {
        for _ in 0..quiet_at(ms) {
            let _ = quiet.try_acquire(1);
        }
        for _ in 0..busy_at(ms) {
            let _ = busy.try_acquire(1);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        if busy.stats().rate_mtps > 0 {
            busy_rated_since.get_or_insert(ms);
        } else if let Some(since) = busy_rated_since {
            panic!("the busy node's rate ended at {ms} ms (held since {since} ms)");
        }
    }
    assert!(
        quiet.stats().rate_mtps > 0,
        "the node to go quiet holds no rate"
    );
    let busy_rate = busy.stats().rate_mtps;
    let (leases, releases) = (quiet.stats().leases, quiet.stats().releases);
    let mut ended = None;
    for ms in 0..1_000u64 {
        for _ in 0..busy_at(ms) {
            let _ = busy.try_acquire(1);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        let q = quiet.stats();
        if q.rate_mtps == 0 && ended.is_none() {
            ended = Some(Ended {
                after: ms,
                leases: q.leases - leases,
                releases: q.releases - releases,
                share_mtps: q.share_mtps,
            });
        }
        assert!(
            busy.stats().rate_mtps > 0,
            "the busy node's rate ended at {ms} ms"
        );
    }
    let ended = ended.expect("the quiet node's rate never ended");
    // What the quiet node held is the busy node's to take: its rate grew at a renewal.
    assert!(
        busy.stats().rate_mtps > busy_rate,
        "the busy node's rate stayed at {busy_rate} mtps"
    );
    ended
}

#[tokio::test(start_paused = true)]
async fn a_node_that_goes_quiet_ends_its_rate_at_once_and_a_busy_one_keeps_it() {
    // A node asked 1 500 times a second stops: the rate it held is refill the fleet could
    // spend. It must end within a tenth of a second (twenty expected gaps, at least a review),
    // by one lease call, not decay renewal by renewal as the demand estimate falls.
    let ended = quiet_node(1_500).await;
    assert!(
        ended.after < 100,
        "the quiet node's rate ended {} ms after its last request",
        ended.after
    );
    assert_eq!(
        (ended.leases, ended.releases),
        (1, 0),
        "calls that ended it"
    );
    // That call reported no demand (the burst is tight): the store shares the rate by
    // reported demand, and a quiet node's decaying estimate would keep half of it from the
    // busy node until the quiet one gives its tokens back.
    assert_eq!(
        ended.share_mtps, 0,
        "the quiet node's share once its rate ended"
    );
}

#[tokio::test(start_paused = true)]
async fn a_slower_node_that_goes_quiet_waits_twenty_gaps_before_its_rate_ends() {
    // At 100 requests a second twenty expected gaps are 200 ms, which the node must wait
    // out as its estimate was when its demand stopped (the estimate itself decays meanwhile,
    // and would stretch the wait past the idle give-back at 500 ms).
    let ended = quiet_node(100).await;
    assert!(
        (150..400).contains(&ended.after),
        "the quiet node's rate ended {} ms after its last request",
        ended.after
    );
    // (Its estimate halves within those 200 ms, which renews the rate smaller first.)
    assert!(
        ended.leases <= 2,
        "{} lease calls before its rate ended",
        ended.leases
    );
}

#[tokio::test(start_paused = true)]
async fn a_node_back_from_quiet_reports_its_new_demand_not_its_busy_one() {
    // Two nodes asked 1 500 times a second each, under a tight burst; the first stops, its
    // rate ends (it went quiet), and 50 ms later it is asked 200 times a second. Its estimate
    // of the busy spell (a 300 ms time constant) would still read several hundred a second
    // more, and the store shares the rate by reported demand: a rate it cannot use, held
    // from the busy node. What it reports is its demand since it went quiet.
    let fleet = tight_fleet("back-from-quiet", 2, true);
    let (quiet, busy) = (&fleet[0], &fleet[1]);
    let busy_at = |ms: u64| 1 + ms % 2;
    for ms in 0..3_000u64 {
        for _ in 0..busy_at(ms) {
            let _ = quiet.try_acquire(1);
            let _ = busy.try_acquire(1);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert!(
        quiet.stats().rate_mtps > 0,
        "the node to go quiet holds no rate"
    );
    let mut ended = None;
    for ms in 0..600u64 {
        for _ in 0..busy_at(ms) {
            let _ = busy.try_acquire(1);
        }
        match ended {
            None if quiet.stats().rate_mtps == 0 => ended = Some((ms, quiet.stats().leases)),
            Some((end, _)) if ms >= end + 50 && (ms - end) % 5 == 0 => {
                let _ = quiet.try_acquire(1);
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let (end, leases_then) = ended.expect("the quiet node's rate never ended");
    assert!(end < 100, "its rate ended {end} ms after its last request");
    let back = quiet.stats();
    assert!(back.leases > leases_then, "no lease since it came back");
    // Its share (by reported demand) and its rate within twice the 200 a second (with the
    // estimate of its busy spell: a share of 529 a second, and a rate of 495).
    assert!(
        back.share_mtps < 400_000 && back.rate_mtps < 400_000,
        "back from quiet at 200/s, its share is {} mtps, its rate {} mtps",
        back.share_mtps,
        back.rate_mtps
    );
}
