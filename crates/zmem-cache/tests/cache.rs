//! The clean-page cache against a model (a map that the cache may drop
//! from at any time), under evictions, slot reuse and zcache's rules.

use std::collections::HashMap;

use proptest::prelude::*;
use zmem_cache::{CacheConfig, CacheError, CleanCache, Get, PoolId, PoolOptions, Put, PAGE_SIZE};
use zmem_testkit::XorShift;

/// A page that compresses well, different for every seed.
fn page(seed: u64) -> Vec<u8> {
    let mut r = XorShift::from_state(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let mut p = Vec::with_capacity(PAGE_SIZE);
    while p.len() < PAGE_SIZE {
        p.extend_from_slice(format!("seed {seed} word {} ", r.below(97)).as_bytes());
    }
    p.truncate(PAGE_SIZE);
    p
}

fn random_page(seed: u64) -> Vec<u8> {
    let mut p = vec![0u8; PAGE_SIZE];
    XorShift::from_state(seed | 1).fill(&mut p);
    p
}

fn cache(memlimit: u64) -> CleanCache {
    CleanCache::new(CacheConfig { memlimit, ..CacheConfig::default() }).unwrap()
}

#[derive(Clone, Debug)]
enum Op {
    Put { pool: usize, inode: u64, index: u64, seed: u64 },
    Get { pool: usize, inode: u64, index: u64 },
    InvalidatePage { pool: usize, inode: u64, index: u64 },
    InvalidateInode { pool: usize, inode: u64 },
    InvalidatePool { pool: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let (p, i, x) = (0usize..2, 0u64..4, 0u64..6);
    prop_oneof![
        4 => (p.clone(), i.clone(), x.clone(), 0u64..1000).prop_map(|(pool, inode, index, seed)| Op::Put { pool, inode, index, seed }),
        4 => (p.clone(), i.clone(), x.clone()).prop_map(|(pool, inode, index)| Op::Get { pool, inode, index }),
        1 => (p.clone(), i.clone(), x).prop_map(|(pool, inode, index)| Op::InvalidatePage { pool, inode, index }),
        1 => (p.clone(), i).prop_map(|(pool, inode)| Op::InvalidateInode { pool, inode }),
        1 => p.prop_map(|pool| Op::InvalidatePool { pool }),
    ]
}

proptest! {
    /// Every hit returns the bytes last put; an invalidated page never hits.
    #[test]
    fn hits_return_the_last_put_and_invalidated_pages_miss(ops in prop::collection::vec(op(), 1..200)) {
        let c = cache(4 << 20);
        let mut ids: Vec<PoolId> = (0..2).map(|_| c.create_pool(PoolOptions::default()).unwrap()).collect();
        let mut model: Vec<HashMap<(u64, u64), u64>> = vec![HashMap::new(), HashMap::new()];
        let mut buf = vec![0u8; PAGE_SIZE];
        for op in ops {
            match op {
                Op::Put { pool, inode, index, seed } => {
                    match c.put(ids[pool], inode, index, &page(seed)).unwrap() {
                        Put::Stored => { model[pool].insert((inode, index), seed); }
                        Put::Refused => { model[pool].remove(&(inode, index)); }
                    }
                }
                Op::Get { pool, inode, index } => {
                    let r = c.get(ids[pool], inode, index, &mut buf).unwrap();
                    match (r, model[pool].get(&(inode, index))) {
                        (Get::Hit, Some(&seed)) => prop_assert!(buf == page(seed), "not the last put"),
                        (Get::Hit, None) => prop_assert!(false, "a page never put, or invalidated, hit"),
                        (Get::Miss, _) => {}
                    }
                }
                Op::InvalidatePage { pool, inode, index } => {
                    c.invalidate_page(ids[pool], inode, index).unwrap();
                    model[pool].remove(&(inode, index));
                }
                Op::InvalidateInode { pool, inode } => {
                    c.invalidate_inode(ids[pool], inode).unwrap();
                    model[pool].retain(|&(i, _), _| i != inode);
                }
                Op::InvalidatePool { pool } => {
                    c.invalidate_pool(ids[pool]).unwrap();
                    prop_assert!(matches!(c.get(ids[pool], 0, 0, &mut buf), Err(CacheError::NoSuchPool(_))));
                    ids[pool] = c.create_pool(PoolOptions::default()).unwrap();
                    model[pool].clear();
                }
            }
        }
    }
}

#[test]
fn a_full_pool_evicts_and_never_returns_wrong_data() {
    let c = cache(64 << 20);
    let id = c.create_pool(PoolOptions { memlimit: Some(1 << 20) }).unwrap();
    let mut buf = vec![0u8; PAGE_SIZE];
    for i in 0..6000u64 {
        assert_eq!(c.put(id, i % 60, i / 60, &page(i)).unwrap(), Put::Stored);
    }
    let (mut hits, mut misses) = (0, 0);
    for i in 0..6000u64 {
        match c.get(id, i % 60, i / 60, &mut buf).unwrap() {
            Get::Hit => {
                assert!(buf == page(i), "page {i} read back wrong");
                hits += 1;
            }
            Get::Miss => misses += 1,
        }
    }
    let st = c.stats(id).unwrap();
    assert!(st.evictions > 0 && misses > 0 && hits > 0, "{st:?}");
    assert_eq!(st.pages, hits);
    assert!(st.mem_used_bytes <= (1 << 20) + (256 << 10), "{st:?}");
    assert_eq!((st.hits, st.misses, st.puts), (hits, misses, 6000));
    // The newest pages are the ones kept.
    assert_eq!(c.get(id, 5999 % 60, 5999 / 60, &mut buf).unwrap(), Get::Hit);
}

#[test]
fn zcache_rules_refused_and_free_pages() {
    let c = cache(16 << 20);
    let id = c.create_pool(PoolOptions::default()).unwrap();
    let mut buf = vec![0u8; PAGE_SIZE];
    // A page that compresses to more than half a page is refused, and what
    // was kept for it before is gone (it is older than the refused put).
    assert_eq!(c.put(id, 1, 0, &page(1)).unwrap(), Put::Stored);
    assert_eq!(c.put(id, 1, 0, &random_page(1)).unwrap(), Put::Refused);
    assert_eq!(c.get(id, 1, 0, &mut buf).unwrap(), Get::Miss);
    // Zero and same-filled pages cost nothing.
    assert_eq!(c.put(id, 2, 0, &[0u8; PAGE_SIZE]).unwrap(), Put::Stored);
    assert_eq!(c.put(id, 2, 1, &[7u8; PAGE_SIZE]).unwrap(), Put::Stored);
    assert_eq!(c.get(id, 2, 1, &mut buf).unwrap(), Get::Hit);
    assert!(buf.iter().all(|&b| b == 7));
    let st = c.stats(id).unwrap();
    assert_eq!((st.refused_puts, st.pages, st.compr_bytes), (1, 2, 0), "{st:?}");
    // Indexes past 2^40 are not cached.
    assert_eq!(c.put(id, 3, 1 << 40, &page(3)).unwrap(), Put::Refused);
    // The caller's mistakes are errors.
    assert!(matches!(c.put(id, 1, 0, &[0u8; 100]), Err(CacheError::BadPageSize(100))));
    assert!(matches!(c.get(PoolId(9), 1, 0, &mut buf), Err(CacheError::NoSuchPool(9))));
    assert!(CleanCache::new(CacheConfig { max_compressed: 10, ..CacheConfig::default() }).is_err());
}

#[test]
fn inode_slots_come_back_and_never_show_another_inodes_page() {
    let c = cache(64 << 20);
    let id = c.create_pool(PoolOptions { memlimit: Some(1 << 20) }).unwrap();
    let mut buf = vec![0u8; PAGE_SIZE];
    // Many inodes, one page each: the pool keeps a few hundred pages, and
    // the slots of inodes whose pages were evicted are reused.
    for inode in 0..20_000u64 {
        assert_eq!(c.put(id, inode, 0, &page(inode)).unwrap(), Put::Stored);
    }
    let st = c.stats(id).unwrap();
    // Reclaimed when the table outgrows twice the pages held (plus 1,024),
    // as the pool was when the last new inode came.
    assert!(st.inodes <= 2 * st.pages + 2048 && st.inodes < 5_000, "{st:?}");
    for inode in 0..20_000u64 {
        if c.get(id, inode, 0, &mut buf).unwrap() == Get::Hit {
            assert!(buf == page(inode), "inode {inode} shows another inode's page");
        }
    }
    // invalidate_inode forgets all of an inode's pages at once.
    for index in 0..50 {
        c.put(id, 1_000_000, index, &page(index)).unwrap();
    }
    c.invalidate_inode(id, 1_000_000).unwrap();
    assert!((0..50).all(|i| c.get(id, 1_000_000, i, &mut buf).unwrap() == Get::Miss));
}

#[test]
fn pools_share_the_global_limit_fairly() {
    let c = cache(4 << 20);
    let a = c.create_pool(PoolOptions::default()).unwrap();
    // Alone, a pool may use the whole global limit.
    assert_eq!(c.stats(a).unwrap().cap_bytes, 4 << 20);
    let b = c.create_pool(PoolOptions::default()).unwrap();
    for i in 0..8000u64 {
        c.put(a, 1, i, &page(i)).unwrap();
        c.put(b, 1, i, &page(i + 1_000_000)).unwrap();
    }
    let (sa, sb) = (c.stats(a).unwrap(), c.stats(b).unwrap());
    assert!(sa.cap_bytes <= 3 << 20 && sb.cap_bytes <= 3 << 20, "{sa:?} {sb:?}");
    assert!(c.mem_used_bytes() <= (4 << 20) + (512 << 10), "{} bytes held", c.mem_used_bytes());
    assert!(sa.pages > 0 && sb.pages > 0);
}

/// Threads putting new inodes (which take the slot table's write lock)
/// and reading, while a small pool evicts: no deadlock, no wrong page.
#[test]
fn concurrent_puts_gets_and_slot_churn() {
    let c = std::sync::Arc::new(cache(64 << 20));
    let id = c.create_pool(PoolOptions { memlimit: Some(1 << 20) }).unwrap();
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let c = std::sync::Arc::clone(&c);
            std::thread::spawn(move || {
                let mut buf = vec![0u8; PAGE_SIZE];
                for i in 0..3000u64 {
                    let (inode, index) = (t * 1_000_000 + i / 3, i % 3);
                    let seed = inode * 10 + index;
                    c.put(id, inode, index, &page(seed)).unwrap();
                    let back = t * 1_000_000 + (i / 3).saturating_sub(i % 50);
                    if c.get(id, back, index, &mut buf).unwrap() == Get::Hit {
                        assert!(buf == page(back * 10 + index), "thread {t}: inode {back} read back wrong");
                    }
                    if i % 97 == 0 {
                        c.invalidate_inode(id, back).unwrap();
                    }
                }
            })
        })
        .collect();
    for h in threads {
        h.join().unwrap();
    }
    assert!(c.stats(id).unwrap().evictions > 0);
}
