//! A pool with a ledger can be opened again by another process: every page
//! it held reads back, the counts of what it holds are the same, and it
//! goes on. What cannot be opened is refused with its reason.

mod common;

use std::collections::HashMap;
use std::os::fd::OwnedFd;

use common::{compressible, file_of, half, incompressible, ledger_entry_at, same_filled};
use zmem_core::{Compressor, Pool, PoolConfig, ZmemError};

const KEYS: u64 = 8192;

fn cfg() -> PoolConfig {
    PoolConfig { ledger_keys: Some(KEYS), recomp_algorithms: vec![Compressor::zstd(9).unwrap()], ..PoolConfig::default() }
}

fn page(kind: u64, seed: u64) -> Vec<u8> {
    match kind % 4 {
        0 => compressible(seed),
        1 => incompressible(seed),
        2 => same_filled(seed % 3),
        _ => half(seed),
    }
}

fn arena(pool: &Pool) -> OwnedFd {
    pool.arena().expect("an arena").try_clone_to_owned().unwrap()
}

fn check(pool: &Pool, model: &HashMap<u64, Vec<u8>>) {
    let mut buf = vec![0u8; 4096];
    for k in 0..KEYS {
        match model.get(&k) {
            Some(p) => {
                pool.load(k, &mut buf).unwrap_or_else(|e| panic!("key {k}: {e}"));
                assert!(buf == *p, "key {k} read back wrong");
            }
            None => assert!(matches!(pool.load(k, &mut buf), Err(ZmemError::NotFound { .. })), "key {k} should hold nothing"),
        }
    }
    assert_eq!(pool.mem_charged(), pool.stats().mem_used_total);
}

#[test]
fn a_pool_opened_again_holds_every_page_and_goes_on() {
    // Without a ledger there is nothing to hand over.
    assert!(Pool::new(PoolConfig::default()).unwrap().arena().is_none(), "a pool without a ledger offers its arena");
    let pool = Pool::new(cfg()).unwrap();
    let mut model = HashMap::new();
    for k in 0..6000u64 {
        let p = page(k, k * 7919);
        pool.store(k, &p).unwrap();
        model.insert(k, p);
    }
    // Overwrites, single invalidations, a range dropped whole (whole
    // pages of the ledger given back) and one dropped key by key.
    for k in (0..6000u64).step_by(5) {
        let p = page(k + 1, k * 31);
        pool.store(k, &p).unwrap();
        model.insert(k, p);
    }
    for k in (1..6000u64).step_by(7) {
        assert!(pool.invalidate(k));
        model.remove(&k);
    }
    // (Wider than the pool holds: dropped shard by shard, not key by key.)
    assert!(6144 > pool.len());
    let dropped = pool.invalidate_range(2048..8192);
    assert!(dropped > 3000);
    model.retain(|k, _| !(2048..8192).contains(k));
    pool.invalidate_range(5000..5010);
    model.retain(|k, _| !(5000..5010).contains(k));
    // Recompression rewrites objects under their keys.
    let r = pool.recompress(&zmem_core::Recompress::default()).unwrap();
    assert!(r.recompressed > 0, "{r:?}");
    check(&pool, &model);
    let before = pool.stats();
    assert!(before.ledger_bytes > 0 && before.ledger_bytes < KEYS * 16, "{}", before.ledger_bytes);

    let fd = arena(&pool);
    drop(pool);
    let (pool, report) = Pool::open(fd, cfg()).unwrap();
    assert_eq!((report.pages, report.strays_freed), (model.len() as u64, 0));
    check(&pool, &model);
    let after = pool.stats();
    for (what, a, b) in [
        ("stored_pages", before.stored_pages, after.stored_pages),
        ("same_pages", before.same_pages, after.same_pages),
        ("huge_pages", before.huge_pages, after.huge_pages),
        ("compr_data_size", before.compr_data_size, after.compr_data_size),
        ("pool_pages", before.pool_pages, after.pool_pages),
        ("ledger_bytes", before.ledger_bytes, after.ledger_bytes),
    ] {
        assert_eq!(a, b, "{what} changed across the opening");
    }

    // It goes on, and opens again.
    for k in (0..KEYS).step_by(3) {
        let p = page(k + 2, k ^ 0x55);
        pool.store(k, &p).unwrap();
        model.insert(k, p);
    }
    assert!(matches!(pool.store(KEYS, &compressible(1)), Err(ZmemError::PastLedger { key: KEYS, keys: KEYS })));
    check(&pool, &model);
    let fd = arena(&pool);
    drop(pool);
    let (pool, report) = Pool::open(fd, cfg()).unwrap();
    assert_eq!(report.pages, model.len() as u64);
    check(&pool, &model);
}

