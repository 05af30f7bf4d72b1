//! A flood of unique keys keeps a keyed limiter's memory bounded by its cap — the scaled-down
//! CI version of `cargo run --release --example keyed_flood` (10 M keys; numbers in
//! RELIABILITY.md). Alone in its binary, so the resident memory it reads is its own.

#[path = "../examples/keyed_flood.rs"]
#[allow(dead_code)]
mod keyed_flood;

#[test]
fn a_flood_of_unique_keys_keeps_memory_bounded_by_the_cap() {
    let report = keyed_flood::flood(1_000_000, 2_000);
    println!("{report:#?}");
    keyed_flood::check(&report);
    assert!(
        report.rss_churned_kib > 0,
        "the flood should churn through the whole cap at least once: {report:#?}"
    );
}
