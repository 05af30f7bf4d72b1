//! Metrics: pure functions of a run's records.
//!
//! Definitions (the field names are those of `report.json`):
//!
//! - `demand`, `admitted`, `rejected`: requests, and how many were allowed or not (errors and
//!   undecided requests count as rejected, so `admitted + rejected = demand`).
//! - `max_window_overshoot`: the most any window of length `window_ms` admitted beyond what the
//!   bucket allows, `burst + rate × W`, floored at 0. Windows are anchored at **every** admission
//!   (the window `[t, t + W)` for each admission time `t`, two pointers over the sorted times),
//!   not just aligned buckets: the worst window always starts at some admission.
//! - `utilization`: `admitted / min(demand, burst + rate × duration)`: how much of what could
//!   have been admitted was.
//! - `first_second_admission`: the same ratio over the first second of the fleet (from the
//!   first instant any node runs): how well a fleet that starts cold admits what it may.
//! - `jain_acceptance`: Jain's fairness index `(Σx)² / (n Σx²)` over the per-node acceptance
//!   ratios `admitted_i / demand_i` (nodes without demand left out): 1 when every node is
//!   served in the same proportion, `1/n` when one node gets everything.
//! - `min_max_acceptance_ratio`: the lowest per-node acceptance ratio over the highest.
//! - `store_calls`; `store_calls_per_s_per_node_max`: the most calls one node made in any
//!   window (sliding: every window that starts at one of its calls), per second. (Until
//!   2026-11-27 the report's fixed windows: a burst of calls across a window's edge read up
//!   to half as many.)
//! - `redis_cpu`: the Redis server time of the run's calls over its duration, in cores (each
//!   call costs the measured service time of its kind when simulated; live, Redis's own
//!   `INFO commandstats` accounting).
//! - `tokens_stranded`: tokens the store granted that never served a request (held by a
//!   crashed node, or granted to a call whose reply never arrived).
//! - `latency_us`: p50 / p99 / p999 of the time a caller waited for its decision (nearest rank).
//! - `rejected_while_tokens_idle`: denials while another live node held unused tokens.
//! - `by_demand_rank`: the nodes ranked by their requests (1 = the most) in groups of ranks 1,
//!   2–3, 4–10, 11–32, 33–100, 101–316, … (each about √10 times the last): per group, the mean
//!   requests and store calls per node per second and the group's acceptance (admitted over
//!   requested) — where Jain says the fleet is unfair, this says to whom.
//! - `tokens_from_rates`: tokens the hybrid limiters' rate leases dripped into their local
//!   buckets — whether the mode leased rates (the default does by itself where the burst is
//!   tight in a small fleet), and how much.
//! - `mixed` (hybrid modes with `pure_share` only): the acceptance of the nodes deciding in
//!   pure mode and of the leasing nodes, each over its group's requests.
//! - `recovery_s` (moving hot spot only): after each move, the time until the first
//!   100 ms bin whose utilization (`admitted / min(demand, rate × bin)`) reaches 0.95; the
//!   maximum over all moves (a move never recovered from counts its whole interval).

use serde::{Deserialize, Serialize};

use crate::demand::hot_moves;
use crate::record::{CallRecord, Outcome, RunLog};
use crate::scenario::{s_to_ns, Scenario};

/// Bin length of the recovery metric.
pub const RECOVERY_BIN_NS: u64 = 100_000_000;
/// Utilization a bin must reach to count as recovered.
pub const RECOVERY_TARGET: f64 = 0.95;

/// Jain's fairness index of `xs`; 1 for an empty or all-zero input (nothing to be unfair about).
pub fn jain(xs: &[f64]) -> f64 {
    let sum: f64 = xs.iter().sum();
    let sq: f64 = xs.iter().map(|x| x * x).sum();
    if xs.is_empty() || sq == 0.0 {
        return 1.0;
    }
    sum * sum / (xs.len() as f64 * sq)
}

/// `min / max` of `xs`; 1 for an empty or all-zero input.
pub fn min_max_ratio(xs: &[f64]) -> f64 {
    let max = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let min = xs.iter().copied().fold(f64::INFINITY, f64::min);
    if xs.is_empty() || max <= 0.0 {
        return 1.0;
    }
    min / max
}

