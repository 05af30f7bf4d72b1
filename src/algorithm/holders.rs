//! The concurrency step: a pure function from (holder records, operation, now) to (new
//! records, reply).
//!
//! This is the Rust twin of `lua/concurrency.lua`, written to give the same reply for every
//! input, error messages included; [`MemoryStore`](crate::MemoryStore) runs it under a per-name
//! lock, the script runs it inside Redis, and a differential property test holds the two
//! together. The script's header documents the protocol; this file follows it line by line.
//!
//! State is one record per holder (a process, not a permit): how many slots it holds, the
//! largest acquire sequence number that granted it slots, the last release sequence number
//! applied, and its expiry. The fleet's total is kept next to them. Every call first reclaims
//! the holders whose expiry has passed (their slots come back), so a crashed process leaks its
//! slots for one ttl at most.

use std::collections::BTreeMap;

use crate::algorithm::token_bucket::{InvalidArgument, MAX_NODE_LEN, MAX_TIME_US};
use crate::quota::MAX_VALUE;

/// One holder's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder {
    /// Slots it holds (≥ 1: a record whose count reaches 0 is deleted).
    pub count: u64,
    /// The largest acquire sequence number that granted it slots.
    pub aseq: u64,
    /// The last release sequence number applied.
    pub rseq: u64,
    /// When the record expires unless renewed, µs on the store's clock.
    pub expires_us: u64,
}

/// Every holder of one limiter name, and their total.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holders {
    /// Slots held across the fleet: the sum of the records' counts.
    pub total: u64,
    /// Records by holder id.
    pub records: BTreeMap<String, Holder>,
}

/// What one script call does. Holder ids are at most [`MAX_NODE_LEN`] bytes, non-empty (except
/// for [`Op::Peek`]) and do not start with `#`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op<'a> {
    /// Take between `min` and `want` slots for `holder` (none if fewer than `min` are free),
    /// and renew its record.
    Acquire {
        /// The holder.
        holder: &'a str,
        /// Most slots to take.
        want: u64,
        /// Fewest acceptable.
        min: u64,
        /// The caller's concurrency limit.
        limit: u64,
        /// How long the record lives without another call, µs.
        ttl_us: u64,
        /// The holder's acquire sequence number for this call.
        aseq: u64,
        /// The holder's latest release sequence number (a new record starts from it).
        rseq: u64,
    },
    /// Give back up to `n` of `holder`'s slots, once per `rseq`.
    Release {
        /// The holder.
        holder: &'a str,
        /// Slots given back.
        n: u64,
        /// Release sequence number: applied only if above the record's.
        rseq: u64,
    },
    /// Set `holder`'s count to `count` and renew it, unless an acquire with a larger `aseq`
    /// was applied already (then only renew).
    Sync {
        /// The holder.
        holder: &'a str,
        /// Slots the holder really holds.
        count: u64,
        /// How long the record lives without another call, µs.
        ttl_us: u64,
        /// The last acquire sequence number the holder had sent when it counted.
        aseq: u64,
        /// The last release sequence number it had sent.
        rseq: u64,
    },
    /// Only reclaim expired holders; `holder` (may be empty) says whose count to report.
    Peek {
        /// The holder, or `""`.
        holder: &'a str,
    },
}

