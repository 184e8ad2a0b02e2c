//! Targeted behaviour: errors, accounting, compressor switching, stress.

mod common;

use std::sync::Arc;

use common::*;
use zmem_core::{Pool, PoolConfig, ZmemError, DEFAULT_HUGE_THRESHOLD};

fn pool(dedup: bool) -> Pool {
    Pool::new(PoolConfig { dedup, ..PoolConfig::default() }).unwrap()
}

#[test]
fn bad_sizes_and_unknown_keys_are_typed_errors() {
    let p = pool(false);
    p.store(1, &compressible(1)).unwrap();
    assert!(matches!(p.store(2, &[0u8; 100]), Err(ZmemError::BadPageSize { len: 100 })));
    assert!(matches!(p.store(2, &vec![0u8; 8192]), Err(ZmemError::BadPageSize { len: 8192 })));
    let mut small = [0u8; 10];
    assert!(matches!(p.load(1, &mut small), Err(ZmemError::BadPageSize { len: 10 })));
    let mut buf = vec![0u8; PAGE];
    assert!(matches!(p.load(99, &mut buf), Err(ZmemError::NotFound { key: 99 })));
    assert!(!p.invalidate(99));
    // The good entry survived all of that.
    p.load(1, &mut buf).unwrap();
    assert_eq!(buf, compressible(1));
}

#[test]
fn full_pool_rejects_and_keeps_everything_else() {
    let p = Pool::new(PoolConfig { mem_limit: Some(256 * 1024), ..PoolConfig::default() }).unwrap();
    let mut stored = Vec::new();
    let mut full = None;
    for k in 0..1000u64 {
        match p.store(k, &incompressible(k)) {
            Ok(()) => stored.push(k),
            Err(e) => {
                full = Some((k, e));
                break;
            }
        }
    }
    let (k, e) = full.expect("a 256 KiB limit must fill up");
    assert!(matches!(e, ZmemError::PoolFull { limit_bytes: 262144 }), "{e}");
    assert!(!p.contains(k), "a rejected store must not leave an entry");
    // Overwriting an existing key with a page that needs new memory (another
    // size class, no span yet) fails and keeps the old page.
    let victim = stored[0];
    assert!(p.store(victim, &half(5555)).is_err());
    let mut buf = vec![0u8; PAGE];
    for &k in &stored {
        p.load(k, &mut buf).unwrap();
        assert_eq!(buf, incompressible(k));
    }
    // A page that fits the old object's size class is rewritten in place:
    // it needs no new memory, so it succeeds even now.
    let last = *stored.last().unwrap();
    p.store(last, &incompressible(7777)).unwrap();
    p.load(last, &mut buf).unwrap();
    assert_eq!(buf, incompressible(7777));
    // Same-filled pages take no allocation, so they still fit where the
    // index has room for them (a key whose block exists; a key that needs
    // a new index block needs memory, and the limit covers the index too).
    p.store(stored[1], &same_filled(0x55)).unwrap();
    p.load(stored[1], &mut buf).unwrap();
    assert_eq!(buf, same_filled(0x55));
    let st = p.stats();
    assert!(st.pool_limit_hit >= 2);
    assert!(st.mem_limit == 262144);
}

#[test]
fn same_filled_and_huge_pages_are_counted() {
    let p = pool(false);
    p.store(0, &same_filled(0)).unwrap();
    p.store(1, &same_filled(0xabcdef0123456789)).unwrap();
    p.store(2, &incompressible(2)).unwrap();
    p.store(3, &compressible(3)).unwrap();
    let st = p.stats();
    assert_eq!(st.same_pages, 2);
    assert_eq!(st.huge_pages, 1);
    assert_eq!(st.objs_used, 2);
    assert!(st.compr_data_size >= 4096);
    assert!(st.compr_data_size < 4096 + DEFAULT_HUGE_THRESHOLD as u64);
    let fields: Vec<u64> = st.mm_stat().split_whitespace().map(|f| f.parse().unwrap()).collect();
    assert_eq!(fields.len(), 9, "zram's nine fields");
    assert_eq!(fields[0], 4 * 4096);
    assert_eq!(fields[5], 2);
    assert_eq!(fields[7], 1);
    assert_eq!(fields[8], 1, "huge_pages_since");
    // Overwrite a huge page with a same-filled one: counters follow, but
    // huge_pages_since counts stores.
    p.store(2, &same_filled(7)).unwrap();
    let st = p.stats();
    assert_eq!((st.same_pages, st.huge_pages, st.objs_used), (3, 0, 1));
    assert_eq!(st.huge_pages_since, 1);
}

