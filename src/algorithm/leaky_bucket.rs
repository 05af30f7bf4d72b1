//! The leaky bucket's step (GCRA): the Rust twin of `lua/leaky_bucket.lua`, line by line.
//!
//! Document 004's funnel: `burst` tokens of capacity, leaking `rate` per `period`. The whole
//! state is the theoretical arrival time (TAT), when the funnel will be empty; its content at
//! `now` is `TAT − now`. In the token bucket's fixed point (one token is `scale` units, one µs
//! `inc` units) the emission interval is exactly `scale` units, so the TAT is kept as whole
//! microseconds plus a fraction below one microsecond, with no drift. See the script's header.

use super::{keep_for, validate, Op, Persist, Reply};
use crate::algorithm::token_bucket::InvalidArgument;
use crate::quota::{Quota, MAX_VALUE};

/// The stored funnel: its theoretical arrival time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// The TAT, whole µs on the store's clock.
    pub tat_us: u64,
    /// Its fraction of a µs, in units (below `inc`).
    pub frac: u64,
}

/// Runs one step on `state` (absent: an empty funnel). On error nothing changes.
///
/// # Errors
/// The script's argument errors.
pub fn step(
    state: &mut Option<State>,
    quota: &Quota,
    op: Op,
    now_us: u64,
) -> Result<(Reply, Persist), InvalidArgument> {
    validate(quota, &op, now_us, false)?;
    let (scale, inc, burst, now) = (quota.scale(), quota.increment(), quota.burst(), now_us);
    let cap = burst * scale;

    // The funnel's content in units: how far the TAT is ahead of now, at most `cap`.
    let mut b = match *state {
        Some(s) if s.tat_us <= 2 * MAX_VALUE && s.frac <= MAX_VALUE && s.tat_us >= now => {
            // A fraction written under another quota counts as less than one microsecond.
            let frac = s.frac.min(inc - 1);
            let ahead = s.tat_us - now;
            if ahead > cap.div_ceil(inc) {
                cap
            } else {
                cap.min(ahead * inc + frac)
            }
        }
        _ => 0,
    };

    let (mut granted, mut retry, mut changed) = (0, 0, false);
    match op {
        Op::Lease { want, min } => {
            let room = (cap - b) / scale;
            if room >= min {
                granted = want.min(room);
                b += granted * scale;
                changed = true;
            }
            let need = min * scale;
            if need > cap - b {
                retry = (need - (cap - b)).div_ceil(inc);
            }
        }
        Op::Release { tokens, .. } if tokens > 0 && b > 0 => {
            b = b.saturating_sub(tokens.min(burst) * scale);
            changed = true;
        }
        _ => {}
    }

    let reset = b.div_ceil(inc);
    let persist = match (changed, b) {
        (false, _) => Persist::Unchanged,
        (true, 0) => {
            *state = None;
            Persist::Delete
        }
        (true, b) => {
            *state = Some(State {
                tat_us: now + b / inc,
                frac: b % inc,
            });
            keep_for(reset)
        }
    };
    let reply = Reply {
        granted,
        remaining: (cap - b) / scale,
        retry_after_us: retry,
        reset_after_us: reset,
        at_us: now,
    };
    Ok((reply, persist))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::algorithm::lease_with;

    #[test]
    fn after_a_burst_grants_are_spaced_one_emission_interval_apart() {
        // 3 per 10 ms (one every 3 333.3 µs), capacity 2.
        let q = Quota::with_parts(3, Duration::from_millis(10), 2).unwrap();
        let mut st = None;
        assert_eq!(lease_with(step, &mut st, &q, 2, 2, 0).granted, 2);
        let r = lease_with(step, &mut st, &q, 1, 1, 0);
        assert_eq!((r.granted, r.retry_after_us), (0, 3_334));
        assert_eq!(r.reset_after_us, 6_667);
        // Three emission intervals are exactly 10 ms: no drift from the fractions.
        let mut admitted = 0;
        for us in 3_000..13_334 {
            admitted += lease_with(step, &mut st, &q, 1, 1, us).granted;
        }
        assert_eq!(
            admitted, 3,
            "at 3 334, 6 667 and 10 000 µs, the next at 13 334"
        );
        assert_eq!(
            st.unwrap(),
            State {
                tat_us: 16_666,
                frac: 2
            }
        );
    }

    #[test]
    fn releases_never_empty_below_empty_and_the_funnel_expires_when_empty() {
        let q = Quota::per_second(10).unwrap();
        let mut st = None;
        let (_, p) = step(&mut st, &q, Op::Lease { want: 4, min: 4 }, 0).unwrap();
        assert_eq!(p, Persist::Keep { ms: 400 + 10_000 });
        let release = Op::Release {
            tokens: 9,
            at: None,
        };
        let (r, p) = step(&mut st, &q, release, 0).unwrap();
        assert_eq!((r.remaining, r.reset_after_us, p), (10, 0, Persist::Delete));
        let (_, p) = step(&mut st, &q, release, 0).unwrap();
        assert_eq!(p, Persist::Unchanged);
    }

    #[test]
    fn a_tat_far_ahead_reads_as_full() {
        let q = Quota::per_second(10).unwrap();
        let mut st = Some(State {
            tat_us: 50_000_000,
            frac: 0,
        });
        let r = lease_with(step, &mut st, &q, 1, 1, 0);
        assert_eq!(
            (r.granted, r.remaining, r.reset_after_us),
            (0, 0, 1_000_000)
        );
    }
}
