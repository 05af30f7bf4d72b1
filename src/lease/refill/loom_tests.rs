//! Loom models of the count/refill-flag handshake: a caller that leaves the local bucket below
//! the low-water mark, or is denied, while the task lowers the flag and looks again, is never
//! lost. They run the production [`LocalBucket`] and [`RefillSignal`] (loom's atomics in this
//! build, see `super::super::sync`); how to run them and why every word is re-stored first:
//! `crate::lease::local::loom_tests`.
//!
//! What the callers and the task do between those calls is a comparison and a branch, written
//! out here as in the limiter: [`caller`] as `HybridLimiter::try_acquire` (`hybrid/mod.rs`),
//! [`spurious`] as the task's `hybrid::shared::spurious`, [`after_lease`] as the end of its
//! `Task::lease` (`hybrid/task.rs`).
//!
//! The [`AtomicWaker`](atomic_waker::AtomicWaker) is not modelled: it is the `atomic-waker`
//! crate's (std atomics here), its `wake` finds no waker registered in these models, and what
//! the task does once woken starts where these models start, with the flag up.

use loom::sync::Arc;
use loom::thread;

use super::*;
use crate::lease::local::loom_tests::{model, seq_cst_start};
use crate::lease::local::{pin_thread, LocalBucket, MIN_CHUNK, SLOTS};

/// Preemptions explored per execution: three, one more than the orders that lose a request
/// need (the task preempted between its first look and lowering the flag, or between lowering
/// it and looking again, while a caller takes and checks). The models are small enough that
/// three cost well under a second; every mutation in the commit history was caught.
const PREEMPTION_BOUND: usize = 3;

/// The smallest grant that shards (as in the limiter after a lease of that size).
const SHARDED: u64 = 4 * SLOTS as u64 * MIN_CHUNK;

/// A caller's `try_acquire(n)` after the burst check: take, then raise the flag if the hint of
/// what is left is under the mark; when denied, record it (which raises the flag too).
fn caller(bucket: &LocalBucket, signal: &RefillSignal, low_water: u64, n: u64) {
    match bucket.try_take(n) {
        Ok(left) => {
            if left < low_water {
                signal.request();
            }
        }
        Err(_) => signal.denied(n),
    }
}

/// The task's check of a request that may need no lease: true if it drops the request (the
/// bucket still holds the mark and nobody was denied), having lowered the flag and looked again.
fn spurious(bucket: &LocalBucket, signal: &RefillSignal, low_water: u64) -> bool {
    let enough = || !signal.was_denied() && low_water > 0 && bucket.available() >= low_water;
    if !enough() {
        return false;
    }
    signal.done();
    if enough() {
        return true;
    }
    signal.request();
    false
}

/// The end of a lease that brought the bucket to `after`: lower the flag, look again, and
/// raise it if a caller was denied or consumption took the bucket under the mark meanwhile.
fn after_lease(bucket: &LocalBucket, signal: &RefillSignal, low_water: u64, after: u64) {
    signal.done();
    let now = bucket.available();
    if signal.was_denied() || (now < low_water && now < after) {
        signal.request();
    }
}

/// A bucket holding `tokens` (sharded if `tokens >= SHARDED`) and a signal whose flag is up (a
/// request woke the task), every word re-stored `SeqCst` for loom.
fn start(tokens: u64) -> (Arc<LocalBucket>, Arc<RefillSignal>) {
    let bucket = LocalBucket::default();
    bucket.add(tokens);
    seq_cst_start(&bucket);
    let signal = RefillSignal::new(false);
    signal.take_denied(); // re-stores `denied_max` with SeqCst
    signal.request();
    (Arc::new(bucket), Arc::new(signal))
}

/// Spawns a caller on slot `slot` taking `n` once.
fn spawn_caller(
    bucket: &Arc<LocalBucket>,
    signal: &Arc<RefillSignal>,
    slot: usize,
    low_water: u64,
    n: u64,
) -> thread::JoinHandle<()> {
    let (bucket, signal) = (bucket.clone(), signal.clone());
    thread::spawn(move || {
        pin_thread(slot);
        caller(&bucket, &signal, low_water, n);
    })
}

