//! The cold-page seam (`cold.rs`): a pool whose cold store drops what the
//! shrinker evicts (a clean-page cache, zcache's role). Evicted pages miss
//! (`NotFound`), never read back wrong or stale; the pool stays under its
//! cap; shared objects that are dropped make every key sharing them miss.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use zmem_core::{DropCold, Pool, PoolConfig, WritebackMode, ZmemError};

fn cache(max_pool: u64, dedup: bool) -> Pool {
    let cfg = PoolConfig { max_pool: Some(max_pool), dedup, shards: 8, ..PoolConfig::default() };
    Pool::with_cold_store(cfg, Box::new(DropCold)).unwrap()
}

/// Load `key`: Some(page) on a hit, None on a miss; any other error fails.
fn get(p: &Pool, key: u64) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; PAGE];
    match p.load(key, &mut buf) {
        Ok(()) => Some(buf),
        Err(ZmemError::NotFound { .. }) => None,
        Err(e) => panic!("key {key}: {e}"),
    }
}

#[test]
fn a_clean_cache_drops_its_coldest_pages_which_then_miss() {
    let p = cache(2 << 20, false);
    let n = 4000u64;
    for k in 0..n {
        p.store(k, &compressible(k)).unwrap();
    }
    assert!(p.settle(Duration::from_secs(10)));
    let st = p.stats();
    assert!(st.evicted_pages > 0 && st.written_back_pages == 0, "{st:?}");
    assert_eq!(st.bd_count, 0, "nothing is kept anywhere else");
    assert!(st.max_pool_used_bytes <= 2 << 20, "{} over the cap", st.max_pool_used_bytes);
    let (mut hits, mut misses) = (0, 0);
    for k in 0..n {
        match get(&p, k) {
            Some(page) => {
                assert!(page == compressible(k), "key {k} read back wrong");
                hits += 1;
            }
            None => {
                assert!(!p.contains(k));
                misses += 1;
            }
        }
    }
    assert_eq!(misses, st.evicted_pages, "every miss is an eviction");
    assert_eq!(hits, st.stored_pages);
    // The coldest went first: the newest pages are all there.
    assert!((n - 200..n).all(|k| p.contains(k)));
    assert_eq!(p.mem_charged(), p.stats().mem_used_total);
}

#[test]
fn an_evicted_or_overwritten_page_never_reads_back_stale() {
    let p = Arc::new(cache(1 << 20, false));
    let threads: Vec<_> = (0..2u64)
        .map(|t| {
            let p = Arc::clone(&p);
            std::thread::spawn(move || {
                let mut latest: HashMap<u64, u64> = HashMap::new();
                let mut r = xorshift(t + 1);
                for i in 0..6000u64 {
                    let key = t * 1_000_000 + r() % 700;
                    let seed = (t << 32) | i;
                    p.store(key, &compressible(seed)).unwrap();
                    latest.insert(key, seed);
                    if i % 7 == 0 {
                        let k = t * 1_000_000 + r() % 700;
                        if let (Some(page), Some(&s)) = (get(&p, k), latest.get(&k)) {
                            assert!(page == compressible(s), "key {k}: not the latest page");
                        }
                    }
                }
                latest
            })
        })
        .collect();
    for h in threads {
        let latest = h.join().unwrap();
        for (k, s) in latest {
            if let Some(page) = get(&p, k) {
                assert!(page == compressible(s), "key {k}: not the latest page");
            }
        }
    }
    assert!(p.stats().evicted_pages > 0);
}

#[test]
fn a_dropped_shared_object_makes_all_its_keys_miss() {
    let p = cache(8 << 20, true);
    // Ten keys share each of 50 pages.
    for k in 0..500u64 {
        p.store(k, &compressible(k % 50)).unwrap();
    }
    assert_eq!(p.stats().dup_pages, 450);
    assert_eq!(p.writeback(WritebackMode::All, None).unwrap(), 50, "explicit writeback drops, one object each");
    let st = p.stats();
    assert_eq!((st.evicted_pages, st.stored_pages, st.dup_pages, st.compr_data_size), (50, 0, 0, 0), "{st:?}");
    assert!((0..500).all(|k| get(&p, k).is_none() && !p.contains(k)));
    // Stored again: the page is back (not joined to the dropped object).
    p.store(7, &compressible(7)).unwrap();
    assert_eq!(get(&p, 7).unwrap(), compressible(7));
    assert!(get(&p, 57).is_none(), "another key of the dropped object still misses");
    // While a dropped record has keys, an equal page cannot join it.
    p.store(1000, &compressible(8)).unwrap();
    assert_eq!(p.stats().dup_pages, 0);
    // Freeing every key lets the dropped records go: equal pages share again.
    assert_eq!(p.invalidate_range(0..2000), 501);
    let st = p.stats();
    assert_eq!(st.stored_pages, 0);
    assert_eq!(p.mem_charged(), st.mem_used_total);
    p.store(57, &compressible(8)).unwrap();
    p.store(58, &compressible(8)).unwrap();
    assert_eq!(p.stats().dup_pages, 1, "the dropped record was freed with its last key");
    assert_eq!(get(&p, 58).unwrap(), compressible(8));
}

