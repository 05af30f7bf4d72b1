//! [`RedisStore`] running the fixed-window, sliding-window and leaky-bucket scripts
//! ([`crate::algorithm`]), through the same EVALSHA path as the token bucket.

use std::sync::LazyLock;

use super::RedisStore;
use crate::algorithm::{
    Algorithm, Op, Reply, FIXED_WINDOW_LUA, LEAKY_BUCKET_LUA, SLIDING_WINDOW_LUA,
};
use crate::error::StoreError;
use crate::protocol::{algorithm_key, LeaseReply};
use crate::quota::Quota;

static FIXED_WINDOW: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(FIXED_WINDOW_LUA));
static SLIDING_WINDOW: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(SLIDING_WINDOW_LUA));
static LEAKY_BUCKET: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(LEAKY_BUCKET_LUA));

impl RedisStore {
    /// The Redis keys holding `algorithm`'s state for `name`'s budget of `client` (or its
    /// fleet-wide one), in the order its script takes them: `<bucket key><suffix>` with the
    /// suffix `:fw`, `:sw` (and the log's total at `:sw:n`), `:lb`, then the client's.
    pub fn algorithm_keys(
        &self,
        name: &str,
        algorithm: Algorithm,
        client: Option<u64>,
    ) -> Vec<String> {
        let key = algorithm_key(&self.key(name), algorithm, client);
        match algorithm {
            Algorithm::TokenBucket => self.keys(name, client).to_vec(),
            Algorithm::SlidingWindow => vec![key.clone(), format!("{key}:n")],
            Algorithm::FixedWindow | Algorithm::LeakyBucket => vec![key],
        }
    }

    /// Runs `algorithm`'s script for `op`.
    pub(super) async fn run_algorithm(
        &self,
        name: &str,
        client: Option<u64>,
        quota: &Quota,
        algorithm: Algorithm,
        op: Op,
    ) -> Result<LeaseReply, StoreError> {
        let script = match algorithm {
            Algorithm::FixedWindow => &FIXED_WINDOW,
            Algorithm::SlidingWindow => &SLIDING_WINDOW,
            Algorithm::LeakyBucket => &LEAKY_BUCKET,
            Algorithm::TokenBucket => {
                return Err(StoreError::Rejected("invalid argument algorithm".into()))
            }
        };
        let (a, b) = match op {
            Op::Lease { want, min } => (want.to_string(), min.to_string()),
            Op::Release { tokens, at } => (
                tokens.to_string(),
                at.map(|at| at.to_string()).unwrap_or_default(),
            ),
            Op::Peek => Default::default(),
        };
        let args = [
            op.name().to_owned(),
            quota.rate().to_string(),
            quota.period_us().to_string(),
            quota.burst().to_string(),
            a,
            b,
            self.now_arg(),
        ];
        let keys = self.algorithm_keys(name, algorithm, client);
        let reply = self.eval_counts(script, &keys, args.iter()).await?;
        let [granted, remaining, retry_after_us, reset_after_us, at_us] = reply[..] else {
            return Err(StoreError::BadReply(format!(
                "expected 5 integers, got {reply:?}"
            )));
        };
        let reply = Reply {
            granted,
            remaining,
            retry_after_us,
            reset_after_us,
            at_us,
        };
        Ok(reply.into_lease_reply(quota))
    }
}
