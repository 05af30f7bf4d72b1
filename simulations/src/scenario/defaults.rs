//! A scenario's defaults, the measured Redis service times among them.

pub(super) fn default_seed() -> u64 {
    1
}

pub(super) fn default_window_ms() -> u64 {
    1000
}

pub(super) fn default_rtt_us() -> f64 {
    90.0
}

/// Redis CPU per call, µs, as measured on redis-server 7.0.15 (Debian's package) on this
/// project's 2-core test machine, idle, with the server and the client pinned to a core each:
/// `taskset -c 1 cargo run --release -p simulations -- calibrate --redis URL` against
/// `taskset -c 0 redis-server` (`INFO cpu` over the calls: the command and its network I/O;
/// SIMULATIONS.md "Calibration" has the whole table). A node's lease on terms (the most
/// expensive of 10, 1 000 and 10 000 leasers on record), an anonymous lease, a release, and
/// one plain command. Calibrate against your own Redis and set the scenario keys to model it.
/// The pure decision was re-measured after the script's short path for it (three runs: 16.4,
/// 16.5, 16.6 µs, was 23.1); the other three re-measured within their noise (lease 28.8–34.5,
/// release 23.8–25.0, command 4.2–4.4) and kept.
///
/// Since then the scripts were cut by more than such timings can see (±20 % between runs on
/// that machine), so these are the timed values scaled by the instructions Redis counts per
/// call before and after (`scripts/script-instructions.sh`): a pure decision 16.5 µs ×
/// 99 139 / 121 490, a node lease 31.5 µs × 207 374 / 277 716 and a release 25.9 µs ×
/// 170 265 / 215 933 (a lease without its tiny function calls; 13.6, 24.2 and 20.7 µs before,
/// 13.9, 26.7 and 22.7 before the arguments were checked written out, and before packed node
/// calls 27.9 and 23.2 µs). Timed in alternated pairs, an earlier cut of
/// the node lease read 0.86× the Redis CPU per call against the 0.88× counted.
pub const MEASURED_SERVICE_US: ServiceUs = ServiceUs {
    lease: 23.5,
    pure: 13.5,
    release: 20.4,
    command: 5.0,
};

/// Redis server time per kind of call, µs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ServiceUs {
    /// A node's lease on terms.
    pub lease: f64,
    /// An anonymous lease.
    pub pure: f64,
    /// A release.
    pub release: f64,
    /// A plain command.
    pub command: f64,
}

pub(super) fn default_service_us() -> f64 {
    MEASURED_SERVICE_US.lease
}

pub(super) fn default_service_pure_us() -> f64 {
    MEASURED_SERVICE_US.pure
}

pub(super) fn default_service_release_us() -> f64 {
    MEASURED_SERVICE_US.release
}

pub(super) fn default_service_command_us() -> f64 {
    MEASURED_SERVICE_US.command
}

pub(super) fn default_timeout_ms() -> f64 {
    50.0
}

pub(super) fn default_prefetch() -> bool {
    true
}

pub(super) fn is_true(b: &bool) -> bool {
    *b
}

pub(super) fn is_false(b: &bool) -> bool {
    !*b
}

pub(super) fn is_zero(x: &f64) -> bool {
    *x == 0.0
}
