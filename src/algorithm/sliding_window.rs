//! The sliding window's step: the Rust twin of `lua/sliding_window.lua`, line by line.
//!
//! Every grant is logged at the time it was made and counts for one period; a lease is served
//! only if the tokens counted stay within `rate`, so no window of one period ever holds more
//! than `rate` grants. Grants made at the same microsecond share one log entry, and the log
//! never goes back in time, so it holds at most `min(rate, period_us)` entries. See the
//! script's header for the protocol.

use std::collections::BTreeMap;

use super::{keep_for, validate, Op, Persist, Reply};
use crate::algorithm::token_bucket::InvalidArgument;
use crate::quota::{Quota, MAX_VALUE};

/// How many of the oldest entries a denial looks at to say when enough tokens will have left.
pub const WALK: usize = 128;

/// The stored log. A state the step never writes is read as the script reads such keys: an
/// entry's tokens outside `1 ..= MAX_VALUE` count as none, and a sum above
/// [`MAX_VALUE`] is recounted from the log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// Tokens granted, by the µs they were logged at (each ≥ 1).
    pub log: BTreeMap<u64, u64>,
    /// Their sum.
    pub sum: u64,
}

/// An entry's tokens as the script reads them: none if out of range.
fn count(n: u64) -> u64 {
    if (1..=MAX_VALUE).contains(&n) {
        n
    } else {
        0
    }
}

