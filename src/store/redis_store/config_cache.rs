//! What a store last learned of each name's central config, so that a pure-mode call can send
//! the bucket's key alone.
//!
//! A token-bucket call that sends the name's config key reads the config on every call: the
//! quota an operator stored applies at once. It also makes every pure-mode call a four-key
//! command — bucket, leasers hash, expiry index, config — and on a Redis Cluster a command
//! whose keys are not all on one node answers `TRYAGAIN` while its slot migrates. The leasers'
//! keys of a pure-mode bucket never exist, so *every* pure call on a migrating slot waited for
//! the handover (about 1.3 s in `tests/cluster.rs`). It also costs Redis a read per call.
//!
//! So an anonymous call sends one key — the bucket — with the quota that applies passed as its
//! own; the script's one-key protocol runs it as the three-key one on a bucket with no leasers
//! (and says so if the bucket has some: then the call is sent again with every key). The quota
//! that applies is the config read within [`RedisStoreBuilder::config_refresh`] (default
//! [`DEFAULT_CONFIG_REFRESH`]), remembered here: read by a one-key `config_get` on the config
//! hash alone when it is older (one more round trip, once per refresh per name), and learned
//! from every call that read it anyway (a node's lease, a config op). A config changed by
//! this store applies at once; one changed elsewhere applies to pure-mode calls within the
//! refresh time (to a node's next lease at once: leases always send every key).
//!
//! The cache is bounded ([`MAX_NAMES`]): a keyed pure limiter makes one name per key. When it
//! is full, entries older than the refresh time are dropped (at most once per refresh time);
//! a name that still finds no room is not cached, and its calls send every key as before
//! (one round trip, the config read with the call).
//!
//! [`RedisStoreBuilder::config_refresh`]: super::RedisStoreBuilder::config_refresh

use std::time::{Duration, Instant};

use dashmap::DashMap;
use parking_lot::Mutex;

use crate::algorithm::token_bucket::QuotaSource;
use crate::protocol::LeaseReply;
use crate::quota::Quota;

/// How long a pure-mode call trusts what it last learned of a name's central config.
pub const DEFAULT_CONFIG_REFRESH: Duration = Duration::from_secs(1);

/// The most names remembered; calls on others send every key.
pub const MAX_NAMES: usize = 4096;

/// What one name's last config read said.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The stored quota, or `None`: the name has no central config.
    config: Option<Quota>,
    /// When that was read.
    read_at: Instant,
}

/// Names' central configs as last read, each trusted for `refresh`.
#[derive(Debug)]
pub(super) struct ConfigCache {
    refresh: Duration,
    names: DashMap<Box<str>, Entry>,
    /// When stale entries were last dropped.
    pruned: Mutex<Instant>,
}

impl ConfigCache {
    /// A cache whose entries are trusted for `refresh` (zero: never, every call reads the
    /// config).
    pub(super) fn new(refresh: Duration) -> Self {
        ConfigCache {
            refresh,
            names: DashMap::new(),
            pruned: Mutex::new(Instant::now()),
        }
    }

    /// The config of `name` if read less than the refresh time ago: `Some(None)` if it has
    /// none, `None` if unknown or stale.
    pub(super) fn fresh(&self, name: &str) -> Option<Option<Quota>> {
        if self.refresh.is_zero() {
            return None;
        }
        let entry = *self.names.get(name)?;
        (entry.read_at.elapsed() < self.refresh).then_some(entry.config)
    }

    /// Whether anything is cached (a zero refresh: every call reads the config).
    pub(super) fn enabled(&self) -> bool {
        !self.refresh.is_zero()
    }

    /// Whether what is read of `name`'s config now would be kept (after dropping stale
    /// entries if the cache is full).
    pub(super) fn has_room_for(&self, name: &str) -> bool {
        if self.names.len() < MAX_NAMES || self.names.contains_key(name) {
            return true;
        }
        // At most once per refresh time: a full cache of fresh entries is not walked per call.
        if let Some(mut pruned) = self.pruned.try_lock() {
            if pruned.elapsed() >= self.refresh {
                *pruned = Instant::now();
                self.names.retain(|_, e| e.read_at.elapsed() < self.refresh);
            }
        }
        self.names.len() < MAX_NAMES
    }

