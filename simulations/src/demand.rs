//! Demand: the requests every mode is asked to serve, generated once per run.
//!
//! Each node receives a Poisson stream of one-token requests. Its rate is piecewise constant
//! in time: it changes only at *breakpoints* (a hot-spot move, an on/off switch, a crash or a
//! join), so the trace is generated segment by segment with the time-rescaling method: draw an
//! `Exp(1)` "amount of integrated rate" and walk forward through the segments until it is used
//! up. That gives an exact non-homogeneous Poisson process with one RNG stream per node
//! (`("demand", node)`, see [`crate::rng`]).
//!
//! `total_rps` is fleet-wide. When a node is down (before its `node_join`, after its
//! `node_crash`) its share moves to the live nodes, as a load balancer would move it, so the
//! fleet keeps receiving `total_rps`. For `on_off` the long-run fleet mean is `total_rps`: a node
//! that is on sends `total_rps / N × (on_s + off_s) / on_s`, and node `i`'s cycle is shifted by
//! `i × (on_s + off_s) / N`.
//!
//! The trace is sorted by (time, node); all modes replay the same one.

use crate::rng::{exponential, rng_for};
use crate::scenario::{s_to_ns, Pattern, Scenario};

/// One request: one token asked on `node` at `t_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Arrival {
    /// Time since the start, ns.
    pub t_ns: u64,
    /// The node receiving it.
    pub node: u32,
}

/// Whether `node` is up at `t_s` (joined, not crashed).
pub fn is_alive(sc: &Scenario, node: usize, t_s: f64) -> bool {
    sc.join_s(node).is_none_or(|j| t_s >= j) && sc.crash_s(node).is_none_or(|c| t_s < c)
}

/// The hot node at `t_s` for `moving_hotspot` (node 0 for `hot_node`).
pub fn hot_node(sc: &Scenario, t_s: f64) -> usize {
    match sc.demand.pattern {
        Pattern::MovingHotspot => (t_s / sc.demand.move_every_s).floor() as usize % sc.nodes,
        _ => 0,
    }
}

/// Times (s) at which the hot spot moves, excluding the start.
pub fn hot_moves(sc: &Scenario) -> Vec<f64> {
    if sc.demand.pattern != Pattern::MovingHotspot {
        return Vec::new();
    }
    (1..)
        .map(|k| k as f64 * sc.demand.move_every_s)
        .take_while(|&t| t < sc.duration_s)
        .collect()
}

/// Whether node `i` is in the on phase at `t_s` (`on_off`).
fn is_on(sc: &Scenario, node: usize, t_s: f64) -> bool {
    let period = sc.demand.on_s + sc.demand.off_s;
    let offset = node as f64 * period / sc.nodes as f64;
    (t_s - offset).rem_euclid(period) < sc.demand.on_s
}

/// Every node's request rate (per second) at `t_s`.
pub fn rates_at(sc: &Scenario, t_s: f64) -> Vec<f64> {
    let n = sc.nodes;
    let d = &sc.demand;
    let alive: Vec<bool> = (0..n).map(|i| is_alive(sc, i, t_s)).collect();
    if d.pattern == Pattern::OnOff {
        let live = alive.iter().filter(|&&a| a).count();
        if live == 0 {
            return vec![0.0; n];
        }
        let period = d.on_s + d.off_s;
        let on_rate = d.total_rps / live as f64 * period / d.on_s;
        return (0..n)
            .map(|i| {
                if alive[i] && is_on(sc, i, t_s) {
                    on_rate
                } else {
                    0.0
                }
            })
            .collect();
    }
    let hot = hot_node(sc, t_s);
    let weight = |i: usize| -> f64 {
        match d.pattern {
            Pattern::Uniform => 1.0,
            Pattern::Zipf => 1.0 / ((i + 1) as f64).powf(d.zipf_s),
            Pattern::HotNode | Pattern::MovingHotspot if n == 1 => 1.0,
            Pattern::HotNode | Pattern::MovingHotspot => {
                if i == hot {
                    d.hot_share
                } else {
                    (1.0 - d.hot_share) / (n - 1) as f64
                }
            }
            Pattern::OnOff => unreachable!("handled above"),
        }
    };
    let w: Vec<f64> = (0..n)
        .map(|i| if alive[i] { weight(i) } else { 0.0 })
        .collect();
    let total: f64 = w.iter().sum();
    if total <= 0.0 {
        return vec![0.0; n];
    }
    w.iter().map(|wi| d.total_rps * wi / total).collect()
}

