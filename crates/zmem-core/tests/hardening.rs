//! The defects of issue 8, each pinned by a test that failed before its fix:
//! dedup with writeback, admission only for new memory, a failed writeback
//! pinning pages, the shrinker in the storing thread and disk reads under
//! locks; and concurrency on shared keys.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::*;
use zmem_backing::{BackingStore, FaultyFile, MemFile};
use zmem_core::{Algorithm, Compressor, Pool, PoolConfig, Recompress, Residency, WritebackMode, ZmemError};

const KIB: u64 = 1024;
const WAIT: Duration = Duration::from_secs(20);

fn mem_file() -> Arc<FaultyFile<MemFile>> {
    Arc::new(FaultyFile::new(MemFile::new(true)))
}

fn tiered_with(cfg: PoolConfig, file: &Arc<FaultyFile<MemFile>>) -> Pool {
    let store = BackingStore::new(Box::new(Arc::clone(file)), None);
    Pool::with_cold_store(cfg, Box::new(store)).unwrap()
}

/// Releases a file's held reads and writes when dropped, so a failing test
/// does not leave the shrinker stuck at the door (and the pool's drop
/// waiting for it forever).
struct Doors(Arc<FaultyFile<MemFile>>);

impl Drop for Doors {
    fn drop(&mut self) {
        self.0.hold_reads(false);
        self.0.hold_writes(false);
    }
}

/// Run `f` on another thread; its result if it finishes within `within`.
fn finishes<T: Send + 'static>(within: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(within).ok()
}

/// Defect 1: a dedup pool with a backing store used to refuse stores with
/// `PoolFull` after a few thousand pages, because shared objects were never
/// on an LRU. Now shared objects are written back once, and every key that
/// shares one follows it to the file and back.
#[test]
fn dedup_with_a_backing_store_writes_back_and_never_refuses() {
    let file = mem_file();
    let cfg = PoolConfig { dedup: true, max_pool: Some(256 * KIB), shards: 8, max_span_pages: 4, ..PoolConfig::default() };
    let p = tiered_with(cfg, &file);
    let n = 3000u64;
    // Every fourth page repeats one of 50 pages; the rest are unique.
    let page = |k: u64| if k.is_multiple_of(4) { compressible(1_000_000 + k % 50) } else { compressible(k) };
    for k in 0..n {
        p.store(k, &page(k)).unwrap_or_else(|e| panic!("store {k}: {e}"));
    }
    assert!(p.settle(WAIT));
    let st = p.stats();
    assert!(st.written_back_pages > n / 2, "{st:?}");
    assert!(st.dup_pages > 0 && st.bd_count > 0, "{st:?}");
    assert!(st.pool_pages * 4096 <= 256 * KIB, "{st:?}");
    // A shared object that went to the file took its sharers along.
    let shared_backed = (0..n).filter(|k| k % 4 == 0).any(|k| p.residency(k) == Some(Residency::Backed));
    assert!(shared_backed, "some shared object was written back");
    let mut buf = vec![0u8; PAGE];
    for k in 0..n {
        p.load(k, &mut buf).unwrap_or_else(|e| panic!("load {k}: {e}"));
        assert_eq!(buf, page(k), "key {k}");
    }
    // Sharing a written-back object, dropping sharers and overwriting all
    // keep the counts straight and the data right.
    for k in (0..n).step_by(8) {
        p.invalidate(k);
    }
    for k in n..n + 200 {
        p.store(k, &page(k - n)).unwrap();
    }
    assert!(p.settle(WAIT));
    p.writeback(WritebackMode::All, None).unwrap();
    for k in 0..n + 200 {
        match p.load(k, &mut buf) {
            Ok(()) => assert_eq!(buf, page(if k >= n { k - n } else { k }), "key {k}"),
            Err(ZmemError::NotFound { .. }) => assert!(k < n && k % 8 == 0, "key {k} lost"),
            Err(e) => panic!("key {k}: {e}"),
        }
    }
    let present = p.len() as u64;
    assert_eq!(p.invalidate_range(0..u64::MAX), present);
    let st = p.stats();
    assert_eq!((st.stored_pages, st.bd_count, st.dup_pages, st.compr_data_size), (0, 0, 0, 0), "{st:?}");
    assert_eq!(st.backing_live_bytes, 0, "every record freed with its last sharer");
}

