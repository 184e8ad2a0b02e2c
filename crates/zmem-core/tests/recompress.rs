//! Recompression (zram's `recompress`): objects rewritten smaller by a
//! stronger algorithm read back byte for byte; objects none can shrink are
//! marked and skipped; filters pick idle, huge and large objects; stores
//! and loads running meanwhile never see a wrong page.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use zmem_backing::{BackingStore, FaultyFile, MemFile};
use zmem_core::{Compressor, Pool, PoolConfig, Recompress, WritebackMode, ZmemError};

/// Bytes from a 64-symbol alphabet: no 4-byte repeats for lz4 to find
/// (stored raw), 6 bits of entropy a byte for zstd's entropy coder.
fn six_bit(seed: u64) -> Vec<u8> {
    let mut r = xorshift(seed);
    (0..4096).map(|_| b'0' + (r() % 64) as u8).collect()
}

fn zstd(level: i32) -> Compressor {
    Compressor::zstd(level).unwrap()
}

fn pool(recomp: Vec<Compressor>, tiered: bool) -> Pool {
    let cfg = PoolConfig { shards: 8, recomp_algorithms: recomp, ..PoolConfig::default() };
    if tiered {
        let store = BackingStore::new(Box::new(Arc::new(FaultyFile::new(MemFile::new(true)))), None);
        Pool::with_cold_store(PoolConfig { max_pool: Some(64 << 20), ..cfg }, Box::new(store)).unwrap()
    } else {
        Pool::new(cfg).unwrap()
    }
}

fn page(kind: u64, k: u64) -> Vec<u8> {
    match kind {
        0 => six_bit(k),
        1 => compressible(k),
        _ => incompressible(k),
    }
}

fn check_all(p: &Pool, keys: impl Iterator<Item = (u64, Vec<u8>)>) {
    let mut buf = vec![0u8; 4096];
    for (k, want) in keys {
        p.load(k, &mut buf).unwrap_or_else(|e| panic!("key {k}: {e}"));
        assert!(buf == want, "key {k} read back wrong");
    }
}

#[test]
fn recompression_rewrites_smaller_marks_the_rest_and_every_page_reads_back() {
    for tiered in [false, true] {
        let p = pool(vec![zstd(9)], tiered);
        let n = 300u64;
        for k in 0..3 * n {
            p.store(k, &page(k % 3, k)).unwrap();
        }
        let before = p.stats();
        assert_eq!(before.huge_pages, 2 * n, "six-bit and random pages are stored raw with lz4");
        assert_eq!(before.huge_pages_since, 2 * n);
        let r = p.recompress(&Recompress::default()).unwrap();
        let after = p.stats();
        // Six-bit pages shrink from raw; random ones cannot; text pages
        // mostly shrink by a size class or more.
        assert!(r.recompressed >= n, "{r:?}");
        assert!(r.marked >= n, "the random pages are marked: {r:?}");
        assert_eq!(r.candidates, 3 * n);
        assert_eq!(r.recompressed + r.marked + r.skipped, r.candidates, "{r:?}");
        assert_eq!(after.huge_pages, n, "only the random pages stay raw");
        assert_eq!(before.compr_data_size - after.compr_data_size, r.saved_bytes);
        assert!(r.saved_bytes > n * 800, "{r:?}");
        assert!(after.mem_used_total < before.mem_used_total, "{} -> {}", before.mem_used_total, after.mem_used_total);
        assert_eq!((after.recompressed_pages, after.recompress_saved_bytes), (r.recompressed, r.saved_bytes));
        assert_eq!(after.huge_pages_since, 2 * n, "a counter of stores, not of what is held");
        check_all(&p, (0..3 * n).map(|k| (k, page(k % 3, k))));
        let rewritten = (0..3 * n).filter(|&k| p.recomp_priority(k) == Some(1)).count() as u64;
        assert_eq!(rewritten, r.recompressed);
        assert!((0..3 * n).filter(|k| k % 3 == 0).all(|k| p.recomp_priority(k) == Some(1)), "every six-bit page");

        // Rewritten objects are at the top priority and the rest are
        // marked: a second pass has nothing to try.
        let again = p.recompress(&Recompress::default()).unwrap();
        assert_eq!(again.candidates, 0, "{again:?}");

        // A rewritten page is a page like any other: overwrite, write back, read.
        p.store(0, &compressible(77)).unwrap();
        if tiered {
            p.writeback(WritebackMode::All, None).unwrap();
        }
        check_all(&p, std::iter::once((0, compressible(77))).chain((1..3 * n).map(|k| (k, page(k % 3, k)))));
    }
}

