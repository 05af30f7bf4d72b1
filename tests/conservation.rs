//! The conservation invariant of the lease protocol, checked after every operation.
//!
//! Random interleavings of leases on terms (nodes reporting what they still hold — that is,
//! spending), anonymous leases, returns (some retried, some leaving), time passing (leases
//! expiring) and crashes (a node that stops calling) are applied to the shared step
//! ([`ratelease::algorithm::token_bucket::step`], the Rust twin of the Lua script). After each one:
//!
//! - `level + outstanding ≤ capacity`: tokens held by nodes are never refilled behind their back;
//! - `outstanding` is exactly the sum of the live leasers' records;
//! - no leaser outlives its expiry.

use std::collections::BTreeSet;
use std::time::Duration;

use proptest::prelude::*;
use ratelease::algorithm::token_bucket::{step, NodeLeaseArgs, NodeReleaseArgs, Op, Stored};
use ratelease::Quota;

#[derive(Debug, Clone)]
enum Action {
    /// Node leases; `spend` of what it holds was spent since its last call.
    Lease {
        node: u8,
        want: u64,
        spend: u64,
        demand: u64,
    },
    Anonymous {
        want: u64,
    },
    Return {
        node: u8,
        seq: u64,
        leaving: bool,
    },
    Wait {
        us: u64,
    },
    Crash {
        node: u8,
    },
}

fn action(burst: u64) -> impl Strategy<Value = Action> {
    prop_oneof![
        5 => (0u8..4, 1..=burst * 2, 0..=burst, 0u64..10_000_000)
            .prop_map(|(node, want, spend, demand)| Action::Lease { node, want, spend, demand }),
        1 => (1..=burst).prop_map(|want| Action::Anonymous { want }),
        2 => (0u8..4, 0u64..4, any::<bool>())
            .prop_map(|(node, seq, leaving)| Action::Return { node, seq, leaving }),
        3 => (0u64..600_000).prop_map(|us| Action::Wait { us }),
        1 => (0u8..4).prop_map(|node| Action::Crash { node }),
    ]
}

fn scenario() -> impl Strategy<Value = (Quota, Vec<Action>)> {
    (1u64..5_000, 1u64..2_000).prop_flat_map(|(rate, burst)| {
        let quota = Quota::with_parts(rate, Duration::from_secs(1), burst).unwrap();
        (Just(quota), prop::collection::vec(action(burst), 1..150))
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn level_plus_outstanding_never_exceeds_capacity((quota, actions) in scenario()) {
        let mut st = Stored::default();
        let mut now = 1_000_000u64;
        let mut held = [0u64; 4];
        // Each node stops spending at 90 % of its lease's ttl, as the limiter does.
        let mut local_deadline = [0u64; 4];
        let mut crashed = BTreeSet::new();
        let ids = ["n0", "n1", "n2", "n3"];
        for a in &actions {
            match *a {
                Action::Lease { node, want, spend, demand } => {
                    let i = usize::from(node);
                    if crashed.contains(&node) { continue; }
                    held[i] -= spend.min(held[i]);
                    let lease = NodeLeaseArgs {
                        id: ids[i],
                        held: held[i],
                        demand_mtps: demand,
                        horizon_us: 100_000,
                        ttl_us: 1_000_000,
                    };
                    let op = Op::Lease { want, min: 1, node: Some(lease) };
                    let (reply, _) = step(&mut st, &quota, op, now).unwrap();
                    let recorded = st.leasers[ids[i]].outstanding - reply.granted;
                    held[i] = held[i].min(recorded) + reply.granted;
                    local_deadline[i] = now + 900_000;
                }
                Action::Anonymous { want } => {
                    let op = Op::Lease { want, min: 1, node: None };
                    step(&mut st, &quota, op, now).unwrap();
                }
                Action::Return { node, seq, leaving } => {
                    let i = usize::from(node);
                    if crashed.contains(&node) { continue; }
                    let release = NodeReleaseArgs { id: ids[i], seq, leaving };
                    let op = Op::Release { tokens: held[i], node: Some(release) };
                    step(&mut st, &quota, op, now).unwrap();
                    if leaving { held[i] = 0; }
                }
                Action::Wait { us } => {
                    // Time passes silently: the next operation refills and expires leases.
                    now += us;
                    for i in 0..4 {
                        if now >= local_deadline[i] {
                            held[i] = 0;
                        }
                    }
                    continue;
                }
                Action::Crash { node } => {
                    crashed.insert(node);
                    continue;
                }
            }
            // In the bucket's own units: exact, no rounding.
            let (units, out, scale) = st
                .bucket
                .map_or((0, 0, 1), |b| (b.level, b.outstanding, b.scale));
            let cap = quota.burst() * scale;
            prop_assert!(
                units + out * scale <= cap,
                "level {units} + outstanding {out} × {scale} > {cap}"
            );
            let sum: u64 = st.leasers.values().map(|l| l.outstanding).sum();
            prop_assert_eq!(out, sum, "outstanding is the sum of the records");
            prop_assert!(st.leasers.values().all(|l| l.expires_us > now), "an expired leaser survived");
            prop_assert!(
                st.expiry.len() == st.leasers.len()
                    && st.expiry.iter().all(|(e, id)| st.leasers.get(id).is_some_and(|l| l.expires_us == *e)),
                "the expiry index and the leasers disagree"
            );
        }
    }
}