/// Defect 2: at `max_pool` without a backing store, pages that need no new
/// memory used to be refused too (and kept being refused until usage fell
/// under the accept threshold). Only a store that needs new memory may be.
#[test]
fn at_the_limit_only_new_memory_is_refused() {
    for dedup in [false, true] {
        let p = Pool::new(PoolConfig { dedup, max_pool: Some(64 * 4096), ..PoolConfig::default() }).unwrap();
        let mut k = 0;
        let full = loop {
            match p.store(k, &incompressible(k)) {
                Ok(()) => k += 1,
                Err(e) => break e,
            }
        };
        assert!(matches!(full, ZmemError::PoolFull { .. }), "{full}");
        let stored = k;
        // Still refused: a new page that needs memory.
        assert!(matches!(p.store(stored, &compressible(1)), Err(ZmemError::PoolFull { .. })));
        // Accepted: zero and same-filled pages, new keys and overwrites.
        p.store(stored, &same_filled(0)).unwrap();
        p.store(stored + 1, &same_filled(0xdead_beef)).unwrap();
        p.store(0, &same_filled(0)).unwrap();
        // Accepted: discards.
        assert!(p.invalidate(1));
        assert_eq!(p.invalidate_range(2..4), 2);
        if dedup {
            // Accepted: a page equal to one already stored.
            p.store(stored + 2, &incompressible(5)).unwrap();
            assert!(p.stats().dup_pages >= 1);
        } else {
            // Accepted: a rewrite in place (same size class).
            p.store(5, &incompressible(99_999)).unwrap();
        }
        let mut buf = vec![0u8; PAGE];
        p.load(stored + 1, &mut buf).unwrap();
        assert_eq!(buf, same_filled(0xdead_beef));
        p.load(5, &mut buf).unwrap();
        assert_eq!(buf, if dedup { incompressible(5) } else { incompressible(99_999) });
        for j in 6..stored {
            p.load(j, &mut buf).unwrap();
            assert_eq!(buf, incompressible(j), "dedup {dedup} key {j}");
        }
    }
}

/// Store compressible pages until the shrinker is inside a (held) write;
/// close to `max_pool`, wait for it to get there. Returns pages stored.
fn fill_until_writing(p: &Arc<Pool>, file: &Arc<FaultyFile<MemFile>>) -> u64 {
    let p2 = Arc::clone(p);
    let f2 = Arc::clone(file);
    let max_pages = p.stats().max_pool_bytes / 4096;
    finishes(WAIT, move || {
        let mut k = 0u64;
        while !f2.wait_held(1, Duration::ZERO) {
            if p2.stats().max_pool_used_bytes / 4096 + 2 >= max_pages {
                assert!(f2.wait_held(1, WAIT), "the shrinker started writing");
                break;
            }
            p2.store(k, &compressible(k)).unwrap();
            k += 1;
        }
        k
    })
    .expect("stores below max_pool never wait for the disk")
}

/// A one-shard pool of 128 pages whose shrinker is stuck in its first
/// write (held at the door until the returned `Doors` drop or release it),
/// and how many pages were stored to get it there.
fn stuck_in_a_write() -> (Arc<FaultyFile<MemFile>>, Arc<Pool>, Doors, u64) {
    let file = mem_file();
    let cfg = PoolConfig { max_pool: Some(512 * KIB), shards: 1, max_span_pages: 4, ..PoolConfig::default() };
    let p = Arc::new(tiered_with(cfg, &file));
    let doors = Doors(Arc::clone(&file));
    file.hold_writes(true);
    let stored = fill_until_writing(&p, &file);
    (file, p, doors, stored)
}

/// Defect 3: a page loaded while its writeback batch was on the disk, when
/// that write failed, lost its LRU item and stayed in RAM for good.
#[test]
fn a_failed_write_does_not_pin_pages_loaded_during_it() {
    let (file, p, _doors, stored) = stuck_in_a_write();
    // Touch every page while the batch is on the disk, then fail that write.
    let mut buf = vec![0u8; PAGE];
    for k in 0..stored {
        p.load(k, &mut buf).unwrap();
    }
    file.fail_nth_write(1);
    file.hold_writes(false);
    assert!(p.settle(WAIT));
    assert!(p.stats().writeback_fail >= 1);
    // Push the pool through several times its size: the first pages are
    // the coldest and must all go to the file eventually.
    for k in stored..stored + 4000 {
        p.store(k, &compressible(k)).unwrap();
    }
    assert!(p.settle(WAIT));
    let pinned: Vec<u64> = (0..stored).filter(|&k| p.residency(k) == Some(Residency::Ram)).collect();
    assert!(pinned.is_empty(), "pages pinned in RAM after a failed write: {pinned:?}");
    for k in 0..stored + 4000 {
        p.load(k, &mut buf).unwrap();
        assert_eq!(buf, compressible(k));
    }
}