/// Times (s) where any node's rate may change, sorted, from 0 to `duration_s` inclusive: the
/// events, and each node's own start and stop (an event spread over `duration_s` starts or
/// stops its nodes one after another, and the fleet's demand moves to those up at each).
pub fn breakpoints(sc: &Scenario) -> Vec<f64> {
    let end = sc.duration_s;
    let mut b = vec![0.0, end];
    for e in &sc.events {
        b.push(e.at_s);
    }
    for life in sc.lives() {
        b.extend(life.join_s);
        b.extend(life.leave_s);
    }
    b.extend(hot_moves(sc));
    if sc.demand.pattern == Pattern::OnOff {
        let period = sc.demand.on_s + sc.demand.off_s;
        for i in 0..sc.nodes {
            let offset = i as f64 * period / sc.nodes as f64;
            let mut start = offset - period;
            while start < end {
                b.push(start);
                b.push(start + sc.demand.on_s);
                start += period;
            }
        }
    }
    b.retain(|&t| (0.0..=end).contains(&t));
    b.sort_by(f64::total_cmp);
    b.dedup();
    b
}

/// The request trace of `sc` under `seed`, sorted by (time, node). Each node's arrivals are
/// a Poisson process at its rate in each segment between [`breakpoints`], drawn from its own
/// random stream; the segments are walked in time order, holding one segment's rates at a
/// time (a fleet of 10 000 nodes started one by one has 10 000 segments).
pub fn generate(sc: &Scenario, seed: u64) -> Vec<Arrival> {
    let points = breakpoints(sc);
    let end_ns = sc.duration_ns();
    let mut rngs: Vec<_> = (0..sc.nodes)
        .map(|node| rng_for(seed, "demand", node as u64))
        .collect();
    let mut needs: Vec<f64> = rngs.iter_mut().map(|rng| exponential(rng, 1.0)).collect();
    let mut out = Vec::new();
    for w in points.windows(2) {
        let (start, end) = (w[0], w[1]);
        let rates = rates_at(sc, (start + end) / 2.0);
        for (node, (rng, need)) in rngs.iter_mut().zip(&mut needs).enumerate() {
            let rate = rates[node];
            let mut t = start;
            loop {
                let here = rate * (end - t);
                if *need >= here {
                    *need -= here;
                    break;
                }
                t += *need / rate;
                let t_ns = s_to_ns(t);
                if t_ns < end_ns {
                    out.push(Arrival {
                        t_ns,
                        node: node as u32,
                    });
                }
                *need = exponential(rng, 1.0);
            }
        }
    }
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scenario(pattern: &str, extra: &str) -> Scenario {
        Scenario::parse(&format!(
            "name = \"t\"\nduration_s = 20\nrate = 100\nnodes = 4\n{extra}\n\
             [demand]\npattern = \"{pattern}\"\ntotal_rps = 1000\nzipf_s = 1.0\n\
             hot_share = 0.7\nmove_every_s = 5\non_s = 1\noff_s = 3\n"
        ))
        .unwrap()
    }

    fn per_node(trace: &[Arrival], nodes: usize) -> Vec<usize> {
        let mut c = vec![0; nodes];
        for a in trace {
            c[a.node as usize] += 1;
        }
        c
    }

    /// A scale-out or scale-in spread over a period starts or stops its nodes one by one; no
    /// node sees a request before it starts or after it stops (the trace changed rates only
    /// at the event: a node joining 4.9 s into a spread scale-out had 4.9 s of requests that
    /// no limiter of it could answer), and the fleet's demand stays the scenario's.
    #[test]
    fn no_node_sees_requests_outside_its_life() {
        for event in [
            "at_s = 5\nkind = \"scale_out\"\ncount = 2\nduration_s = 4",
            "at_s = 5\nkind = \"scale_in\"\ncount = 2\nduration_s = 4",
        ] {
            let sc = scenario("zipf", &format!("[[events]]\n{event}"));
            let trace = generate(&sc, 7);
            for a in &trace {
                let life = sc.lives()[a.node as usize];
                assert!(
                    life.join_s.is_none_or(|j| a.t_ns >= s_to_ns(j)),
                    "{event}: node {} at {} ns, before its start",
                    a.node,
                    a.t_ns
                );
                assert!(
                    life.leave_s.is_none_or(|l| a.t_ns < s_to_ns(l)),
                    "{event}: node {} at {} ns, after its stop",
                    a.node,
                    a.t_ns
                );
            }
            // 1 000 requests a second for 20 s, whichever nodes are up.
            let n = trace.len() as f64;
            assert!(
                (n - 20_000.0).abs() < 3.0 * 20_000f64.sqrt(),
                "{event}: {n}"
            );
        }
    }

    #[test]
    fn zipf_rates_sum_to_total_and_decrease() {
        let sc = scenario("zipf", "");
        let r = rates_at(&sc, 1.0);
        assert!((r.iter().sum::<f64>() - 1000.0).abs() < 1e-6);
        assert!(r.windows(2).all(|w| w[0] > w[1]));
        assert!((r[0] / r[1] - 2.0).abs() < 1e-9, "1/k weights");
    }

    #[test]
    fn trace_matches_rates_and_is_sorted() {
        let sc = scenario("hot_node", "");
        let trace = generate(&sc, 3);
        assert!(trace.windows(2).all(|w| w[0] <= w[1]));
        let c = per_node(&trace, 4);
        let total: usize = c.iter().sum();
        assert!((total as f64 - 20_000.0).abs() < 600.0, "{total}");
        let hot = c[0] as f64 / total as f64;
        assert!((hot - 0.7).abs() < 0.02, "{hot}");
        assert_eq!(generate(&sc, 3), trace, "deterministic");
        assert_ne!(generate(&sc, 4), trace);
    }

    #[test]
    fn crashed_node_gets_nothing_after_and_its_share_moves() {
        let sc = scenario(
            "uniform",
            "[[events]]\nat_s = 10\nkind = \"node_crash\"\nnode = 1\n",
        );
        let trace = generate(&sc, 1);
        let crash_ns = 10_000_000_000;
        assert!(trace.iter().all(|a| a.node != 1 || a.t_ns < crash_ns));
        let after = trace.iter().filter(|a| a.t_ns >= crash_ns).count();
        assert!((after as f64 - 10_000.0).abs() < 400.0, "{after}");
    }

    #[test]
    fn moving_hotspot_moves() {
        let sc = scenario("moving_hotspot", "");
        assert_eq!(hot_moves(&sc), vec![5.0, 10.0, 15.0]);
        assert_eq!(hot_node(&sc, 4.9), 0);
        assert_eq!(hot_node(&sc, 5.0), 1);
        assert_eq!(hot_node(&sc, 19.0), 3);
    }

    #[test]
    fn on_off_nodes_are_on_a_quarter_of_the_time() {
        let sc = scenario("on_off", "");
        // Period 4 s, on 1 s, 4 nodes shifted by 1 s: exactly one node is on at any time.
        for t in [0.5, 1.5, 2.5, 3.5, 7.2] {
            let r = rates_at(&sc, t);
            assert_eq!(r.iter().filter(|&&x| x > 0.0).count(), 1, "t = {t}");
            assert!((r.iter().sum::<f64>() - 1000.0).abs() < 1e-6);
        }
        let c = per_node(&generate(&sc, 5), 4);
        assert!(
            c.iter().all(|&x| (x as f64 - 5000.0).abs() < 400.0),
            "{c:?}"
        );
    }
}
