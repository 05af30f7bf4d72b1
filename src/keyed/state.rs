//! One key's local state: 32 bytes of atomics, 4-byte aligned, stored inline beside the key
//! in the keyed limiter's map (`map.rs`): a 40-byte entry with a `u64` key, 52 with an
//! `IpAddr` (17 bytes; 56 if the state were 8-byte aligned).
//!
//! Callers touch only the first 20 bytes on a hit: `tokens` (a load and a store), `last_use` and `flags`
//! (a load each, and a store only when they change: once per tick and once per key) and
//! `low_water` (a load). Everything else is read on the denial path or written by the worker.
//! The rate word of [`FailurePolicy::LocalFallback`](crate::FailurePolicy) is not here: it is
//! used only while the store fails, so it lives in a side map (`Shared::fallback_words`).
//!
//! The token count is 64 bits kept as two 32-bit halves: every access holds the shard's lock
//! (below), so the count needs no single atomic word, and the halves keep the state 4-byte
//! aligned. To fit, three values are narrower than a word: the largest denied request shares
//! the flags word (27 bits, saturating: the request in hand still sizes its own lease);
//! `granted_at_ms` is a wrapping millisecond clock (demand is measured over far less than 49
//! days); `blocked_until_us` a wrapping microsecond clock, valid while [`BLOCKED`] is set, so a
//! block is at most [`MAX_BLOCK`] long (a key refused for longer asks the store again then, and
//! is refused again) and the sweep clears blocks that ended long ago
//! ([`forget_old_block`](KeyState::forget_old_block)) before the clock can wrap onto them.
//!
//! # Memory ordering
//!
//! Every field is `Relaxed`. A state is only ever reached through its map shard's mutex
//! (`map.rs`), callers and worker alike, so every access to it is ordered by that lock:
//! `tokens` is conserved because a take, a grant and a give back (each a load and a store of
//! both halves) never overlap, and nothing else is published through it. The fields are
//! atomics so that a value can be shared by reference (`&KeyState`) without `unsafe` code; a
//! read of `tokens` outside the lock could see halves of two counts, and nothing reads it
//! there. `flags`, `last_use` and the worker's fields are hints: a caller that sees a
//! stale value requests a lease once too often or too late, and the next call corrects it (a
//! caller that sees [`BLOCKED`] with the previous block's time reads an older block, the same
//! kind of staleness). No caller ever waits on a flag (async callers have their own reply
//! channel), so there is no lost-wake-up pattern to order. Eviction removes the state under
//! the shard's lock, after every caller's last hold of it; the lock's acquire and release
//! order its reads after every caller's last write, and no caller can reach it afterwards.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// A lease for the key is queued or in flight (at most one per key from sync callers).
pub(crate) const QUEUED: u32 = 1;
/// A caller got tokens of this key at least once (evicted last under a flood).
pub(crate) const USED: u32 = 2;
/// The worker granted this key tokens at least once (`granted_at_ms` is valid).
pub(crate) const GRANTED: u32 = 4;
/// The key is blocked (`blocked_until_us` is valid).
pub(crate) const BLOCKED: u32 = 8;
/// The block is the store's refusal, not a failing store's back-off.
pub(crate) const REFUSED: u32 = 16;
/// The flags' bits of the flags word; the largest denied request is above them.
const FLAG_BITS: u32 = 5;
const FLAG_MASK: u32 = (1 << FLAG_BITS) - 1;
/// The largest denied request the flags word holds.
const MAX_DENIED: u64 = (u32::MAX >> FLAG_BITS) as u64;
/// Longest block kept: half the range of the wrapping microsecond clock is 35 minutes.
pub(crate) const MAX_BLOCK: Duration = Duration::from_secs(30 * 60);
/// A block that ended this long ago is forgotten by the sweep (see the module docs).
const FORGET_BLOCK_AFTER: Duration = Duration::from_secs(60);