#[test]
fn filters_pick_huge_large_and_idle_objects() {
    let p = pool(vec![zstd(3)], false);
    for k in 0..200u64 {
        p.store(k, &page(k % 2, k)).unwrap();
    }
    // Huge: only the raw six-bit pages.
    let r = p.recompress(&Recompress { huge: true, ..Recompress::default() }).unwrap();
    assert_eq!((r.candidates, r.recompressed), (100, 100), "{r:?}");
    // Compressed size at least 4000 bytes: none left.
    let r = p.recompress(&Recompress { min_size: Some(4000), ..Recompress::default() }).unwrap();
    assert_eq!(r.candidates, 0, "{r:?}");
    // A limit stops the pass.
    let r = p.recompress(&Recompress { limit: Some(10), ..Recompress::default() }).unwrap();
    assert_eq!(r.recompressed, 10, "{r:?}");

    // Idle: pages stored 1.5 s ago are, pages stored now are not.
    let p = pool(vec![zstd(3)], false);
    for k in 0..50u64 {
        p.store(k, &six_bit(k)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(1500));
    for k in 50..100u64 {
        p.store(k, &six_bit(k)).unwrap();
    }
    let r = p.recompress(&Recompress { idle_secs: Some(1), ..Recompress::default() }).unwrap();
    assert_eq!((r.candidates, r.recompressed), (50, 50), "{r:?}");
    // A load is an access: it makes an idle page young again.
    let p = pool(vec![zstd(3)], false);
    for k in 0..20u64 {
        p.store(k, &six_bit(k)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(1500));
    let mut buf = vec![0u8; 4096];
    for k in 0..10u64 {
        p.load(k, &mut buf).unwrap();
    }
    let r = p.recompress(&Recompress { idle_secs: Some(1), ..Recompress::default() }).unwrap();
    assert_eq!(r.candidates, 10, "{r:?}");
}

#[test]
fn priorities_go_up_one_way() {
    let p = pool(vec![zstd(1), zstd(19)], false);
    for k in 0..100u64 {
        p.store(k, &compressible(k)).unwrap();
    }
    // Priority 1 only: nothing is marked, since priority 2 was not tried.
    let r1 = p.recompress(&Recompress { prio: Some(1), ..Recompress::default() }).unwrap();
    assert_eq!(r1.marked, 0, "{r1:?}");
    // Then the default tries what is above each object's priority.
    let r2 = p.recompress(&Recompress::default()).unwrap();
    assert_eq!(r2.candidates, 100, "every object is below priority 2: {r2:?}");
    assert_eq!(r2.recompressed + r2.marked + r2.skipped, 100);
    let r3 = p.recompress(&Recompress::default()).unwrap();
    assert_eq!(r3.candidates, 0, "{r3:?}");
    check_all(&p, (0..100).map(|k| (k, compressible(k))));
}

#[test]
fn bad_requests_and_configs_are_typed_errors() {
    let none = pool(vec![], false);
    let e = none.recompress(&Recompress::default()).unwrap_err();
    assert!(matches!(e, ZmemError::Config(ref m) if m.contains("--recomp-algo")), "{e}");
    let one = pool(vec![zstd(9)], false);
    for prio in [0, 2] {
        let e = one.recompress(&Recompress { prio: Some(prio), ..Recompress::default() }).unwrap_err();
        assert!(matches!(e, ZmemError::Config(ref m) if m.contains("zstd:9")), "{e}");
    }
    let cfg = PoolConfig { recomp_algorithms: vec![zstd(1), zstd(3), zstd(9), zstd(19)], ..PoolConfig::default() };
    let e = Pool::new(cfg).err().expect("four recompression algorithms are refused");
    assert!(e.to_string().contains("at most 3"), "{e}");
}

/// Stores, overwrites and loads race passes of recompression: every load
/// returns the last page stored under its key.
#[test]
fn recompression_races_stores_and_loads_without_a_wrong_page() {
    for tiered in [false, true] {
        let p = Arc::new(pool(vec![zstd(3)], tiered));
        let keys = 512u64;
        for k in 0..keys {
            p.store(k, &page(k % 2, k)).unwrap();
        }
        let stop = Arc::new(AtomicBool::new(false));
        let recomp = {
            let (p, stop) = (Arc::clone(&p), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut done = 0;
                while !stop.load(Ordering::Relaxed) {
                    done += p.recompress(&Recompress { limit: Some(64), ..Recompress::default() }).unwrap().recompressed;
                }
                done
            })
        };
        // Key k holds version v: page(kind, k + v * keys); the writer owns
        // the versions, so it knows what each load must return.
        let mut version = vec![0u64; keys as usize];
        let mut r = xorshift(9);
        let mut buf = vec![0u8; 4096];
        for _ in 0..20_000 {
            let k = r() % keys;
            if r().is_multiple_of(3) {
                version[k as usize] += 1;
                p.store(k, &page(k % 2, k + version[k as usize] * keys)).unwrap();
            } else {
                p.load(k, &mut buf).unwrap();
                assert!(buf == page(k % 2, k + version[k as usize] * keys), "key {k} read back wrong");
            }
        }
        stop.store(true, Ordering::Relaxed);
        let done = recomp.join().unwrap();
        assert!(done > 0, "the recompression thread rewrote something");
        check_all(&p, (0..keys).map(|k| (k, page(k % 2, k + version[k as usize] * keys))));
        assert_eq!(p.stats().free_fail, 0);
    }
}

/// The background policy: objects idle long enough are recompressed
/// within the CPU share, and `stop` ends it.
#[test]
fn the_idle_policy_recompresses_in_the_background_until_stopped() {
    let p = Arc::new(pool(vec![zstd(3)], false));
    for k in 0..400u64 {
        p.store(k, &six_bit(k)).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let (p, stop) = (Arc::clone(&p), Arc::clone(&stop));
        std::thread::spawn(move || p.recompress_idle_until(0, || 0.5, &stop))
    };
    let t = std::time::Instant::now();
    while p.stats().recompressed_pages < 400 && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    let total = worker.join().unwrap().unwrap();
    assert_eq!(total.recompressed, 400, "{total:?}");
    assert_eq!(p.stats().huge_pages, 0);
    check_all(&p, (0..400).map(|k| (k, six_bit(k))));
    // Without an algorithm it stops at once with the reason.
    let none = pool(vec![], false);
    assert!(none.recompress_idle_until(0, || 0.1, &AtomicBool::new(false)).is_err());
}

/// A share that follows the machine (`--recompress-cpu auto`): while it is
/// none, nothing is rewritten; once there is one, the work goes on; and
/// `stop` ends a policy that is waiting for a share.
#[test]
fn the_idle_policy_waits_while_it_has_no_share_of_a_cpu() {
    let p = Arc::new(pool(vec![zstd(3)], false));
    for k in 0..200u64 {
        p.store(k, &six_bit(k)).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let share = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let asked = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let worker = {
        let (p, stop, share, asked) = (Arc::clone(&p), Arc::clone(&stop), Arc::clone(&share), Arc::clone(&asked));
        std::thread::spawn(move || {
            p.recompress_idle_until(
                0,
                || {
                    asked.fetch_add(1, Ordering::Relaxed);
                    f64::from_bits(share.load(Ordering::Relaxed))
                },
                &stop,
            )
        })
    };
    let t = std::time::Instant::now();
    while asked.load(Ordering::Relaxed) < 3 && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(asked.load(Ordering::Relaxed) >= 3, "it asks again while it has no share");
    assert_eq!(p.stats().recompressed_pages, 0, "no work without a share");
    share.store(1.0f64.to_bits(), Ordering::Relaxed);
    while p.stats().recompressed_pages < 200 && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(p.stats().recompressed_pages, 200);
    // Back to none: stop ends the wait.
    share.store(0, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let total = worker.join().unwrap().unwrap();
    assert_eq!(total.recompressed, 200, "{total:?}");
    check_all(&p, (0..200).map(|k| (k, six_bit(k))));
}

/// The idle policy leaves alone the pages the pool was told to write back
/// first (a swap device's unmapped pages: about to leave RAM, most dead),
/// but not one stored again since it was named; a pass asked for by hand
/// takes them too; every page reads back as stored.
#[test]
fn the_idle_policy_spares_pages_named_to_go_first() {
    let p = Arc::new(pool(vec![zstd(3)], true));
    let n = 300u64;
    for k in 0..n {
        p.store(k, &six_bit(k)).unwrap();
    }
    let mut named = p.resident();
    named.retain(|k| k % 2 == 1);
    assert_eq!(p.write_back_first(named), (n / 2) as usize);
    let restored = 3;
    p.store(restored, &six_bit(restored + 1_000)).unwrap();
    let want = |k: u64| six_bit(if k == restored { k + 1_000 } else { k });
    let stop = Arc::new(AtomicBool::new(false));
    let worker = {
        let (p, stop) = (Arc::clone(&p), Arc::clone(&stop));
        std::thread::spawn(move || p.recompress_idle_until(0, || 0.5, &stop))
    };
    let spared = n / 2 - 1;
    let t = std::time::Instant::now();
    while p.stats().recompressed_pages < n - spared && t.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(1_500));
    stop.store(true, Ordering::Relaxed);
    let total = worker.join().unwrap().unwrap();
    assert_eq!(total.recompressed, n - spared, "{total:?}");
    assert!(total.going_first >= spared, "{total:?}");
    assert_eq!(p.stats().written_back_pages, 0, "nothing needed room");
    check_all(&p, (0..n).map(|k| (k, want(k))));
    let by_hand = p.recompress(&Recompress::default()).unwrap();
    assert_eq!((by_hand.recompressed, by_hand.going_first), (spared, 0), "{by_hand:?}");
    check_all(&p, (0..n).map(|k| (k, want(k))));
}