/// Defect 4: writeback ran in the storing thread, and a load of a
/// written-back page read the disk under its shard lock. Now a background
/// thread writes back; stores below the limit never wait for the disk, a
/// store over it waits for room (and gets it), and a stuck disk read blocks
/// no other key of its shard.
#[test]
fn the_disk_is_off_the_store_and_lock_paths() {
    let (file, p, _doors, stored) = stuck_in_a_write();
    // The write is stuck; stores keep going up to the hard limit, and the
    // next one waits for room, and goes in once the disk moves.
    let p2 = Arc::clone(&p);
    let waiter = thread::spawn(move || {
        let mut k = stored;
        while p2.stats().pool_pages < 128 {
            p2.store(k, &compressible(k)).unwrap();
            k += 1;
        }
        p2.store(k, &compressible(k)).map(|()| k + 1)
    });
    thread::sleep(Duration::from_millis(300));
    assert!(!waiter.is_finished(), "a store over max_pool went in while the disk was stuck");
    file.hold_writes(false);
    let stored = waiter.join().unwrap().expect("the waiting store went in once the shrinker made room");
    assert!(p.settle(WAIT));
    // A written-back page whose read is stuck on the disk...
    let backed = (0..stored).find(|&k| p.residency(k) == Some(Residency::Backed)).expect("something was written back");
    file.hold_reads(true);
    let p3 = Arc::clone(&p);
    let reader = thread::spawn(move || {
        let mut buf = vec![0u8; PAGE];
        p3.load(backed, &mut buf).map(|()| buf)
    });
    assert!(file.wait_held(1, WAIT));
    // ...holds no lock: the one shard's other keys are served meanwhile.
    let ram = (0..stored).rev().find(|&k| p.residency(k) == Some(Residency::Ram)).unwrap();
    let p4 = Arc::clone(&p);
    let other = finishes(Duration::from_secs(10), move || {
        let mut buf = vec![0u8; PAGE];
        p4.load(ram, &mut buf).unwrap();
        p4.store(ram, &compressible(ram + 1)).unwrap();
        p4.invalidate(stored + 10_000);
        buf == compressible(ram)
    });
    file.hold_reads(false);
    assert_eq!(other, Some(true), "a stuck disk read blocked its shard");
    assert_eq!(reader.join().unwrap().unwrap(), compressible(backed));
}

/// A key overwritten while its written-back page is being read returns one
/// of the two versions, never an error or a mix.
#[test]
fn a_load_racing_an_overwrite_of_a_written_back_page() {
    let file = mem_file();
    let p = Arc::new(tiered_with(PoolConfig { shards: 1, ..PoolConfig::default() }, &file));
    p.store(7, &compressible(1)).unwrap();
    p.writeback(WritebackMode::All, None).unwrap();
    assert_eq!(p.residency(7), Some(Residency::Backed));
    let _doors = Doors(Arc::clone(&file));
    file.hold_reads(true);
    let p2 = Arc::clone(&p);
    let reader = thread::spawn(move || {
        let mut buf = vec![0u8; PAGE];
        p2.load(7, &mut buf).map(|()| buf)
    });
    assert!(file.wait_held(1, WAIT));
    p.store(7, &compressible(2)).unwrap();
    p.writeback(WritebackMode::All, None).unwrap();
    file.hold_reads(false);
    let got = reader.join().unwrap().unwrap();
    assert!(got == compressible(1) || got == compressible(2));
    assert_eq!(p.stats().bd_count, 1, "the old record was freed");
    let mut buf = vec![0u8; PAGE];
    p.load(7, &mut buf).unwrap();
    assert_eq!(buf, compressible(2));
}

/// A page: keyed (names its key and version, body derived from both) or
/// shared (one of eight bodies, the same under every key, for dedup).
fn versioned(key: u64, version: u64) -> Vec<u8> {
    if version.is_multiple_of(3) {
        return shared_body(version % 8);
    }
    let mut p = if version % 5 == 1 { incompressible(key * 7919 + version) } else { compressible(key * 7919 + version) };
    p[..8].copy_from_slice(&key.to_le_bytes());
    p[8..16].copy_from_slice(&version.to_le_bytes());
    p
}

