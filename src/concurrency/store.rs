//! Where a concurrency limit's holder records live: [`ConcurrencyStore`].
//!
//! One method runs one step of [`holders::step`](super::holders::step) atomically for one
//! limiter name. [`RedisStore`] runs `lua/concurrency.lua` (EVALSHA through
//! `RedisStore::eval`, so NOSCRIPT reloads, timeouts and ACL errors are handled as for the
//! token bucket) on the keys `<prefix>{<name>}:conc` and `…:conc:expiry`: the limiter's hash
//! tag with a suffix of their own, so they never collide with the token bucket of the same
//! name. [`MemoryStore`] runs the Rust twin under the name's `dashmap` shard lock, on its
//! clock, counting each call as Redis would count a script call.

use std::future::Future;
use std::sync::LazyLock;

use super::holders::{self, Op, Reply};
use crate::error::StoreError;
use crate::store::{MemoryStore, RedisStore};

/// The complete concurrency script, ready for `EVAL`: `lua/helpers.lua`, `lua/arguments.lua`
/// and `lua/concurrency.lua`. Other languages can run it against the same keys (see the last
/// one's header for the argument protocol), or concatenate the three files the same way.
pub const CONCURRENCY_LUA: &str = lua_script!("arguments.lua", "concurrency.lua");

static SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(CONCURRENCY_LUA));

/// How many memory-store calls between sweeps of names whose every holder expired.
const SWEEP_EVERY: u64 = 4096;

/// Holder records of concurrency limits, addressed by limiter name.
///
/// Implementations must be atomic per name: concurrent calls behave as if run one at a time.
pub trait ConcurrencyStore: Send + Sync + 'static {
    /// Runs `op` on `name`'s holder records, after reclaiming the holders that expired.
    ///
    /// Invalid arguments are rejected with [`StoreError::Rejected`] and change nothing.
    fn concurrency(
        &self,
        name: &str,
        op: &Op<'_>,
    ) -> impl Future<Output = Result<Reply, StoreError>> + Send;
}

impl RedisStore {
    /// The two Redis keys of `name`'s concurrency limit: the holders hash and the expiry index.
    pub fn concurrency_keys(&self, name: &str) -> [String; 2] {
        let hash = format!("{}:conc", self.key(name));
        let expiry = format!("{hash}:expiry");
        [hash, expiry]
    }
}

impl ConcurrencyStore for RedisStore {
    async fn concurrency(&self, name: &str, op: &Op<'_>) -> Result<Reply, StoreError> {
        let keys = self.concurrency_keys(name);
        let args = script_args(op, self.now_arg());
        let reply = self.eval_counts(&SCRIPT, &keys, args.iter()).await?;
        match reply[..] {
            [granted, in_use, held, existed @ (0 | 1)] => Ok(Reply {
                granted,
                in_use,
                held,
                existed: existed == 1,
            }),
            _ => Err(StoreError::BadReply(format!(
                "expected 4 integers, got {reply:?}"
            ))),
        }
    }
}

/// The script's nine arguments for `op` at `now` (`""` for the server's clock).
fn script_args(op: &Op<'_>, now: String) -> Vec<String> {
    let numbers = op
        .numbers()
        .map(|v| v.map_or_else(String::new, |v| v.to_string()));
    [op.name().to_owned(), now, op.holder().to_owned()]
        .into_iter()
        .chain(numbers)
        .collect()
}

impl ConcurrencyStore for MemoryStore {
    async fn concurrency(&self, name: &str, op: &Op<'_>) -> Result<Reply, StoreError> {
        let now = self.now_us();
        let map = self.holders();
        if self.count_call().is_multiple_of(SWEEP_EVERY) {
            map.retain(|_, h| h.records.values().any(|r| r.expires_us > now));
        }
        let mut entry = map.entry(name.to_owned()).or_default();
        let result = holders::step(&mut entry, op, now);
        let empty = entry.records.is_empty();
        drop(entry);
        if empty {
            map.remove_if(name, |_, h| h.records.is_empty());
        }
        result.map_err(|e| StoreError::Rejected(e.to_string()))
    }
}
