//! The local tier: tokens this process has leased and not yet spent, sharded so that threads
//! taking tokens at the same time do not fight over one cache line.
//!
//! # Implementation details
//!
//! Tokens live in a **reserve** word and in [`SLOTS`] **slots**, each an `AtomicU64` on cache
//! lines of its own. Nothing here locks, allocates or does I/O, and only
//! [`take_all`](LocalBucket::take_all) ever waits (see below).
//!
//! - [`add`](LocalBucket::add) (a granted lease) goes into the reserve.
//! - Each thread is given a slot the first time it takes tokens: a thread-local number handed
//!   out round-robin from a global counter, so no `thread::current()` call and no allocation on
//!   later calls. Several threads may share a slot; that is correct, only slower.
//! - [`try_take`](LocalBucket::try_take) runs one CAS loop on the caller's own slot. Only that
//!   is inline, so `HybridLimiter::try_acquire` stays small enough to be inlined into its
//!   callers (when it was not, each call cost ~1.7 ns more). When the slot runs short, the
//!   out-of-line slow path moves a **chunk** of tokens from the reserve into it; when the
//!   reserve is short too, it **steals** `n` from another slot; and if no single word holds `n`
//!   although together they do (only possible for `n > 1`), it **gathers** everything into its
//!   own slot and tries once more.
//! - [`take_all`](LocalBucket::take_all) drains the reserve and every slot;
//!   [`available`](LocalBucket::available) sums them.
//!
//! Two threads on different slots therefore touch shared memory only once per chunk, so their
//! throughput adds up instead of collapsing under cache-line ping-pong (`BENCHMARKS.md`: two
//! threads ~2× one thread, where one shared word gives ~0.2×).
//!
//! **Chunk size and the single-word mode.** Each `add` sets the chunk to
//! `granted / (CHUNK_DIVISOR × SLOTS)`. A lease so small that the chunk would fall below
//! [`MIN_CHUNK`] (under 1 024 tokens) is not worth spreading: then every thread takes straight
//! from the reserve, which is the one-word bucket this module used to be (tokens still parked
//! in slots from an earlier, larger lease are found by the steal path). A slot holds at most
//! about one chunk, so with the divisor of 4 at most about a quarter of a lease is parked in
//! slots, which bounds how far the low-water hint below can run ahead.
//!
//! **The low-water hint.** `try_take` returns an estimate of what is left: the caller's slot
//! plus the reserve (the reserve's line is written once per chunk, so reading it is almost
//! always a cache hit). The other slots are not counted, so it is at most the total (give or
//! take tokens moving at that instant): the limiter's "refill below the mark" fires no later
//! than with one word, and at most about a quarter of a lease earlier.
//!
//! **Conservation.** Every move is an atomic read-modify-write that subtracts from one word
//! what the same call adds to another word or hands to its caller, so no token is created or
//! lost. While a chunk or a gather is in flight its tokens are in no word: a concurrent caller
//! may then be denied although the total would have served it (near empty, a denial is not
//! linearizable as it is with one word; it only under-admits, and a denial asks for a refill).
//!
//! **`take_all` is a clean cut**, as with one word: once it returns, no token that was in the
//! bucket can still be spent (the limiter relies on this to drop an expiring lease). Moves
//! announce themselves in `moving`; `take_all` raises `draining`, so no new move starts,
//! waits until `moving` is zero (a few instructions, unless a mover was preempted: it yields
//! meanwhile), then sweeps every word. Takes and steals are not moves: they spend, each at its
//! own CAS, before the sweep of that word or not at all.
//!
//! Conservation and the clean cut are checked by loom models of this code (`loom_tests.rs`
//! beside this file): `RUSTFLAGS="--cfg ratelease_loom" CARGO_TARGET_DIR=target/loom cargo test
//! --release --lib loom`.
//!
//! # Memory ordering
//!
//! The counters publish no other data, so `Relaxed` would be enough for conservation. Writes to
//! counts and [`LocalBucket::available`] are `SeqCst` because they take part in a store-buffer
//! (Dekker) pattern with the refill flag (see [`crate::lease::refill`]): a caller writes a count then
//! reads the flag, the refill task writes the flag then reads the counts, and only sequential
//! consistency guarantees that one of the two sees the other. That holds for a sum of several
//! words too: every word the caller wrote before reading the flag is read by the task after
//! its flag write. `moving` and `draining` form a second store-buffer pattern (a mover
//! increments `moving` then reads `draining`; `take_all` increments `draining` then reads
//! `moving`), also `SeqCst`. The chunk size and the reserve read that feeds the low-water hint
//! are `Relaxed`: they pick a path or feed a hint, and no protocol depends on them. On x86 a
//! `SeqCst` RMW is the same `lock` instruction as a relaxed one and a `SeqCst` load is a plain
//! `mov`.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;

