//! How simulated code runs: what both the fleet ([`crate::modes`]) and the store model
//! ([`crate::store_model`]) need — a run's clock, the request a store call is made for, and
//! polling a future that is ready at once.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

tokio::task_local! {
    /// The index (in the demand trace) of the request a pure-Redis store call is made for.
    pub static REQUEST: usize;
}

/// A reading of the run's clock, ns since its start.
pub type NowFn = Arc<dyn Fn() -> u64 + Send + Sync>;

/// Polls a future that must be ready at once (every `MemoryStore` future is).
pub(crate) fn ready<F: Future>(f: F) -> F::Output {
    match pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => unreachable!("MemoryStore futures complete on their first poll"),
    }
}
