//! A pool with a ledger and a backing file, left by a process and opened
//! by another (`Pool::open_with_cold_store`): the pages in RAM and those
//! written back all read back as stored, the next process writes back and
//! reads on, and a record the new store cannot take is a lost page (an
//! error), never another page's bytes.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use zmem_backing::{BackingStore, MemFile};
use zmem_core::{Pool, PoolConfig, WritebackMode, ZmemError};

const KEYS: u64 = 8192;

fn cfg() -> PoolConfig {
    // (Loads leave written-back pages where they are: the opening must
    // find them there.)
    PoolConfig { ledger_keys: Some(KEYS), promote_loads: false, ..PoolConfig::default() }
}

fn page(key: u64, v: u64) -> Vec<u8> {
    let mut p = format!("page {key:08} v{v:04} ").repeat(300).into_bytes();
    p.truncate(4096);
    if key.is_multiple_of(3) {
        // A third hardly compress.
        for (i, b) in p.iter_mut().enumerate().step_by(2) {
            *b = (key.wrapping_mul(2654435761).wrapping_add(i as u64 * 40503) >> 7) as u8;
        }
    }
    p
}

fn check(pool: &Pool, model: &HashMap<u64, Vec<u8>>) {
    let mut buf = vec![0u8; 4096];
    for (&k, p) in model {
        pool.load(k, &mut buf).unwrap_or_else(|e| panic!("key {k}: {e}"));
        assert_eq!(&buf, p, "key {k}");
    }
    assert_eq!(pool.mem_charged(), pool.stats().mem_used_total, "the budget and the counters disagree");
}

fn arena(pool: &Pool) -> OwnedFd {
    pool.arena().expect("a pool with a ledger offers its arena").try_clone_to_owned().unwrap()
}

fn store_on(file: &Arc<MemFile>) -> Box<BackingStore> {
    Box::new(BackingStore::new(Box::new(file.clone()), None))
}

#[test]
fn a_pool_with_a_backing_file_opened_again_holds_every_page() {
    let file = Arc::new(MemFile::new(false));
    let pool = Pool::with_cold_store(cfg(), store_on(&file)).unwrap();
    let mut model = HashMap::new();
    for k in 0..6000u64 {
        pool.store(k, &page(k, 0)).unwrap();
        model.insert(k, page(k, 0));
    }
    assert!(pool.writeback(WritebackMode::All, Some(4000)).unwrap() >= 3000);
    // Overwrites (of pages in RAM and written back) and drops.
    for k in (0..6000u64).step_by(7) {
        pool.store(k, &page(k, 1)).unwrap();
        model.insert(k, page(k, 1));
    }
    for k in (3..6000u64).step_by(11) {
        pool.invalidate(k);
        model.remove(&k);
    }
    check(&pool, &model);
    let before = pool.stats();
    assert!(before.bd_count > 2000, "{before:?}");

    let fd = arena(&pool);
    drop(pool);
    let (pool, report) = Pool::open_with_cold_store(fd, cfg(), store_on(&file)).unwrap();
    assert_eq!((report.pages, report.lost, report.strays_freed), (model.len() as u64, 0, 0));
    check(&pool, &model);
    let after = pool.stats();
    for (what, a, b) in [
        ("stored_pages", before.stored_pages, after.stored_pages),
        ("written back (bd_count)", before.bd_count, after.bd_count),
        ("compr_data_size", before.compr_data_size, after.compr_data_size),
    ] {
        assert_eq!(a, b, "{what} changed across the opening");
    }

    // It goes on: the objects in RAM are on its LRU again (a writeback of
    // all of them writes them), it writes new pages back, and opens again.
    assert!(pool.writeback(WritebackMode::All, None).unwrap() > 0);
    for k in 6000..KEYS {
        pool.store(k, &page(k, 2)).unwrap();
        model.insert(k, page(k, 2));
    }
    pool.writeback(WritebackMode::All, Some(1000)).unwrap();
    check(&pool, &model);
    let fd = arena(&pool);
    drop(pool);
    let (pool, report) = Pool::open_with_cold_store(fd.try_clone().unwrap(), cfg(), store_on(&file)).unwrap();
    assert_eq!((report.pages, report.lost), (model.len() as u64, 0));
    check(&pool, &model);
    drop(pool);

    // Without its backing file, the written-back pages are lost (their
    // reads fail), the others served.
    let (pool, report) = Pool::open(fd, cfg()).unwrap();
    assert!(report.lost > 0 && report.pages + report.lost == model.len() as u64, "{report:?}");
    let mut buf = vec![0u8; 4096];
    let (mut lost, mut right) = (0, 0);
    for (&k, p) in &model {
        match pool.load(k, &mut buf) {
            Ok(()) => {
                assert_eq!(&buf, p, "key {k}");
                right += 1;
            }
            Err(ZmemError::Lost { .. }) => lost += 1,
            Err(e) => panic!("key {k}: {e}"),
        }
    }
    assert_eq!((lost, right), (report.lost, report.pages));
}