/// Once every thread is done: if the bucket is under the mark or a caller was denied, the
/// flag is up or the task is about to lease anyway.
fn assert_not_lost(bucket: &LocalBucket, signal: &RefillSignal, low_water: u64, leasing: bool) {
    let low = bucket.available() < low_water || signal.was_denied();
    assert!(
        !low || signal.is_requested() || leasing,
        "a crossing of the mark or a denial was lost: {} left, mark {low_water}, flag down",
        bucket.available()
    );
}

/// Two callers on their own slots of a sharded bucket that holds exactly the mark take one
/// token each (moving chunks) while the task checks the request it woke on.
#[test]
fn loom_spurious_check_loses_no_crossing_sharded() {
    model(Some(PREEMPTION_BOUND), || {
        let low_water = SHARDED;
        let (bucket, signal) = start(SHARDED);
        let callers = [0, 1].map(|slot| spawn_caller(&bucket, &signal, slot, low_water, 1));
        let dropped = spurious(&bucket, &signal, low_water);
        callers.into_iter().for_each(|c| c.join().unwrap());
        assert_not_lost(&bucket, &signal, low_water, !dropped);
    });
}

/// As above, but each slot already holds a chunk (the setup took one token on each), so the
/// callers take on their own slot's fast path, whose hint adds a `Relaxed` read of the reserve.
#[test]
fn loom_spurious_check_loses_no_crossing_fast_path() {
    model(Some(PREEMPTION_BOUND), || {
        let (bucket, signal) = start(SHARDED);
        for slot in [0, 1] {
            pin_thread(slot);
            bucket.try_take(1).unwrap();
        }
        seq_cst_start(&bucket);
        let low_water = bucket.available();
        let callers = [0, 1].map(|slot| spawn_caller(&bucket, &signal, slot, low_water, 1));
        let dropped = spurious(&bucket, &signal, low_water);
        callers.into_iter().for_each(|c| c.join().unwrap());
        assert_not_lost(&bucket, &signal, low_water, !dropped);
    });
}

/// A caller is denied although the bucket holds the mark (it asked for more than is left):
/// only the recorded denial tells the task, which must still see it or leave the flag up.
#[test]
fn loom_spurious_check_loses_no_denial_above_the_mark() {
    model(Some(PREEMPTION_BOUND), || {
        let low_water = 1;
        let (bucket, signal) = start(2);
        let caller = spawn_caller(&bucket, &signal, 0, low_water, 3);
        let dropped = spurious(&bucket, &signal, low_water);
        caller.join().unwrap();
        assert!(signal.was_denied());
        assert_not_lost(&bucket, &signal, low_water, !dropped);
    });
}

/// The same in single-word mode (a grant too small to shard): one caller takes one token, the
/// other asks for more than is left and is denied.
#[test]
fn loom_spurious_check_loses_no_crossing_or_denial_single_word() {
    model(Some(PREEMPTION_BOUND), || {
        let low_water = 3;
        let (bucket, signal) = start(3);
        let callers = [
            spawn_caller(&bucket, &signal, 0, low_water, 1),
            spawn_caller(&bucket, &signal, 1, low_water, 3),
        ];
        let dropped = spurious(&bucket, &signal, low_water);
        callers.into_iter().for_each(|c| c.join().unwrap());
        assert_not_lost(&bucket, &signal, low_water, !dropped);
    });
}

/// A caller crosses the mark (or is denied) while the task ends a lease.
#[test]
fn loom_end_of_lease_loses_no_crossing_or_denial() {
    model(Some(PREEMPTION_BOUND), || {
        let low_water = SHARDED;
        let (bucket, signal) = start(SHARDED);
        let after = bucket.available();
        let callers = [
            spawn_caller(&bucket, &signal, 0, low_water, 1),
            spawn_caller(&bucket, &signal, 1, low_water, SHARDED),
        ];
        after_lease(&bucket, &signal, low_water, after);
        callers.into_iter().for_each(|c| c.join().unwrap());
        assert_not_lost(&bucket, &signal, low_water, false);
    });
}