/// Check a loaded page is exactly some version stored under `key`.
fn check(key: u64, page: &[u8], issued: u64) -> Result<(), String> {
    let tag = u64::from_le_bytes(page[..8].try_into().unwrap());
    let v = u64::from_le_bytes(page[8..16].try_into().unwrap());
    if tag == u64::MAX {
        return (v < 8 && page == shared_body(v).as_slice()).then_some(()).ok_or(format!("key {key}: torn shared page {v}"));
    }
    if tag != key {
        return Err(format!("key {key}: foreign page of key {tag}"));
    }
    if v > issued {
        return Err(format!("key {key}: version {v} was never stored (issued up to {issued})"));
    }
    if page != versioned(key, v).as_slice() {
        return Err(format!("key {key}: torn page, version {v}"));
    }
    Ok(())
}

fn shared_body(s: u64) -> Vec<u8> {
    let mut p = compressible(10_000 + s);
    p[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    p[8..16].copy_from_slice(&s.to_le_bytes());
    p
}

/// Many threads store, load, overwrite and invalidate the same 64 keys,
/// while another recompresses some of them and (with a tier) writeback and
/// compaction run. Every load returns some version that was stored under
/// that key, never torn or foreign bytes. Keys are overwritten thousands of
/// times, so the 8-bit LRU generations wrap many times over.
fn hammer(dedup: bool, tier: bool) {
    const KEYS: u64 = 64;
    const THREADS: u64 = 4;
    const OPS: u64 = 6000;
    let file = mem_file();
    let recomp_algorithms = vec![Compressor { algorithm: Algorithm::Zstd, level: 1 }, Compressor { algorithm: Algorithm::Lzo, level: 0 }];
    let cfg = PoolConfig { dedup, shards: 4, max_span_pages: 4, max_pool: Some(96 * KIB), recomp_algorithms, ..PoolConfig::default() };
    let p = Arc::new(if tier { tiered_with(cfg, &file) } else { Pool::new(PoolConfig { max_pool: None, ..cfg }).unwrap() });
    let issued: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (p, stop) = (Arc::clone(&p), Arc::clone(&stop));
        thread::spawn(move || {
            let mut i = 0;
            while !stop.load(SeqCst) {
                // Objects of three algorithms: lz4, and what a pass
                // rewrites with zstd:1 or LZO.
                p.recompress(&Recompress { limit: Some(16), ..Recompress::default() }).unwrap();
                if tier && i % 7 == 0 {
                    p.writeback(WritebackMode::All, Some(32)).unwrap();
                }
                if i % 11 == 0 {
                    p.compact();
                }
                i += 1;
                thread::sleep(Duration::from_micros(200));
            }
        })
    };
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (p, issued) = (Arc::clone(&p), Arc::clone(&issued));
            thread::spawn(move || -> Result<u64, String> {
                let mut r = xorshift(t + 1);
                let mut buf = vec![0u8; PAGE];
                let mut loads = 0;
                for _ in 0..OPS {
                    let key = r() % KEYS;
                    match r() % 10 {
                        0..=3 => {
                            let v = issued[key as usize].fetch_add(1, SeqCst) + 1;
                            p.store(key, &versioned(key, v)).map_err(|e| format!("store {key}: {e}"))?;
                        }
                        4 => {
                            p.invalidate(key);
                        }
                        _ => match p.load(key, &mut buf) {
                            Ok(()) => {
                                check(key, &buf, issued[key as usize].load(SeqCst))?;
                                loads += 1;
                            }
                            Err(ZmemError::NotFound { .. }) => {}
                            Err(e) => return Err(format!("load {key}: {e}")),
                        },
                    }
                }
                Ok(loads)
            })
        })
        .collect();
    let mut loads = 0;
    for w in workers {
        loads += w.join().expect("worker panicked").unwrap_or_else(|e| panic!("dedup {dedup} tier {tier}: {e}"));
    }
    stop.store(true, SeqCst);
    churn.join().unwrap();
    assert!(loads > 1000, "only {loads} loads returned data");
    // Quiet now: every key takes a final version and reads it back.
    let mut buf = vec![0u8; PAGE];
    for key in 0..KEYS {
        let v = issued[key as usize].fetch_add(1, SeqCst) + 1;
        p.store(key, &versioned(key, v)).unwrap();
    }
    assert!(p.settle(WAIT));
    for key in 0..KEYS {
        p.load(key, &mut buf).unwrap();
        assert_eq!(buf, versioned(key, issued[key as usize].load(SeqCst)), "key {key}");
    }
    let st = p.stats();
    assert_eq!((st.failed_reads, st.free_fail, st.decompress_fail), (0, 0, 0), "{st:?}");
    assert_eq!(p.invalidate_range(0..KEYS), KEYS);
    let st = p.stats();
    assert_eq!((st.stored_pages, st.bd_count, st.compr_data_size, st.dup_pages), (0, 0, 0, 0), "{st:?}");
}