// std's atomics, or loom's in the loom models (see `super::sync`).
use super::sync::{const_thread_local, yield_now, AtomicU64};

/// A granted lease is split into chunks of `granted / (CHUNK_DIVISOR × slots)` tokens.
const CHUNK_DIVISOR: u64 = 4;
/// Smallest chunk worth sharding for: below it, every thread uses the reserve directly.
pub(crate) const MIN_CHUNK: u64 = 32;
/// Slots per bucket: a power of two, fixed so that a slot's address is the bucket's address
/// plus a constant plus `(thread index % SLOTS) × 128` — no load on the way to the CAS that the
/// one-word bucket did not have (a runtime-sized boxed array would add the load of its pointer
/// before a serializing `lock cmpxchg`). Eight slots cost 1 KiB per limiter and let eight busy
/// threads run without sharing a line; more threads share slots, which is correct, only slower.
#[cfg(not(all(test, ratelease_loom)))]
pub(crate) const SLOTS: usize = 8;
/// Two slots in the loom models: every loop over the slots is the same code, and each slot more
/// multiplies loom's state space (with eight, >240 000 executions without a single preemption).
#[cfg(all(test, ratelease_loom))]
pub(crate) const SLOTS: usize = 2;

/// One counter on cache lines of its own (`CachePadded` is 128 bytes on x86-64 and aarch64:
/// the adjacent-line prefetcher pairs lines).
type Slot = CachePadded<AtomicU64>;

/// Unspent leased tokens.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct LocalBucket {
    /// Where leases land; chunks are taken from it. Written once per chunk (or per take in
    /// single-word mode); shares its line only with `chunk`, which changes once per lease.
    reserve: AtomicU64,
    /// Tokens a slot takes from the reserve at a time; below [`MIN_CHUNK`], single-word mode.
    chunk: AtomicU64,
    /// Moves in progress: chunk moves and gathers, whose tokens are briefly in no word.
    moving: AtomicU64,
    /// `take_all` (or `settled`) calls in progress; no move may start while this is non-zero.
    draining: AtomicU64,
    slots: [Slot; SLOTS],
    /// Successful steals from other slots, so tests can tell stealing really happened. A
    /// `std` atomic even in the loom models: instrumentation, not part of any protocol.
    #[cfg(test)]
    steals: std::sync::atomic::AtomicU64,
}

/// Hands out slot numbers round-robin. A `std` atomic even in the loom models: it only spreads
/// threads over slots (any assignment is correct), and the models pin each thread's slot.
static NEXT_INDEX: AtomicUsize = AtomicUsize::new(0);

const_thread_local! {
    /// This thread's slot, in `0..SLOTS`; `usize::MAX` until first use. `const` and without a
    /// destructor, so reading it is a plain TLS access that never allocates.
    static THREAD_INDEX: Cell<usize> = Cell::new(usize::MAX);
}

