//! A discrete-event scheduler on top of tokio's paused clock.
//!
//! # Why not just `tokio::time::sleep`
//!
//! Paused tokio time is virtual, but tokio's timer wheel has a resolution of one millisecond:
//! every deadline is rounded up to the next whole millisecond (a 1 µs sleep takes 1 ms, a
//! 100 µs sleep started at 1.3 ms ends at 2 ms). A store round trip of 90 µs and tens of µs of
//! Redis service time cannot be modelled with it.
//!
//! # How it works
//!
//! The simulator keeps its own queue of timed callbacks, ordered by (time in ns, insertion
//! number), and one driver (see [`crate::sim`]) pops them in order. Before running the callbacks
//! due at time `t`, the driver moves tokio's paused clock to exactly `t` with
//! `tokio::time::advance`, so `tokio::time::Instant::now()`, [`ratelease::TokioClock`] and
//! therefore the `MemoryStore` all read `t`, to the nanosecond. The driver also stops at every
//! millisecond boundary so that the library's own tokio timers (lease back-off, over-limit
//! waits) fire at the tick where real tokio would fire them.
//!
//! Callbacks run on the driver, outside the queue's lock, and may schedule more callbacks.
//! Everything is single-threaded and ordered, so a run is a pure function of its seed.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, Ordering as MemOrdering};
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

/// A scheduled piece of work.
pub type Callback = Box<dyn FnOnce() + Send>;

struct Entry {
    at_ns: u64,
    seq: u64,
    /// If set (true) when the entry comes due, it is dropped without advancing time.
    cancelled: Option<Arc<AtomicBool>>,
    run: Callback,
}

impl Entry {
    fn is_cancelled(&self) -> bool {
        self.cancelled
            .as_ref()
            .is_some_and(|c| c.load(MemOrdering::Relaxed))
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.at_ns, self.seq) == (other.at_ns, other.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    /// Reversed, so the `BinaryHeap` (a max-heap) pops the earliest entry first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at_ns, other.seq).cmp(&(self.at_ns, self.seq))
    }
}

#[derive(Default)]
struct Queue {
    heap: BinaryHeap<Entry>,
    seq: u64,
}

/// The queue of timed callbacks, and the origin of virtual time.
pub struct Scheduler {
    origin: Instant,
    queue: Mutex<Queue>,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("now_ns", &self.now_ns())
            .field("pending", &self.queue().heap.len())
            .finish()
    }
}

impl Scheduler {
    /// A scheduler whose time zero is tokio's "now". Call inside the simulation's runtime.
    pub fn new() -> Arc<Self> {
        Arc::new(Scheduler {
            origin: Instant::now(),
            queue: Mutex::new(Queue::default()),
        })
    }

    /// tokio's instant for time zero.
    pub fn origin(&self) -> Instant {
        self.origin
    }

    /// Virtual time since the origin, ns.
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn push(&self, at_ns: u64, cancelled: Option<Arc<AtomicBool>>, run: Callback) {
        let mut q = self.queue();
        let seq = q.seq;
        q.seq += 1;
        q.heap.push(Entry {
            at_ns,
            seq,
            cancelled,
            run,
        });
    }

    /// Runs `f` at `at_ns` (or at once, on the next driver step, if that is in the past).
    pub fn at(&self, at_ns: u64, f: impl FnOnce() + Send + 'static) {
        self.push(at_ns, None, Box::new(f));
    }

    /// Runs `f` at `at_ns` unless `cancelled` is true by then; a cancelled entry costs the
    /// driver no step.
    pub fn at_unless(
        &self,
        at_ns: u64,
        cancelled: Arc<AtomicBool>,
        f: impl FnOnce() + Send + 'static,
    ) {
        self.push(at_ns, Some(cancelled), Box::new(f));
    }

    /// When the next live callback is due, dropping cancelled ones on the way.
    pub fn next_at(&self) -> Option<u64> {
        let mut q = self.queue();
        while let Some(top) = q.heap.peek() {
            if top.is_cancelled() {
                q.heap.pop();
            } else {
                return Some(top.at_ns);
            }
        }
        None
    }

    /// The next callback due at or before `now_ns`, if any.
    pub fn pop_due(&self, now_ns: u64) -> Option<Callback> {
        let mut q = self.queue();
        while let Some(top) = q.heap.peek() {
            if top.at_ns > now_ns {
                return None;
            }
            let entry = q.heap.pop().expect("peeked");
            if !entry.is_cancelled() {
                return Some(entry.run);
            }
        }
        None
    }

    /// Drops every pending callback (ending the run; callbacks hold references to the store
    /// model, so this also breaks the reference cycle).
    pub fn clear(&self) {
        let heap = std::mem::take(&mut self.queue().heap);
        drop(heap); // outside the lock: dropping callbacks may drop their captured state
    }

    /// Callbacks waiting (cancelled ones included until they are dropped).
    pub fn len(&self) -> usize {
        self.queue().heap.len()
    }

    /// True when nothing is scheduled.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn pops_in_time_then_insertion_order_and_skips_cancelled() {
        let s = Scheduler::new();
        let log = Arc::new(Mutex::new(Vec::new()));
        let cancel = Arc::new(AtomicBool::new(false));
        for (t, tag) in [(30, "c"), (10, "a"), (10, "b"), (20, "x")] {
            let log = log.clone();
            let f = move || log.lock().unwrap().push(tag);
            if tag == "x" {
                s.at_unless(t, cancel.clone(), f);
            } else {
                s.at(t, f);
            }
        }
        cancel.store(true, MemOrdering::Relaxed);
        assert_eq!(s.next_at(), Some(10));
        assert!(s.pop_due(9).is_none());
        while let Some(t) = s.next_at() {
            while let Some(f) = s.pop_due(t) {
                f();
            }
        }
        assert_eq!(*log.lock().unwrap(), ["a", "b", "c"]);
        assert!(s.is_empty());
    }
}