#[test]
fn what_cannot_be_opened_is_refused_with_its_reason() {
    // A ledger with what it cannot keep yet.
    let e = Pool::new(PoolConfig { dedup: true, ..cfg() }).err().expect("dedup with a ledger is refused");
    assert!(e.to_string().contains("dedup"), "{e}");
    let e = Pool::new(PoolConfig { ledger_keys: Some(1000), ..cfg() }).err().expect("a ledger of part of a page is refused");
    assert!(e.to_string().contains("multiple of 256"), "{e}");

    let pool = Pool::new(cfg()).unwrap();
    pool.store(1, &compressible(1)).unwrap();
    // Held by a live pool.
    let e = Pool::open(arena(&pool), cfg()).err().expect("an arena in use is refused");
    assert!(e.to_string().contains("another process holds this arena"), "{e}");
    let fd = arena(&pool);
    drop(pool);
    // Without the ledger it was made with.
    let e = Pool::open(fd.try_clone().unwrap(), PoolConfig { ledger_keys: None, ..cfg() }).err().unwrap();
    assert!(e.to_string().contains("ledger_keys"), "{e}");
    let e = Pool::open(fd.try_clone().unwrap(), PoolConfig { ledger_keys: Some(2 * KEYS), ..cfg() }).err().unwrap();
    assert!(e.to_string().contains("entries"), "{e}");
    // A file that is not an arena.
    let f = tempfile::tempfile().unwrap();
    f.set_len(4 << 20).unwrap();
    let e = Pool::open(f.into(), cfg()).err().unwrap();
    assert!(e.to_string().contains("not a zmem arena"), "{e}");
    // Every refusal left the arena whole.
    let (pool, report) = Pool::open(fd, cfg()).unwrap();
    assert_eq!(report.pages, 1);
    let mut buf = vec![0u8; 4096];
    pool.load(1, &mut buf).unwrap();
    assert_eq!(buf, compressible(1));
}

#[test]
fn a_page_that_cannot_be_proven_right_reads_as_an_error_the_rest_are_served() {
    use std::os::unix::fs::FileExt;
    let pool = Pool::new(cfg()).unwrap();
    for k in 0..300u64 {
        pool.store(k, &compressible(k)).unwrap();
    }
    let fd = arena(&pool);
    drop(pool);
    // Key 5 names an object the arena does not hold; key 6's word is no
    // entry at all.
    let f = file_of(&fd);
    let at5 = ledger_entry_at(&fd, 5);
    f.write_all_at(&0x00ff_0000_0000_1234u64.to_le_bytes(), at5).unwrap();
    f.write_all_at(&[5u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], ledger_entry_at(&fd, 6)).unwrap();

    let (pool, report) = Pool::open(fd.try_clone().unwrap(), cfg()).unwrap();
    // (The objects the two keys held are named by nothing now: freed.)
    assert_eq!((report.pages, report.lost, report.strays_freed), (298, 2, 2), "{report:?}");
    let mut buf = vec![0u8; 4096];
    for k in [5, 6] {
        assert!(matches!(pool.load(k, &mut buf), Err(ZmemError::Lost { key }) if key == k), "key {k} must not read as anything");
    }
    for k in (0..300u64).filter(|k| ![5, 6].contains(k)) {
        pool.load(k, &mut buf).unwrap();
        assert_eq!(buf, compressible(k), "key {k}");
    }
    assert_eq!(pool.stats().lost_pages, 2);
    // The marks outlive the next opening too...
    drop(pool);
    let (pool, report) = Pool::open(fd.try_clone().unwrap(), cfg()).unwrap();
    assert_eq!((report.pages, report.lost), (298, 2));
    assert!(matches!(pool.load(5, &mut buf), Err(ZmemError::Lost { .. })));
    // ...until the key is written or dropped.
    pool.store(5, &compressible(500)).unwrap();
    assert!(!pool.invalidate(6), "a lost key holds no page");
    pool.load(5, &mut buf).unwrap();
    assert_eq!(buf, compressible(500));
    assert!(matches!(pool.load(6, &mut buf), Err(ZmemError::NotFound { .. })));
    assert_eq!(pool.stats().lost_pages, 0);
    drop(pool);
    let (_pool, report) = Pool::open(fd, cfg()).unwrap();
    assert_eq!((report.pages, report.lost), (299, 0));
}
