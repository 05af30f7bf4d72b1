//! The atomics, thread-locals and yield of the lease tier's lock-free parts ([`super::local`],
//! [`super::refill`]): `std`'s in every build, loom's in unit tests built with
//! `--cfg ratelease_loom`, so that the loom models run the production code itself.
//!
//! Outside such a test build these are plain re-exports of `std` items (the same types, so the
//! same code is generated). Under the cfg only the lib's tests whose names contain `loom` may
//! run, each inside `loom::model` (a loom atomic panics outside one):
//!
//! ```sh
//! RUSTFLAGS="--cfg ratelease_loom" CARGO_TARGET_DIR=target/loom cargo test --release --lib loom
//! ```
//!
//! The one other difference in that build is `local::SLOTS`: 2 instead of 8, to keep loom's
//! state space small.
//!
//! The cfg is `ratelease_loom`, not loom's customary `loom`, which would also switch tokio
//! (a dependency) to its own loom build.

#[cfg(not(all(test, ratelease_loom)))]
pub(crate) use std::{
    sync::atomic::{AtomicBool, AtomicU64},
    thread::yield_now,
};

#[cfg(all(test, ratelease_loom))]
pub(crate) use loom::{
    sync::atomic::{AtomicBool, AtomicU64},
    thread::yield_now,
};

/// `thread_local!` with a `const` initializer: `std`'s (`const { init }`: no lazy-init check,
/// no destructor), or loom's, whose macro takes no `const` block.
#[cfg(not(all(test, ratelease_loom)))]
macro_rules! const_thread_local {
    ($(#[$attr:meta])* static $name:ident: $t:ty = $init:expr;) => {
        std::thread_local! {
            $(#[$attr])* static $name: $t = const { $init };
        }
    };
}

/// `thread_local!` with a `const` initializer: `std`'s (`const { init }`: no lazy-init check,
/// no destructor), or loom's, whose macro takes no `const` block.
#[cfg(all(test, ratelease_loom))]
macro_rules! const_thread_local {
    ($(#[$attr:meta])* static $name:ident: $t:ty = $init:expr;) => {
        loom::thread_local! {
            $(#[$attr])* static $name: $t = $init;
        }
    };
}

pub(crate) use const_thread_local;