#[test]
fn rejecting_incompressible_pages_like_zswap() {
    let p = Pool::new(PoolConfig { store_incompressible: false, ..PoolConfig::default() }).unwrap();
    assert!(matches!(p.store(1, &incompressible(1)), Err(ZmemError::CompressPoor)));
    assert_eq!(p.stats().reject_compress_poor, 1);
    assert!(!p.contains(1));
}

#[test]
fn dedup_shares_and_frees_with_last_user() {
    let p = pool(true);
    for k in 0..10 {
        p.store(k, &compressible(42)).unwrap();
    }
    p.store(10, &compressible(43)).unwrap();
    let st = p.stats();
    assert_eq!(st.objs_used, 2);
    assert_eq!(st.dup_pages, 9);
    assert!(st.dup_data_size > 0 && st.meta_data_size > 0);
    let one = st.compr_data_size;
    for k in 0..9 {
        assert!(p.invalidate(k));
    }
    let st = p.stats();
    assert_eq!((st.objs_used, st.dup_pages, st.dup_data_size), (2, 0, 0));
    assert_eq!(st.compr_data_size, one);
    let mut buf = vec![0u8; PAGE];
    p.load(9, &mut buf).unwrap();
    assert_eq!(buf, compressible(42));
    p.invalidate(9);
    assert_eq!(p.stats().objs_used, 1);
}

#[test]
fn dedup_never_shares_on_hash_alone() {
    // Different pages with the same content hash can't be crafted cheaply,
    // so check the other half of the rule: different pages are never merged.
    let p = pool(true);
    for k in 0..200 {
        p.store(k, &compressible(k)).unwrap();
    }
    let st = p.stats();
    assert_eq!(st.dup_pages, 0);
    assert_eq!(st.objs_used, 200);
    let mut buf = vec![0u8; PAGE];
    for k in 0..200 {
        p.load(k, &mut buf).unwrap();
        assert_eq!(buf, compressible(k));
    }
}

#[test]
fn memory_accounting_counts_metadata_and_shrinks() {
    let p = pool(false);
    for k in 0..4000u64 {
        p.store(k, &compressible(k)).unwrap();
    }
    let st = p.stats();
    assert!(st.index_bytes >= 4000 * 16, "index {}", st.index_bytes);
    assert!(st.alloc_metadata_bytes > 0);
    assert_eq!(st.mem_used_total, st.pool_pages * 4096 + st.alloc_metadata_bytes + st.index_bytes + st.meta_data_size);
    assert!(st.mem_used_total > st.compr_data_size);
    // Drop every other page, compact: pages go back.
    for k in (0..4000u64).step_by(2) {
        p.invalidate(k);
    }
    p.compact();
    let after = p.stats();
    assert!(after.pages_compacted > 0);
    assert!(after.pool_pages < st.pool_pages * 3 / 4, "{} -> {}", st.pool_pages, after.pool_pages);
    assert!(after.mem_used_max >= st.mem_used_total);
    let mut buf = vec![0u8; PAGE];
    for k in (1..4000u64).step_by(2) {
        p.load(k, &mut buf).unwrap();
        assert_eq!(buf, compressible(k));
    }
}

#[test]
fn many_threads_store_load_invalidate() {
    for dedup in [false, true] {
        let p = Arc::new(pool(dedup));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let p = Arc::clone(&p);
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; PAGE];
                    let mut r = xorshift(t + 1);
                    let base = t << 32;
                    let mut live = std::collections::HashMap::new();
                    for i in 0..6000u64 {
                        let k = base + r() % 300;
                        match r() % 10 {
                            0..=4 => {
                                let seed = if r().is_multiple_of(3) { r() % 8 } else { i };
                                let page = if seed % 5 == 0 { half(seed) } else { compressible(seed) };
                                p.store(k, &page).unwrap();
                                live.insert(k, page);
                            }
                            5..=7 => {
                                if let Some(want) = live.get(&k) {
                                    p.load(k, &mut buf).unwrap();
                                    assert_eq!(&buf, want);
                                } else {
                                    assert!(p.load(k, &mut buf).is_err());
                                }
                            }
                            8 => {
                                assert_eq!(p.invalidate(k), live.remove(&k).is_some());
                            }
                            _ => {
                                if i % 500 == 0 {
                                    p.compact();
                                }
                            }
                        }
                    }
                    for (k, want) in &live {
                        p.load(*k, &mut buf).unwrap();
                        assert_eq!(&buf, want);
                    }
                    live.len()
                })
            })
            .collect();
        let total: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(p.len(), total);
        assert_eq!(p.stats().stored_pages, total as u64);
    }
}