impl<'a> Op<'a> {
    /// The script's name for the op.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Acquire { .. } => "acquire",
            Op::Release { .. } => "release",
            Op::Sync { .. } => "sync",
            Op::Peek { .. } => "peek",
        }
    }

    /// The script's numeric arguments `ARGV[4..=9]`: want (acquire), n (release) or count
    /// (sync); min; limit; ttl_us; aseq; rseq — `None` where the op takes none.
    pub fn numbers(&self) -> [Option<u64>; 6] {
        match *self {
            Op::Acquire {
                want,
                min,
                limit,
                ttl_us,
                aseq,
                rseq,
                ..
            } => [want, min, limit, ttl_us, aseq, rseq].map(Some),
            Op::Release { n, rseq, .. } => [Some(n), None, None, None, None, Some(rseq)],
            Op::Sync {
                count,
                ttl_us,
                aseq,
                rseq,
                ..
            } => [
                Some(count),
                None,
                None,
                Some(ttl_us),
                Some(aseq),
                Some(rseq),
            ],
            Op::Peek { .. } => [None; 6],
        }
    }

    /// The holder the op is about.
    pub fn holder(&self) -> &'a str {
        match *self {
            Op::Acquire { holder, .. }
            | Op::Release { holder, .. }
            | Op::Sync { holder, .. }
            | Op::Peek { holder } => holder,
        }
    }
}

/// The script's reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    /// Acquire: slots taken; release: slots given back; sync: 1 if the count was set, 0 if the
    /// record was only renewed; peek: 0.
    pub granted: u64,
    /// Slots held across the fleet after the call.
    pub in_use: u64,
    /// The holder's count after the call.
    pub held: u64,
    /// Whether the holder had a live record before the call.
    pub existed: bool,
}

/// Checks the arguments in the script's order.
fn validate(op: &Op<'_>, now_us: u64) -> Result<(), InvalidArgument> {
    let bad = |what| Err(InvalidArgument(what));
    if now_us > MAX_TIME_US {
        return bad("now_us");
    }
    let holder = op.holder();
    let needs_holder = !matches!(op, Op::Peek { .. });
    if holder.len() > MAX_NODE_LEN || holder.starts_with('#') || (holder.is_empty() && needs_holder)
    {
        return bad("holder");
    }
    // The script's ARGV[4..=9], in its order.
    let [n, min, limit, ttl_us, aseq, rseq] = op.numbers();
    let (n_name, n_min) = match op {
        Op::Acquire { .. } => ("want", 1),
        Op::Release { .. } => ("n", 0),
        Op::Sync { .. } => ("count", 0),
        Op::Peek { .. } => return Ok(()),
    };
    let n = n.unwrap_or_default();
    if !(n_min..=MAX_VALUE).contains(&n) {
        return bad(n_name);
    }
    if min.is_some_and(|m| !(1..=n).contains(&m)) {
        return bad("min");
    }
    if limit.is_some_and(|l| !(1..=MAX_VALUE).contains(&l)) {
        return bad("limit");
    }
    if min > limit {
        return bad("min");
    }
    if ttl_us.is_some_and(|t| !(1..=MAX_VALUE).contains(&t)) {
        return bad("ttl_us");
    }
    if aseq.is_some_and(|a| a > MAX_VALUE) {
        return bad("aseq");
    }
    if rseq.is_some_and(|r| r > MAX_VALUE) {
        return bad("rseq");
    }
    Ok(())
}