/// Runs one step on `state` (absent: an empty log). On error nothing changes.
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
    // Worked on in place (a log can be long); put back as it was if nothing changes.
    let stored = state.is_some();
    let mut st = state.take().unwrap_or_default();

    // Drop what left the window: entries at or before `now - period`.
    let left_window = |t: u64| now >= period && t <= now - period;
    let mut changed = false;
    match st.log.last_key_value() {
        Some((&last, _)) if left_window(last) => {
            st = State::default();
            changed = true;
        }
        Some(_) => {
            if st.sum > MAX_VALUE {
                st.sum = st
                    .log
                    .values()
                    .map(|&n| count(n))
                    .sum::<u64>()
                    .min(MAX_VALUE);
                changed = true;
            }
            while let Some(entry) = st.log.first_entry().filter(|e| left_window(*e.key())) {
                st.sum = st.sum.saturating_sub(count(entry.remove()));
                changed = true;
            }
        }
        None => {}
    }

    let t = st
        .log
        .last_key_value()
        .map_or(now, |(&last, _)| last.max(now));
    let mut granted = 0;
    match op {
        Op::Lease { want, min } if rate.saturating_sub(st.sum) >= min => {
            granted = want.min(rate - st.sum);
            let n = st.log.entry(t).or_default();
            *n = count(*n) + granted;
            st.sum += granted;
            changed = true;
        }
        Op::Release {
            tokens,
            at: Some(at),
        } if tokens > 0 => {
            if let Some(n) = st.log.get_mut(&at) {
                let give = tokens.min(count(*n));
                *n = count(*n) - give;
                if *n == 0 {
                    st.log.remove(&at);
                }
                st.sum = st.sum.saturating_sub(give);
                changed = true;
            }
        }
        _ => {}
    }

    let left = rate.saturating_sub(st.sum);
    let mut retry = 0;
    if let Op::Lease { min, .. } = op {
        if left < min {
            // Until the oldest entries holding `excess` tokens have left.
            let excess = st.sum + min - rate;
            let (mut acc, mut when) = (0, None);
            for (&at, &n) in st.log.iter().take(WALK) {
                acc += count(n);
                when = Some(at);
                if acc >= excess {
                    break;
                }
            }
            retry = when.map_or(0, |w| w.saturating_add(period).saturating_sub(now));
        }
    }
    let newest = st.log.last_key_value().map(|(&t, _)| t);
    let reset = newest.map_or(0, |last| last.saturating_add(period) - now);
    let persist = match (changed, newest) {
        (false, _) => {
            *state = stored.then_some(st);
            Persist::Unchanged
        }
        (true, None) => Persist::Delete,
        (true, Some(_)) => {
            *state = Some(st);
            keep_for(reset)
        }
    };
    let reply = Reply {
        granted,
        remaining: left,
        retry_after_us: retry,
        reset_after_us: reset,
        at_us: t,
    };
    Ok((reply, persist))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::algorithm::lease_with;

    #[test]
    fn grants_count_for_one_period_after_they_were_made() {
        let q = Quota::new(10, Duration::from_secs(1)).unwrap();
        let mut st = None;
        assert_eq!(lease_with(step, &mut st, &q, 6, 1, 0).granted, 6);
        assert_eq!(lease_with(step, &mut st, &q, 4, 1, 500_000).granted, 4);
        let r = lease_with(step, &mut st, &q, 5, 5, 900_000);
        assert_eq!((r.granted, r.remaining), (0, 0));
        assert_eq!(r.retry_after_us, 100_000, "the six of t = 0 leave at 1 s");
        assert_eq!(r.reset_after_us, 600_000, "the log empties at 1.5 s");
        let r = lease_with(step, &mut st, &q, 10, 5, 1_000_000);
        assert_eq!(
            (r.granted, r.remaining),
            (6, 0),
            "no more than 10 in (0, 1 s]"
        );
        assert_eq!(st.as_ref().unwrap().log.len(), 2);
    }

    #[test]
    fn same_microsecond_grants_share_an_entry_and_releases_find_it() {
        let q = Quota::new(10, Duration::from_secs(1)).unwrap();
        let mut st = None;
        let a = lease_with(step, &mut st, &q, 3, 1, 7);
        let b = lease_with(step, &mut st, &q, 2, 1, 7);
        assert_eq!((a.at_us, b.at_us), (7, 7));
        assert_eq!(st.as_ref().unwrap().log.len(), 1);
        let release = |at| Op::Release {
            tokens: 4,
            at: Some(at),
        };
        let (r, p) = step(&mut st, &q, release(8), 9).unwrap();
        assert_eq!((r.remaining, p), (5, Persist::Unchanged), "no entry at 8");
        let (r, _) = step(&mut st, &q, release(7), 9).unwrap();
        assert_eq!(r.remaining, 9);
        // Released after the entry left the window: nothing more is given back.
        let (r, p) = step(&mut st, &q, release(7), 1_000_007).unwrap();
        assert_eq!((r.remaining, p), (10, Persist::Delete));
    }

    #[test]
    fn the_log_never_goes_back_in_time() {
        let q = Quota::new(10, Duration::from_secs(1)).unwrap();
        let mut st = None;
        lease_with(step, &mut st, &q, 1, 1, 1_000);
        let r = lease_with(step, &mut st, &q, 1, 1, 500);
        assert_eq!(r.at_us, 1_000, "logged at the newest entry, not before it");
        assert_eq!(st.as_ref().unwrap().log[&1_000], 2);
    }

    /// A state the step never writes (a sum beyond the largest value, an entry's tokens out of
    /// range, an entry at the end of time) is read as the script reads it, and never
    /// overflows: the sum recounted, such an entry counting none.
    #[test]
    fn a_state_it_never_writes_is_read_as_the_script_reads_it() {
        let q = Quota::new(10, Duration::from_secs(1)).unwrap();
        let corrupt = |log: &[(u64, u64)], sum| {
            Some(State {
                log: log.iter().copied().collect(),
                sum,
            })
        };
        let mut st = corrupt(&[(100, 4)], u64::MAX);
        let r = lease_with(step, &mut st, &q, 10, 1, 200);
        assert_eq!(r.granted, 6, "the sum recounted: 4 in the window");
        assert_eq!(st.as_ref().unwrap().sum, 10);

        let mut st = corrupt(&[(100, u64::MAX), (150, 3)], 3);
        let r = lease_with(step, &mut st, &q, 10, 1, 200);
        assert_eq!(r.granted, 7, "an entry out of range counts none");
        let r = lease_with(step, &mut st, &q, 10, 1, 1_000_160);
        assert_eq!(
            r.granted, 3,
            "t = 100 and 150 left: the 7 of t = 200 remain"
        );

        let mut st = corrupt(&[(u64::MAX, 2)], 2);
        let r = lease_with(step, &mut st, &q, 10, 10, 200);
        assert_eq!((r.granted, r.at_us), (0, u64::MAX));
        assert_eq!(r.retry_after_us, u64::MAX - 200, "saturated, not wrapped");
        assert_eq!(r.reset_after_us, u64::MAX - 200);
    }
}
