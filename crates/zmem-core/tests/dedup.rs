//! Adaptive dedup (`dedup.rs`): on data without twins a dedup pool costs
//! what a pool without dedup costs (records only for a sample); when
//! twins appear it goes back to full mode and shares the pages it stored
//! meanwhile too; every page reads back byte for byte throughout.

mod common;

use common::*;
use zmem_core::{Pool, PoolConfig};

const N: u64 = 24_000;

fn pool(dedup: bool) -> Pool {
    Pool::new(PoolConfig { dedup, shards: 16, ..PoolConfig::default() }).unwrap()
}

fn check(p: &Pool, keys: impl Iterator<Item = (u64, u64)>) {
    let mut buf = vec![0u8; PAGE];
    for (k, seed) in keys {
        p.load(k, &mut buf).unwrap_or_else(|e| panic!("key {k}: {e}"));
        assert!(buf == compressible(seed), "key {k} read back wrong");
    }
}

#[test]
fn without_twins_dedup_costs_what_no_dedup_costs() {
    let (on, off) = (pool(true), pool(false));
    for k in 0..N {
        on.store(k, &compressible(k)).unwrap();
        off.store(k, &compressible(k)).unwrap();
    }
    let (a, b) = (on.stats(), off.stats());
    assert!(!a.dedup_full, "no twins: sampling");
    assert_eq!(a.dedup_switches, 1);
    assert_eq!(a.dup_pages, 0);
    assert!(
        a.mem_used_total * 1000 <= b.mem_used_total * 1005,
        "dedup on {} bytes, off {} (meta_data_size {})",
        a.mem_used_total,
        b.mem_used_total,
        a.meta_data_size
    );
    // Records for about one page in 32 (hashes 0 mod 32), no more.
    assert!(a.meta_data_size < N / 32 * 100, "meta_data_size {}", a.meta_data_size);
    assert_eq!(on.mem_charged(), a.mem_used_total);
    check(&on, (0..N).map(|k| (k, k)));
}

#[test]
fn a_second_copy_switches_back_and_shares_what_came_before() {
    let (on, off) = (pool(true), pool(false));
    for k in 0..N {
        on.store(k, &compressible(k)).unwrap();
        off.store(k, &compressible(k)).unwrap();
    }
    assert!(!on.stats().dedup_full);
    for k in 0..N {
        on.store(N + k, &compressible(k)).unwrap();
        off.store(N + k, &compressible(k)).unwrap();
    }
    on.compact();
    off.compact();
    let (a, b) = (on.stats(), off.stats());
    assert!(a.dedup_full, "twins: full again");
    assert_eq!(a.dedup_switches, 2);
    assert!(a.dup_pages >= N * 99 / 100, "{} of {N} twins shared", a.dup_pages);
    assert!(a.dup_data_size > a.meta_data_size);
    assert!(a.mem_used_total * 10 <= b.mem_used_total * 6, "dedup on {} bytes, off {}", a.mem_used_total, b.mem_used_total);
    assert_eq!(on.mem_charged(), a.mem_used_total);
    check(&on, (0..2 * N).map(|k| (k, k % N)));
    // Freeing the first copy leaves the second whole.
    assert_eq!(on.invalidate_range(0..N), N);
    check(&on, (N..2 * N).map(|k| (k, k - N)));
    assert_eq!(on.invalidate_range(N..2 * N), N);
    assert_eq!(on.stats().mem_used_total, on.mem_charged());
}

#[test]
fn frequent_twins_keep_full_mode() {
    let p = pool(true);
    for k in 0..3 * 2048 {
        // Every page stored twice in a row.
        p.store(k, &compressible(k / 2)).unwrap();
    }
    let st = p.stats();
    assert!(st.dedup_full && st.dedup_switches == 0, "{st:?}");
    assert_eq!(st.dup_pages, 3 * 1024);
    check(&p, (0..3 * 2048).map(|k| (k, k / 2)));
}