/// One key's state.
#[derive(Debug, Default)]
#[repr(C)] // the fields a hit reads first, together
pub(crate) struct KeyState {
    /// Leased tokens not yet spent: the low and the high 32 bits.
    tokens: [AtomicU32; 2],
    /// The tick of the last hit (see `mod.rs`: the worker's coarse clock).
    last_use: AtomicU32,
    /// [`QUEUED`], [`USED`], [`GRANTED`], [`BLOCKED`], [`REFUSED`] in the low [`FLAG_BITS`];
    /// above them the largest request denied since the worker last leased (saturating at
    /// [`MAX_DENIED`]).
    flags: AtomicU32,
    /// Request a lease when a hit leaves fewer tokens than this (0: only when denied).
    low_water: AtomicU32,
    /// Worker only: tokens held right after the last grant, plus any handed to a waiter
    /// (saturating). What is missing at the next lease was spent.
    after_grant: AtomicU32,
    /// Worker only: ms since origin of the last grant (wrapping; valid with [`GRANTED`]).
    granted_at_ms: AtomicU32,
    /// Until when (µs since the limiter's origin, wrapping; valid with [`BLOCKED`]) the store
    /// said no lease can succeed, or the circuit said not to try: callers are denied locally
    /// until then.
    blocked_until_us: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<KeyState>() == 32);
const _: () = assert!(std::mem::align_of::<KeyState>() == 4);