#[test]
fn same_keys_from_many_threads() {
    hammer(false, false);
}

#[test]
fn same_keys_from_many_threads_with_dedup() {
    hammer(true, false);
}

#[test]
fn same_keys_from_many_threads_with_a_tier() {
    hammer(false, true);
}

#[test]
fn same_keys_from_many_threads_with_dedup_and_a_tier() {
    hammer(true, true);
}

/// Errors name what failed: a record that fails its checksum is a backing
/// error for that key, counted in `failed_reads`, not a compressor's.
#[test]
fn failures_are_typed_and_counted() {
    let file = mem_file();
    let p = tiered_with(PoolConfig::default(), &file);
    p.store(1, &compressible(1)).unwrap();
    p.writeback(WritebackMode::All, None).unwrap();
    file.fail_reads(true);
    let mut buf = vec![0u8; PAGE];
    let e = p.load(1, &mut buf).unwrap_err();
    assert!(matches!(e, ZmemError::Cold(_)), "{e:?}");
    file.fail_reads(false);
    assert!(p.store(2, &[0u8; 10]).is_err());
    assert!(p.load(2, &mut buf[..100]).is_err());
    assert!(matches!(p.load(2, &mut buf), Err(ZmemError::NotFound { .. })), "not stored is not a failed read");
    assert!(p.invalidate(1));
    let st = p.stats();
    // zram counts a bad request as invalid_io, not as a failed write.
    assert_eq!((st.failed_reads, st.failed_writes, st.invalid_io, st.notify_free), (1, 0, 2, 1), "{st:?}");
    assert!(st.io_stat().split_whitespace().eq(["1", "0", "2", "1"]));
    assert_eq!(st.free_fail, 0);
}

/// A backing store at its own size limit (`--backing-limit`): a discard
/// that frees most of it makes room for new stores at once (compaction runs
/// when an append meets the limit). A regression guard; the same case on a
/// full *filesystem* is not handled yet (see the notes).
#[test]
fn space_freed_on_a_full_backing_file_is_usable_at_once() {
    let file = mem_file();
    let store = BackingStore::new(Box::new(Arc::clone(&file)), Some(4 << 20));
    let cfg = PoolConfig { max_pool: Some(256 * KIB), shards: 4, max_span_pages: 4, ..PoolConfig::default() };
    let p = Pool::with_cold_store(cfg, Box::new(store)).unwrap();
    let mut k = 0u64;
    let full = loop {
        match p.store(k, &incompressible(k)) {
            Ok(()) => k += 1,
            Err(e) => break e,
        }
    };
    assert!(matches!(full, ZmemError::PoolFull { .. }), "{full}");
    assert!(p.stats().bd_count > 500, "{:?}", p.stats());
    // Discard nine pages in ten, as a filesystem's TRIM would.
    for j in 0..k {
        if j % 10 != 0 {
            p.invalidate(j);
        }
    }
    // A log-structured store is not filled to the last byte again: it
    // compacts segments under half full, so half of what the discard freed
    // is what it promises at once (where the new records land depends on
    // the shrinker's timing).
    let discarded = k - k.div_ceil(10);
    let new = k..k + discarded / 2;
    let start = std::time::Instant::now();
    for j in new.clone() {
        // Writeback runs beside the stores: on a loaded machine a store can
        // find the pool full before the shrinker has caught up. Once it has settled, a
        // few times at most, the freed space must take the page.
        let mut tries = 0;
        loop {
            match p.store(j, &incompressible(j)) {
                Ok(()) => break,
                Err(ZmemError::PoolFull { .. }) if tries < 3 => {
                    tries += 1;
                    assert!(p.settle(Duration::from_secs(30)), "writeback did not settle");
                }
                Err(e) => panic!("store {j} of {new:?} after the discard ({tries} settles): {e}; {:?}", p.stats()),
            }
        }
    }
    assert!(start.elapsed() < Duration::from_secs(5), "stores waited {:?}", start.elapsed());
    let mut buf = vec![0u8; PAGE];
    for j in (0..k).step_by(10).chain(new) {
        p.load(j, &mut buf).unwrap();
        assert_eq!(buf, incompressible(j), "key {j}");
    }
}