    /// Remembers `name`'s config as just read: its stored quota, or `None`.
    pub(super) fn learn(&self, name: &str, config: Option<Quota>) {
        if self.refresh.is_zero() {
            return;
        }
        let entry = Entry {
            config,
            read_at: Instant::now(),
        };
        if let Some(mut known) = self.names.get_mut(name) {
            *known = entry;
        } else if self.names.len() < MAX_NAMES {
            self.names.insert(name.into(), entry);
        }
    }
}

/// The config a call that read it found: the stored quota, or `None`.
pub(super) fn stored_config(reply: &LeaseReply) -> Option<Quota> {
    match reply.source {
        QuotaSource::Stored => Some(reply.quota),
        QuotaSource::Caller | QuotaSource::Absent => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(source: QuotaSource, quota: Quota) -> LeaseReply {
        LeaseReply {
            granted: 0,
            remaining: 0,
            retry_after: Duration::ZERO,
            reset_after: Duration::ZERO,
            share_mtps: 0,
            quota,
            source,
            at: None,
        }
    }

    #[test]
    fn a_reply_names_the_stored_config_only_if_it_ran_under_it() {
        let q = Quota::per_second(7).unwrap();
        assert_eq!(stored_config(&reply(QuotaSource::Stored, q)), Some(q));
        assert_eq!(stored_config(&reply(QuotaSource::Caller, q)), None);
        assert_eq!(stored_config(&reply(QuotaSource::Absent, q)), None);
    }

    #[test]
    fn remembers_the_stored_config_or_its_absence() {
        let cache = ConfigCache::new(Duration::from_secs(60));
        let q = Quota::per_second(7).unwrap();
        assert_eq!(cache.fresh("a"), None);
        cache.learn("a", Some(q));
        cache.learn("b", None);
        assert_eq!(cache.fresh("a"), Some(Some(q)));
        assert_eq!(cache.fresh("b"), Some(None));
        cache.learn("a", None);
        assert_eq!(cache.fresh("a"), Some(None));
    }

    #[test]
    fn a_zero_refresh_never_trusts_and_entries_go_stale() {
        let q = Quota::per_second(7).unwrap();
        let never = ConfigCache::new(Duration::ZERO);
        assert!(!never.enabled());
        never.learn("a", Some(q));
        assert_eq!(never.fresh("a"), None);
        let short = ConfigCache::new(Duration::from_millis(20));
        short.learn("a", Some(q));
        assert_eq!(short.fresh("a"), Some(Some(q)));
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(short.fresh("a"), None);
    }

    #[test]
    fn holds_at_most_max_names_and_still_refreshes_known_ones() {
        let q = Quota::per_second(7).unwrap();
        let cache = ConfigCache::new(Duration::from_secs(60));
        for i in 0..MAX_NAMES + 10 {
            cache.learn(&format!("n{i}"), None);
        }
        assert_eq!(cache.names.len(), MAX_NAMES);
        assert_eq!(cache.fresh(&format!("n{}", MAX_NAMES + 5)), None);
        assert!(!cache.has_room_for("new") && cache.has_room_for("n1"));
        cache.learn("n0", Some(q));
        assert_eq!(cache.fresh("n0"), Some(Some(q)));
    }

    #[test]
    fn a_full_cache_drops_stale_entries_to_make_room() {
        let cache = ConfigCache::new(Duration::from_millis(20));
        for i in 0..MAX_NAMES {
            cache.learn(&format!("n{i}"), None);
        }
        assert!(!cache.has_room_for("new"));
        std::thread::sleep(Duration::from_millis(30));
        cache.learn("n0", None);
        assert!(cache.has_room_for("new"));
        assert_eq!(cache.names.len(), 1, "only the fresh entry stays");
        assert_eq!(cache.fresh("n0"), Some(None));
    }
}
