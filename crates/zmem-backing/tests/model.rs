//! Model-based test: the store against a HashMap.
mod common;

use std::collections::HashMap;

use proptest::prelude::*;
use zmem_backing::{BackingError, BackingStore, MemFile, RecordId, RECORD_ALIGN, RECORD_HEADER_SIZE, SEGMENT_SIZE};
use zmem_testkit::XorShift;

#[derive(Debug, Clone)]
enum Op {
    /// (key, len, seed, kind) per record.
    Write(Vec<(u64, usize, u64, u8)>),
    Read(usize),
    /// Read with the wrong key.
    ReadWrongKey(usize),
    /// Free roughly `pct` percent of the live records.
    FreeMany(u8, u64),
    Free(usize),
    UseStale(usize),
    Compact,
}

fn op() -> impl Strategy<Value = Op> {
    let rec = (any::<u64>(), 1usize..=4096, any::<u64>(), 0u8..3);
    prop_oneof![
        4 => prop::collection::vec(rec, 1..48).prop_map(Op::Write),
        3 => any::<usize>().prop_map(Op::Read),
        1 => any::<usize>().prop_map(Op::ReadWrongKey),
        2 => (0u8..=100, any::<u64>()).prop_map(|(p, s)| Op::FreeMany(p, s)),
        2 => any::<usize>().prop_map(Op::Free),
        1 => any::<usize>().prop_map(Op::UseStale),
        1 => Just(Op::Compact),
    ]
}

type Model = HashMap<RecordId, (u64, Vec<u8>)>;

/// Do what the engine does with the records compaction copied: the owner
/// of an old id takes its copy and frees the old one; a copy of a record
/// freed since is freed. Returns the moves taken.
fn take_moves(store: &BackingStore, model: &mut Model, ids: &mut [RecordId], stale: &mut Vec<RecordId>) -> Result<usize, TestCaseError> {
    let moves = store.take_moves();
    for m in &moves {
        let free = match model.remove(&m.from) {
            Some(d) => {
                prop_assert_eq!(m.key, d.0, "a move names the record's key");
                prop_assert!(model.insert(m.to, d).is_none(), "a copy's id is new");
                let at = ids.iter().position(|&i| i == m.from).expect("a live id");
                ids[at] = m.to;
                m.from
            }
            None => m.to,
        };
        store.free(free).map_err(|e| TestCaseError::fail(e.to_string()))?;
        stale.push(free);
    }
    Ok(moves.len())
}

/// Compact until compaction copies nothing more, taking its moves.
fn compact_fully(store: &BackingStore, model: &mut Model, ids: &mut [RecordId], stale: &mut Vec<RecordId>) -> Result<(), TestCaseError> {
    for _ in 0..16 {
        store.compact().map_err(|e| TestCaseError::fail(e.to_string()))?;
        if take_moves(store, model, ids, stale)? == 0 {
            return Ok(());
        }
    }
    Err(TestCaseError::fail("compaction kept copying"))
}

