//! The keyed limiter's key map: open-addressing tables (hashbrown's `HashTable`: SIMD control
//! bytes, entries inline) under one `Mutex` per shard, with a seeded hasher.
//!
//! An entry is the key and its value side by side, so a hit reads the shard's header (its lock
//! word and table pointer), one group of control bytes and the entry: no pointer to follow for
//! keys that are plain values (`u64`, `IpAddr`), and no allocation per key.
//!
//! **A mutex, not a read-write lock.** A hit holds its shard's lock for a few nanoseconds: one
//! atomic read-modify-write to take it and one to drop it, whether the lock is a mutex or a
//! read lock. Under a mutex the key's state is also the caller's alone meanwhile, so taking
//! tokens is a load and a store instead of a third read-modify-write (`KeyState::take`): that
//! is a third of a hot key's cost (BENCHMARKS.md, issue 15). The price is that calls on keys
//! of one shard run one at a time — for a few nanoseconds each, on one shard of hundreds or
//! thousands — and that every hold must stay short: nothing that holds a value waits, looks
//! up another key of this map, or wakes a task it could avoid waking; walks over the map
//! ([`for_each`](KeyMap::for_each)) let go of the shard every [`SCAN_CHUNK`] buckets.
//!
//! **Shards are sized for the cap.** hashbrown tables have a power-of-two number of buckets and
//! grow when 7/8 full, so bytes per key swing by 2× as a table grows. The limiter knows its cap
//! ([`max_keys`](super::KeyedHybridBuilder::max_keys)), so the number of shards is chosen for
//! it: at the cap each shard holds about [`KEYS_PER_SHARD`] keys, 80 % of a 4 096-bucket table
//! (the margin keeps a shard that draws more keys than the mean from doubling). A full limiter
//! thus spends `(entry + 1) / 0.8` bytes per key (the 1: its control byte); a partly full one
//! swings as any hashbrown table does. Shards also bound what a resize costs: a shard grows
//! under its lock, and none holds more than a few thousand keys.
//!
//! **Shards shrink again.** After a flood the tables would stay sized for it. The worker's
//! sweep calls [`shrink`](KeyMap::shrink), which gives a shard whose entries fell below a
//! quarter of its capacity a table for twice its entries (about half full, so it does not grow
//! back at once). The new table is allocated and the old one freed without the shard's lock;
//! under it, only the entries move, and at most [`MAX_SHRINK_MOVES`] of them (a few µs), so
//! no caller waits long behind a shrink. The price: a shard that keeps more entries than that
//! in a table four times too large stays as it is until its entries fall to that many (a flood
//! swept away leaves its shards nearly empty, which is the case this is for; shrinking in
//! steps, with lookups in both tables meanwhile, would lift the limit and was not done).
//!
//! Shards are picked with bits 24–55 of the hash: hashbrown takes the bucket from the low bits
//! and the control byte from the top seven, so all three stay independent.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;
use hashbrown::hash_table::Entry;
use hashbrown::HashTable;
use parking_lot::{MappedMutexGuard, Mutex, MutexGuard};

/// Keys per shard at the cap: 80 % of a 4 096-bucket table.
pub(super) const KEYS_PER_SHARD: usize = 3_277;
/// Fewest shards, so that threads on different keys rarely share a lock word.
const MIN_SHARDS: usize = 8;
/// Most shards: 8 MiB of padded locks, sized for about 200 million keys. A larger cap (up to
/// `usize::MAX`, "no cap") gives each shard more keys instead of allocating shards for keys
/// that will never come — it aborted the process at build.
const MAX_SHARDS: usize = 1 << 16;
/// Buckets a walk over the map reads per hold of a shard's lock (about a microsecond).
pub(super) const SCAN_CHUNK: usize = 256;

/// Most entries a shrink moves while it holds a shard's lock. Measured on the 2-vCPU machine
/// of BENCHMARKS.md (loaded): about 110 ns per entry moved (entries and the new table come
/// from memory), 0.9–2 µs for 5 entries, 7–14 µs for 64; so 32, for a hold of a few µs.
pub(super) const MAX_SHRINK_MOVES: usize = 32;
/// Tables of at most this many buckets are not shrunk: it would save little.
const MIN_SHRINK_BUCKETS: usize = 64;

