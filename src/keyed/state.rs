//! One key's local state: 32 bytes of plain integers, **byte-aligned** (`repr(packed)`), stored
//! inline beside the key in the keyed limiter's map (`map.rs`): a 40-byte entry with a `u64`
//! key (the key's alignment pads it), 49 with an `IpAddr` (17 bytes: no padding at all; a
//! 4-byte-aligned state made it 52, and 56 when the state was 8-byte aligned).
//!
//! Callers touch only the first 20 bytes on a hit: `tokens` (a load and a store), `last_use` and
//! `flags` (a load each, and a store only when they change: once per tick and once per key) and
//! `low_water` (a load). Everything else is read on the denial path or written by the worker.
//! The rate word of [`FailurePolicy::LocalFallback`](crate::FailurePolicy) is not here: it is
//! used only while the store fails, so it lives in a side map (`Shared::fallback_words`).
//!
//! To fit, three values are narrower than a word: the largest denied request shares the flags
//! word (27 bits, saturating: the request in hand still sizes its own lease); `granted_at_ms` is
//! a wrapping millisecond clock (demand is measured over far less than 49 days);
//! `blocked_until_us` a wrapping microsecond clock, valid while [`BLOCKED`] is set, so a block
//! is at most [`MAX_BLOCK`] long (a key refused for longer asks the store again then, and is
//! refused again) and the sweep clears blocks that ended long ago
//! ([`forget_old_block`](KeyState::forget_old_block)) before the clock can wrap onto them.
//!
//! # No atomics: the shard's lock is the synchronisation
//!
//! A state is only ever reached through its map shard's mutex (`map.rs`): a lookup returns a
//! guard that derefs to `&mut KeyState`, a walk over the map hands out `&mut KeyState` under the
//! shard's lock, and eviction moves the state out under it. So every write has the borrow
//! checker's proof that nobody else reads or writes the state meanwhile, and every read sees the
//! last write through the lock's acquire and release — no field needs to be atomic, and none is.
//! (An earlier version used relaxed atomics so that `&KeyState` could be shared: the same loads
//! and stores, but a locked read-modify-write for every flag change, and 4-byte alignment.)
//! `tokens` is conserved because a take, a grant and a give back never overlap (each holds
//! `&mut`); eviction takes the tokens of a state no caller can reach any more.
//!
//! **Why packed.** Unaligned loads and stores cost nothing extra on x86-64 and AArch64 unless
//! they straddle a cache line, and the fields are read by value (a packed field cannot be
//! borrowed, so nothing here takes a reference to one). Byte alignment lets the entry take the
//! key's alignment alone: with an `IpAddr` key (17 bytes, align 1) the entry is 49 bytes instead
//! of 52, which is what brings an `IpAddr` key under 64 bytes with the map's overhead
//! (BENCHMARKS.md, issue 15). With a `u64` key nothing changes (40 bytes, the key 8-aligned
//! and the state after it, so `tokens` stays 8-aligned there).

use std::time::Duration;

/// A lease for the key is queued or in flight (at most one per key from sync callers).
pub(crate) const QUEUED: u32 = 1;
/// A caller got tokens of this key at least once (evicted last under a flood).
pub(crate) const USED: u32 = 2;
/// The worker granted this key tokens at least once (`granted_at_ms` is valid).
pub(crate) const GRANTED: u32 = 4;
/// The key is blocked (`blocked_until_us` is valid).
pub(crate) const BLOCKED: u32 = 8;
/// The block is the store's answer — its refusal, or an error that is no outage (an ACL
/// denial, a bad reply) — not a failing store's back-off, which ends with the outage.
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
#[repr(C, packed)] // the fields a hit reads first, together; byte-aligned (see the module docs)
pub(crate) struct KeyState {
    /// Leased tokens not yet spent.
    tokens: u64,
    /// The tick of the last hit (see `mod.rs`: the worker's coarse clock).
    last_use: u32,
    /// [`QUEUED`], [`USED`], [`GRANTED`], [`BLOCKED`], [`REFUSED`] in the low [`FLAG_BITS`];
    /// above them the largest request denied since the worker last leased (saturating at
    /// [`MAX_DENIED`]).
    flags: u32,
    /// Request a lease when a hit leaves fewer tokens than this (0: only when denied).
    low_water: u32,
    /// Worker only: tokens held right after the last grant, plus any handed to a waiter
    /// (saturating). What is missing at the next lease was spent.
    after_grant: u32,
    /// Worker only: ms since origin of the last grant (wrapping; valid with [`GRANTED`]).
    granted_at_ms: u32,
    /// Until when (µs since the limiter's origin, wrapping; valid with [`BLOCKED`]) the store
    /// said no lease can succeed, or the circuit said not to try: callers are denied locally
    /// until then.
    blocked_until_us: u32,
}

