//! [`MemoryStore`] running the fixed-window, sliding-window and leaky-bucket twins
//! ([`crate::algorithm`]).
//!
//! Their states live in a map of their own, keyed like the token bucket's (length-prefixed
//! name, then the algorithm's and the client's suffixes), one step at a time under the key's
//! `dashmap` shard lock. Each step says whether it wrote, and how long the state lives, so
//! expiry follows the script's `PEXPIRE` exactly: an expired entry reads as absent.

use std::sync::atomic::Ordering;

use dashmap::mapref::entry::Entry as Slot;

use super::{MemoryStore, SWEEP_EVERY};
use crate::algorithm::{self, Algorithm, Op, Persist, State};
use crate::error::StoreError;
use crate::protocol::{algorithm_key, LeaseReply};
use crate::quota::Quota;

/// One key's state and when it expires (µs on the store's clock).
pub(super) struct Entry {
    state: Option<State>,
    expires_at_us: u64,
}

impl MemoryStore {
    /// One atomic step of `algorithm` on `name`'s budget of `client` (or its fleet-wide one).
    pub(super) fn run_algorithm(
        &self,
        name: &str,
        client: Option<u64>,
        quota: &Quota,
        algorithm: Algorithm,
        op: Op,
    ) -> Result<LeaseReply, StoreError> {
        let key = algorithm_key(&format!("{}:{name}", name.len()), algorithm, client);
        let now = self.now_us();
        let map = &self.inner.algorithms;
        let calls = self.inner.calls.fetch_add(1, Ordering::Relaxed) + 1;
        if calls.is_multiple_of(SWEEP_EVERY) {
            map.retain(|_, e| e.expires_at_us > now);
        }
        let reject = |e: crate::algorithm::token_bucket::InvalidArgument| {
            StoreError::Rejected(e.to_string())
        };
        let (reply, _) = match map.entry(key) {
            Slot::Occupied(mut slot) => {
                let entry = slot.get_mut();
                let mut state = if entry.expires_at_us > now {
                    entry.state.take()
                } else {
                    None
                };
                let result = algorithm::step(algorithm, &mut state, quota, op, now);
                entry.state = state;
                match result {
                    Ok((_, Persist::Keep { ms })) => {
                        entry.expires_at_us = now.saturating_add(ms.saturating_mul(1_000));
                    }
                    Ok((_, Persist::Delete)) => {
                        slot.remove();
                    }
                    _ if entry.state.is_none() => {
                        slot.remove();
                    }
                    _ => {}
                }
                result.map_err(reject)?
            }
            Slot::Vacant(slot) => {
                let mut state = None;
                let result = algorithm::step(algorithm, &mut state, quota, op, now);
                if let Ok((_, Persist::Keep { ms })) = result {
                    slot.insert(Entry {
                        state,
                        expires_at_us: now.saturating_add(ms.saturating_mul(1_000)),
                    });
                }
                result.map_err(reject)?
            }
        };
        Ok(reply.into_lease_reply(quota))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::clock::FakeClock;

    #[test]
    fn states_expire_as_the_scripts_keys_do_and_are_kept_per_algorithm_and_client() {
        let clock = FakeClock::new();
        let store = MemoryStore::with_clock(clock.clone());
        let q = Quota::per_second(10).unwrap();
        let lease = Op::Lease { want: 10, min: 1 };
        for algorithm in [Algorithm::FixedWindow, Algorithm::SlidingWindow] {
            for client in [None, Some(1)] {
                let r = store
                    .run_algorithm("k", client, &q, algorithm, lease)
                    .unwrap();
                assert_eq!(r.granted, 10, "{algorithm} {client:?}: its own budget");
            }
        }
        let r = store.run_algorithm("k", None, &q, Algorithm::LeakyBucket, lease);
        assert_eq!(r.unwrap().granted, 10);
        assert_eq!(store.len(), 5);
        // A denial writes nothing; the windows end after 1 s and the keys 10 s later.
        clock.advance(Duration::from_millis(11_001));
        let peek = store.run_algorithm("k", None, &q, Algorithm::FixedWindow, Op::Peek);
        assert_eq!(peek.unwrap().remaining, 10);
        assert_eq!(
            store.len(),
            4,
            "the expired entry read as absent and was dropped"
        );
        for _ in 0..SWEEP_EVERY {
            let _ = store.run_algorithm("other", None, &q, Algorithm::LeakyBucket, Op::Peek);
        }
        assert_eq!(store.len(), 0, "swept");
    }
}