/// A key and its value, side by side in the table.
struct Slot<K, V> {
    key: K,
    value: V,
}

type Shard<K, V> = CachePadded<Mutex<HashTable<Slot<K, V>>>>;

/// A concurrent map from keys to values, each reached only under its shard's lock.
pub(super) struct KeyMap<K, V, H> {
    shards: Box<[Shard<K, V>]>,
    hasher: H,
    /// Entries, counted under the shards' locks.
    len: AtomicUsize,
}

/// A value held under its shard's lock.
pub(super) type Ref<'a, V> = MappedMutexGuard<'a, V>;

impl<K, V, H> KeyMap<K, V, H>
where
    K: Hash + Eq,
    H: BuildHasher,
{
    /// A map sharded for at most `max_keys` keys.
    pub(super) fn new(hasher: H, max_keys: usize) -> Self {
        let shards = max_keys
            .div_ceil(KEYS_PER_SHARD)
            .clamp(MIN_SHARDS, MAX_SHARDS);
        KeyMap {
            shards: (0..shards)
                .map(|_| CachePadded::new(Mutex::new(HashTable::new())))
                .collect(),
            hasher,
            len: AtomicUsize::new(0),
        }
    }

    #[inline]
    fn shard(&self, hash: u64) -> &Mutex<HashTable<Slot<K, V>>> {
        // Multiply-shift: any number of shards, from 32 bits the table does not use.
        let bits = (hash >> 24) & u64::from(u32::MAX);
        let index = (bits * self.shards.len() as u64) >> 32;
        &self.shards[index as usize]
    }

    #[inline]
    fn hash<Q: Hash + ?Sized>(&self, key: &Q) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The map's hasher (the worker's table of waiting callers hashes keys with it too).
    pub(super) fn hasher(&self) -> &H {
        &self.hasher
    }

    /// The value of `key`, held under its shard's lock until the guard drops. Keep it short:
    /// do not look up another key of this map while holding it (the same shard would
    /// deadlock), nor wait.
    #[inline(always)] // the hit path: without it, a call the hot key pays for
    pub(super) fn get<Q>(&self, key: &Q) -> Option<Ref<'_, V>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hash(key);
        let table = self.shard(hash).lock();
        MutexGuard::try_map(table, |t| {
            t.find_mut(hash, |slot| slot.key.borrow() == key)
                .map(|slot| &mut slot.value)
        })
        .ok()
    }

    /// Whether `key` is in the map.
    pub(super) fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get(key).is_some()
    }

    /// Inserts `key` with `value()` unless it is present; true if it inserted.
    pub(super) fn insert_new(&self, key: K, value: impl FnOnce() -> V) -> bool {
        let hash = self.hash(&key);
        let mut table = self.shard(hash).lock();
        match table.entry(
            hash,
            |slot| slot.key == key,
            |slot| self.hasher.hash_one(&slot.key),
        ) {
            Entry::Occupied(_) => false,
            Entry::Vacant(vacant) => {
                vacant.insert(Slot {
                    key,
                    value: value(),
                });
                // Relaxed: a count, read only to skip work on an empty map.
                self.len.fetch_add(1, Ordering::Relaxed);
                true
            }
        }
    }

    /// Removes `key` if `keep_out` says so, under the shard's lock (nobody holds the value
    /// meanwhile); returns the key and value removed.
    pub(super) fn remove_if<Q>(&self, key: &Q, keep_out: impl FnOnce(&V) -> bool) -> Option<(K, V)>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hash = self.hash(key);
        let mut table = self.shard(hash).lock();
        let entry = table
            .find_entry(hash, |slot| slot.key.borrow() == key)
            .ok()?;
        if !keep_out(&entry.get().value) {
            return None;
        }
        let (slot, _) = entry.remove();
        self.len.fetch_sub(1, Ordering::Relaxed);
        Some((slot.key, slot.value))
    }

    /// Calls `f` on every entry (which it may change), [`SCAN_CHUNK`] buckets per hold of a shard's lock. An entry
    /// inserted meanwhile may be missed, and if its shard grows meanwhile (an insert) some
    /// entries may be seen twice or missed: this is for sweeps, which run again.
    pub(super) fn for_each(&self, mut f: impl FnMut(&K, &mut V)) {
        for shard in self.shards.iter() {
            let mut start = 0;
            loop {
                let mut table = shard.lock();
                let end = (start + SCAN_CHUNK).min(table.num_buckets());
                for i in start..end {
                    if let Some(slot) = table.get_bucket_mut(i) {
                        f(&slot.key, &mut slot.value);
                    }
                }
                if end >= table.num_buckets() {
                    break;
                }
                start = end;
            }
        }
    }

    /// Gives every shard whose entries fell below a quarter of its capacity a table for twice
    /// its entries (see the module docs); returns the shards shrunk. The tables are allocated
    /// and freed outside the shards' locks; under a lock at most [`MAX_SHRINK_MOVES`] entries
    /// move.
    pub(super) fn shrink(&self) -> usize {
        // The entries the buckets hold at most (hashbrown's 7/8). Not `capacity()`: that is
        // what can be inserted before the next resize, and removals leave tombstones that
        // it does not count, so after an eviction sweep it is barely above the entries left.
        fn oversized<T>(table: &HashTable<T>) -> bool {
            let buckets = table.num_buckets();
            buckets > MIN_SHRINK_BUCKETS
                && table.len() < buckets / 8 * 7 / 4
                && table.len() <= MAX_SHRINK_MOVES
        }
        let mut shrunk = 0;
        for shard in self.shards.iter() {
            let len = {
                let table = shard.lock();
                if !oversized(&table) {
                    continue;
                }
                table.len()
            };
            // Allocated before taking the lock: an empty shard gets a table without any.
            let mut smaller = HashTable::with_capacity(len * 2);
            let old = {
                let mut table = shard.lock();
                // Keys came or went meanwhile: move them only if they still fit without a
                // resize and the shard is still too big.
                if !oversized(&table)
                    || table.len() > smaller.capacity()
                    || smaller.num_buckets() >= table.num_buckets()
                {
                    continue;
                }
                for slot in table.drain() {
                    let hash = self.hash(&slot.key);
                    smaller.insert_unique(hash, slot, |slot| self.hasher.hash_one(&slot.key));
                }
                std::mem::replace(&mut *table, smaller)
            };
            // Freed once the lock is let go of.
            drop(old);
            shrunk += 1;
        }
        shrunk
    }

    /// Bytes the shards' tables hold (entries and control bytes; not the shard headers).
    #[cfg(test)]
    pub(super) fn table_bytes(&self) -> usize {
        self.shards.iter().map(|s| s.lock().allocation_size()).sum()
    }

    /// The sum of `f` over every entry, each shard read whole under its lock (no entry is
    /// missed or counted twice, however the shard changes between shards).
    pub(super) fn sum(&self, f: impl Fn(&V) -> u64) -> u64 {
        self.shards
            .iter()
            .map(|shard| shard.lock().iter().map(|slot| f(&slot.value)).sum::<u64>())
            .sum()
    }

    /// Whether the map is empty (a hint while others insert or remove).
    pub(super) fn is_empty(&self) -> bool {
        self.len.load(Ordering::Relaxed) == 0
    }

    /// Removes every entry and frees the tables.
    pub(super) fn clear(&self) {
        for shard in self.shards.iter() {
            let mut table = shard.lock();
            self.len.fetch_sub(table.len(), Ordering::Relaxed);
            *table = HashTable::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn map(max_keys: usize) -> KeyMap<String, AtomicU64, foldhash::fast::RandomState> {
        KeyMap::new(foldhash::fast::RandomState::default(), max_keys)
    }

    #[test]
    fn a_cap_of_any_size_builds_at_most_max_shards() {
        assert_eq!(map(1).shards.len(), MIN_SHARDS);
        assert_eq!(map(100 * KEYS_PER_SHARD).shards.len(), 100);
        let unbounded = map(usize::MAX);
        assert_eq!(unbounded.shards.len(), MAX_SHARDS);
        assert!(unbounded.insert_new("a".to_owned(), || AtomicU64::new(1)));
    }

    #[test]
    fn insert_get_remove() {
        let m = map(100);
        assert!(m.is_empty());
        assert!(m.insert_new("a".to_owned(), || AtomicU64::new(1)));
        assert!(!m.insert_new("a".to_owned(), || unreachable!("present")));
        assert!(m.contains_key("a"));
        m.get("a").unwrap().fetch_add(1, Ordering::Relaxed);
        assert_eq!(m.sum(|v| v.load(Ordering::Relaxed)), 2);
        assert_eq!(m.get("a").unwrap().load(Ordering::Relaxed), 2);
        assert!(m
            .remove_if("a", |v| v.load(Ordering::Relaxed) > 5)
            .is_none());
        let (k, v) = m.remove_if("a", |_| true).unwrap();
        assert_eq!((k.as_str(), v.into_inner()), ("a", 2));
        assert!(m.get("a").is_none());
    }

    #[test]
    fn every_key_is_found_across_shards_and_resizes() {
        let m = map(40_000);
        assert!(m.shards.len() > MIN_SHARDS, "sharded for the cap");
        for i in 0..20_000u64 {
            assert!(m.insert_new(i.to_string(), || AtomicU64::new(i)));
        }
        for i in 0..20_000u64 {
            let v = m.get(i.to_string().as_str()).expect("present");
            assert_eq!(v.load(Ordering::Relaxed), i);
        }
        let (mut n, mut sum) = (0, 0);
        m.for_each(|_, v| {
            n += 1;
            sum += v.load(Ordering::Relaxed);
        });
        assert_eq!((n, sum), (20_000, (0..20_000).sum()));
        // The keys spread over every shard.
        assert!(m.shards.iter().all(|s| s.lock().len() > 100));
        m.clear();
        assert!(m.is_empty());
    }

    #[test]
    fn shards_shrink_once_their_keys_are_gone() {
        let m = map(100_000);
        let keys = 90_000u64;
        for i in 0..keys {
            assert!(m.insert_new(i.to_string(), || AtomicU64::new(i)));
        }
        let full = m.table_bytes();
        assert!(full >= keys as usize * 25, "{full} bytes");
        assert_eq!(m.shrink(), 0, "nothing to shrink while full");
        // A sweep evicts all but every 200th key (about 15 per shard, fewer than
        // `MAX_SHRINK_MOVES`): no table shrinks before the sweep does.
        for i in (0..keys).filter(|i| i % 200 != 0) {
            assert!(m.remove_if(i.to_string().as_str(), |_| true).is_some());
        }
        assert_eq!(
            m.table_bytes(),
            full,
            "hashbrown tables never shrink by themselves"
        );
        let shrunk = m.shrink();
        assert!(shrunk > 0);
        let after = m.table_bytes();
        assert!(after * 16 <= full, "{full} bytes before, {after} after");
        // Every key left is still there, with its value, and the map still grows.
        for i in (0..keys).step_by(200) {
            let v = m.get(i.to_string().as_str()).expect("kept");
            assert_eq!(v.load(Ordering::Relaxed), i);
        }
        assert_eq!(m.sum(|_| 1), keys / 200);
        for i in keys..keys + 10_000 {
            assert!(m.insert_new(i.to_string(), || AtomicU64::new(i)));
        }
        assert!(m.get("95000").is_some());
        // Emptied: no table is kept at all.
        for i in (0..keys).step_by(200).chain(keys..keys + 10_000) {
            m.remove_if(i.to_string().as_str(), |_| true);
        }
        m.shrink();
        assert_eq!(m.table_bytes(), 0);
    }
}
