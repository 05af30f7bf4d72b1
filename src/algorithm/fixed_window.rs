//! The fixed window's step: the Rust twin of `lua/fixed_window.lua`, line by line.
//!
//! A window opens with the first lease after the previous one ended and lasts one period; at
//! most `rate` tokens are counted in it. A release gives tokens back only to the window they
//! were leased in (its start is the lease reply's `at`), and only while it is open. See the
//! script's header for the protocol.

use super::{keep_for, validate, Op, Persist, Reply};
use crate::algorithm::token_bucket::InvalidArgument;
use crate::quota::{Quota, MAX_VALUE};

/// The stored window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// When the window opened, µs on the store's clock.
    pub start_us: u64,
    /// Tokens counted in it (≥ 1; a window that counts nothing is not stored).
    pub count: u64,
}

/// Runs one step on `state` (absent: no window open). On error nothing changes.
///
/// # Errors
/// The script's argument errors.
pub fn step(
    state: &mut Option<State>,
    quota: &Quota,
    op: Op,
    now_us: u64,
) -> Result<(Reply, Persist), InvalidArgument> {
    validate(quota, &op, now_us, true)?;
    let (rate, period, now) = (quota.rate(), quota.period_us(), now_us);
    // The open window, if any. One that starts after `now` (the clock went back) is open.
    let open = state.filter(|s| {
        s.start_us <= MAX_VALUE
            && (1..=MAX_VALUE).contains(&s.count)
            && now.saturating_sub(s.start_us) < period
    });
    let (mut start, mut count) = open.map_or((None, 0), |s| (Some(s.start_us), s.count));

    let (mut granted, mut retry, mut changed) = (0, 0, false);
    match op {
        Op::Lease { want, min } => {
            if rate.saturating_sub(count) >= min {
                granted = want.min(rate - count);
                start.get_or_insert(now);
                count += granted;
                changed = true;
            }
        }
        Op::Release { tokens, at } => {
            if start.is_some() && at == start && tokens > 0 {
                count -= tokens.min(count);
                changed = true;
            }
        }
        Op::Peek => {}
    }

    let left = rate.saturating_sub(count);
    // The end of the open window, from now.
    let end = |start: Option<u64>| start.map_or(0, |s| s + period - now);
    if matches!(op, Op::Lease { min, .. } if left < min) {
        retry = end(start);
    }
    let reset = if count > 0 { end(start) } else { 0 };
    let persist = match (changed, count) {
        (false, _) => Persist::Unchanged,
        (true, 0) => {
            *state = None;
            Persist::Delete
        }
        (true, count) => {
            *state = Some(State {
                start_us: start.unwrap_or(now),
                count,
            });
            keep_for(reset)
        }
    };
    let at_us = match (count, start) {
        (1.., Some(s)) => s,
        _ => now,
    };
    let reply = Reply {
        granted,
        remaining: left,
        retry_after_us: retry,
        reset_after_us: reset,
        at_us,
    };
    Ok((reply, persist))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::algorithm::lease_with;

    #[test]
    fn a_window_admits_its_rate_then_waits_for_its_end() {
        let q = Quota::new(10, Duration::from_secs(1)).unwrap();
        let mut st = None;
        let r = lease_with(step, &mut st, &q, 4, 1, 500);
        assert_eq!((r.granted, r.remaining, r.at_us), (4, 6, 500));
        assert_eq!(r.reset_after_us, 1_000_000);
        let r = lease_with(step, &mut st, &q, 10, 7, 600_500);
        assert_eq!((r.granted, r.remaining), (0, 6), "all or nothing below min");
        assert_eq!(r.retry_after_us, 400_000, "until the window ends");
        assert_eq!(lease_with(step, &mut st, &q, 6, 6, 999_999).granted, 6);
        assert_eq!(
            lease_with(step, &mut st, &q, 10, 10, 1_000_500).granted,
            10,
            "a new window"
        );
    }

    #[test]
    fn a_release_goes_back_to_its_own_window_only() {
        let q = Quota::new(10, Duration::from_secs(1)).unwrap();
        let mut st = None;
        let first = lease_with(step, &mut st, &q, 8, 8, 0);
        let give = |st: &mut Option<State>, at, now| {
            step(st, &q, Op::Release { tokens: 5, at }, now).unwrap()
        };
        // Wrong window: nothing changes.
        let (r, p) = give(&mut st, Some(first.at_us + 1), 10);
        assert_eq!((r.remaining, p), (2, Persist::Unchanged));
        let (r, _) = give(&mut st, Some(first.at_us), 10);
        assert_eq!(r.remaining, 7);
        // The next window opened: a late release of the first window's tokens is ignored.
        assert_eq!(lease_with(step, &mut st, &q, 10, 10, 1_000_000).granted, 10);
        let (r, p) = give(&mut st, Some(first.at_us), 1_000_001);
        assert_eq!((r.remaining, p), (0, Persist::Unchanged));
    }

    #[test]
    fn denials_and_peeks_write_nothing_and_releasing_everything_deletes() {
        let q = Quota::per_second(3).unwrap();
        let mut st = None;
        let r = lease_with(step, &mut st, &q, 3, 3, 0);
        assert_eq!(
            step(&mut st, &q, Op::Peek, 1).unwrap().1,
            Persist::Unchanged
        );
        let (_, p) = step(&mut st, &q, Op::Lease { want: 1, min: 1 }, 2).unwrap();
        assert_eq!(p, Persist::Unchanged);
        let release = Op::Release {
            tokens: 9,
            at: Some(r.at_us),
        };
        let (r, p) = step(&mut st, &q, release, 3).unwrap();
        assert_eq!((r.remaining, r.reset_after_us, p), (3, 0, Persist::Delete));
        assert!(st.is_none());
    }

    #[test]
    fn rejects_bad_arguments() {
        let q = Quota::per_second(3).unwrap();
        let mut st = None;
        let e = |st: &mut Option<State>, q: &Quota, op, now| step(st, q, op, now).unwrap_err().0;
        let bursty = q.with_burst(4).unwrap();
        assert_eq!(e(&mut st, &bursty, Op::Peek, 0), "burst");
        assert_eq!(e(&mut st, &q, Op::Lease { want: 2, min: 3 }, 0), "min");
        let no_at = Op::Release {
            tokens: 1,
            at: None,
        };
        assert_eq!(e(&mut st, &q, no_at, 0), "at");
        assert_eq!(e(&mut st, &q, Op::Peek, MAX_VALUE + 1), "now_us");
        assert!(st.is_none());
    }
}