/// This thread's slot, in `0..SLOTS`: assigned round-robin on first use.
#[inline]
fn thread_index() -> usize {
    THREAD_INDEX.with(|index| match index.get() {
        usize::MAX => {
            let assigned = NEXT_INDEX.fetch_add(1, Ordering::Relaxed) % SLOTS;
            index.set(assigned);
            assigned
        }
        assigned => assigned,
    })
}

/// Puts the calling thread on slot `index` (tests: the slot a thread gets otherwise depends on
/// the order threads first took tokens in).
#[cfg(test)]
pub(crate) fn pin_thread(index: usize) {
    assert!(index < SLOTS);
    THREAD_INDEX.with(|i| i.set(index));
}

/// Takes `n` from `word` if it holds that many: `Ok(left)`, else `Err(what there was)`.
#[inline(always)]
fn take_from(word: &AtomicU64, n: u64, on_retry: &mut impl FnMut()) -> Result<u64, u64> {
    let mut current = word.load(Ordering::Relaxed);
    while current >= n {
        // SeqCst on success: the count write of the Dekker pattern (module docs).
        match word.compare_exchange_weak(current, current - n, Ordering::SeqCst, Ordering::Relaxed)
        {
            Ok(_) => return Ok(current - n),
            Err(actual) => {
                on_retry();
                current = actual;
            }
        }
    }
    Err(current)
}

impl LocalBucket {
    /// Takes `n` tokens if there are that many; returns an estimate of what is left (never more
    /// than the true total), or what there was.
    #[inline]
    pub(crate) fn try_take(&self, n: u64) -> Result<u64, u64> {
        self.take_counting(n, || {})
    }

    /// [`try_take`](Self::try_take), calling `on_retry` each time another thread won a race.
    ///
    /// Only the common case is inline — one CAS loop on the caller's slot (sharded) or on the
    /// reserve (single-word mode) — so that `HybridLimiter::try_acquire` stays small enough to
    /// be inlined into its callers; everything else is in the out-of-line [`Self::take_slow`].
    #[inline(always)]
    pub(crate) fn take_counting(&self, n: u64, mut on_retry: impl FnMut()) -> Result<u64, u64> {
        // Relaxed: the chunk only picks a path; every path is correct with any value.
        let chunk = self.chunk.load(Ordering::Relaxed);
        let sharded = chunk >= MIN_CHUNK;
        let word = if sharded {
            &self.slots[thread_index() % SLOTS]
        } else {
            &self.reserve
        };
        match take_from(word, n, &mut on_retry) {
            // Relaxed: the reserve only feeds the low-water hint.
            Ok(left) if sharded => Ok(left + self.reserve.load(Ordering::Relaxed)),
            Ok(left) => Ok(left),
            Err(_) => self.take_slow(n, chunk, &mut on_retry),
        }
    }

