//! The lease tier's parts, each free of I/O: what the hybrid limiters ([`crate::hybrid`],
//! [`crate::keyed`], the pooled permits of [`crate::concurrency`]) build their background task
//! and hot path from.
//!
//! - [`local`]: the local bucket — leased tokens spent by callers with a CAS on a per-thread
//!   slot, no lock, no allocation.
//! - [`refill`]: the single-flight signal a caller raises when the bucket runs low, and the
//!   handshake that makes sure no request is lost while the task works.
//! - [`policy`]: how much to lease, when, and on what terms ([`LeasePolicy`](policy::LeasePolicy)).
//! - [`demand`]: the node's measured demand, reported to the store so fair shares follow it.
//! - [`rate_ask`]: whether a node asks for a rate lease, and how the rate shapes its token lease.
//! - [`drip`]: what a rate lease earns, added to the local bucket by the node between calls.
//!
//! The store call itself and what the task does with its reply live with each limiter.

pub(crate) mod demand;
pub(crate) mod drip;
pub(crate) mod local;
pub(crate) mod policy;
pub(crate) mod rate_ask;
pub(crate) mod refill;
mod sync;
