//! Model-based test: random operation sequences checked against a plain map.

mod common;

use std::collections::HashMap;

use common::*;
use proptest::prelude::*;
use zmem_core::{Pool, PoolConfig, Recompress, ZmemError};

#[derive(Clone, Debug)]
enum Kind {
    Compressible(u64),
    Incompressible(u64),
    Same(u64),
    /// One of four fixed contents, so duplicates are common.
    Dup(u8),
    Half(u64),
}

impl Kind {
    fn page(&self) -> Vec<u8> {
        match *self {
            Kind::Compressible(s) => compressible(s),
            Kind::Incompressible(s) => incompressible(s),
            Kind::Same(p) => same_filled(p),
            Kind::Dup(i) => compressible(1000 + i as u64),
            Kind::Half(s) => half(s),
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Store(u64, Kind),
    Load(u64),
    Invalidate(u64),
    InvalidateRange(u64, u64),
    Compact,
    /// A recompression pass at this priority (1..=3): objects of
    /// several algorithms in one pool.
    Recompress(u8),
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        3 => any::<u64>().prop_map(Kind::Compressible),
        1 => any::<u64>().prop_map(Kind::Incompressible),
        2 => prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>()].prop_map(Kind::Same),
        3 => (0u8..4).prop_map(Kind::Dup),
        1 => any::<u64>().prop_map(Kind::Half),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0u64..48;
    prop_oneof![
        6 => (key.clone(), kind()).prop_map(|(k, p)| Op::Store(k, p)),
        4 => key.clone().prop_map(Op::Load),
        2 => key.clone().prop_map(Op::Invalidate),
        1 => (key.clone(), 0u64..16).prop_map(|(a, n)| Op::InvalidateRange(a, a + n)),
        1 => Just(Op::Compact),
        1 => (1u8..=3).prop_map(Op::Recompress),
    ]
}

fn run(dedup: bool, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let recomp_algorithms = ["zstd", "zstd:9", "lzo"].iter().map(|a| a.parse().unwrap()).collect();
    let pool = Pool::new(PoolConfig { dedup, shards: 4, recomp_algorithms, ..PoolConfig::default() }).unwrap();
    let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut buf = vec![0u8; PAGE];
    for op in ops {
        match op {
            Op::Store(k, kind) => {
                let p = kind.page();
                pool.store(k, &p).unwrap();
                model.insert(k, p);
            }
            Op::Load(k) => match (pool.load(k, &mut buf), model.get(&k)) {
                (Ok(()), Some(want)) => prop_assert_eq!(&buf, want, "key {}", k),
                (Err(ZmemError::NotFound { key }), None) => prop_assert_eq!(key, k),
                (got, want) => prop_assert!(false, "key {k}: got {got:?}, model has {}", want.is_some()),
            },
            Op::Invalidate(k) => prop_assert_eq!(pool.invalidate(k), model.remove(&k).is_some()),
            Op::InvalidateRange(a, b) => {
                let before = model.len();
                model.retain(|k, _| !(a..b).contains(k));
                prop_assert_eq!(pool.invalidate_range(a..b), (before - model.len()) as u64);
            }
            Op::Compact => {
                pool.compact();
            }
            Op::Recompress(prio) => {
                pool.recompress(&Recompress { prio: Some(prio), ..Recompress::default() }).unwrap();
            }
        }
        let st = pool.stats();
        prop_assert_eq!(st.stored_pages, model.len() as u64);
        prop_assert_eq!(st.orig_data_size, model.len() as u64 * PAGE as u64);
        let same = model.values().filter(|p| p.chunks(8).all(|w| w == &p[..8])).count();
        prop_assert_eq!(st.same_pages, same as u64);
        if !dedup {
            prop_assert_eq!(st.dup_pages, 0);
            prop_assert_eq!(st.objs_used, (model.len() - same) as u64);
        } else {
            let mut distinct: Vec<&Vec<u8>> = model.values().filter(|p| !p.chunks(8).all(|w| w == &p[..8])).collect();
            distinct.sort();
            distinct.dedup();
            prop_assert_eq!(st.objs_used, distinct.len() as u64);
            prop_assert_eq!(st.dup_pages, (model.len() - same - distinct.len()) as u64);
        }
        prop_assert!(st.mem_used_total >= st.pool_pages * PAGE as u64);
        prop_assert!(st.mem_used_max >= st.mem_used_total);
    }
    // Everything back, byte for byte.
    for (k, want) in &model {
        pool.load(*k, &mut buf).unwrap();
        prop_assert_eq!(&buf, want);
    }
    // And once all is dropped, no object is left.
    pool.invalidate_range(0..u64::MAX);
    let st = pool.stats();
    prop_assert_eq!(st.objs_used, 0);
    prop_assert_eq!(st.compr_data_size, 0);
    prop_assert_eq!(st.dup_data_size, 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn model_without_dedup(ops in proptest::collection::vec(op(), 1..160)) {
        run(false, ops)?;
    }

    #[test]
    fn model_with_dedup(ops in proptest::collection::vec(op(), 1..160)) {
        run(true, ops)?;
    }
}