fn run(direct: bool, limit: Option<u64>, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let store = BackingStore::new(Box::new(MemFile::new(direct)), limit);
    let mut model: Model = HashMap::new();
    let mut ids: Vec<RecordId> = Vec::new();
    let mut stale: Vec<RecordId> = Vec::new();
    let mut out = Vec::new();
    for op in ops {
        match op {
            Op::Write(recs) => {
                let data: Vec<(u64, Vec<u8>)> = recs.iter().map(|&(k, len, seed, kind)| (k, common::payload(len, seed, kind))).collect();
                let batch: Vec<(u64, &[u8])> = data.iter().map(|(k, p)| (*k, p.as_slice())).collect();
                let got = match store.write_batch(&batch) {
                    Ok(got) => got,
                    // Under a limit, Full is allowed and records nothing.
                    Err(BackingError::Full { .. }) if limit.is_some() => {
                        let s = store.stats();
                        prop_assert!(s.file_bytes <= limit.unwrap());
                        continue;
                    }
                    Err(e) => return Err(TestCaseError::fail(e.to_string())),
                };
                prop_assert_eq!(got.len(), data.len());
                for (id, d) in got.into_iter().zip(data) {
                    prop_assert_ne!(id.to_raw(), 0);
                    prop_assert!(model.insert(id, d).is_none(), "duplicate live id");
                    ids.push(id);
                }
            }
            Op::Read(i) | Op::ReadWrongKey(i) if !ids.is_empty() => {
                let id = ids[i % ids.len()];
                let (key, data) = &model[&id];
                if matches!(op, Op::Read(_)) {
                    store.read(id, *key, &mut out).map_err(|e| TestCaseError::fail(e.to_string()))?;
                    prop_assert!(&out == data);
                } else {
                    let r = store.read(id, key ^ 1, &mut out);
                    prop_assert!(matches!(r, Err(BackingError::Checksum { .. })), "{:?}", r);
                    prop_assert!(out.is_empty());
                }
            }
            Op::Free(i) if !ids.is_empty() => {
                let id = ids.swap_remove(i % ids.len());
                model.remove(&id);
                store.free(id).map_err(|e| TestCaseError::fail(e.to_string()))?;
                stale.push(id);
            }
            Op::FreeMany(pct, seed) => {
                let mut r = XorShift::from_state(seed | 1);
                let mut i = 0;
                while i < ids.len() {
                    if r.below(100) < pct as u64 {
                        let id = ids.swap_remove(i);
                        model.remove(&id);
                        store.free(id).map_err(|e| TestCaseError::fail(e.to_string()))?;
                        stale.push(id);
                    } else {
                        i += 1;
                    }
                }
            }
            Op::UseStale(i) if !stale.is_empty() => {
                let id = stale[i % stale.len()];
                let r = store.read(id, 0, &mut out);
                prop_assert!(matches!(r, Err(BackingError::InvalidRecord { .. })), "{:?}", r);
                let f = store.free(id);
                prop_assert!(matches!(f, Err(BackingError::InvalidRecord { .. })), "{:?}", f);
            }
            Op::Compact => {
                compact_fully(&store, &mut model, &mut ids, &mut stale)?;
                let s = store.stats();
                prop_assert!(s.file_bytes <= 2 * s.live_bytes + 2 * SEGMENT_SIZE as u64, "after compact: {:?}", s);
            }
            _ => {}
        }
        // (A write may have compacted.)
        take_moves(&store, &mut model, &mut ids, &mut stale)?;
        let s = store.stats();
        prop_assert_eq!(s.records, model.len() as u64);
        let live: u64 = model.values().map(|(_, p)| (RECORD_HEADER_SIZE + p.len()).next_multiple_of(RECORD_ALIGN) as u64).sum();
        prop_assert_eq!(s.live_bytes, live);
    }
    // Everything still reads back.
    for (id, (key, data)) in &model {
        store.read(*id, *key, &mut out).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert!(&out == data);
    }
    // Freeing everything and compacting returns the file to nothing.
    for id in ids.drain(..) {
        model.remove(&id);
        store.free(id).map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
    compact_fully(&store, &mut model, &mut ids, &mut stale)?;
    let s = store.stats();
    prop_assert_eq!(s.records, 0);
    prop_assert!(s.file_bytes <= SEGMENT_SIZE as u64, "{:?}", s);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]
    #[test]
    fn model_buffered(ops in prop::collection::vec(op(), 1..120)) {
        run(false, None, ops)?;
    }
    #[test]
    fn model_direct(ops in prop::collection::vec(op(), 1..120)) {
        run(true, None, ops)?;
    }
    #[test]
    fn model_with_limit(ops in prop::collection::vec(op(), 1..120)) {
        run(true, Some(2 * SEGMENT_SIZE as u64), ops)?;
    }
}