/// The most admissions in any window `[t, t + window_ns)` anchored at an admission time `t`,
/// beyond `allowed`, floored at 0. `sorted_ns` must be sorted.
pub fn max_window_overshoot(sorted_ns: &[u64], window_ns: u64, allowed: f64) -> u64 {
    // A whole count exceeds `allowed` exactly when it exceeds its floor.
    max_in_window(sorted_ns, window_ns).saturating_sub(allowed.floor() as u64)
}

/// The most of `sorted_ns` in any half-open window of `window_ns`: the windows that start at
/// one of them are the ones to look at (any other holds no more than the one starting at its
/// first time).
pub fn max_in_window(sorted_ns: &[u64], window_ns: u64) -> u64 {
    debug_assert!(sorted_ns.is_sorted());
    let mut most = 0;
    let mut j = 0;
    for (i, &t) in sorted_ns.iter().enumerate() {
        let end = t.saturating_add(window_ns);
        while j < sorted_ns.len() && sorted_ns[j] < end {
            j += 1;
        }
        most = most.max(j - i);
    }
    most as u64
}

/// The most store calls one node made in any window of `window_ns` (see [`max_in_window`]).
fn peak_node_calls(nodes: usize, calls: &[CallRecord], window_ns: u64) -> u64 {
    let mut times: Vec<Vec<u64>> = vec![Vec::new(); nodes];
    for c in calls {
        times[c.node as usize].push(c.t_ns);
    }
    times
        .iter_mut()
        .map(|t| {
            t.sort_unstable();
            max_in_window(t, window_ns)
        })
        .max()
        .unwrap_or(0)
}

/// `admitted / min(demand, allowed)`; 1 when there was nothing to admit.
pub fn utilization(admitted: u64, demand: u64, allowed: f64) -> f64 {
    let possible = (demand as f64).min(allowed);
    if possible <= 0.0 {
        return 1.0;
    }
    admitted as f64 / possible
}

/// The `q`-quantile of `sorted` by nearest rank (0 for an empty input).
pub fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Recovery after each move (see the module docs). `admitted` and `demand` are per bin of
/// `bin_s` seconds; `per_bin` is `rate × bin_s`. `None` without moves.
pub fn recovery_s(
    admitted: &[u64],
    demand: &[u64],
    bin_s: f64,
    per_bin: f64,
    moves: &[f64],
    end_s: f64,
) -> Option<f64> {
    let mut worst: Option<f64> = None;
    for (k, &m) in moves.iter().enumerate() {
        let next = moves.get(k + 1).copied().unwrap_or(end_s);
        let mut b = (m / bin_s - 1e-9).ceil().max(0.0) as usize;
        let mut rec = next - m;
        while b < admitted.len() && (b as f64) * bin_s < next {
            let possible = (demand[b] as f64).min(per_bin);
            if possible <= 0.0 || admitted[b] as f64 / possible >= RECOVERY_TARGET {
                rec = ((b as f64) * bin_s - m).max(0.0);
                break;
            }
            b += 1;
        }
        worst = Some(worst.map_or(rec, |w: f64| w.max(rec)));
    }
    worst
}

/// Latency quantiles, µs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LatencyUs {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
}

/// One mode's results, as written to `report.json` under `modes.<name>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModeMetrics {
    /// Requests allowed.
    pub admitted: u64,
    /// Requests not allowed (denied, failed or undecided).
    pub rejected: u64,
    /// Requests.
    pub demand: u64,
    /// Worst window excess over `burst + rate × W`.
    pub max_window_overshoot: u64,
    /// `admitted / min(demand, allowed)`.
    pub utilization: f64,
    /// `utilization` over the fleet's first second.
    #[serde(default)]
    pub first_second_admission: f64,
    /// Jain's index over per-node acceptance ratios.
    pub jain_acceptance: f64,
    /// Lowest over highest per-node acceptance ratio.
    pub min_max_acceptance_ratio: f64,
    /// Store calls.
    pub store_calls: u64,
    /// Peak calls per second of one node in one window.
    pub store_calls_per_s_per_node_max: f64,
    /// Tokens granted that never served a request.
    pub tokens_stranded: u64,
    /// Redis CPU the fleet cost: server time of its calls over the run's duration, in cores.
    #[serde(default)]
    pub redis_cpu: f64,
    /// Decision latency quantiles.
    pub latency_us: LatencyUs,
    /// Denials while another live node held unused tokens.
    pub rejected_while_tokens_idle: u64,
    /// Acceptance and store calls by demand rank (see the module docs).
    #[serde(default)]
    pub by_demand_rank: Vec<RankGroup>,
    /// Worst recovery after a hot-spot move, s (`moving_hotspot` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_s: Option<f64>,
    /// Tokens the hybrid limiters took from rate leases (dripped into their local buckets),
    /// admitted or not; 0 for other modes and where no rate was leased.
    #[serde(default)]
    pub tokens_from_rates: u64,
    /// A hybrid mode's fleet with some nodes in pure mode (`pure_share`): each group's
    /// acceptance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mixed: Option<MixedAcceptance>,
    /// Store calls that failed.
    pub store_errors: u64,
    /// Hex FNV-1a hash of the run's event log.
    pub trace_hash: String,
    /// Wall-clock time of the run, ms.
    pub wall_ms: u64,
}

