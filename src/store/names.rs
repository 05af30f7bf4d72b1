//! One name, one quota: which limiters of this process spend which bucket of which store, and
//! under which quota.
//!
//! A store keeps one bucket per name (per algorithm, and per client under
//! [`Budget::PerClient`](crate::Budget::PerClient)). Two limiters built with the same name
//! share it, and every call runs under its caller's quota unless the name has a central config
//! ([`crate::config`]): with different builder quotas the bucket answers neither, and nothing
//! says so. The store cannot tell either — the token-bucket script runs each call under the
//! quota it is given, and a bucket rescaled to a new quota is how a central change is applied.
//!
//! So the builders check in process, where it costs nothing on any hot path: each limiter
//! registers (store, bucket, quota) when it is built and leaves when its last clone is dropped
//! (a [`Registration`]); a limiter registering a quota that differs from every quota a live
//! limiter holds on the same bucket gets a `tracing::warn!`, once per bucket and quota. It is a
//! warning, not an error: a config reload may build the new limiter before dropping the old
//! one, and with a central config the builders' quotas are only the fallback for a name that
//! has none.
//!
//! What it does not see: limiters in other processes (a fleet must get one quota from one
//! place: a shared config, or a quota stored centrally, which every limiter on the name then
//! runs under), stores connected separately to the same server (a store is recognised by
//! instance, which its clones share), stores other than [`RedisStore`] and [`MemoryStore`],
//! and a plain limiter named like one key's bucket of a keyed limiter (`name#key`).

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use parking_lot::Mutex;

use super::{LeaseStore, MemoryStore, RedisStore};
use crate::algorithm::Algorithm;
use crate::quota::Quota;

/// Which of a store's buckets a limiter spends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Scope {
    /// A limiter's bucket: one per algorithm (each runs on keys of its own), and per client
    /// id under `Budget::PerClient`.
    Named {
        algorithm: Algorithm,
        client: Option<u64>,
    },
    /// Every key's bucket of a keyed limiter (`name#key`).
    Keyed,
}

/// One bucket of one store instance.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Bucket {
    /// The store's identity ([`store_id`]).
    store: usize,
    scope: Scope,
    name: Arc<str>,
}

/// The quotas the live limiters of a bucket were built with, and how many hold each.
type Quotas = Vec<(Quota, usize)>;

/// Every bucket with live limiters.
static LIVE: LazyLock<Mutex<HashMap<Bucket, Quotas>>> = LazyLock::new(Default::default);

/// A limiter's entry in the registry, removed when it is dropped (with the limiter's last
/// clone).
#[derive(Debug)]
pub(crate) struct Registration {
    bucket: Bucket,
    quota: Quota,
}

/// An identity for `store` that its clones share and no other live store has (the address of
/// its shared state), for the stores whose buckets are known to be theirs alone; `None` for
/// any other store.
fn store_id<S: LeaseStore>(store: &S) -> Option<usize> {
    let any: &dyn Any = store;
    if let Some(redis) = any.downcast_ref::<RedisStore>() {
        return Some(redis.instance_id());
    }
    any.downcast_ref::<MemoryStore>()
        .map(MemoryStore::instance_id)
}

/// Registers a limiter `name` that spends `scope` of `store` under `quota`, and warns if a live
/// limiter of this process spends that bucket under another quota. `None` for a store this
/// cannot identify (nothing is checked).
pub(crate) fn register<S: LeaseStore>(
    store: &S,
    name: &str,
    scope: Scope,
    quota: Quota,
) -> Option<Registration> {
    let bucket = Bucket {
        store: store_id(store)?,
        scope,
        name: name.into(),
    };
    let mut live = LIVE.lock();
    let quotas = live.entry(bucket.clone()).or_default();
    match quotas.iter_mut().find(|(q, _)| *q == quota) {
        Some((_, users)) => *users += 1,
        None => {
            if !quotas.is_empty() {
                let others: Vec<Quota> = quotas.iter().map(|&(q, _)| q).collect();
                tracing::warn!(
                    limiter = %name,
                    ?quota,
                    ?others,
                    "another limiter in this process uses this name on the same store with a \
                     different quota: they share one bucket, and each call runs under its own \
                     caller's quota unless the name has a central config; give them one quota, \
                     or store it centrally (ConfigStore) so that every limiter on the name runs \
                     under it"
                );
            }
            quotas.push((quota, 1));
        }
    }
    Some(Registration { bucket, quota })
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut live = LIVE.lock();
        let Some(quotas) = live.get_mut(&self.bucket) else {
            return;
        };
        if let Some(i) = quotas.iter().position(|(q, _)| *q == self.quota) {
            quotas[i].1 -= 1;
            if quotas[i].1 == 0 {
                quotas.swap_remove(i);
            }
        }
        if quotas.is_empty() {
            live.remove(&self.bucket);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(store: &MemoryStore, name: &str) -> Quotas {
        let bucket = Bucket {
            store: store.instance_id(),
            scope: Scope::Keyed,
            name: name.into(),
        };
        LIVE.lock().get(&bucket).cloned().unwrap_or_default()
    }

    #[test]
    fn entries_count_their_limiters_and_leave_with_the_last() {
        let store = MemoryStore::new();
        let (a, b) = (Quota::per_second(1).unwrap(), Quota::per_second(2).unwrap());
        let first = register(&store, "names-unit", Scope::Keyed, a).unwrap();
        let second = register(&store.clone(), "names-unit", Scope::Keyed, a).unwrap();
        let other = register(&store, "names-unit", Scope::Keyed, b).unwrap();
        assert_eq!(live(&store, "names-unit"), [(a, 2), (b, 1)]);
        drop((first, other));
        assert_eq!(live(&store, "names-unit"), [(a, 1)]);
        drop(second);
        assert!(live(&store, "names-unit").is_empty());
        assert!(LIVE.lock().keys().all(|k| &*k.name != "names-unit"));
    }
}