/// A cold store in RAM whose writes fail until `heals_at` (a cluster
/// failing over), and which says its failures heal within `ride`.
struct Healing {
    records: parking_lot::Mutex<HashMap<u64, Vec<u8>>>,
    next: std::sync::atomic::AtomicU64,
    heals_at: parking_lot::Mutex<Option<std::time::Instant>>,
    ride: Duration,
}

impl zmem_core::ColdStore for Healing {
    fn put_batch(&self, objects: &[(u64, &[u8])]) -> Result<Vec<Option<zmem_core::RecordId>>, zmem_core::ColdError> {
        if self.heals_at.lock().is_some_and(|t| std::time::Instant::now() < t) {
            return Err(zmem_core::ColdError::Store("the cluster is failing over".into()));
        }
        let mut r = self.records.lock();
        Ok(objects
            .iter()
            .map(|(_, o)| {
                let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                r.insert(id, o.to_vec());
                Some(zmem_core::RecordId::from_raw(id))
            })
            .collect())
    }
    fn read(&self, id: zmem_core::RecordId, _key: u64, out: &mut Vec<u8>) -> Result<(), zmem_core::ColdError> {
        let r = self.records.lock();
        let v = r.get(&id.to_raw()).ok_or(zmem_core::ColdError::NotLive { id: id.to_raw() })?;
        out.clear();
        out.extend_from_slice(v);
        Ok(())
    }
    fn free(&self, id: zmem_core::RecordId) -> Result<(), zmem_core::ColdError> {
        self.records.lock().remove(&id.to_raw()).map(|_| ()).ok_or(zmem_core::ColdError::NotLive { id: id.to_raw() })
    }
    fn ride_through(&self) -> Duration {
        self.ride
    }
}

/// Fill a 1 MiB pool over a store that fails for `fail_for` from the
/// moment the pool is full, storing on through the failure: how many
/// stores were refused, and whether every page stored reads back.
fn store_through_a_failure(ride: Duration, fail_for: Duration) -> (u64, Pool) {
    let store = Arc::new(Healing { records: Default::default(), next: Default::default(), heals_at: Default::default(), ride });
    struct Shared(Arc<Healing>);
    impl zmem_core::ColdStore for Shared {
        fn put_batch(&self, o: &[(u64, &[u8])]) -> Result<Vec<Option<zmem_core::RecordId>>, zmem_core::ColdError> {
            self.0.put_batch(o)
        }
        fn read(&self, id: zmem_core::RecordId, key: u64, out: &mut Vec<u8>) -> Result<(), zmem_core::ColdError> {
            self.0.read(id, key, out)
        }
        fn free(&self, id: zmem_core::RecordId) -> Result<(), zmem_core::ColdError> {
            self.0.free(id)
        }
        fn ride_through(&self) -> Duration {
            self.0.ride_through()
        }
    }
    let cfg = PoolConfig { max_pool: Some(1 << 20), shards: 8, ..PoolConfig::default() };
    let p = Pool::with_cold_store(cfg, Box::new(Shared(Arc::clone(&store)))).unwrap();
    let mut k = 0u64;
    while p.stats().written_back_pages == 0 {
        p.store(k, &compressible(k)).unwrap();
        k += 1;
    }
    let start = std::time::Instant::now();
    *store.heals_at.lock() = Some(start + fail_for);
    let mut refused = 0;
    while start.elapsed() < fail_for + Duration::from_millis(200) {
        match p.store(k, &compressible(k)) {
            Ok(()) => k += 1,
            Err(ZmemError::PoolFull { .. }) => refused += 1,
            Err(e) => panic!("page {k}: {e}"),
        }
    }
    for key in 0..k {
        assert!(get(&p, key).is_some_and(|page| page == compressible(key)), "page {key} did not read back");
    }
    (refused, p)
}

#[test]
fn a_cold_store_that_heals_holds_stores_instead_of_refusing_them() {
    let (refused, p) = store_through_a_failure(Duration::from_secs(10), Duration::from_millis(1500));
    assert_eq!(refused, 0, "a store was refused while the cold store healed");
    assert!(p.stats().reject_reclaim_fail > 0, "writeback never failed: the test tested nothing");
    // A store whose failures do not heal (a file): refused at once.
    let (refused, _) = store_through_a_failure(Duration::ZERO, Duration::from_millis(1500));
    assert!(refused > 0, "a failing file's pool took every store");
}
