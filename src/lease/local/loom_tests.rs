//! Loom models of [`LocalBucket`]: conservation and the clean cut of
//! [`take_all`](LocalBucket::take_all), explored over every interleaving (within a preemption
//! bound) of the production code itself — the bucket's atomics are loom's in this build
//! (`super::super::sync`). Run them with
//!
//! ```sh
//! RUSTFLAGS="--cfg ratelease_loom" CARGO_TARGET_DIR=target/loom cargo test --release --lib loom
//! ```
//!
//! Each model checks, after every thread has finished, that every token added was taken by a
//! caller exactly once, returned by `take_all`, or is still in the bucket (never created or
//! lost), and that `take_all` was a clean cut: with no add after it, nothing is left in the
//! bucket and no take that began after it returned was served.
//!
//! **loom and `SeqCst`.** loom treats `SeqCst` accesses as `AcqRel` (its README, "Unsupported
//! features"): it may return a store older than the newest `SeqCst` one when that older store
//! was not `SeqCst` itself — and an atomic's initial value counts as such a store. The
//! store-buffer patterns of the bucket (`moving`/`draining`, counts/refill flag) would then
//! fail in loom although they hold in C++20's model. [`seq_cst_start`] therefore re-stores
//! every word of the starting state with `SeqCst` on the model's main thread before any other
//! starts; from then on every store to those words is a `SeqCst` read-modify-write of the
//! production code, and loom's loads of them are sequentially consistent.

use std::sync::atomic::Ordering::SeqCst;

use loom::sync::atomic::AtomicBool;
use loom::sync::Arc;
use loom::thread;

use super::*;

/// Smallest grant that shards: chunks of [`MIN_CHUNK`], every slot empty.
const SHARDED: u64 = CHUNK_DIVISOR * SLOTS as u64 * MIN_CHUNK;

/// Preemptions explored per execution of the models below (see [`model`]). Two suffice: the
/// orders that break the clean cut need a mover preempted inside its move (between taking
/// tokens from one word and adding them to another) and, for the `moving`/`draining`
/// handshake, `take_all` preempted between registering and sweeping; every mutation listed in
/// the commit history was caught within this bound. Three take each model ~10× longer
/// (~40 s in all on a busy 2-core machine) and find nothing more; `LOOM_MAX_PREEMPTIONS`
/// overrides it.
const PREEMPTION_BOUND: usize = 2;

/// Runs `f` under loom, exploring every interleaving with at most `bound` preemptions (`None`:
/// all of them), unless `LOOM_MAX_PREEMPTIONS` says otherwise.
pub(crate) fn model(bound: Option<usize>, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = bound;
    }
    builder.check(f);
}

/// Re-stores every word of `bucket` with `SeqCst`, so that loom's loads of them are
/// sequentially consistent (module docs). Call it on the model's main thread, after setting
/// up the starting state and before spawning.
pub(crate) fn seq_cst_start(bucket: &LocalBucket) {
    for word in [&bucket.reserve, &bucket.moving, &bucket.draining]
        .into_iter()
        .chain(bucket.slots.iter().map(|slot| &**slot))
    {
        word.store(word.load(SeqCst), SeqCst);
    }
}

/// A taker on slot `slot`: `tries` calls to `try_take(n)`. Returns the tokens it was served;
/// panics if a take that began after `cut` was raised (after `take_all` returned) was served.
fn taker(
    bucket: &Arc<LocalBucket>,
    cut: &Arc<AtomicBool>,
    slot: usize,
    n: u64,
    tries: usize,
) -> thread::JoinHandle<u64> {
    let (bucket, cut) = (bucket.clone(), cut.clone());
    thread::spawn(move || {
        pin_thread(slot);
        let mut taken = 0;
        for _ in 0..tries {
            let after_cut = cut.load(SeqCst);
            if bucket.try_take(n).is_ok() {
                assert!(
                    !after_cut,
                    "a take that began after take_all returned was served"
                );
                taken += n;
            }
        }
        taken
    })
}

/// Two takers on their own slots of a fresh sharded bucket (so each of their first takes moves
/// a chunk from the reserve, its tokens briefly in no word) race a `take_all`.
#[test]
fn loom_take_all_is_a_clean_cut_during_chunk_moves() {
    model(Some(PREEMPTION_BOUND), || {
        let bucket = Arc::new(LocalBucket::default());
        bucket.add(SHARDED);
        seq_cst_start(&bucket);
        let cut = Arc::new(AtomicBool::new(false));
        let takers = [taker(&bucket, &cut, 0, 1, 2), taker(&bucket, &cut, 1, 1, 1)];
        let swept = bucket.take_all();
        cut.store(true, SeqCst);
        let taken: u64 = takers.into_iter().map(|t| t.join().unwrap()).sum();
        let left = bucket.available();
        assert_eq!(taken + swept + left, SHARDED, "a token was created or lost");
        assert_eq!(left, 0, "tokens survived the cut");
    });
}

/// Tokens scattered over the words, none of which holds 4: a request of 4 on slot 0 gathers
/// everything into its slot, a request of 2 on the empty slot 1 steals from slot 0, and a
/// `take_all` races both.
#[test]
fn loom_take_all_is_a_clean_cut_during_steals_and_gathers() {
    model(Some(PREEMPTION_BOUND), || {
        let bucket = Arc::new(LocalBucket::default());
        bucket.add(SHARDED); // sharded: chunks of MIN_CHUNK
                             // The state a mostly spent lease may leave: 1 in the reserve, 3 parked in slot 0.
        bucket.reserve.store(1, SeqCst);
        bucket.slots[0].store(3, SeqCst);
        seq_cst_start(&bucket);
        let cut = Arc::new(AtomicBool::new(false));
        let takers = [taker(&bucket, &cut, 0, 4, 1), taker(&bucket, &cut, 1, 2, 1)];
        let swept = bucket.take_all();
        cut.store(true, SeqCst);
        let taken: u64 = takers.into_iter().map(|t| t.join().unwrap()).sum();
        let left = bucket.available();
        assert_eq!(taken + swept + left, 4, "a token was created or lost");
        assert_eq!(left, 0, "tokens survived the cut");
    });
}

/// A lease lands (`add`) while a taker moves chunks and a `take_all` sweeps: every token of
/// both grants is taken once, swept, or still there (tokens added after the cut may be).
#[test]
fn loom_add_during_takes_and_take_all_conserves_tokens() {
    model(Some(PREEMPTION_BOUND), || {
        let bucket = Arc::new(LocalBucket::default());
        bucket.add(SHARDED);
        seq_cst_start(&bucket);
        let adder = {
            let bucket = bucket.clone();
            thread::spawn(move || {
                bucket.add(SHARDED);
            })
        };
        let taker = {
            let bucket = bucket.clone();
            thread::spawn(move || {
                pin_thread(0);
                (0..2).filter(|_| bucket.try_take(1).is_ok()).count() as u64
            })
        };
        let swept = bucket.take_all();
        adder.join().unwrap();
        let taken = taker.join().unwrap();
        let left = bucket.available();
        assert_eq!(
            taken + swept + left,
            2 * SHARDED,
            "a token was created or lost"
        );
    });
}
