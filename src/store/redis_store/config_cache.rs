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
//! [`DEFAULT_CONFIG_REFRESH`]), learned here from every call that reads it (any call sending
//! every key, a config op). A name not known yet, or known for longer than the refresh time,
//! is refreshed by the call at hand sending every key (one call, as before: never an extra
//! round trip); while that call is out, the name's other calls go on with one key under the
//! config known so far. So per name and refresh period one call sends every key — the one that
//! can meet `TRYAGAIN` if it falls inside a slot migration. A config changed by this store
//! applies at once; one changed elsewhere applies to pure-mode calls within the refresh time
//! (and a call), to a node's next lease on terms at once (such leases send every key; a fixed
//! batch lease, being anonymous, is a pure-mode call here).
//!
//! A one-key call on a bucket with leasers on record is answered "send every key" and sent
//! again: two script calls for one decision (a pure-mode client beside hybrid nodes, a node
//! deciding per request: 25 µs of Redis CPU where a decision alone costs 11, measured with
//! `simulate calibrate`). So a bucket (a name, or one client's budget of it) whose one-key
//! call found leasers sends every key for a refresh time, then tries one key again: about one
//! call in vain per bucket and refresh time (every call already out when that time ends may
//! be one too). Buckets without leasers — other clients' budgets of the same name — keep
//! their one-key calls. Bounded like the configs ([`MAX_NAMES`]).
//!
//! The cache is bounded ([`MAX_NAMES`]): a keyed limiter makes one name per key. When it is
//! full, entries older than the refresh time are dropped (at most once per refresh time); a
//! name that still finds no room is not cached, and its calls send every key as before.
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
    /// When a call set out to read it again (it sends every key), if one did since.
    refreshing_since: Option<Instant>,
}

/// Names' central configs as last read, each trusted for `refresh`.
#[derive(Debug)]
pub(super) struct ConfigCache {
    refresh: Duration,
    names: DashMap<Box<str>, Entry>,
    /// When stale entries were last dropped.
    pruned: Mutex<Instant>,
    /// Buckets (by key) whose one-key call found leasers on record, and when.
    leased: DashMap<Box<str>, Instant>,
    /// When stale entries of `leased` were last dropped.
    leased_pruned: Mutex<Instant>,
}

impl ConfigCache {
    /// A cache whose entries are trusted for `refresh` (zero: never, every call reads the
    /// config).
    pub(super) fn new(refresh: Duration) -> Self {
        ConfigCache {
            refresh,
            names: DashMap::new(),
            pruned: Mutex::new(Instant::now()),
            leased: DashMap::new(),
            leased_pruned: Mutex::new(Instant::now()),
        }
    }

    /// The config a call on `name` may run under with one key: `Some(None)` if the name has
    /// none. `None` — send every key, which reads it — if the name is unknown, or if its
    /// config is older than the refresh time and no other call is reading it already (this
    /// caller is then the one that does; a read that has not answered within the refresh time
    /// is given up on and another caller tries).
    pub(super) fn fresh(&self, name: &str) -> Option<Option<Quota>> {
        if self.refresh.is_zero() {
            return None;
        }
        let mut entry = self.names.get_mut(name)?;
        if entry.read_at.elapsed() < self.refresh
            || entry
                .refreshing_since
                .is_some_and(|since| since.elapsed() < self.refresh)
        {
            return Some(entry.config);
        }
        entry.refreshing_since = Some(Instant::now());
        None
    }

    /// Whether anything is cached (a zero refresh: every call reads the config).
    pub(super) fn enabled(&self) -> bool {
        !self.refresh.is_zero()
    }

    /// Whether what is read of `name`'s config now would be kept (after dropping stale
    /// entries if the cache is full).
    fn has_room_for(&self, name: &str) -> bool {
        room_in(&self.names, name, &self.pruned, self.refresh, |e| e.read_at)
    }

    /// Remembers that a one-key call on the bucket `key` found leasers on record: its calls
    /// send every key for a refresh time (see [`has_leasers`](Self::has_leasers)).
    pub(super) fn found_leasers(&self, key: &str) {
        if self.refresh.is_zero() {
            return;
        }
        if room_in(
            &self.leased,
            key,
            &self.leased_pruned,
            self.refresh,
            |&seen| seen,
        ) {
            self.leased.insert(key.into(), Instant::now());
        }
    }