const _: () = assert!(std::mem::size_of::<KeyState>() == 32);
const _: () = assert!(std::mem::align_of::<KeyState>() == 1);
const _: () = assert!(std::mem::size_of::<(std::net::IpAddr, KeyState)>() == 49);
const _: () = assert!(std::mem::size_of::<(u64, KeyState)>() == 40);

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
        KeyState {
            last_use: tick,
            flags,
            ..KeyState::default()
        }
    }

    /// Takes `n` tokens and returns what is left, or `None` if there are fewer.
    #[inline]
    pub(crate) fn take(&mut self, n: u64) -> Option<u64> {
        let left = self.tokens.checked_sub(n)?;
        self.tokens = left;
        Some(left)
    }

    /// Records a hit at `tick`: stores only what changed, so a busy key's flags and clock are
    /// not written again on every call.
    #[inline]
    pub(crate) fn touch(&mut self, tick: u32) {
        self.seen(tick);
        if self.flags & USED == 0 {
            self.flags |= USED;
        }
    }

    /// Records a call at `tick`, admitted or not: the key is in use.
    #[inline]
    pub(crate) fn seen(&mut self, tick: u32) {
        if self.last_use != tick {
            self.last_use = tick;
        }
    }

    /// Whether a hit that left `left` tokens should request the next lease.
    #[inline]
    pub(crate) fn below_low_water(&self, left: u64) -> bool {
        left < u64::from(self.low_water)
    }

    /// Tokens held now.
    pub(crate) fn tokens(&self) -> u64 {
        self.tokens
    }

    /// Takes every token (to give them back); none can be spent afterwards.
    pub(crate) fn take_all(&mut self) -> u64 {
        self.after_grant = 0;
        let all = self.tokens;
        self.tokens = 0;
        all
    }

    /// Sets [`QUEUED`]; true if this call set it (and must queue the lease).
    pub(crate) fn mark_queued(&mut self) -> bool {
        let was = self.flags & QUEUED == 0;
        self.flags |= QUEUED;
        was
    }

    /// Clears [`QUEUED`].
    pub(crate) fn unqueue(&mut self) {
        self.flags &= !QUEUED;
    }

    /// The flags.
    pub(crate) fn flags(&self) -> u32 {
        self.flags & FLAG_MASK
    }

    /// The tick of the last hit (or of creation).
    pub(crate) fn last_use(&self) -> u32 {
        self.last_use
    }

    /// Eviction order: keys never used first, then by last use (lower goes first).
    pub(crate) fn eviction_rank(&self) -> u64 {
        let used = u64::from(self.flags() & USED != 0);
        (used << 32) | u64::from(self.last_use())
    }

    /// Remembers a denied request of `n` tokens, so the next lease takes at least that many.
    pub(crate) fn note_denied(&mut self, n: u64) {
        let n = n.min(MAX_DENIED) as u32;
        if self.flags >> FLAG_BITS < n {
            self.flags = (self.flags & FLAG_MASK) | (n << FLAG_BITS);
        }
    }

    /// The largest request denied since the last call.
    pub(crate) fn take_denied(&mut self) -> u64 {
        let denied = self.flags >> FLAG_BITS;
        self.flags &= FLAG_MASK;
        u64::from(denied)
    }

    /// The end of the block, in ns since origin, read at `now_ns` (`None` if not blocked).
    fn block_end(&self, now_ns: u64) -> Option<u64> {
        if self.flags() & BLOCKED == 0 {
            return None;
        }
        let until = self.blocked_until_us;
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

    /// How long callers are still denied at `now_ns` for the store's answer ([`REFUSED`]);
    /// zero for a failing store's back-off, which ends with the outage rather than at its
    /// time (a lease in flight beside the failed one may have closed the circuit since).
    pub(crate) fn refused_for(&self, now_ns: u64) -> Duration {
        if self.flags() & REFUSED == 0 {
            return Duration::ZERO;
        }
        self.blocked_for(now_ns)
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
    pub(crate) fn block_until(&mut self, until_ns: u64, now_ns: u64) {
        self.set_block(until_ns, now_ns);
        self.flags &= !REFUSED;
    }

    /// Denies callers locally until `until_ns` (at most [`MAX_BLOCK`] after `now_ns`), the
    /// store having refused the key until then. Worker only.
    pub(crate) fn refuse_until(&mut self, until_ns: u64, now_ns: u64) {
        self.set_block(until_ns, now_ns);
        self.flags |= REFUSED;
    }

    fn set_block(&mut self, until_ns: u64, now_ns: u64) {
        let until = until_ns.min(now_ns.saturating_add(crate::time::nanos(MAX_BLOCK)));
        self.blocked_until_us = micros(until.div_ceil(1_000) * 1_000);
        self.flags |= BLOCKED;
    }

    /// Forgets a block that ended long before `now_ns`, before the wrapping clock could make
    /// it look current again. Worker only (the sweep).
    pub(crate) fn forget_old_block(&mut self, now_ns: u64) {
        if self.flags() & BLOCKED != 0 && !self.blocked_within(FORGET_BLOCK_AFTER, now_ns) {
            self.flags &= !(BLOCKED | REFUSED);
        }
    }

    /// Adds `n` tokens.
    pub(crate) fn add(&mut self, n: u64) {
        self.tokens += n;
    }

    /// Adds a grant at `now_ms` (`now_ns`), of which `to_waiter` went straight to a waiting
    /// caller and the rest into the key; sets the next low-water mark and ends any block
    /// (remembering when it ended, for [`refused_within`](Self::refused_within)). Worker only.
    pub(crate) fn grant(
        &mut self,
        rest: u64,
        to_waiter: u64,
        low_water: u64,
        now_ms: u32,
        now_ns: u64,
    ) {
        let held = self.tokens + rest;
        self.tokens = held;
        self.after_grant = saturate(held + to_waiter);
        self.granted_at_ms = now_ms;
        self.low_water = saturate(low_water);
        // Not blocked from now on; a block that was ended early reads as ending now.
        if self.block_end(now_ns).is_some_and(|end| end > now_ns) {
            self.blocked_until_us = micros(now_ns.div_ceil(1_000) * 1_000);
        }
        let used = if to_waiter > 0 { USED } else { 0 };
        self.flags |= GRANTED | used;
    }

    /// Tokens per second spent since the last grant (0 if never granted): the key's demand,
    /// as the worker sees it at `now_ms` without any counter on the hot path.
    pub(crate) fn demand(&self, now_ms: u32) -> f64 {
        if self.flags() & GRANTED == 0 {
            return 0.0;
        }
        let after = u64::from(self.after_grant);
        let spent = after.saturating_sub(self.tokens());
        let elapsed_ms = now_ms.wrapping_sub(self.granted_at_ms).max(1);
        spent as f64 * 1_000.0 / f64::from(elapsed_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_grant_and_give_back_conserve_tokens() {
        let mut s = KeyState::new(7, QUEUED);
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
        let mut s = KeyState::new(0, 0);
        assert_eq!(s.demand(5_000), 0.0, "never granted: no demand");
        s.grant(10, 2, 0, 1_000, 1_000_000_000);
        s.take(4).unwrap();
        // 2 handed to a waiter + 4 taken, over 500 ms.
        assert_eq!(s.demand(1_500), 12.0);
        // The millisecond clock wraps.
        let mut w = KeyState::new(0, 0);
        w.grant(1, 0, 0, u32::MAX - 99, 1);
        w.take(1).unwrap();
        assert_eq!(w.demand(100), 5.0);
    }

    #[test]
    fn flags_and_eviction_rank() {
        let mut s = KeyState::new(3, 0);
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
        let mut s = KeyState::new(0, 0);
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
    fn token_counts_above_32_bits_survive() {
        let mut s = KeyState::new(0, 0);
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
        let mut s = KeyState::new(0, 0);
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