    /// The caller's word is short. Sharded: move a chunk (at least `n`) from the reserve to the
    /// caller's slot; in either mode, steal from the slots if the reserve is short too.
    #[cold]
    #[inline(never)]
    fn take_slow(&self, n: u64, chunk: u64, on_retry: &mut impl FnMut()) -> Result<u64, u64> {
        let mut reserve = self.reserve.load(Ordering::Relaxed);
        if reserve < n {
            // Near empty: no move to announce (callers denied in a loop stay cheap).
            return self.steal(n, reserve, on_retry);
        }
        // Single-word mode, or a `take_all` under way: take just `n`, move nothing.
        let moving = chunk >= MIN_CHUNK && self.begin_move();
        while reserve >= n {
            let take = if moving { reserve.min(chunk.max(n)) } else { n };
            match self.reserve.compare_exchange_weak(
                reserve,
                reserve - take,
                Ordering::SeqCst,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    let mut left = reserve - take;
                    let surplus = take - n;
                    if surplus > 0 {
                        let slot = &self.slots[thread_index() % SLOTS];
                        left += slot.fetch_add(surplus, Ordering::SeqCst) + surplus;
                    }
                    if moving {
                        self.end_move();
                    }
                    return Ok(left);
                }
                Err(actual) => {
                    on_retry();
                    reserve = actual;
                }
            }
        }
        if moving {
            self.end_move();
        }
        self.steal(n, reserve, on_retry)
    }

    /// Registers a move (tokens about to leave every word for a moment); false, registering
    /// nothing, while a `take_all` is draining. `SeqCst` on both sides: a store-buffer pattern
    /// with `take_all` (this increments `moving` then reads `draining`; it increments
    /// `draining` then reads `moving`), so at least one of the two sees the other.
    fn begin_move(&self) -> bool {
        self.moving.fetch_add(1, Ordering::SeqCst);
        if self.draining.load(Ordering::SeqCst) == 0 {
            return true;
        }
        self.end_move();
        false
    }

    /// Ends a move registered by [`begin_move`](Self::begin_move), once its tokens are in a
    /// word again.
    fn end_move(&self) {
        self.moving.fetch_sub(1, Ordering::SeqCst);
    }

    /// The reserve is short: take `n` from any slot that has them, else gather.
    #[cold]
    fn steal(&self, n: u64, reserve: u64, on_retry: &mut impl FnMut()) -> Result<u64, u64> {
        let own = thread_index() % SLOTS;
        let mut seen = reserve;
        for i in 0..SLOTS {
            // Our own slot first (it may have been refilled since), then the others in turn.
            match take_from(&self.slots[(own + i) % SLOTS], n, on_retry) {
                Ok(left) => {
                    #[cfg(test)]
                    if i > 0 {
                        self.steals.fetch_add(1, Ordering::Relaxed);
                    }
                    return Ok(left);
                }
                Err(there) => seen = seen.saturating_add(there),
            }
        }
        if n > 1 && seen >= n {
            return self.gather(n, own, on_retry);
        }
        Err(seen)
    }

    /// No single word holds `n` but together they may: move everything into our slot, then
    /// try once. Each token is `swap`ped out of one word and `fetch_add`ed into another.
    #[cold]
    fn gather(&self, n: u64, own: usize, on_retry: &mut impl FnMut()) -> Result<u64, u64> {
        if !self.begin_move() {
            return Err(self.available());
        }
        let mut moved = self.reserve.swap(0, Ordering::SeqCst);
        for i in 1..SLOTS {
            moved += self.slots[(own + i) % SLOTS].swap(0, Ordering::SeqCst);
        }
        let slot = &self.slots[own];
        slot.fetch_add(moved, Ordering::SeqCst);
        self.end_move();
        take_from(slot, n, on_retry)
    }

    /// Adds leased tokens to the reserve and sizes chunks from the grant; returns the new
    /// total.
    pub(crate) fn add(&self, n: u64) -> u64 {
        // Relaxed: see `take_counting`.
        self.chunk
            .store(n / (CHUNK_DIVISOR * SLOTS as u64), Ordering::Relaxed);
        self.reserve.fetch_add(n, Ordering::SeqCst);
        self.available()
    }

    /// Takes every token (to give them back); returns how many there were.
    ///
    /// A clean cut, as with one word: once it returns, no token that was in the bucket can
    /// still be spent. It stops new moves, waits for the ones under way to land (a few
    /// instructions each; it yields the thread if a mover was preempted), then sweeps every
    /// word. Takes that race with it are either before the cut or find nothing.
    pub(crate) fn take_all(&self) -> u64 {
        self.at_rest(|| {
            let mut total = self.reserve.swap(0, Ordering::SeqCst);
            for slot in self.slots.iter() {
                total += slot.swap(0, Ordering::SeqCst);
            }
            total
        })
    }

    /// Tokens available, summed with no move under way (as [`take_all`](Self::take_all)
    /// cuts, without the sweep), so no token in transit between words is missed.
    /// [`available`](Self::available) may miss a chunk in transit, which would read as tokens
    /// spent; metrics read this instead.
    pub(crate) fn settled(&self) -> u64 {
        self.at_rest(|| self.available())
    }

    /// Runs `f` with no move under way: stops new moves, waits for the ones under way to
    /// land, runs `f`, lets moves start again.
    fn at_rest<T>(&self, f: impl FnOnce() -> T) -> T {
        self.draining.fetch_add(1, Ordering::SeqCst);
        while self.moving.load(Ordering::SeqCst) != 0 {
            yield_now();
        }
        let result = f();
        self.draining.fetch_sub(1, Ordering::SeqCst);
        result
    }

    /// Tokens available now (the sum of the reserve and the slots).
    pub(crate) fn available(&self) -> u64 {
        self.reserve.load(Ordering::SeqCst)
            + self
                .slots
                .iter()
                .map(|slot| slot.load(Ordering::SeqCst))
                .sum::<u64>()
    }
}

