//! The worker's evictions: a key idle past its time goes at a sweep, and at the cap the
//! least recently used make room for new ones; either way its tokens go back to the fleet.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::Ordering;

use super::super::name::bucket_name;
use super::super::shared::count;
use super::super::state::{KeyState, QUEUED};
use super::Worker;
use crate::store::LeaseStore;

impl<K, S, H> Worker<K, S, H>
where
    K: Hash + Eq + Clone + Display + Send + Sync + 'static,
    S: LeaseStore,
    H: BuildHasher + Clone + Send + Sync + 'static,
{
    /// Removes `key` if it has no lease queued and `still` holds; queues its tokens for
    /// release. Under the shard's lock no caller holds the state, so nothing is spent
    /// after this takes the tokens.
    pub(super) fn evict(&mut self, key: &K, still: impl FnOnce(&KeyState) -> bool) -> bool {
        let removed = self
            .s
            .map
            .remove_if(key, |state| state.flags() & QUEUED == 0 && still(state));
        let Some((key, mut state)) = removed else {
            return false;
        };
        self.s.live.fetch_sub(1, Ordering::Relaxed);
        // Its fallback rate word, if the store failed while it lived (created under the
        // key's shard lock, so it is there by now if ever).
        if !self.s.fallback_words.is_empty() {
            self.s.fallback_words.remove_if(&key, |_| true);
        }
        let tokens = state.take_all();
        if tokens > 0 {
            self.give_back(bucket_name(&self.s.name, &key), tokens);
        }
        true
    }

    /// Evicts keys idle for the TTL; gives back the tokens of keys idle for
    /// `give_back_after`.
    pub(super) fn sweep(&mut self) {
        let tick = self.s.tick();
        let (ttl, give_back) = (self.s.ttl_ticks, self.s.give_back_ticks);
        let now_ns = self.s.now_ns();
        let idle = |state: &KeyState| tick.saturating_sub(state.last_use());
        let mut expired = Vec::new();
        let mut holding = Vec::new();
        self.s.map.for_each(|key, state| {
            state.forget_old_block(now_ns);
            if state.flags() & QUEUED != 0 {
                return;
            }
            if idle(state) >= ttl {
                expired.push(key.clone());
            } else if idle(state) >= give_back && state.tokens() > 0 {
                holding.push(key.clone());
            }
        });
        for key in expired {
            if self.evict(&key, |state| idle(state) >= ttl) {
                count(&self.s.counters.evicted_idle, 1);
            }
        }
        for key in holding {
            let tokens = match self.s.map.get(&key) {
                Some(mut state) if idle(&state) >= give_back => state.take_all(),
                _ => 0,
            };
            if tokens > 0 {
                self.give_back(bucket_name(&self.s.name, &key), tokens);
            }
        }
        // A flood's keys gone, the tables they filled shrink (`map.rs`: no caller waits long).
        self.s.map.shrink();
        self.s.fallback_words.shrink();
    }

    /// At the cap: evicts the `max_keys / 16` least recently used keys (never-used keys
    /// first). Two passes over the map: a histogram of eviction ranks, then the victims.
    pub(super) fn make_room(&mut self) {
        if self.s.live.load(Ordering::Relaxed) < self.s.max_keys {
            return; // a sweep made room meanwhile
        }
        let target = (self.s.max_keys / 16).max(1);
        let mut ranks: BTreeMap<u64, usize> = BTreeMap::new();
        self.s.map.for_each(|_, state| {
            if state.flags() & QUEUED == 0 {
                *ranks.entry(state.eviction_rank()).or_default() += 1;
            }
        });
        // The lowest ranks that add up to `target`: all below `threshold`, and `at_threshold`
        // of the keys at it.
        let (mut threshold, mut at_threshold, mut below) = (u64::MAX, usize::MAX, 0);
        for (&rank, &count) in &ranks {
            if below + count >= target {
                (threshold, at_threshold) = (rank, target - below);
                break;
            }
            below += count;
        }
        let mut victims = Vec::with_capacity(target);
        self.s.map.for_each(|key, state| {
            let rank = state.eviction_rank();
            if victims.len() >= target || state.flags() & QUEUED != 0 || rank > threshold {
                return;
            }
            if rank == threshold {
                if at_threshold == 0 {
                    return;
                }
                at_threshold -= 1;
            }
            victims.push(key.clone());
        });
        for key in victims {
            if self.evict(&key, |state| state.eviction_rank() <= threshold) {
                count(&self.s.counters.evicted_at_cap, 1);
            }
        }
    }
}
