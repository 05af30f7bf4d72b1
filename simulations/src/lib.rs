//! # ratelease fleet simulator
//!
//! Runs one rate limit shared by a simulated fleet under uneven traffic and compares the
//! limiter modes: pure-Redis (one script call per request), hybrid (leasing, the library's
//! current policy), hybrid-fixed (a fixed batch lease) and static-share
//! (rate / N per node, no coordination). It drives the **real limiter code** of `ratelease`;
//! only the network and the Redis server are modelled.
//!
//! ## Design
//!
//! - **Virtual time** ([`scheduler`], [`sim`]). Each mode runs on a fresh current-thread tokio
//!   runtime with paused time. Because tokio's timers have millisecond resolution, the
//!   simulator keeps its own nanosecond event queue and moves tokio's paused clock to each
//!   event exactly (`tokio::time::advance`), stopping at every millisecond so the library's
//!   tokio timers fire on time. The store's clock is [`ratelease::TokioClock`], so store and
//!   limiters share one virtual time. No wall-clock time or thread scheduling enters a run.
//! - **Store model** ([`store_model`]). One shared `MemoryStore` (the same bucket arithmetic
//!   as the Lua script) behind a modelled network round trip (default mean 90 µs) and a
//!   single-threaded Redis server (a service time per kind of call, measured on a real
//!   redis-server by [`calibrate`]; FIFO queueing), with outages and latency spikes as timed
//!   events. Its busy time is the Redis CPU a fleet costs.
//! - **Fleet events** ([`scenario::NodeLife`]). Crashes, joins, a whole fleet starting at
//!   once, rolling restarts, scale-out and scale-in; [`sweep`] runs one scenario at several
//!   fleet sizes.
//! - **Demand** ([`demand`]). Per-node Poisson arrivals with piecewise-constant rates
//!   (uniform, Zipf, hot node, moving hot spot, on/off), generated once from the seed and
//!   replayed identically to every mode.
//! - **Modes** ([`modes`]). The per-node limiters and what one request does in each mode;
//!   generic over the store so live mode ([`live`]) reuses it against a real Redis.
//! - **Determinism** ([`rng`], [`record`]). One master seed, split into named streams; each
//!   run's request and store-call log is hashed (FNV-1a) into a `trace_hash`.
//! - **Results** ([`metrics`], [`report`], [`plots`]). Metrics are pure functions of the log;
//!   the report directory holds `report.json`, `windows.csv`, `summary.md` and SVG plots, and
//!   ends with the mode the numbers recommend for this traffic ([`recommend`]).

pub mod calibrate;
pub mod demand;
pub mod exec;
pub mod live;
pub mod lock_mode;
pub mod metrics;
pub mod modes;
pub mod plots;
pub mod recommend;
pub mod record;
pub mod report;
pub mod rng;
pub mod scenario;
pub mod scheduler;
pub mod sim;
pub mod store_model;
pub mod sweep;

pub use metrics::ModeMetrics;
pub use record::RunLog;
pub use scenario::{Mode, Scenario};