/// Loom models of the clean cut and of conservation (`--cfg ratelease_loom`, see
/// `super::sync`).
#[cfg(all(test, ratelease_loom))]
pub(crate) mod loom_tests;

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Barrier;

    use super::*;

    /// Smallest grant that shards.
    const SHARDED: u64 = CHUNK_DIVISOR * SLOTS as u64 * MIN_CHUNK;

    /// Two threads drain `bucket` with requests of `n` from slots `slots.0` and `slots.1`;
    /// returns what each took and how many CAS races were lost in total.
    fn drain_on_two_threads(
        bucket: &LocalBucket,
        n: u64,
        slots: (usize, usize),
    ) -> (Vec<u64>, usize) {
        let retries = AtomicUsize::new(0);
        let barrier = Barrier::new(2);
        let taken = std::thread::scope(|s| {
            let handles: Vec<_> = [slots.0, slots.1]
                .into_iter()
                .map(|slot| {
                    let (barrier, retries) = (&barrier, &retries);
                    s.spawn(move || {
                        pin_thread(slot);
                        barrier.wait();
                        let mut mine = 0u64;
                        let mut local_retries = 0usize;
                        while bucket.take_counting(n, || local_retries += 1).is_ok() {
                            mine += n;
                        }
                        retries.fetch_add(local_retries, Ordering::Relaxed);
                        mine
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        (taken, retries.into_inner())
    }

    #[test]
    fn takes_only_what_is_there() {
        let b = LocalBucket::default();
        assert_eq!(b.try_take(1), Err(0));
        b.add(5);
        assert_eq!(b.try_take(3), Ok(2));
        assert_eq!(b.try_take(3), Err(2));
        assert_eq!(b.take_all(), 2);
        assert_eq!(b.available(), 0);
    }

    #[test]
    fn small_grants_use_the_single_word_and_large_ones_shard() {
        let b = LocalBucket::default();
        b.add(SHARDED - 1);
        assert!(b.chunk.load(Ordering::Relaxed) < MIN_CHUNK);
        pin_thread(0);
        assert_eq!(
            b.try_take(1),
            Ok(SHARDED - 2),
            "exact count, all in reserve"
        );
        assert_eq!(b.slots[0].load(Ordering::Relaxed), 0);
        b.take_all();

        b.add(SHARDED);
        assert_eq!(b.chunk.load(Ordering::Relaxed), MIN_CHUNK);
        assert_eq!(
            b.try_take(1),
            Ok(SHARDED - 1),
            "the estimate is exact while one thread uses the bucket"
        );
        assert_eq!(
            b.slots[0].load(Ordering::Relaxed),
            MIN_CHUNK - 1,
            "a chunk moved"
        );
        assert_eq!(b.available(), SHARDED - 1);
    }

    /// Drains a fresh bucket from `fill` on two threads (slots `slots`) until the threads
    /// really contended, asserting the exact total on every attempt. Tests run in parallel on
    /// few cores, so one attempt may find the two threads time-sliced instead of overlapping;
    /// only if none of many attempts collides does the test fail as proving nothing.
    fn drain_until_contended(fill: impl Fn(&LocalBucket) -> u64, slots: (usize, usize)) {
        for _ in 0..50 {
            let bucket = LocalBucket::default();
            let leased = fill(&bucket);
            let (taken, retries) = drain_on_two_threads(&bucket, 1, slots);
            assert_eq!(
                taken.iter().sum::<u64>(),
                leased,
                "no token lost or doubled"
            );
            assert_eq!(bucket.available(), 0);
            if retries > 0 && taken.iter().all(|&t| t > 0) {
                return;
            }
        }
        panic!("the threads never contended in 50 attempts; the test proved nothing");
    }

    /// Two threads drain one word (grants too small to shard): together they take exactly
    /// what was there, and the CAS loop really did collide (otherwise the test proves nothing
    /// about concurrency).
    #[test]
    fn two_threads_on_one_word_hand_out_exactly_the_leased_count() {
        drain_until_contended(
            |bucket| {
                for _ in 0..2_000 {
                    bucket.add(SHARDED - 1);
                }
                assert!(bucket.chunk.load(Ordering::Relaxed) < MIN_CHUNK);
                2_000 * (SHARDED - 1)
            },
            (0, 1),
        );
    }

    /// The same on a sharded bucket, with both threads on one slot so that the slot's CAS loop
    /// and the chunk moves really collide.
    #[test]
    fn two_threads_on_one_slot_hand_out_exactly_the_leased_count() {
        drain_until_contended(
            |bucket| {
                bucket.add(2_000_000);
                assert!(bucket.chunk.load(Ordering::Relaxed) >= MIN_CHUNK);
                2_000_000
            },
            (2, 2),
        );
    }

    /// Threads on their own slots: exact total, including requests of several tokens that
    /// need gathering at the end.
    #[test]
    fn two_threads_on_own_slots_hand_out_exactly_the_leased_count() {
        const LEASED: u64 = 3_000_000; // a multiple of both request sizes below
        for n in [1, 3] {
            // Retried until the two threads really overlapped (see `drain_until_contended`).
            let overlapped = (0..50).any(|_| {
                let bucket = LocalBucket::default();
                bucket.add(LEASED);
                let (taken, _) = drain_on_two_threads(&bucket, n, (0, 1));
                assert_eq!(
                    taken.iter().sum::<u64>(),
                    LEASED,
                    "n = {n}: no token lost or doubled"
                );
                assert_eq!(bucket.available(), 0);
                taken.iter().all(|&t| t > 0)
            });
            assert!(overlapped, "n = {n}: one thread always took everything");
        }
    }

    /// Tokens parked in another thread's slot are stolen before a request is denied.
    #[test]
    fn steals_from_other_slots_before_failing() {
        let bucket = LocalBucket::default();
        let leased = 2 * SHARDED;
        bucket.add(leased); // chunks of 64
        let parked = std::thread::scope(|s| {
            s.spawn(|| {
                pin_thread(0);
                bucket.try_take(1).unwrap();
            })
            .join()
            .unwrap();
            bucket.slots[0].load(Ordering::Relaxed)
        });
        assert_eq!(parked, 63, "the first taker moved a chunk to its slot");
        pin_thread(1);
        let mut taken = 0;
        while bucket.try_take(1).is_ok() {
            taken += 1;
        }
        assert_eq!(
            taken,
            leased - 1,
            "everything but the first token, parked ones included"
        );
        assert_eq!(bucket.steals.load(Ordering::Relaxed), 63);
        assert_eq!(bucket.available(), 0);
    }

    /// A request larger than any single word is served by gathering; one larger than the total
    /// is denied with the total, and nothing moves out of the bucket.
    #[test]
    fn gathers_scattered_tokens_for_large_requests() {
        let bucket = LocalBucket::default();
        bucket.add(2 * SHARDED); // 2048 tokens in chunks of 64
        for slot in 0..SLOTS {
            std::thread::scope(|s| {
                s.spawn(|| {
                    pin_thread(slot);
                    bucket.try_take(1).unwrap();
                });
            });
        }
        // Reserve 2048 - 8 × 64 = 1536, slots 63 each: 2040 in all.
        pin_thread(0);
        assert_eq!(bucket.try_take(2_041), Err(2_040));
        assert_eq!(
            bucket.available(),
            2_040,
            "a failed request moves nothing out"
        );
        assert_eq!(bucket.try_take(2_000), Ok(40));
        assert_eq!(bucket.available(), 40);
        assert_eq!(bucket.take_all(), 40);
    }

    /// Takers with mixed request sizes on their own slots, an adder granting leases, and a
    /// final `take_all`: every token added is taken exactly once or given back.
    #[test]
    fn concurrent_adds_takes_and_take_all_conserve_tokens() {
        const GRANTS: u64 = 2_000;
        const GRANT: u64 = 4_000; // chunks of 4000 / (4 × 8) = 125
        let bucket = LocalBucket::default();
        let taken = AtomicU64::new(0);
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            for (slot, n) in [(0, 1), (1, 7)] {
                let (bucket, taken, done) = (&bucket, &taken, &done);
                s.spawn(move || {
                    pin_thread(slot);
                    let mut mine = 0;
                    while !done.load(Ordering::Relaxed) {
                        if bucket.try_take(n).is_ok() {
                            mine += n;
                        }
                    }
                    taken.fetch_add(mine, Ordering::Relaxed);
                });
            }
            for _ in 0..GRANTS {
                bucket.add(GRANT);
                std::thread::yield_now();
            }
            done.store(true, Ordering::Relaxed);
        });
        let left = bucket.take_all();
        assert_eq!(
            taken.into_inner() + left,
            GRANTS * GRANT,
            "no token lost or doubled"
        );
        assert_eq!(bucket.available(), 0);
    }

    /// `take_all` is a clean cut: once it has returned, no token that was in the bucket before
    /// can be spent, even by a thread that was moving a chunk at that moment. (The hybrid
    /// limiter relies on this to drop a lease at expiry.) A take counts as a violation if the
    /// bucket was closed (even epoch) both before and after it and no add came in between.
    #[test]
    fn take_all_is_a_clean_cut_even_during_chunk_moves() {
        const ROUNDS: u64 = 20_000;
        let bucket = LocalBucket::default();
        let epoch = AtomicU64::new(0);
        let stop = std::sync::atomic::AtomicBool::new(false);
        let (violations, taken) = (AtomicU64::new(0), AtomicU64::new(0));
        let mut swept = 0;
        std::thread::scope(|s| {
            for slot in [0, 1] {
                let (bucket, epoch, stop) = (&bucket, &epoch, &stop);
                let (violations, taken) = (&violations, &taken);
                s.spawn(move || {
                    pin_thread(slot);
                    while !stop.load(Ordering::Relaxed) {
                        let before = epoch.load(Ordering::SeqCst);
                        if bucket.try_take(1).is_ok() {
                            taken.fetch_add(1, Ordering::Relaxed);
                            if before % 2 == 0 && epoch.load(Ordering::SeqCst) == before {
                                violations.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                });
            }
            for round in 0..ROUNDS {
                epoch.store(2 * round + 1, Ordering::SeqCst);
                bucket.add(SHARDED); // chunks of MIN_CHUNK: moves all the time
                for _ in 0..(round % 64) * 8 {
                    std::hint::spin_loop();
                }
                swept += bucket.take_all();
                epoch.store(2 * round + 2, Ordering::SeqCst);
            }
            stop.store(true, Ordering::Relaxed);
        });
        swept += bucket.take_all();
        assert_eq!(
            taken.into_inner() + swept,
            ROUNDS * SHARDED,
            "no token lost or doubled"
        );
        assert_eq!(
            violations.into_inner(),
            0,
            "tokens were spent after take_all returned"
        );
    }
}