fn saturate(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The wrapping microsecond clock at `ns`.
fn micros(ns: u64) -> u32 {
    // Truncated on purpose: a wrapping clock.
    (ns / 1_000) as u32
}

impl KeyState {
    /// A new key, last used at `tick`, with `flags`.
    pub(crate) fn new(tick: u32, flags: u32) -> Self {
        let state = KeyState::default();
        state.last_use.store(tick, Ordering::Relaxed);
        state.flags.store(flags, Ordering::Relaxed);
        state
    }

    /// The token count. Every caller holds the state's shard lock (see the module docs).
    #[inline]
    fn load_tokens(&self) -> u64 {
        let [low, high] = &self.tokens;
        u64::from(low.load(Ordering::Relaxed)) | u64::from(high.load(Ordering::Relaxed)) << 32
    }

    /// Sets the token count, under the state's shard lock.
    #[inline]
    fn store_tokens(&self, n: u64) {
        let [low, high] = &self.tokens;
        // Truncated on purpose: the two halves.
        low.store(n as u32, Ordering::Relaxed);
        high.store((n >> 32) as u32, Ordering::Relaxed);
    }

    /// Takes `n` tokens and returns what is left, or `None` if there are fewer. The caller
    /// holds the state's shard lock, so no other change to `tokens` can come between the
    /// load and the store (see the module docs).
    #[inline]
    pub(crate) fn take(&self, n: u64) -> Option<u64> {
        let left = self.load_tokens().checked_sub(n)?;
        self.store_tokens(left);
        Some(left)
    }

    /// Records a hit at `tick`: stores only what changed, so a busy key's line is not
    /// written again on every call.
    #[inline]
    pub(crate) fn touch(&self, tick: u32) {
        self.seen(tick);
        if self.flags.load(Ordering::Relaxed) & USED == 0 {
            self.flags.fetch_or(USED, Ordering::Relaxed);
        }
    }

    /// Records a call at `tick`, admitted or not: the key is in use.
    #[inline]
    pub(crate) fn seen(&self, tick: u32) {
        if self.last_use.load(Ordering::Relaxed) != tick {
            self.last_use.store(tick, Ordering::Relaxed);
        }
    }

    /// Whether a hit that left `left` tokens should request the next lease.
    #[inline]
    pub(crate) fn below_low_water(&self, left: u64) -> bool {
        left < u64::from(self.low_water.load(Ordering::Relaxed))
    }

    /// Tokens held now.
    pub(crate) fn tokens(&self) -> u64 {
        self.load_tokens()
    }

    /// Takes every token (to give them back); none can be spent afterwards.
    pub(crate) fn take_all(&self) -> u64 {
        self.after_grant.store(0, Ordering::Relaxed);
        let all = self.load_tokens();
        self.store_tokens(0);
        all
    }

    /// Sets [`QUEUED`]; true if this call set it (and must queue the lease).
    pub(crate) fn mark_queued(&self) -> bool {
        self.flags.load(Ordering::Relaxed) & QUEUED == 0
            && self.flags.fetch_or(QUEUED, Ordering::Relaxed) & QUEUED == 0
    }

    /// Clears [`QUEUED`].
    pub(crate) fn unqueue(&self) {
        self.flags.fetch_and(!QUEUED, Ordering::Relaxed);
    }

    /// The flags.
    pub(crate) fn flags(&self) -> u32 {
        self.flags.load(Ordering::Relaxed) & FLAG_MASK
    }

    /// The tick of the last hit (or of creation).
    pub(crate) fn last_use(&self) -> u32 {
        self.last_use.load(Ordering::Relaxed)
    }

    /// Eviction order: keys never used first, then by last use (lower goes first).
    pub(crate) fn eviction_rank(&self) -> u64 {
        let used = u64::from(self.flags() & USED != 0);
        (used << 32) | u64::from(self.last_use())
    }

    /// Remembers a denied request of `n` tokens, so the next lease takes at least that many.
    pub(crate) fn note_denied(&self, n: u64) {
        let n = n.min(MAX_DENIED) as u32;
        let denied = |word: u32| word >> FLAG_BITS;
        if denied(self.flags.load(Ordering::Relaxed)) < n {
            let _ = self
                .flags
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |word| {
                    (denied(word) < n).then_some((word & FLAG_MASK) | (n << FLAG_BITS))
                });
        }
    }

    /// The largest request denied since the last call.
    pub(crate) fn take_denied(&self) -> u64 {
        u64::from(self.flags.fetch_and(FLAG_MASK, Ordering::Relaxed) >> FLAG_BITS)
    }

    /// The end of the block, in ns since origin, read at `now_ns` (`None` if not blocked).
    fn block_end(&self, now_ns: u64) -> Option<u64> {
        if self.flags() & BLOCKED == 0 {
            return None;
        }
        let until = self.blocked_until_us.load(Ordering::Relaxed);
        // Signed distance on the wrapping clock: blocks are shorter than half its range.
        let ahead = i64::from(until.wrapping_sub(micros(now_ns)) as i32);
        let end_us = (now_ns / 1_000) as i64 + ahead;
        Some(end_us.max(0) as u64 * 1_000)
    }

    /// How long callers are still denied locally at `now_ns` (zero if not blocked).
    pub(crate) fn blocked_for(&self, now_ns: u64) -> Duration {
        let end = self.block_end(now_ns).unwrap_or(0);
        Duration::from_nanos(end.saturating_sub(now_ns))
    }

    /// Whether the store refused this key (a block, not a back-off after a store error) that
    /// ended less than `window` before `now_ns` or has not ended yet.
    pub(crate) fn refused_within(&self, window: Duration, now_ns: u64) -> bool {
        self.flags() & REFUSED != 0 && self.blocked_within(window, now_ns)
    }

    /// Whether a block ended less than `window` before `now_ns` or has not ended yet.
    fn blocked_within(&self, window: Duration, now_ns: u64) -> bool {
        self.block_end(now_ns)
            .is_some_and(|end| end.saturating_add(crate::time::nanos(window)) > now_ns)
    }

    /// Denies callers locally until `until_ns` (at most [`MAX_BLOCK`] after `now_ns`), while
    /// the store is failing: no refusal. Worker only.
    pub(crate) fn block_until(&self, until_ns: u64, now_ns: u64) {
        self.set_block(until_ns, now_ns);
        if self.flags() & REFUSED != 0 {
            self.flags.fetch_and(!REFUSED, Ordering::Relaxed);
        }
    }

    /// Denies callers locally until `until_ns` (at most [`MAX_BLOCK`] after `now_ns`), the
    /// store having refused the key until then. Worker only.
    pub(crate) fn refuse_until(&self, until_ns: u64, now_ns: u64) {
        self.set_block(until_ns, now_ns);
        self.flags.fetch_or(REFUSED, Ordering::Relaxed);
    }

    fn set_block(&self, until_ns: u64, now_ns: u64) {
        let until = until_ns.min(now_ns.saturating_add(crate::time::nanos(MAX_BLOCK)));
        self.blocked_until_us
            .store(micros(until.div_ceil(1_000) * 1_000), Ordering::Relaxed);
        self.flags.fetch_or(BLOCKED, Ordering::Relaxed);
    }

    /// Forgets a block that ended long before `now_ns`, before the wrapping clock could make
    /// it look current again. Worker only (the sweep).
    pub(crate) fn forget_old_block(&self, now_ns: u64) {
        if self.flags() & BLOCKED != 0 && !self.blocked_within(FORGET_BLOCK_AFTER, now_ns) {
            self.flags
                .fetch_and(!(BLOCKED | REFUSED), Ordering::Relaxed);
        }
    }

    /// Adds `n` tokens.
    pub(crate) fn add(&self, n: u64) {
        self.store_tokens(self.load_tokens() + n);
    }

    /// Adds a grant at `now_ms` (`now_ns`), of which `to_waiter` went straight to a waiting
    /// caller and the rest into the key; sets the next low-water mark and ends any block
    /// (remembering when it ended, for [`refused_within`](Self::refused_within)). Worker only.
    pub(crate) fn grant(
        &self,
        rest: u64,
        to_waiter: u64,
        low_water: u64,
        now_ms: u32,
        now_ns: u64,
    ) {
        let held = self.load_tokens() + rest;
        self.store_tokens(held);
        self.after_grant
            .store(saturate(held + to_waiter), Ordering::Relaxed);
        self.granted_at_ms.store(now_ms, Ordering::Relaxed);
        self.low_water.store(saturate(low_water), Ordering::Relaxed);
        // Not blocked from now on; a block that was ended early reads as ending now (only the
        // worker writes the block, so a load and a store suffice).
        if self.block_end(now_ns).is_some_and(|end| end > now_ns) {
            self.blocked_until_us
                .store(micros(now_ns.div_ceil(1_000) * 1_000), Ordering::Relaxed);
        }
        let used = if to_waiter > 0 { USED } else { 0 };
        self.flags.fetch_or(GRANTED | used, Ordering::Relaxed);
    }

    /// Tokens per second spent since the last grant (0 if never granted): the key's demand,
    /// as the worker sees it at `now_ms` without any counter on the hot path.
    pub(crate) fn demand(&self, now_ms: u32) -> f64 {
        if self.flags() & GRANTED == 0 {
            return 0.0;
        }
        let after = u64::from(self.after_grant.load(Ordering::Relaxed));
        let spent = after.saturating_sub(self.tokens());
        let elapsed_ms = now_ms
            .wrapping_sub(self.granted_at_ms.load(Ordering::Relaxed))
            .max(1);
        spent as f64 * 1_000.0 / f64::from(elapsed_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_grant_and_give_back_conserve_tokens() {
        let s = KeyState::new(7, QUEUED);
        assert_eq!(s.take(1), None);
        s.grant(5, 0, 2, 1_000, 1_000_000_000);
        assert_eq!(s.take(3), Some(2));
        assert!(!s.below_low_water(2));
        assert!(s.below_low_water(1));
        assert_eq!(s.take(3), None);
        assert_eq!(s.take_all(), 2);
        assert_eq!(s.tokens(), 0);
    }

    #[test]
    fn demand_is_what_was_spent_since_the_grant() {
        let s = KeyState::new(0, 0);
        assert_eq!(s.demand(5_000), 0.0, "never granted: no demand");
        s.grant(10, 2, 0, 1_000, 1_000_000_000);
        s.take(4).unwrap();
        // 2 handed to a waiter + 4 taken, over 500 ms.
        assert_eq!(s.demand(1_500), 12.0);
        // The millisecond clock wraps.
        let w = KeyState::new(0, 0);
        w.grant(1, 0, 0, u32::MAX - 99, 1);
        w.take(1).unwrap();
        assert_eq!(w.demand(100), 5.0);
    }

    #[test]
    fn flags_and_eviction_rank() {
        let s = KeyState::new(3, 0);
        assert!(s.mark_queued());
        assert!(!s.mark_queued(), "only the first caller queues");
        s.unqueue();
        assert!(s.mark_queued());
        let fresh = s.eviction_rank();
        s.touch(2);
        assert!(
            s.eviction_rank() > fresh,
            "a used key is evicted after unused ones"
        );
        assert_eq!(s.last_use(), 2);
        s.note_denied(9);
        s.note_denied(4);
        assert_eq!(s.take_denied(), 9);
        assert_eq!(s.take_denied(), 0);
        s.block_until(1_000, 0);
        assert_eq!(s.blocked_for(400), Duration::from_nanos(600));
        assert_eq!(s.blocked_for(2_000), Duration::ZERO);
    }

    #[test]
    fn a_block_ended_by_a_grant_stays_recent_for_the_window() {
        let s = KeyState::new(0, 0);
        let second = Duration::from_secs(1);
        assert!(!s.refused_within(second, 5_000_000_000), "never refused");
        s.block_until(9_000_000_000, 0);
        assert!(
            !s.refused_within(second, 1_000_000_000),
            "a store error's back-off is no refusal"
        );
        s.refuse_until(9_000_000_000, 0);
        assert!(s.refused_within(second, 1_000_000_000), "blocked now");
        // Granted at 2 s: the block ends early, and reads as ending then.
        s.grant(1, 0, 0, 2_000, 2_000_000_000);
        assert_eq!(s.blocked_for(2_000_000_000), Duration::ZERO);
        assert!(s.refused_within(second, 2_999_999_999));
        assert!(!s.refused_within(second, 3_000_000_000));
    }
    #[test]
    fn token_counts_above_32_bits_survive_the_halves() {
        let s = KeyState::new(0, 0);
        let big = (1u64 << 52) + 7;
        s.grant(big, 0, 0, 0, 0);
        assert_eq!(s.tokens(), big);
        assert_eq!(s.take(8), Some(big - 8));
        s.add(u64::from(u32::MAX));
        assert_eq!(s.take_all(), big - 8 + u64::from(u32::MAX));
        assert_eq!(s.tokens(), 0);
    }

    #[test]
    fn narrow_fields_keep_their_meaning() {
        let s = KeyState::new(0, 0);
        // The largest denied request shares the flags word without disturbing the flags.
        assert!(s.mark_queued());
        s.note_denied(u64::MAX);
        s.note_denied(3);
        assert_eq!(s.flags(), QUEUED);
        assert_eq!(s.take_denied(), MAX_DENIED, "saturates");
        assert_eq!((s.flags(), s.take_denied()), (QUEUED, 0));
        // Days after the origin (the microsecond clock has wrapped many times), a block far
        // ahead is cut to `MAX_BLOCK` and reads right.
        let day = 86_400_000_000_000u64;
        let now = 3 * day + 123;
        s.refuse_until(now + day, now);
        let left = s.blocked_for(now);
        assert!(
            left >= MAX_BLOCK && left < MAX_BLOCK + Duration::from_micros(1),
            "{left:?}"
        );
        assert_eq!(s.flags(), QUEUED | BLOCKED | REFUSED);
        // Ended 61 s ago: still a refusal for a long enough window, then forgotten by the
        // sweep before the clock can wrap onto it.
        let later = now + crate::time::nanos(MAX_BLOCK) + 61_000_000_000;
        assert_eq!(s.blocked_for(later), Duration::ZERO);
        assert!(s.refused_within(Duration::from_secs(120), later));
        s.forget_old_block(later - 2_000_000_000);
        assert_ne!(s.flags() & BLOCKED, 0, "ended 59 s before: kept");
        s.forget_old_block(later);
        assert_eq!(s.flags(), QUEUED);
        assert!(!s.refused_within(Duration::from_secs(120), later));
    }
}