    /// Whether a one-key call on the bucket `key` found leasers within the refresh time: then
    /// its calls send every key at once (one script call a decision, not two).
    pub(super) fn has_leasers(&self, key: &str) -> bool {
        self.leased
            .get(key)
            .is_some_and(|seen| seen.elapsed() < self.refresh)
    }

    /// Remembers `name`'s config as just read: its stored quota, or `None`.
    pub(super) fn learn(&self, name: &str, config: Option<Quota>) {
        if self.refresh.is_zero() {
            return;
        }
        let entry = Entry {
            config,
            read_at: Instant::now(),
            refreshing_since: None,
        };
        if let Some(mut known) = self.names.get_mut(name) {
            *known = entry;
        } else if self.has_room_for(name) {
            self.names.insert(name.into(), entry);
        }
    }
}

/// Whether `map` (at most [`MAX_NAMES`] entries) has room for `key`, after dropping the entries
/// older than `refresh` (by `at`) if it is full — at most once per refresh time (`pruned`: when
/// it last did), so a full map of fresh entries is not walked per call.
fn room_in<V>(
    map: &DashMap<Box<str>, V>,
    key: &str,
    pruned: &Mutex<Instant>,
    refresh: Duration,
    at: impl Fn(&V) -> Instant,
) -> bool {
    if map.len() < MAX_NAMES || map.contains_key(key) {
        return true;
    }
    if let Some(mut last) = pruned.try_lock() {
        if last.elapsed() >= refresh {
            *last = Instant::now();
            map.retain(|_, v| at(v).elapsed() < refresh);
        }
    }
    map.len() < MAX_NAMES
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
        LeaseReply::empty(quota, source)
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
    fn a_bucket_with_leasers_sends_every_key_for_a_refresh_time() {
        // Long enough that a loaded test machine does not make it stale between two lines.
        let cache = ConfigCache::new(Duration::from_millis(300));
        assert!(!cache.has_leasers("n"));
        cache.found_leasers("n");
        // That bucket only: another client's budget of the name keeps its one-key calls.
        assert!(cache.has_leasers("n") && !cache.has_leasers("n:c1"));
        std::thread::sleep(Duration::from_millis(350));
        assert!(
            !cache.has_leasers("n"),
            "a refresh time later, one key again"
        );
        let never = ConfigCache::new(Duration::ZERO);
        never.found_leasers("n");
        assert!(!never.has_leasers("n"));
    }

    #[test]
    fn a_zero_refresh_never_trusts_and_entries_go_stale() {
        let q = Quota::per_second(7).unwrap();
        let never = ConfigCache::new(Duration::ZERO);
        assert!(!never.enabled());
        never.learn("a", Some(q));
        assert_eq!(never.fresh("a"), None);
        // Long enough that a loaded test machine does not make it stale between two lines.
        let short = ConfigCache::new(Duration::from_millis(300));
        short.learn("a", Some(q));
        assert_eq!(short.fresh("a"), Some(Some(q)));
        std::thread::sleep(Duration::from_millis(350));
        // Stale: the first caller reads it again (every key); the others go on meanwhile.
        assert_eq!(short.fresh("a"), None);
        assert_eq!(short.fresh("a"), Some(Some(q)));
        // That read never answered: after the refresh time another caller tries.
        std::thread::sleep(Duration::from_millis(350));
        assert_eq!(short.fresh("a"), None);
        short.learn("a", None);
        assert_eq!(short.fresh("a"), Some(None));
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
        cache.learn("new", Some(q));
        assert_eq!(cache.fresh("new"), None, "not kept");
        cache.learn("n0", Some(q));
        assert_eq!(cache.fresh("n0"), Some(Some(q)));
    }

    #[test]
    fn a_full_cache_drops_stale_entries_to_make_room() {
        // Long enough that filling it on a loaded test machine leaves every entry fresh.
        let cache = ConfigCache::new(Duration::from_millis(1_000));
        for i in 0..MAX_NAMES {
            cache.learn(&format!("n{i}"), None);
        }
        assert!(!cache.has_room_for("new"));
        std::thread::sleep(Duration::from_millis(1_050));
        cache.learn("n0", None);
        cache.learn("new", None);
        assert_eq!(cache.names.len(), 2, "only the fresh entries stay");
        assert_eq!(cache.fresh("new"), Some(None));
    }
}