/// Acceptance (admitted over requested) of the nodes that decide in pure mode and of those
/// that lease, in a hybrid mode's fleet with both (`mixed`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MixedAcceptance {
    /// The pure-mode nodes'.
    pub pure: f64,
    /// The leasing nodes'.
    pub leasing: f64,
}

/// The two groups' acceptance, if `sc` mixes pure-mode nodes into `log`'s hybrid mode.
fn mixed(sc: &Scenario, log: &RunLog) -> Option<MixedAcceptance> {
    if !log.mode.is_hybrid() || sc.pure_share == 0.0 {
        return None;
    }
    // (requested, admitted) of the leasing nodes, then of the pure ones.
    let mut counts = [(0u64, 0u64); 2];
    for r in &log.requests {
        let group = &mut counts[usize::from(sc.runs_pure(r.node as usize))];
        group.0 += 1;
        group.1 += u64::from(r.outcome == Outcome::Admitted);
    }
    let acceptance = |(asked, admitted): (u64, u64)| match asked {
        0 => 1.0,
        _ => admitted as f64 / asked as f64,
    };
    Some(MixedAcceptance {
        pure: acceptance(counts[1]),
        leasing: acceptance(counts[0]),
    })
}

/// One group of nodes by demand rank (`by_demand_rank`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankGroup {
    /// First rank of the group (1 = the node with the most requests).
    pub first: usize,
    /// Last rank of the group.
    pub last: usize,
    /// Requests per node per second, the group's mean.
    pub demand_per_s: f64,
    /// Admitted over requested, over the group (1 for a group without requests).
    pub acceptance: f64,
    /// Store calls per node per second, the group's mean.
    pub calls_per_s: f64,
}

/// The nodes ranked by requests, in groups of ranks 1, 2–3, 4–10, 11–32, 33–100, …: each
/// group's mean requests and store calls per node per second and its acceptance.
pub fn by_demand_rank(nodes: usize, log: &RunLog, duration_s: f64) -> Vec<RankGroup> {
    let (demand, admitted) = per_node_requests(nodes, log);
    let mut calls = vec![0u64; nodes];
    for c in &log.calls {
        calls[c.node as usize] += 1;
    }
    let mut order: Vec<usize> = (0..nodes).collect();
    // Ties by node index, so the grouping is deterministic.
    order.sort_by_key(|&i| (std::cmp::Reverse(demand[i]), i));
    let per_s = duration_s.max(f64::MIN_POSITIVE);
    let mut groups = Vec::new();
    let (mut first, mut bound) = (1usize, 1.0f64);
    while first <= nodes {
        let last = (bound.round() as usize).clamp(first, nodes);
        let members = &order[first - 1..last];
        let sum = |v: &[u64]| members.iter().map(|&i| v[i]).sum::<u64>();
        let (d, a, c) = (sum(&demand), sum(&admitted), sum(&calls));
        let n = members.len() as f64;
        groups.push(RankGroup {
            first,
            last,
            demand_per_s: d as f64 / n / per_s,
            acceptance: if d == 0 { 1.0 } else { a as f64 / d as f64 },
            calls_per_s: c as f64 / n / per_s,
        });
        first = last + 1;
        bound *= 10f64.sqrt();
    }
    groups
}

/// Requests and admissions per node.
pub fn per_node_requests(nodes: usize, log: &RunLog) -> (Vec<u64>, Vec<u64>) {
    let mut demand = vec![0u64; nodes];
    let mut admitted = vec![0u64; nodes];
    for r in &log.requests {
        demand[r.node as usize] += 1;
        admitted[r.node as usize] += u64::from(r.outcome == Outcome::Admitted);
    }
    (demand, admitted)
}