/// One atomic step on `state` at `now_us`. Invalid arguments change nothing.
///
/// # Errors
/// [`InvalidArgument`] with the script's message.
pub fn step(state: &mut Holders, op: &Op<'_>, now_us: u64) -> Result<Reply, InvalidArgument> {
    validate(op, now_us)?;
    let holder = op.holder();
    // Read: expired holders and the caller's record.
    let due: Vec<String> = state
        .records
        .iter()
        .filter(|(_, r)| r.expires_us <= now_us)
        .map(|(id, _)| id.clone())
        .collect();
    let mut total = state.total;
    for id in &due {
        total = total.saturating_sub(state.records[id].count);
    }
    let expired = due.iter().any(|id| id == holder);
    let mut rec = match expired {
        true => None,
        false => state.records.get(holder).copied(),
    };
    let existed = rec.is_some();
    let stale = matches!((op, rec), (Op::Sync { aseq, .. }, Some(r)) if r.aseq > *aseq);
    if let (Op::Sync { count, .. }, false) = (op, stale) {
        let old = rec.map_or(0, |r| r.count);
        if total.saturating_sub(old) + count > MAX_VALUE {
            return Err(InvalidArgument("count"));
        }
    }
    // Write: reclaim, then the op.
    for id in &due {
        state.records.remove(id);
    }
    let expiry = |ttl_us: u64| (now_us + ttl_us).min(MAX_TIME_US);
    let mut granted = 0;
    match *op {
        Op::Acquire {
            want,
            min,
            limit,
            ttl_us,
            aseq,
            rseq,
            ..
        } => {
            let avail = limit.saturating_sub(total);
            if avail >= min {
                granted = want.min(avail);
            }
            if granted > 0 {
                let r = rec.get_or_insert(Holder {
                    count: 0,
                    aseq: 0,
                    rseq,
                    expires_us: 0,
                });
                r.count += granted;
                r.aseq = r.aseq.max(aseq);
                total += granted;
            }
            if let Some(r) = &mut rec {
                r.expires_us = expiry(ttl_us);
            }
        }
        Op::Release { n, rseq, .. } => {
            if let Some(r) = rec.as_mut().filter(|r| rseq > r.rseq) {
                granted = n.min(r.count);
                r.count -= granted;
                r.rseq = rseq;
                total = total.saturating_sub(granted);
                if r.count == 0 {
                    rec = None;
                }
            }
        }
        Op::Sync {
            count,
            ttl_us,
            aseq,
            rseq,
            ..
        } => {
            if stale {
                if let Some(r) = &mut rec {
                    r.expires_us = expiry(ttl_us);
                }
            } else {
                granted = 1;
                let (old, a, s) = rec.map_or((0, aseq, rseq), |r| {
                    (r.count, r.aseq.max(aseq), r.rseq.max(rseq))
                });
                total = total.saturating_sub(old) + count;
                rec = (count > 0).then_some(Holder {
                    count,
                    aseq: a,
                    rseq: s,
                    expires_us: expiry(ttl_us),
                });
            }
        }
        Op::Peek { .. } => {}
    }
    if !holder.is_empty() {
        match rec {
            Some(r) => {
                state.records.insert(holder.to_owned(), r);
            }
            None => {
                state.records.remove(holder);
            }
        }
    }
    if state.records.is_empty() {
        total = 0;
    }
    state.total = total;
    Ok(Reply {
        granted,
        in_use: total,
        held: rec.map_or(0, |r| r.count),
        existed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: u64 = 1_000;

    fn acquire(st: &mut Holders, holder: &str, want: u64, min: u64, now: u64) -> Reply {
        let op = Op::Acquire {
            holder,
            want,
            min,
            limit: 5,
            ttl_us: TTL,
            aseq: 1,
            rseq: 0,
        };
        step(st, &op, now).unwrap()
    }

    #[test]
    fn grants_up_to_the_limit_all_or_nothing_below_min() {
        let mut st = Holders::default();
        assert_eq!(acquire(&mut st, "a", 3, 3, 0).granted, 3);
        assert_eq!(acquire(&mut st, "b", 3, 3, 0).granted, 0, "only 2 free");
        let r = acquire(&mut st, "b", 3, 1, 0);
        assert_eq!((r.granted, r.in_use, r.held, r.existed), (2, 5, 2, false));
        assert!(!st.records.is_empty());
        assert_eq!(st.total, 5);
    }

    #[test]
    fn an_expired_holder_is_reclaimed_at_its_expiry_and_not_before() {
        let mut st = Holders::default();
        acquire(&mut st, "a", 5, 5, 0);
        assert_eq!(acquire(&mut st, "b", 1, 1, TTL - 1).granted, 0);
        let r = acquire(&mut st, "b", 5, 5, TTL);
        assert_eq!((r.granted, r.in_use), (5, 5));
        assert!(!st.records.contains_key("a"));
    }

    #[test]
    fn releases_apply_once_and_never_touch_another_holder() {
        let mut st = Holders::default();
        acquire(&mut st, "a", 2, 2, 0);
        acquire(&mut st, "b", 2, 2, 0);
        let rel = |holder, n, rseq| Op::Release { holder, n, rseq };
        assert_eq!(step(&mut st, &rel("a", 1, 1), 1).unwrap().granted, 1);
        assert_eq!(
            step(&mut st, &rel("a", 1, 1), 1).unwrap().granted,
            0,
            "retry"
        );
        let r = step(&mut st, &rel("a", 9, 2), 1).unwrap();
        assert_eq!((r.granted, r.held, r.in_use), (1, 0, 2), "never below zero");
        assert!(!st.records.contains_key("a"), "a record at 0 is deleted");
        assert_eq!(step(&mut st, &rel("c", 9, 1), 1).unwrap().granted, 0);
        assert_eq!(st.records["b"].count, 2);
    }

    #[test]
    fn sync_sets_the_count_unless_a_later_acquire_was_applied() {
        let mut st = Holders::default();
        acquire(&mut st, "a", 4, 4, 0);
        let sync = |count, aseq| Op::Sync {
            holder: "a",
            count,
            ttl_us: TTL,
            aseq,
            rseq: 0,
        };
        // Two of the four slots leaked (lost replies): the holder says it holds 2.
        let r = step(&mut st, &sync(2, 1), 10).unwrap();
        assert_eq!((r.granted, r.held, r.in_use), (1, 2, 2));
        assert_eq!(st.records["a"].expires_us, 10 + TTL, "renewed");
        // A sync counted before acquire 1 was sent is stale: renew only.
        let r = step(&mut st, &sync(0, 0), 20).unwrap();
        assert_eq!((r.granted, r.held), (0, 2));
        assert_eq!(st.records["a"].expires_us, 20 + TTL);
        // Zero deletes the record; an absent record is re-registered.
        assert_eq!(step(&mut st, &sync(0, 1), 30).unwrap().held, 0);
        assert!(st.records.is_empty());
        let r = step(&mut st, &sync(7, 1), 40).unwrap();
        assert_eq!((r.held, r.in_use, r.existed), (7, 7, false));
    }

    #[test]
    fn rejects_bad_arguments_without_changing_anything() {
        let mut st = Holders::default();
        acquire(&mut st, "a", 1, 1, 0);
        let before = st.clone();
        let acquire = |want, min, limit, ttl_us, rseq| Op::Acquire {
            holder: "h",
            want,
            min,
            limit,
            ttl_us,
            aseq: 0,
            rseq,
        };
        let overflow = Op::Sync {
            holder: "h",
            count: MAX_VALUE,
            ttl_us: 1,
            aseq: 0,
            rseq: 0,
        };
        let cases = [
            (Op::Peek { holder: "#x" }, "holder"),
            (
                Op::Release {
                    holder: "",
                    n: 0,
                    rseq: 0,
                },
                "holder",
            ),
            (acquire(0, 1, 5, TTL, 0), "want"),
            (acquire(2, 3, 5, TTL, 0), "min"),
            (acquire(2, 1, 0, TTL, 0), "limit"),
            (acquire(2, 2, 1, TTL, 0), "min"),
            (acquire(2, 1, 5, 0, 0), "ttl_us"),
            (acquire(2, 1, 5, TTL, MAX_VALUE + 1), "rseq"),
            (overflow, "count"),
        ];
        for (op, what) in cases {
            assert_eq!(step(&mut st, &op, 5), Err(InvalidArgument(what)), "{op:?}");
            assert_eq!(st, before);
        }
        let long = "x".repeat(MAX_NODE_LEN + 1);
        let peek = Op::Peek { holder: &long };
        assert_eq!(step(&mut st, &peek, 0), Err(InvalidArgument("holder")));
        let peek = Op::Peek { holder: "" };
        assert_eq!(
            step(&mut st, &peek, MAX_TIME_US + 1),
            Err(InvalidArgument("now_us"))
        );
    }
}