/// Per-node acceptance ratios (nodes without demand left out).
pub fn acceptance_ratios(nodes: usize, log: &RunLog) -> Vec<f64> {
    let (demand, admitted) = per_node_requests(nodes, log);
    demand
        .iter()
        .zip(&admitted)
        .filter(|(&d, _)| d > 0)
        .map(|(&d, &a)| a as f64 / d as f64)
        .collect()
}

/// Sorted admission times (ns).
pub fn admission_times(log: &RunLog) -> Vec<u64> {
    let mut t: Vec<u64> = log
        .requests
        .iter()
        .filter(|r| r.outcome == Outcome::Admitted)
        .map(|r| r.decided_ns)
        .collect();
    t.sort_unstable();
    t
}

/// Counts per bin of `bin_ns` over `bins` bins; times past the end go to the last bin.
fn bin_counts(times: impl Iterator<Item = u64>, bin_ns: u64, bins: usize) -> Vec<u64> {
    let mut c = vec![0u64; bins.max(1)];
    let last = c.len() - 1;
    for t in times {
        c[((t / bin_ns) as usize).min(last)] += 1;
    }
    c
}

/// Every metric of one run.
pub fn compute(sc: &Scenario, log: &RunLog) -> ModeMetrics {
    let demand = log.requests.len() as u64;
    let admitted_at = admission_times(log);
    let admitted = admitted_at.len() as u64;
    let ratios = acceptance_ratios(sc.nodes, log);
    let window_ns = sc.window_ns();

    let peak_calls = peak_node_calls(sc.nodes, &log.calls, window_ns);

    let start = if sc.lives().iter().any(|l| l.join_s.is_none()) {
        0
    } else {
        sc.lives()
            .iter()
            .filter_map(|l| l.join_s)
            .map(s_to_ns)
            .min()
            .unwrap_or(0)
    };
    let first = start..start + 1_000_000_000;
    let first_admitted = admitted_at.iter().filter(|t| first.contains(t)).count() as u64;
    let first_demand = log
        .requests
        .iter()
        .filter(|r| first.contains(&r.arrival_ns))
        .count() as u64;

    let mut latencies: Vec<u64> = log
        .requests
        .iter()
        .filter(|r| r.outcome != Outcome::Undecided)
        .map(|r| r.latency_ns)
        .collect();
    latencies.sort_unstable();
    let us = |q| percentile(&latencies, q) as f64 / 1e3;

    let moves = hot_moves(sc);
    let recovery = if moves.is_empty() {
        None
    } else {
        let bins = sc.duration_ns().div_ceil(RECOVERY_BIN_NS) as usize;
        let adm = bin_counts(admitted_at.iter().copied(), RECOVERY_BIN_NS, bins);
        let dem = bin_counts(
            log.requests.iter().map(|r| r.arrival_ns),
            RECOVERY_BIN_NS,
            bins,
        );
        let bin_s = RECOVERY_BIN_NS as f64 / 1e9;
        recovery_s(
            &adm,
            &dem,
            bin_s,
            sc.rate as f64 * bin_s,
            &moves,
            sc.duration_s,
        )
    };

    ModeMetrics {
        admitted,
        rejected: demand - admitted,
        demand,
        max_window_overshoot: max_window_overshoot(
            &admitted_at,
            window_ns,
            sc.allowed_in(window_ns),
        ),
        utilization: utilization(admitted, demand, sc.allowed_in(sc.duration_ns())),
        first_second_admission: utilization(
            first_admitted,
            first_demand,
            sc.allowed_in(1_000_000_000),
        ),
        jain_acceptance: jain(&ratios),
        min_max_acceptance_ratio: min_max_ratio(&ratios),
        store_calls: log.store_calls,
        store_calls_per_s_per_node_max: peak_calls as f64 / (window_ns as f64 / 1e9),
        tokens_stranded: log.tokens_stranded,
        redis_cpu: log.redis_busy_ns as f64 / sc.duration_ns() as f64,
        latency_us: LatencyUs {
            p50: us(0.5),
            p99: us(0.99),
            p999: us(0.999),
        },
        rejected_while_tokens_idle: log.rejected_while_tokens_idle,
        by_demand_rank: by_demand_rank(sc.nodes, log, sc.duration_s),
        recovery_s: recovery,
        tokens_from_rates: log.tokens_dripped,
        mixed: mixed(sc, log),
        store_errors: log.store_errors,
        trace_hash: format!("{:016x}", log.trace_hash()),
        wall_ms: u64::try_from(log.wall.as_millis()).unwrap_or(u64::MAX),
    }
}

/// One metric window of one mode (a row of `windows.csv`).
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    /// Start of the window, s.
    pub start_s: f64,
    /// Admissions in the window (by the time they took effect).
    pub admitted: u64,
    /// Requests that arrived in the window.
    pub demand: u64,
    /// Store calls sent in the window.
    pub store_calls: u64,
    /// Per node: the share of its requests arriving in the window that were admitted (`None`
    /// without demand).
    pub node_acceptance: Vec<Option<f64>>,
}

/// The run cut into `window_ms` windows.
pub fn windows(sc: &Scenario, log: &RunLog) -> Vec<Window> {
    let w = sc.window_ns();
    let count = sc.duration_ns().div_ceil(w).max(1) as usize;
    let admitted = bin_counts(admission_times(log).into_iter(), w, count);
    let demand = bin_counts(log.requests.iter().map(|r| r.arrival_ns), w, count);
    let calls = bin_counts(log.calls.iter().map(|c| c.t_ns), w, count);
    let mut node_demand = vec![vec![0u64; sc.nodes]; count];
    let mut node_admitted = vec![vec![0u64; sc.nodes]; count];
    for r in &log.requests {
        let i = ((r.arrival_ns / w) as usize).min(count - 1);
        node_demand[i][r.node as usize] += 1;
        node_admitted[i][r.node as usize] += u64::from(r.outcome == Outcome::Admitted);
    }
    (0..count)
        .map(|i| Window {
            start_s: (i as u64 * w) as f64 / 1e9,
            admitted: admitted[i],
            demand: demand[i],
            store_calls: calls[i],
            node_acceptance: node_demand[i]
                .iter()
                .zip(&node_admitted[i])
                .map(|(&d, &a)| (d > 0).then(|| a as f64 / d as f64))
                .collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jain_of_equal_ratios_is_one_and_of_one_hot_is_one_over_n() {
        assert!((jain(&[0.5, 0.5, 0.5, 0.5]) - 1.0).abs() < 1e-12);
        assert!((jain(&[1.0, 0.0, 0.0, 0.0]) - 0.25).abs() < 1e-12);
        assert!((jain(&[1.0, 0.0]) - 0.5).abs() < 1e-12);
        // (1 + 0.5)² / (2 × 1.25) = 0.9
        assert!((jain(&[1.0, 0.5]) - 0.9).abs() < 1e-12);
        assert_eq!(jain(&[]), 1.0);
        assert_eq!(jain(&[0.0, 0.0]), 1.0);
    }

    #[test]
    fn nodes_are_grouped_by_demand_rank() {
        use crate::record::{CallKind, CallRecord, RequestRecord};
        // Twelve nodes: node i sees i + 1 requests (node 11 the most), of which node 11 has
        // all admitted and the others none; node 11 makes 4 store calls. Over 2 s.
        let mut requests = Vec::new();
        for node in 0..12u32 {
            for k in 0..=node {
                let mut r = RequestRecord::pending(u64::from(k), node);
                if node == 11 {
                    r.outcome = Outcome::Admitted;
                }
                requests.push(r);
            }
        }
        let calls = (0..4)
            .map(|t| CallRecord {
                t_ns: t,
                node: 11,
                kind: CallKind::Lease,
            })
            .collect();
        let log = RunLog {
            mode: crate::scenario::Mode::Hybrid,
            requests,
            calls,
            store_calls: 4,
            tokens_stranded: 0,
            store_errors: 0,
            redis_busy_ns: 0,
            rejected_while_tokens_idle: 0,
            tokens_dripped: 0,
            wall: std::time::Duration::ZERO,
        };
        let g = by_demand_rank(12, &log, 2.0);
        let ranks: Vec<(usize, usize)> = g.iter().map(|g| (g.first, g.last)).collect();
        assert_eq!(ranks, [(1, 1), (2, 3), (4, 10), (11, 12)]);
        // Rank 1 is node 11: 12 requests, all admitted, 4 calls, over 2 s.
        assert_eq!(
            (g[0].demand_per_s, g[0].acceptance, g[0].calls_per_s),
            (6.0, 1.0, 2.0)
        );
        // Ranks 2–3 are nodes 10 and 9: 11 + 10 requests, none admitted.
        assert_eq!((g[1].demand_per_s, g[1].acceptance), (5.25, 0.0));
        // Ranks 11–12 are nodes 1 and 0: 2 + 1 requests.
        assert_eq!(g[3].demand_per_s, 0.75);
    }

    #[test]
    fn min_max_ratio_of_known_inputs() {
        assert_eq!(min_max_ratio(&[0.2, 0.8, 0.4]), 0.25);
        assert_eq!(min_max_ratio(&[0.0, 0.0]), 1.0);
        assert_eq!(min_max_ratio(&[0.0, 1.0]), 0.0);
    }

    #[test]
    fn overshoot_counts_sliding_windows_not_just_aligned_ones() {
        let s = 1_000_000_000;
        // Three admissions in [0.9 s, 1.1 s]: aligned 1 s buckets see 1 and 2, a sliding
        // window anchored at 0.9 s sees all three.
        let t = [s * 9 / 10, s, s * 11 / 10];
        assert_eq!(max_window_overshoot(&t, s, 2.0), 1);
        assert_eq!(max_window_overshoot(&t, s, 3.0), 0);
        assert_eq!(max_window_overshoot(&t, s, 2.5), 1, "3 > 2.5");
        // The window is half-open: an admission exactly W later is in the next window.
        assert_eq!(max_window_overshoot(&[0, s], s, 1.0), 0);
        assert_eq!(max_window_overshoot(&[], s, 0.0), 0);
        // Five at the same instant against an allowance of 2.
        assert_eq!(max_window_overshoot(&[7; 5], s, 2.0), 3);
    }

    /// The busiest node's calls per window slide as the overshoot's windows do: 100 calls
    /// 10 ms apart from 0.5 s are 100 in the second from 0.5 s, though the report's fixed
    /// windows see 50 and 50.
    #[test]
    fn peak_node_calls_count_sliding_windows() {
        use crate::record::CallKind;
        let s = 1_000_000_000u64;
        let mut calls: Vec<CallRecord> = (0..100)
            .map(|i| CallRecord {
                t_ns: s / 2 + i * s / 100,
                node: 1,
                kind: CallKind::Lease,
            })
            .collect();
        calls.push(CallRecord {
            t_ns: 0,
            node: 0,
            kind: CallKind::Lease,
        });
        assert_eq!(peak_node_calls(2, &calls, s), 100);
        assert_eq!(peak_node_calls(2, &calls[..50], s), 50);
        assert_eq!(peak_node_calls(3, &[], s), 0);
    }

    #[test]
    fn utilization_is_relative_to_what_was_possible() {
        assert_eq!(utilization(50, 100, 1000.0), 0.5, "demand-bound");
        assert_eq!(utilization(500, 2000, 1000.0), 0.5, "limit-bound");
        assert_eq!(utilization(1000, 2000, 1000.0), 1.0);
        assert_eq!(utilization(0, 0, 1000.0), 1.0);
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<u64> = (1..=1000).collect();
        assert_eq!(percentile(&v, 0.5), 500);
        assert_eq!(percentile(&v, 0.99), 990);
        assert_eq!(percentile(&v, 0.999), 999);
        assert_eq!(percentile(&[5], 0.999), 5);
        assert_eq!(percentile(&[], 0.5), 0);
    }

    #[test]
    fn recovery_finds_the_first_good_bin_after_each_move() {
        // Bins of 1 s, 10 per bin allowed, demand 20 everywhere. Move at 2 s: bins 2, 3 bad,
        // bin 4 good → 2 s. Move at 6 s: bin 6 good → 0 s.
        let adm = [10, 10, 3, 5, 10, 10, 10, 10];
        let dem = [20; 8];
        let r = recovery_s(&adm, &dem, 1.0, 10.0, &[2.0, 6.0], 8.0).unwrap();
        assert!((r - 2.0).abs() < 1e-9, "{r}");
        // Never recovered before the next move: the whole interval.
        let bad = [10, 1, 1, 1, 10];
        let r = recovery_s(&bad, &[20; 5], 1.0, 10.0, &[1.0, 4.0], 5.0).unwrap();
        assert!((r - 3.0).abs() < 1e-9, "{r}");
        assert_eq!(recovery_s(&adm, &dem, 1.0, 10.0, &[], 8.0), None);
    }
}
